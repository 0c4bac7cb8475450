package troupe

import (
	"errors"
	"net"
	"time"
)

// How a session ends: leaving with a goodbye, failing, giving up on a
// peer (a goodbye, then a reset so the kernel keeps nothing the peer never
// read), and what was queued or unacknowledged becoming dead letters.
// assoc_state.go decides what an end means; this carries it out.

// byeGrace bounds the goodbye this node writes to a peer it gave up on:
// a link that carries it carries it at once.
const byeGrace = 100 * time.Millisecond

// sayGaveUp writes the goodbye that tells the peer this node gave up on
// it (and why), then ends this node's half of the stream; the reader ends
// the session once the peer closes its half. A peer that reads gets the
// goodbye and closes at once. One that does not read would keep the
// connection open in the kernel, its unread bytes held behind a FIN that
// cannot go: byeGrace after the abort, the heartbeat loop closes it with
// a reset (closeLate).
func (a *assoc) sayGaveUp(cause error) {
	text := ""
	if cause != nil {
		text = cause.Error()
		if len(text) > maxByeText {
			text = text[:maxByeText]
		}
	}
	if _, err := a.conn.Write(appendWhole(nil, appendBye(nil, byeGaveUp, text))); err != nil {
		closeHard(a.conn) // the goodbye cannot reach the peer
		return
	}
	if tc, ok := rawConn(a.conn).(*net.TCPConn); ok {
		tc.CloseWrite()
		return
	}
	a.conn.Close()
}

// rawConn is the network connection under c (a TLS connection's).
func rawConn(c net.Conn) net.Conn {
	if w, ok := c.(interface{ NetConn() net.Conn }); ok {
		return w.NetConn()
	}
	return c
}

// closeHard closes c with a reset rather than a FIN: what this node wrote
// and the peer never read is thrown away at once. Closed the ordinary way,
// a connection whose peer stopped reading outlives its close in the
// kernel, holding its unsent bytes behind a FIN that cannot go, and the
// peer's writes can block for minutes on a window that never opens. It is
// for a session this node gave up on; a peer that reads has had its
// goodbye by then.
func closeHard(c net.Conn) {
	raw := rawConn(c)
	if tc, ok := raw.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
	raw.Close() // (for TLS: no close_notify to a peer that does not read)
	if raw != c {
		c.Close()
	}
}

// abort ends an up session from a goroutine other than its reader: it
// records why, and has the writer tell the peer that this node gave up
// on it (a link that still carries bytes carries that at once) and close
// the connection; the reader ends the session after its last delivery.
// The goodbye gets byeGrace: a writer stuck on a peer that does not read
// is cut off by then.
func (a *assoc) abort(cause error) {
	a.mu.Lock()
	next, ok := step(a.state, evGiveUp)
	if ok {
		a.state = next
		if a.endCause == nil {
			a.endCause = cause
			a.endingAt.Store(time.Now().UnixNano())
		}
	}
	conn := a.conn
	sayBye := ok && next == assocEnding && conn != nil
	if sayBye {
		conn.SetWriteDeadline(time.Now().Add(byeGrace))
	}
	a.mu.Unlock()
	if conn == nil {
		return
	}
	if !sayBye {
		closeHard(conn) // no goodbye to say (the session was not up): what waits for the peer goes
		return
	}
	a.notify()
	select {
	case <-a.writerDone:
		closeHard(conn) // no writer to say it
	default:
	}
}

// unwritten is the dead-letter reason of a message this session's
// connection broke before it was written.
func (a *assoc) unwritten() error {
	if err := a.failure(); err != nil {
		return err
	}
	return &sessionError{peer: a.label(), cause: errors.New("the connection broke before the message was written")}
}

// deadLetters publishes a dead letter for every message in q.
func (a *assoc) deadLetters(q recQueue, err error) {
	q.each(func(r *outRec) {
		if r.h != nil {
			a.n.deadLetter(r.h.String(), r.msg, err)
		}
	})
}

// deadLettersOf publishes a dead letter for every tell frame in c, which
// this session encoded: its message is decoded again (an equal value,
// not the one sent). unconfirmed: the frames were written, and the peer
// may have received them.
func (a *assoc) deadLettersOf(c *frameChain, err error, unconfirmed bool) {
	if c.tells == 0 {
		return
	}
	c.each(func(f []byte) bool {
		body := f[frameBodyAt(f):]
		fields := body[1:]
		switch frameKind(body[0]) {
		case frameTell:
		case frameTellHeaders:
			_, fields, _ = parseHeaders(fields)
		default:
			return true
		}
		target, msg := a.decodeHeld(fields)
		if unconfirmed {
			a.n.deadLetterUnconfirmed(target, msg, err)
		} else {
			a.n.deadLetter(target, msg, err)
		}
		return true
	})
}

// decodeHeld reads back a tell frame's body that this session encoded:
// the target's ref string and the message.
func (a *assoc) decodeHeld(b []byte) (string, any) {
	var th tellHeader
	payload, err := parseTell(b, &th)
	if err != nil {
		return "", nil
	}
	path := th.path
	if !th.targetInline && th.target > 0 && th.target <= uint64(len(a.outTargetKeys)) {
		path = a.outTargetKeys[th.target-1].path
	}
	target := FormatRef(a.addr(), path)
	var mt *msgType
	switch {
	case th.typInline:
		mt = typeByKey(th.key)
	case th.typ > 0 && th.typ <= uint64(len(a.outTypeList)):
		mt = a.outTypeList[th.typ-1]
	}
	if mt == nil {
		return target, nil
	}
	d := decoder{binder: heldBinder{a}}
	msg, err := d.payload(mt, payload)
	if err != nil {
		return target, nil
	}
	return target, msg
}

// heldBinder binds the refs of a payload this node encoded for the peer,
// read back: sender and receiver swap places (the sender's actors are
// this node's, the receiver's the peer's).
type heldBinder struct{ a *assoc }

func (b heldBinder) bindRef(kind byte, key refKey, addr string) *handle {
	switch kind {
	case refSender:
		kind = refReceiver
	case refReceiver:
		kind = refSender
	}
	return b.a.bindRefFrom(kind, key, addr, NodeUID{}) // refs this node sent: nobody's to be charged
}

// leave queues a bye: the peer learns this node is closing. Nothing more is
// accepted for sending. With now, what was queued is dropped (as dead
// letters) and the bye goes in its place; otherwise it follows the queue.
func (a *assoc) leave(now bool) {
	a.mu.Lock()
	next, ok := step(a.state, evLeave)
	if !ok || a.mergedInto != nil {
		a.mu.Unlock()
		return
	}
	if next == assocClosed {
		// Never came up: nothing to say goodbye on.
		a.mu.Unlock()
		a.fail(ErrNodeClosed)
		return
	}
	a.state = next
	a.wakeSenders() // nothing more is accepted
	a.wakeCredited()
	var dropped recQueue
	var droppedOut frameChain
	if now {
		dropped, droppedOut = a.takeQueue(), a.out.take()
		a.pushControl(appendBye(nil, byeLeaving, ""))
	} else {
		a.byeOnAck = true // the writer says bye once the peer confirmed all
	}
	pend := a.pending
	a.pending = map[pendingAsk]struct{}{}
	a.mu.Unlock()
	for p := range pend {
		p.fail(ErrNodeClosed)
	}
	a.deadLettersOf(&droppedOut, ErrNodeClosed, false)
	a.deadLetters(dropped, ErrNodeClosed)
	a.notify()
}

// takeHeld empties what the session holds for the peer (mu held): the
// frames written and not acknowledged, those encoded and not written,
// and the records not yet encoded. Their blocks are left to the garbage
// collector, not recycled: the writer may still be writing them.
func (a *assoc) takeHeld() (unacked, out frameChain, queue recQueue) {
	unacked, out, queue = a.unacked.take(), a.out.take(), a.takeQueue()
	return
}

// fail ends the session with err: queued messages become dead letters,
// pending asks and resolves fail, and every local watcher of an actor on
// the peer gets Terminated. A session that was up and did not end by a
// goodbye from either side (the peer went silent, its connection broke, or
// it sent something malformed) quarantines the peer.
func (a *assoc) fail(err error) {
	a.mu.Lock()
	from := a.state
	if _, ok := step(from, evEnded); !ok {
		a.mu.Unlock()
		return
	}
	a.state = assocClosed
	a.wakeSenders()
	a.wakeCredited()
	if a.endCause != nil {
		err = a.endCause
	}
	conn := a.conn
	closing := errors.Is(err, ErrNodeClosed)
	select {
	case <-a.n.done:
		closing = true
	default:
	}
	peerLeft := errors.Is(err, ErrPeerLeft)
	// A session the peer replaced with a new one, or refused, is no
	// failure: nothing is published or quarantined.
	closing = closing || errors.Is(err, errSessionReplaced)
	// An observer's session ends quietly, whatever ended it, on both ends:
	// the observer does not quarantine what it inspects either (it dials
	// again on its next call).
	observer := a.observer
	closing = closing || observer || a.n.cfg.Observer
	end := endingOf(from, peerLeft, closing, false)
	if end.retired {
		// A retired duplicate: its work moved to the winner already, but
		// for what it had not written or the peer had not confirmed.
		unacked, out, queue := a.takeHeld()
		a.mu.Unlock()
		unwritten := &sessionError{peer: a.label(), cause: errors.New("duplicate connection retired before it wrote this")}
		a.deadLettersOf(&out, unwritten, false)
		a.deadLetters(queue, unwritten)
		if conn != nil {
			conn.Close()
		}
		a.finish()
		a.deadLettersOf(&unacked, &sessionError{peer: a.label(), cause: errors.New("duplicate connection retired before the peer confirmed")}, true)
		return
	}
	a.err = err
	unacked, out, queue := a.takeHeld()
	pending, resolves, watches := a.pending, a.resolves, a.watches
	watchedBy := a.watchedBy.take()
	a.pending, a.resolves, a.watches = nil, nil, nil
	a.mu.Unlock()
	a.dropWatchedBy(watchedBy)
	if end.quarantine {
		// Whether the peer is exempt takes the peer-table lock, so it is
		// asked outside mu, and only of a peer that was up.
		end = endingOf(from, peerLeft, closing, a.exemptFromQuarantine())
	}

	reason := err
	if end.quarantine {
		a.n.addQuarantine(a, err)
		reason = &quarantineError{peer: a.label(), uid: a.peerUID, cause: err}
		a.mu.Lock()
		a.err = reason
		a.mu.Unlock()
		a.n.log.Warn("troupe: peer unreachable; quarantined until Reconnect or ClearQuarantine", "peer", a.label(), "uid", a.peerUID.String(), "cause", err)
	}
	if conn != nil {
		conn.Close()
	}
	a.finish()
	serr := &sessionError{peer: a.label(), cause: reason, observer: observer}
	if end.publish {
		if peerLeft {
			a.n.totals.peersLeft.Add(1)
		} else {
			a.n.totals.peersGivenUp.Add(1) // (quarantined, unless a cluster member or a registrar)
		}
		a.n.events.Publish(PeerUnreachable{Addr: a.addr(), UID: a.peerUID, Name: a.peerName, Quarantined: end.quarantine, Reason: reason, LastHeard: a.lastHeard()})
	}
	a.deadLettersOf(&unacked, serr, true)
	a.deadLettersOf(&out, serr, false)
	a.deadLetters(queue, serr)
	for p := range pending {
		p.fail(serr)
	}
	for _, ch := range resolves {
		ch <- resolveAnswer{err: serr}
	}
	for w := range watches {
		w.watcher.signal(sysMsg{kind: sysTerminated, key: w.target, reason: reason})
	}
	if from != assocConnecting {
		a.n.log.Debug("troupe: association ended", "peer", a.label(), "reason", reason)
	}
}
