package troupe

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"time"
	"unsafe"
)

// An association's two loops: the one writer, which writes what the
// senders encoded (a heartbeat and an acknowledgement first) with one
// vectored write, and the one reader.

// writeChunk is about how much the writer writes at once: large enough
// that a burst costs few system calls, small enough that what counts as
// unacknowledged (UnackedLimit) is what the connection has taken, and not
// a backlog still waiting to be written.
const writeChunk = 256 << 10

// brokenWriteDrain is how long the reader of a resumable session may go
// on reading after a write failed: what the peer sent before the
// connection broke is already here, so it takes no longer than that.
const brokenWriteDrain = 250 * time.Millisecond

// prioKeep is the largest buffer for the frames that go ahead that the
// writer keeps between writes (it also gathers a write for a connection
// without vectored writes).
const prioKeep = 1 << 20

// writeLoop is the association's only writer: it takes everything
// encoded, records it as unacknowledged and writes it with one call.
func (a *assoc) writeLoop() {
	defer close(a.writerDone)
	if a.resumed && !a.write(net.Buffers{appendWhole(nil, appendResume(nil, a.resumeRcv))}) {
		return
	}
	_, vectored := a.conn.(interface {
		SyscallConn() (syscall.RawConn, error)
	})
	vectored = vectored && !raceEnabled
	for {
		select {
		case <-a.wake:
		case <-a.stop:
			return
		}
		a.mu.Lock()
		failed := a.encodeQueued()
		var out frameChain
		var spent []*frameBlock
		bufs := a.bufs[:0]
		if !a.holdQueue {
			// A part at a time, so that what counts as unacknowledged
			// is what the connection took, not what waits to be written.
			out = a.out.takePrefix(writeChunk)
			if a.out.frames > 0 {
				a.notify() // the rest, next
			}
			bufs = out.buffers(bufs) // before keepUnacked relinks the blocks
			spent = a.keepUnacked(&out)
			a.writing = out.frames > 0
		}
		draining := a.state == assocLeaving || a.state == assocRetiring
		over := a.unacked.bytes
		a.mu.Unlock()
		for _, f := range failed {
			a.n.deadLetter(f.h.String(), f.msg, f.err)
		}
		if lim := a.n.cfg.UnackedLimit; lim > 0 && over >= lim {
			// A peer that reads but never confirms is as good as silent:
			// what it holds unconfirmed must not grow without end.
			a.abort(fmt.Errorf("%s has not acknowledged %d bytes of messages (Config.UnackedLimit is %d)", a.label(), over, lim))
			a.doneWriting(out.frames > 0, spent)
			return
		}
		a.prio = a.writePriority(a.prio[:0])
		iov := a.iov[:0]
		if !vectored {
			for _, b := range bufs {
				a.prio = append(a.prio, b...)
			}
			bufs = bufs[:0]
		}
		if len(a.prio) > 0 {
			iov = append(iov, a.prio)
		}
		iov = append(iov, bufs...)
		ok := len(iov) == 0 || a.write(iov)
		if ok {
			a.tellsOut.Add(uint64(out.tells))
		}
		clear(iov)
		clear(bufs)
		a.iov, a.bufs = iov[:0], bufs[:0]
		if cap(a.prio) > prioKeep {
			a.prio = nil
		}
		a.doneWriting(out.frames > 0, spent)
		if !ok {
			return
		}
		if draining {
			a.mu.Lock()
			empty := a.queue.len() == 0 && a.out.frames == 0
			if empty && a.byeOnAck && a.unackedSeq() == 0 {
				a.byeOnAck, empty = false, false
				a.push(&outRec{msg: ctlFrame(appendBye(nil, byeLeaving, ""))})
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

// failedRec is a queued message that could not be encoded, and why.
type failedRec struct {
	h   *handle
	msg any
	err error
}

// encodeQueued lets senders encode from now on, and encodes what was
// queued as records before (mu held). It returns the messages that could
// not be encoded, for dead letters.
func (a *assoc) encodeQueued() []failedRec {
	if a.state == assocClosed {
		return nil
	}
	a.encoding = true
	if a.queue.len() == 0 {
		return nil
	}
	var failed []failedRec
	a.queue.take().each(func(r *outRec) {
		if err := a.encode(r); err != nil {
			failed = append(failed, failedRec{r.h, r.msg, err})
		}
	})
	a.wakeSenders() // a record counted more than its frame, perhaps
	return failed
}

// keepUnacked records the frames of out, about to be written, as
// unacknowledged (mu held): before the write, since the acknowledgement
// may come back before Write returns. A block with room for it is
// copied into unacked's last block, and returned to be recycled once
// written; any other block becomes unacked's.
func (a *assoc) keepUnacked(out *frameChain) []*frameBlock {
	if out.frames == 0 {
		return nil
	}
	var spent []*frameBlock
	u := &a.unacked
	off := out.off
	for b := out.head; b != nil; {
		next := b.next
		data := b.b[off:]
		if u.tail != nil && cap(u.tail.b)-len(u.tail.b) >= len(data) {
			u.tail.b = append(u.tail.b, data...)
			u.tail.frames += b.frames
			u.tail.tells += b.tells
			spent = append(spent, b)
		} else {
			u.link(b, off)
		}
		off, b = 0, next
	}
	u.bytes += out.bytes
	u.frames += out.frames
	u.tells += out.tells
	return spent
}

// doneWriting recycles the blocks a write has finished with: the ones it
// copied, and those an acknowledgement freed meanwhile.
// A write of a heartbeat or an acknowledgement alone (wrote false) held
// no blocks: it takes no lock.
func (a *assoc) doneWriting(wrote bool, spent []*frameBlock) {
	for _, b := range spent {
		recycle(b)
	}
	if !wrote {
		return
	}
	a.mu.Lock()
	a.writing = false
	freed := a.freed
	a.freed = nil
	a.mu.Unlock()
	for _, b := range freed {
		recycle(b)
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

// write writes iov. On failure a session that cannot resume is ended;
// what it held unacknowledged becomes dead letters, as possibly
// delivered, since what the kernel took before the failure cannot be
// told apart from what it did not.
func (a *assoc) write(iov net.Buffers) bool {
	var n int64
	var err error
	if len(iov) == 1 {
		var k int
		k, err = a.conn.Write(iov[0]) // (WriteTo would use writev for one buffer too)
		n = int64(k)
	} else {
		n, err = iov.WriteTo(a.conn)
	}
	a.written.Add(uint64(n))
	if err == nil {
		return true
	}
	if a.resumable {
		// A broken connection. The reader finds it broken too, and
		// suspends the session, once it has read what did arrive —
		// perhaps the peer's goodbye, which closing the connection here
		// would throw away. The deadline makes sure it looks.
		a.conn.SetReadDeadline(time.Now().Add(brokenWriteDrain))
	} else {
		a.abort(fmt.Errorf("write to %s: %w", a.label(), err))
	}
	return false
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
	if count < a.acked || count-a.acked > uint64(a.unackedSeq()) {
		if a.mergedInto != nil {
			return nil
		}
		return fmt.Errorf("%w: acknowledgement of %d frames, %d were sent", ErrMalformed, count, a.acked+uint64(a.unackedSeq()))
	}
	a.release(int(count - a.acked))
	a.acked = count
	if a.unackedSeq() == 0 && a.byeOnAck {
		a.notify() // the writer may say bye now
	}
	if a.room != nil && !a.full() {
		a.wakeSenders()
	}
	return nil
}

// unackedSeq counts the sequenced frames in unacked: its tells, or every
// frame of a resumable session (mu held).
func (a *assoc) unackedSeq() int {
	if a.resumable {
		return a.unacked.frames
	}
	return a.unacked.tells
}

// release drops the first k sequenced frames from unacked, with the
// frames that are not sequenced before and among them (mu held).
func (a *assoc) release(k int) {
	a.unacked.drop(func(kind frameKind) bool {
		if !a.resumable && kind != frameTell {
			return true
		}
		if k == 0 {
			return false
		}
		k--
		return true
	}, a.free)
}

// free recycles a block an acknowledgement emptied, or keeps it for the
// writer to recycle if a write may still be reading it (mu held).
func (a *assoc) free(b *frameBlock) {
	if a.writing {
		a.freed = append(a.freed, b)
		return
	}
	recycle(b)
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

// encode appends r's frame to out (mu held). A message that cannot be
// encoded adds nothing; the error says why, for its dead letter.
func (a *assoc) encode(r *outRec) error {
	if r.h == nil {
		buf := a.out.room()
		start := len(buf)
		buf = append(buf, 0)
		buf = append(buf, r.msg.(ctlFrame)...)
		a.out.commit(fixLength(buf, start), false)
		return nil
	}
	return a.encodeTell(r.h, r.mt, r.msg, nil)
}

// encodeTell appends the tell frame of msg, of type mt, for h to out (mu
// held); or, msg nil, of the flat value at p, which it does not keep.
func (a *assoc) encodeTell(h *handle, mt *msgType, msg any, p unsafe.Pointer) error {
	if h.key.node != a.peerUID {
		return fmt.Errorf("%w: the node incarnation %s is gone", ErrNoSuchActor, h.key.node.String()[:8])
	}
	buf := a.out.room()
	start := len(buf)
	buf = append(buf, 0)
	// New table entries are committed only once the frame is complete,
	// so a message that fails to encode leaves the tables as they were.
	var th tellHeader
	var id uint32
	var knownTarget bool
	if w := h.wire.Load(); w != nil && w.a == a {
		id, knownTarget = w.id, true
	} else if id, knownTarget = a.outTargets[h.key]; knownTarget {
		h.wire.Store(&wireID{a, id})
	}
	newTarget := !knownTarget && h.key.uuid != (UUID{}) && len(a.outTargets) < maxTableSize && len(h.key.path) <= maxTableEntry
	if newTarget {
		id = uint32(len(a.outTargets) + 1)
	}
	th.target, th.targetInline = uint64(id), !knownTarget
	if !knownTarget {
		th.path, th.uuid = h.key.path, h.key.uuid
	}
	var tid uint32
	var knownType bool
	if mt == a.lastType {
		tid, knownType = a.lastTypeID, true
	} else if tid, knownType = a.outTypes[mt]; knownType {
		a.lastType, a.lastTypeID = mt, tid
	}
	newType := !knownType && len(a.outTypes) < maxTableSize
	if newType {
		tid = uint32(len(a.outTypes) + 1)
	}
	th.typ, th.typInline = uint64(tid), !knownType
	if !knownType {
		th.key = mt.key
	}
	buf = appendTellHeader(buf, &th)
	var err error
	if msg == nil {
		buf = appendFlatValue(buf, mt.flat, p)
	} else {
		a.enc.peer = a.peerUID
		buf, err = a.enc.payload(buf, mt, msg)
	}
	if err == nil && len(buf)-start-1 > a.n.cfg.MaxFrameSize {
		err = fmt.Errorf("%w: %d bytes, the limit is %d", ErrFrameTooBig, len(buf)-start-1, a.n.cfg.MaxFrameSize)
	}
	if err != nil {
		return err // (out is as it was: nothing was committed)
	}
	for _, x := range a.enc.exports {
		x.exportTemp() // reachable by path before the frame is written
	}
	if newTarget {
		a.outTargets[h.key] = id
		a.outTargetKeys = append(a.outTargetKeys, h.key)
		h.wire.Store(&wireID{a, id})
	}
	if newType {
		a.outTypes[mt] = tid
		a.outTypeList = append(a.outTypeList, mt)
	}
	a.out.commit(fixLength(buf, start), true)
	return nil
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
		if frameKind(body[0]) != frameTell {
			return true
		}
		target, msg := a.decodeHeld(body[1:])
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
	return b.a.bindRef(kind, key, addr)
}

// readLoop reads frames until the connection ends or misbehaves.
func (a *assoc) readLoop(fr *frameReader) {
	for {
		if len(a.batch) > 0 && !fr.complete() {
			a.flushBatch() // before waiting for the connection
		}
		body, err := fr.next()
		if err != nil {
			a.flushBatch()
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
		if kind != frameTell && len(a.batch) > 0 {
			a.flushBatch()
		}
		done, err := a.handleFrame(kind, body[1:])
		if err != nil {
			a.flushBatch()
			a.n.protocolError(a.label(), kind.String(), err)
			a.fail(&FrameError{Peer: a.label(), Kind: kind.String(), Reason: err})
			return
		}
		if done {
			return
		}
		if a.rcvTells != a.ackQueued && (fr.buffered() == 0 || a.rcvTells-a.ackQueued >= ackEvery) {
			// About to wait for more, or a steady stream: confirm what
			// arrived. The acknowledgement rides on the next frame this node
			// writes (a reply, at the latest the next heartbeat); only a
			// large backlog, or a heartbeat (a sender waiting for room in
			// its send budget sends one), wakes the writer for it alone.
			a.ackTo.Store(a.rcvTells)
			if a.rcvTells-a.ackQueued >= ackEvery || kind == frameHeartbeat {
				a.notify()
			}
			a.ackQueued = a.rcvTells
		}
	}
}
