package troupe

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// oneConnection reports whether a and b hold one session with each
// other, over one connection (both ends of it), and nothing else.
func oneConnection(a, b *Node) bool {
	a.peers.mu.Lock()
	x := a.peers.byUID[b.uid]
	a.peers.mu.Unlock()
	b.peers.mu.Lock()
	y := b.peers.byUID[a.uid]
	b.peers.mu.Unlock()
	if x == nil || y == nil || a.peers.liveAssocs() != 1 || b.peers.liveAssocs() != 1 {
		return false
	}
	x.mu.Lock()
	xc := x.conn
	x.mu.Unlock()
	y.mu.Lock()
	yc := y.conn
	y.mu.Unlock()
	return xc != nil && yc != nil && xc.LocalAddr().String() == yc.RemoteAddr().String() && xc.RemoteAddr().String() == yc.LocalAddr().String()
}

// Issue #50's third item: two dials of one node to another at one moment
// can finish in either order on each side, and each side kept the
// connection it attached last, so each retired the one the other kept
// (measured at 9 of 40 trials, and a quarantine after). Here the order is
// forced 100 times: the dialer's first connection is welcomed by the
// peer, which attaches it first; only then is the second dialed, and the
// dialer attaches the first one only once it has attached the second.
// Both sides must keep the same connection, every message sent through
// either ref arrive once, and nobody be given up on.
func TestTwoDialsAtOnceToOneNodeSettleOnOneConnection(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	slowTest(t)
	p := startNode(t, testConfig("tcp://127.0.0.1:0", "tcp://127.0.0.1:0"))
	_, got := spawnCollector[testPong](t, p, "sink", 64)
	// What goes wrong during a trial, on either side (not what its
	// dialer's Close at the end does).
	var current atomic.Pointer[firstOf]
	Subscribe(p, func(ev PeerUnreachable) {
		if !errors.Is(ev.Reason, ErrPeerLeft) { // (each trial's dialer leaves at its end)
			current.Load().CompareAndSwap(nil, ev)
		}
	})
	Subscribe(p, func(ev PeerLinkLost) { current.Load().CompareAndSwap(nil, ev) })
	Subscribe(p, func(ev DeadLetter) { current.Load().CompareAndSwap(nil, ev) })
	addr1, addr2 := p.Addrs()[0], p.Addrs()[1]
	for trial := range 100 {
		trouble := &firstOf{}
		current.Store(trouble)
		var firstWelcomed, secondAttached sync.Once
		welcomed, attached := make(chan struct{}), make(chan struct{})
		cfg := testConfig("tcp://127.0.0.1:0")
		cfg.attachHook = func(a *assoc, peer NodeUID, done bool) {
			switch {
			case !a.outbound:
			case a.dialAddr == addr1 && !done:
				firstWelcomed.Do(func() { close(welcomed) })
				select {
				case <-attached:
				case <-time.After(10 * time.Second):
				}
			case a.dialAddr == addr2 && done:
				secondAttached.Do(func() { close(attached) })
			}
		}
		d := startNode(t, cfg)
		troubleOn(d, trouble)
		refs := make([]Ref[testPong], 2)
		errs := make([]error, 2)
		var wg sync.WaitGroup
		for i, at := range []Addr{addr1, addr2} {
			wg.Go(func() {
				refs[i], errs[i] = Resolve[testPong](ctxT(t, 10*time.Second), d, FormatRef(at, "/user/sink"))
			})
			if i == 0 {
				select {
				case <-welcomed:
				case <-time.After(10 * time.Second):
					t.Fatalf("trial %d: the first dial was never welcomed", trial)
				}
			}
		}
		wg.Wait()
		if errs[0] != nil || errs[1] != nil {
			t.Fatalf("trial %d: Resolve: %v, %v", trial, errs[0], errs[1])
		}
		for i := range 10 {
			refs[i%2].Tell(testPong{N: i})
		}
		seen := map[int]bool{}
		for range 10 {
			select {
			case m := <-got:
				if seen[m.N] {
					t.Fatalf("trial %d: message %d arrived twice", trial, m.N)
				}
				seen[m.N] = true
			case <-time.After(5 * time.Second):
				t.Fatalf("trial %d: %d of 10 messages arrived (trouble: %+v)", trial, len(seen), trouble.Load())
			}
		}
		waitFor(t, 5*time.Second, fmt.Sprintf("trial %d: both sides on one connection", trial), func() bool { return oneConnection(p, d) })
		if ev := trouble.Load(); ev != nil {
			t.Fatalf("trial %d: %+v", trial, ev)
		}
		if q := p.peers.quarantined(); len(q) != 0 {
			t.Fatalf("trial %d: quarantined %+v", trial, q)
		}
		d.Close()
		waitFor(t, 5*time.Second, "the dialer's session to end", func() bool { return p.peers.liveAssocs() == 0 })
	}
}

// Two nodes that dial each other at one moment keep one connection, the
// one the lower uid dialed, on both sides. The order is forced 100 times:
// neither handshake completes before both hellos have arrived, and each
// node attaches the other's dial before its own.
func TestTwoNodesDialingEachOtherAtOnceKeepOneConnection(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	slowTest(t)
	for trial := range 100 {
		trouble := &firstOf{}
		type gates struct {
			helloIn, inAttached chan struct{}
			once, onceAttached  sync.Once
		}
		var g [2]gates
		var nodes [2]*Node
		for i := range 2 {
			g[i] = gates{helloIn: make(chan struct{}), inAttached: make(chan struct{})}
		}
		for i := range 2 {
			me, other := &g[i], &g[1-i]
			cfg := testConfig("tcp://127.0.0.1:0")
			cfg.attachHook = func(a *assoc, peer NodeUID, done bool) {
				if nodes[1-i] == nil || peer != nodes[1-i].uid {
					return
				}
				switch {
				case !a.outbound && !done:
					me.once.Do(func() { close(me.helloIn) })
					select { // both hellos are in before either is welcomed
					case <-other.helloIn:
					case <-time.After(10 * time.Second):
					}
				case !a.outbound && done:
					me.onceAttached.Do(func() { close(me.inAttached) })
				case a.outbound && !done:
					select { // the peer's dial is attached first
					case <-me.inAttached:
					case <-time.After(10 * time.Second):
					}
				}
			}
			nodes[i] = startNode(t, cfg)
		}
		sinks := make([]chan testPong, 2)
		for i, n := range nodes {
			_, sinks[i] = spawnCollector[testPong](t, n, "sink", 64)
			troubleOn(n, trouble)
		}
		refs := make([]Ref[testPong], 2)
		errs := make([]error, 2)
		var wg sync.WaitGroup
		for i := range 2 {
			wg.Go(func() {
				refs[i], errs[i] = Resolve[testPong](ctxT(t, 10*time.Second), nodes[i], FormatRef(nodes[1-i].Addrs()[0], "/user/sink"))
			})
		}
		wg.Wait()
		if errs[0] != nil || errs[1] != nil {
			t.Fatalf("trial %d: Resolve: %v, %v", trial, errs[0], errs[1])
		}
		for i := range 10 {
			refs[i%2].Tell(testPong{N: i})
		}
		for i := range 2 {
			for range 5 {
				select {
				case <-sinks[1-i]:
				case <-time.After(5 * time.Second):
					t.Fatalf("trial %d: a message from %s never arrived (trouble: %+v)", trial, nodes[i].Name(), trouble.Load())
				}
			}
		}
		waitFor(t, 5*time.Second, fmt.Sprintf("trial %d: both sides on one connection", trial), func() bool { return oneConnection(nodes[0], nodes[1]) })
		low := nodes[0]
		if string(nodes[1].uid[:]) < string(low.uid[:]) {
			low = nodes[1]
		}
		low.peers.mu.Lock()
		kept := low.peers.byUID[map[*Node]*Node{nodes[0]: nodes[1], nodes[1]: nodes[0]}[low].uid]
		low.peers.mu.Unlock()
		if !kept.outbound {
			t.Fatalf("trial %d: both kept the connection the higher uid dialed", trial)
		}
		for i := range 2 {
			select {
			case m := <-sinks[i]:
				t.Fatalf("trial %d: an extra message %+v", trial, m)
			default:
			}
		}
		if ev := trouble.Load(); ev != nil {
			t.Fatalf("trial %d: %+v", trial, ev)
		}
		for _, n := range nodes {
			if q := n.peers.quarantined(); len(q) != 0 {
				t.Fatalf("trial %d: quarantined %+v", trial, q)
			}
			n.Close()
		}
	}
}
