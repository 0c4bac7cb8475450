package troupe

import (
	"errors"
	"net"
	"time"
)

// The means of a session's end: the goodbye to a peer this node gave up
// on, then a reset so the kernel keeps nothing the peer never read; and
// what was queued or unacknowledged becoming dead letters. life.step
// (assoc_state.go) decides what an end does; transition
// (assoc_transition.go) carries it out with these.

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
			a.n.dead.deadLetter(r.h.String(), r.msg, err)
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
			a.n.dead.deadLetterUnconfirmed(target, msg, err)
		} else {
			a.n.dead.deadLetter(target, msg, err)
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
	if !th.targetInline && th.target > 0 && th.target <= uint64(len(a.enc.targetKeys)) {
		path = a.enc.targetKeys[th.target-1].path
	}
	target := FormatRef(a.addr(), path)
	var mt *msgType
	switch {
	case th.typInline:
		mt = typeByKey(th.key)
	case th.typ > 0 && th.typ <= uint64(len(a.enc.typeList)):
		mt = a.enc.typeList[th.typ-1]
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

// takeHeld empties what the session holds for the peer (mu held): the
// frames written and not acknowledged, those encoded and not written,
// and the records not yet encoded. Their blocks are left to the garbage
// collector, not recycled: the writer may still be writing them.
func (a *assoc) takeHeld() (unacked, out frameChain, queue recQueue) {
	unacked, out, queue = a.win.unacked.take(), a.out.take(), a.takeQueue()
	return
}
