package troupe

import "testing"

// TestEventsMatchDropAndUnsubscribe covers the event stream alone: a
// subscription sees the events of its type (or interface), a full channel
// drops and counts, a panicking callback is unsubscribed, and nothing
// arrives after Unsubscribe.
func TestEventsMatchDropAndUnsubscribe(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	var es Events
	var peers []PeerConnected
	var all int
	s1 := Subscribe(&es, func(e PeerConnected) { peers = append(peers, e) })
	Subscribe(&es, func(any) { all++ })
	ch := make(chan DeadLetter, 1)
	s3 := SubscribeChan(&es, ch)
	panics := Subscribe(&es, func(ProtocolError) { panic("subscriber bug") })

	es.Publish(PeerConnected{Name: "a"})
	es.Publish(DeadLetter{Target: "x"})
	es.Publish(DeadLetter{Target: "y"}) // the channel is full: dropped
	es.Publish(ProtocolError{Remote: "r"})
	es.Publish(ProtocolError{Remote: "r"}) // the panicking subscriber is gone
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
	es.Publish(PeerConnected{Name: "b"})
	if len(peers) != 1 {
		t.Fatalf("an unsubscribed callback ran: %v", peers)
	}
	if !es.hasSubscribers() {
		t.Fatal("subscribers remain, yet hasSubscribers is false")
	}
}
