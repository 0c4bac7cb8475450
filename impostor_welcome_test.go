package troupe

import (
	"net"
	"testing"
	"time"
)

// An impostor that answers a dial with a live peer's uid and no proof
// (a welcome without the session extension) is refused even where the
// held session wins (held inbound, this node the higher uid): a losing
// duplicate retires into the session, its frames read as the peer's, so
// it must prove its claim too.
func TestAnImpostorWelcomeWithoutProofDoesNotJoinTheSession(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	var server, d *Node
	for {
		x := startNode(t, testConfig("tcp://127.0.0.1:0"))
		y := startNode(t, testConfig("tcp://127.0.0.1:0"))
		if func() bool { a, b := y.UID(), x.UID(); return string(a[:]) > string(b[:]) }() {
			server, d = x, y
			break
		}
		x.Close()
		y.Close()
	}
	echoD := spawnEcho(t, d, "echo")
	echoS := spawnEcho(t, server, "echo")
	// server dials d: at d the session is inbound.
	rs, err := Resolve[testPing](ctxT(t, 5*time.Second), server, FormatRef(d.Addrs()[0], echoD.Path()))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Ask(ctxT(t, 5*time.Second), rs, func(r Ref[testPong]) testPing { return testPing{ReplyTo: r} }); err != nil {
		t.Fatal(err)
	}
	d.peers.mu.Lock()
	held := d.peers.byUID[server.UID()]
	d.peers.mu.Unlock()
	if held == nil || held.outbound {
		t.Fatalf("held %+v", held)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	got := make(chan []frameKind, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			got <- nil
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(3 * time.Second))
		fr := newFrameReader(c, defaultMaxFrameSize)
		if _, err := fr.next(); err != nil {
			got <- nil
			return
		}
		w := &hello{version: protocolVersion, uid: server.UID(), name: server.Name(), flags: helloResumable | helloCredit}
		c.Write(appendFrame(nil, func(b []byte) []byte { return appendHello(b, frameWelcome, w) }))
		c.Write(appendWhole(nil, appendDraining(nil)))
		var kinds []frameKind
		for {
			body, err := fr.next()
			if err != nil {
				got <- kinds
				return
			}
			kinds = append(kinds, frameKind(body[0]))
		}
	}()
	_, err = Resolve[testPing](ctxT(t, 5*time.Second), d, FormatRef(tcpAddr(l.Addr().String()), echoS.Path()))
	t.Logf("Resolve through the impostor: %v", err)
	kinds := <-got
	t.Logf("impostor read %v", kinds)
	held.mu.Lock()
	dr := held.peerDraining
	held.mu.Unlock()
	d.peers.mu.Lock()
	now := d.peers.byUID[server.UID()]
	proven := now.tab.proven
	d.peers.mu.Unlock()
	t.Logf("held still the session: %v; proven addrs: %v", now == held, proven)
	if dr {
		t.Errorf("the impostor's draining frame marked the real session with the server as draining")
	}
	if len(kinds) != 1 || kinds[0] != frameBye {
		t.Errorf("the impostor read %v, want only a bye (refused)", kinds)
	}
}
