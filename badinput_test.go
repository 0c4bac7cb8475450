package troupe

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"
	"time"
)

// rawHandshake dials n like a troupe node would and completes the
// handshake, returning the connection for the test to misbehave on.
func rawHandshake(t *testing.T, n *Node) net.Conn {
	t.Helper()
	c, _ := rawHandshakeWith(t, n, 0)
	return c
}

// expectClosed waits until the peer closes c.
func expectClosed(t *testing.T, c net.Conn) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 256)
	for {
		if _, err := c.Read(buf); err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				t.Fatal("the node did not close the connection")
			}
			return
		}
	}
}

func TestBadInputClosesOnlyThatConnection(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	attacks := []struct {
		name      string
		handshake bool
		send      []byte
		mention   string
	}{
		{"garbage before handshake", false, []byte("GET / HTTP/1.1\r\n\r\n"), "troupe handshake"},
		{"oversized length", true, []byte{0xff, 0xff, 0xff, 0xff, 0x0f}, "too big"},
		{"unknown frame kind", true, []byte{1, 200}, "unknown frame kind"},
		{"truncated tell", true, []byte{3, byte(frameTell), 3, 0}, "malformed"},
		{"undefined target id", true, []byte{3, byte(frameTell), 8, 2}, "undefined target id"},
		{"hello after handshake", true, []byte{1, byte(frameHello)}, "after the handshake"},
		{"seventeen headers", true, []byte{2, byte(frameTellHeaders), 17}, "17 headers"},
		{"a header twice", true, appendWhole(nil, []byte{byte(frameTellHeaders), 2, 1, 'k', 1, 'v', 1, 'k', 1, 'w', 2, 2}), "twice"},
		{"a header past its bound", true, appendWhole(nil, append([]byte{byte(frameTellHeaders), 1, 1, 'k', 0x81, 0x08}, make([]byte, 1025)...)), "1025-byte value"},
	}
	forEachTransport(t, func(t *testing.T, listen func(testing.TB) string) {
		victim := startNode(t, testConfig(listen(t)))
		friend := startNode(t, testConfig(listen(t)))
		spawnEcho(t, victim, "echo")
		errs := make(chan ProtocolError, 16)
		SubscribeChan(victim, errs)
		for _, at := range attacks {
			t.Run(strings.ReplaceAll(at.name, " ", "_"), func(t *testing.T) {
				var c net.Conn
				if at.handshake {
					c = rawHandshake(t, victim)
				} else {
					addr := victim.Addrs()[0]
					var err error
					if c, err = net.Dial(addr.Network(), addr.Address()); err != nil {
						t.Fatal(err)
					}
					defer c.Close()
				}
				c.Write(at.send)
				expectClosed(t, c)
				ev := recv(t, errs, "ProtocolError event")
				if !strings.Contains(ev.Err.Error(), at.mention) {
					t.Errorf("ProtocolError = %v, want it to mention %q", ev.Err, at.mention)
				}
				var fe *frameError
				if !errors.As(ev.Err, &fe) {
					t.Errorf("ProtocolError.Err = %T, want *frameError", ev.Err)
				}
				// A well-behaved peer is not disturbed.
				roundTrip(t, friend, victim, "/user/echo")
			})
		}
	})
}

// ghostTell is a raw tell frame of count{N: 1} to /user/ghost, an actor
// that does not exist, with target and type given inline, so the same
// frame may be sent again and again.
func ghostTell() []byte {
	body := []byte{byte(frameTell), 1} // target id 0, defined inline
	body = appendString(body, "/user/ghost")
	body = append(body, make([]byte, 16)...)
	body = append(body, 1) // type id 0, defined inline: the frame can repeat
	body = appendString(body, "troupe.test.count")
	body = append(body, 2)
	return appendFrame(nil, func(b []byte) []byte { return append(b, body...) })
}

func TestUnknownTargetAndKeyAreDeadLetters(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	n := startNode(t, testConfig("tcp://127.0.0.1:0"))
	dead := make(chan DeadLetter, 4)
	SubscribeChan(n, dead)
	c := rawHandshake(t, n)
	// A tell to an actor that does not exist, of a registered type.
	c.Write(ghostTell())
	if dl := recv(t, dead, "dead letter"); !errors.Is(dl.Reason, ErrNoSuchActor) || dl.Message.(count).N != 1 {
		t.Fatalf("dead letter = %+v", dl)
	}
	// A tell with a wire key this node does not know.
	body := []byte{byte(frameTell), 1}
	body = appendString(body, "/user/ghost")
	body = append(body, make([]byte, 16)...)
	body = append(body, 1)
	body = appendString(body, "no.such.key")
	c.Write(appendFrame(nil, func(b []byte) []byte { return append(b, body...) }))
	if dl := recv(t, dead, "dead letter"); !errors.Is(dl.Reason, ErrNoWireKey) || !strings.Contains(dl.Reason.Error(), "no.such.key") {
		t.Fatalf("dead letter = %+v", dl)
	}
}

// TestAnnouncedAddressesAreNotBelieved: a peer that announces another
// node's address gets neither that node's traffic nor, when it
// misbehaves, that node's address quarantined.
func TestAnnouncedAddressesAreNotBelieved(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	victim := startNode(t, testConfig("tcp://127.0.0.1:0"))
	real := startNode(t, testConfig("tcp://127.0.0.1:0"))
	echo := spawnEcho(t, real, "echo")
	x := real.Addrs()[0]

	// The impostor connects to the victim claiming to listen at x.
	c, err := net.Dial("tcp", victim.Addrs()[0].Address())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	h := &hello{version: protocolVersion, name: "impostor", addrs: []string{x.String()}}
	rand.Read(h.uid[:])
	c.Write(appendFrame(nil, func(b []byte) []byte { return appendHello(b, frameHello, h) }))
	fr := newFrameReader(c, defaultMaxFrameSize)
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if body, err := fr.next(); err != nil || frameKind(body[0]) != frameWelcome {
		t.Fatalf("handshake: %v", err)
	}
	c.SetReadDeadline(time.Time{})

	// Traffic for x goes to the node that really listens there.
	r, err := Resolve[testPing](ctxT(t, 5*time.Second), victim, FormatRef(x, "/user/echo"))
	if err != nil || r.NodeUID() != real.UID() || r.AID() != echo.AID() {
		t.Fatalf("Resolve at %s reached %v (%v), want the real node %v", x, r, err, real.UID())
	}

	// The impostor misbehaves and is quarantined: by its uid, not by x.
	unreachable := make(chan PeerUnreachable, 4)
	SubscribeChan(victim, unreachable)
	c.Write([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}) // a length prefix too long
	waitFor(t, 5*time.Second, "the impostor to be dropped", func() bool {
		for _, q := range victim.peers.quarantined() {
			if q.UID == h.uid {
				if slices.Contains(q.Addrs, x) {
					t.Fatalf("the impostor's claimed address %s was quarantined: %+v", x, q)
				}
				return true
			}
		}
		return false
	})
	roundTrip(t, victim, real, "/user/echo")
}

// TestPeerTablesAreBounded: a peer cannot make a connection keep more than
// maxTableSize entries of at most maxTableEntry bytes.
func TestPeerTablesAreBounded(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	n := startNode(t, testConfig("tcp://127.0.0.1:0"))
	errs := make(chan ProtocolError, 4)
	SubscribeChan(n, errs)
	define := func(id int, path string) []byte {
		body := []byte{byte(frameTell)}
		body = binary.AppendUvarint(body, uint64(id)<<1|1)
		body = appendString(body, path)
		body = append(body, make([]byte, 16)...)
		body = append(body, 0<<1|1)
		body = appendString(body, "no.such.key")
		return appendFrame(nil, func(b []byte) []byte { return append(b, body...) })
	}
	// An entry longer than the bound is refused.
	c := rawHandshake(t, n)
	c.Write(define(1, "/user/"+strings.Repeat("x", maxTableEntry)))
	expectClosed(t, c)
	recv(t, errs, "a protocol error for the long entry")
	// One entry past the count is refused.
	c = rawHandshake(t, n)
	var batch []byte
	for id := 1; id <= maxTableSize+1; id++ {
		batch = append(batch, define(id, fmt.Sprintf("/user/t%d", id))...)
	}
	c.Write(batch)
	expectClosed(t, c)
	recv(t, errs, "a protocol error for the table past its size")
}
