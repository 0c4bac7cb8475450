package troupe

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync/atomic"
	"time"
	"unsafe"
)

// NodeUID identifies one incarnation of a node: [Start] draws a fresh random
// 128-bit value every time, so a node restarted at the same address is a
// different peer.
type NodeUID [16]byte

// String returns the uid in hex.
func (u NodeUID) String() string { return hex.EncodeToString(u[:]) }

// UUID is the unique half of an actor's identity.
type UUID [16]byte

// String returns the uuid in hex.
func (u UUID) String() string { return hex.EncodeToString(u[:]) }

// AID is an actor's identity: its name (the last element of its path) and a
// UUID unique to this incarnation of the actor. Two actors spawned one after
// the other under the same name have different AIDs.
type AID struct {
	Name string
	UUID UUID
}

// refKey identifies an actor incarnation anywhere: the node incarnation, the
// path on it and the actor's uuid (zero for temporary ask refs).
type refKey struct {
	node NodeUID
	path string
	uuid UUID
}

// localTarget is what a handle to a local actor delivers into: an actor
// cell, an ask promise or a message adapter.
type localTarget interface {
	// tellAny delivers msg, or returns why it could not (and publishes
	// nothing: the caller turns the error into a DeadLetter).
	tellAny(msg any) error
	// tellWire is tellAny for a message that arrived over the wire in
	// size encoded bytes.
	tellWire(msg any, size int, hd Headers) error
	// sysPush queues a signal on the system lane; false if the target has
	// already stopped.
	sysPush(m sysMsg) bool
	// watchHandle is the handle whose stop a watcher of this target sees.
	watchHandle() *handle
	// protocol is the message type the target accepts.
	protocol() reflect.Type
}

// handle is the untyped heart of every Ref: who the target is and how to
// reach it. Exactly one of local and assoc is set. Handles are immutable
// after creation.
type handle struct {
	node  *Node // the node on which this ref value is used (dead letters go there)
	key   refKey
	local localTarget
	assoc *assoc // remote: the association session the ref is bound to
	// wire caches the target's id in the target table of the association
	// that last wrote a tell to it, so a steady stream to one actor skips
	// the table's lookup (a hash of the path) on every message.
	wire atomic.Pointer[wireID]
}

// wireID is a target's id in one association's target table.
type wireID struct {
	a  *assoc
	id uint32
}

func (h *handle) name() string {
	p := h.key.path
	for i := len(p) - 1; i >= 0; i-- {
		if p[i] == '/' {
			return p[i+1:]
		}
	}
	return p
}

// String returns a ref string for the target (see [FormatRef]).
func (h *handle) String() string {
	if h == nil {
		return "<zero ref>"
	}
	if h.assoc != nil {
		return FormatRef(h.assoc.addr(), h.key.path)
	}
	if addrs := h.node.addrList(); len(addrs) > 0 {
		return FormatRef(addrs[0], h.key.path)
	}
	return "troupe:" + h.key.path
}

// send delivers msg to the target, or publishes a DeadLetter and returns
// the reason.
func (h *handle) send(msg any) error { return h.sendHeaders(msg, nil) }

// sendHeaders is send for a message that carries headers hd.
func (h *handle) sendHeaders(msg any, hd Headers) error {
	var err error
	switch {
	case h.local != nil:
		if hd != nil {
			err = h.local.tellWire(msg, 0, hd)
		} else {
			err = h.local.tellAny(msg)
		}
	case h.assoc != nil:
		err = h.assoc.send(nil, h, msg, hd)
		if err == nil {
			return nil
		}
	}
	if err != nil {
		h.node.dead.deadLetter(h.String(), msg, err)
	}
	return err
}

// AnyRef is implemented by every [Ref], whatever its message type; it is
// what [Context.Watch] and [Terminated] use. Only Ref values implement it.
type AnyRef interface {
	// Path returns the actor's path on its node, such as "/user/worker".
	Path() string
	// AID returns the actor's identity.
	AID() AID
	// String returns the ref string of the actor (see [FormatRef]).
	String() string
	handle() *handle
}

// Ref is a reference to an actor whose protocol (the type of message it
// accepts) is T; a protocol of several messages is an interface type that
// each of them implements. A Ref is a small value: copy it, store it, send it
// inside a message to another node (it arrives as a usable ref bound to the
// right node). The zero Ref refers to nothing: what is told to it is a
// dead letter (see [Ref.Tell]).
//
// Ref is safe for concurrent use.
type Ref[T any] struct {
	h *handle
}

// Tell sends msg to the actor and returns at once; it never blocks on the
// network. A message that cannot be delivered (the actor has stopped, the
// peer has gone, the mailbox or send queue is full, …) is published as a
// [DeadLetter] on the node's event stream. Messages from one sender to one
// actor arrive in the order they were told. A message told to the zero
// Ref (one never obtained from Spawn, Resolve, a lookup or a message, such
// as a request's forgotten ReplyTo) is a dead letter with the target
// "<zero ref>": the zero Ref belongs to no node, so it is published on
// every node this process has open (or logged with [slog.Default] if none
// is), and the actor that told it goes on.
func (r Ref[T]) Tell(msg T) {
	if r.h == nil {
		zeroRefDeadLetter(msg)
		return
	}
	switch l := r.h.local.(type) {
	case *cell[T]:
		if err := l.push(msg); err != nil {
			r.h.node.dead.deadLetter(r.h.String(), msg, err)
		}
		return
	case *promise[T]: // the reply to a local Ask: no box on the way
		if !l.complete(msg, nil) {
			r.h.node.dead.deadLetter(r.h.String(), msg, errAskOver)
		}
		return
	}
	if a := r.h.assoc; a != nil && r.h.local == nil {
		// A flat message is encoded from where it lies, without a box
		// (escape analysis sees that nothing keeps the pointer, so msg
		// stays on the stack). Anything the fast
		// path does not take (a session not yet writing, a full budget,
		// an error to report) goes the general way.
		if mt := flatTypeFor[T](); mt != nil && a.tellFlat(r.h, mt, unsafe.Pointer(&msg)) {
			return
		}
	}
	r.h.send(msg)
}

// flatTypeFor returns T's registered type if T is a concrete flat type
// (see flat.go), else nil.
func flatTypeFor[T any]() *msgType {
	rt := reflect.TypeFor[T]()
	if rt.Kind() == reflect.Interface {
		return nil
	}
	mt := typeOfWord((*iface)(unsafe.Pointer(&rt)).data) // a reflect.Type's data word is the type's descriptor
	if mt == nil || mt.flat == nil {
		return nil
	}
	return mt
}

// Send delivers msg like Tell, but where Tell would make a dead letter
// because there is no room — the actor's mailbox holds
// [Config.MailboxLimit] messages, or the association with its node holds
// [Config.SendQueueLimit] bytes (the network, or the peer, is slower than
// this producer) — Send waits for room. Use it for a producer
// that must not lose messages to its own speed; use Tell where a message
// may be dropped (and reported) rather than hold the sender up.
//
// It returns nil once msg is queued, which, as with Tell, is not a promise
// of delivery; ctx.Err() if ctx ends first (msg is then not sent, and no
// dead letter is published: the caller still holds it); or why msg cannot
// be delivered at all (the actor stopped, its node is gone or
// quarantined, this node closed, the type has no wire key, the Ref is
// zero), in which
// case a DeadLetter is published too, as Tell would. A session with the peer that is suspended
// by a link flap keeps Send waiting until it resumes or ends.
//
// msg carries the headers of ctx (see [WithHeaders]) and what
// [Config.OnSend] adds; headers past their bounds fail the Send with
// [ErrBadHeaders], and nothing is sent.
func (r Ref[T]) Send(ctx context.Context, msg T) error {
	if r.h == nil {
		zeroRefDeadLetter(msg)
		return errZeroRef
	}
	hd, err := outHeaders(ctx, r.h.node.cfg.OnSend, r.h)
	if err != nil {
		return err
	}
	switch {
	case r.h.local != nil:
		if c, ok := r.h.local.(*cell[T]); ok {
			err = c.pushWait(ctx, msg, hd)
		} else if w, ok := r.h.local.(roomWaiter); ok {
			err = w.sendWait(ctx, msg, hd)
		} else {
			err = r.h.local.tellWire(msg, 0, hd)
		}
	case r.h.assoc != nil:
		err = r.h.assoc.send(ctx, r.h, msg, hd)
	}
	if err != nil && err != ctx.Err() {
		r.h.node.dead.deadLetter(r.h.String(), msg, err)
	}
	return err
}

// Path returns the actor's path on its node.
func (r Ref[T]) Path() string { return r.h.key.path }

// AID returns the actor's identity.
func (r Ref[T]) AID() AID { return AID{Name: r.h.name(), UUID: r.h.key.uuid} }

// NodeUID returns the uid of the node incarnation the actor lives on.
func (r Ref[T]) NodeUID() NodeUID { return r.h.key.node }

// IsZero reports whether r is the zero Ref.
func (r Ref[T]) IsZero() bool { return r.h == nil }

// IsLocal reports whether the actor lives on the node the ref is used on.
func (r Ref[T]) IsLocal() bool { return r.h != nil && r.h.local != nil }

// String returns the ref string (see [FormatRef]).
func (r Ref[T]) String() string { return r.h.String() }

func (r Ref[T]) handle() *handle { return r.h }

// withHandle returns a Ref of the same type as r around h; the codec uses it
// to build a Ref[T] field from a decoded handle without knowing T.
func (r Ref[T]) withHandle(h *handle) any { return Ref[T]{h: h} }

type refCarrier interface {
	handle() *handle
	withHandle(h *handle) any
}

var refCarrierType = reflect.TypeFor[refCarrier]()

// Ask sends the message that mk builds around a temporary reply ref, and
// waits for the first reply to that ref, the end of ctx, or the close of the
// node. The reply ref works across the wire like any other. mk runs once, on
// the calling goroutine.
//
// Ask returns ctx.Err() when ctx ends first, [ErrNodeClosed] when the node
// closes (for a handler that a Shutdown lets finish, when its Context is
// cancelled), [ErrPeerShuttingDown] at once when the target's node is
// shutting down, the dead-letter reason when the request could not be
// sent (for example [ErrActorStopped]), and the association's error (such as
// [ErrPeerLeft]) when the target's node goes away while it waits. When the
// target stops before it replies — a panic, a failure, a stop — Ask
// returns at once an [*AskError] with the stop's reason (for a target on
// another node, Ask watches it while it waits). A reply that arrives
// after Ask returned becomes a [DeadLetter].
//
// Like [Ref.Send], Ask sends the headers of ctx with the request (see
// [WithHeaders]), and fails with [ErrBadHeaders] before sending anything
// when they break their bounds.
func Ask[Req, Resp any](ctx context.Context, to Ref[Req], mk func(replyTo Ref[Resp]) Req) (Resp, error) {
	var zero Resp
	if to.h == nil {
		return zero, errZeroRef
	}
	n := to.h.node
	if rt := reflect.TypeFor[Resp](); to.h.assoc != nil && rt.Kind() != reflect.Interface && typeOf(rt) == nil {
		return zero, fmt.Errorf("%w: the reply type %s of an Ask to another node needs SetWireKey", ErrNoWireKey, rt)
	}
	hd, err := outHeaders(ctx, n.cfg.OnSend, to.h)
	if err != nil {
		return zero, err
	}
	p := newPromise[Resp](n)
	defer p.finishAsk()
	if a := to.h.assoc; a != nil {
		if err := a.addPending(p, isWork(to.h.key.path)); err != nil {
			return zero, err
		}
		defer a.removePending(p)
	}
	req := mk(Ref[Resp]{h: p.h})
	var sent time.Time
	if n.lat.Load() != nil {
		sent = time.Now()
	}
	var stopped <-chan struct{}
	var note *stopNote
	if c, ok := to.h.local.(*cell[Req]); ok {
		// A local actor takes the request typed: no box on the way. Its
		// stop fails the promise.
		if err = c.pushAsked(req, 0, hd, false, p); err != nil {
			n.dead.deadLetter(to.h.String(), req, err)
		} else {
			defer c.removeAsker(p)
		}
	} else {
		if sn, ok := to.h.local.(stopNoticer); ok {
			// An adapter of a local actor: the actor's stop ends the wait.
			if note = sn.stopNotice(); note != nil {
				stopped = note.ch
				defer sn.releaseStopNotice(note)
			}
		}
		if a := to.h.assoc; a != nil && to.h.key.uuid != (UUID{}) {
			// The target's stop, on its node, ends the wait: the promise
			// watches it for as long as the Ask lasts. The watch goes
			// first, so that the target's node has it before the request
			// (a stop on the request itself reports its real reason).
			p.target = to.h
			p.exportTemp()
			if a.watch(to.h, p.h) == nil {
				defer a.unwatch(to.h, p.h)
			}
		}
		err = to.h.sendHeaders(req, hd)
	}
	if err != nil {
		return zero, err
	}
	select {
	case <-p.ch:
		p.taken = true
		if lat := n.lat.Load(); lat != nil && !sent.IsZero() && p.err == nil {
			lat.ask.of(reflect.TypeFor[Req]()).observe(time.Since(sent))
		}
		return p.v, p.err
	case <-ctx.Done():
		return zero, ctx.Err()
	case <-n.lc.workDone(): // (handlers that a Shutdown lets finish may still ask)
		return zero, ErrNodeClosed
	case <-stopped:
		select {
		case <-p.ch: // it replied, then stopped
			p.taken = true
			if lat := n.lat.Load(); lat != nil && !sent.IsZero() && p.err == nil {
				lat.ask.of(reflect.TypeFor[Req]()).observe(time.Since(sent))
			}
			return p.v, p.err
		default:
		}
		return zero, &AskError{Target: to.h.String(), Reason: note.reason}
	}
}

// AskError is the error of an [Ask] whose target stopped before it
// replied: on this node or on another, by a panic, a failure, or a stop.
// It wraps [ErrActorStopped] and the stop's reason (nil for a normal
// stop; a [*PanicError] or the error given to [Context.Fail] locally; the
// text of the failure, or one of troupe's errors, from another node):
// [IsFailure] reports whether the target failed.
type AskError struct {
	Target string // the ref string of the actor asked
	Reason error  // why it stopped; nil for a normal stop
}

// Error names the target and says that it stopped before it replied, and
// why.
func (e *AskError) Error() string {
	if e.Reason == nil {
		return "troupe: " + e.Target + " stopped before it replied"
	}
	return "troupe: " + e.Target + " stopped before it replied: " + e.Reason.Error()
}

// Unwrap returns ErrActorStopped and the reason.
func (e *AskError) Unwrap() []error {
	if e.Reason == nil {
		return []error{ErrActorStopped}
	}
	return []error{ErrActorStopped, e.Reason}
}

// promise is the temporary actor behind an Ask's reply ref. It is put in the
// node's path table only when its ref is encoded for the wire.
type promise[T any] struct {
	h      *handle // &hd
	hd     handle  // (in the promise's allocation, not one of its own)
	target *handle // the actor asked, when it is on another node
	// ch is ready once v and err are written, by the one complete that
	// set done: a channel of nothing is one allocation, where a channel
	// of the reply would be two (its buffer holds pointers)
	ch   chan struct{}
	done atomic.Bool
	// taken: the Ask received from ch (only its goroutine reads or
	// writes it; beside done, in what would be padding)
	taken bool
	v     T
	err   error

	mu         mutex[lkPromise] // guards registered
	registered bool             // in the actor table, so remote replies can find it

	path [tempPathLen]byte // hd's path is here: one allocation for the promise
}

// pendingAsk is the untyped view of a promise, for associations that must
// fail their pending asks.
type pendingAsk interface {
	fail(err error)
}

var tempSeq atomic.Uint64

func newPromise[T any](n *Node) *promise[T] {
	p := &promise[T]{ch: make(chan struct{}, 1)}
	// The path is written once, here, before the string is made of it.
	b := appendBase36(append(p.path[:0], "/temp/$"...), tempSeq.Add(1))
	p.hd = handle{node: n, key: refKey{node: n.uid, path: unsafe.String(&b[0], len(b))}, local: p}
	p.h = &p.hd
	return p
}

// tempPathLen is the longest path of a promise: "/temp/$" and a uint64
// in base 36.
const tempPathLen = 7 + 13

func (p *promise[T]) complete(v T, err error) bool {
	if !p.done.CompareAndSwap(false, true) {
		return false
	}
	p.v, p.err = v, err
	p.ch <- struct{}{}
	return true
}

func (p *promise[T]) fail(err error) {
	var zero T
	p.complete(zero, err)
}

// finish marks the promise done and takes it out of the path table.
func (p *promise[T]) finish() {
	p.done.Store(true)
	p.unregister()
}

// finishAsk is finish for an Ask's promise: a reply that completed the
// promise as the Ask ended without it (on its context, the node's close
// or the target's stop) becomes a dead letter, as one that comes later
// does, rather than nothing.
func (p *promise[T]) finishAsk() {
	if p.done.Swap(true) && !p.taken {
		<-p.ch // (whoever completed it sends right after it won)
		if p.err == nil {
			p.h.node.dead.deadLetter(p.h.String(), p.v, errAskOver)
		}
	}
	p.unregister()
}

// unregister takes the promise out of the path table, if it is in it.
func (p *promise[T]) unregister() {
	p.mu.Lock()
	reg := p.registered
	p.registered = false
	p.mu.Unlock()
	if reg {
		p.h.node.actors.remove(p.h.key.path)
	}
}

// exportTemp makes the promise reachable by path from other nodes.
func (p *promise[T]) exportTemp() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.registered || p.done.Load() {
		return
	}
	p.registered = true
	p.h.node.actors.put(p.h.key.path, p.h)
}

func (p *promise[T]) tellAny(msg any) error {
	v, ok := msg.(T)
	if !ok {
		return fmt.Errorf("%w: ask reply wants %s, got %T", ErrWrongType, reflect.TypeFor[T](), msg)
	}
	if !p.complete(v, nil) {
		return errAskOver
	}
	return nil
}

// errAskOver is the dead-letter reason of a reply to an Ask that already
// has its reply or has ended.
var errAskOver = fmt.Errorf("%w: the ask already has its reply or ended", ErrActorStopped)

func (p *promise[T]) tellWire(msg any, _ int, _ Headers) error { return p.tellAny(msg) }
func (p *promise[T]) sysPush(m sysMsg) bool {
	if t := p.target; m.kind == sysTerminated && t != nil && stopOf(m.key, t.key) && !errors.Is(m.reason, ErrWatchRefused) {
		// The actor an Ask watches on another node stopped (or its node
		// is gone) before the reply came; a Terminated about anything
		// else (a peer naming this promise's path) is ignored, and so is
		// a refused watch: the Ask waits on without a stop notice.
		p.fail(&AskError{Target: t.String(), Reason: m.reason})
	}
	return !p.done.Load()
}
func (p *promise[T]) watchHandle() *handle   { return p.h }
func (p *promise[T]) protocol() reflect.Type { return reflect.TypeFor[T]() }

// exporter is implemented by local targets that must be put in the path
// table before their ref leaves the node.
type exporter interface{ exportTemp() }

// adapter is the target behind a ref made by [MessageAdapter].
type adapter[U, T any] struct {
	h       *handle
	owner   *cell[T]
	f       func(U) T
	retired atomic.Bool // its actor restarted: the adapter is gone
}

// stopOf reports whether the stop of the actor stopped is the stop of
// target: the actor itself, or one of its adapters (same node and uuid, a
// path below it), as a remote actor reports its own stop.
func stopOf(stopped, target refKey) bool {
	return stopped == target || stopped.node == target.node && stopped.uuid == target.uuid && strings.HasPrefix(target.path, stopped.path+"/$adapter")
}

// stopNoticer is a local target whose actor's stop an Ask can wait on.
type stopNoticer interface {
	stopNotice() *stopNote
	releaseStopNotice(*stopNote)
}

func (a *adapter[U, T]) stopNotice() *stopNote            { return a.owner.stopNotice() }
func (a *adapter[U, T]) releaseStopNotice(note *stopNote) { a.owner.releaseStopNotice(note) }

// retirable is an adapter, which a restart of its actor retires.
type retirable interface{ retire() }

func (a *adapter[U, T]) retire() { a.retired.Store(true) }

// MessageAdapter returns a Ref[U] that converts each U with f and delivers
// the result into the actor of c. The adapter ref is addressable across the
// wire like the actor itself and stops working when the actor stops. f runs
// on the goroutine that tells the adapter (the reader goroutine for a message
// from another node), not on the actor's, so it must be a pure conversion
// that touches no actor state. Call it from the actor's goroutine (in Setup
// or a handler).
func MessageAdapter[U, T any](c *Context[T], f func(U) T) Ref[U] {
	cl := c.c
	l := cl.linksFor()
	l.adapterSeq++
	a := &adapter[U, T]{owner: cl, f: f}
	a.h = &handle{node: cl.n, key: refKey{node: cl.n.uid, path: cl.self.key.path + "/$adapter" + formatBase36(l.adapterSeq), uuid: cl.self.key.uuid}, local: a}
	cl.n.actors.put(a.h.key.path, a.h)
	l.adapters = append(l.adapters, a.h)
	return Ref[U]{h: a.h}
}

func (a *adapter[U, T]) tellAny(msg any) error {
	if a.retired.Load() {
		return errAdapterRetired
	}
	u, ok := msg.(U)
	if !ok {
		return fmt.Errorf("%w: adapter wants %s, got %T", ErrWrongType, reflect.TypeFor[U](), msg)
	}
	return a.owner.push(a.f(u))
}

func (a *adapter[U, T]) tellWire(msg any, size int, hd Headers) error {
	return a.tellCredited(msg, size, hd, false)
}

// tellCredited is tellWire; a credited message lands in the owner's
// mailbox past its limit, as one to the actor itself would (see
// creditTeller).
func (a *adapter[U, T]) tellCredited(msg any, size int, hd Headers, credited bool) error {
	u, ok := msg.(U)
	if !ok || a.retired.Load() {
		return a.tellAny(msg)
	}
	return a.owner.pushCredited(a.f(u), size, hd, credited)
}

// roomWaiter is a local target that a Send waits on for room: a message
// adapter, whose actor's mailbox the message goes into.
type roomWaiter interface {
	sendWait(ctx context.Context, msg any, hd Headers) error
}

// sendWait converts msg once, on the sending goroutine, and waits for
// room for the result in the actor's mailbox.
func (a *adapter[U, T]) sendWait(ctx context.Context, msg any, hd Headers) error {
	u, ok := msg.(U)
	if !ok || a.retired.Load() {
		return a.tellAny(msg)
	}
	return a.owner.pushWaitUnless(ctx, a.f(u), hd, &a.retired)
}

func (a *adapter[U, T]) sysPush(m sysMsg) bool  { return a.owner.sysPush(m) }
func (a *adapter[U, T]) watchHandle() *handle   { return a.owner.self }
func (a *adapter[U, T]) protocol() reflect.Type { return reflect.TypeFor[U]() }

// errAdapterRetired is the dead-letter reason for a message to an adapter
// whose actor has restarted since it was made.
var errAdapterRetired = fmt.Errorf("%w: the adapter's actor restarted", ErrNoSuchActor)

func formatBase36(v uint64) string {
	return string(appendBase36(nil, v))
}

func appendBase36(dst []byte, v uint64) []byte {
	const digits = "0123456789abcdefghijklmnopqrstuvwxyz"
	var b [13]byte
	i := len(b)
	for {
		i--
		b[i] = digits[v%36]
		v /= 36
		if v == 0 {
			return append(dst, b[i:]...)
		}
	}
}
