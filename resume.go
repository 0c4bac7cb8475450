package troupe

import (
	"errors"
	"fmt"
	"time"
)

// A link flap: a resumable session whose connection broke without a
// goodbye is suspended, not ended. Sends to the peer queue up; the side
// that dialed dials again at once and keeps trying; the same incarnation
// answering resumes the session, and each side sends again what the other
// had not confirmed, so every sequenced frame arrives once and in order.
// A refusal or a new incarnation ends the session at once; silence past
// Config.UnreachableAfter ends it as it ends a session that stays up.

// Bounds of the dialer's retries after a flap: the first is immediate,
// then the wait doubles from redialMin, capped at redialMax, until
// UnreachableAfter has passed since the peer was last heard.
const (
	redialMin = 10 * time.Millisecond
	redialMax = 250 * time.Millisecond
)

// lost is how the reader ends on a broken connection: a resumable session
// that was up is suspended; anything else ends.
func (a *assoc) lost(err error) {
	a.mu.Lock()
	ev := lifeEvent{kind: evLinkLost, cause: err, resumable: a.peer.resumable && !a.n.lc.flushBegun()}
	_, _, resumable := a.life.step(ev) // (a question: nothing moves yet)
	conn := a.conn
	a.mu.Unlock()
	if !resumable {
		a.fail(err)
		return
	}
	// The writer exits first, so that what it held is either written and
	// unconfirmed (sent again on resume) or back in the queue.
	conn.Close()
	a.stopOnce.Do(func() { close(a.stop) })
	<-a.writerDone
	ev.at = time.Now()
	if !a.transition(ev) {
		a.fail(err)
	}
}

// suspended carries out a suspension: the session waits for a new
// connection, which the dialer seeks.
func (a *assoc) suspended() {
	a.mu.Lock()
	err := a.life.lostCause
	a.mu.Unlock()
	a.n.log.Info("troupe: connection to peer lost; resuming", "peer", a.label(), "cause", err)
	a.n.totals.linksLost.Add(1)
	a.n.events.emit(PeerLinkLost{Addr: a.addr(), UID: a.peer.uid, Name: a.peer.name, Cause: err})
	if a.outbound {
		a.n.wg.Go(a.redial)
		return
	}
	// The acceptor waits for the dialer's new connection; the heartbeat
	// loop ends the wait after UnreachableAfter. Meanwhile it asks the
	// dialer's proven address, if it has one, who answers there.
	a.n.peers.mu.Lock()
	var back Addr
	if len(a.tab.proven) > 0 {
		back = a.tab.proven[0]
	}
	a.n.peers.mu.Unlock()
	if !back.IsZero() {
		a.n.wg.Go(func() { a.watchBack(back) })
	}
}

// watchBack follows a suspended session on the side that was dialed: it
// cannot dial the session back, but it can ask the peer's proven address
// who answers there, without associating. A refusal, or another
// incarnation, means the peer is gone: the session ends at once (a killed
// process is seen in milliseconds by both sides). The same incarnation
// means it is alive and will dial back; the window decides if it does not.
func (a *assoc) watchBack(addr Addr) {
	a.whileSuspended(func(cause error, silent bool) bool {
		if silent {
			return true // the heartbeat loop's to end it
		}
		uid, err := a.n.peers.probeAt(addr)
		switch {
		case err != nil && isRefused(err):
			a.fail(fmt.Errorf("%v, and %s now refuses connections", cause, addr))
			return true
		case uid != (NodeUID{}) && uid != a.peer.uid:
			a.fail(fmt.Errorf("%v, and another incarnation answers at %s", cause, addr))
			return true
		}
		return false
	})
}

// whileSuspended calls try at once, then after a wait that doubles from
// redialMin up to redialMax, for as long as the session stays suspended
// and the node open, until try says it is done. try is told why the
// connection broke, and whether the peer has been silent for
// UnreachableAfter.
func (a *assoc) whileSuspended(try func(cause error, silent bool) (done bool)) {
	n := a.n
	var wait time.Duration
	for {
		if wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-n.lc.flushing: // (a flap during a drain resumes)
				t.Stop()
				return
			case <-t.C:
			}
		}
		wait = min(max(2*wait, redialMin), redialMax)
		a.mu.Lock()
		suspended, cause := a.life.state == assocSuspended, a.life.lostCause
		a.mu.Unlock()
		if !suspended || try(cause, time.Since(a.silentSince()) >= n.cfg.UnreachableAfter) {
			return
		}
	}
}

// silentSince is when the peer was last heard, or the session came up.
func (a *assoc) silentSince() time.Time {
	a.mu.Lock()
	since := a.life.upAt
	a.mu.Unlock()
	if h := a.lastHeard(); h.After(since) {
		since = h
	}
	return since
}

// redial dials a suspended session's peer again until the session is
// resumed, or it is clear that it cannot be.
func (a *assoc) redial() {
	n := a.n
	a.whileSuspended(func(cause error, silent bool) bool {
		if silent {
			a.fail(fmt.Errorf("%v, and no new connection within %v", cause, n.cfg.UnreachableAfter))
			return true
		}
		n.peers.mu.Lock()
		held := n.peers.byUID[a.peer.uid]
		n.peers.mu.Unlock()
		switch {
		case held == nil:
			// Out of the table for a moment (a duplicate's winner not yet
			// attached): the peer would have no session here to resume
			// into. Wait; the window decides if it stays so.
			return false
		case held != a:
			// Another session with the peer took this one's place: the
			// peer, asked to resume, would resume that one, whose state
			// this connection would not carry. This one ends quietly (no
			// quarantine: the peer is there, in the other session).
			a.fail(fmt.Errorf("%w: %v, and another session with the peer took its place", errSessionReplaced, cause))
			return true
		}
		c, err := n.peers.dial(a.dialAddr)
		if err != nil {
			if isRefused(err) {
				a.fail(fmt.Errorf("%v, and %s now refuses connections", cause, a.dialAddr))
				return true
			}
			return false
		}
		fresh := newAssoc(n, true, a.dialAddr)
		fresh.resumeOf = a
		fresh.dialOnce.Do(func() {}) // it never dials by itself
		n.peers.mu.Lock()
		if n.peers.closing {
			n.peers.mu.Unlock()
			c.Close()
			return true
		}
		n.peers.all[fresh] = struct{}{}
		n.peers.outbound++
		n.peers.mu.Unlock()
		fresh.runDialed(c) // on success, reads until that session ends
		a.mu.Lock()
		suspended := a.life.state == assocSuspended
		a.mu.Unlock()
		if !suspended {
			return true // resumed, or ended
		}
		if err := fresh.failure(); errors.Is(err, ErrRejected) {
			a.fail(fmt.Errorf("%v, and the peer refused the new connection: %w", cause, err))
			return true
		}
		return false
	})
}

// takeOver moves a suspended session's sequence state into w, the new
// connection that resumes it, before w's reader and writer start: what
// this side received (for w's resume frame and acknowledgements) and what
// the peer had not confirmed (sent again once the peer's resume frame says
// where to start). w holds its queue until then. Both are locked.
func (a *assoc) takeOver(w *assoc, moved recQueue) {
	w.win.unacked, w.win.acked = a.win.unacked.take(), a.win.acked
	// The session's counts go on (Stats, /metrics): what the old
	// connections carried, beside what w's will.
	w.traffic.bytesOutBase, w.traffic.tellsOutBase = a.traffic.bytesOutBase+a.traffic.written.Load(), a.traffic.tellsOutBase+a.traffic.tellsOut.Load()
	w.traffic.bytesInBase = a.traffic.bytesInBase
	if a.in != nil {
		w.traffic.bytesInBase += a.in.bytes.Load()
	}
	// What a encoded refers to a's tables, which the peer keeps for the
	// session: w goes on with them, and its reader with a's in tables.
	// (w encodes nothing before its writer starts.)
	w.out = a.out.take()
	w.enc.types, w.enc.targets, w.enc.targetKeys, w.enc.typeList = a.enc.types, a.enc.targets, a.enc.targetKeys, a.enc.typeList
	w.rd.inTypes, w.rd.inTargets, w.rd.inShapes, w.rd.shapeBytes = a.rd.inTypes, a.rd.inTargets, a.rd.inShapes, a.rd.shapeBytes
	w.peerDraining, w.rd.incompatLogged = a.peerDraining, a.rd.incompatLogged
	if w.peerToken == nil {
		w.peerToken = a.peerToken // the session's, until w's token frame
	}
	// Credit goes on with the tables: what the peer granted, and the
	// accounts of what this side granted, which now answer to w.
	w.enc.peerMailbox, w.enc.sent, w.enc.granted = a.enc.peerMailbox, a.enc.sent, a.enc.granted
	a.moveCredit(w)
	// The resume frame acknowledges everything received: an acknowledgement
	// of less (a count the old reader had not yet handed on) must not
	// follow it.
	w.rd.rcvTells, w.rd.ackQueued, w.wr.ackSent = a.rd.rcvTells, a.rd.rcvTells, a.rd.rcvTells
	w.ackTo.Store(a.rd.rcvTells)
	w.open.resumeRcv, w.open.resume = a.rd.rcvTells, true
	w.stepLocked(lifeEvent{kind: evTakenOver, at: a.life.lostAt}, &taken{}) // (no effects)
	w.win.ackMoved = time.Now()                                             // the peer's acknowledgements may move again from now
	// What waited here goes before anything sent to w meanwhile.
	moved.appendQueue(w.takeQueue())
	w.queue = moved
}

// onResume acts on the peer's resume frame: it releases what the peer
// confirmed, and queues the rest to be sent again, in order, ahead of
// everything else.
func (a *assoc) onResume(b []byte) error {
	count, err := parseResume(b)
	if err != nil {
		return err
	}
	a.mu.Lock()
	if !a.life.holdQueue {
		a.mu.Unlock()
		return fmt.Errorf("%w: resume on a session that was not resumed", ErrMalformed)
	}
	if count < a.win.acked || count-a.win.acked > uint64(a.unackedSeq()) {
		a.mu.Unlock()
		return fmt.Errorf("%w: resume after %d frames, %d were sent", ErrMalformed, count, a.win.acked+uint64(a.unackedSeq()))
	}
	a.release(int(count - a.win.acked))
	resend := a.unackedSeq()
	rest := a.win.unacked.take()
	rest.appendChain(a.out.take())
	a.out = rest
	a.win.acked = count
	var tk taken
	eff, _ := a.stepLocked(lifeEvent{kind: evResumeFrame}, &tk)
	tk.resent, tk.down = resend, a.life.upAt.Sub(a.life.lostAt)
	a.mu.Unlock()
	a.carryOut(eff, &tk)
	return nil
}
