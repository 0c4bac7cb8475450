package troupe

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

// Lookups that never spin, crash or lie.

func TestWaitForANameOnlyANodeHoldsReturnsAtItsDeadline(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	slowTest(t)
	reg := freeRegistryAddr(t, "tcp")
	registrar := startNode(t, discoveryConfig("registrar", reg))
	startNode(t, discoveryConfig("billing", reg)) // a node, not an actor, named billing
	client := startNode(t, discoveryConfig("client", reg))
	for _, n := range []*Node{registrar, client} {
		before := registrar.registrar.reg().requests.Load()
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		done := make(chan error, 1)
		go func() { _, err := WaitForActor[testPing](ctx, n, "billing"); done <- err }()
		select {
		case err := <-done:
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("%s: WaitForActor = %v, want DeadlineExceeded", n.Name(), err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: WaitForActor for a node's name ignores its context", n.Name())
		}
		cancel()
		// Parked, not polled: a request to wait and one to cancel it.
		if got := registrar.registrar.reg().requests.Load() - before; got > 4 {
			t.Fatalf("%s: %d registry requests during one wait", n.Name(), got)
		}
	}
	// An actor registered under the name later answers the wait.
	waited := make(chan error, 1)
	go func() { _, err := WaitForActor[testPing](ctxT(t, 10*time.Second), client, "billing"); waited <- err }()
	spawnEcho(t, registrar, "billing")
	if err := recv(t, waited, "the wait to end"); err != nil {
		t.Fatalf("WaitForActor once an actor has the name: %v", err)
	}
}

// plantStale registers, in registrar's table, an actor on an address that
// refuses connections.
func plantStale(t *testing.T, registrar *Node, name string) {
	var ghost NodeUID
	rand.Read(ghost[:])
	registrar.registrar.registryRegister(Registration{Name: name, UUID: UUID(ghost), Path: "/user/" + name, Node: ghost, NodeName: "ghost", Addrs: []Addr{tcpAddr(freeRegistryAddr(t, "tcp")[len("tcp://"):])}})
}

func TestWaitMeetingAStaleEntryOnANodeThatIsNotTheRegistrar(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	reg := freeRegistryAddr(t, "tcp")
	registrar := startNode(t, discoveryConfig("registrar", reg))
	client := startNode(t, discoveryConfig("client", reg))
	plantStale(t, registrar, "svc")
	waited := make(chan error, 1)
	go func() { _, err := WaitForActor[testPing](ctxT(t, 10*time.Second), client, "svc"); waited <- err }()
	waitFor(t, 5*time.Second, "the stale entry to be deleted", func() bool { return len(registrar.registrar.reg().find("svc")) == 0 })
	spawnEcho(t, registrar, "svc")
	if err := recv(t, waited, "the wait to end"); err != nil {
		t.Fatalf("WaitForActor after a stale entry: %v", err)
	}
}

func TestFastPathForgetsAnActorThatStopped(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	reg := freeRegistryAddr(t, "tcp")
	server := startNode(t, discoveryConfig("server", reg))
	client := startNode(t, discoveryConfig("client", reg))
	svc := spawnEcho(t, server, "svc")
	ctx := ctxT(t, 5*time.Second)
	if _, err := FindActor[testPing](ctx, client, "svc"); err != nil {
		t.Fatalf("FindActor = %v", err)
	}
	stopped := watcher(t, server, "probe", svc)
	server.Stop(svc)
	recv(t, stopped, "svc to stop")
	waitFor(t, 5*time.Second, "the stopped actor to be forgotten", func() bool {
		_, err := FindActor[testPing](ctx, client, "svc")
		return errors.Is(err, ErrNotFound)
	})
}

// The fast path reads the list of found actors after letting go of the
// found table's lock, while a stopped actor (or an ended session) makes the
// node forget one: at a failover, FindActor and the forgetting meet. The
// list the fast path took must never change under it: a torn entry pairs
// one actor's protocol with another's handle (or a nil handle).
func TestFastPathBesideForgetReadsWholeEntries(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	n := startNode(t, testConfig())
	ping := protocolName(reflect.TypeFor[testPing]())
	var hs []*handle
	isPing := map[*handle]bool{}
	for i := range 6 {
		h := &handle{node: n, key: refKey{node: NodeUID{1}, path: fmt.Sprintf("/user/svc%d", i)}, assoc: &assoc{}}
		hs = append(hs, h)
		isPing[h] = i%2 == 0
	}
	proto := func(h *handle) string {
		if isPing[h] {
			return ping
		}
		return "other"
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 2000 {
			for _, h := range hs {
				n.disc.addFound("svc", h, proto(h))
			}
			for _, h := range hs {
				n.disc.forget("svc", h.key)
			}
		}
	}()
	for {
		select {
		case <-done:
			return
		default:
		}
		if r, ok := fastPath[testPing](n, "svc", nil); ok && !isPing[r.h] {
			t.Fatalf("the fast path returned %v, which is not a %T", r.h, testPing{})
		}
	}
}

func TestLookupsOnAClosedNode(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	reg := freeRegistryAddr(t, "tcp")
	n, err := Start(ctxT(t, 5*time.Second), discoveryConfig("closed", reg))
	if err != nil {
		t.Fatal(err)
	}
	checkLeaks(t)
	spawnEcho(t, n, "svc")
	n.Close()
	ctx := ctxT(t, 5*time.Second)
	if _, err := n.QueryActor(ctx, "svc"); !errors.Is(err, ErrNodeClosed) {
		t.Errorf("QueryActor = %v", err)
	}
	if _, err := FindActor[testPing](ctx, n, "svc"); !errors.Is(err, ErrNodeClosed) {
		t.Errorf("FindActor = %v", err)
	}
	if _, err := FindActorPerRegistrar[testPing](ctx, n, "svc"); !errors.Is(err, ErrNodeClosed) {
		t.Errorf("FindActorPerRegistrar = %v", err)
	}
	if _, err := WaitForActor[testPing](ctx, n, "svc"); !errors.Is(err, ErrNodeClosed) {
		t.Errorf("WaitForActor = %v", err)
	}
	if _, err := n.Registry(); !errors.Is(err, ErrNodeClosed) {
		t.Errorf("Registry = %v", err)
	}
}

// TestRegistrarRestartedAfterAKillGetsEverythingBack: a registrar killed
// without a goodbye and started again on its address is not quarantined by
// the nodes; within a few heartbeat intervals every node has registered
// again, and a WaitForActor parked on the old registrar is answered by
// the new one.
func TestRegistrarRestartedAfterAKillGetsEverythingBack(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	f := new(FaultNet)
	reg := freeRegistryAddr(t, "tcp")
	cfg := func(name string) Config {
		c := failConfig(name, 20*time.Millisecond, 300*time.Millisecond)
		c.RegistryAddrs = []string{reg}
		return c
	}
	dedicated := cfg("registrar")
	dedicated.EnsureRegistry = true
	old, err := f.Start(ctxT(t, 5*time.Second), dedicated)
	if err != nil {
		t.Fatal(err)
	}
	service := startOn(t, f, cfg("service"))
	client := startOn(t, f, cfg("client"))
	spawnEcho(t, service, "svc")

	waited := make(chan error, 1)
	go func() { _, err := WaitForActor[testPing](ctxT(t, 20*time.Second), client, "late"); waited <- err }()
	waitFor(t, 5*time.Second, "the wait to be parked", func() bool { return old.registrar.reg().waiting() == 1 })

	lost := make(chan PeerUnreachable, 4)
	SubscribeChan(service, lost)
	f.Kill(old)
	if e := recv(t, lost, "the service to lose the registrar"); e.Quarantined {
		t.Fatalf("the registrar was quarantined: %+v", e)
	}
	fresh := startOn(t, f, dedicated)
	waitFor(t, 5*time.Second, "the service to register again", func() bool { return len(fresh.registrar.reg().find("svc")) == 1 })
	waitFor(t, 5*time.Second, "the client's wait to be parked again", func() bool { return fresh.registrar.reg().waiting() == 1 })
	if _, err := FindActor[testPing](ctxT(t, 5*time.Second), client, "svc", WithRegistries(reg)); err != nil {
		t.Fatalf("FindActor after the restart: %v", err)
	}
	spawnEcho(t, service, "late")
	if err := recv(t, waited, "the wait to end"); err != nil {
		t.Fatalf("WaitForActor across the restart: %v", err)
	}
}

// TestRegistrarFailover: when the node that was the registrar dies (it
// vanishes, or it closes), the survivors run the bootstrap rule again on
// the registry address: exactly one becomes the registrar, the others
// register with it, and every surviving named actor is found again —
// twenty times over. It logs the slowest recovery of each kind.
func TestRegistrarFailover(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	slowTest(t)
	forEachRegistryTransport(t, func(t *testing.T, tr string) {
		t.Parallel() // each transport on its own network and registry address

		var slowest [2]time.Duration // vanished (FaultNet Kill), closed
		for round := range 8 {
			f := new(FaultNet)
			reg := freeRegistryAddr(t, tr)
			cfg := func(name string) Config {
				// A window wide enough that a loaded machine (tests run
				// side by side) does not give up on a live node.
				c := failConfig(name, 50*time.Millisecond, time.Second)
				c.RegistryAddrs = []string{reg}
				return c
			}
			first, err := f.Start(ctxT(t, 5*time.Second), cfg("first"))
			if err != nil {
				t.Fatal(err)
			}
			if !first.registrar.isRegistrar() {
				t.Fatal("the first node did not become the registrar")
			}
			a := startOn(t, f, cfg("a"))
			b := startOn(t, f, cfg("b"))
			spawnEcho(t, a, "svc-a")
			spawnEcho(t, b, "svc-b")
			closed := round%2 == 1
			start := time.Now()
			if closed {
				first.Close()
			} else {
				f.Kill(first) // no goodbye: the window must notice
			}
			waitFor(t, 10*time.Second, fmt.Sprintf("round %d: a new registrar, found by both", round), func() bool {
				return oneRegistrarFindingAll(t, reg, a, b)
			})
			kind := 0
			if closed {
				kind = 1
			}
			slowest[kind] = max(slowest[kind], time.Since(start))
			if a.registrar.isRegistrar() && b.registrar.isRegistrar() {
				t.Fatalf("round %d: two registrars", round)
			}
			a.Close()
			b.Close()
		}
		t.Logf("%s, heartbeat 50 ms, window 1 s: slowest recovery %v after a registrar vanished, %v after one closed", tr, slowest[0].Round(time.Millisecond), slowest[1].Round(time.Millisecond))
	})
}

// oneRegistrarFindingAll reports whether exactly one of a and b is the
// registrar at reg, and both find svc-a and svc-b through it.
func oneRegistrarFindingAll(t *testing.T, reg string, a, b *Node) bool {
	if a.registrar.isRegistrar() == b.registrar.isRegistrar() {
		return false
	}
	for _, n := range []*Node{a, b} {
		for _, name := range []string{"svc-a", "svc-b"} {
			if _, err := FindActor[testPing](ctxT(t, time.Second), n, name, WithRegistries(reg)); err != nil {
				return false
			}
		}
	}
	return true
}

func TestWaitForActorIsPushedAndCancelReleases(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	reg := freeRegistryAddr(t, "tcp")
	registrar := startNode(t, discoveryConfig("registrar", reg))
	client := startNode(t, discoveryConfig("client", reg))
	service := startNode(t, discoveryConfig("service", reg))

	// Cancelling releases the waiter on the registrar.
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { _, err := WaitForActor[testPing](ctx, client, "late"); errc <- err }()
	waitFor(t, 5*time.Second, "the waiter to be parked", func() bool { return registrar.registrar.reg().waiting() == 1 })
	cancel()
	if err := recv(t, errc, "WaitForActor to return"); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled WaitForActor = %v", err)
	}
	waitFor(t, 5*time.Second, "the waiter to be released", func() bool { return registrar.registrar.reg().waiting() == 0 })

	// A registration is pushed to the waiter.
	got := make(chan Ref[testPing], 1)
	go func() {
		r, err := WaitForActor[testPing](ctxT(t, 10*time.Second), client, "late")
		if err != nil {
			t.Error(err)
		}
		got <- r
	}()
	waitFor(t, 5*time.Second, "the waiter to be parked", func() bool { return registrar.registrar.reg().waiting() == 1 })
	spawnEcho(t, service, "late")
	r := recv(t, got, "WaitForActor")
	if _, err := Ask(ctxT(t, 5*time.Second), r, func(rr Ref[testPong]) testPing { return testPing{ReplyTo: rr} }); err != nil {
		t.Fatal(err)
	}
}

func TestLocalFastPathSkipsTheRegistrar(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	reg := freeRegistryAddr(t, "tcp")
	registrar := startNode(t, discoveryConfig("registrar", reg))
	client := startNode(t, discoveryConfig("client", reg))
	service := startNode(t, discoveryConfig("service", reg))
	spawnEcho(t, service, "svc")
	spawnEcho(t, client, "mine")
	ctx := ctxT(t, 5*time.Second)
	if _, err := FindActor[testPing](ctx, client, "svc"); err != nil {
		t.Fatalf("first lookup: %v", err)
	}
	before := registrar.registrar.reg().requests.Load()
	for _, name := range []string{"svc", "mine"} {
		r, err := FindActor[testPing](ctx, client, name)
		if err != nil {
			t.Fatalf("fast lookup of %s: %v", name, err)
		}
		if _, err := Ask(ctx, r, func(rr Ref[testPong]) testPing { return testPing{ReplyTo: rr} }); err != nil {
			t.Fatal(err)
		}
	}
	if after := registrar.registrar.reg().requests.Load(); after != before {
		t.Fatalf("the fast path made %d registrar requests", after-before)
	}
}

func TestAddressPreference(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	uds, loop, remote := unixAddr("/run/a.sock"), tcpAddr("127.0.0.1:1"), tcpAddr("203.0.113.9:1")
	older := Registration{Name: "x", Seq: 1, Addrs: []Addr{remote, loop}}
	newer := Registration{Name: "x", Seq: 2, Addrs: []Addr{remote, loop, uds}}
	tests := []struct {
		name string
		regs []Registration
		want []Addr
	}{
		{"unix before local tcp before remote", []Registration{newer}, []Addr{uds, loop, remote}},
		{"newest first within a tier", []Registration{older, newer}, []Addr{uds, loop, loop, remote, remote}},
		{"remote only", []Registration{{Seq: 1, Addrs: []Addr{remote}}}, []Addr{remote}},
	}
	for _, tt := range tests {
		got := preferAddrs(tt.regs)
		if len(got) != len(tt.want) {
			t.Fatalf("%s: %d candidates, want %d", tt.name, len(got), len(tt.want))
		}
		for i := range got {
			if got[i].addr != tt.want[i] {
				t.Errorf("%s: candidate %d = %v, want %v", tt.name, i, got[i].addr, tt.want[i])
			}
		}
		if tt.name == "newest first within a tier" && got[1].reg.Seq != 2 {
			t.Errorf("%s: the newer registration's loopback address is not first in its tier", tt.name)
		}
	}
}

func TestStaleEntriesAreDeletedOnUse(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	reg := freeRegistryAddr(t, "tcp")
	registrar := startNode(t, discoveryConfig("registrar", reg))
	service := startNode(t, discoveryConfig("service", reg))
	spawnEcho(t, service, "svc")
	ghost := tcpAddr(freeRegistryAddr(t, "tcp")[len("tcp://"):])
	// A newer registration of the same name on a node that is gone.
	registrar.registrar.reg().register(Registration{Name: "svc", UUID: UUID{7}, Path: "/user/svc", Node: NodeUID{7}, Addrs: []Addr{ghost}})
	client := startNode(t, discoveryConfig("client", reg))
	r, err := FindActor[testPing](ctxT(t, 10*time.Second), client, "svc")
	if err != nil || r.NodeUID() != service.UID() {
		t.Fatalf("FindActor = %v, %v; want the live service", r, err)
	}
	// The client reports the entry it could not reach, and the registrar
	// deletes it once its own check finds nobody there: soon after, not
	// before FindActor returns.
	waitFor(t, 5*time.Second, "the stale registration deleted", func() bool {
		return !slices.ContainsFunc(registrar.registrar.reg().find("svc"), func(e Registration) bool { return e.Node == (NodeUID{7}) })
	})
}

// A lookup of one actor that finds none fails with ErrNotFound, naming
// the name and the registrars asked; one that could not ask a registrar
// says why instead; a listing that finds none is empty, with no error.
func TestLookupOfNoneIsErrNotFound(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	reg := freeRegistryAddr(t, "tcp")
	n := startNode(t, discoveryConfig("only", reg))
	ctx := ctxT(t, 5*time.Second)
	_, err := FindActor[testPing](ctx, n, "ghost")
	if !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), `"ghost"`) || !strings.Contains(err.Error(), "this node's registry") {
		t.Fatalf("FindActor of a missing name = %v, want ErrNotFound naming the name and the registry", err)
	}
	if _, err := n.QueryActor(ctx, "ghost"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("QueryActor of a missing name = %v, want ErrNotFound", err)
	}
	if all, err := FindActorPerRegistrar[testPing](ctx, n, "ghost"); all != nil || err != nil {
		t.Fatalf("FindActorPerRegistrar of a missing name = %v, %v; want nil, nil", all, err)
	}
	dead := tcpAddr(freeRegistryAddr(t, "tcp")[len("tcp://"):])
	if _, err := FindActor[testPing](ctx, n, "ghost", WithRegistries(dead.String())); err == nil || errors.Is(err, ErrNotFound) {
		t.Fatalf("FindActor against an unreachable registrar = %v, want a connection error", err)
	}
	plain := startNode(t, testConfig())
	if _, err := FindActor[testPing](ctx, plain, "x"); !errors.Is(err, ErrNoRegistry) {
		t.Fatalf("FindActor without discovery = %v, want ErrNoRegistry", err)
	}
}
