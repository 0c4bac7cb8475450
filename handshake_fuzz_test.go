package troupe

import (
	"net"
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
			src, _ := n.admit(ours)
			n.serveInbound(ours, src)
			n.inbound.Add(-1)
			if n == guarded && guarded.liveAssocs() != 0 {
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
			n.dialHandshake(ours, newFrameReader(ours, DefaultMaxFrameSize), n.hello())
			ours.Close()
		}
	})
}
