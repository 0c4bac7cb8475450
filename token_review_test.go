package troupe

import (
	"bytes"
	"fmt"
	"net"
	"testing"
	"time"
)

// sessionGivenUp starts b and c, has c dial b (so b holds the session
// inbound, and waits for c to resume it), waits for each side's token to
// arrive at the other, and then has c give the session up without a word
// (as a side whose resume window ran out first would). It returns b's
// session with c, suspended.
func sessionGivenUp(t *testing.T) (b, c *Node, held *assoc) {
	t.Helper()
	// A window long enough that the session b holds suspended outlasts
	// the test on a loaded machine (at 2 s, a run beside the whole suite
	// once saw it given up, and c quarantined, before b dialed c anew).
	cfg := testConfig("tcp://127.0.0.1:0")
	cfg.UnreachableAfter = 10 * time.Second
	b = startNode(t, cfg)
	c = startNode(t, cfg)
	spawnEcho(t, b, "echo")
	ref, err := Resolve[testPing](ctxT(t, 5*time.Second), c, FormatRef(b.Addrs()[0], "/user/echo"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Ask(ctxT(t, 5*time.Second), ref, func(r Ref[testPong]) testPing { return testPing{ReplyTo: r} }); err != nil {
		t.Fatal(err)
	}
	b.peers.mu.Lock()
	held = b.peers.byUID[c.UID()]
	b.peers.mu.Unlock()
	c.peers.mu.Lock()
	ca := c.peers.byUID[b.UID()]
	c.peers.mu.Unlock()
	if held == nil || held.outbound || ca == nil {
		t.Fatalf("b's session with c: %+v", held)
	}
	waitFor(t, 5*time.Second, "both tokens", func() bool {
		held.mu.Lock()
		tb := held.peerToken
		held.mu.Unlock()
		ca.mu.Lock()
		tc := ca.peerToken
		ca.mu.Unlock()
		return tb != nil && tc != nil
	})
	ca.conn.(*net.TCPConn).SetLinger(0)
	ca.fail(fmt.Errorf("%w: the test gives the session up", errSessionReplaced))
	waitFor(t, 5*time.Second, "b's session with c suspended", func() bool {
		held.mu.Lock()
		defer held.mu.Unlock()
		return held.life.state == assocSuspended
	})
	// And c has ended its side: until then its welcome could still offer
	// the session it is giving up (once, beside two CPU burners, b's new
	// connection resumed into it, and b's Resolve waited out the window).
	waitFor(t, 5*time.Second, "c's side of the session ended", func() bool {
		c.peers.mu.Lock()
		defer c.peers.mu.Unlock()
		return c.peers.byUID[b.UID()] != ca
	})
	return b, c, held
}

// A stranger that b dials (any ref at the stranger's address) and that
// answers with the uid of a peer whose session b holds suspended, and the
// 32 zero bytes of "I hold no session with you", proves nothing: it must
// not end b's session with that peer, nor take its place under its uid.
func TestAZeroProofWelcomeDoesNotReplaceASuspendedSession(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	b, c, held := sessionGivenUp(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		conn, err := l.Accept()
		if err != nil {
			return
		}
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(3 * time.Second))
		fr := newFrameReader(conn, defaultMaxFrameSize)
		if _, err := fr.next(); err != nil {
			return
		}
		w := &hello{version: protocolVersion, uid: c.UID(), name: c.Name(), flags: helloResumable | helloCredit, session: make([]byte, tokenSize), ordered: true}
		conn.Write(appendFrame(nil, func(b []byte) []byte { return appendHello(b, frameWelcome, w) }))
		for {
			if _, err := fr.next(); err != nil {
				return
			}
		}
	}()
	_, err = Resolve[testPing](ctxT(t, 3*time.Second), b, FormatRef(tcpAddr(l.Addr().String()), "/user/echo"))
	t.Logf("Resolve through the stranger: %v", err)
	b.peers.mu.Lock()
	now := b.peers.byUID[c.UID()]
	b.peers.mu.Unlock()
	held.mu.Lock()
	st := held.life.state
	held.mu.Unlock()
	if now != held || st != assocSuspended {
		t.Errorf("a stranger's zero proof ended b's suspended session with c (now %v) and took its place under c's uid: %v", st, now != held)
	}
	l.Close()
	<-done
}

// The honest case of the same welcome: c gave the session up, and b,
// which still holds it suspended, dials c without resuming (another of
// c's addresses, or one it had not proven): c's welcome says it holds no
// session, the new connection replaces the suspended one, and the two
// talk again.
func TestADialerHoldingAGivenUpSessionIsWelcomedAnew(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	b, c, held := sessionGivenUp(t)
	spawnEcho(t, c, "echo")
	b.peers.mu.Lock()
	for ad, x := range b.peers.byAddr {
		if x == held {
			delete(b.peers.byAddr, ad) // b dials c anew, not through the session
		}
	}
	b.peers.mu.Unlock()
	ref, err := Resolve[testPing](ctxT(t, slack(5*time.Second)), b, FormatRef(c.Addrs()[0], "/user/echo"))
	if err != nil {
		t.Fatalf("b resolves at c: %v", err)
	}
	if _, err := Ask(ctxT(t, 5*time.Second), ref, func(r Ref[testPong]) testPing { return testPing{ReplyTo: r} }); err != nil {
		t.Fatal(err)
	}
	b.peers.mu.Lock()
	now := b.peers.byUID[c.UID()]
	b.peers.mu.Unlock()
	if now == held || now == nil {
		t.Fatalf("b still holds the session c gave up")
	}
}

// A node that founded sessions with more peers than it remembers tokens
// for (maxKeptTokens: every dial carries a session nonce, so every new
// incarnation that connects counts, a command-line observer's among them,
// and a stranger can send that many hellos on purpose) still proves its
// live sessions: a connection reset is followed by a resume, not an
// unreachable peer.
func TestALiveSessionsTokenOutlivesManyOtherPeers(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	f := new(FaultNet)
	home := startOn(t, f, failConfig("home", 50*time.Millisecond, 5*time.Second))
	away := startOn(t, f, failConfig("away", 50*time.Millisecond, 5*time.Second))
	spawnEcho(t, away, "echo")
	spawnEcho(t, home, "echo")
	unreachable := make(chan PeerUnreachable, 4)
	SubscribeChan(home, unreachable)
	resumed := make(chan PeerResumed, 4)
	SubscribeChan(home, resumed)
	ref, err := Resolve[testPing](ctxT(t, 5*time.Second), home, FormatRef(away.Addrs()[0], "/user/echo"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Ask(ctxT(t, 5*time.Second), ref, func(r Ref[testPong]) testPing { return testPing{ReplyTo: r} }); err != nil {
		t.Fatal(err)
	}
	for _, n := range []*Node{home, away} {
		n.peers.mu.Lock()
		for range maxKeptTokens {
			var other NodeUID
			copy(other[:], newNonce())
			n.gate.tokens.issue(other, func(uid NodeUID) bool { return n.peers.byUID[uid] != nil }) // as a session with another peer does
		}
		n.peers.mu.Unlock()
	}
	if f.Reset(home, away) == 0 {
		t.Fatal("the reset found no connection")
	}
	expectResume(t, resumed, unreachable)
	if _, err := Ask(ctxT(t, 5*time.Second), ref, func(r Ref[testPong]) testPing { return testPing{ReplyTo: r} }); err != nil {
		t.Fatalf("after the resume: %v", err)
	}
}

// A peer that gave its session up while this node still holds it
// connected (its connection's end has not reached this node yet) and
// dials again proves the session's token, and its fresh connection wins
// over the held one here; there it founds a new session and draws a new
// token. Both sides must then hold the same token for it: the next
// connection (a resume after a reset) is proven with the new one.
func TestARedialThatWinsAHeldSessionKeepsTheTokensInStep(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	f := new(FaultNet)
	b := startOn(t, f, failConfig("b", 50*time.Millisecond, 5*time.Second))
	c := startOn(t, f, failConfig("c", 50*time.Millisecond, 5*time.Second))
	spawnEcho(t, c, "echo")
	ask := func(what string) {
		t.Helper()
		ref, err := Resolve[testPing](ctxT(t, 5*time.Second), b, FormatRef(c.Addrs()[0], "/user/echo"))
		if err != nil {
			t.Fatalf("%s: resolve: %v", what, err)
		}
		if _, err := Ask(ctxT(t, 5*time.Second), ref, func(r Ref[testPong]) testPing { return testPing{ReplyTo: r} }); err != nil {
			t.Fatalf("%s: ask: %v", what, err)
		}
	}
	ask("first session")
	b.peers.mu.Lock()
	old := b.peers.byUID[c.UID()]
	b.peers.mu.Unlock()
	waitFor(t, 5*time.Second, "c holds b's token", func() bool { return c.byUIDToken(t, b.UID()) != nil })
	// b gives the session up; c has not heard of it yet.
	b.peers.untable(old)
	ask("b dials again")
	waitFor(t, 5*time.Second, "the tokens in step", func() bool {
		b.peers.mu.Lock()
		now := b.peers.byUID[c.UID()]
		b.peers.mu.Unlock()
		return now != nil && now != old && bytes.Equal(c.byUIDToken(t, b.UID()), b.gate.tokenFor(c.UID()))
	})
	unreachable := make(chan PeerUnreachable, 4)
	SubscribeChan(b, unreachable)
	resumed := make(chan PeerResumed, 4)
	SubscribeChan(b, resumed)
	if f.Reset(b, c) == 0 {
		t.Fatal("the reset found no connection")
	}
	expectResume(t, resumed, unreachable)
}

// A second connection to another of a peer's addresses: the peer takes
// it over the first one and retires that one at once, and this node may
// read the retirement before the new connection's welcome, and then
// founds a session on the new connection and draws a new token, while
// the peer keeps the session it proved its way into. Both must end with
// the same token, or the session's next connection (a resume) is refused.
func TestASecondConnectionLeavesTheTokensInStep(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	for range 10 {
		server := startNode(t, testConfig("tcp://127.0.0.1:0", "tcp://127.0.0.1:0"))
		echo := spawnEcho(t, server, "echo")
		d := startNode(t, testConfig("tcp://127.0.0.1:0"))
		for k := range 2 {
			r, err := Resolve[testPing](ctxT(t, 5*time.Second), d, FormatRef(server.Addrs()[k], echo.Path()))
			if err != nil {
				t.Fatalf("Resolve through address %d: %v", k, err)
			}
			if _, err := Ask(ctxT(t, 5*time.Second), r, func(p Ref[testPong]) testPing { return testPing{N: k, ReplyTo: p} }); err != nil {
				t.Fatalf("ask through ref %d: %v", k, err)
			}
		}
		waitFor(t, 5*time.Second, "the tokens in step", func() bool {
			if ok := bytes.Equal(server.byUIDToken(t, d.UID()), d.gate.tokenFor(server.UID())); !ok {
				return false
			}
			return bytes.Equal(d.byUIDToken(t, server.UID()), server.gate.tokenFor(d.UID()))
		})
	}
}

// expectResume waits for the session to resume after a reset, failing
// on its end instead, or after 10 s.
func expectResume(t *testing.T, resumed <-chan PeerResumed, unreachable <-chan PeerUnreachable) {
	t.Helper()
	select {
	case <-resumed:
	case ev := <-unreachable:
		t.Fatalf("the session did not resume: %+v", ev)
	case <-time.After(10 * time.Second):
		t.Fatal("no resume")
	}
}
