package troupe

import "testing"

// TestEventsMatchDropAndUnsubscribe covers the event stream alone: a
// subscription sees the events of its type (or interface), a full channel
// drops and counts, a panicking callback is unsubscribed, and nothing
// arrives after Unsubscribe.
func TestEventsMatchDropAndUnsubscribe(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	var es eventStream
	var peers []PeerConnected
	var all int
	s1 := subscribe(&es, func(e PeerConnected) { peers = append(peers, e) }, false)
	subscribe(&es, func(any) { all++ }, false)
	ch := make(chan DeadLetter, 1)
	s3 := subscribeChan(&es, ch, false)
	panics := subscribe(&es, func(ProtocolError) { panic("subscriber bug") }, false)

	es.publish(PeerConnected{Name: "a"}, false)
	es.publish(DeadLetter{Target: "x"}, false)
	es.publish(DeadLetter{Target: "y"}, false) // the channel is full: dropped
	es.publish(ProtocolError{Remote: "r"}, false)
	es.publish(ProtocolError{Remote: "r"}, false) // the panicking subscriber is gone
	if len(peers) != 1 || peers[0].Name != "a" {
		t.Fatalf("PeerConnected subscriber saw %v", peers)
	}
	if all != 5 {
		t.Fatalf("Subscribe[any] saw %d events, want 5", all)
	}
	if got := (<-ch).Target; got != "x" || s3.Dropped() != 1 {
		t.Fatalf("channel got %q with %d dropped, want x and 1", got, s3.Dropped())
	}
	if !panics.off.Load() {
		t.Fatal("a subscriber that panicked is still subscribed")
	}
	s1.Unsubscribe()
	s1.Unsubscribe() // twice is fine
	es.publish(PeerConnected{Name: "b"}, false)
	if len(peers) != 1 {
		t.Fatalf("an unsubscribed callback ran: %v", peers)
	}
	if !es.hasSubscribers() {
		t.Fatal("subscribers remain, yet hasSubscribers is false")
	}
}
