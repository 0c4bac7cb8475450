package troupe

import (
	"errors"
	"net"
	"os"
	"testing"
	"time"
)

func TestFaultNetShortPauseLosesNothing(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	p := newPair(t, 20*time.Millisecond, 500*time.Millisecond)
	sink, got := spawnCollector[testPong](t, p.home, "sink", 100)
	p.f.Pause(p.away)
	for i := range 50 {
		p.toAway.Tell(testPing{N: i, ReplyTo: sink})
	}
	select {
	case m := <-got:
		t.Fatalf("a reply crossed a paused network: %+v", m)
	case <-time.After(100 * time.Millisecond): // well inside the window
	}
	p.f.Resume(p.away)
	for i := range 50 {
		if m := recv(t, got, "reply after resume"); m.N != i {
			t.Fatalf("reply %d has N=%d", i, m.N)
		}
	}
	select {
	case ev := <-p.homeEvents:
		t.Fatalf("a pause shorter than the window raised %+v", ev)
	default:
	}
}

func TestFaultNetIsolate(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	p := newPair(t, 20*time.Millisecond, 300*time.Millisecond)
	third := startOn(t, p.f, failConfig("third", 20*time.Millisecond, 300*time.Millisecond))
	spawnEcho(t, third, "echo")
	roundTrip(t, third, p.home, "/user/echo")
	p.f.isolate(p.home)
	recv(t, p.homeEvents, "home gives up on a peer")
	recv(t, p.awayEv, "away gives up on home")
	roundTrip(t, third, p.away, "/user/echo") // the others still talk
}

// A read held on a link to a killed node, or on a cut one, ends at its
// deadline as on a real connection, and what it had read arrives once
// the link heals. Before, such a read waited for ever: beside two CPU
// burners a member's dial to the address of a member killed during its
// handshake stayed "connecting" for good, and every send to the address
// where that member had restarted went nowhere
// (TestClusterMemberRestartedAtSameAddress).
func TestFaultNetAHeldReadHonoursItsDeadline(t *testing.T) {
	t.Parallel()
	read := func(t *testing.T, c *faultConn) (string, error) {
		t.Helper()
		c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		done := make(chan error, 1)
		buf := make([]byte, 16)
		var n int
		go func() {
			var err error
			n, err = c.Read(buf)
			done <- err
		}()
		select {
		case err := <-done:
			return string(buf[:n]), err
		case <-time.After(slack(10 * time.Second)):
			c.Close()
			t.Fatal("a held read outlived its deadline by 10 s")
			return "", nil
		}
	}
	for _, tc := range []struct {
		name  string
		fault func(f *FaultNet, a, b *Node)
		heal  func(f *FaultNet, a, b *Node)
	}{
		{"killed", func(f *FaultNet, _, b *Node) { f.change(func() { f.killed[b] = true }) }, nil},
		{"cut", func(f *FaultNet, a, b *Node) { f.Partition(a, b) }, func(f *FaultNet, _, _ *Node) { f.Heal() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, a, b := new(FaultNet), &Node{}, &Node{uid: NodeUID{1}}
			// A real connection, so that what the far end writes is there
			// to read before the first Read (a pipe writes only into a
			// waiting read).
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			near, err := net.Dial("tcp", l.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			far, err := l.Accept()
			if err != nil {
				t.Fatal(err)
			}
			defer far.Close()
			c := &faultConn{Conn: near, f: f, local: a, remote: b}
			defer c.Close()
			tc.fault(f, a, b)
			if _, err := far.Write([]byte("hello")); err != nil {
				t.Fatal(err)
			}
			if got, err := read(t, c); !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("held read: %q, %v; want the deadline's error", got, err)
			}
			if tc.heal == nil {
				return
			}
			tc.heal(f, a, b)
			if got, err := read(t, c); got != "hello" || err != nil {
				t.Fatalf("after the heal: %q, %v; want what was held", got, err)
			}
		})
	}
}
