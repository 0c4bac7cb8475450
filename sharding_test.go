package troupe_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"troupe"
)

// acct is a sharded test entity's message: the sender's name and its
// sequence number for the entity.
type acct struct {
	ID   string
	From string
	Seq  int
	Stop bool // the entity asks to be passivated after it
}

func init() { troupe.RegisterMessage[acct]("troupe.test.sharding.acct") }

// ledger is what a sharding test's entities report: how many run per id
// now and at most, where each started, and whether each sender's
// messages came in order, none missing.
type ledger struct {
	mu       sync.Mutex
	running  map[string]int
	most     int
	starts   map[string][]string
	last     map[string]int // by id and sender
	disorder []string
	handled  int
	on       map[string]int // messages handled by member
}

func newLedger() *ledger {
	return &ledger{running: map[string]int{}, starts: map[string][]string{}, last: map[string]int{}, on: map[string]int{}}
}

// factory makes the entities of the member named member.
func (l *ledger) factory(member string) func(id string) troupe.Behavior[acct] {
	return func(id string) troupe.Behavior[acct] {
		return troupe.Behavior[acct]{
			Setup: func(*troupe.Context[acct]) {
				l.mu.Lock()
				defer l.mu.Unlock()
				l.running[id]++
				l.most = max(l.most, l.running[id])
				l.starts[id] = append(l.starts[id], member)
			},
			Receive: func(c *troupe.Context[acct], m acct) {
				l.mu.Lock()
				k := m.ID + "/" + m.From
				if m.ID != id || m.Seq != l.last[k]+1 {
					l.disorder = append(l.disorder, fmt.Sprintf("%s got %s #%d after #%d", id, m.From, m.Seq, l.last[k]))
				}
				l.last[k] = m.Seq
				l.handled++
				l.on[member]++
				l.mu.Unlock()
				if m.Stop {
					troupe.Passivate(c)
				}
			},
			Signal: func(_ *troupe.Context[acct], s troupe.Signal) {
				if _, ok := s.(troupe.PostStop); ok {
					l.mu.Lock()
					l.running[id]--
					l.mu.Unlock()
				}
			},
		}
	}
}

func (l *ledger) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.handled
}

func (l *ledger) handledOn(member string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.on[member]
}

func (l *ledger) startsOf(id string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.starts[id])
}

// check fails t if an id ever ran twice at once or a sender's messages
// came out of order or with a gap.
func (l *ledger) check(t *testing.T) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.most > 1 {
		t.Errorf("an entity ran on %d members at once", l.most)
	}
	if len(l.disorder) > 0 {
		t.Errorf("%d messages out of order or after a gap, first: %v", len(l.disorder), l.disorder[:min(5, len(l.disorder))])
	}
}

// sender sends numbered messages to entities, keeping each id's count.
type sender struct {
	name string
	seq  map[string]int
}

func (s *sender) send(sh *troupe.Sharded[acct], id string) {
	if s.seq == nil {
		s.seq = map[string]int{}
	}
	s.seq[id]++
	sh.Entity(id).Tell(acct{ID: id, From: s.name, Seq: s.seq[id]})
}

func (s *sender) sent() int {
	n := 0
	for _, v := range s.seq {
		n += v
	}
	return n
}

// shardedCluster starts members named names (the first is the oldest)
// and the kind "accounts" on each, reporting to l.
func shardedCluster(t *testing.T, f *troupe.FaultNet, l *ledger, ccfg troupe.ClusterConfig, scfg troupe.ShardingConfig, names ...string) ([]*troupe.Node, []*troupe.Cluster, []*troupe.Sharded[acct]) {
	t.Helper()
	var nodes []*troupe.Node
	var members []*troupe.Cluster
	var kinds []*troupe.Sharded[acct]
	for _, name := range names {
		n, c := joinRegistryless(t, f, name, nodes, ccfg)
		nodes, members = append(nodes, n), append(members, c)
		waitAllUp(t, members, len(members))
		k, err := troupe.Sharding(c, "accounts", l.factory(name), scfg)
		if err != nil {
			t.Fatal(err)
		}
		kinds = append(kinds, k)
	}
	return nodes, members, kinds
}

// Entities are started on their first message, each on one member only,
// and take messages sent through any member, in order per sender.
func TestShardedEntitiesRunOnceEachAndKeepOrder(t *testing.T) {
	f := troupe.NewFaultNet()
	l := newLedger()
	_, _, kinds := shardedCluster(t, f, l, troupe.ClusterConfig{StableAfter: singletonStable}, troupe.ShardingConfig{Shards: 30}, "a", "b", "c")
	senders := []*sender{{name: "a"}, {name: "b"}, {name: "c"}}
	for round := range 20 {
		for i, s := range senders {
			for id := range 25 {
				s.send(kinds[i], fmt.Sprint("acct-", (id+round)%25))
			}
		}
	}
	waitUntil(t, 20*time.Second, "1,500 messages handled", func() bool { return l.count() == 1500 })
	l.check(t)
	for id := range 25 {
		if starts := l.startsOf(fmt.Sprint("acct-", id)); len(starts) != 1 {
			t.Errorf("acct-%d started %d times (%v); want once", id, len(starts), starts)
		}
	}
	for _, m := range []string{"a", "b", "c"} {
		if l.handledOn(m) == 0 {
			t.Errorf("no entity ran on %s: the shards were not spread", m)
		}
	}
}

// Sharding refuses a bad name and a second kind of one name on one
// member.
func TestShardingErrors(t *testing.T) {
	f := troupe.NewFaultNet()
	l := newLedger()
	_, members := registrylessCluster(t, f, troupe.ClusterConfig{}, "a")
	if _, err := troupe.Sharding(members[0], "bad name", l.factory("a"), troupe.ShardingConfig{}); !errors.Is(err, troupe.ErrBadName) {
		t.Fatalf("a bad name: %v; want ErrBadName", err)
	}
	if _, err := troupe.Sharding(members[0], "one", l.factory("a"), troupe.ShardingConfig{}); err != nil {
		t.Fatal(err)
	}
	if _, err := troupe.Sharding(members[0], "one", l.factory("a"), troupe.ShardingConfig{}); !errors.Is(err, troupe.ErrNameTaken) {
		t.Fatalf("a second kind of one name: %v; want ErrNameTaken", err)
	}
	members[0].Close()
	if _, err := troupe.Sharding(members[0], "two", l.factory("a"), troupe.ShardingConfig{}); !errors.Is(err, troupe.ErrClusterStopped) {
		t.Fatalf("after the cluster stopped: %v; want ErrClusterStopped", err)
	}
}

// When a member leaves, its shards are handed over first: their entities
// stop there and start elsewhere, and messages sent meanwhile, from any
// member, are held and delivered in order. Nothing is lost, and no
// entity runs twice.
func TestShardsAreHandedOverWhenAMemberLeaves(t *testing.T) {
	f := troupe.NewFaultNet()
	l := newLedger()
	_, members, kinds := shardedCluster(t, f, l, troupe.ClusterConfig{StableAfter: singletonStable}, troupe.ShardingConfig{Shards: 20}, "a", "b", "c")
	s := &sender{name: "b"}
	for id := range 40 {
		s.send(kinds[1], fmt.Sprint("cart-", id))
	}
	waitUntil(t, 20*time.Second, "the first messages handled", func() bool { return l.count() == 40 })
	if l.handledOn("a") == 0 {
		t.Fatal("no entity ran on a")
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ctx.Err() == nil; i++ {
			s.send(kinds[1], fmt.Sprint("cart-", i%40))
			if i%40 == 0 {
				time.Sleep(time.Millisecond)
			}
		}
	}()
	if err := members[0].Leave(ctxFor(t)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // (traffic after the leave)
	cancel()
	<-done
	want := s.sent()
	waitUntil(t, 20*time.Second, fmt.Sprintf("all %d messages handled", want), func() bool { return l.count() == want })
	l.check(t)
	moved := 0
	for id := range 40 {
		starts := l.startsOf(fmt.Sprint("cart-", id))
		if starts[0] == "a" {
			if len(starts) != 2 || starts[1] == "a" {
				t.Errorf("cart-%d started on %v; want on a, then on b or c", id, starts)
			}
			moved++
		}
	}
	if moved == 0 {
		t.Error("no entity ran on a")
	}
}
