package troupe

import (
	"errors"
	"testing"
	"time"
)

func TestNodeLease(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	slowTest(t)
	server := startNode(t, testConfig("tcp://127.0.0.1:0"))
	if err := server.ServeLeases(); err != nil {
		t.Fatal(err)
	}
	a, b := startNode(t, testConfig()), startNode(t, testConfig())
	// A ttl with room for a keep-alive delayed on a loaded machine (the
	// keep-alive runs every third of it).
	const ttl = time.Second
	la := NewNodeLease(a, server.Addrs()[0].String(), "x", ttl)
	lb := NewNodeLease(b, server.Addrs()[0].String(), "x", ttl)
	ctx := ctxT(t, 5*time.Second)
	// A server that has just started grants nothing for one ttl: it may
	// have forgotten a grant of its previous run that still runs. It says
	// how long until it can.
	var notYet *LeaseWaitError
	if ok, err := la.Acquire(ctx, "a"); ok || !errors.As(err, &notYet) || notYet.Wait <= 0 || notYet.Wait > ttl {
		t.Fatalf("a fresh server: granted %v, %v; want a LeaseWaitError within the ttl", ok, err)
	}
	waitFor(t, 5*time.Second, "the server to grant, a ttl after it started", func() bool {
		ok, err := la.Acquire(ctx, "a")
		return ok && err == nil
	})
	time.Sleep(2 * ttl) // the keep-alive must hold it
	if ok, _ := lb.Acquire(ctx, "b"); ok {
		t.Fatal("b acquired a lease a holds")
	}
	if !la.CheckHeld("a") || lb.CheckHeld("b") {
		t.Fatal("CheckHeld is wrong")
	}
	if err := la.Release(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if ok, err := lb.Acquire(ctx, "b"); !ok || err != nil {
		t.Fatalf("b after release: %v %v", ok, err)
	}
	// A release from an earlier owner, late (a cluster gives back a
	// lease lost in its hold when the hold ends), leaves b's alone.
	if err := la.Release(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	lc := NewNodeLease(a, server.Addrs()[0].String(), "x", ttl)
	if ok, _ := lc.Acquire(ctx, "c"); ok || !lb.CheckHeld("b") {
		t.Fatalf("after a late release by a: c acquired %v, b holds %v; want b to keep it", ok, lb.CheckHeld("b"))
	}
	lost := lb.Lost()
	server.Close()
	select {
	case <-lost:
	case <-time.After(5 * time.Second):
		t.Fatal("losing the lease server did not report the lease lost")
	}
}
