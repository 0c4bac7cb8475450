package troupe

import (
	"context"
	"errors"
	"fmt"
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
	return fmt.Sprintf("tcp://127.0.0.1:%d", freePort(t))
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
	t.Parallel()
	checkLeaks(t)
	forEachRegistryTransport(t, func(t *testing.T, tr string) {
		reg := freeRegistryAddr(t, tr)
		first := startNode(t, discoveryConfig("first", reg))
		if !first.registrar.isRegistrar() || first.Addrs()[0].String() != reg {
			t.Fatalf("first node: registrar %v, addrs %v; want it to become the registrar on %s", first.registrar.isRegistrar(), first.Addrs(), reg)
		}
		second := startNode(t, discoveryConfig("second", reg))
		if second.registrar.isRegistrar() || len(second.Addrs()) != 1 || second.Addrs()[0].Network() != first.Addrs()[0].Network() {
			t.Fatalf("second node: registrar %v, addrs %v; want a joiner on its own address in the same transport", second.registrar.isRegistrar(), second.Addrs())
		}
		spawnEcho(t, second, "svc")
		ctx := ctxT(t, 5*time.Second)

		svc, err := FindActor[testPing](ctx, first, "svc")
		if err != nil {
			t.Fatalf("FindActor = %v", err)
		}
		if _, err := Ask(ctx, svc, func(r Ref[testPong]) testPing { return testPing{ReplyTo: r} }); err != nil {
			t.Fatalf("Ask the found actor: %v", err)
		}
		q, err := second.QueryActor(ctx, "svc")
		if err != nil || q.Addrs[0] != second.Addrs()[0] || q.Registry.String() != reg {
			t.Fatalf("QueryActor = %+v, %v", q, err)
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

func TestBootstrapRefusesOccupiedAddresses(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
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
	t.Parallel()
	checkLeaks(t)
	reg := freeRegistryAddr(t, "tcp")
	first := startNode(t, discoveryConfig("first", reg))
	events := make(chan any, 8)
	Subscribe(first, func(e PeerConnected) { events <- e })
	Subscribe(first, func(e PeerUnreachable) { events <- e })
	cfg := discoveryConfig("second", reg)
	cfg.EnsureRegistry = true
	checkLeaks(t)
	if _, err := Start(ctxT(t, 5*time.Second), cfg); !errors.Is(err, ErrRegistryRunning) {
		t.Fatalf("EnsureRegistry with a registrar running = %v, want ErrRegistryRunning", err)
	}
	if got := len(first.registrar.reg().list()); got != 1 {
		t.Fatalf("registry holds %d entries after a probe, want just the registrar itself", got)
	}
	select {
	case e := <-events:
		t.Fatalf("a probe left an event: %#v", e)
	case <-time.After(100 * time.Millisecond):
	}
	if n := first.peers.liveAssocs(); n != 0 {
		t.Fatalf("a probe left %d associations", n)
	}
}

func TestConcurrentFirstBootsEndWithOneRegistrar(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
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
			if nodes[0].registrar.isRegistrar() == nodes[1].registrar.isRegistrar() {
				t.Fatalf("round %d: registrar flags %v and %v, want exactly one", round, nodes[0].registrar.isRegistrar(), nodes[1].registrar.isRegistrar())
			}
			registrar := nodes[0]
			if !registrar.registrar.isRegistrar() {
				registrar = nodes[1]
			}
			if got := len(registrar.registrar.reg().list()); got != 2 {
				t.Fatalf("round %d: registry has %d entries, want both nodes", round, got)
			}
		}
	})
}
