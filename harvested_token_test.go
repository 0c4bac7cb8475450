package troupe

import (
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
	fr := newFrameReader(c, DefaultMaxFrameSize)
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
// gets C's token for B, which never changes; with it, it later takes
// over the live session between B and C at B by claiming C's uid there.
//
// Open (#50 item 1): the token belongs to a pair of incarnations, not to
// one session; the fix is a random token per session. The test is kept,
// skipped, as the reproduction for that work; remove the Skip with it.
func TestAHarvestedTokenDoesNotTakeOverALiveSession(t *testing.T) {
	t.Skip("open: a token belongs to a pair of incarnations, not a session (#50 item 1); this reproduces the takeover")
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
	time.Sleep(200 * time.Millisecond)
	// 2. B and C connect for real: B dials C.
	echo := spawnEcho(t, c, "echo")
	ref, err := Resolve[testPing](ctxT(t, 5*time.Second), b, FormatRef(c.Addrs()[0], echo.Path()))
	if err != nil {
		t.Fatalf("B resolves at C: %v", err)
	}
	if _, err := Ask(ctxT(t, 5*time.Second), ref, func(r Ref[testPong]) testPing { return testPing{ReplyTo: r} }); err != nil {
		t.Fatal(err)
	}
	b.pmu.Lock()
	held := b.byUID[c.UID()]
	b.pmu.Unlock()
	// 3. Claim C at B, resuming, with the harvested token.
	h2 := &hello{version: protocolVersion, uid: c.UID(), name: c.Name(), flags: helloResumable | helloCredit | helloResuming, session: newNonce(), dial: 1 << 40}
	v, _, conn2 := rawDial(t, b, h2, tokCforB)
	defer conn2.Close()
	time.Sleep(200 * time.Millisecond)
	b.pmu.Lock()
	now := b.byUID[c.UID()]
	b.pmu.Unlock()
	t.Logf("verdict %v; B's session with C replaced: %v", v, now != held)
	if v == frameWelcome || now != held {
		t.Errorf("the stranger took over B's live session with C with a token it harvested earlier")
	}
}
