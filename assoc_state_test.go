package troupe

import (
	"errors"
	"io"
	"testing"
)

// TestAssocTransitions pins the whole transition table: every state under
// every event.
func TestAssocTransitions(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
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
	t.Parallel()
	checkLeaks(t)
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
	t.Parallel()
	checkLeaks(t)
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

// TestChooseDuplicate is the rule for two connections with one peer
// incarnation: both nodes keep the same one, deciding alike without a
// word, whatever order each attached them in.
func TestChooseDuplicate(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	low, high := NodeUID{1}, NodeUID{2}
	out, in := func(n uint64) dialOf { return dialOf{true, n} }, func(n uint64) dialOf { return dialOf{false, n} }
	tests := []struct {
		name        string
		fresh, held dialOf
		self, peer  NodeUID
		want        mergeVerdict
	}{
		{"low side: its own fresh dial wins over the peer's held one", out(1), in(1), low, high, keepFresh},
		{"low side: the peer's fresh dial is refused", in(1), out(1), low, high, refuseFresh},
		{"high side: its own fresh dial yields to the peer's held one", out(1), in(1), high, low, keepHeld},
		{"high side: the peer's fresh dial wins", in(1), out(1), high, low, keepFresh},
		{"the peer dialed again: its later dial replaces the held one", in(2), in(1), low, high, keepFresh},
		{"the peer dialed again, seen from the high side", in(2), in(1), high, low, keepFresh},
		{"the peer's earlier dial, attached last, is refused", in(1), in(2), low, high, refuseFresh},
		{"this node's later dial wins", out(2), out(1), low, high, keepFresh},
		{"this node's earlier dial, attached last, retires", out(1), out(2), high, low, keepHeld},
		{"a peer of an earlier release dialed again: the fresh one wins", in(0), in(0), low, high, keepFresh},
		{"this node dialed a peer of an earlier release twice: the fresh one wins", out(0), out(0), high, low, keepFresh},
	}
	for _, tt := range tests {
		if got := chooseDuplicate(tt.fresh, tt.held, tt.self, tt.peer); got != tt.want {
			t.Errorf("%s: %d, want %d", tt.name, got, tt.want)
		}
	}
	// Both ends keep the same connection, whichever order each attached
	// two of them in: one dialed by each (a simultaneous dial: the low
	// side's), or two by the same node (two dials at once: the later).
	// kept is what a side keeps of x and y, attaching first, then second.
	type conn struct {
		dialer NodeUID
		num    uint64
	}
	kept := func(self, peer NodeUID, first, second conn) conn {
		of := func(c conn) dialOf { return dialOf{c.dialer == self, c.num} }
		switch chooseDuplicate(of(second), of(first), self, peer) {
		case keepFresh:
			return second
		}
		return first
	}
	pairs := [][2]conn{
		{{low, 1}, {high, 1}}, // a simultaneous dial
		{{low, 1}, {low, 2}},  // the low side dialed twice
		{{high, 1}, {high, 2}},
		{{high, 7}, {low, 3}},
	}
	for _, xy := range pairs {
		x, y := xy[0], xy[1]
		for _, lowFirst := range []bool{true, false} {
			for _, highFirst := range []bool{true, false} {
				order := func(first bool) (conn, conn) {
					if first {
						return x, y
					}
					return y, x
				}
				a, b := order(lowFirst)
				c, d := order(highFirst)
				if kl, kh := kept(low, high, a, b), kept(high, low, c, d); kl != kh {
					t.Errorf("connections %v and %v: the low side keeps %v, the high side %v", x, y, kl, kh)
				}
			}
		}
	}
}

// A session that ends unreachable (given up on, or its link lost without a
// goodbye) carries a failure that wraps ErrPeerUnreachable from the moment
// it ends: the Sends it wakes read it before any quarantine is recorded
// (TestASendWaitingForCreditEndsWithItsPeer failed on that window), and
// an exempt peer (a registrar, a member) is never quarantined at all.
func TestAnUnreachableEndWrapsErrPeerUnreachableAtOnce(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
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
