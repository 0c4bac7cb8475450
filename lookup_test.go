package troupe

import (
	"context"
	"crypto/rand"
	"errors"
	"testing"
	"time"
)

// Lookups that never spin, crash or lie.

func TestWaitForANameOnlyANodeHoldsReturnsAtItsDeadline(t *testing.T) {
	reg := freeRegistryAddr(t, "tcp")
	registrar := startNode(t, discoveryConfig("registrar", reg))
	startNode(t, discoveryConfig("billing", reg)) // a node, not an actor, named billing
	client := startNode(t, discoveryConfig("client", reg))
	for _, n := range []*Node{registrar, client} {
		before := registrar.reg.requests.Load()
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
		if got := registrar.reg.requests.Load() - before; got > 4 {
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
	registrar.registryRegister(Registration{Name: name, UUID: UUID(ghost), Path: "/user/" + name, Node: ghost, NodeName: "ghost", Addrs: []Addr{TCPAddr(freeRegistryAddr(t, "tcp")[len("tcp://"):])}})
}

func TestWaitMeetingAStaleEntryOnANodeThatIsNotTheRegistrar(t *testing.T) {
	reg := freeRegistryAddr(t, "tcp")
	registrar := startNode(t, discoveryConfig("registrar", reg))
	client := startNode(t, discoveryConfig("client", reg))
	plantStale(t, registrar, "svc")
	waited := make(chan error, 1)
	go func() { _, err := WaitForActor[testPing](ctxT(t, 10*time.Second), client, "svc"); waited <- err }()
	waitFor(t, 5*time.Second, "the stale entry to be deleted", func() bool { return len(registrar.reg.find("svc")) == 0 })
	spawnEcho(t, registrar, "svc")
	if err := recv(t, waited, "the wait to end"); err != nil {
		t.Fatalf("WaitForActor after a stale entry: %v", err)
	}
}

func TestFastPathForgetsAnActorThatStopped(t *testing.T) {
	reg := freeRegistryAddr(t, "tcp")
	server := startNode(t, discoveryConfig("server", reg))
	client := startNode(t, discoveryConfig("client", reg))
	svc := spawnEcho(t, server, "svc")
	ctx := ctxT(t, 5*time.Second)
	if _, found, err := FindActor[testPing](ctx, client, "svc"); !found || err != nil {
		t.Fatalf("FindActor = %v, %v", found, err)
	}
	stopped := watcher(t, server, "probe", svc)
	server.Stop(svc)
	recv(t, stopped, "svc to stop")
	waitFor(t, 5*time.Second, "the stopped actor to be forgotten", func() bool {
		_, found, err := FindActor[testPing](ctx, client, "svc")
		return !found && err == nil
	})
}

func TestLookupsOnAClosedNode(t *testing.T) {
	reg := freeRegistryAddr(t, "tcp")
	n, err := Start(ctxT(t, 5*time.Second), discoveryConfig("closed", reg))
	if err != nil {
		t.Fatal(err)
	}
	checkLeaks(t)
	spawnEcho(t, n, "svc")
	n.Close()
	ctx := ctxT(t, 5*time.Second)
	if _, _, err := QueryActor(ctx, n, "svc"); !errors.Is(err, ErrNodeClosed) {
		t.Errorf("QueryActor = %v", err)
	}
	if _, _, err := FindActor[testPing](ctx, n, "svc"); !errors.Is(err, ErrNodeClosed) {
		t.Errorf("FindActor = %v", err)
	}
	if _, err := FindActorAll[testPing](ctx, n, "svc"); !errors.Is(err, ErrNodeClosed) {
		t.Errorf("FindActorAll = %v", err)
	}
	if _, err := WaitForActor[testPing](ctx, n, "svc"); !errors.Is(err, ErrNodeClosed) {
		t.Errorf("WaitForActor = %v", err)
	}
	if _, err := n.Registry(); !errors.Is(err, ErrNodeClosed) {
		t.Errorf("Registry = %v", err)
	}
}
