package troupe

import (
	"bytes"
	"context"
	"fmt"
	"reflect"
	"runtime"
	"slices"
	"time"
	"unsafe"
)

// Resolve returns a ref to the actor named by ref (a string made by
// [FormatRef], such as "troupe://127.0.0.1:7001/user/worker"), which may
// live on n itself or on another node. It dials the node if n has no
// association with it yet, and asks it for the actor.
//
// Resolve fails with an error wrapping [ErrNoSuchActor] when no actor lives
// at that path, [ErrWrongType] when the actor's protocol is not T (the
// nodes compare T's wire key if it has one, else its package path
// and name, troupe's own types by name alone wherever the package lives),
// the dial or handshake error when the node cannot be reached, ctx.Err()
// when ctx ends first, [ErrPeerShuttingDown] when that node is shutting
// down (find the name again), and [ErrNodeClosed] when n closes (for a
// handler that a Shutdown lets finish, when its Context is cancelled).
// The returned ref is bound to the association it was resolved over; if
// that association ends, resolve again.
func Resolve[T any](ctx context.Context, n *Node, ref string) (Ref[T], error) {
	addr, path, err := ParseRef(ref)
	if err != nil {
		return Ref[T]{}, err
	}
	r, err := resolveAt[T](ctx, n, addr, path)
	if err != nil {
		return Ref[T]{}, fmt.Errorf("resolve %s: %w", ref, err)
	}
	return r, nil
}

// resolveAt is [Resolve] for an address and path already parsed; its
// errors do not repeat them, so that each caller names what it knows.
func resolveAt[T any](ctx context.Context, n *Node, addr Addr, path string) (Ref[T], error) {
	want := reflect.TypeFor[T]()
	if n.isOwnAddr(addr) {
		h := n.actors.get(path, UUID{})
		if h == nil || h.local.protocol() == nil {
			return Ref[T]{}, ErrNoSuchActor // (nil: a lookup's watcher, no actor)
		}
		if got := h.local.protocol(); got != want {
			return Ref[T]{}, fmt.Errorf("%w: the actor accepts %s, not %s", ErrWrongType, got, want)
		}
		return Ref[T]{h: h}, nil
	}
	a, err := n.peers.assocFor(addr)
	if err != nil {
		return Ref[T]{}, err
	}
	ans, err := a.resolve(ctx, path, protocolName(want))
	if err != nil {
		return Ref[T]{}, err
	}
	switch {
	case ans.status == resolveOK:
	case ans.status == resolveNoSuchActor:
		return Ref[T]{}, ErrNoSuchActor
	case ans.status == resolveWrongType && sameProtocol(ans.proto, want):
		// a node built from an earlier copy of the package, at this
		// one's path, which names troupe's types by that path
	default:
		return Ref[T]{}, fmt.Errorf("%w: the actor accepts %s, not %s", ErrWrongType, ans.proto, protocolName(want))
	}
	t := a.lockTarget()
	peer := t.peer.uid
	t.mu.Unlock()
	return Ref[T]{h: &handle{node: n, key: refKey{node: peer, path: path, uuid: ans.uuid}, assoc: a}}, nil
}

// awaitUp waits until the association's handshake is done.
func (a *assoc) awaitUp(ctx context.Context) error {
	a.mu.Lock()
	if a.life.state < assocLeaving {
		a.use()
	}
	a.mu.Unlock()
	select {
	case <-a.ready:
	case <-ctx.Done():
		return ctx.Err()
	case <-a.n.lc.workDone():
		return ErrNodeClosed
	}
	if err := a.failure(); err != nil {
		return err
	}
	return nil
}

// resolve asks the peer for the actor at path.
func (a *assoc) resolve(ctx context.Context, path, proto string) (resolveAnswer, error) {
	if err := a.awaitUp(ctx); err != nil {
		return resolveAnswer{}, err
	}
	ch := make(chan resolveAnswer, 1)
	t := a.lockTarget()
	if t.life.state >= assocLeaving {
		t.mu.Unlock()
		return resolveAnswer{}, t.failure()
	}
	if t.peerDraining && isWork(path) {
		err := t.drainingError()
		t.mu.Unlock()
		return resolveAnswer{}, err
	}
	id := a.n.ids.req.Add(1)
	t.reqs.resolves[id] = ch
	t.mu.Unlock()
	t.control(appendResolve(nil, resolveBody{id: id, path: path, proto: proto}))
	select {
	case ans := <-ch:
		return ans, ans.err
	case <-ctx.Done():
		t = a.lockTarget() // the request may have moved with a merge
		delete(t.reqs.resolves, id)
		t.mu.Unlock()
		return resolveAnswer{}, ctx.Err()
	case <-a.n.lc.workDone():
		return resolveAnswer{}, ErrNodeClosed
	}
}

// handleFrame acts on one frame read after the handshake. done means the
// reader must stop (the peer said goodbye).
func (a *assoc) handleFrame(kind frameKind, b []byte) (done bool, err error) {
	if kind.isTell() || a.peer.resumable && kind.sequenced() {
		a.rd.rcvTells++
	}
	switch kind {
	case frameTell:
		return false, a.onTell(b, nil, len(b))
	case frameTellHeaders:
		hd, rest, err := parseHeaders(b)
		if err != nil {
			return false, err
		}
		return false, a.onTell(rest, hd, len(b))
	case frameWatch, frameUnwatch:
		return false, a.onWatch(kind, b)
	case frameTerminated:
		return false, a.onTerminated(b)
	case frameResolve:
		return false, a.onResolve(b)
	case frameResolved:
		return false, a.onResolved(b)
	case frameBye:
		err := a.onBye(b)
		a.mu.Lock()
		done := a.life.state == assocClosed
		a.mu.Unlock()
		return done, err
	case frameHeartbeat:
		return false, parseHeartbeat(b)
	case frameAck:
		return false, a.onAck(b)
	case frameResume:
		return false, a.onResume(b)
	case frameCredit:
		return false, a.onCredit(b)
	case frameShape:
		return false, a.onShape(b)
	case frameDraining:
		if err := parseDraining(b); err != nil {
			return false, err
		}
		t := a.lockTarget()
		t.peerDraining = true
		t.mu.Unlock()
		return false, nil
	case frameToken:
		return false, a.onToken(b)
	case frameHello, frameWelcome, frameReject, frameChallenge, frameProof, frameTokenChallenge:
		return false, fmt.Errorf("%w: %s after the handshake", ErrMalformed, kind)
	}
	return false, fmt.Errorf("%w: unknown frame kind %d", ErrMalformed, uint8(kind))
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

// onTell delivers the message of a tell frame's body b (with headers hd,
// from a tell with headers); size is the whole body's, headers included,
// counted against MailboxBytes.
func (a *assoc) onTell(b []byte, hd Headers, size int) error {
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
			if id != uint64(len(a.rd.inTargets))+1 || id > maxTableSize {
				return fmt.Errorf("%w: target id %d defined out of sequence", ErrMalformed, id)
			}
			if len(it.path) > maxTableEntry {
				return fmt.Errorf("%w: a %d-byte target path entered in the table (at most %d)", ErrMalformed, len(it.path), maxTableEntry)
			}
			if a.peer.credit && n.mailboxCredit() > 0 {
				it.acct = a.newCreditAcct(uint32(id), it.target)
			}
			a.rd.inTargets = append(a.rd.inTargets, *it)
		}
	} else {
		if id == 0 || id > uint64(len(a.rd.inTargets)) {
			return fmt.Errorf("%w: undefined target id %d", ErrMalformed, id)
		}
		it = &a.rd.inTargets[id-1]
	}
	credited := false
	if ac := it.acct; ac != nil {
		// Within the credit this node granted, a message is taken past
		// the mailbox's limit; past it (a sender that ignores its
		// credit), it is held to the limit like any other.
		a.creditReceived(ac)
		credited = ac.received <= ac.granted.Load()
	}
	tid := th.typ
	var ty *inType
	if th.typInline {
		ty = &inType{key: th.key, mt: typeByKey(th.key)}
		a.matchShape(ty)
		if tid != 0 {
			if tid != uint64(len(a.rd.inTypes))+1 || tid > maxTableSize {
				return fmt.Errorf("%w: type id %d defined out of sequence", ErrMalformed, tid)
			}
			if len(ty.key) > maxTableEntry {
				return fmt.Errorf("%w: a %d-byte wire key entered in the table (at most %d)", ErrMalformed, len(ty.key), maxTableEntry)
			}
			a.rd.inTypes = append(a.rd.inTypes, *ty)
		}
	} else {
		if tid == 0 || tid > uint64(len(a.rd.inTypes)) {
			return fmt.Errorf("%w: undefined type id %d", ErrMalformed, tid)
		}
		ty = &a.rd.inTypes[tid-1]
	}
	if ty.mt == nil {
		n.dead.deadLetter(n.localRefString(it.path), nil, fmt.Errorf("%w: unknown wire key %q from %s", ErrNoWireKey, ty.key, a.label()))
		return nil
	}
	if ty.incompat != nil {
		a.incompatible(it.path, ty.mt, ty.incompat)
		return nil
	}
	if ty.conv != nil {
		msg, err := a.rd.dec.convert(ty.mt, ty.conv, payload)
		if err != nil {
			a.incompatible(it.path, ty.mt, err)
			return nil
		}
		if ty.mt.stamped {
			msg = stampSender(msg, a.peer.uid)
		}
		return a.deliver(it, id, msg, size, credited, hd)
	}
	if bt := it.batch; bt != nil && ty.mt.plain && !ty.mt.stamped {
		// Decoded into the batch's memory, not a box of its own: an
		// actor whose protocol is this very type takes it without an
		// allocation (see cell.tellWireBatch).
		mt := ty.mt
		a.batchFor(bt, it.path, id) // (a flush empties the arena)
		words := mt.words
		at := len(a.rd.arena)
		a.rd.arena = slices.Grow(a.rd.arena, words)[:at+words]
		clear(a.rd.arena[at:])
		if err := a.rd.dec.flatInto(mt, payload, unsafe.Pointer(&a.rd.arena[at])); err != nil {
			a.rd.arena = a.rd.arena[:at]
			a.incompatible(it.path, mt, a.explain(mt, payload, err))
			return nil
		}
		a.batchPush(wireMsg{size: size, mt: mt, at: at, credited: credited, hd: hd})
		return nil
	}
	msg, err := a.rd.dec.payload(ty.mt, payload)
	if err != nil {
		a.incompatible(it.path, ty.mt, a.explain(ty.mt, payload, err))
		return nil
	}
	if ty.mt.stamped {
		msg = stampSender(msg, a.peer.uid)
	}
	return a.deliver(it, id, msg, size, credited, hd)
}

// deliver hands a decoded message, with its headers hd if any, to its
// target (in a batch when the target takes them), or makes it a dead
// letter.
func (a *assoc) deliver(it *inTarget, id uint64, msg any, size int, credited bool, hd Headers) error {
	n := a.n
	if it.target == nil {
		n.dead.deadLetter(n.localRefString(it.path), msg, ErrNoSuchActor)
		return nil
	}
	if bt := it.batch; bt != nil {
		a.batchFor(bt, it.path, id)
		a.batchPush(wireMsg{msg: msg, size: size, credited: credited, hd: hd})
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
func (a *assoc) explain(mt *msgType, payload []byte, err error) error {
	if mt.flat != nil {
		if why := a.rd.dec.explain(mt, payload); why != nil {
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
func (a *assoc) incompatible(path string, mt *msgType, why error) {
	n := a.n
	err := fmt.Errorf("%w: %q from %s: %v", ErrIncompatibleMessage, mt.key, a.label(), why)
	if _, seen := a.rd.incompatLogged[mt.key]; !seen && len(a.rd.incompatLogged) < maxIncompatLogged {
		if a.rd.incompatLogged == nil {
			a.rd.incompatLogged = map[string]struct{}{}
		}
		a.rd.incompatLogged[mt.key] = struct{}{}
		n.log.Warn("troupe: a message from a peer does not decode as the type with its wire key here; it is a dead letter (the peer may run another version of the type)",
			"peer", a.label(), "key", mt.key, "to", path, "err", why)
	}
	n.dead.deadLetter(n.localRefString(path), nil, err)
}

// onShape keeps a shape the peer sent for a wire key it is about to
// define (at most maxShapeSession bytes of them a session; past that, and
// for a key this node has not registered or that encodes itself, the
// shape is not kept: messages decode positionally).
func (a *assoc) onShape(b []byte) error {
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
	if old := a.rd.inShapes[key]; old != nil {
		a.rd.shapeBytes -= len(old.b) // (sent again: a message that failed to encode)
		delete(a.rd.inShapes, key)
	}
	if a.rd.shapeBytes+len(shape) > maxShapeSession || len(a.rd.inShapes) >= maxTableSize {
		return nil
	}
	if a.rd.inShapes == nil {
		a.rd.inShapes = map[string]*rawShape{}
	}
	rs.b = append([]byte(nil), shape...) // (b is the read buffer's)
	a.rd.inShapes[key] = rs
	a.rd.shapeBytes += len(shape)
	return nil
}

// matchShape compares the shape the peer sent for ty's key, if any, with
// the registered type's: the same, and messages decode as always;
// different, and they decode through a conversion by field name, or are
// dead letters when a field's kind changed.
func (a *assoc) matchShape(ty *inType) {
	rs := a.rd.inShapes[ty.key]
	if rs == nil {
		return
	}
	delete(a.rd.inShapes, ty.key)
	a.rd.shapeBytes -= len(rs.b)
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

// batchFor makes the batch one for bt at path, whose table id is id (0
// for a target defined inline), delivering the batch for another target
// first.
func (a *assoc) batchFor(bt batchTarget, path string, id uint64) {
	if id != 0 && id == a.rd.batchID {
		return // the same entry of the table: the same target
	}
	if a.rd.batchTo != bt {
		a.flushBatch()
		a.rd.batchTo, a.rd.batchPath = bt, path
	}
	a.rd.batchID = id
}

// batchPush adds m to the batch, for the target batchFor named.
func (a *assoc) batchPush(m wireMsg) {
	a.rd.batch = append(a.rd.batch, m)
	if len(a.rd.batch) >= maxBatch {
		a.flushBatch()
	}
}

// flushBatch delivers the batch; a message its target refuses becomes a
// dead letter, and the rest are offered again.
func (a *assoc) flushBatch() {
	ms := a.rd.batch
	for len(ms) > 0 {
		k, err := a.rd.batchTo.tellWireBatch(ms, a.rd.arena)
		if k >= len(ms) {
			break
		}
		a.n.dead.deadLetter(a.n.localRefString(a.rd.batchPath), ms[k].value(a.rd.arena), err)
		ms = ms[k+1:]
	}
	clear(a.rd.batch)
	a.rd.batch, a.rd.batchTo, a.rd.batchID, a.rd.arena = a.rd.batch[:0], nil, 0, a.rd.arena[:0]
}

// localRefString is the ref string of a local path, for dead letters.
func (n *Node) localRefString(path string) string {
	if len(n.addrList()) > 0 {
		return FormatRef(n.addrList()[0], path)
	}
	return "troupe:" + path
}

func (a *assoc) onTerminated(b []byte) error {
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

func (a *assoc) onResolve(b []byte) error {
	r, err := parseResolve(b)
	if err != nil {
		return err
	}
	ans := resolveAnswer{status: resolveNoSuchActor}
	// A handle without a protocol (a lookup's watcher of a found actor,
	// at /system/$found…) takes no messages: no actor to resolve.
	if h := a.n.actors.get(r.path, UUID{}); h != nil && h.local.protocol() != nil {
		ans = resolveAnswer{status: resolveOK, uuid: h.key.uuid, proto: protocolName(h.local.protocol())}
		if !sameProtocol(r.proto, h.local.protocol()) {
			ans.status = resolveWrongType
		}
	}
	a.answer(appendResolved(nil, r.id, ans))
	return nil
}

func (a *assoc) onResolved(b []byte) error {
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

func (a *assoc) onBye(b []byte) error {
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
		// The answer to our own duplicate-bye: the connection is drained.
		<-a.writerDone
		a.fail(nil)
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
	a.conn.SetReadDeadline(time.Now().Add(retireDrain))
	return nil
}

// bindRef binds a ref read from a payload that came over a: to an actor
// of this node, to the peer's actor through a, or to a third node's actor
// through an association that dials on first use (never from the reader).
func (a *assoc) bindRef(kind byte, key refKey, addr string) *handle {
	return a.bindRefFrom(kind, key, addr, a.peer.uid)
}

// bindRefFrom is bindRef, a new node's binding charged to the peer from
// once it dials (see [Config.MaxRefDialsPerPeer]).
func (a *assoc) bindRefFrom(kind byte, key refKey, addr string, from NodeUID) *handle {
	n := a.n
	if kind == refThird && key.node == n.uid {
		kind = refReceiver
	}
	if kind == refThird && key.node == a.peer.uid {
		kind = refSender
	}
	switch kind {
	case refReceiver:
		key.node = n.uid
		if h := n.actors.get(key.path, key.uuid); h != nil {
			return h
		}
		return deadHandle(n, key)
	case refSender:
		key.node = a.peer.uid
		return &handle{node: n, key: key, assoc: a}
	}
	ad, err := ParseAddr(addr)
	if err != nil || n.isOwnAddr(ad) {
		return deadHandle(n, key)
	}
	via, held, err := n.peers.assocHeld(ad, false, from)
	if err != nil {
		return deadHandle(n, key)
	}
	h := &handle{node: n, key: key, assoc: via}
	if held {
		runtime.AddCleanup(h, n.peers.releaseBinding, via)
	}
	return h
}

// deadTarget stands for an actor that does not exist: every message to it
// is a dead letter, and a watch of it terminates at once.
type deadTarget struct{ h *handle }

func deadHandle(n *Node, key refKey) *handle {
	d := &deadTarget{}
	d.h = &handle{node: n, key: key, local: d}
	return d.h
}

func (d *deadTarget) tellAny(any) error                { return ErrNoSuchActor }
func (d *deadTarget) tellWire(any, int, Headers) error { return ErrNoSuchActor }
func (d *deadTarget) sysPush(sysMsg) bool              { return false }
func (d *deadTarget) watchHandle() *handle             { return d.h }
func (d *deadTarget) protocol() reflect.Type           { return nil }
