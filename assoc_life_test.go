package troupe

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"
)

// The session's state as one value: life.step is table-tested event by
// event, then for the interleavings the session core's defects came from,
// then exhaustively for what must hold in every order.

var (
	lt0     = time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	lt1     = lt0.Add(40 * time.Millisecond)
	causeA  = errors.New("cause A")
	causeB  = errors.New("cause B")
	winnerW = &assoc{}
)

func (e effect) String() string {
	names := []string{"wake", "notify", "failPending", "dropQueued", "sayGaveUp", "closeHard", "markEnding", "endAsClosing",
		"retire", "handOver", "takeOver", "heldLost", "winnerGone", "end", "retiredEnd", "publish", "quarantine", "suspended", "resumed"}
	var b []string
	for i, n := range names {
		if e&(1<<i) != 0 {
			b = append(b, n)
		}
	}
	return "{" + strings.Join(b, " ") + "}"
}

// TestLifeStep is every event in the states where it matters: the life
// it leaves and the effects it asks for.
func TestLifeStep(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	up := life{state: assocUp, upAt: lt0, encoding: true}
	at := func(s assocState) life { l := up; l.state = s; return l }
	ending := at(assocEnding)
	ending.endCause = causeA
	suspended := at(assocSuspended)
	suspended.lostAt, suspended.lostCause = lt0, causeA
	held := at(assocUp)
	held.holdQueue = true
	closed := at(assocClosed)
	closed.err = causeA
	leavingAcked := at(assocLeaving)
	leavingAcked.byeOnAck = true
	with := func(l life, f func(*life)) life { f(&l); return l }

	tests := []struct {
		name string
		from life
		ev   lifeEvent
		want life
		eff  effect
		ok   bool
	}{
		{"handshaken", life{}, lifeEvent{kind: evHandshaken, at: lt0}, life{state: assocUp, upAt: lt0}, 0, true},
		{"a late handshake changes nothing", closed, lifeEvent{kind: evHandshaken, at: lt1}, closed, 0, false},

		{"give up on an up peer: the peer is told", up, lifeEvent{kind: evGiveUp, cause: causeA}, with(at(assocEnding), func(l *life) { l.endCause = causeA }), effMarkEnding | effSayGaveUp, true},
		{"give up again: the first cause stays", ending, lifeEvent{kind: evGiveUp, cause: causeB}, ending, effSayGaveUp, true},
		{"give up while leaving: recorded, the connection reset", at(assocLeaving), lifeEvent{kind: evGiveUp, cause: causeA}, with(at(assocLeaving), func(l *life) { l.endCause = causeA }), effMarkEnding | effCloseHard, true},
		{"give up during the handshake: reset", life{}, lifeEvent{kind: evGiveUp, cause: causeA}, life{}, effCloseHard, false},
		{"give up on a suspended session: no connection to say it on", suspended, lifeEvent{kind: evGiveUp, cause: causeB}, suspended, effCloseHard, false},

		{"leave: the bye follows the queue, once acknowledged", up, lifeEvent{kind: evLeave}, with(at(assocLeaving), func(l *life) { l.byeOnAck = true }), effWake | effFailPending | effNotify, true},
		{"leave now: the queue is dropped", up, lifeEvent{kind: evLeave, now: true}, at(assocLeaving), effWake | effFailPending | effDropQueued | effNotify, true},
		{"leave during the handshake is an end", life{}, lifeEvent{kind: evLeave}, life{}, effEndAsClosing, true},
		{"leave while suspended is an end", suspended, lifeEvent{kind: evLeave}, suspended, effEndAsClosing, true},
		{"a retiring duplicate is not left", at(assocRetiring), lifeEvent{kind: evLeave}, at(assocRetiring), 0, false},
		{"the writer queues the bye", leavingAcked, lifeEvent{kind: evByeQueued}, at(assocLeaving), effNotify, true},
		{"a bye queued twice", at(assocLeaving), lifeEvent{kind: evByeQueued}, at(assocLeaving), 0, false},

		{"lost merge while up: retire and drain", up, lifeEvent{kind: evLostMerge, winner: winnerW}, with(at(assocRetiring), func(l *life) { l.mergedInto = winnerW }), effWake | effRetire, true},
		{"lost merge in the handshake: hand over", life{}, lifeEvent{kind: evLostMerge, winner: winnerW}, life{state: assocClosed, mergedInto: winnerW}, effWake | effHandOver | effHeldLost, true},
		{"a resume takes the suspended session over", suspended, lifeEvent{kind: evLostMerge, winner: winnerW, resuming: true}, with(suspended, func(l *life) { l.state, l.mergedInto = assocClosed, winnerW }), effWake | effHandOver | effTakeOver, true},
		{"a replace (no resume) reports what was held", suspended, lifeEvent{kind: evLostMerge, winner: winnerW}, with(suspended, func(l *life) { l.state, l.mergedInto = assocClosed, winnerW }), effWake | effHandOver | effHeldLost, true},
		{"a resume into a leaving winner loses nothing silently", suspended, lifeEvent{kind: evLostMerge, winner: winnerW, resuming: true, gone: true}, with(suspended, func(l *life) { l.state, l.mergedInto = assocClosed, winnerW }), effWake | effHandOver | effHeldLost | effWinnerGone, true},
		{"retiring into a gone winner", up, lifeEvent{kind: evLostMerge, winner: winnerW, gone: true}, with(at(assocRetiring), func(l *life) { l.mergedInto = winnerW }), effWake | effRetire | effWinnerGone, true},
		{"a merged session merges once", with(at(assocRetiring), func(l *life) { l.mergedInto = winnerW }), lifeEvent{kind: evLostMerge, winner: &assoc{}}, with(at(assocRetiring), func(l *life) { l.mergedInto = winnerW }), 0, false},

		{"the peer said goodbye: published, not quarantined", up, lifeEvent{kind: evEnded, cause: ErrPeerLeft}, with(closed, func(l *life) { l.err = ErrPeerLeft }), effWake | effEnd | effPublish, true},
		{"broken: published and quarantined", up, lifeEvent{kind: evEnded, cause: io.EOF}, with(closed, func(l *life) { l.err = io.EOF }), effWake | effEnd | effPublish | effQuarantine, true},
		{"given up: it ends with why it was given up", ending, lifeEvent{kind: evEnded, cause: io.EOF}, with(closed, func(l *life) { l.endCause = causeA }), effWake | effEnd | effPublish | effQuarantine, true},
		{"this node closing: nothing published", up, lifeEvent{kind: evEnded, cause: io.EOF, closing: true}, with(closed, func(l *life) { l.err = io.EOF }), effWake | effEnd, true},
		{"ended as the node closes", up, lifeEvent{kind: evEnded, cause: ErrNodeClosed}, with(closed, func(l *life) { l.err = ErrNodeClosed }), effWake | effEnd, true},
		{"replaced by the peer: nothing published", up, lifeEvent{kind: evEnded, cause: fmt.Errorf("x: %w", errSessionReplaced)}, with(closed, func(l *life) { l.err = fmt.Errorf("x: %w", errSessionReplaced) }), effWake | effEnd, true},
		{"a leave ends quietly", at(assocLeaving), lifeEvent{kind: evEnded, cause: io.EOF}, with(closed, func(l *life) { l.err = io.EOF }), effWake | effEnd, true},
		{"a retired duplicate ends", at(assocRetiring), lifeEvent{kind: evEnded, cause: io.EOF}, at(assocClosed), effWake | effRetiredEnd, true},
		{"a failed dial", life{}, lifeEvent{kind: evEnded, cause: causeB}, life{state: assocClosed, err: causeB}, effWake | effEnd, true},
		{"a second end", closed, lifeEvent{kind: evEnded, cause: causeB}, closed, 0, false},
		{"quarantined: the reason says so", closed, lifeEvent{kind: evQuarantined, cause: causeB}, with(closed, func(l *life) { l.err = causeB }), 0, true},
		{"quarantined before the end", up, lifeEvent{kind: evQuarantined, cause: causeB}, up, 0, false},

		{"a flap suspends", up, lifeEvent{kind: evLinkLost, at: lt1, cause: causeB, resumable: true}, with(at(assocSuspended), func(l *life) { l.lostAt, l.lostCause = lt1, causeB }), effSuspended, true},
		{"a flap of a session that cannot resume", up, lifeEvent{kind: evLinkLost, at: lt1, cause: causeB}, up, 0, false},
		{"a flap after giving up is the end", ending, lifeEvent{kind: evLinkLost, at: lt1, cause: causeB, resumable: true}, ending, 0, false},
		{"a flap of a merged session is the end", with(at(assocRetiring), func(l *life) { l.mergedInto = winnerW }), lifeEvent{kind: evLinkLost, resumable: true}, with(at(assocRetiring), func(l *life) { l.mergedInto = winnerW }), 0, false},
		{"a flap while leaving is the end", at(assocLeaving), lifeEvent{kind: evLinkLost, resumable: true}, at(assocLeaving), 0, false},

		{"taken over: the queue waits for the resume frame", life{state: assocConnecting}, lifeEvent{kind: evTakenOver, at: lt0}, life{holdQueue: true, lostAt: lt0}, 0, true},
		{"the resume frame releases the queue", held, lifeEvent{kind: evResumeFrame}, up, effWake | effNotify | effResumed, true},
		{"a resume frame on a session not resumed", up, lifeEvent{kind: evResumeFrame}, up, 0, false},
		{"the writer takes the queue", life{state: assocUp}, lifeEvent{kind: evEncoding, on: true}, life{state: assocUp, encoding: true}, 0, true},
		{"nothing is encoded once closed", at(assocClosed), lifeEvent{kind: evEncoding, on: true}, at(assocClosed), 0, false},
	}
	for _, tt := range tests {
		got, eff, ok := tt.from.step(tt.ev)
		if !sameLife(got, tt.want) || eff != tt.eff || ok != tt.ok {
			t.Errorf("%s:\n got  %s %v %v\n want %s %v %v", tt.name, describeLife(got), eff, ok, describeLife(tt.want), tt.eff, tt.ok)
		}
	}
}

func sameLife(a, b life) bool {
	return a.state == b.state && a.upAt.Equal(b.upAt) && a.encoding == b.encoding && a.endCause == b.endCause &&
		fmt.Sprint(a.err) == fmt.Sprint(b.err) && a.mergedInto == b.mergedInto && a.lostAt.Equal(b.lostAt) &&
		a.lostCause == b.lostCause && a.holdQueue == b.holdQueue && a.byeOnAck == b.byeOnAck
}

func describeLife(l life) string {
	return fmt.Sprintf("{%s endCause=%v err=%v merged=%v lost=%v/%v hold=%v byeOnAck=%v enc=%v}",
		l.state, l.endCause, l.err, l.mergedInto != nil, l.lostAt.Sub(lt0), l.lostCause, l.holdQueue, l.byeOnAck, l.encoding)
}

// TestLifeInterleavings runs the orders of events the session core's
// defects came from, as the code meets them, and checks what each step
// asks for.
func TestLifeInterleavings(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	type stepWant struct {
		ev  lifeEvent
		eff effect
		ok  bool
	}
	runs := []struct {
		name  string
		steps []stepWant
		end   assocState
	}{
		{"a peer given up on is told at once, then quarantined with the cause", []stepWant{
			{lifeEvent{kind: evHandshaken, at: lt0}, 0, true},
			{lifeEvent{kind: evGiveUp, cause: causeA}, effMarkEnding | effSayGaveUp, true},
			{lifeEvent{kind: evLinkLost, resumable: true, cause: io.EOF}, 0, false}, // the reader sees the close: not a flap
			{lifeEvent{kind: evEnded, cause: io.EOF}, effWake | effEnd | effPublish | effQuarantine, true},
		}, assocClosed},
		{"a resume racing a close: the leaving winner gets nothing, and nothing is dropped", []stepWant{
			{lifeEvent{kind: evHandshaken, at: lt0}, 0, true},
			{lifeEvent{kind: evLinkLost, at: lt1, resumable: true, cause: io.EOF}, effSuspended, true},
			{lifeEvent{kind: evLostMerge, winner: winnerW, resuming: true, gone: true}, effWake | effHandOver | effHeldLost | effWinnerGone, true},
			{lifeEvent{kind: evEnded, cause: causeB}, 0, false},
		}, assocClosed},
		{"a redial reaching a new incarnation: the old session is replaced, not resumed", []stepWant{
			{lifeEvent{kind: evHandshaken, at: lt0}, 0, true},
			{lifeEvent{kind: evLinkLost, at: lt1, resumable: true, cause: io.EOF}, effSuspended, true},
			{lifeEvent{kind: evEnded, cause: causeB}, effWake | effEnd | effPublish | effQuarantine, true},
			{lifeEvent{kind: evLostMerge, winner: winnerW}, 0, false},
		}, assocClosed},
		{"a flap resumed", []stepWant{
			{lifeEvent{kind: evHandshaken, at: lt0}, 0, true},
			{lifeEvent{kind: evLinkLost, at: lt1, resumable: true, cause: io.EOF}, effSuspended, true},
			{lifeEvent{kind: evGiveUp, cause: causeA}, effCloseHard, false}, // no connection: the window ends it, not a give up
			{lifeEvent{kind: evLostMerge, winner: winnerW, resuming: true}, effWake | effHandOver | effTakeOver, true},
		}, assocClosed},
		{"the connection that resumes", []stepWant{
			{lifeEvent{kind: evTakenOver, at: lt1}, 0, true},
			{lifeEvent{kind: evHandshaken, at: lt1}, 0, true},
			{lifeEvent{kind: evEncoding, on: true}, 0, true},
			{lifeEvent{kind: evResumeFrame}, effWake | effNotify | effResumed, true},
			{lifeEvent{kind: evResumeFrame}, 0, false}, // a second one is malformed
		}, assocUp},
		{"a graceful leave waits for every acknowledgement", []stepWant{
			{lifeEvent{kind: evHandshaken, at: lt0}, 0, true},
			{lifeEvent{kind: evLeave}, effWake | effFailPending | effNotify, true},
			{lifeEvent{kind: evLinkLost, resumable: true}, 0, false}, // a flap while leaving ends it
			{lifeEvent{kind: evByeQueued}, effNotify, true},
			{lifeEvent{kind: evEnded, cause: ErrPeerLeft}, effWake | effEnd, true}, // this node left: nothing published
		}, assocClosed},
		{"given up while leaving: the end is quiet, with the cause", []stepWant{
			{lifeEvent{kind: evHandshaken, at: lt0}, 0, true},
			{lifeEvent{kind: evLeave}, effWake | effFailPending | effNotify, true},
			{lifeEvent{kind: evGiveUp, cause: causeA}, effMarkEnding | effCloseHard, true},
			{lifeEvent{kind: evEnded, cause: io.EOF}, effWake | effEnd, true},
		}, assocClosed},
		{"a simultaneous dial lost while up drains, then ends as retired", []stepWant{
			{lifeEvent{kind: evHandshaken, at: lt0}, 0, true},
			{lifeEvent{kind: evLostMerge, winner: winnerW}, effWake | effRetire, true},
			{lifeEvent{kind: evLeave, now: true}, 0, false},
			{lifeEvent{kind: evGiveUp, cause: causeA}, effMarkEnding | effCloseHard, true},
			{lifeEvent{kind: evEnded, cause: io.EOF}, effWake | effRetiredEnd, true},
		}, assocClosed},
	}
	for _, r := range runs {
		var l life
		for i, s := range r.steps {
			next, eff, ok := l.step(s.ev)
			if eff != s.eff || ok != s.ok {
				t.Errorf("%s, step %d (%s in %s): %v %v, want %v %v", r.name, i, s.ev.kind, l.state, eff, ok, s.eff, s.ok)
			}
			l = next
		}
		if l.state != r.end {
			t.Errorf("%s: ends %s, want %s", r.name, l.state, r.end)
		}
	}
}

// TestLifeInAnyOrder steps every sequence of up to six events (each in
// its variants) from the start, and checks what must hold in every
// order: a closed session stays closed; it closes once, by a step that
// either ends it (everything that waited fails, what it held becomes dead
// letters) or hands it to a winner; a merge happens once; nothing but a
// give up asks for an effect when it does not apply; a given-up session
// ends with why it was given up; and a session that stops taking
// messages wakes whoever waits for room or credit in it.
func TestLifeInAnyOrder(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	var evs []lifeEvent
	for k := range lifeEventCount {
		kind := assocEvent(k)
		switch kind {
		case assocEventCount:
			continue
		case evLostMerge:
			for _, v := range [][2]bool{{false, false}, {true, false}, {false, true}, {true, true}} {
				evs = append(evs, lifeEvent{kind: kind, winner: winnerW, resuming: v[0], gone: v[1]})
			}
		case evEnded:
			evs = append(evs, lifeEvent{kind: kind, cause: io.EOF}, lifeEvent{kind: kind, cause: ErrPeerLeft}, lifeEvent{kind: kind, cause: io.EOF, closing: true})
		case evLeave:
			evs = append(evs, lifeEvent{kind: kind}, lifeEvent{kind: kind, now: true})
		case evLinkLost:
			evs = append(evs, lifeEvent{kind: kind, at: lt1, cause: causeB, resumable: true}, lifeEvent{kind: kind, cause: causeB})
		case evEncoding:
			evs = append(evs, lifeEvent{kind: kind, on: true}, lifeEvent{kind: kind})
		default:
			evs = append(evs, lifeEvent{kind: kind, at: lt0, cause: causeA})
		}
	}
	const depth = 5
	seen := 0
	var walk func(l life, path []assocEvent, closes, merges int)
	walk = func(l life, path []assocEvent, closes, merges int) {
		seen++
		if len(path) == depth {
			return
		}
		for _, ev := range evs {
			next, eff, ok := l.step(ev)
			p := append(path, ev.kind)
			fail := func(format string, args ...any) {
				t.Fatalf("%v: %s", p, fmt.Sprintf(format, args...))
			}
			if l.state == assocClosed && next.state != assocClosed {
				fail("left closed for %s", next.state)
			}
			if !ok && eff != 0 && !(ev.kind == evGiveUp && eff == effCloseHard) {
				fail("did not apply, yet asked for %v", eff)
			}
			c, m := closes, merges
			if l.state != assocClosed && next.state == assocClosed {
				c++
				if eff&(effEnd|effRetiredEnd|effHandOver) == 0 {
					fail("closed without ending or handing over: %v", eff)
				}
			}
			if eff&(effEnd|effRetiredEnd) != 0 && next.state != assocClosed {
				fail("ended, yet %s", next.state)
			}
			if eff&(effRetire|effHandOver) != 0 {
				m++
				if next.mergedInto == nil {
					fail("merged into nothing")
				}
			}
			if c > 1 || m > 1 {
				fail("closed %d times, merged %d times", c, m)
			}
			if eff&effEnd != 0 && l.endCause != nil && !errors.Is(next.err, l.endCause) {
				fail("given up with %v, ended with %v", l.endCause, next.err)
			}
			if eff&effEnd != 0 && next.err == nil {
				fail("ended with no reason")
			}
			if l.state < assocLeaving && next.state >= assocLeaving && eff&effWake == 0 {
				fail("%s to %s without waking the senders: %v", l.state, next.state, eff)
			}
			if eff&effRetire != 0 && eff&effHandOver != 0 {
				fail("retired and handed over at once")
			}
			walk(next, p, c, m)
		}
	}
	walk(life{}, nil, 0, 0)
	t.Logf("walked %d lives", seen)
	if seen < 100000 {
		t.Fatalf("walked %d lives", seen)
	}
}
