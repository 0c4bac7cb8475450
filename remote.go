package troupe

import (
	"context"
	"fmt"
	"reflect"
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
