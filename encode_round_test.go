package troupe

import (
	"testing"
	"time"
)

// slowWire is a message whose encoding takes a millisecond.
type slowWire struct{ N uint16 }

func (s slowWire) AppendWire(b []byte) []byte {
	time.Sleep(time.Millisecond) // (a costly encoder, as a user may write)
	return append(b, byte(s.N>>8), byte(s.N))
}

func (s *slowWire) UnmarshalWire(b []byte) error {
	s.N = uint16(b[0])<<8 | uint16(b[1])
	return nil
}

func init() { SetWireKey[slowWire]("troupe.test.slowwire") }

// Messages queued before a session came up are encoded by its writer, a
// round at a time: between rounds it writes, heartbeats included, so a
// long backlog of costly encodings never keeps the connection silent past
// the peer's window. (The writer encoded the whole queue before its first
// write: 2,000 records of 1 ms held it 2 s, and the peer, with a 1 s
// window, declared this node unreachable; seen as "nothing heard for 5 s"
// in TestResetsWhileMidSizeMessagesStream, whose sender kept refilling the
// queue a resume had handed to the writer.)
func TestAQueuedBacklogDoesNotSilenceTheConnection(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	slowTest(t)
	cfg := func(name string) Config {
		c := failConfig(name, 50*time.Millisecond, time.Second)
		c.Listen = []string{"tcp://127.0.0.1:0"}
		return c
	}
	home, away := startNode(t, cfg("home")), startNode(t, cfg("away"))
	const total = 2000
	got := make(chan uint16, total)
	if _, err := Spawn(away, "sink", Behavior[slowWire]{Receive: func(_ *Context[slowWire], m slowWire) { got <- m.N }}); err != nil {
		t.Fatal(err)
	}
	var trouble firstOf
	for _, n := range []*Node{home, away} {
		Subscribe(n, func(ev PeerUnreachable) { trouble.CompareAndSwap(nil, ev) })
		Subscribe(n, func(ev DeadLetter) { trouble.CompareAndSwap(nil, ev) })
	}
	a, err := home.peers.assocAt(away.Addrs()[0], false, NodeUID{})
	if err != nil {
		t.Fatal(err)
	}
	key := refKey{node: away.UID(), path: "/user/sink"}
	sink := Ref[slowWire]{h: &handle{node: home, key: key, assoc: a}}
	// Queued as records: the association dials on the first, and comes up
	// while the rest are queued behind it.
	for i := range total {
		sink.Tell(slowWire{N: uint16(i)})
	}
	for i := range total {
		select {
		case n := <-got:
			if n != uint16(i) {
				t.Fatalf("message %d arrived as %d", i, n)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("%d of %d messages arrived (trouble: %+v)", i, total, trouble.Load())
		}
		if ev := trouble.Load(); ev != nil {
			t.Fatalf("after %d messages: %+v", i, ev)
		}
	}
}
