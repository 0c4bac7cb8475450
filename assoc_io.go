package troupe

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"time"
)

// An association's two loops: the one writer that coalesces queued frames
// (heartbeats and acknowledgements first), and the one reader.

// Sizes of the writer's buffer.
const (
	// writeChunk is how much the writer encodes before it writes: large
	// enough that a burst costs few system calls, small enough that the
	// first frames of a long queue leave without waiting for the last
	// ones to be encoded.
	writeChunk = 256 << 10
	// writeBufferKeep is the largest buffer the writer keeps between
	// bursts; one grown by an outsized message is let go.
	writeBufferKeep = 1 << 20
	// brokenWriteDrain is how long the reader of a resumable session may
	// go on reading after a write failed: what the peer sent before the
	// connection broke is already here, so it takes no longer than that.
	brokenWriteDrain = 250 * time.Millisecond
	// unackedCompactAfter is how many confirmed entries the front of the
	// unacknowledged list may hold before it is moved down, so that a
	// steady stream neither copies on every acknowledgement nor grows
	// the list without end.
	unackedCompactAfter = 1024
)

// writeLoop is the association's only writer: it takes everything queued,
// encodes it into one buffer and writes it with one call.
func (a *assoc) writeLoop() {
	defer close(a.writerDone)
	if a.resumed && !a.write(appendWhole(nil, appendResume(nil, a.resumeRcv))) {
		return
	}
	for {
		select {
		case <-a.wake:
		case <-a.stop:
			return
		}
		a.mu.Lock()
		var recs recQueue
		if !a.holdQueue {
			recs = a.queue.take()
			a.wakeSenders()
		}
		draining := a.state == assocLeaving || a.state == assocRetiring
		a.mu.Unlock()
		buf := a.writePriority(a.wbuf[:0]) // heartbeat and acknowledgement first
		ok := true
		var requeue recQueue // a resumable session's frames not yet written
		recs.each(func(r *outRec) {
			if !ok {
				if a.resumable {
					requeue.push(*r)
				} else if r.h != nil {
					a.n.deadLetter(r.h.String(), r.msg, a.unwritten())
				}
				return
			}
			var sent bool
			start := len(buf)
			buf, sent = a.encodeRec(buf, r)
			if sent && (r.h != nil || a.resumable) {
				a.inflight = append(a.inflight, inflightMsg{r.h, r.msg, r.mt, len(buf), len(buf) - start})
			}
			if len(buf) >= writeChunk {
				ok = a.write(buf)
				buf = a.writePriority(buf[:0])
			}
		})
		if ok && len(buf) > 0 {
			ok = a.write(buf)
		}
		if !ok {
			if requeue.len() > 0 {
				a.mu.Lock()
				ended := a.state == assocClosed // its queue was already reported
				if !ended {
					requeue.appendQueue(a.queue.take())
					a.queue = requeue
				}
				a.mu.Unlock()
				if ended {
					a.deadLetters(requeue, a.unwritten())
				}
			}
			return
		}
		if cap(buf) <= writeBufferKeep {
			a.wbuf = buf
		}
		if draining {
			a.mu.Lock()
			empty := a.queue.len() == 0
			if empty && a.byeOnAck && a.unackedHead == len(a.unacked) {
				a.byeOnAck, empty = false, false
				a.queue.push(outRec{msg: ctlFrame(appendBye(nil, byeLeaving, ""))})
				a.notify()
			}
			last := empty && !a.byeOnAck
			a.mu.Unlock()
			if last {
				return
			}
		}
	}
}

// ackEvery bounds how many tell frames a busy reader receives before it
// acknowledges them, so that a sender's unacknowledged backlog stays small
// under a steady stream.
const ackEvery = 1024

// writePriority appends what goes ahead of queued frames: a heartbeat when
// one is due, and the acknowledgement of the tell frames received so far.
func (a *assoc) writePriority(buf []byte) []byte {
	var body [1 + binary.MaxVarintLen64]byte
	if a.beat.Swap(false) {
		buf = appendWhole(buf, appendHeartbeat(body[:0]))
	}
	if v := a.ackTo.Load(); v != a.ackSent {
		a.ackSent = v
		buf = appendWhole(buf, appendAck(body[:0], v))
	}
	return buf
}

// write writes b. The messages it carries wait for the peer's
// acknowledgement (they are recorded before the write, since the ack may
// come back before Write returns); what the kernel did not take becomes
// dead letters with the session's final reason.
func (a *assoc) write(b []byte) bool {
	if len(a.inflight) > 0 {
		a.mu.Lock()
		ended := a.state == assocClosed
		if !ended {
			a.unacked = append(a.unacked, a.inflight...)
			for _, m := range a.inflight {
				a.unackedBytes += m.size
			}
		}
		over := a.unackedBytes
		a.mu.Unlock()
		if lim := a.n.cfg.UnackedLimit; lim > 0 && over > lim {
			// A peer that reads but never confirms is as good as silent:
			// what it holds unconfirmed must not grow without end.
			a.abort(fmt.Errorf("%s has not acknowledged %d bytes of messages (Config.UnackedLimit is %d)", a.label(), over, lim))
			clear(a.inflight)
			a.inflight = a.inflight[:0]
			return false
		}
		if ended {
			reason := a.failure()
			for _, m := range a.inflight {
				if m.h != nil {
					a.n.deadLetter(m.h.String(), m.msg, reason)
				}
			}
			clear(a.inflight)
			a.inflight = a.inflight[:0]
			return false
		}
	}
	n, err := a.conn.Write(b)
	a.written.Add(uint64(n))
	for _, m := range a.inflight {
		if m.h != nil {
			a.tellsOut.Add(1)
		}
	}
	if err != nil {
		if a.resumable {
			// A broken connection. The reader finds it broken too, and
			// suspends the session, once it has read what did arrive —
			// perhaps the peer's goodbye, which closing the connection
			// here would throw away. The deadline makes sure it looks.
			a.conn.SetReadDeadline(time.Now().Add(brokenWriteDrain))
		} else {
			a.abort(fmt.Errorf("write to %s: %w", a.label(), err))
		}
		cut := len(a.inflight)
		for i, m := range a.inflight {
			if m.end > n {
				cut = i
				break
			}
		}
		if unsent := len(a.inflight) - cut; unsent > 0 && !a.resumable {
			// (A resumable session keeps them unconfirmed: a resume
			// sends them again.)
			a.mu.Lock()
			if a.state != assocClosed && len(a.unacked)-a.unackedHead >= unsent {
				tail := len(a.unacked) - unsent
				for _, m := range a.unacked[tail:] {
					a.unackedBytes -= m.size
				}
				a.unsent = append(a.unsent, a.unacked[tail:]...)
				clear(a.unacked[tail:])
				a.unacked = a.unacked[:tail]
			}
			a.mu.Unlock()
		}
	}
	clear(a.inflight)
	a.inflight = a.inflight[:0]
	return err == nil
}

// onAck releases the messages the peer confirmed it received.
func (a *assoc) onAck(b []byte) error {
	count, err := parseAck(b)
	if err != nil {
		return err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.state == assocClosed {
		return nil // the session ended; its unacknowledged messages are reported
	}
	waiting := uint64(len(a.unacked) - a.unackedHead)
	if count < a.acked || count-a.acked > waiting {
		if a.mergedInto != nil {
			return nil
		}
		return fmt.Errorf("%w: acknowledgement of %d frames, %d were sent", ErrMalformed, count, a.acked+waiting)
	}
	release := int(count - a.acked)
	for _, m := range a.unacked[a.unackedHead : a.unackedHead+release] {
		a.unackedBytes -= m.size
	}
	clear(a.unacked[a.unackedHead : a.unackedHead+release])
	a.unackedHead += release
	a.acked = count
	if a.unackedHead == len(a.unacked) {
		a.unacked, a.unackedHead = a.unacked[:0], 0
		if a.byeOnAck {
			a.notify() // the writer may say bye now
		}
	} else if a.unackedHead > unackedCompactAfter && a.unackedHead > len(a.unacked)/2 {
		n := copy(a.unacked, a.unacked[a.unackedHead:])
		a.unacked, a.unackedHead = a.unacked[:n], 0
	}
	return nil
}

// abort ends an up session from a goroutine other than its reader: it
// records why and closes the connection, and the reader ends the session
// after its last delivery.
func (a *assoc) abort(cause error) {
	a.mu.Lock()
	if s, ok := step(a.state, evGiveUp); ok {
		a.state = s
		if a.endCause == nil {
			a.endCause = cause
		}
	}
	conn := a.conn
	a.mu.Unlock()
	conn.Close()
}

// encodeRec appends the frame for r and reports whether it did. A message
// that cannot be encoded becomes a dead letter and adds nothing.
func (a *assoc) encodeRec(buf []byte, r *outRec) ([]byte, bool) {
	if r.h == nil {
		start := len(buf)
		buf = append(buf, 0)
		buf = append(buf, r.msg.(ctlFrame)...)
		return fixLength(buf, start), true
	}
	if r.h.key.node != a.peerUID {
		a.n.deadLetter(r.h.String(), r.msg, fmt.Errorf("%w: the node incarnation %s is gone", ErrNoSuchActor, r.h.key.node.String()[:8]))
		return buf, false
	}
	start := len(buf)
	buf = append(buf, 0)
	// New table entries are committed only once the frame is complete,
	// so a message that fails to encode leaves the tables as they were.
	var th tellHeader
	var id uint32
	var knownTarget bool
	if w := r.h.wire.Load(); w != nil && w.a == a {
		id, knownTarget = w.id, true
	} else if id, knownTarget = a.outTargets[r.h.key]; knownTarget {
		r.h.wire.Store(&wireID{a, id})
	}
	newTarget := !knownTarget && r.h.key.uuid != (UUID{}) && len(a.outTargets) < maxTableSize && len(r.h.key.path) <= maxTableEntry
	if newTarget {
		id = uint32(len(a.outTargets) + 1)
	}
	th.target, th.targetInline = uint64(id), !knownTarget
	if !knownTarget {
		th.path, th.uuid = r.h.key.path, r.h.key.uuid
	}
	tid, knownType := a.outTypes[r.mt]
	newType := !knownType && len(a.outTypes) < maxTableSize
	if newType {
		tid = uint32(len(a.outTypes) + 1)
	}
	th.typ, th.typInline = uint64(tid), !knownType
	if !knownType {
		th.key = r.mt.key
	}
	buf = appendTellHeader(buf, &th)
	a.enc.peer = a.peerUID
	buf, err := a.enc.payload(buf, r.mt, r.msg)
	if err == nil && len(buf)-start-1 > a.n.cfg.MaxFrameSize {
		err = fmt.Errorf("%w: %d bytes, the limit is %d", ErrFrameTooBig, len(buf)-start-1, a.n.cfg.MaxFrameSize)
	}
	if err != nil {
		a.n.deadLetter(r.h.String(), r.msg, err)
		return buf[:start], false
	}
	for _, x := range a.enc.exports {
		x.exportTemp() // reachable by path before the frame is written
	}
	if newTarget {
		a.outTargets[r.h.key] = id
		r.h.wire.Store(&wireID{a, id})
	}
	if newType {
		a.outTypes[r.mt] = tid
	}
	return fixLength(buf, start), true
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

// readLoop reads frames until the connection ends or misbehaves.
func (a *assoc) readLoop(fr *frameReader) {
	for {
		body, err := fr.next()
		if err != nil {
			switch {
			case errors.Is(err, ErrMalformed) || errors.Is(err, ErrFrameTooBig):
				a.n.protocolError(a.label(), "", err)
				a.fail(&FrameError{Peer: a.label(), Reason: err})
			case errors.Is(err, io.EOF):
				a.lost(fmt.Errorf("connection to %s closed by the peer: %w", a.label(), io.EOF))
			default:
				a.lost(fmt.Errorf("read from %s: %w", a.label(), err))
			}
			return
		}
		kind := frameKind(body[0])
		done, err := a.handleFrame(kind, body[1:])
		if err != nil {
			a.n.protocolError(a.label(), kind.String(), err)
			a.fail(&FrameError{Peer: a.label(), Kind: kind.String(), Reason: err})
			return
		}
		if done {
			return
		}
		if a.rcvTells != a.ackQueued && (fr.r.Buffered() == 0 || a.rcvTells-a.ackQueued >= ackEvery) {
			// About to wait for more, or a steady stream: confirm what
			// arrived. The acknowledgement rides on the next frame this node
			// writes (a reply, at the latest the next heartbeat); only a
			// large backlog wakes the writer for it alone.
			a.ackTo.Store(a.rcvTells)
			if a.rcvTells-a.ackQueued >= ackEvery {
				a.notify()
			}
			a.ackQueued = a.rcvTells
		}
	}
}
