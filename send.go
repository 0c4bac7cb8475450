package troupe

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"sync"
	"unsafe"
)

// The send path: how a message for a remote actor becomes a frame in its
// association's chain. The payload is encoded on the sender's goroutine
// with no lock held; under the association's lock only the table ids are
// assigned, the credit and the budgets checked, and the frame copied in.
// Before a session's writer starts, messages wait as records.
// outTables is a session's outbound side as the senders see it, guarded
// by the association's lock (mu): the tables of the types and targets
// defined for the peer, the credit the peer granted, and the encoder's
// scratch. The senders encode; a connection resuming the session takes
// the tables over (takeOver, assoc_transition.go).
type outTables struct {
	// types and targets give the ids defined in the session; targetKeys
	// and typeList are the same by id less one, to decode a held frame
	// again for its dead letter.
	types      map[*msgType]uint32
	targets    map[refKey]uint32
	targetKeys []refKey
	typeList   []*msgType
	// Credit (credit.go): how many messages the peer's mailboxes take (0
	// not yet known, -1 no limit), and, for each target in targetKeys,
	// the messages sent to it and the credit granted for it besides that.
	peerMailbox int64
	sent        []int64
	granted     []int64
	lastType    *msgType // the type of the last message encoded, if in the table
	lastTypeID  uint32
	hdr         []byte // scratch for a tell's header
}

// tell queues a user message for the remote actor h, or says why it
// cannot: a full send budget is ErrSendQueueFull.
func (a *assoc) tell(h *handle, msg any) error { return a.send(nil, h, msg, nil) }

// send queues a user message for the remote actor h. Its payload is
// encoded on the caller's goroutine with no lock held (a WireMarshaler's
// AppendWire may send, even to the same peer); under the association's
// lock only the table ids are assigned and the frame is copied in.
// Without ctx a full send budget is an error; with one, send waits for
// room until ctx ends: while the session holds SendQueueLimit bytes,
// until the peer acknowledges enough of them or the session ends (its
// failure is returned). hd are the message's headers, if any: a peer
// that does not take them (an older troupe) gets the message without.
func (a *assoc) send(ctx context.Context, h *handle, msg any, hd Headers) error {
	mt := typeOfValue(msg)
	if mt == nil {
		return fmt.Errorf("%w: %T (call SetWireKey to send it to another node)", ErrNoWireKey, msg)
	}
	var pb *payloadBuf
	defer func() {
		if pb != nil {
			pb.release()
		}
	}()
	for {
		t := a.lockTarget()
		if t.life.state >= assocLeaving {
			t.mu.Unlock()
			return t.failure()
		}
		t.use()
		if t.full() {
			if ctx == nil {
				held := t.held()
				t.mu.Unlock()
				return fmt.Errorf("%w: %d bytes held for %s (Config.SendQueueLimit)", ErrSendQueueFull, held, t.label())
			}
			if err := t.await(ctx, t.waitRoom()); err != nil {
				return err
			}
			continue
		}
		if ctx != nil && t.waitsForCredit(h) {
			// The remote actor's mailbox is full (or its node's limit not
			// known yet): wait for its node to grant more (other actors
			// on the connection go on).
			if err := t.await(ctx, t.waitCredit()); err != nil {
				return err
			}
			continue
		}
		if ctx == nil && t.peer.credit && t.enc.peerMailbox > 0 {
			if id, ok := t.enc.targets[h.key]; ok && !t.enc.hasCredit(id) {
				t.mu.Unlock()
				return errNoCredit // (without encoding what would be refused)
			}
		}
		if !t.encodesNow() {
			// The writer has not started: the peer's uid, which refs in
			// the payload are encoded against, may not be known yet (or
			// records wait before this one: it waits behind them, with
			// its payload if it was encoded already).
			t.queue.push(outRec{h: h, msg: msg, mt: mt, pb: pb, wait: ctx != nil, hd: hd})
			pb = nil
			first := t.queue.len() == 1 && t.out.frames == 0
			t.mu.Unlock()
			if first {
				t.notify()
			}
			return nil
		}
		if pb == nil {
			peer := t.peer.uid
			t.mu.Unlock()
			var err error
			if pb, err = encodeFor(peer, mt, msg); err != nil {
				return err
			}
			continue // the session may have moved on meanwhile
		}
		idle := t.out.frames == 0
		err := t.encodeTell(h, mt, pb.b, nil, hd)
		if err == errNoCredit && ctx != nil {
			// The remote actor's mailbox is full: wait for its node to
			// grant more (other actors on the connection go on).
			if err := t.await(ctx, t.waitCredit()); err != nil {
				return err
			}
			continue
		}
		// A frame is one or two (a shape goes before a type's first
		// message): the writer is woken when there was nothing before.
		first := idle && t.out.frames > 0
		t.mu.Unlock()
		if first {
			t.notify()
		}
		return err
	}
}

// await unlocks a (mu held) and waits for ch to close: nil then, or
// why the wait ended first.
func (a *assoc) await(ctx context.Context, ch chan struct{}) error {
	a.mu.Unlock()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-a.n.lc.workDone():
		return ErrNodeClosed
	}
}

// tellFlat encodes a flat message for the remote actor h from p, where
// the caller's value lies, if the session encodes now and has room, and
// reports whether it did; otherwise nothing happened (the caller takes
// the general way, which queues, waits or reports). A flat message runs
// no user code: it is encoded under the lock, straight into the chain.
func (a *assoc) tellFlat(h *handle, mt *msgType, p unsafe.Pointer) bool {
	t := a.lockTarget()
	if t.life.state >= assocLeaving || !t.encodesNow() || t.full() {
		t.mu.Unlock()
		return false
	}
	idle := t.out.frames == 0
	if t.encodeTell(h, mt, nil, p, nil) != nil {
		t.mu.Unlock()
		return false
	}
	first := idle && t.out.frames > 0
	t.mu.Unlock()
	if first {
		t.notify()
	}
	return true
}

// payloadBuf is the scratch space a sender encodes a payload into, on
// its own goroutine and with no lock held.
type payloadBuf struct {
	b   []byte
	enc encoder
}

var payloadPool = sync.Pool{New: func() any { return new(payloadBuf) }}

// payloadKeep is the largest scratch buffer kept in the pool.
const payloadKeep = 256 << 10

// encodeFor encodes msg, of registered type mt, for the node peer.
// The temporary refs it carries (ask replies) are made reachable by path
// before it returns, since the frame may be written at any time after.
func encodeFor(peer NodeUID, mt *msgType, msg any) (pb *payloadBuf, err error) {
	pb = payloadPool.Get().(*payloadBuf)
	pb.enc.peer = peer
	defer func() {
		if v := recover(); v != nil {
			// A panicking AppendWire: the message's fate, reported as
			// its dead letter, on whichever goroutine encoded it.
			pb, err = nil, fmt.Errorf("troupe: AppendWire of a %s panicked: %v", mt.key, v)
		}
	}()
	pb.b, err = pb.enc.payload(pb.b[:0], mt, msg)
	if err != nil {
		pb.release()
		return nil, err
	}
	for _, x := range pb.enc.exports {
		x.exportTemp()
	}
	return pb, nil
}

func (pb *payloadBuf) release() {
	clear(pb.enc.exports)
	pb.enc.exports = pb.enc.exports[:0]
	if cap(pb.b) > payloadKeep {
		pb.b = nil
	}
	payloadPool.Put(pb)
}

// encodesNow says whether a frame may be encoded into out at once: the
// writer has started, and no records wait to be encoded before it (mu
// held).
func (a *assoc) encodesNow() bool { return a.life.encoding && a.queue.len() == 0 }

// recordCharge is what a frame queued as a record (before the session's
// writer has started) counts against SendQueueLimit: it is not encoded
// yet, so its size is not known.
const recordCharge = 64

// answerBudget bounds the answers to the peer's requests (resolved,
// terminated) waiting to be written: a peer that asks more than it reads
// is ended with a protocol error, not allowed to grow this node's memory.
const answerBudget = 1 << 20

// held is what the session holds against SendQueueLimit, in bytes: frames
// waiting to be written and frames the peer has not acknowledged (mu
// held). Queued answers count at their size, other records at
// recordCharge.
func (a *assoc) held() int {
	q := &a.queue
	return a.out.bytes + a.win.unacked.bytes + (q.len()-q.answers)*recordCharge + q.answerBytes
}

// full says whether a user message must wait for room (mu held).
func (a *assoc) full() bool {
	lim := a.n.cfg.SendQueueLimit
	return lim > 0 && a.held() >= lim
}

// waitRoom returns a channel closed when there may be room again (mu
// held).
func (a *assoc) waitRoom() chan struct{} {
	if a.room == nil {
		a.room = make(chan struct{})
		// A heartbeat asks the peer to acknowledge what it has read at
		// once, not with its next frame: room comes from that.
		a.beat.Store(true)
		a.notify()
	}
	return a.room
}

// pushControl queues the body of a control frame (mu held): encoded into
// out at once once the writer has started, as a record before.
func (a *assoc) pushControl(body []byte) {
	if !a.encodesNow() {
		// (a copy: the caller's body may be its own scratch space)
		a.queue.push(outRec{msg: ctlFrame(slices.Clone(body))})
		return
	}
	a.encodeControl(body, false)
}

// control queues a control frame of this node's own (a watch, an
// unwatch, a resolve); false if the session has ended.
func (a *assoc) control(body []byte) bool {
	t := a.lockTarget()
	if t.life.state >= assocEnding {
		t.mu.Unlock()
		return false
	}
	t.controlLocked(body)
	return true
}

// controlLocked is control with a (the target) locked and not ended; it
// unlocks it.
func (a *assoc) controlLocked(body []byte) {
	a.use()
	a.pushControl(body)
	first := a.out.frames+a.queue.len() == 1
	a.mu.Unlock()
	if first {
		a.notify()
	}
}

// answer queues an answer to one of the peer's requests (a resolved, a
// terminated); false if the session has ended, or the peer asked for more
// than answerBudget bytes of answers it has not read (the session is then
// ended with a protocol error). Answers still queued as records, behind
// a round the writer has not come back for, count too — against
// SendQueueLimit instead when what holds them up is a Send waiting for
// the peer's credit, not the peer's reading.
func (a *assoc) answer(body []byte) bool {
	t := a.lockTarget()
	if t.life.state >= assocEnding {
		t.mu.Unlock()
		return false
	}
	limit := answerBudget
	if t.creditStalled {
		// The answers wait behind a Send that waits for the peer's
		// credit: the peer reads, but one of its actors takes no
		// messages. They are held in memory as any queued message is,
		// up to SendQueueLimit, not the answer budget.
		limit = max(answerBudget, t.n.cfg.SendQueueLimit)
	}
	if waiting := t.out.answers + t.queue.answerBytes + len(body); waiting > limit {
		t.mu.Unlock()
		err := fmt.Errorf("%w: the peer asks more than it reads: %d bytes of answers wait for it (at most %d)", ErrMalformed, waiting, limit)
		t.n.gate.protocolError(t.label(), frameKind(body[0]).String(), err)
		t.abort(&frameError{Peer: t.label(), Kind: frameKind(body[0]).String(), Reason: err})
		return false
	}
	if !t.encodesNow() {
		t.queue.push(outRec{msg: answerFrame(body)})
	} else {
		t.encodeControl(body, true)
	}
	first := t.out.frames+t.queue.len() == 1
	t.mu.Unlock()
	if first {
		t.notify()
	}
	return true
}

// wakeSenders wakes the senders waiting for room (mu held).
func (a *assoc) wakeSenders() {
	if a.room != nil {
		close(a.room)
		a.room = nil
	}
}

// waitCredit returns a channel closed when a grant (or the session's
// end, or a move) comes (mu held).
func (a *assoc) waitCredit() chan struct{} {
	if a.credited == nil {
		a.credited = make(chan struct{})
	}
	return a.credited
}

// wakeCredited wakes the Sends waiting for credit (mu held).
func (a *assoc) wakeCredited() {
	if a.credited != nil {
		close(a.credited)
		a.credited = nil
	}
}

func (a *assoc) notify() {
	select {
	case a.wake <- struct{}{}:
	default:
	}
}

// encodeControl appends a control frame, its body given, to out (mu
// held); answer: an answer to one of the peer's requests.
func (a *assoc) encodeControl(body []byte, answer bool) {
	buf := a.out.room(len(body) + binary.MaxVarintLen32)
	start := len(buf)
	buf = append(buf, 0)
	buf = append(buf, body...)
	if answer {
		a.out.commitAnswer(fixLength(buf, start))
		return
	}
	a.out.commit(fixLength(buf, start), false)
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// maxHeader bounds the size of a tell frame's length prefix and header
// for a target path and wire key.
func maxHeader(path, key string) int {
	return 2*binary.MaxVarintLen32 + 1 + 2*binary.MaxVarintLen64 + len(path) + len(UUID{}) + len(key)
}

// encodeTell appends the tell frame of the payload for h, of type mt, to
// out (mu held); or, payload nil, of the flat value at p, which it does
// not keep. Nothing here runs user code: a payload that is not flat was
// encoded before, with no lock held. Headers hd (with a payload only)
// make it a tell with headers, for a peer that takes them; another peer
// gets the message without.
func (a *assoc) encodeTell(h *handle, mt *msgType, payload []byte, p unsafe.Pointer, hd Headers) error {
	if h.key.node != a.peer.uid {
		return fmt.Errorf("%w: the node incarnation %s is gone", ErrNoSuchActor, h.key.node.String()[:8])
	}
	size := len(payload)
	if p != nil {
		size = mt.flatMax
		if mt.flatStrings {
			size = flatMaxSize(mt.flat, p)
		}
	}
	// Too big for certain before anything is taken from the chain (a
	// flat message's size is a bound, some bytes a field over).
	if exact := size - binary.MaxVarintLen64*len(mt.flat)*btoi(p != nil); exact > a.n.cfg.MaxFrameSize {
		return fmt.Errorf("%w: %d bytes, the limit is %d", ErrFrameTooBig, exact, a.n.cfg.MaxFrameSize)
	}
	if !a.peer.headers {
		hd = nil
	}
	need := size + maxHeader(h.key.path, mt.key)
	if hd != nil {
		need += headersSize(hd)
	}
	// New table entries are committed only once the frame is complete,
	// so a message that fails to encode leaves the tables as they were.
	var th tellHeader
	var id uint32
	var knownTarget bool
	if w := h.wire.Load(); w != nil && w.a == a {
		id, knownTarget = w.id, true
	} else if id, knownTarget = a.enc.targets[h.key]; knownTarget {
		h.wire.Store(&wireID{a, id})
	}
	newTarget := !knownTarget && h.key.uuid != (UUID{}) && len(a.enc.targets) < maxTableSize && len(h.key.path) <= maxTableEntry
	if newTarget {
		id = uint32(len(a.enc.targets) + 1)
	} else if knownTarget && !a.enc.hasCredit(id) {
		return errNoCredit
	}
	th.target, th.targetInline = uint64(id), !knownTarget
	if !knownTarget {
		th.path, th.uuid = h.key.path, h.key.uuid
	}
	var tid uint32
	var knownType bool
	if mt == a.enc.lastType {
		tid, knownType = a.enc.lastTypeID, true
	} else if tid, knownType = a.enc.types[mt]; knownType {
		a.enc.lastType, a.enc.lastTypeID = mt, tid
	}
	newType := !knownType && len(a.enc.types) < maxTableSize
	if newType {
		tid = uint32(len(a.enc.types) + 1)
	}
	th.typ, th.typInline = uint64(tid), !knownType
	if !knownType {
		th.key = mt.key
	}
	if newType && mt.shape != nil && a.peer.flags&helloShapes != 0 {
		// The peer learns the type's shape before its first message,
		// once a session: it decodes by field name if its own differs.
		a.encodeControl(appendShapeFrame(nil, mt.key, mt.shape), false)
	}
	buf := a.out.room(need)
	start := len(buf)
	var body int
	if p != nil {
		// Small, and of a size known only once written: the length goes
		// in front afterwards.
		buf = append(buf, 0)
		buf = appendTellHeader(buf, &th)
		buf = appendFlatValue(buf, mt.flat, p)
		body = len(buf) - start - 1
		buf = fixLength(buf, start)
	} else {
		// The header first on its own, so that the length prefix goes
		// in front of a large payload without moving it.
		if hd != nil {
			a.enc.hdr = appendHeaders(append(a.enc.hdr[:0], byte(frameTellHeaders)), hd)
			a.enc.hdr = appendTellFields(a.enc.hdr, &th)
		} else {
			a.enc.hdr = appendTellHeader(a.enc.hdr[:0], &th)
		}
		body = len(a.enc.hdr) + len(payload)
		buf = binary.AppendUvarint(buf, uint64(body))
		buf = append(buf, a.enc.hdr...)
		buf = append(buf, payload...)
	}
	if body > a.n.cfg.MaxFrameSize {
		return fmt.Errorf("%w: %d bytes, the limit is %d", ErrFrameTooBig, body, a.n.cfg.MaxFrameSize)
	}
	if newTarget {
		a.enc.targets[h.key] = id
		a.enc.targetKeys = append(a.enc.targetKeys, h.key)
		a.enc.sent = append(a.enc.sent, 1)
		a.enc.granted = append(a.enc.granted, 0)
		h.wire.Store(&wireID{a, id})
	} else if knownTarget {
		a.enc.sent[id-1]++
	}
	if newType {
		a.enc.types[mt] = tid
		a.enc.typeList = append(a.enc.typeList, mt)
	}
	a.out.commit(buf, true)
	return nil
}

// firstFrames queues what a session that just came up tells the peer
// first (a.mu held): how many messages this node's mailboxes take (see
// credit.go; a resumed session keeps what it was told), and that this
// node is shutting down if it is (a peer told twice ignores the second).
func (a *assoc) firstFrames(resume bool) {
	if a.peer.credit && !resume && a.resumeOf == nil {
		a.encodeControl(appendCredit(nil, 0, uint64(a.n.cfg.mailboxCredit())), false)
	}
	if a.n.lc.refusing.Load() && a.peer.flags&helloDrains != 0 {
		a.encodeControl(appendDraining(nil), false)
	}
	if a.out.frames > 0 {
		// The writer, once it starts, is to find them at once: a frame
		// queued behind them does not wake it (it is not the first).
		a.notify()
	}
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

// waitsForCredit says whether a Send to h must wait before it may even
// be queued (mu held): the peer's limit is not known yet, or h's target
// has no credit left.
func (a *assoc) waitsForCredit(h *handle) bool {
	if !a.peer.credit {
		return false
	}
	if a.enc.peerMailbox == 0 {
		return a.life.state == assocUp // (before the handshake the peer is not known)
	}
	id, ok := a.enc.targets[h.key]
	return ok && !a.enc.hasCredit(id)
}

// hasCredit says whether a message may go to the target with table id
// id (the association's mu held): always, until the peer's limit is known, or when it has
// none.
func (t *outTables) hasCredit(id uint32) bool {
	return t.peerMailbox <= 0 || t.sent[id-1] < t.peerMailbox+t.granted[id-1]
}
