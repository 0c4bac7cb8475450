package troupe

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// FuzzHandshake plays arbitrary bytes as a dialer to an accepting node (one
// with a shared secret and one without), and as an acceptor to a dialing
// node. Nothing may panic or hang; a node must not be left with an
// association to a peer that never completed the handshake properly.
func FuzzHandshake(f *testing.F) {
	h := &hello{version: protocolVersion, uid: NodeUID{1, 2, 3}, name: "fuzz", addrs: []string{"tcp://127.0.0.1:1"}}
	f.Add(appendFrame(nil, func(b []byte) []byte { return appendHello(b, frameHello, h) }))
	h.auth = make([]byte, nonceSize)
	f.Add(append(appendFrame(nil, func(b []byte) []byte { return appendHello(b, frameHello, h) }),
		appendFrame(nil, func(b []byte) []byte { return append(append(b, byte(frameProof)), make([]byte, macSize)...) })...))
	f.Add(appendFrame(nil, func(b []byte) []byte {
		return appendChallenge(b, challengeBody{uid: NodeUID{9}, nonce: make([]byte, nonceSize), mac: make([]byte, macSize)})
	}))
	f.Add([]byte{0x05, 0x01, 'T', 'R', 'P', 0x01})
	h.auth, h.appVersion = nil, "v2.1.0"
	f.Add(appendFrame(nil, func(b []byte) []byte { return appendHello(b, frameHello, h) }))
	h.appVersion, h.session, h.dial = "", newNonce(), 7 // a dialer that speaks session tokens and numbers its dials
	f.Add(appendFrame(nil, func(b []byte) []byte { return appendHello(b, frameHello, h) }))
	f.Add(append(appendFrame(nil, func(b []byte) []byte { return appendHello(b, frameHello, h) }), // and answers a token challenge
		appendFrame(nil, func(b []byte) []byte { return appendProof(b, make([]byte, macSize)) })...))
	f.Add(appendFrame(nil, func(b []byte) []byte { // (as the acceptor's answer to a dialer)
		return appendTokenChallenge(b, tokenChallenge{uid: NodeUID{9}, nonce: make([]byte, nonceSize)})
	}))
	f.Add(appendFrame(nil, func(b []byte) []byte { // a session extension of the wrong length
		b = appendHello(b, frameHello, &hello{version: protocolVersion, uid: NodeUID{5}, name: "short"})
		return append(b[:len(b)-1], 1, 4, 3, 1, 2, 3)
	}))
	f.Add(appendFrame(nil, func(b []byte) []byte { // a dial number of 0
		b = appendHello(b, frameHello, &hello{version: protocolVersion, uid: NodeUID{6}, name: "zero"})
		return append(b[:len(b)-1], 1, 5, 1, 0)
	}))
	f.Add(appendFrame(nil, func(b []byte) []byte { // a probe's downed notice, with a proof
		return appendHello(b, frameHello, &hello{version: protocolVersion, flags: helloProbe, uid: NodeUID{8}, name: "teller",
			downed: &downedNotice{uid: NodeUID{9}, mac: make([]byte, macSize)}})
	}))
	f.Add(appendFrame(nil, func(b []byte) []byte { // a downed notice of the wrong length
		b = appendHello(b, frameHello, &hello{version: protocolVersion, uid: NodeUID{8}, name: "short"})
		return append(b[:len(b)-1], 1, 6, 3, 1, 2, 3)
	}))
	h.session, h.dial = nil, 0
	f.Add(appendFrame(nil, func(b []byte) []byte { // an extension of a later version: skipped
		b = appendHello(b, frameHello, &hello{version: protocolVersion, uid: NodeUID{4}, name: "later"})
		return append(b[:len(b)-1], 2, 9, 3, 'a', 'b', 'c', 1, 2, 'v', '3')
	}))

	open, err := Start(ctxT(f, 5*time.Second), Config{Logger: quietLogger(), HandshakeTimeout: time.Second})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { open.Close() })
	guarded, err := Start(ctxT(f, 5*time.Second), Config{Logger: quietLogger(), HandshakeTimeout: time.Second, Secret: []byte("sixteen byte key")})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { guarded.Close() })

	f.Fuzz(func(t *testing.T, in []byte) {
		for _, n := range []*Node{open, guarded} {
			ours, theirs := net.Pipe()
			go func() {
				theirs.Write(in)
				theirs.Close()
			}()
			src, _ := n.inbound.admit(ours, n.cfg.MaxInboundConns, n.cfg.MaxPendingHandshakes)
			n.gate.serveInbound(ours, src)
			n.inbound.open.Add(-1)
			if n == guarded && guarded.peers.liveAssocs() != 0 {
				t.Fatalf("an unauthenticated dialer got an association from %x", in)
			}
		}
		for _, n := range []*Node{open, guarded} {
			ours, theirs := net.Pipe()
			go func() {
				buf := make([]byte, 4096)
				theirs.SetDeadline(time.Now().Add(time.Second))
				theirs.Read(buf) // the hello
				theirs.Write(in)
				theirs.Close()
			}()
			ours.SetDeadline(time.Now().Add(time.Second))
			h := n.gate.hello()
			h.session = newNonce()
			n.gate.dialHandshake(ours, newFrameReader(ours, defaultMaxFrameSize), h)
			ours.Close()
		}
	})
}

func TestSimultaneousDialEndsWithOneAssociation(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	for i := range 10 {
		a := startNode(t, testConfig("tcp://127.0.0.1:0"))
		b := startNode(t, testConfig("tcp://127.0.0.1:0"))
		ea, eb := spawnEcho(t, a, "echo"), spawnEcho(t, b, "echo")
		_, _ = ea, eb
		ctx := ctxT(t, 5*time.Second)
		type res struct {
			r   Ref[testPing]
			err error
		}
		ra, rb := make(chan res, 1), make(chan res, 1)
		go func() { r, err := Resolve[testPing](ctx, a, FormatRef(b.Addrs()[0], "/user/echo")); ra <- res{r, err} }()
		go func() { r, err := Resolve[testPing](ctx, b, FormatRef(a.Addrs()[0], "/user/echo")); rb <- res{r, err} }()
		x, y := <-ra, <-rb
		if x.err != nil || y.err != nil {
			t.Fatalf("round %d: Resolve: %v, %v", i, x.err, y.err)
		}
		for _, r := range []Ref[testPing]{x.r, y.r} {
			if _, err := Ask(ctx, r, func(rr Ref[testPong]) testPing { return testPing{ReplyTo: rr} }); err != nil {
				t.Fatalf("round %d: Ask over the merged association: %v", i, err)
			}
		}
		waitFor(t, 5*time.Second, "one association on each side", func() bool {
			return a.peers.liveAssocs() == 1 && b.peers.liveAssocs() == 1
		})
	}
}

// TestConcurrentResolvesAcrossASimultaneousDial resolves dozens of
// actors from both sides at once, on nodes listening on a wildcard address
// and dialled on loopback (so neither knows the other's dialled address in
// advance): every Resolve gets its own actor's identity, or an error, and
// none waits for its deadline.
func TestConcurrentResolvesAcrossASimultaneousDial(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	const actors = 40
	for round := range 40 {
		a := startNode(t, testConfig("tcp://0.0.0.0:0"))
		b := startNode(t, testConfig("tcp://0.0.0.0:0"))
		want := map[*Node]map[string]AID{a: {}, b: {}}
		for _, n := range []*Node{a, b} {
			for i := range actors {
				r := spawnEcho(t, n, fmt.Sprintf("echo-%d", i))
				want[n][r.Path()] = r.AID()
			}
		}
		loopback := func(n *Node) Addr {
			_, port, _ := net.SplitHostPort(n.Addrs()[0].Address())
			return tcpAddr("127.0.0.1:" + port)
		}
		ctx := ctxT(t, 10*time.Second)
		var wg sync.WaitGroup
		errs := make(chan error, 2*actors)
		for _, pair := range [][2]*Node{{a, b}, {b, a}} {
			from, to := pair[0], pair[1]
			for i := range actors {
				wg.Go(func() {
					path := fmt.Sprintf("/user/echo-%d", i)
					r, err := Resolve[testPing](ctx, from, FormatRef(loopback(to), path))
					switch {
					case err != nil && ctx.Err() != nil:
						errs <- fmt.Errorf("%s: waited for the deadline: %v", path, err)
					case err == nil && r.AID() != want[to][path]:
						errs <- fmt.Errorf("%s: got the identity %v, want %v", path, r.AID(), want[to][path])
					}
				})
			}
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Errorf("round %d: %v", round, err)
		}
		if t.Failed() {
			return
		}
	}
}

// TestAnotherProtocolVersionIsRefusedInOneLine: a node refuses a hello of
// protocol version 1 with reject code 3 and a text naming both versions;
// a node whose peer refuses its version says so, with the peer's text.
func TestAnotherProtocolVersionIsRefusedInOneLine(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	n := startNode(t, testConfig("tcp://127.0.0.1:0"))
	c, err := net.Dial("tcp", n.Addrs()[0].Address())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// A version 1 hello, as a node of that version wrote it: no extensions.
	old := appendHello(nil, frameHello, &hello{version: 1, uid: NodeUID{5}, name: "old"})
	c.Write(appendWhole(nil, old[:len(old)-1]))
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	body, err := newFrameReader(c, defaultMaxFrameSize).next()
	if err != nil || frameKind(body[0]) != frameReject {
		t.Fatalf("the answer to a version 1 hello: %v %v", body, err)
	}
	r, err := parseReject(body[1:])
	if err != nil || r.code != rejectVersion || !strings.Contains(r.text, "protocol version 1, want 2") {
		t.Fatalf("the refusal: %+v %v", r, err)
	}

	// The other way: a version 1 acceptor refuses this node's hello.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		newFrameReader(c, defaultMaxFrameSize).hello()
		c.Write(rejectFrame(rejectVersion, NodeUID{6}, "troupe: malformed frame: protocol version 2, want 1"))
	}()
	_, err = Resolve[string](ctxT(t, 5*time.Second), n, FormatRef(tcpAddr(l.Addr().String()), "/user/x"))
	if !errors.Is(err, ErrRejected) || !strings.Contains(err.Error(), "another wire protocol version than this node's 2") || !strings.Contains(err.Error(), "want 1") {
		t.Fatalf("Resolve at a version 1 node: %v", err)
	}
}
