package troupe

import (
	"errors"
	"time"
)

// An association's life as a pure state machine: its states, the events
// that move it, and what ending it must do. Nothing here reads a clock,
// takes a lock or does I/O: life.step returns the next state and the
// effects, and transition (assoc_transition.go) carries them out.
//
//	connecting ──handshaken──▶ up ──leave──▶ leaving ──ended──▶ closed
//	    │                      │ ╲──give up──▶ ending ──ended──▶ closed
//	    │                      │ ╲──link lost──▶ suspended ──resumed (lost merge)──▶ closed
//	    │                      ╰──lost merge──▶ retiring ──ended──▶ closed
//	    ╰──lost merge, leave or ended──▶ closed
//
// A suspended session lost its connection without a goodbye; a new
// connection to the same incarnation resumes it by taking it over, as the
// winner of a merge does.
//
// Dialing and the handshake are one state: until the peer is accepted,
// nothing but the dialer and the acceptor's handshake touch it.

// assocState is where an association is in its life.
type assocState uint8

// The states, in the order of a life: a state at or past assocLeaving
// accepts nothing new to send.
const (
	assocConnecting assocState = iota // dialing, or in the handshake
	assocUp                           // the peer was accepted: frames flow both ways
	assocSuspended                    // the connection broke without a goodbye: sends queue up while a new connection is sought (resumable sessions only)
	assocEnding                       // this node gave up on the session (endCause says why): its connection is closed, and the reader ends it after the last frame it read
	assocLeaving                      // this node is closing: the queue drains, then a bye
	assocRetiring                     // lost a simultaneous dial while up: merged into the winner (mergedInto); drains what it holds and a duplicate-bye
	assocClosed                       // ended; err says why
	assocStateCount
)

var assocStateNames = [...]string{
	assocConnecting: "connecting", assocUp: "up", assocSuspended: "suspended", assocEnding: "ending", assocLeaving: "leaving",
	assocRetiring: "retiring", assocClosed: "closed",
}

func (s assocState) String() string { return assocStateNames[s] }

// assocEvent is what happens to an association.
type assocEvent uint8

const (
	evHandshaken    assocEvent = iota // the handshake completed and the peer was accepted
	evLostMerge                       // another association with the same peer won a simultaneous dial
	evLeave                           // this node is closing
	evGiveUp                          // this node gave up: the peer is silent, confirms nothing, or a write failed
	evEnded                           // the session is over: the reader or the dialer stopped, or the node closed it
	evLinkLost                        // the connection of a resumable session broke without a goodbye
	assocEventCount                   // (the events above move the state; those below only what it carries)
	evTakenOver                       // this new connection took a suspended session over: it holds its queue for the peer's resume frame
	evResumeFrame                     // the peer's resume frame arrived: the queue goes again
	evByeQueued                       // a leaving session's writer queued its goodbye, the peer having confirmed everything
	evQuarantined                     // the end quarantined the peer: the reason the session ended says so
	evEncoding                        // the writer took the queue (on), or encodes it itself (off)
	lifeEventCount
)

var assocEventNames = [...]string{"handshaken", "lost merge", "leave", "give up", "ended", "link lost", "",
	"taken over", "resume frame", "bye queued", "quarantined", "encoding"}

func (e assocEvent) String() string { return assocEventNames[e] }

// nextState is the table of states: the state an event moves s to, and
// false when the event does not apply in s (it came too late, or the
// session is past it), in which case nothing is to be done.
//
// A lost merge retires an association that is up (it drains over its own
// connection, so nothing in flight is lost); one that has no connection
// to drain (connecting, suspended), or one that is already being closed
// (leaving), ends at once and hands its queue to the winner. For a
// suspended session that is the resume: the winner is the new connection
// to the same incarnation, and it also takes over the sequence numbers
// and what the peer has not yet confirmed. Giving up while leaving
// or retiring keeps the state: the cause is recorded, and the end comes
// from the reader as for an ending session.
func nextState(s assocState, ev assocEvent) (assocState, bool) {
	switch ev {
	case evHandshaken:
		if s == assocConnecting {
			return assocUp, true
		}
	case evLostMerge:
		switch s {
		case assocConnecting, assocLeaving, assocSuspended:
			return assocClosed, true
		case assocUp, assocEnding:
			return assocRetiring, true
		}
	case evLeave:
		switch s {
		case assocConnecting, assocSuspended:
			return assocClosed, true
		case assocUp, assocEnding:
			return assocLeaving, true
		}
	case evGiveUp:
		switch s {
		case assocUp:
			return assocEnding, true
		case assocEnding, assocLeaving, assocRetiring:
			return s, true
		}
	case evEnded:
		if s != assocClosed {
			return assocClosed, true
		}
	case evLinkLost:
		if s == assocUp {
			return assocSuspended, true
		}
	}
	return s, false
}

// life is an association's state: where it is in its life and what
// that state carries, in one value (the association holds it under mu).
// Only step moves it; transition (assoc_transition.go) stores what step
// returns and carries out its effects.
type life struct {
	state assocState
	upAt  time.Time // when the handshake completed
	// encoding: the writer has taken the queue, so senders encode into
	// out on their own goroutines (before that, and while the writer
	// encodes what was queued, they queue records).
	encoding bool
	// endCause is why this node gave up on the session (ending, or a
	// give up while leaving or retiring): the session ends with it.
	endCause error
	// err is why the session ended (closed).
	err error
	// mergedInto is the association that won a simultaneous dial over
	// this one, or took over this suspended session: sends go there.
	mergedInto *assoc
	// lostAt and lostCause: when and why a suspended session's
	// connection broke; lostAt stays with the connection that resumes it.
	lostAt    time.Time
	lostCause error
	// holdQueue: this connection resumes a session, and what it holds
	// waits for the peer's resume frame to say what to send again.
	holdQueue bool
	// byeOnAck: a graceful leave waits, before its bye, until the queue
	// is written and the peer acknowledged every tell in it.
	byeOnAck bool
}

// lifeEvent is an event with what step needs to know of it, gathered by
// the code that saw it happen.
type lifeEvent struct {
	kind assocEvent
	at   time.Time // handshaken, link lost, taken over: when
	// cause: why (give up, ended, link lost, quarantined).
	cause error
	// now: a leave that drops what was queued; the bye goes at once.
	now bool
	// closing: this node is closing, or the session ends quietly
	// (an observer's), whatever the cause says (ended).
	closing bool
	// resumable: the session may be suspended on a link loss (both sides
	// sequence their frames, and this node is not flushing).
	resumable bool
	// Of a lost merge: the winner, whether it has ended or is leaving
	// (gone), and whether it is the connection that resumes this
	// suspended session (resuming).
	winner         *assoc
	gone, resuming bool
	on             bool // encoding: on or off
}

// effect is what a transition asks the association to do, as a set.
type effect uint32

const (
	// wake the senders and the Sends waiting for credit: nothing more is
	// accepted, or they follow mergedInto to the winner.
	effWake effect = 1 << iota
	// notify the writer: it has work (a bye to write, frames to resend).
	effNotify
	// failPending: the pending asks fail now (this node leaves).
	effFailPending
	// dropQueued: what was queued and encoded becomes dead letters, and
	// a bye takes its place (a leave now).
	effDropQueued
	// sayGaveUp: the writer tells the peer this node gave up on it, within
	// byeGrace (the peer learns at once if the link carries it).
	effSayGaveUp
	// closeHard: reset the connection (given up on, with no goodbye to say).
	effCloseHard
	// markEnding: record when this node gave up (the heartbeat loop
	// resets the connection byeGrace after it).
	effMarkEnding
	// endAsClosing: a leave of a session that never came up (or whose
	// link is down) is an end, as the node closing.
	effEndAsClosing
	// retire: the loser of a merge that is up queues a duplicate-bye and
	// drains over its own connection; what waits on it moves to the winner.
	effRetire
	// handOver: the loser of a merge that has no connection to drain
	// hands the winner its queue and what waits on it, and ends.
	effHandOver
	// takeOver: the winner resumes this suspended session: the sequence
	// state, tables and held frames move to it too.
	effTakeOver
	// heldLost: what the loser encoded for its own tables cannot move:
	// dead letters (unconfirmed where written).
	effHeldLost
	// winnerGone: the winner has ended too: what would have moved fails.
	effWinnerGone
	// end: the connection closes, the session leaves the tables, and
	// everything that waits on it fails.
	effEnd
	// retiredEnd: a retired duplicate ends: only what it had not written
	// or the peer had not confirmed is reported.
	effRetiredEnd
	// publish PeerUnreachable.
	effPublish
	// quarantine the peer incarnation, unless it is exempt (a cluster
	// member or a registrar).
	effQuarantine
	// suspended: publish PeerLinkLost and seek a new connection.
	effSuspended
	// resumed: publish PeerResumed.
	effResumed
)

// step is the transition function of a session: the life an event moves
// l to, what that asks the association to do, and false when the event
// does not apply (it came too late, or the session is past it). Nothing
// here reads a clock, takes a lock or does I/O.
func (l life) step(ev lifeEvent) (life, effect, bool) {
	switch ev.kind {
	case evTakenOver:
		l.holdQueue, l.lostAt = true, ev.at
		return l, 0, true
	case evResumeFrame:
		if !l.holdQueue {
			return l, 0, false // a resume frame on a session that was not resumed
		}
		l.holdQueue = false
		return l, effWake | effNotify | effResumed, true // what the peer confirmed made room
	case evByeQueued:
		if !l.byeOnAck {
			return l, 0, false
		}
		l.byeOnAck = false
		return l, effNotify, true
	case evQuarantined:
		if l.state != assocClosed {
			return l, 0, false
		}
		l.err = ev.cause
		return l, 0, true
	case evEncoding:
		if ev.on && l.state == assocClosed {
			return l, 0, false // nothing is sent any more
		}
		l.encoding = ev.on
		return l, 0, true
	case evLinkLost:
		if !ev.resumable || l.endCause != nil || l.mergedInto != nil {
			return l, 0, false // not suspended: it ends
		}
	}
	from := l.state
	next, ok := nextState(from, ev.kind)
	if !ok {
		if ev.kind == evGiveUp {
			return l, effCloseHard, false // not up: nothing to say goodbye on
		}
		return l, 0, false
	}
	l.state = next
	switch ev.kind {
	case evHandshaken:
		l.upAt = ev.at
		return l, 0, true
	case evGiveUp:
		var eff effect
		if l.endCause == nil {
			l.endCause = ev.cause
			eff |= effMarkEnding
		}
		if next == assocEnding {
			return l, eff | effSayGaveUp, true
		}
		return l, eff | effCloseHard, true
	case evLeave:
		if next == assocClosed {
			l.state = from // the end moves it, as the node closing
			return l, effEndAsClosing, true
		}
		if ev.now {
			return l, effWake | effFailPending | effDropQueued | effNotify, true
		}
		l.byeOnAck = true // the writer says bye once the peer confirmed all
		return l, effWake | effFailPending | effNotify, true
	case evLostMerge:
		return l.lostMerge(from, ev)
	case evEnded:
		return l.ended(from, ev)
	case evLinkLost:
		l.lostAt, l.lostCause = ev.at, ev.cause
		return l, effSuspended, true
	}
	return l, 0, true
}

// lostMerge is step's lost merge: l retires into the winner if it is up,
// or hands its work over and ends; if the winner is gone, what would move
// fails instead.
func (l life) lostMerge(from assocState, ev lifeEvent) (life, effect, bool) {
	l.mergedInto = ev.winner
	eff := effWake // the senders follow mergedInto
	if l.state == assocRetiring {
		eff |= effRetire
	} else {
		eff |= effHandOver
		switch {
		case from == assocSuspended && ev.resuming && !ev.gone:
			eff |= effTakeOver // the new connection to the same incarnation
		default:
			eff |= effHeldLost // encoded for tables the winner does not have
		}
	}
	if ev.gone {
		eff |= effWinnerGone
	}
	return l, eff, true
}

// ended is step's end: why the session ended, and whether the peer's
// loss is published and the peer quarantined (endingOf).
func (l life) ended(from assocState, ev lifeEvent) (life, effect, bool) {
	err := ev.cause
	if l.endCause != nil {
		err = l.endCause
	}
	// A session the peer replaced with a new one, or refused, is no
	// failure: nothing is published or quarantined.
	closing := ev.closing || errors.Is(err, ErrNodeClosed) || errors.Is(err, errSessionReplaced)
	end := endingOf(from, errors.Is(err, ErrPeerLeft), closing, false)
	// Whatever waits for room or credit wakes: the session takes nothing
	// more (the wait ends with the session's failure).
	if end.retired {
		return l, effWake | effRetiredEnd, true
	}
	l.err = err
	if end.publish && !errors.Is(err, ErrPeerLeft) {
		// Unreachable: what wakes now reads it so, before any quarantine
		// is recorded, and whether or not the peer is exempt from one.
		l.err = &unreachableError{cause: err}
	}
	eff := effWake | effEnd
	if end.publish {
		eff |= effPublish
	}
	if end.quarantine {
		eff |= effQuarantine
	}
	return l, eff, true
}

// ending is what ending a session does besides closing its connection
// and failing what waits on it.
type ending struct {
	// retired: a merged duplicate. Its work moved to the winner; only
	// the messages the peer never confirmed are reported.
	retired bool
	// publish PeerUnreachable: the session was up, and neither this node
	// nor the peer closed it.
	publish bool
	// quarantine the peer incarnation: published, and not a goodbye, and
	// not a peer exempt from quarantine (a cluster member or a registrar).
	quarantine bool
}

// endingOf decides how a session in state from ends. peerLeft: the peer
// said goodbye. closing: this node is closing. exempt: the peer is never
// quarantined.
func endingOf(from assocState, peerLeft, closing, exempt bool) ending {
	if from == assocRetiring {
		return ending{retired: true}
	}
	wasUp := from == assocUp || from == assocSuspended || from == assocEnding || from == assocLeaving
	closing = closing || from == assocLeaving
	publish := wasUp && !closing
	return ending{publish: publish, quarantine: publish && !peerLeft && !exempt}
}

// mergeVerdict says which of two associations with the same peer
// incarnation stays: the one being accepted (fresh) or the one already
// there (held).
type mergeVerdict uint8

const (
	keepFresh   mergeVerdict = iota // the fresh one wins; the held one retires into it
	keepHeld                        // the held one wins; the fresh one retires into it
	refuseFresh                     // the held one wins; the fresh connection is refused (the peer dialed it and retires its own end)
)

// dialOf is who dialed one of two connections with a peer, for
// chooseDuplicate: this node (outbound) or the peer, and the dial's number
// (hello extension 5): 0 when the peer does not number or order dials.
type dialOf struct {
	outbound bool
	num      uint64
}

// chooseDuplicate decides which of two connections with one peer
// incarnation stays. Both nodes decide alike without a word, whatever
// order each attached them in:
//
//   - Dialed one by each node (a simultaneous dial): the one dialed by the
//     node with the lower uid wins.
//   - Both dialed by the same node: the one with the higher dial number
//     wins, its later dial. The dialer dialed again (its old connection
//     is gone for it), or dialed another of the peer's addresses not
//     knowing where it led (a registrar's address that the peer took
//     over), or two of its dials to the peer crossed: the two sides may
//     have attached them in either order, and the numbers give both the
//     same one. A lower fresh one is refused when the peer dialed it (it
//     is not up yet there), retired when this node did.
//   - Both dialed by the same node of a release before dial numbers: the
//     fresh one wins, in the order this node attached them (two such
//     dials at the same moment may still cross).
func chooseDuplicate(fresh, held dialOf, self, peer NodeUID) mergeVerdict {
	switch {
	case fresh.outbound == held.outbound && (fresh.num == 0 || held.num == 0):
		return keepFresh
	case fresh.outbound == held.outbound && fresh.num > held.num:
		return keepFresh
	case fresh.outbound == held.outbound && fresh.outbound:
		return keepHeld
	case fresh.outbound == held.outbound:
		return refuseFresh
	case fresh.outbound == (string(self[:]) < string(peer[:])):
		return keepFresh // fresh was dialed by the lower uid
	case !fresh.outbound:
		return refuseFresh
	}
	return keepHeld
}
