package troupe

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"
)

// freeRegistryAddr returns an address nobody listens on, in the transport
// of listen.
func freeRegistryAddr(t testing.TB, transport string) string {
	t.Helper()
	if transport == "unix" {
		return "unix://" + shortSocket(t)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return "tcp://" + l.Addr().String()
}

func discoveryConfig(name, registry string, listen ...string) Config {
	cfg := testConfig(listen...)
	cfg.Name = name
	cfg.RegistryAddrs = []string{registry}
	return cfg
}

func forEachRegistryTransport(t *testing.T, body func(t *testing.T, tr string)) {
	for _, tr := range []string{"tcp", "unix"} {
		t.Run(tr, func(t *testing.T) { body(t, tr) })
	}
}

func TestBootstrapJoinFindQuery(t *testing.T) {
	forEachRegistryTransport(t, func(t *testing.T, tr string) {
		reg := freeRegistryAddr(t, tr)
		first := startNode(t, discoveryConfig("first", reg))
		if !first.IsRegistrar() || first.Addrs()[0].String() != reg {
			t.Fatalf("first node: registrar %v, addrs %v; want it to become the registrar on %s", first.IsRegistrar(), first.Addrs(), reg)
		}
		second := startNode(t, discoveryConfig("second", reg))
		if second.IsRegistrar() || len(second.Addrs()) != 1 || second.Addrs()[0].Network() != first.Addrs()[0].Network() {
			t.Fatalf("second node: registrar %v, addrs %v; want a joiner on its own address in the same transport", second.IsRegistrar(), second.Addrs())
		}
		spawnEcho(t, second, "svc")
		ctx := ctxT(t, 5*time.Second)

		svc, found, err := FindActor[testPing](ctx, first, "svc")
		if err != nil || !found {
			t.Fatalf("FindActor = %v, %v", found, err)
		}
		if _, err := Ask(ctx, svc, func(r Ref[testPong]) testPing { return testPing{ReplyTo: r} }); err != nil {
			t.Fatalf("Ask the found actor: %v", err)
		}
		q, found, err := QueryActor(ctx, second, "svc")
		if err != nil || !found || q.Addr != second.Addrs()[0] || q.Registry.String() != reg {
			t.Fatalf("QueryActor = %+v, %v, %v", q, found, err)
		}
		r, err := second.Registry()
		if err != nil || r.IsLocal() {
			t.Fatalf("Registry() = %v, %v", r, err)
		}
		all, err := r.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		names := map[string]bool{}
		for _, x := range all {
			names[x.Name] = true
		}
		if !names["first"] || !names["second"] || !names["svc"] {
			t.Fatalf("registry lists %v", all)
		}
		if lr, _ := first.Registry(); !lr.IsLocal() {
			t.Fatal("the registrar's own handle is not the local shim")
		}
	})
}

func TestLookupNoneIsNotAnError(t *testing.T) {
	reg := freeRegistryAddr(t, "tcp")
	n := startNode(t, discoveryConfig("only", reg))
	ctx := ctxT(t, 5*time.Second)
	if _, found, err := FindActor[testPing](ctx, n, "ghost"); found || err != nil {
		t.Fatalf("FindActor of a missing name = %v, %v; want not found and no error", found, err)
	}
	_, _, err := FindActor[testPing](ctx, n, "ghost", RequireFound())
	if !errors.Is(err, ErrNotFound) {
		t.Fatalf("RequireFound: %v, want ErrNotFound", err)
	}
	dead := TCPAddr(freeRegistryAddr(t, "tcp")[len("tcp://"):])
	if _, _, err := FindActor[testPing](ctx, n, "ghost", WithRegistries(dead.String())); err == nil || errors.Is(err, ErrNotFound) {
		t.Fatalf("FindActor against an unreachable registrar = %v, want a connection error", err)
	}
	plain := startNode(t, testConfig())
	if _, _, err := FindActor[testPing](ctx, plain, "x"); !errors.Is(err, ErrNoRegistry) {
		t.Fatalf("FindActor without discovery = %v, want ErrNoRegistry", err)
	}
}

func TestBootstrapRefusesOccupiedAddresses(t *testing.T) {
	// A foreign listener that accepts and closes at once.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	checkLeaks(t)
	_, err = Start(ctxT(t, 10*time.Second), discoveryConfig("x", "tcp://"+l.Addr().String()))
	if !errors.Is(err, ErrRegistryOccupied) {
		t.Fatalf("Start against a foreign listener = %v, want ErrRegistryOccupied", err)
	}
	// A troupe node that does not serve a registry.
	plain := startNode(t, testConfig("tcp://127.0.0.1:0"))
	_, err = Start(ctxT(t, 10*time.Second), discoveryConfig("y", plain.Addrs()[0].String()))
	if !errors.Is(err, ErrRegistryOccupied) {
		t.Fatalf("Start against a plain troupe node = %v, want ErrRegistryOccupied", err)
	}
}

func TestEnsureRegistryAndProbeLeavesNothing(t *testing.T) {
	reg := freeRegistryAddr(t, "tcp")
	first := startNode(t, discoveryConfig("first", reg))
	events := make(chan any, 8)
	Subscribe(first.Events(), func(e PeerConnected) { events <- e })
	Subscribe(first.Events(), func(e PeerUnreachable) { events <- e })
	cfg := discoveryConfig("second", reg)
	cfg.EnsureRegistry = true
	checkLeaks(t)
	if _, err := Start(ctxT(t, 5*time.Second), cfg); !errors.Is(err, ErrRegistryRunning) {
		t.Fatalf("EnsureRegistry with a registrar running = %v, want ErrRegistryRunning", err)
	}
	if got := len(first.reg().list()); got != 1 {
		t.Fatalf("registry holds %d entries after a probe, want just the registrar itself", got)
	}
	select {
	case e := <-events:
		t.Fatalf("a probe left an event: %#v", e)
	case <-time.After(100 * time.Millisecond):
	}
	if n := first.liveAssocs(); n != 0 {
		t.Fatalf("a probe left %d associations", n)
	}
}

func TestConcurrentFirstBootsEndWithOneRegistrar(t *testing.T) {
	forEachRegistryTransport(t, func(t *testing.T, tr string) {
		for round := range 5 {
			reg := freeRegistryAddr(t, tr)
			var nodes [2]*Node
			var errs [2]error
			var wg sync.WaitGroup
			start := make(chan struct{})
			for i := range nodes {
				wg.Go(func() {
					<-start
					nodes[i], errs[i] = Start(context.Background(), discoveryConfig("n", reg))
				})
			}
			checkLeaks(t)
			close(start)
			wg.Wait()
			for i, n := range nodes {
				if errs[i] != nil {
					t.Fatalf("round %d: Start %d: %v", round, i, errs[i])
				}
				defer n.Close()
			}
			if nodes[0].IsRegistrar() == nodes[1].IsRegistrar() {
				t.Fatalf("round %d: registrar flags %v and %v, want exactly one", round, nodes[0].IsRegistrar(), nodes[1].IsRegistrar())
			}
			registrar := nodes[0]
			if !registrar.IsRegistrar() {
				registrar = nodes[1]
			}
			if got := len(registrar.reg().list()); got != 2 {
				t.Fatalf("round %d: registry has %d entries, want both nodes", round, got)
			}
		}
	})
}

func TestWaitForActorIsPushedAndCancelReleases(t *testing.T) {
	reg := freeRegistryAddr(t, "tcp")
	registrar := startNode(t, discoveryConfig("registrar", reg))
	client := startNode(t, discoveryConfig("client", reg))
	service := startNode(t, discoveryConfig("service", reg))

	// Cancelling releases the waiter on the registrar.
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { _, err := WaitForActor[testPing](ctx, client, "late"); errc <- err }()
	waitFor(t, 5*time.Second, "the waiter to be parked", func() bool { return registrar.reg().waiting() == 1 })
	cancel()
	if err := recv(t, errc, "WaitForActor to return"); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled WaitForActor = %v", err)
	}
	waitFor(t, 5*time.Second, "the waiter to be released", func() bool { return registrar.reg().waiting() == 0 })

	// A registration is pushed to the waiter.
	got := make(chan Ref[testPing], 1)
	go func() {
		r, err := WaitForActor[testPing](ctxT(t, 10*time.Second), client, "late")
		if err != nil {
			t.Error(err)
		}
		got <- r
	}()
	waitFor(t, 5*time.Second, "the waiter to be parked", func() bool { return registrar.reg().waiting() == 1 })
	spawnEcho(t, service, "late")
	r := recv(t, got, "WaitForActor")
	if _, err := Ask(ctxT(t, 5*time.Second), r, func(rr Ref[testPong]) testPing { return testPing{ReplyTo: rr} }); err != nil {
		t.Fatal(err)
	}
}

func TestLocalFastPathSkipsTheRegistrar(t *testing.T) {
	reg := freeRegistryAddr(t, "tcp")
	registrar := startNode(t, discoveryConfig("registrar", reg))
	client := startNode(t, discoveryConfig("client", reg))
	service := startNode(t, discoveryConfig("service", reg))
	spawnEcho(t, service, "svc")
	spawnEcho(t, client, "mine")
	ctx := ctxT(t, 5*time.Second)
	if _, found, err := FindActor[testPing](ctx, client, "svc"); !found || err != nil {
		t.Fatalf("first lookup: %v, %v", found, err)
	}
	before := registrar.reg().requests.Load()
	for _, name := range []string{"svc", "mine"} {
		r, found, err := FindActor[testPing](ctx, client, name)
		if !found || err != nil {
			t.Fatalf("fast lookup of %s: %v, %v", name, found, err)
		}
		if _, err := Ask(ctx, r, func(rr Ref[testPong]) testPing { return testPing{ReplyTo: rr} }); err != nil {
			t.Fatal(err)
		}
	}
	if after := registrar.reg().requests.Load(); after != before {
		t.Fatalf("the fast path made %d registrar requests", after-before)
	}
}

func TestAddressPreference(t *testing.T) {
	uds, loop, remote := UnixAddr("/run/a.sock"), TCPAddr("127.0.0.1:1"), TCPAddr("203.0.113.9:1")
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
	reg := freeRegistryAddr(t, "tcp")
	registrar := startNode(t, discoveryConfig("registrar", reg))
	service := startNode(t, discoveryConfig("service", reg))
	spawnEcho(t, service, "svc")
	ghost := TCPAddr(freeRegistryAddr(t, "tcp")[len("tcp://"):])
	// A newer registration of the same name on a node that is gone.
	registrar.reg().register(Registration{Name: "svc", UUID: UUID{7}, Path: "/user/svc", Node: NodeUID{7}, Addrs: []Addr{ghost}})
	client := startNode(t, discoveryConfig("client", reg))
	r, found, err := FindActor[testPing](ctxT(t, 10*time.Second), client, "svc")
	if err != nil || !found || r.NodeUID() != service.UID() {
		t.Fatalf("FindActor = %v, %v, %v; want the live service", r, found, err)
	}
	for _, e := range registrar.reg().find("svc") {
		if e.Node == (NodeUID{7}) {
			t.Fatalf("the stale registration is still there: %+v", e)
		}
	}
}

func TestRegistrarDropsNodesThatLeave(t *testing.T) {
	reg := freeRegistryAddr(t, "tcp")
	registrar := startNode(t, discoveryConfig("registrar", reg))
	service := startNode(t, discoveryConfig("service", reg))
	spawnEcho(t, service, "svc")
	if len(registrar.reg().find("svc")) != 1 {
		t.Fatal("svc not registered")
	}
	service.Close()
	waitFor(t, 5*time.Second, "the service's registrations to go", func() bool {
		return len(registrar.reg().find("svc")) == 0 && len(registrar.reg().find("service")) == 0
	})
}

func TestActorStopUnregisters(t *testing.T) {
	reg := freeRegistryAddr(t, "tcp")
	registrar := startNode(t, discoveryConfig("registrar", reg))
	service := startNode(t, discoveryConfig("service", reg))
	r := spawnEcho(t, service, "svc")
	service.Stop(r)
	waitFor(t, 5*time.Second, "svc to be unregistered", func() bool { return len(registrar.reg().find("svc")) == 0 })
}
