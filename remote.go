package troupe

import (
	"context"
	"fmt"
	"reflect"
	"runtime"
	"time"
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
