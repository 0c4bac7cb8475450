package troupe

import (
	"bytes"
	"fmt"
	"net"
	"testing"
	"time"
)

func rawDial(t *testing.T, n *Node, h *hello, token []byte) (frameKind, *frameReader, net.Conn) {
	t.Helper()
	addr := n.Addrs()[0]
	c, err := net.Dial(addr.Network(), addr.Address())
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(3 * time.Second))
	c.Write(appendFrame(nil, func(b []byte) []byte { return appendHello(b, frameHello, h) }))
	fr := newFrameReader(c, defaultMaxFrameSize)
	body, err := fr.next()
	if err != nil {
		t.Fatal(err)
	}
	if frameKind(body[0]) == frameTokenChallenge {
		tc, _ := parseTokenChallenge(body[1:])
		proof := authMAC(token, "claim-dialer", append([]byte(nil), tc.nonce...), h.session, h.uid, tc.uid)
		c.Write(appendFrame(nil, func(b []byte) []byte { return appendProof(b, proof) }))
		if body, err = fr.next(); err != nil {
			t.Fatal(err)
		}
	}
	return frameKind(body[0]), fr, c
}

// A stranger that claims B's uid at C while C holds no session with B
// gets C's token for that session; with it, it must not take over the
// later, live session between B and C at B by claiming C's uid there.
//
// (#50 item 1, from review: the token was HMAC(key, peer uid), the same
// for every session of a pair; now each session draws its own.)
func TestAHarvestedTokenDoesNotTakeOverALiveSession(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	b := startNode(t, testConfig("tcp://127.0.0.1:0"))
	c := startNode(t, testConfig("tcp://127.0.0.1:0"))
	// 1. Claim B at C (no session yet) and read C's token frame.
	h := &hello{version: protocolVersion, uid: b.UID(), name: b.Name(), flags: helloResumable | helloCredit, session: newNonce()}
	v, fr, conn := rawDial(t, c, h, nil)
	if v != frameWelcome {
		t.Fatalf("claim of B at C: %v", v)
	}
	var tokCforB []byte
	for tokCforB == nil {
		body, err := fr.next()
		if err != nil {
			t.Fatal(err)
		}
		if frameKind(body[0]) == frameToken {
			tokCforB = append([]byte(nil), body[1:]...)
		}
	}
	conn.Close()
	waitFor(t, 5*time.Second, "C to see the claim's connection close", func() bool {
		c.peers.mu.Lock()
		a := c.peers.byUID[b.UID()]
		c.peers.mu.Unlock()
		if a == nil {
			return true
		}
		a.mu.Lock()
		defer a.mu.Unlock()
		return a.life.state != assocUp
	})
	// 2. B and C connect for real: B dials C.
	echo := spawnEcho(t, c, "echo")
	ref, err := Resolve[testPing](ctxT(t, 5*time.Second), b, FormatRef(c.Addrs()[0], echo.Path()))
	if err != nil {
		t.Fatalf("B resolves at C: %v", err)
	}
	if _, err := Ask(ctxT(t, 5*time.Second), ref, func(r Ref[testPong]) testPing { return testPing{ReplyTo: r} }); err != nil {
		t.Fatal(err)
	}
	b.peers.mu.Lock()
	held := b.peers.byUID[c.UID()]
	b.peers.mu.Unlock()
	// 3. Claim C at B, resuming, with the harvested token.
	h2 := &hello{version: protocolVersion, uid: c.UID(), name: c.Name(), flags: helloResumable | helloCredit | helloResuming, session: newNonce(), dial: 1 << 40}
	v, _, conn2 := rawDial(t, b, h2, tokCforB)
	defer conn2.Close()
	time.Sleep(200 * time.Millisecond)
	b.peers.mu.Lock()
	now := b.peers.byUID[c.UID()]
	b.peers.mu.Unlock()
	t.Logf("verdict %v; B's session with C replaced: %v", v, now != held)
	if v == frameWelcome || now != held {
		t.Errorf("the stranger took over B's live session with C with a token it harvested earlier")
	}
}

// A peer that gave its session up (here: ended it without a word, as a
// side whose resume window ran out first would) and dials again without
// resuming, while this node still holds the session suspended, proves the
// token it drew for that session: the new connection replaces the
// suspended session, and the two talk again. The new session draws new
// tokens on both sides.
func TestAPeerThatGaveItsSessionUpRedialsAndIsAdmitted(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	b := startNode(t, testConfig("tcp://127.0.0.1:0"))
	c := startNode(t, testConfig("tcp://127.0.0.1:0"))
	echo := spawnEcho(t, c, "echo")
	target := FormatRef(c.Addrs()[0], echo.Path())
	ask := func(what string) {
		t.Helper()
		ref, err := Resolve[testPing](ctxT(t, 5*time.Second), b, target)
		if err != nil {
			t.Fatalf("%s: resolve: %v", what, err)
		}
		if _, err := Ask(ctxT(t, 5*time.Second), ref, func(r Ref[testPong]) testPing { return testPing{ReplyTo: r} }); err != nil {
			t.Fatalf("%s: ask: %v", what, err)
		}
	}
	ask("first session")
	first := b.gate.tokenFor(c.UID())
	c.peers.mu.Lock()
	held := c.peers.byUID[b.UID()]
	c.peers.mu.Unlock()
	if first == nil || !bytes.Equal(c.byUIDToken(t, b.UID()), first) {
		t.Fatalf("c does not hold b's token for their session")
	}
	// B ends its side quietly: its connection closes, C suspends.
	b.peers.mu.Lock()
	a := b.peers.byUID[c.UID()]
	b.peers.mu.Unlock()
	a.conn.(*net.TCPConn).SetLinger(0)
	a.fail(fmt.Errorf("%w: the test gives the session up", errSessionReplaced))
	deadline := time.Now().Add(5 * time.Second)
	for {
		held.mu.Lock()
		st := held.life.state
		held.mu.Unlock()
		if st == assocSuspended {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("c's session with b is %v, want suspended", st)
		}
		time.Sleep(5 * time.Millisecond)
	}
	ask("after b gave the session up")
	c.peers.mu.Lock()
	now := c.peers.byUID[b.UID()]
	c.peers.mu.Unlock()
	if now == held {
		t.Fatalf("c still holds the session b gave up")
	}
	if second := b.gate.tokenFor(c.UID()); bytes.Equal(second, first) || !bytes.Equal(c.byUIDToken(t, b.UID()), second) {
		t.Fatalf("the new session's token: b drew a new one %v, c holds it %v", !bytes.Equal(second, first), bytes.Equal(c.byUIDToken(t, b.UID()), second))
	}
}
