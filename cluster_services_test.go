package troupe_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"troupe"
)

// registrylessCluster starts members on f with no registry at all, the
// first starting the cluster and the others joining through it, and
// waits until every one sees them all up.
func registrylessCluster(t *testing.T, f *troupe.FaultNet, cfg troupe.ClusterConfig, names ...string) ([]*troupe.Node, []*troupe.Cluster) {
	t.Helper()
	var nodes []*troupe.Node
	var members []*troupe.Cluster
	for _, name := range names {
		n, c := joinRegistryless(t, f, name, nodes, cfg)
		nodes, members = append(nodes, n), append(members, c)
	}
	waitAllUp(t, members, len(names))
	return nodes, members
}

// joinRegistryless starts a node with no registry on f and makes it a
// member, through the first of others (or as the first member).
func joinRegistryless(t *testing.T, f *troupe.FaultNet, name string, others []*troupe.Node, cfg troupe.ClusterConfig) (*troupe.Node, *troupe.Cluster) {
	t.Helper()
	n := registrylessNode(t, f, name)
	return n, startMember(t, n, others, cfg)
}

// registrylessNode starts a node with no registry on f.
func registrylessNode(t *testing.T, f *troupe.FaultNet, name string) *troupe.Node {
	t.Helper()
	n, err := f.Start(ctxFor(t), troupe.Config{Name: name, HeartbeatInterval: 20 * time.Millisecond, UnreachableAfter: 2 * time.Second,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}

// startMember makes n a member, through the first of others (or as the
// first member).
func startMember(t *testing.T, n *troupe.Node, others []*troupe.Node, cfg troupe.ClusterConfig) *troupe.Cluster {
	t.Helper()
	if cfg.StableAfter == 0 {
		cfg.StableAfter = 300 * time.Millisecond
	}
	if len(others) > 0 {
		cfg.Seeds = []string{others[0].Addrs()[0].String()}
	}
	c, err := troupe.StartCluster(ctxFor(t), n, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func waitAllUp(t *testing.T, members []*troupe.Cluster, want int) {
	t.Helper()
	waitUntil(t, 10*time.Second, fmt.Sprintf("%d members up everywhere", want), func() bool { return allUp(members, want) })
}

// listings follows key on n into the latest listing's paths.
type listings struct {
	mu   sync.Mutex
	last []string
	n    int
}

func (l *listings) set(refs []troupe.Ref[job]) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.last, l.n = paths(refs), l.n+1
}

func (l *listings) get() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.last)
}

// followKey runs ServiceKey.Watch of workersKey on n until the test ends; its
// error arrives on the returned channel.
func followKey(t *testing.T, n *troupe.Node) (*listings, <-chan error) {
	l := &listings{}
	ctx, cancel := context.WithCancel(context.Background())
	errc, done := make(chan error, 1), make(chan struct{})
	go func() {
		defer close(done)
		errc <- workersKey.Watch(ctx, n, l.set)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return l, errc
}

// Without a registrar or etcd, the members of a cluster keep the service
// keys: an actor registered on any member is found and followed from
// every member, and answers through its ref; it leaves every listing when
// it stops or is deregistered, and the listing of a member that cannot
// reach it (coming back when it can again); a member that joins later
// gets the listing and adds its own.
func TestServiceKeysLiveInTheClusterWithoutARegistry(t *testing.T) {
	t.Parallel()
	f := new(troupe.FaultNet)
	nodes, _ := registrylessCluster(t, f, troupe.ClusterConfig{}, "a", "b", "c")
	refs := make([]troupe.Ref[job], len(nodes))
	for i, n := range nodes {
		refs[i] = spawnWorker(t, n, fmt.Sprintf("w%d", i))
	}
	watchA, _ := followKey(t, nodes[0])
	watchC, _ := followKey(t, nodes[2])
	all := []string{"/user/w0", "/user/w1", "/user/w2"}
	for _, w := range []*listings{watchA, watchC} {
		waitUntil(t, 10*time.Second, "every member's worker in the listing", func() bool { return slices.Equal(w.get(), all) })
	}
	// b learns each member's entries on its own (c's push to b may come
	// after a and c have theirs): Find on b, until it has them all.
	var found []troupe.Ref[job]
	waitUntil(t, 10*time.Second, "ServiceKey.Find on b to return the three workers", func() bool {
		var err error
		found, err = workersKey.Find(ctxFor(t), nodes[1])
		if err != nil {
			t.Fatalf("ServiceKey.Find on b: %v", err)
		}
		return len(found) == 3
	})
	for _, r := range found {
		reply, err := troupe.Ask(ctxFor(t), r, func(to troupe.Ref[string]) job { return job{N: 7, Reply: to} })
		want := r.Path()[len("/user/"):] + ":7"
		if err != nil || reply != want {
			t.Fatalf("Ask through a listed ref: %q, %v; want %q", reply, err, want)
		}
	}

	nodes[1].Stop(refs[1])
	waitUntil(t, 10*time.Second, "a stopped actor to leave the listings", func() bool {
		return slices.Equal(watchA.get(), []string{"/user/w0", "/user/w2"}) && slices.Equal(watchC.get(), []string{"/user/w0", "/user/w2"})
	})
	if !workersKey.Unregister(nodes[2], refs[2]) {
		t.Fatal("ServiceKey.Unregister: w2 was not registered")
	}
	waitUntil(t, 10*time.Second, "a deregistered actor to leave the listing", func() bool { return slices.Equal(watchA.get(), []string{"/user/w0"}) })
	if err := workersKey.Register(nodes[2], refs[2]); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 10*time.Second, "w2 back", func() bool { return slices.Equal(watchA.get(), []string{"/user/w0", "/user/w2"}) })

	// A partition between a and c: each drops the other's worker, and b,
	// which reaches both, keeps both. Healed, they come back.
	bFinds := func() []string {
		l, err := workersKey.Find(ctxFor(t), nodes[1])
		if err != nil {
			t.Fatalf("ServiceKey.Find on b: %v", err)
		}
		return paths(l)
	}
	waitUntil(t, 10*time.Second, "b to list w0 and w2 (it learns each member's entries on its own)", func() bool {
		return slices.Equal(bFinds(), []string{"/user/w0", "/user/w2"})
	})
	f.Partition(nodes[0], nodes[2])
	waitUntil(t, 10*time.Second, "an unreachable member's worker to leave", func() bool {
		return slices.Equal(watchA.get(), []string{"/user/w0"}) && slices.Equal(watchC.get(), []string{"/user/w2"})
	})
	// (Polled: with heartbeats every 20 ms, a loaded machine can make b
	// suspect c for a moment, and b's listing leaves out what b suspects;
	// a b that dropped c's worker for good fails here.)
	waitUntil(t, 10*time.Second, "ServiceKey.Find on b, which reaches both sides, to return both", func() bool {
		return slices.Equal(bFinds(), []string{"/user/w0", "/user/w2"})
	})
	f.Heal()
	waitUntil(t, 10*time.Second, "a reachable member's worker to come back", func() bool {
		return slices.Equal(watchA.get(), []string{"/user/w0", "/user/w2"}) && slices.Equal(watchC.get(), []string{"/user/w0", "/user/w2"})
	})

	// A member that joins later gets the listing, and adds its own.
	d, _ := joinRegistryless(t, f, "d", nodes, troupe.ClusterConfig{})
	waitUntil(t, 10*time.Second, "the joiner to find the workers", func() bool {
		l, err := workersKey.Find(ctxFor(t), d)
		return err == nil && slices.Equal(paths(l), []string{"/user/w0", "/user/w2"})
	})
	spawnWorker(t, d, "w3")
	waitUntil(t, 10*time.Second, "the joiner's worker in the listings", func() bool {
		return slices.Equal(watchA.get(), []string{"/user/w0", "/user/w2", "/user/w3"}) && slices.Equal(watchC.get(), []string{"/user/w0", "/user/w2", "/user/w3"})
	})
}

// A member that crashes leaves the listings once it is unreachable, and
// stays out once it is downed and removed; a member that leaves takes its
// entries with it. On a member whose cluster stops, ServiceKey.Watch ends
// with ErrClusterStopped, a ServiceKey.Subscribe subscriber gets a last,
// empty listing, and lookups and registrations return ErrNoRegistry.
func TestClusterServiceListingsFollowMembersThatGo(t *testing.T) {
	t.Parallel()
	f := new(troupe.FaultNet)
	nodes, members := registrylessCluster(t, f, troupe.ClusterConfig{Downing: troupe.KeepMajority()}, "a", "b", "c")
	for i, n := range nodes {
		spawnWorker(t, n, fmt.Sprintf("w%d", i))
	}
	watchA, _ := followKey(t, nodes[0])
	waitUntil(t, 10*time.Second, "three workers", func() bool { return len(watchA.get()) == 3 })
	cUID := nodes[2].UID()
	f.Kill(nodes[2])
	waitUntil(t, 10*time.Second, "a crashed member's worker to leave", func() bool {
		return slices.Equal(watchA.get(), []string{"/user/w0", "/user/w1"})
	})
	waitUntil(t, 10*time.Second, "the crashed member to be downed and removed", func() bool {
		for _, m := range members[0].Members() {
			if m.UID == cUID {
				return m.Status == troupe.MemberRemoved
			}
		}
		return true
	})
	if got := watchA.get(); !slices.Equal(got, []string{"/user/w0", "/user/w1"}) {
		t.Fatalf("after the crashed member was removed, the listing is %v", got)
	}

	listings := make(chan troupe.ServiceListing[job], 16)
	sub, err := troupe.Spawn(nodes[1], "subscriber", troupe.Behavior[troupe.ServiceListing[job]]{
		Receive: func(_ *troupe.Context[troupe.ServiceListing[job]], l troupe.ServiceListing[job]) { listings <- l },
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := workersKey.Subscribe(nodes[1], sub); err != nil {
		t.Fatal(err)
	}
	_, errB := followKey(t, nodes[1])
	waitUntil(t, 10*time.Second, "the subscriber's first listing", func() bool { return len(listings) > 0 })
	if err := members[1].Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errB:
		if !errors.Is(err, troupe.ErrClusterStopped) {
			t.Fatalf("ServiceKey.Watch on a member whose cluster stopped: %v, want ErrClusterStopped", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("ServiceKey.Watch did not end when its cluster stopped")
	}
	var last troupe.ServiceListing[job]
	waitUntil(t, 10*time.Second, "the subscriber's last, empty listing", func() bool {
		for len(listings) > 0 {
			last = <-listings
		}
		return len(last.Refs) == 0
	})
	if _, err := workersKey.Find(ctxFor(t), nodes[1]); !errors.Is(err, troupe.ErrNoRegistry) {
		t.Fatalf("ServiceKey.Find after the cluster stopped: %v, want ErrNoRegistry", err)
	}
	w, err := troupe.Spawn(nodes[1], "late", troupe.Behavior[job]{Receive: func(*troupe.Context[job], job) {}})
	if err != nil {
		t.Fatal(err)
	}
	if err := workersKey.Register(nodes[1], w); !errors.Is(err, troupe.ErrNoRegistry) {
		t.Fatalf("ServiceKey.Register after the cluster stopped: %v, want ErrNoRegistry", err)
	}
	waitUntil(t, 10*time.Second, "a member that left to take its worker along", func() bool {
		return slices.Equal(watchA.get(), []string{"/user/w0"})
	})
}

// Before a node is a cluster member, with no registry, registering a
// service returns ErrNoRegistry; the cluster keeps service keys and
// topics only: a name lookup still needs a registry.
func TestAClusterRegistryServesServiceKeysOnly(t *testing.T) {
	t.Parallel()
	f := new(troupe.FaultNet)
	n := registrylessNode(t, f, "alone")
	w, err := troupe.Spawn(n, "w", troupe.Behavior[job]{Receive: func(*troupe.Context[job], job) {}})
	if err != nil {
		t.Fatal(err)
	}
	if err := workersKey.Register(n, w); !errors.Is(err, troupe.ErrNoRegistry) {
		t.Fatalf("ServiceKey.Register before StartCluster: %v, want ErrNoRegistry", err)
	}
	startMember(t, n, nil, troupe.ClusterConfig{})
	if err := workersKey.Register(n, w); err != nil {
		t.Fatalf("ServiceKey.Register on a member: %v", err)
	}
	if l, err := workersKey.Find(ctxFor(t), n); err != nil || len(l) != 1 {
		t.Fatalf("ServiceKey.Find on the member: %v, %v", paths(l), err)
	}
	if _, err := troupe.FindActor[job](ctxFor(t), n, "elsewhere"); !errors.Is(err, troupe.ErrNoRegistry) {
		t.Fatalf("FindActor on a member without a registry: %v, want ErrNoRegistry", err)
	}
}

// Topics work across a cluster's members without a registry: a message
// published on one member reaches every subscriber on the others exactly
// once, in order, also for a publisher that published, and a subscriber
// that subscribed, before its cluster started.
func TestTopicsAcrossAClusterWithoutARegistry(t *testing.T) {
	t.Parallel()
	f := new(troupe.FaultNet)
	first, err := f.Start(ctxFor(t), troupe.Config{Name: "pub", HeartbeatInterval: 20 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { first.Close() })
	news := troupe.Topic[int]{Name: "news"}
	if err := news.Publish(ctxFor(t), first, -1); err != nil {
		t.Fatalf("Publish with no registry and no cluster: %v", err)
	}
	c, err := troupe.StartCluster(ctxFor(t), first, troupe.ClusterConfig{StableAfter: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	got := map[string]chan int{"b": make(chan int, 1000), "d": make(chan int, 1000)}
	subscribe := func(name string, n *troupe.Node) {
		ch := got[name]
		ref, err := troupe.Spawn(n, "reader", troupe.Behavior[int]{Receive: func(_ *troupe.Context[int], v int) { ch <- v }})
		if err != nil {
			t.Fatal(err)
		}
		if err := news.Subscribe(n, ref); err != nil {
			t.Fatal(err)
		}
	}
	b := registrylessNode(t, f, "b")
	subscribe("b", b) // before its cluster starts
	cb := startMember(t, b, []*troupe.Node{first}, troupe.ClusterConfig{})
	d, cd := joinRegistryless(t, f, "d", []*troupe.Node{first}, troupe.ClusterConfig{})
	subscribe("d", d)
	waitAllUp(t, []*troupe.Cluster{c, cb, cd}, 3)
	// Probes until both subscribers hear one: the publisher lists both.
	heard := map[string]bool{}
	waitUntil(t, 10*time.Second, "both subscribers to hear the publisher", func() bool {
		if err := news.Publish(ctxFor(t), first, 0); err != nil {
			t.Fatal(err)
		}
		for name, ch := range got {
			for len(ch) > 0 {
				if v := <-ch; v == 0 {
					heard[name] = true
				}
			}
		}
		return heard["b"] && heard["d"]
	})
	const count = 200
	for i := 1; i <= count; i++ {
		if err := news.Publish(ctxFor(t), first, i); err != nil {
			t.Fatal(err)
		}
	}
	for name, ch := range got {
		next := 1
		for next <= count {
			select {
			case v := <-ch:
				if v == 0 {
					continue // a late probe
				}
				if v != next {
					t.Fatalf("%s heard %d, want %d (each once, in order)", name, v, next)
				}
				next++
			case <-time.After(10 * time.Second):
				t.Fatalf("%s heard %d of %d messages", name, next-1, count)
			}
		}
	}
}
