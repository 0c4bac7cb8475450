package troupe

import (
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
