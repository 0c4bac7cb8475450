package troupe

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"
	"unsafe"
)

// assocReader is what an association's reader goroutine keeps: the
// session's inbound tables, the decoder, the batch of messages for one
// actor that it delivers at once, and the acknowledgements it owes. Only
// the reader reads or writes it, except that a connection resuming a
// session takes the old reader's tables over before its own reader
// starts (takeOver, assoc_transition.go).
type assocReader struct {
	a         *assoc // whose reader this is
	inTypes   []inType
	inTargets []inTarget
	// inShapes holds the shapes the peer sent for wire keys it has not
	// yet defined in the session; shapeBytes counts their bytes (at most
	// maxShapeSession are held).
	inShapes   map[string]*rawShape
	shapeBytes int
	// incompatLogged holds the wire keys whose incompatible messages this
	// session has logged.
	incompatLogged map[string]struct{}
	dec            decoder
	rcvTells       uint64 // tell frames received
	batch          []wireMsg
	batchTo        batchTarget // the target of batch
	batchID        uint64      // its table id (0: none, or defined inline)
	batchPath      string      // its path, for dead letters
	arena          []uint64    // the plain values of batch
	ackQueued      uint64      // the last count handed to the writer to acknowledge
	ackBytes       int         // bytes received since then
}

// inType is an entry of the receive-side type table; mt is nil for a key
// this node has not registered.
type inType struct {
	key string
	mt  *msgType
	// conv decodes the peer's shape of the key into mt, when the peer
	// sent one that differs from mt's; incompat says why every message
	// of the key is a dead letter, when the shapes cannot be matched.
	conv     *conv
	incompat error
}

// maxIncompatLogged bounds the wire keys a session logs incompatible
// messages of.
const maxIncompatLogged = 64

// Delivery in batches: the reader gathers the messages of consecutive
// tell frames for one actor and hands them to its mailbox together, with
// one lock and at most one wake-up. The batch is delivered before any
// other frame is handled, before the reader waits for the connection,
// and before the session ends, so order and the ordering of Terminated
// are those of the frames.

// maxBatch bounds a batch, so that a steady stream reaches the actor
// without waiting for the stream to pause.
const maxBatch = 256

// wireMsg is a decoded message waiting in a batch, with its encoded size:
// msg, or a value of the plain type mt in the batch's arena at word at.
type wireMsg struct {
	msg  any
	size int
	mt   *msgType
	at   int
	// credited: the sender spent credit on it, which this node granted
	// from the mailbox's room; the mailbox takes it past its limit (by
	// at most creditInit a session).
	credited bool
	hd       Headers // the message's headers, if any
}

// value returns the message as an interface (a plain one is copied out
// of arena into a box of its own).
func (m *wireMsg) value(arena []uint64) any {
	if m.msg == nil && m.mt != nil {
		return m.mt.boxCopy(unsafe.Pointer(&arena[m.at]))
	}
	return m.msg
}

// batchTarget is a local target that takes a batch: tellWireBatch
// delivers ms (whose plain values lie in arena) in order until one fails,
// and returns how many it delivered and, if not all, why the next one
// failed.
type batchTarget interface {
	tellWireBatch(ms []wireMsg, arena []uint64) (int, error)
}

// readLoop reads frames until the connection ends or misbehaves. It
// waits for the connection in fr.await, so that an idle reader's stack
// is small enough for the collector to halve (TestAnIdleAssociationIsCheap).
func (r *assocReader) readLoop(fr *frameReader) {
	a := r.a
	for {
		if len(r.batch) > 0 && !fr.complete() {
			r.flushBatch() // before waiting for the connection
		}
		if fr.quiet() && (cap(r.batch) > keepBatch || cap(r.arena) > keepArena) {
			// About to wait on a link gone quiet: what a burst grew goes
			// (the batch is empty: a quiet reader holds no whole frame).
			r.batch, r.arena = nil, nil
		}
		fr.await()
		body, err := fr.next()
		if err != nil {
			r.readFailed(err)
			return
		}
		kind := frameKind(body[0])
		if kind != frameBye && a.endingAt.Load() != 0 {
			// This node gave up on the peer: what it still sends while
			// its goodbye goes out is neither delivered nor acknowledged.
			continue
		}
		if !kind.isTell() && len(r.batch) > 0 {
			r.flushBatch()
		}
		done, err := r.handleFrame(kind, body[1:])
		if err != nil {
			r.frameFailed(kind, err)
			return
		}
		if done {
			return
		}
		r.ackBytes += len(body)
		if r.rcvTells != r.ackQueued {
			// About to wait for more, or a steady stream: confirm what
			// arrived. The acknowledgement rides on the next frame this
			// node writes (a reply, at the latest the next heartbeat);
			// every ackEvery frames or ackBytes bytes it wakes the writer
			// for it alone, so that the sender's window keeps moving.
			now := r.rcvTells-r.ackQueued >= ackEvery || r.ackBytes >= ackBytes
			if now || fr.buffered() == 0 {
				a.ackTo.Store(r.rcvTells)
				r.ackQueued, r.ackBytes = r.rcvTells, 0
				if now {
					a.notify()
				}
			}
		}
		if kind == frameHeartbeat {
			// A sender waiting for its window or its send budget sends
			// one: what this side owes it goes out at once.
			a.notify()
		}
	}
}

// readFailed ends the association on the connection's read error.
// readLoop's failures are functions of their own so that its frame, on
// the stack of every idle reader, stays small.
func (r *assocReader) readFailed(err error) {
	a := r.a
	r.flushBatch()
	switch {
	case errors.Is(err, io.ErrUnexpectedEOF):
		// The connection ended inside a frame: a broken link (a
		// resumable session resumes; the lost bytes are sent again), not
		// a malformed frame.
		a.lost(fmt.Errorf("connection to %s broke inside a frame: %w", a.label(), err))
	case errors.Is(err, ErrMalformed) || errors.Is(err, ErrFrameTooBig):
		a.n.gate.protocolError(a.label(), "", err)
		a.fail(&frameError{Peer: a.label(), Reason: err})
	case errors.Is(err, io.EOF):
		if a.dup.peerBye.Load() && a.mergedTo.Load() != nil {
			// A retiring connection whose peer said bye and has
			// half-closed: the writer's last acknowledgement goes first
			// (the peer reads on for it).
			r.awaitWriter()
		}
		a.lost(fmt.Errorf("connection to %s closed by the peer: %w", a.label(), io.EOF))
	default:
		a.lost(fmt.Errorf("read from %s: %w", a.label(), err))
	}
}

// frameFailed ends the association on a frame it could not handle.
func (r *assocReader) frameFailed(kind frameKind, err error) {
	a := r.a
	r.flushBatch()
	a.n.gate.protocolError(a.label(), kind.String(), err)
	a.fail(&frameError{Peer: a.label(), Kind: kind.String(), Reason: err})
}

// handleFrame acts on one frame read after the handshake. done means the
// reader must stop (the peer said goodbye).
func (r *assocReader) handleFrame(kind frameKind, b []byte) (done bool, err error) {
	a := r.a
	if kind.isTell() || a.peer.resumable && kind.sequenced() {
		r.rcvTells++
	}
	switch kind {
	case frameTell:
		return false, r.onTell(b, nil, len(b))
	case frameTellHeaders:
		hd, rest, err := parseHeaders(b)
		if err != nil {
			return false, err
		}
		return false, r.onTell(rest, hd, len(b))
	case frameWatch, frameUnwatch:
		return false, r.onWatch(kind, b)
	case frameTerminated:
		return false, r.onTerminated(b)
	case frameResolve:
		return false, r.onResolve(b)
	case frameResolved:
		return false, r.onResolved(b)
	case frameBye:
		err := r.onBye(b)
		a.mu.Lock()
		done := a.life.state == assocClosed
		a.mu.Unlock()
		return done, err
	case frameHeartbeat:
		return false, parseHeartbeat(b)
	case frameAck:
		return false, r.onAck(b)
	case frameResume:
		return false, r.onResume(b)
	case frameCredit:
		return false, r.onCredit(b)
	case frameShape:
		return false, r.onShape(b)
	case frameDraining:
		if err := parseDraining(b); err != nil {
			return false, err
		}
		t := a.lockTarget()
		t.peerDraining = true
		t.mu.Unlock()
		return false, nil
	case frameToken:
		return false, r.onToken(b)
	case frameHello, frameWelcome, frameReject, frameChallenge, frameProof, frameTokenChallenge:
		return false, fmt.Errorf("%w: %s after the handshake", ErrMalformed, kind)
	}
	return false, fmt.Errorf("%w: unknown frame kind %d", ErrMalformed, uint8(kind))
}

// onTell delivers the message of a tell frame's body b (with headers hd,
// from a tell with headers); size is the whole body's, headers included,
// counted against MailboxBytes.
func (r *assocReader) onTell(b []byte, hd Headers, size int) error {
	a := r.a
	n := a.n
	var th tellHeader // (set whole by parseTell)
	payload, err := parseTell(b, &th)
	if err != nil {
		return err
	}
	id := th.target
	var it *inTarget
	if th.targetInline {
		it = &inTarget{path: th.path, uuid: th.uuid}
		if h := n.actors.get(it.path, it.uuid); h != nil {
			it.target = h.local
			it.batch, _ = h.local.(batchTarget)
		}
		if id != 0 {
			if id != uint64(len(r.inTargets))+1 || id > maxTableSize {
				return fmt.Errorf("%w: target id %d defined out of sequence", ErrMalformed, id)
			}
			if len(it.path) > maxTableEntry {
				return fmt.Errorf("%w: a %d-byte target path entered in the table (at most %d)", ErrMalformed, len(it.path), maxTableEntry)
			}
			if a.peer.credit && n.cfg.mailboxCredit() > 0 {
				it.acct = a.due.newAcct(uint32(id), it.target)
			}
			r.inTargets = append(r.inTargets, *it)
		}
	} else {
		if id == 0 || id > uint64(len(r.inTargets)) {
			return fmt.Errorf("%w: undefined target id %d", ErrMalformed, id)
		}
		it = &r.inTargets[id-1]
	}
	credited := false
	if ac := it.acct; ac != nil {
		// Within the credit this node granted, a message is taken past
		// the mailbox's limit; past it (a sender that ignores its
		// credit), it is held to the limit like any other.
		a.due.received(ac)
		credited = ac.received <= ac.granted.Load()
	}
	tid := th.typ
	var ty *inType
	if th.typInline {
		ty = &inType{key: th.key, mt: typeByKey(th.key)}
		r.matchShape(ty)
		if tid != 0 {
			if tid != uint64(len(r.inTypes))+1 || tid > maxTableSize {
				return fmt.Errorf("%w: type id %d defined out of sequence", ErrMalformed, tid)
			}
			if len(ty.key) > maxTableEntry {
				return fmt.Errorf("%w: a %d-byte wire key entered in the table (at most %d)", ErrMalformed, len(ty.key), maxTableEntry)
			}
			r.inTypes = append(r.inTypes, *ty)
		}
	} else {
		if tid == 0 || tid > uint64(len(r.inTypes)) {
			return fmt.Errorf("%w: undefined type id %d", ErrMalformed, tid)
		}
		ty = &r.inTypes[tid-1]
	}
	if ty.mt == nil {
		n.dead.deadLetter(n.localRefString(it.path), nil, fmt.Errorf("%w: unknown wire key %q from %s", ErrNoWireKey, ty.key, a.label()))
		return nil
	}
	if ty.incompat != nil {
		r.incompatible(it.path, ty.mt, ty.incompat)
		return nil
	}
	if ty.conv != nil {
		msg, err := r.dec.convert(ty.mt, ty.conv, payload)
		if err != nil {
			r.incompatible(it.path, ty.mt, err)
			return nil
		}
		if ty.mt.stamped {
			msg = stampSender(msg, a.peer.uid)
		}
		return r.deliver(it, id, msg, size, credited, hd)
	}
	if bt := it.batch; bt != nil && ty.mt.plain && !ty.mt.stamped {
		// Decoded into the batch's memory, not a box of its own: an
		// actor whose protocol is this very type takes it without an
		// allocation (see cell.tellWireBatch).
		mt := ty.mt
		r.batchFor(bt, it.path, id) // (a flush empties the arena)
		words := mt.words
		at := len(r.arena)
		r.arena = slices.Grow(r.arena, words)[:at+words]
		clear(r.arena[at:])
		if err := r.dec.flatInto(mt, payload, unsafe.Pointer(&r.arena[at])); err != nil {
			r.arena = r.arena[:at]
			r.incompatible(it.path, mt, r.explain(mt, payload, err))
			return nil
		}
		r.batchPush(wireMsg{size: size, mt: mt, at: at, credited: credited, hd: hd})
		return nil
	}
	msg, err := r.dec.payload(ty.mt, payload)
	if err != nil {
		r.incompatible(it.path, ty.mt, r.explain(ty.mt, payload, err))
		return nil
	}
	if ty.mt.stamped {
		msg = stampSender(msg, a.peer.uid)
	}
	return r.deliver(it, id, msg, size, credited, hd)
}

// deliver hands a decoded message, with its headers hd if any, to its
// target (in a batch when the target takes them), or makes it a dead
// letter.
func (r *assocReader) deliver(it *inTarget, id uint64, msg any, size int, credited bool, hd Headers) error {
	a := r.a
	n := a.n
	if it.target == nil {
		n.dead.deadLetter(n.localRefString(it.path), msg, ErrNoSuchActor)
		return nil
	}
	if bt := it.batch; bt != nil {
		r.batchFor(bt, it.path, id)
		r.batchPush(wireMsg{msg: msg, size: size, credited: credited, hd: hd})
		return nil
	}
	var err error
	if ct, ok := it.target.(creditTeller); ok && credited {
		err = ct.tellCredited(msg, size, hd, true)
	} else {
		err = it.target.tellWire(msg, size, hd)
	}
	if err != nil {
		n.dead.deadLetter(n.localRefString(it.path), msg, err)
	}
	return nil
}

// explain says why payload does not decode as mt, given the decoder's
// error: the flat fast path does not track fields, so a flat type's
// payload is decoded once more, field by field, to name the one it broke
// at.
func (r *assocReader) explain(mt *msgType, payload []byte, err error) error {
	if mt.flat != nil {
		if why := r.dec.explain(mt, payload); why != nil {
			return why
		}
	}
	return err
}

// incompatible dead-letters a message for path whose frame was whole but
// whose payload does not decode as mt (why): one message, one fate — the
// session goes on (a peer running another version of the type must not
// lose its link). The first such message of each wire key in a session
// is logged.
func (r *assocReader) incompatible(path string, mt *msgType, why error) {
	a := r.a
	n := a.n
	err := fmt.Errorf("%w: %q from %s: %v", ErrIncompatibleMessage, mt.key, a.label(), why)
	if _, seen := r.incompatLogged[mt.key]; !seen && len(r.incompatLogged) < maxIncompatLogged {
		if r.incompatLogged == nil {
			r.incompatLogged = map[string]struct{}{}
		}
		r.incompatLogged[mt.key] = struct{}{}
		n.log.Warn("troupe: a message from a peer does not decode as the type with its wire key here; it is a dead letter (the peer may run another version of the type)",
			"peer", a.label(), "key", mt.key, "to", path, "err", why)
	}
	n.dead.deadLetter(n.localRefString(path), nil, err)
}

// onShape keeps a shape the peer sent for a wire key it is about to
// define (at most maxShapeSession bytes of them a session; past that, and
// for a key this node has not registered or that encodes itself, the
// shape is not kept: messages decode positionally).
func (r *assocReader) onShape(b []byte) error {
	key, shape, err := parseShapeFrame(b)
	if err != nil {
		return err
	}
	rs, err := parseShape(shape)
	if err != nil {
		return err // (a troupe peer sends only shapes that parse)
	}
	if mt := typeByKey(key); mt == nil || mt.fast {
		return nil
	}
	if old := r.inShapes[key]; old != nil {
		r.shapeBytes -= len(old.b) // (sent again: a message that failed to encode)
		delete(r.inShapes, key)
	}
	if r.shapeBytes+len(shape) > maxShapeSession || len(r.inShapes) >= maxTableSize {
		return nil
	}
	if r.inShapes == nil {
		r.inShapes = map[string]*rawShape{}
	}
	rs.b = append([]byte(nil), shape...) // (b is the read buffer's)
	r.inShapes[key] = rs
	r.shapeBytes += len(shape)
	return nil
}

// matchShape compares the shape the peer sent for ty's key, if any, with
// the registered type's: the same, and messages decode as always;
// different, and they decode through a conversion by field name, or are
// dead letters when a field's kind changed.
func (r *assocReader) matchShape(ty *inType) {
	rs := r.inShapes[ty.key]
	if rs == nil {
		return
	}
	delete(r.inShapes, ty.key)
	r.shapeBytes -= len(rs.b)
	mt := ty.mt
	if mt == nil || mt.fast || bytes.Equal(rs.b, mt.shape) {
		return
	}
	c, err := buildConv(rs, mt.t)
	if err != nil {
		ty.incompat = fmt.Errorf("the shapes differ: %w", err)
		return
	}
	ty.conv = c
}

// batchFor makes the batch one for bt at path, whose table id is id (0
// for a target defined inline), delivering the batch for another target
// first.
func (r *assocReader) batchFor(bt batchTarget, path string, id uint64) {
	if id != 0 && id == r.batchID {
		return // the same entry of the table: the same target
	}
	if r.batchTo != bt {
		r.flushBatch()
		r.batchTo, r.batchPath = bt, path
	}
	r.batchID = id
}

// batchPush adds m to the batch, for the target batchFor named.
func (r *assocReader) batchPush(m wireMsg) {
	r.batch = append(r.batch, m)
	if len(r.batch) >= maxBatch {
		r.flushBatch()
	}
}

// flushBatch delivers the batch; a message its target refuses becomes a
// dead letter, and the rest are offered again.
func (r *assocReader) flushBatch() {
	a := r.a
	ms := r.batch
	for len(ms) > 0 {
		k, err := r.batchTo.tellWireBatch(ms, r.arena)
		if k >= len(ms) {
			break
		}
		a.n.dead.deadLetter(a.n.localRefString(r.batchPath), ms[k].value(r.arena), err)
		ms = ms[k+1:]
	}
	clear(r.batch)
	r.batch, r.batchTo, r.batchID, r.arena = r.batch[:0], nil, 0, r.arena[:0]
}

// The handlers of the control frames, which the reader runs as it
// reads them.

func (r *assocReader) onWatch(kind frameKind, b []byte) error {
	a := r.a
	n := a.n
	wb, err := parseWatch(kind, b)
	if err != nil {
		return err
	}
	path, uuid, wpath := wb.path, wb.uuid, wb.watcher
	if len(wpath) > maxWatchPath {
		return fmt.Errorf("%w: a %d-byte watcher path (at most %d)", ErrMalformed, len(wpath), maxWatchPath)
	}
	watcher := &handle{node: n, key: refKey{node: a.peer.uid, path: wpath}, assoc: a}
	h := n.actors.get(path, uuid)
	var w inWatch
	if h != nil {
		// Kept, and ended, under the key of the actor that stops: a
		// watch without a uuid under its uuid, a watch of an adapter
		// under its actor's.
		tk := h.local.watchHandle().key
		w = inWatch{tk.path, tk.uuid, wpath}
		uuid = h.key.uuid
	}
	// The peer's watches live in one set, the session's that sends go to:
	// a connection retiring after a merge or a resume adds to the winner's.
	if kind == frameUnwatch {
		t := a.lockTarget()
		t.reqs.watchedBy.remove(w)
		t.mu.Unlock()
		if h != nil {
			h.local.watchHandle().local.sysPush(sysMsg{kind: sysUnwatch, ref: watcher})
		}
		return nil
	}
	reason := ErrNoSuchActor
	if h != nil {
		target := h.local.watchHandle()
		t := a.lockTarget()
		live := t.life.state < assocClosed
		var refused error
		if live && !t.reqs.watchedBy.add(w, target, n.cfg.MaxWatchesPerPeer) {
			refused = t.reqs.watchedBy.refusal(n.cfg.MaxWatchesPerPeer)
		}
		t.mu.Unlock()
		if refused != nil {
			a.signal(watcher, sysMsg{kind: sysTerminated, key: refKey{node: n.uid, path: path, uuid: uuid}, reason: refused})
			return nil
		}
		if live && target.local.sysPush(sysMsg{kind: sysWatch, ref: watcher}) {
			return nil
		}
		t = a.lockTarget()
		t.reqs.watchedBy.remove(w)
		t.mu.Unlock()
		reason = ErrActorStopped
	}
	reason = n.actors.stops.reason(path, uuid, reason) // (it stopped before the watch arrived: why)
	a.signal(watcher, sysMsg{kind: sysTerminated, key: refKey{node: n.uid, path: path, uuid: uuid}, reason: reason})
	return nil
}

func (r *assocReader) onTerminated(b []byte) error {
	a := r.a
	n := a.n
	wb, err := parseWatch(frameTerminated, b)
	if err != nil {
		return err
	}
	key := refKey{node: a.peer.uid, path: wb.path, uuid: wb.uuid}
	w := n.actors.get(wb.watcher, UUID{})
	if w == nil {
		return nil // the watcher has stopped meanwhile
	}
	wh := w.local.watchHandle()
	t := a.lockTarget()
	delete(t.reqs.watches, watchPair{key, wh})
	t.mu.Unlock()
	wh.local.sysPush(sysMsg{kind: sysTerminated, key: key, reason: reasonErr(wb.code, wb.text)})
	return nil
}

func (r *assocReader) onResolve(b []byte) error {
	a := r.a
	rq, err := parseResolve(b)
	if err != nil {
		return err
	}
	ans := resolveAnswer{status: resolveNoSuchActor}
	// A handle without a protocol (a lookup's watcher of a found actor,
	// at /system/$found…) takes no messages: no actor to resolve.
	if h := a.n.actors.get(rq.path, UUID{}); h != nil && h.local.protocol() != nil {
		ans = resolveAnswer{status: resolveOK, uuid: h.key.uuid, proto: protocolName(h.local.protocol())}
		if !sameProtocol(rq.proto, h.local.protocol()) {
			ans.status = resolveWrongType
		}
	}
	a.answer(appendResolved(nil, rq.id, ans))
	return nil
}

func (r *assocReader) onResolved(b []byte) error {
	a := r.a
	id, ans, err := parseResolved(b)
	if err != nil {
		return err
	}
	t := a.lockTarget()
	ch := t.reqs.resolves[id]
	delete(t.reqs.resolves, id)
	t.mu.Unlock()
	if ch != nil {
		ch <- ans
	}
	return nil
}

func (r *assocReader) onBye(b []byte) error {
	a := r.a
	code, text, err := parseBye(b)
	if err != nil {
		return err
	}
	if len(text) > maxByeText {
		text = text[:maxByeText]
	}
	switch code {
	case byeGaveUp:
		// The peer declared this node unreachable: this side learns it
		// now rather than at its own window, and ends the session as it
		// would have then.
		a.fail(fmt.Errorf("%w: %s gave up on this node: %s", ErrQuarantinedByPeer, a.label(), text))
		return nil
	case byeRefused:
		// The dialer refused the connection this node welcomed: nothing
		// was ever sent over it, and the dialer is not unreachable.
		a.fail(fmt.Errorf("%w: %w: %s", errSessionReplaced, ErrRejected, text))
		return nil
	case byeDuplicate:
	default:
		a.fail(ErrPeerLeft)
		return nil
	}
	a.mu.Lock()
	retired := a.life.mergedInto != nil
	a.mu.Unlock()
	if retired {
		// The peer's duplicate-bye, after ours or beside it: it writes no
		// more here. The writer acknowledges everything read (the peer
		// may have written frames after it last acknowledged ours, and
		// before it read our bye) and half-closes; this side reads on
		// until the peer does the same, taking its last acknowledgement,
		// so that nothing the peer read is reported unconfirmed.
		r.peerSaidBye()
		a.conn.SetReadDeadline(time.Now().Add(retireDrain))
		return nil
	}
	// The peer keeps another connection with us: move over to it, and
	// answer with our own bye once what we queued here is written.
	n := a.n
	n.peers.mu.Lock()
	w := n.peers.byUID[a.peer.uid]
	if w == a {
		w = nil
		delete(n.peers.byUID, a.peer.uid)
	}
	if w == nil {
		n.peers.awaiting[a.peer.uid] = append(n.peers.awaiting[a.peer.uid], a)
	}
	n.peers.mu.Unlock()
	if w != nil {
		a.mergeInto(w)
	}
	r.peerSaidBye()
	a.conn.SetReadDeadline(time.Now().Add(retireDrain))
	return nil
}

// awaitWriter waits for the writer of a retiring connection to write its
// last ack and exit. Bounded: a writer stuck on a full window never gets
// there.
func (r *assocReader) awaitWriter() {
	t := time.NewTimer(retireDrain)
	defer t.Stop()
	select {
	case <-r.a.writerDone:
	case <-t.C:
	}
}

// peerSaidBye has the writer of this retiring connection end with an
// acknowledgement of every frame read, now that the peer's
// duplicate-bye has come and no frame follows it.
func (r *assocReader) peerSaidBye() {
	a := r.a
	a.ackTo.Store(r.rcvTells)
	r.ackQueued, r.ackBytes = r.rcvTells, 0
	a.dup.peerBye.Store(true)
	a.notify()
}

// onAck releases the messages the peer confirmed it received.
func (r *assocReader) onAck(b []byte) error {
	a := r.a
	count, err := parseAck(b)
	if err != nil {
		return err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.life.state == assocClosed {
		return nil // the session ended; its unacknowledged messages are reported
	}
	if count <= a.win.acked {
		return nil // nothing new (an acknowledgement may repeat what a resume said)
	}
	if count-a.win.acked > uint64(a.win.unackedSeq(a.peer.resumable)) {
		if a.life.mergedInto != nil {
			return nil
		}
		return fmt.Errorf("%w: acknowledgement of %d frames, %d were sent", ErrMalformed, count, a.win.acked+uint64(a.win.unackedSeq(a.peer.resumable)))
	}
	a.win.release(int(count-a.win.acked), a.peer.resumable)
	a.win.acked = count
	a.win.ackMoved = time.Now()
	if a.win.unackedSeq(a.peer.resumable) == 0 && a.life.byeOnAck {
		a.notify() // the writer may say bye now
	}
	if a.win.stalled && a.win.unacked.bytes < a.n.cfg.UnackedLimit {
		a.win.stalled = false
		a.notify() // the window is open again
	}
	if a.room != nil && !a.full() {
		a.wakeSenders()
	}
	return nil
}

// onResume acts on the peer's resume frame: it releases what the peer
// confirmed, and queues the rest to be sent again, in order, ahead of
// everything else.
func (r *assocReader) onResume(b []byte) error {
	a := r.a
	count, err := parseResume(b)
	if err != nil {
		return err
	}
	a.mu.Lock()
	if !a.life.holdQueue {
		a.mu.Unlock()
		return fmt.Errorf("%w: resume on a session that was not resumed", ErrMalformed)
	}
	if count < a.win.acked || count-a.win.acked > uint64(a.win.unackedSeq(a.peer.resumable)) {
		a.mu.Unlock()
		return fmt.Errorf("%w: resume after %d frames, %d were sent", ErrMalformed, count, a.win.acked+uint64(a.win.unackedSeq(a.peer.resumable)))
	}
	a.win.release(int(count-a.win.acked), a.peer.resumable)
	resend := a.win.unackedSeq(a.peer.resumable)
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

// onCredit takes the peer's credit frame: for target 0, how many messages
// its mailboxes take (the session's first frame); otherwise a grant of
// more for that target. It wakes the senders waiting for credit.
func (r *assocReader) onCredit(b []byte) error {
	a := r.a
	id, n, err := parseCredit(b)
	if err != nil {
		return err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if id > uint64(len(a.enc.sent)) || n > maxCredit || id == 0 && a.enc.peerMailbox != 0 {
		return fmt.Errorf("%w: credit of %d for target %d (%d defined)", ErrMalformed, n, id, len(a.enc.sent))
	}
	if id == 0 {
		a.enc.peerMailbox = int64(n)
		if n == 0 {
			a.enc.peerMailbox = -1 // no limit there
		}
	} else {
		a.enc.granted[id-1] = min(a.enc.granted[id-1]+int64(n), 4*maxCredit)
	}
	a.wakeCredited()
	if a.queue.len() > 0 {
		a.notify() // a Send's record may wait at the head for this
	}
	return nil
}

// onToken keeps the peer's session token, with the session. A token that
// comes on a connection that founded the session or whose peer proved the
// session's token (a.open.sendToken: it is the peer's) replaces the one kept:
// the peer may have drawn a new one (it gave the session up and founded
// a new one there, while this node's side of it won on here), and it
// proves its next claims with that. On any other connection the first
// token the session receives stays.
func (r *assocReader) onToken(b []byte) error {
	a := r.a
	tok, err := parseToken(b)
	if err != nil {
		return err
	}
	t := a.lockTarget()
	if t.peerToken == nil || a.open.sendToken {
		t.peerToken = append([]byte(nil), tok...)
	}
	t.mu.Unlock()
	return nil
}
