package troupe

import (
	"context"
	"slices"
	"testing"
	"time"
)

// A lookup skips a registered incarnation this node has quarantined,
// without dialing it: the next candidate answers at once, not after a
// handshake's timeout.
func TestALookupSkipsAQuarantinedIncarnationWithoutDialing(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	f := new(FaultNet)
	t.Cleanup(f.Heal)
	registry := freeRegistryAddr(t, "tcp")
	cfg := func(name string) Config {
		c := discoveryConfig(name, registry)
		// (A 500 ms window wrote c off too, once, under -race beside the
		// suite and two burners.)
		c.HeartbeatInterval, c.UnreachableAfter = 100*time.Millisecond, 1500*time.Millisecond
		c.HandshakeTimeout = 3 * time.Second
		return c
	}
	if reg := startOn(t, f, cfg("reg")); !reg.registrar.isRegistrar() {
		t.Fatal("no registrar")
	}
	a, b, c := startOn(t, f, cfg("a")), startOn(t, f, cfg("b")), startOn(t, f, cfg("c"))
	spawnEcho(t, c, "svc")
	spawnEcho(t, b, "svc") // newest: preferred
	gone := make(chan PeerUnreachable, 8)
	SubscribeChan(a, gone)
	waitFor(t, 5*time.Second, "both registered", func() bool {
		regs, err := remoteRegistrar{&a.disc, mustAddr(t, registry)}.ask(ctxT(t, 5*time.Second), regRequest{Op: regOpFind, Name: "svc"})
		return err == nil && len(slices.DeleteFunc(regs, func(r Registration) bool { return r.Path == "" })) == 2
	})
	if r, err := FindActor[testPing](ctxT(t, 5*time.Second), a, "svc"); err != nil || r.NodeUID() != b.UID() {
		t.Fatalf("first lookup: %v  %v", r, err)
	}
	f.Partition(a, b)
	for ev := recv(t, gone, "b quarantined"); ev.UID != b.UID(); ev = recv(t, gone, "b quarantined") {
	}
	a.disc.found.mu.Lock()
	a.disc.found.by = nil
	a.disc.found.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	r, err := FindActor[testPing](ctx, a, "svc")
	if err != nil || r.NodeUID() != c.UID() {
		t.Fatalf("lookup: %v  %v", r, err)
	}
	if took := time.Since(start); took >= a.cfg.HandshakeTimeout {
		t.Fatalf("the lookup took %v: it waited on the quarantined incarnation", took)
	}
}

func mustAddr(t *testing.T, s string) Addr {
	t.Helper()
	a, err := ParseAddr(s)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// The service listing reads the quarantine under its lock (since 091e6d2
// the quarantine's own, quarantineTable.mu): the race detector caught
// serviceRefs reading the table while a session's end wrote it.
func TestServiceRefsReadsTheQuarantineUnderItsLock(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	slowTest(t)
	n := startNode(t, testConfig())
	gone := NodeUID{7}
	regs := []Registration{{Name: "k", Node: gone, Path: "/user/x", UUID: UUID{1}, Addrs: []Addr{{network: "tcp", address: "127.0.0.1:1"}}}}
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			n.peers.quarantine.add(quarantineInfo{UID: NodeUID{byte(i), 1}, Since: time.Now()})
			n.peers.quarantine.add(quarantineInfo{UID: gone, Since: time.Now()})
			n.peers.quarantine.clear(func(*quarantineInfo) bool { return true })
		}
	}()
	for range 200 { // (the race detector needs one overlap; the writer spins all along)
		serviceRefs[testPing](context.Background(), n, slices.Clone(regs), nil)
	}
	close(stop)
	<-done
}
