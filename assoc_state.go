package troupe

// An association's life as a pure state machine: its states, the events
// that move it, and what ending it must do. Nothing here reads a clock,
// takes a lock or does I/O; the code that applies a transition (assoc.go,
// handshake.go, detector.go) does the I/O, outside the peer-table lock.
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
	evHandshaken assocEvent = iota // the handshake completed and the peer was accepted
	evLostMerge                    // another association with the same peer won a simultaneous dial
	evLeave                        // this node is closing
	evGiveUp                       // this node gave up: the peer is silent, confirms nothing, or a write failed
	evEnded                        // the session is over: the reader or the dialer stopped, or the node closed it
	evLinkLost                     // the connection of a resumable session broke without a goodbye
	assocEventCount
)

var assocEventNames = [...]string{"handshaken", "lost merge", "leave", "give up", "ended", "link lost"}

func (e assocEvent) String() string { return assocEventNames[e] }

// step is the transition function: the state an event moves s to, and
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
func step(s assocState, ev assocEvent) (assocState, bool) {
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

// chooseDuplicate decides which of two connections with one peer
// incarnation stays. Both nodes decide alike without a word:
//
//   - Dialed one by each node (a simultaneous dial): the one dialed by the
//     node with the lower uid wins.
//   - Both dialed by the same node, seen by it or by the node it dialed:
//     the fresh one wins. The dialer dialed again (its old connection is
//     gone for it), or dialed another of this node's addresses not
//     knowing where it led (a registrar's address that this node took
//     over); either way the node it dialed keeps the fresh one, and so
//     must the dialer, or each would retire the connection the other
//     kept and neither would carry the session.
func chooseDuplicate(freshOutbound, heldOutbound bool, self, peer NodeUID) mergeVerdict {
	switch {
	case freshOutbound == heldOutbound:
		return keepFresh
	case freshOutbound == (string(self[:]) < string(peer[:])):
		return keepFresh // fresh was dialed by the lower uid
	case !freshOutbound:
		return refuseFresh
	}
	return keepHeld
}
