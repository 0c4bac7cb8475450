package troupe

import (
	"context"
	"errors"
	"testing"
	"time"
)

// A graceful Shutdown does not wait on a peer that reads and never
// acknowledges (nor on one that went silent) past UnreachableAfter: the
// detector runs until the last writer ends, so the leaving writer's wait
// for acknowledgements ends when the peer counts as unreachable, not at
// Shutdown's deadline.
func TestAShutdownWaitsForASilentPeerOnlyUntilItIsUnreachable(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	slowTest(t)
	for _, audible := range []bool{true, false} {
		cfg := failConfig("n", 50*time.Millisecond, 500*time.Millisecond)
		cfg.Listen = []string{"tcp://127.0.0.1:0"}
		n := startNode(t, cfg)
		var uid NodeUID
		if audible {
			_, uid = rawPeer(t, n, true) // beats, reads, acknowledges nothing
		} else {
			_, uid = rawHandshakeWith(t, n, helloResumable) // then nothing at all
		}
		var a *assoc
		waitFor(t, 5*time.Second, "the raw peer to be up", func() bool {
			n.peers.mu.Lock()
			defer n.peers.mu.Unlock()
			a = n.peers.byUID[uid]
			return a != nil
		})
		h := &handle{node: n, key: refKey{node: uid, path: "/user/x", uuid: UUID{1}}, assoc: a}
		for i := range 8 {
			if err := a.tell(h, padded{N: i, Pad: "unacknowledged"}); err != nil {
				t.Fatal(err)
			}
		}
		const deadline = 8 * time.Second
		ctx, cancel := context.WithTimeout(context.Background(), deadline)
		start := time.Now()
		err := n.Shutdown(ctx)
		took := time.Since(start)
		cancel()
		if err != nil {
			t.Errorf("audible %v: Shutdown: %v", audible, err)
		}
		// The peer counts as unreachable after UnreachableAfter (0.5 s);
		// the bound leaves a loaded machine ten times that.
		if took > 5*time.Second {
			t.Errorf("audible %v: Shutdown took %v with UnreachableAfter %v", audible, took, cfg.UnreachableAfter)
		}
	}
}

// A graceful Shutdown says goodbye to a cluster member it never heard
// from (members that watch other members exchange no heartbeats): the
// window that judges it during the flush starts at the flush, so the
// session is not reset as silent, and the member's watchers hear
// ErrPeerLeft.
func TestShutdownSaysGoodbyeToAMemberItNeverHeardFrom(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	slowTest(t)
	f := new(FaultNet)
	t.Cleanup(f.Heal)
	a := startOn(t, f, failConfig("a", 50*time.Millisecond, 500*time.Millisecond))
	b := startOn(t, f, failConfig("b", 50*time.Millisecond, 500*time.Millisecond))
	_, got := spawnCollector[testPong](t, b, "sink", 16)
	spawnEcho(t, a, "echo")
	toSink, err := Resolve[testPong](ctxT(t, 5*time.Second), a, FormatRef(b.Addrs()[0], "/user/sink"))
	if err != nil {
		t.Fatal(err)
	}
	echo, err := Resolve[testPing](ctxT(t, 5*time.Second), b, FormatRef(a.Addrs()[0], "/user/echo"))
	if err != nil {
		t.Fatal(err)
	}
	term := watcher(t, b, "w", echo)
	none := map[NodeUID]bool{} // members that watch neither: no heartbeats either way
	a.cl.members.Store(b.UID(), struct{}{})
	a.cl.beat.Store(&none)
	b.cl.members.Store(a.UID(), struct{}{})
	b.cl.beat.Store(&none)
	time.Sleep(1500 * time.Millisecond) // (three windows of silence between them)
	a.OnShutdown(PhaseFlush, func(context.Context) error { toSink.Tell(testPong{N: 7}); return nil })
	if err := a.Shutdown(ctxT(t, 5*time.Second)); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if m := recv(t, got, "the last word"); m.N != 7 {
		t.Fatalf("got %v", m)
	}
	if tm := recv(t, term, "b's watcher"); !errors.Is(tm.Reason, ErrPeerLeft) {
		t.Fatalf("got %v; want ErrPeerLeft", tm.Reason)
	}
}
