package troupe

import (
	"context"
	"errors"
	"net"
	"slices"
	"sync"
	"testing"
	"time"
)

var echoKey = ServiceKey[testPing]{Name: "echoes"}

// listingPaths lists the paths of refs, sorted.
func listingPaths(refs []Ref[testPing]) []string {
	var out []string
	for _, r := range refs {
		out = append(out, r.Path())
	}
	slices.Sort(out)
	return out
}

// followService runs ServiceKey.Watch on n and returns its listings.
func followService(t *testing.T, n *Node) <-chan []string {
	t.Helper()
	ch := make(chan []string, 256)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		echoKey.Watch(ctx, n, func(refs []Ref[testPing]) { ch <- listingPaths(refs) })
	}()
	t.Cleanup(func() { cancel(); <-done })
	return ch
}

// awaitListing waits until ch delivers want.
func awaitListing(t *testing.T, ch <-chan []string, what string, want ...string) {
	t.Helper()
	deadline := time.After(15 * time.Second)
	var last []string
	for {
		select {
		case last = <-ch:
			if slices.Equal(last, want) || len(want) == 0 && len(last) == 0 {
				return
			}
		case <-deadline:
			t.Fatalf("%s: the last listing was %v, want %v", what, last, want)
		}
	}
}

func registerEcho(t *testing.T, n *Node, name string) Ref[testPing] {
	t.Helper()
	r := spawnEcho(t, n, name)
	if err := echoKey.Register(n, r); err != nil {
		t.Fatal(err)
	}
	return r
}

// A ServiceKey.Watch follows the registry through a failover: the registrar
// vanishes, another node takes its address over, the nodes register
// again, and what is registered after is pushed by the new registrar,
// in a listing that holds every actor again.
func TestWatchServiceFollowsARegistrarFailover(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	f := new(FaultNet)
	reg := freeRegistryAddr(t, "tcp")
	cfg := func(name string) Config {
		c := failConfig(name, 20*time.Millisecond, time.Second) // (a window a loaded machine does not trip)
		c.RegistryAddrs = []string{reg}
		return c
	}
	first := startOn(t, f, cfg("first"))
	if !first.registrar.isRegistrar() {
		t.Fatal("the first node did not become the registrar")
	}
	a, b := startOn(t, f, cfg("a")), startOn(t, f, cfg("b"))
	registerEcho(t, a, "ea")
	registerEcho(t, b, "eb")
	ch := followService(t, b)
	awaitListing(t, ch, "before the failover", "/user/ea", "/user/eb")
	f.Kill(first)
	waitFor(t, 10*time.Second, "a new registrar", func() bool { return a.registrar.isRegistrar() != b.registrar.isRegistrar() })
	// (The listing is the same: it is not delivered again.)
	registerEcho(t, a, "ea2")
	awaitListing(t, ch, "a registration after the failover", "/user/ea", "/user/ea2", "/user/eb")
}

// Over etcd: ServiceKey.Find lists the actors of every node, and ServiceKey.Watch
// is pushed by etcd's watch stream: a registration, a stop, and a node
// that closes (its entries go with its lease).
func TestServiceKeysOverEtcd(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	slowTest(t)
	url := sharedEtcdURL(t)
	a, b := etcdNode(t, "alpha", url), etcdNode(t, "beta", url)
	registerEcho(t, a, "ea")
	eb := registerEcho(t, b, "eb")
	refs, err := echoKey.Find(ctxT(t, 10*time.Second), a)
	if err != nil || !slices.Equal(listingPaths(refs), []string{"/user/ea", "/user/eb"}) {
		t.Fatalf("ServiceKey.Find = %v, %v", listingPaths(refs), err)
	}
	for _, r := range refs {
		roundTripRef(t, a, r)
	}
	ch := followService(t, b)
	awaitListing(t, ch, "the first listing", "/user/ea", "/user/eb")
	registerEcho(t, a, "ea2")
	awaitListing(t, ch, "ea2 registered", "/user/ea", "/user/ea2", "/user/eb")
	b.Stop(eb)
	awaitListing(t, ch, "eb stopped", "/user/ea", "/user/ea2")
	a.Close()
	awaitListing(t, ch, "alpha closed")
}

// subscribePings subscribes an actor of n to pingTopic and returns what
// it receives.
func subscribePings(t *testing.T, n *Node, name string) <-chan int {
	t.Helper()
	got := make(chan int, 256)
	ref, err := Spawn(n, name, Behavior[testPing]{Receive: func(_ *Context[testPing], p testPing) { got <- p.N }})
	if err != nil {
		t.Fatal(err)
	}
	if err := pingTopic.Subscribe(n, ref); err != nil {
		t.Fatal(err)
	}
	return got
}

var pingTopic = Topic[testPing]{Name: "pings"}

// A node's topic relays are registered again with everything else: after
// the registrar fails over, a publisher on another node still reaches
// the subscriber.
func TestTopicRelaysFollowARegistrarFailover(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	f := new(FaultNet)
	reg := freeRegistryAddr(t, "tcp")
	cfg := func(name string) Config {
		c := failConfig(name, 20*time.Millisecond, time.Second) // (a window a loaded machine does not trip)
		c.RegistryAddrs = []string{reg}
		return c
	}
	first := startOn(t, f, cfg("first"))
	a, b := startOn(t, f, cfg("a")), startOn(t, f, cfg("b"))
	got := subscribePings(t, b, "sub")
	if err := pingTopic.Publish(ctxT(t, 10*time.Second), a, testPing{N: 1}); err != nil {
		t.Fatal(err)
	}
	if n := recv(t, got, "the first publish"); n != 1 {
		t.Fatalf("got %d", n)
	}
	f.Kill(first)
	waitFor(t, 10*time.Second, "a new registrar that lists b's relay", func() bool {
		if a.registrar.isRegistrar() == b.registrar.isRegistrar() {
			return false
		}
		r, err := a.Registry()
		if err != nil {
			return false
		}
		found, err := r.Find(ctxT(t, time.Second), topicPrefix+"pings")
		return err == nil && len(found) == 1
	})
	// Once a publish gets through (a's listing follows the new registrar),
	// every one does, in order.
	waitFor(t, 10*time.Second, "a publish to reach b after the failover", func() bool {
		if err := pingTopic.Publish(ctxT(t, time.Second), a, testPing{N: -1}); err != nil {
			return false
		}
		select {
		case <-got:
			return true
		case <-time.After(100 * time.Millisecond):
			return false
		}
	})
	for i := 2; i <= 50; i++ {
		if err := pingTopic.Publish(ctxT(t, 10*time.Second), a, testPing{N: i}); err != nil {
			t.Fatal(err)
		}
	}
	for want := 2; want <= 50; {
		switch n := recv(t, got, "a publish after the failover"); n {
		case -1: // a late probe
		case want:
			want++
		default:
			t.Fatalf("got %d, want %d", n, want)
		}
	}
}

// Topics over etcd: the relay is written by the node's etcd writer, and
// a publisher on another node reaches the subscriber.
func TestTopicsOverEtcd(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	slowTest(t)
	url := sharedEtcdURL(t)
	a, b := etcdNode(t, "alpha", url), etcdNode(t, "beta", url)
	got := subscribePings(t, b, "sub")
	for i := 1; i <= 20; i++ {
		if err := pingTopic.Publish(ctxT(t, 10*time.Second), a, testPing{N: i}); err != nil {
			t.Fatal(err)
		}
	}
	for want := 1; want <= 20; want++ {
		if n := recv(t, got, "a publish"); n != want {
			t.Fatalf("got %d, want %d", n, want)
		}
	}
}

// Registry.Watch of an etcd registry is pushed by etcd's watch stream:
// the table, then each registration and removal, until ctx ends; and it
// ends with ErrNodeClosed when the node closes.
func TestRegistryWatchOverEtcd(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	slowTest(t)
	url := sharedEtcdURL(t)
	a, b := etcdNode(t, "alpha", url), etcdNode(t, "beta", url)
	reg, err := a.Registry()
	if err != nil {
		t.Fatal(err)
	}
	changes := make(chan RegistryChange, 64)
	ended := make(chan error, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { ended <- reg.Watch(ctx, func(c RegistryChange) { changes <- c }) }()
	next := func(what string) RegistryChange {
		t.Helper()
		select {
		case c := <-changes:
			return c
		case err := <-ended:
			t.Fatalf("%s: the watch ended: %v", what, err)
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: nothing came", what)
		}
		return RegistryChange{}
	}
	names := func(rs []Registration) []string {
		var out []string
		for _, r := range rs {
			out = append(out, r.Name)
		}
		slices.Sort(out)
		return out
	}
	if c := next("the table"); !c.Snapshot || !slices.Equal(names(c.Added), []string{"alpha", "beta"}) {
		t.Fatalf("first call: %+v, want a snapshot of both nodes", c)
	}
	x := spawnEcho(t, b, "x")
	if c := next("x registered"); c.Snapshot || !slices.Equal(names(c.Added), []string{"x"}) || len(c.Removed) != 0 {
		t.Fatalf("after x was spawned: %+v", c)
	}
	b.Stop(x)
	if c := next("x stopped"); c.Snapshot || len(c.Added) != 0 || !slices.Equal(names(c.Removed), []string{"x"}) {
		t.Fatalf("after x stopped: %+v", c)
	}
	cancel()
	select {
	case err := <-ended:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Watch returned %v, want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Watch did not return when its ctx ended")
	}
	go func() { ended <- reg.Watch(context.Background(), func(RegistryChange) {}) }()
	next2 := time.After(10 * time.Second)
	a.Close()
	select {
	case err := <-ended:
		if !errors.Is(err, ErrNodeClosed) {
			t.Fatalf("Watch returned %v as its node closed, want ErrNodeClosed", err)
		}
	case <-next2:
		t.Fatal("Watch did not return when its node closed")
	}
}

// Registry.Watch of an etcd that accepts connections and never answers
// ends with ErrWatchLost, not a wait without end.
func TestRegistryWatchOfASilentEtcdIsLost(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var conns []net.Conn
	var mu sync.Mutex
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c) // (held open, never answered)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
	})
	cfg := testConfig()
	cfg.Name = "watcher"
	cfg.EtcdElectionTimeout = 200 * time.Millisecond
	n := startNode(t, cfg)
	reg, err := n.Registry(WithRegistries("etcd://" + l.Addr().String() + "/silent"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err = reg.Watch(ctx, func(RegistryChange) {})
	if !errors.Is(err, ErrWatchLost) {
		t.Fatalf("Watch of a silent etcd: %v, want ErrWatchLost", err)
	}
}
