package troupe

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
	"time"
)

// An association's writer, which writes what the senders encoded (a
// heartbeat and an acknowledgement first) with one vectored write, and
// the window it keeps. The reader is in assoc_reader.go.

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

// assocWriter is what an association's writer goroutine keeps between
// writes, and only it reads or writes (a connection resuming a session
// starts its ackSent from the old one's, before its writer starts).
type assocWriter struct {
	a       *assoc        // whose writer this is
	iov     net.Buffers   // the buffers of one write
	bufs    [][]byte      // the blocks it writes
	prio    []byte        // its heartbeat and acknowledgement
	ackSent uint64        // the last acknowledgement written
	byeSent bool          // a retiring session's duplicate-bye is written: only acknowledgements follow
	spent   []*frameBlock // blocks a write copied, to recycle after it
	wiov    net.Buffers   // what WriteTo consumes
}

// sendWindow is what an association has written and the peer has not yet
// acknowledged, guarded by the association's lock (mu): the writer adds
// to it, the reader's acknowledgements free it, a resuming connection
// takes it over.
type sendWindow struct {
	// unacked holds the frames written and not yet acknowledged by the
	// peer, in order (unackedSeq counts the sequenced ones), and acked
	// counts those acknowledged. While the writer writes (writing), blocks
	// an acknowledgement frees wait in freed.
	unacked frameChain
	acked   uint64
	writing bool
	freed   []*frameBlock
	// stalled: the writer stopped with UnackedLimit bytes unacknowledged;
	// ackMoved is when the peer's acknowledgements last moved (or
	// something became outstanding).
	stalled  bool
	ackMoved time.Time
	// writeDeadline is the connection's write deadline, moved ahead as the
	// writer writes.
	writeDeadline time.Time
}

// unackedSeq counts the sequenced frames in unacked: its tells, or every
// frame of a resumable session (the association's mu held).
func (w *sendWindow) unackedSeq(resumable bool) int {
	if resumable {
		return w.unacked.frames
	}
	return w.unacked.tells
}

// release drops the first k sequenced frames from unacked, with the
// frames that are not sequenced before and among them (the
// association's mu held).
func (w *sendWindow) release(k int, resumable bool) {
	w.unacked.drop(func(kind frameKind) bool {
		if !resumable && !kind.isTell() {
			return true
		}
		if k == 0 {
			return false
		}
		k--
		return true
	}, w.free)
}

// free recycles a block an acknowledgement emptied, or keeps it for the
// writer to recycle if a write may still be reading it (the
// association's mu held).
func (w *sendWindow) free(b *frameBlock) {
	if w.writing {
		w.freed = append(w.freed, b)
		return
	}
	recycle(b)
}

// encodeRound bounds the time the writer spends encoding queued records
// before it writes what it has.
const encodeRound = 10 * time.Millisecond

// failedRec is a queued message that could not be encoded, and why.
type failedRec struct {
	h   *handle
	msg any
	err error
}

func isAnswer(msg any) bool {
	_, ok := msg.(answerFrame)
	return ok
}

// ackEvery bounds how many tell frames a busy reader receives before it
// acknowledges them, so that a sender's unacknowledged backlog stays small
// under a steady stream.
const ackEvery = 1024

// ackBytes bounds, likewise, how many bytes a busy reader receives before
// it acknowledges them: well below any sender's window.
const ackBytes = 256 << 10

// bigWrite is the most the writer hands the connection in one call: a
// larger write (a large frame has a block of its own) goes in slices, the
// write deadline moving on between them, so that a slow link that keeps
// reading is not taken for one that stopped.
const bigWrite = 1 << 20

// What a reader keeps of its batch of tells, and of their arena, while
// its link is quiet.
const (
	keepBatch = 16
	keepArena = 1 << 10
)

// writeLoop is the association's only writer: it takes what the senders
// encoded, a part at a time, records it as unacknowledged and writes it
// with one call. It never has more than Config.UnackedLimit bytes
// unacknowledged (the window), give or take one block of frames (64 KiB,
// or one frame larger than that): past it, it waits for the peer to
// acknowledge, and asks it to with a heartbeat.
func (w *assocWriter) writeLoop() {
	a := w.a
	defer close(a.writerDone)
	var first net.Buffers
	if a.open.resume {
		first = append(first, appendWhole(nil, appendResume(nil, a.open.resumeRcv)))
	}
	if tok := a.n.gate.tokenFor(a.peer.uid); a.open.sendToken && tok != nil {
		// This node's session token for the peer (after a resume frame,
		// which goes first): see token.go.
		first = append(first, appendWhole(nil, appendToken(nil, tok)))
	}
	if len(first) > 0 && !w.write(first) {
		return
	}
	_, vectored := a.conn.(interface {
		SyscallConn() (syscall.RawConn, error)
	})
	vectored = vectored && !raceEnabled
	window := a.n.cfg.UnackedLimit
	for {
		select {
		case <-a.wake:
		case <-a.stop:
			return
		}
		if !w.writeRound(vectored, window) {
			return
		}
	}
}

// writeRound is one round of the writer: false when the writer is done.
// It is a function of its own, not inlined, so that its locals (the
// session's steps among them) are not in the frame of writeLoop while
// it waits: an idle writer's stack shrinks back to its smallest.
//
//go:noinline
func (w *assocWriter) writeRound(vectored bool, window int) bool {
	a := w.a
	a.due.grant()
	now := time.Now()
	a.mu.Lock()
	if !a.encodesNow() && a.life.state != assocClosed {
		a.mu.Unlock()
		for _, f := range w.encodeQueued() {
			a.n.dead.deadLetterTo(f.h.key, f.h.String(), f.msg, f.err, false)
		}
		a.mu.Lock()
	}
	if a.life.state == assocEnding {
		// This node gave up on the peer: say so, if the link still
		// carries it, and close (abort bounded the write).
		cause := a.life.endCause
		a.mu.Unlock()
		a.sayGaveUp(cause)
		return false
	}
	// (Read before the acknowledgement below: the reader sets ackTo
	// before peerBye.)
	peerBye := a.dup.peerBye.Load()
	var out frameChain
	var spent []*frameBlock
	bufs := w.bufs[:0]
	// A duplicate retired into this session may still carry frames: its
	// peer reads them first (a graceful leave's queue too, but Close's
	// goodbye goes at once).
	behind := a.dup.behind > 0 && (a.life.state == assocUp || a.life.state == assocLeaving && a.life.byeOnAck)
	if !a.life.holdQueue && !behind && !w.byeSent {
		if !a.peer.resumable {
			// Frames that are not sequenced need no acknowledgement:
			// those at the front go, so they never hold the window.
			a.win.release(0, a.peer.resumable)
		}
		if window > 0 && a.win.unacked.bytes >= window {
			if !a.win.stalled {
				a.win.stalled = true
				a.beat.Store(true) // ask for an acknowledgement now
			}
		} else {
			// A part at a time, so that what counts as
			// unacknowledged is what the connection took, not what
			// waits to be written, and no more than the window has
			// room for (give or take a block: see takePrefix).
			part := writeChunk
			if window > 0 {
				part = min(part, window-a.win.unacked.bytes)
			}
			out = a.out.takePrefix(part)
			if a.out.frames > 0 {
				a.notify() // the rest, next
			}
		}
		bufs = out.buffers(bufs) // before keepUnacked relinks the blocks
		spent = w.keepUnacked(&out)
		a.win.writing = out.frames > 0
	}
	draining := a.life.state == assocLeaving || a.life.state == assocRetiring
	w.prio = w.writePriority(w.prio[:0])
	if len(w.prio) > 0 || len(bufs) > 0 {
		w.extendWriteDeadline(now)
	}
	a.mu.Unlock()
	iov := w.iov[:0]
	if !vectored {
		for _, b := range bufs {
			w.prio = append(w.prio, b...)
		}
		bufs = bufs[:0]
	}
	if len(w.prio) > 0 {
		iov = append(iov, w.prio)
	}
	iov = append(iov, bufs...)
	ok := len(iov) == 0 || w.write(iov)
	if ok {
		a.traffic.tellsOut.Add(uint64(out.tells))
	}
	clear(iov)
	clear(bufs)
	w.iov, w.bufs = iov[:0], bufs[:0]
	if cap(w.prio) > prioKeep {
		w.prio = nil
	}
	w.doneWriting(out.frames > 0, spent)
	if !ok {
		return false
	}
	if draining {
		a.mu.Lock()
		empty := a.queue.len() == 0 && a.out.frames == 0
		var eff effect
		var tk taken
		if empty && a.life.byeOnAck && a.win.unackedSeq(a.peer.resumable) == 0 {
			eff, _ = a.stepLocked(lifeEvent{kind: evByeQueued}, &tk) // (it notifies)
			a.pushControl(appendBye(nil, byeLeaving, ""))
			empty = false
		}
		last := empty && !a.life.byeOnAck
		retiring := a.life.state == assocRetiring
		a.mu.Unlock()
		a.carryOut(eff, &tk)
		if retiring && (last || w.byeSent) {
			// The duplicate-bye is written: nothing more of the queue
			// follows it (what came late is the retired session's dead
			// letter), only acks. Once the peer's bye has been read,
			// this round's ack covered every frame it wrote: the
			// writing side half-closes, and the peer reads on to that
			// end. Until then, wait: the reader ends the session at the
			// latest retireDrain on, and a closing node does not wait.
			w.byeSent = true
			if !peerBye && !a.n.lc.flushBegun() {
				return true
			}
			closeWrite(a.conn)
			return false
		}
		if last {
			return false
		}
	}
	return true
}

// extendWriteDeadline moves the connection's write deadline to
// UnreachableAfter from now (mu held, so that it never undoes the short
// deadline abort sets): a write the peer does not drain within about
// UnreachableAfter fails, and the session ends. The deadline moves only
// once a tenth of it has passed, so a busy writer seldom touches it.
func (w *assocWriter) extendWriteDeadline(now time.Time) {
	a := w.a
	window := a.n.cfg.UnreachableAfter
	if next := now.Add(window); next.Sub(a.win.writeDeadline) > window/10 {
		a.win.writeDeadline = next
		a.conn.SetWriteDeadline(next)
	}
}

// encodeQueued encodes, in order, what was queued as records: before the
// writer started (the peer's uid was not known), or moved here by a
// merge or a resume. Payloads are encoded with no lock held; meanwhile
// senders go on queuing records behind them, so order holds. Once the
// queue is empty, senders encode for themselves. It returns the messages
// that could not be encoded, for dead letters.
func (w *assocWriter) encodeQueued() []failedRec {
	a := w.a
	var failed []failedRec
	start := time.Now()
	a.mu.Lock()
	a.creditStalled = false // (until the head waits for credit again)
	for a.life.state != assocClosed && a.queue.len() > 0 {
		if a.life.encoding {
			a.stepLocked(lifeEvent{kind: evEncoding}, &taken{}) // (no effects)
		}
		if a.out.bytes >= writeChunk || time.Since(start) >= encodeRound {
			// Enough for one round: the writer writes it, with the
			// heartbeats and acknowledgements due, and comes back for
			// the rest. A long queue (or a sender that keeps adding to
			// it) must not hold the connection silent for longer than
			// the peer's window.
			a.mu.Unlock()
			a.notify()
			return failed
		}
		// The record stays queued while its payload is encoded, with no
		// lock held: whoever takes the queue meanwhile (a leave, the
		// end, a merge) reports it, and its encoding is dropped here.
		r, gen := *a.queue.peek(), a.qgen
		if r.h != nil && r.pb == nil {
			peer := a.peer.uid
			a.mu.Unlock()
			pb, err := encodeFor(peer, r.mt, r.msg)
			a.mu.Lock()
			if a.qgen != gen {
				if pb != nil {
					pb.release()
				}
				continue
			}
			if err != nil {
				a.queue.pop()
				failed = append(failed, failedRec{r.h, r.msg, err})
				continue
			}
			r.pb = pb
		}
		switch {
		case r.h != nil:
			err := a.encodeTell(r.h, r.mt, r.pb.b, nil, r.hd)
			if err == errNoCredit && r.wait {
				// A Send waits for credit, at the head of the queue (with
				// its payload): onCredit wakes the writer for it.
				*a.queue.peek() = r
				a.creditStalled = true
				a.mu.Unlock()
				return failed
			}
			a.queue.pop()
			if err != nil {
				failed = append(failed, failedRec{r.h, r.msg, err})
			}
			r.pb.release()
		case isAnswer(r.msg):
			a.queue.pop()
			a.encodeControl(r.msg.(answerFrame), true)
		default:
			a.queue.pop()
			a.encodeControl(r.msg.(ctlFrame), false)
		}
		a.wakeSenders() // a record counted more than its frame, perhaps
	}
	if !a.life.encoding {
		a.stepLocked(lifeEvent{kind: evEncoding, on: true}, &taken{}) // (none; it does not apply once closed)
	}
	a.mu.Unlock()
	return failed
}

// keepUnacked records the frames of out, about to be written, as
// unacknowledged (mu held): before the write, since the acknowledgement
// may come back before Write returns. A block with room for it is
// copied into unacked's last block, and returned to be recycled once
// written; any other block becomes unacked's.
func (w *assocWriter) keepUnacked(out *frameChain) []*frameBlock {
	a := w.a
	if out.frames == 0 {
		return nil
	}
	if a.win.unackedSeq(a.peer.resumable) == 0 {
		a.win.ackMoved = time.Now() // something is outstanding from now on
	}
	spent := w.spent[:0]
	u := &a.win.unacked
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
			b.answers = 0 // (counted only while waiting to be written)
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
func (w *assocWriter) doneWriting(wrote bool, spent []*frameBlock) {
	a := w.a
	for _, b := range spent {
		recycle(b)
	}
	if cap(spent) > 0 { // (a round that wrote no frame had none)
		clear(spent)
		w.spent = spent[:0]
	}
	if !wrote {
		return
	}
	a.mu.Lock()
	a.win.writing = false
	freed := a.win.freed
	a.win.freed = nil
	a.mu.Unlock()
	for _, b := range freed {
		recycle(b)
	}
}

// writePriority appends what goes ahead of queued frames: a heartbeat when
// one is due, and the acknowledgement of the tell frames received so far.
func (w *assocWriter) writePriority(buf []byte) []byte {
	a := w.a
	var body [1 + binary.MaxVarintLen64]byte
	if a.beat.Swap(false) {
		buf = appendWhole(buf, appendHeartbeat(body[:0]))
	}
	if v := a.ackTo.Load(); v != w.ackSent {
		w.ackSent = v
		buf = appendWhole(buf, appendAck(body[:0], v))
	}
	return buf
}

// write writes iov. On failure a session that cannot resume is ended;
// what it held unacknowledged becomes dead letters, as possibly
// delivered, since what the kernel took before the failure cannot be
// told apart from what it did not.
func (w *assocWriter) write(iov net.Buffers) bool {
	a := w.a
	var n int64
	var err error
	total := 0
	for _, b := range iov {
		total += len(b)
	}
	switch {
	case total > bigWrite:
		n, err = w.writeSlices(iov)
	case len(iov) == 1:
		var k int
		k, err = a.conn.Write(iov[0]) // (WriteTo would use writev for one buffer too)
		n = int64(k)
	default:
		w.wiov = iov // (WriteTo takes a pointer: a field does not escape each call)
		n, err = w.wiov.WriteTo(a.conn)
		w.wiov = nil
	}
	a.traffic.written.Add(uint64(n))
	if err == nil {
		return true
	}
	a.mu.Lock()
	gaveUp := a.life.state == assocEnding
	a.mu.Unlock()
	if gaveUp {
		closeHard(a.conn) // the end abort asked for; the reader finishes it
		return false
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		// The peer has not drained what this node writes for
		// UnreachableAfter: it is as good as gone, though it may still
		// send. The stream stops mid-frame: it cannot resume.
		a.abort(fmt.Errorf("%s has not read what this node wrote for %v", a.label(), a.n.cfg.UnreachableAfter))
		closeHard(a.conn)
		return false
	}
	if a.peer.resumable {
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

// writeSlices writes iov bigWrite bytes at a time.
func (w *assocWriter) writeSlices(iov net.Buffers) (int64, error) {
	a := w.a
	var n int64
	for _, b := range iov {
		for len(b) > 0 {
			k := min(len(b), bigWrite)
			now := time.Now()
			a.mu.Lock()
			if a.life.state != assocEnding {
				w.extendWriteDeadline(now)
				// A frame is acknowledged only once all of it arrived:
				// a slice the link took is progress too.
				a.win.ackMoved = time.Now()
			}
			a.mu.Unlock()
			m, err := a.conn.Write(b[:k])
			n += int64(m)
			if err != nil {
				return n, err
			}
			b = b[m:]
		}
	}
	return n, nil
}
