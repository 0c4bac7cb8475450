package troupe

import (
	"errors"
	"io"
	"testing"
)

// TestAssocTransitions pins the whole transition table: every state under
// every event.
func TestAssocTransitions(t *testing.T) {
	const (
		C, U, S, E, L, R, X = assocConnecting, assocUp, assocSuspended, assocEnding, assocLeaving, assocRetiring, assocClosed
		no                  = assocStateCount // the event does not apply
	)
	table := map[assocState][assocEventCount]assocState{
		//  handshaken lost merge leave give up ended link lost
		C: {U, X, X, no, X, no},
		U: {no, R, L, E, X, S},
		S: {no, X, X, no, X, no},
		E: {no, R, L, E, X, no},
		L: {no, X, no, L, X, no},
		R: {no, no, no, R, X, no},
		X: {no, no, no, no, no, no},
	}
	if len(table) != int(assocStateCount) {
		t.Fatalf("the table covers %d states of %d", len(table), assocStateCount)
	}
	for from, row := range table {
		for ev, want := range row {
			got, ok := nextState(from, assocEvent(ev))
			if want == no {
				if ok || got != from {
					t.Errorf("%s on %s: moved to %s, want ignored", from, assocEvent(ev), got)
				}
				continue
			}
			if !ok || got != want {
				t.Errorf("%s on %s: %s (applies %v), want %s", from, assocEvent(ev), got, ok, want)
			}
		}
	}
}

// TestAssocLives walks whole lives through step, as the code applies them.
func TestAssocLives(t *testing.T) {
	lives := []struct {
		name   string
		events []assocEvent
		want   assocState
	}{
		{"dial, handshake, peer leaves", []assocEvent{evHandshaken, evEnded}, assocClosed},
		{"silent peer: given up, then the reader ends it", []assocEvent{evHandshaken, evGiveUp, evEnded}, assocClosed},
		{"silent peer while this node leaves", []assocEvent{evHandshaken, evGiveUp, evLeave}, assocLeaving},
		{"simultaneous dial, this one lost while up", []assocEvent{evHandshaken, evLostMerge}, assocRetiring},
		{"a retiring one is not closed by a leave", []assocEvent{evHandshaken, evLostMerge, evLeave}, assocRetiring},
		{"simultaneous dial lost during the handshake", []assocEvent{evLostMerge, evHandshaken}, assocClosed},
		{"a late handshake after the end changes nothing", []assocEvent{evEnded, evHandshaken}, assocClosed},
		{"a second end is ignored", []assocEvent{evHandshaken, evEnded, evEnded}, assocClosed},
		{"a flap, then the resume takes the session over", []assocEvent{evHandshaken, evLinkLost, evLostMerge}, assocClosed},
		{"a flap during a leave is an end", []assocEvent{evHandshaken, evLeave, evLinkLost}, assocLeaving},
		{"a suspended session is not given up on, it is ended", []assocEvent{evHandshaken, evLinkLost, evGiveUp}, assocSuspended},
	}
	for _, l := range lives {
		s := assocConnecting
		for _, ev := range l.events {
			s, _ = nextState(s, ev)
		}
		if s != l.want {
			t.Errorf("%s: ends %s, want %s", l.name, s, l.want)
		}
	}
}

// TestEndingOf is the table of what an end does: publish the peer's loss,
// quarantine it, or only report a retired duplicate's unconfirmed messages.
func TestEndingOf(t *testing.T) {
	tests := []struct {
		from                      assocState
		peerLeft, closing, exempt bool
		want                      ending
	}{
		{assocConnecting, false, false, false, ending{}},                               // a failed dial or handshake: nobody relied on it
		{assocUp, false, false, false, ending{publish: true, quarantine: true}},        // broke or misbehaved
		{assocEnding, false, false, false, ending{publish: true, quarantine: true}},    // silent past the window
		{assocSuspended, false, false, false, ending{publish: true, quarantine: true}}, // not resumed within the window, or refused
		{assocUp, true, false, false, ending{publish: true}},                           // the peer said goodbye
		{assocUp, false, true, false, ending{}},                                        // this node is closing
		{assocLeaving, false, false, false, ending{}},                                  // this node was leaving
		{assocUp, false, false, true, ending{publish: true}},                           // a cluster member or a registrar
		{assocEnding, false, false, true, ending{publish: true}},                       // exempt even when silent
		{assocRetiring, false, false, false, ending{retired: true}},                    // a merged duplicate
		{assocRetiring, false, true, false, ending{retired: true}},                     // whatever else holds
		{assocEnding, true, false, false, ending{publish: true}},                       // given up, then the bye came
		{assocUp, false, false, false, endingOf(assocEnding, false, false, false)},     // up and ending end alike
		{assocConnecting, false, true, false, endingOf(assocConnecting, false, false, false)},
	}
	for i, tt := range tests {
		if got := endingOf(tt.from, tt.peerLeft, tt.closing, tt.exempt); got != tt.want {
			t.Errorf("%d: from %s (left %v, closing %v, exempt %v): %+v, want %+v", i, tt.from, tt.peerLeft, tt.closing, tt.exempt, got, tt.want)
		}
	}
}

// TestChooseDuplicate is the simultaneous-dial rule: both nodes keep the
// connection the lower uid dialed, deciding alike without a word.
func TestChooseDuplicate(t *testing.T) {
	low, high := NodeUID{1}, NodeUID{2}
	tests := []struct {
		name              string
		freshOut, heldOut bool
		self, peer        NodeUID
		want              mergeVerdict
	}{
		{"low side: its own fresh dial wins over the peer's held one", true, false, low, high, keepFresh},
		{"low side: the peer's fresh dial is refused", false, true, low, high, refuseFresh},
		{"high side: its own fresh dial yields to the peer's held one", true, false, high, low, keepHeld},
		{"high side: the peer's fresh dial wins", false, true, high, low, keepFresh},
		{"the peer dialed again: fresh inbound replaces held inbound", false, false, low, high, keepFresh},
		{"the peer dialed again, seen from the high side", false, false, high, low, keepFresh},
		{"two dials of this node: the lower's fresh one wins", true, true, low, high, keepFresh},
		{"two dials of this node: the higher's fresh one wins too, as the peer decides", true, true, high, low, keepFresh},
	}
	for _, tt := range tests {
		if got := chooseDuplicate(tt.freshOut, tt.heldOut, tt.self, tt.peer); got != tt.want {
			t.Errorf("%s: %d, want %d", tt.name, got, tt.want)
		}
	}
	// Both ends of one simultaneous dial keep the same connection, the one
	// the low side dialed, whichever of the two each side attached first.
	keptDialer := func(self, peer NodeUID, heldOwn bool) NodeUID {
		v := chooseDuplicate(!heldOwn, heldOwn, self, peer)
		freshDialer, heldDialer := self, peer // fresh is its own dial
		if heldOwn {
			freshDialer, heldDialer = peer, self
		}
		if v == keepFresh {
			return freshDialer
		}
		return heldDialer
	}
	for _, lowHeldOwn := range []bool{true, false} {
		for _, highHeldOwn := range []bool{true, false} {
			if k := keptDialer(low, high, lowHeldOwn); k != low {
				t.Errorf("low side (held own %v) keeps the dial of %v", lowHeldOwn, k[0])
			}
			if k := keptDialer(high, low, highHeldOwn); k != low {
				t.Errorf("high side (held own %v) keeps the dial of %v", highHeldOwn, k[0])
			}
		}
	}
	// Two connections dialed by one node (to two addresses of the other,
	// as after a registrar's address is taken over), seen in the same
	// order on both: the dialer and the node it dialed keep the same one,
	// whichever has the lower uid. (The dialer with the higher uid kept
	// the old one while the other kept the fresh: each retired the one
	// the other kept, and the session flapped every retireDrain.)
	for _, dialerLow := range []bool{true, false} {
		dialer, acceptor := low, high
		if !dialerLow {
			dialer, acceptor = high, low
		}
		d := chooseDuplicate(true, true, dialer, acceptor)
		a := chooseDuplicate(false, false, acceptor, dialer)
		if d != a {
			t.Errorf("dialer (lower uid %v) decided %d, the node it dialed %d", dialerLow, d, a)
		}
	}
}

// A session that ends unreachable (given up on, or its link lost without a
// goodbye) carries a failure that wraps ErrPeerUnreachable from the moment
// it ends: the Sends it wakes read it before any quarantine is recorded
// (TestASendWaitingForCreditEndsWithItsPeer failed on that window), and
// an exempt peer (a registrar, a member) is never quarantined at all.
func TestAnUnreachableEndWrapsErrPeerUnreachableAtOnce(t *testing.T) {
	window := errors.New("nothing heard for 1s (the limit is 1s)")
	cases := []struct {
		name        string
		events      []lifeEvent
		unreachable bool
	}{
		{"given up, then ended by the reader", []lifeEvent{{kind: evGiveUp, cause: window}, {kind: evEnded, cause: io.EOF}}, true},
		{"the link broke, not resumable", []lifeEvent{{kind: evEnded, cause: io.ErrUnexpectedEOF}}, true},
		{"the peer said goodbye", []lifeEvent{{kind: evEnded, cause: ErrPeerLeft}}, false},
		{"this node closed", []lifeEvent{{kind: evEnded, cause: ErrNodeClosed}}, false},
		{"this node left", []lifeEvent{{kind: evLeave}, {kind: evEnded, cause: io.EOF}}, false},
	}
	for _, c := range cases {
		l := life{state: assocUp}
		var eff effect
		for _, ev := range c.events {
			var ok bool
			l, eff, ok = l.step(ev)
			if !ok {
				t.Fatalf("%s: %s did not apply", c.name, ev.kind)
			}
		}
		if eff&effWake == 0 {
			t.Fatalf("%s: the end wakes no sender", c.name)
		}
		if got := errors.Is(l.err, ErrPeerUnreachable); got != c.unreachable {
			t.Errorf("%s: the failure %v wraps ErrPeerUnreachable: %v, want %v", c.name, l.err, got, c.unreachable)
		}
		if c.unreachable && l.err.Error() != c.events[0].cause.Error() {
			t.Errorf("%s: the failure reads %q, want the cause's own words %q", c.name, l.err, c.events[0].cause)
		}
	}
}
