package troupe

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync/atomic"
	"testing"
	"time"
)

// A member event (which pokes every region) while Sharding is being
// called: the region is seen only once whole.
func TestAPokeWhileShardingStartsIsSafe(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	f := new(FaultNet)
	n := startOn(t, f, failConfig("alone", 20*time.Millisecond, 2*time.Second))
	c, err := StartCluster(ctxT(t, 5*time.Second), n, clusterCfg(nil))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var stop atomic.Bool
	panicked := make(chan any, 1)
	go func() {
		defer func() {
			if p := recover(); p != nil {
				panicked <- p
			}
		}()
		for !stop.Load() {
			c.shardings.poke()
		}
	}()
	for i := range 200 {
		if _, err := Sharding(c, fmt.Sprint("k", i), func(string) Behavior[int] { return Behavior[int]{} }, ShardingConfig{Shards: 1}); err != nil {
			t.Fatal(err)
		}
		select {
		case p := <-panicked:
			stop.Store(true)
			t.Fatalf("shardings.poke panicked during Sharding (kind %d): %v", i, p)
		default:
		}
	}
	stop.Store(true)
}

// goneAfter: an unreachable member is away until it is reachable again;
// a downed or removed one is away for good.
func TestGoneAfter(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	self, a := NodeUID{1}, NodeUID{2}
	ev := func(kind string, st MemberStatus) MemberEvent {
		return MemberEvent{Member: Member{UID: a, Status: st}, Kind: kind}
	}
	steps := []struct {
		event MemberEvent
		away  bool // a is away after it
	}{
		{ev(eventMemberUnreachable, MemberUp), true},
		{ev(eventMemberUnreachable, MemberUp), true},
		{ev(eventMemberReachable, MemberUp), false},
		{ev(eventMemberReachable, MemberUp), false},
		{ev(eventMemberUnreachable, MemberUp), true},
		{ev(eventMemberStatus, MemberDown), true},
		{ev(eventMemberReachable, MemberUp), true}, // (downed: for good)
		{ev(eventMemberStatus, MemberRemoved), true},
	}
	var cur *map[NodeUID]bool
	for i, st := range steps {
		if m := goneAfter(cur, []MemberEvent{st.event}, self); m != nil {
			cur = &m
		}
		_, away := (*cur)[a]
		if away != st.away {
			t.Fatalf("step %d (%s %s): away %v; want %v", i, st.event.Kind, st.event.Member.Status, away, st.away)
		}
	}
	if m := goneAfter(cur, []MemberEvent{{Member: Member{UID: self, Status: MemberDown}, Kind: eventMemberStatus}}, self); m != nil {
		t.Fatal("this member's own event changed the set")
	}
}

// A message left in a region's mailbox when it stops is a dead letter of
// the user's message, to the entity, with ErrEntityUnavailable: not of
// troupe's envelope.
func TestAnEnvelopesDeadLetterNamesTheUsersMessage(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	n := startNode(t, failConfig("a", 20*time.Millisecond, 2*time.Second))
	dead := make(chan DeadLetter, 1)
	sub := SubscribeChan(n, dead)
	defer sub.Unsubscribe()
	n.dead.deadLetter("/system/sharding-k", shardEnvelope[testPing]{id: "x", msg: testPing{N: 7}, to: "/system/sharding-k/entity/x"}, ErrActorStopped)
	d := <-dead
	if m, ok := d.Message.(testPing); !ok || m.N != 7 || d.Target != "/system/sharding-k/entity/x" || !errors.Is(d.Reason, ErrEntityUnavailable) {
		t.Fatalf("dead letter %T %+v to %s (%v); want the testPing to the entity, ErrEntityUnavailable", d.Message, d.Message, d.Target, d.Reason)
	}
}

// A region's word that reaches the coordinator through another member's
// station (as it does while this member sees that one as the oldest) is
// taken as this member's, not as the relaying one's.
func TestARegionsWordRelayedByAnotherStationIsItsOwn(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	r := newClusterRig(t, 3, clusterCfg(nil))
	for _, m := range r.members[0].Members() {
		if m.UID != r.nodes[0].uid && m.UpNumber != 0 && m.UpNumber < r.members[0].Self().UpNumber { // (0: m0 has not yet heard it is up)
			t.Fatalf("m0 is not the oldest member: the coordinator would not run there")
		}
	}
	var kinds []*Sharded[int]
	for _, c := range r.members {
		k, err := Sharding(c, "k", func(string) Behavior[int] { return Behavior[int]{Receive: func(*Context[int], int) {}} },
			ShardingConfig{Shards: 6, RebalanceInterval: 50 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		kinds = append(kinds, k)
	}
	placed := map[int]bool{}
	for i := 0; len(placed) < 6; i++ {
		id := fmt.Sprint("e", i)
		if !placed[kinds[0].Shard(id)] {
			placed[kinds[0].Shard(id)] = true
			kinds[0].Entity(id).Tell(i)
		}
	}
	shards := func() [3]int {
		return [3]int{kinds[0].Stats().Shards, kinds[1].Stats().Shards, kinds[2].Stats().Shards}
	}
	waitFor(t, 10*time.Second, "two shards on every member", func() bool { return shards() == [3]int{2, 2, 2} })
	// m2 says it leaves, through m1's station; the coordinator runs on m0.
	// A leaving region says so every tick, so this one does too: a loaded
	// machine may stall the coordinator's member past the pause budget,
	// and the coordinator that starts again knows only what it hears
	// after.
	leaving := func() {
		tellMember(r.nodes[2], r.nodes[1].Addrs()[0], "/system/singleton-sharding-k", shardCoordMsg(shardLeaving{Origin: r.nodes[2].uid}))
	}
	leaving()
	said := time.Now()
	waitFor(t, 10*time.Second, "m2's shards moved to m0 and m1", func() bool {
		if time.Since(said) > 200*time.Millisecond {
			leaving()
			said = time.Now()
		}
		now := shards()
		if now[1] < 2 {
			t.Fatalf("m1 gives its shards away (%v): m2's word was taken as m1's", now)
		}
		return now == [3]int{3, 3, 0}
	})
}

// Each of a region's words is taken as from the member it names when a
// member delivered it, and dropped when a node that is no member relays
// it.
func TestTheCoordinatorTakesEachWordAsFromItsRegion(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	r := newClusterRig(t, 3, clusterCfg(nil))
	m0, m1, m2, stranger := r.nodes[0].uid, r.nodes[1].uid, r.nodes[2].uid, NodeUID{0xee}
	for _, tc := range []struct {
		origin, via, want NodeUID
		ok                bool
	}{
		{NodeUID{}, m1, m1, true},            // a word from before Origin
		{m2, m2, m2, true},                   // straight from its member
		{m0, m0, m0, true},                   // this member's own region
		{m2, m1, m2, true},                   // relayed by another member
		{m2, stranger, NodeUID{}, false},     // relayed by no member: dropped
		{stranger, stranger, stranger, true}, // (a node speaks for itself)
	} {
		if got, ok := k0(r).sender(tc.origin, tc.via); got != tc.want || ok != tc.ok {
			t.Errorf("sender(%v, %v) = %v, %v; want %v, %v", tc.origin, tc.via, got, ok, tc.want, tc.ok)
		}
	}
	// Every word, relayed by m1 for m2.
	k := k0(r)
	k.epoch = 7
	k.receive(shardRegister{Epoch: 7, Count: 6, Shards: []int32{1}, Origin: m2, sentBy: sentBy{from: m1}}, time.Now())
	if k.regions[m2] == nil || k.regions[m1] != nil || k.homes[1] != m2 {
		t.Fatalf("register: regions %v, homes %v; want m2's region running shard 1", k.regions, k.homes)
	}
	k.receive(shardWhere{Shard: 2, Origin: m2, sentBy: sentBy{from: m1}}, time.Now())
	if len(k.asks[2]) != 1 || k.asks[2][0] != m2 {
		t.Fatalf("where: asks %v; want m2 asking for shard 2", k.asks[2])
	}
	k.receive(shardStopped{Shard: 1, Origin: m2, sentBy: sentBy{from: m1}}, time.Now())
	if _, ok := k.homes[1]; ok {
		t.Fatalf("stopped: shard 1 still runs on %v", k.homes[1])
	}
	k.regions[m1] = &coordRegion{}
	k.receive(shardLeaving{Origin: m2, sentBy: sentBy{from: m1}}, time.Now())
	if !k.regions[m2].leaving || k.regions[m1].leaving {
		t.Fatal("leaving: not m2's region that leaves")
	}
	k.receive(shardRegionGone{Origin: m2, sentBy: sentBy{from: m1}}, time.Now())
	if !k.regions[m2].gone || k.regions[m1].gone {
		t.Fatal("gone: not m2's region that is gone")
	}
	k.receive(shardRegionGone{Origin: m1, sentBy: sentBy{from: stranger}}, time.Now())
	if k.regions[m1].gone {
		t.Fatal("a node that is no member spoke for m1")
	}
}

// k0 is a coordinator on the rig's first member, not started.
func k0(r *clusterRig) *coordinator {
	c := r.members[0]
	return newCoordinatorState(clusterCoordHost{c: c, path: "/system/sharding-k"}, ShardingConfig{Shards: 6}.withDefaults(c))
}

// coordRig is a coordinator on a member of a fixed membership, with what
// it tells each region.
type coordRig struct {
	me      NodeUID
	all     []Member
	told    map[NodeUID][]regionMsg
	unreach map[NodeUID]bool
}

func (h *coordRig) self() NodeUID                { return h.me }
func (h *coordRig) members() []Member            { return slices.Clone(h.all) }
func (h *coordRig) downs() map[NodeUID]time.Time { return nil }
func (h *coordRig) logger() *slog.Logger         { return slog.New(slog.NewTextHandler(io.Discard, nil)) }
func (h *coordRig) listable() map[NodeUID]Addr {
	out := map[NodeUID]Addr{}
	for _, m := range h.all {
		if m.UID != h.me && !h.unreach[m.UID] {
			out[m.UID] = m.Addr
		}
	}
	return out
}
func (h *coordRig) tellRegion(uid NodeUID, msg regionMsg) bool {
	h.told[uid] = append(h.told[uid], msg)
	return true
}

// A region answers a hand-off it is asked for again after it stopped the
// shard with a stop of its own; if the coordinator has meanwhile placed
// the shard back on that member (the member it was headed for could not
// take it), that stop, which answers the earlier hand-off, must not
// unplace it: the coordinator would place it a second time while the
// member runs it. (Found by the simulator: TestClusterSimShardsUnderFaults's
// soak, seed 185.)
func TestAStopThatAnswersAnEarlierHandOffUnplacesNothing(t *testing.T) {
	t.Parallel()
	x, y, c := NodeUID{1}, NodeUID{2}, NodeUID{3}
	h := &coordRig{me: c, told: map[NodeUID][]regionMsg{}, unreach: map[NodeUID]bool{}}
	for i, uid := range []NodeUID{c, x, y} {
		h.all = append(h.all, Member{UID: uid, Addr: tcpAddr(fmt.Sprintf("10.0.0.%d:7000", i+1)), Status: MemberUp, UpNumber: i + 1})
	}
	cfg := ShardingConfig{Shards: 4, RebalanceInterval: time.Hour, HandOffTimeout: 10 * time.Second, RemovalMargin: 20 * time.Second, PassivateAfter: -1, Buffer: 10}
	k := newCoordinatorState(h, cfg)
	now := simEpoch
	k.start(1, 1, now)
	// c runs nothing; x runs every shard; y none.
	k.receive(shardRegister{Epoch: k.epoch, Count: 4, Origin: c, sentBy: sentBy{from: c}}, now)
	k.receive(shardRegister{Epoch: k.epoch, Count: 4, Shards: []int32{0, 1, 2, 3}, Origin: x, sentBy: sentBy{from: x}}, now)
	k.receive(shardRegister{Epoch: k.epoch, Count: 4, Origin: y, sentBy: sentBy{from: y}}, now)
	k.regions[c].leaving = true // (takes none)
	k.startMove(plannedMove{shard: 2, from: x, to: y}, now)
	move := k.moves[2].seq
	// The hand-off is asked again; meanwhile y becomes unreachable, so the
	// shard goes back to x, the only member left to take it.
	now = now.Add(cfg.HandOffTimeout)
	k.receive(coordTick{}, now)
	h.unreach[y] = true
	k.receive(shardStopped{Shard: 2, Origin: x, sentBy: sentBy{from: x}, Epoch: k.epoch, Move: move}, now)
	if k.homes[2] != x || k.moves[2] != nil {
		t.Fatalf("after the stop: home %v, move %+v; want the shard placed back on x", k.homes[2], k.moves[2])
	}
	// x, which runs nothing then, answers the hand-off asked again with
	// a stop; it runs the shard again once told it is placed there.
	k.receive(shardStopped{Shard: 2, Origin: x, sentBy: sentBy{from: x}, Epoch: k.epoch, Move: move}, now)
	if k.homes[2] != x {
		t.Fatalf("a stop that answers the earlier hand-off unplaced the shard from x, which runs it (home %v)", k.homes[2])
	}
	// A stop that answers a hand-off after the placement does.
	k.startMove(plannedMove{shard: 2, from: x, to: y}, now)
	later := k.moves[2].seq
	h.unreach[y] = false
	k.receive(shardStopped{Shard: 2, Origin: x, sentBy: sentBy{from: x}, Epoch: k.epoch, Move: move}, now)
	if k.moves[2] == nil {
		t.Fatal("a stop that answers an earlier hand-off ended the move under way")
	}
	k.receive(shardStopped{Shard: 2, Origin: x, sentBy: sentBy{from: x}, Epoch: k.epoch, Move: later}, now)
	if k.homes[2] != y || k.moves[2] != nil {
		t.Fatalf("after the move's own stop: home %v, move %+v; want the shard on y", k.homes[2], k.moves[2])
	}
	// A region of an earlier version numbers no stop: taken as before.
	k.receive(shardStopped{Shard: 2, Origin: y, sentBy: sentBy{from: y}}, now)
	if _, ok := k.homes[2]; ok {
		t.Fatalf("a stop from y without numbers left the shard on %v", k.homes[2])
	}
	// A coordinator that starts while x stops shard 3 for the one before
	// learns from x's registration that x runs it; x's stop, numbered by
	// the earlier coordinator, then says so. A shard the new one placed
	// is not unplaced by such a stop.
	old := k.epoch
	k2 := newCoordinatorState(h, cfg)
	k2.start(1, 2, now)
	k2.receive(shardRegister{Epoch: k2.epoch, Count: 4, Shards: []int32{3}, Origin: x, sentBy: sentBy{from: x}}, now)
	k2.receive(shardRegister{Epoch: k2.epoch, Count: 4, Origin: y, sentBy: sentBy{from: y}}, now)
	k2.receive(shardRegister{Epoch: k2.epoch, Count: 4, Origin: c, sentBy: sentBy{from: c}}, now)
	if k2.homes[3] != x {
		t.Fatalf("the new coordinator has shard 3 on %v; want x, which registered it", k2.homes[3])
	}
	k2.receive(shardStopped{Shard: 3, Origin: x, sentBy: sentBy{from: x}, Epoch: old, Move: 99}, now)
	if _, ok := k2.homes[3]; ok {
		t.Fatal("x's stop for the earlier coordinator left shard 3 on x")
	}
	k2.receive(shardWhere{Shard: 1, Origin: y, sentBy: sentBy{from: y}}, now)
	on, ok := k2.homes[1]
	if !ok {
		t.Fatal("shard 1 not placed when asked for")
	}
	k2.receive(shardStopped{Shard: 1, Origin: on, sentBy: sentBy{from: on}, Epoch: old, Move: 99}, now)
	if k2.homes[1] != on {
		t.Fatal("a stop for the earlier coordinator unplaced a shard the new one placed")
	}
}
