package troupe

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"runtime"
	"strings"
	"sync/atomic"
	"time"
	"unsafe"
)

// Errors about actors and delivery. Each is the Reason of a [DeadLetter] or
// is returned (wrapped) by the call named.
var (
	// ErrActorStopped is the reason a message to an actor that has stopped
	// becomes a dead letter.
	ErrActorStopped = errors.New("troupe: actor stopped")
	// ErrNoSuchActor is returned by [Resolve] and is the dead-letter reason
	// when no actor lives at a path (or a different incarnation does).
	ErrNoSuchActor = errors.New("troupe: no such actor")
	// ErrWrongType is returned by [Resolve] when the actor's protocol is not
	// the type asked for, and is the dead-letter reason for a message whose
	// type the target does not accept.
	ErrWrongType = errors.New("troupe: wrong message type")
	// ErrMailboxFull is the dead-letter reason when an actor's mailbox holds
	// [Config.MailboxLimit] messages.
	ErrMailboxFull = errors.New("troupe: mailbox full")
	// ErrNameTaken is returned by [Spawn] when a live sibling has the name.
	ErrNameTaken = errors.New("troupe: actor name taken")
	// ErrBadName is returned by [Spawn] for a name with characters other
	// than letters, digits, '-', '_' and '.', or one starting with '$'.
	ErrBadName = errors.New("troupe: bad actor name")
	// ErrParentStopped is the stop reason of a child whose parent stopped.
	ErrParentStopped = errors.New("troupe: parent actor stopped")
)

// PanicError is the stop reason of an actor whose handler panicked. The
// panic stops that actor only; its watchers see this error in
// [Terminated.Reason].
type PanicError struct {
	Value any    // the value passed to panic
	Stack []byte // the panicking goroutine's stack
}

// Error says that the actor panicked, and with what value.
func (e *PanicError) Error() string { return fmt.Sprintf("troupe: actor panicked: %v", e.Value) }

// Behavior is what an actor does. Receive handles each user message; Signal,
// if set, handles signals such as [Terminated]; Setup, if set, runs once
// before either. All three run on the actor's goroutine, one at a time, so
// the actor's own state needs no locks. A panic in any of them is a
// failure: the actor stops, unless the behavior was built by [Supervise]
// with another [Strategy].
type Behavior[T any] struct {
	Setup   func(c *Context[T])
	Receive func(c *Context[T], msg T)
	Signal  func(c *Context[T], s Signal)

	sup *supervisor[T] // set by Supervise
}

// Signal is a message from the runtime rather than from another actor.
// [Terminated] is handled after every user message that was already in the
// mailbox when it arrived, so it follows everything the stopped actor sent.
type Signal interface{ isSignal() }

// Terminated tells a watcher that an actor it watches has stopped. It is
// delivered exactly once per [Context.Watch], and nothing from that actor is
// delivered after it. Reason is nil when the actor stopped itself
// normally; otherwise it says why: a [*PanicError], [ErrParentStopped],
// [ErrNodeClosed], [ErrPeerLeft] when the actor's node closed gracefully,
// [ErrNoSuchActor] when it did not exist, or the error that ended the link.
// One reason is no stop: [ErrWatchRefused] says that the watch could not be
// placed on the actor's node (see [Config.MaxWatchesPerPeer]); the actor
// may still run.
type Terminated struct {
	Ref    AnyRef
	Reason error
}

func (Terminated) isSignal() {}

// Spawner is what [Spawn] spawns under: a [*Node] (a top-level actor at
// "/user/NAME") or a [*Context] (a child at "PARENT/NAME", stopped with its
// parent).
type Spawner interface {
	spawnParent() (n *Node, parent parentCell)
}

// parentCell is the view of a cell its children need.
type parentCell interface {
	localTarget
	addChild(h *handle) error
}

type sysKind uint8

const (
	sysStart sysKind = iota
	sysStop
	sysWatch
	sysUnwatch
	sysTerminated
	sysChildStopped
	sysTimer
	sysRestart
	sysPost
)

// follows says whether m is handled only after the user messages that
// entered the mailbox before it (its after).
func (m *sysMsg) follows() bool {
	return m.kind == sysTerminated || m.kind == sysPost || m.kind == sysStop && m.drain
}

// sysMsg is one entry of the system lane.
type sysMsg struct {
	kind     sysKind
	ref      *handle // the watcher (watch, unwatch) or child (childStopped)
	key      refKey  // the actor that stopped (terminated)
	reason   error   // stop or termination reason
	timerKey any     // the due timer's key (timer); the message (post)
	timerGen uint64  // and which start of it, or which restart (restart)
	// after is, for a termination, how many user messages had entered the
	// mailbox when it arrived: it is handled only once they all have been,
	// so that it follows everything the stopped actor sent. A draining
	// stop and a post wait for them the same way (follows).
	after uint64
	// drain makes a stop wait for the messages already in the mailbox
	// (Shutdown with Config.ShutdownDrain).
	drain bool
}

// throughput is how many messages an actor handles before it yields its
// goroutine to the scheduler, so one busy actor cannot hog a core.
const throughput = 512

// cell is a running actor: its mailbox (a system lane and a user lane) and
// its state. It holds no goroutine while its mailbox is empty, and what
// only some actors use is behind a pointer made on first use (q, waits,
// links, tools), so that an idle actor is small (BenchmarkSpawn).
type cell[T any] struct {
	n      *Node
	self   *handle // points at selfH
	selfH  handle
	parent parentCell // nil for a top-level actor
	b      Behavior[T]
	ctx    Context[T]

	// mu guards the mailbox (q's lanes) and the scheduling flags.
	mu        mutex[lkCell]
	scheduled bool // a goroutine is running (or about to run) the cell
	closed    bool // the actor has stopped; nothing more is accepted
	held      bool // a restart is pending: user messages wait in in
	stopping  bool // (owned by the goroutine running the cell; here, it packs with the flags above)
	hasSys    atomic.Bool
	// maxBytes, if not 0, replaces Config.MailboxBytes for this mailbox
	// (a work worker's controller: its room of the largest frames from
	// each producer); set by its owner (mu).
	maxBytes int
	// q is the mailbox, made by the first message or signal (mu): an
	// actor never sent anything holds none. The pointer never changes
	// once set.
	q *lanes[T]
	// waits holds what waiters on the mailbox wait on, made on first use
	// (mu).
	waits *cellWaits

	// The rest is owned by the goroutine running the cell.
	links *cellLinks     // watches, children and adapters, made on first use
	tools *actorTools[T] // timers and context, made on first use
}

// start runs the cell on a goroutine of its own (the node waits for it).
// A goroutine started from a func value with no arguments needs no
// closure of its own.
func (c *cell[T]) start() {
	c.n.wg.Add(1)
	run := c.q.runFn
	go run()
}

func (c *cell[T]) runThenDone() {
	defer c.n.wg.Done()
	c.run()
}

// Context is an actor's view of itself, passed to its handlers. It must only
// be used on the actor's goroutine, during a handler call.
type Context[T any] struct {
	c *cell[T]
}

// Self returns the actor's own ref.
func (c *Context[T]) Self() Ref[T] { return Ref[T]{h: c.c.self} }

// Node returns the node the actor runs on.
func (c *Context[T]) Node() *Node { return c.c.n }

// Stop stops the actor once the current handler returns. Its children stop
// too, waiting messages become dead letters, and watchers get [Terminated]
// with a nil reason.
func (c *Context[T]) Stop() {
	if !c.c.stopping {
		c.c.setStopping(nil)
	}
}

// Watch asks for a [Terminated] signal when the actor behind r stops —
// whether it lives on this node or another. Watching the same actor twice
// is one watch. If the actor has already stopped, or its node cannot be
// reached, the signal comes at once.
func (c *Context[T]) Watch(r AnyRef) {
	cl := c.c
	h := watchTarget(r)
	if h == nil {
		return
	}
	if h == cl.self || cl.links != nil && cl.links.watching[h.key] != nil {
		return
	}
	l := cl.linksFor()
	if l.watching == nil {
		l.watching = make(map[refKey]AnyRef)
	}
	l.watching[h.key] = r
	var err error
	switch {
	case h.local != nil:
		if !h.local.sysPush(sysMsg{kind: sysWatch, ref: cl.self}) {
			err = cl.n.actors.stops.reason(h.key.path, h.key.uuid, ErrActorStopped)
		}
	case h.assoc != nil:
		err = h.assoc.watch(h, cl.self)
	}
	if err != nil {
		cl.sysPush(sysMsg{kind: sysTerminated, key: h.key, reason: err})
	}
}

// Unwatch cancels a [Context.Watch]; no Terminated for r arrives after it.
func (c *Context[T]) Unwatch(r AnyRef) {
	cl := c.c
	h := watchTarget(r)
	if h == nil {
		return
	}
	if cl.links == nil {
		return
	}
	if _, ok := cl.links.watching[h.key]; !ok {
		return
	}
	delete(cl.links.watching, h.key)
	defer cl.dropLinksIfUnused()
	switch {
	case h.local != nil:
		h.local.sysPush(sysMsg{kind: sysUnwatch, ref: cl.self})
	case h.assoc != nil:
		h.assoc.unwatch(h, cl.self)
	}
}

// watchTarget is the handle whose stop a watcher of r sees: the actor
// itself, or the actor behind an adapter.
func watchTarget(r AnyRef) *handle {
	h := r.handle()
	if h != nil && h.local != nil {
		h = h.local.watchHandle()
	}
	return h
}

func (c *Context[T]) spawnParent() (*Node, parentCell) { return c.c.n, c.c }

// Spawn starts an actor with behavior b under p (a [*Node] or a parent's
// [*Context]) and returns its ref. An empty name spawns an anonymous actor
// with a generated "$…" name. Names are unique among live siblings.
//
// Spawn returns [ErrBadName], [ErrNameTaken] or [ErrNodeClosed]. The actor
// holds no goroutine until it has a message (or a Setup to run).
func Spawn[T any](p Spawner, name string, b Behavior[T]) (Ref[T], error) {
	n, parent := p.spawnParent()
	b, err := b.behavior()
	if err != nil {
		return Ref[T]{}, fmt.Errorf("Spawn: %w", err)
	}
	if name != "" {
		if err := checkName(name); err != nil {
			return Ref[T]{}, err
		}
	}
	c := &cell[T]{n: n, parent: parent, b: b}
	c.ctx.c = c
	base := "/user"
	if pc, ok := parent.(interface{ path() string }); ok {
		base = pc.path()
	} else if sp, ok := p.(interface{ basePath() string }); ok {
		base = sp.basePath()
	}
	var path string
	if name == "" {
		var seq uint64
		if pc, ok := parent.(interface{ nextChild() uint64 }); ok {
			seq = pc.nextChild()
		} else {
			seq = n.ids.anon.Add(1)
		}
		// One allocation for the whole path; the name is its tail.
		b := make([]byte, 0, len(base)+15)
		b = appendBase36(append(append(b, base...), "/$"...), seq)
		path = unsafe.String(&b[0], len(b))
	} else {
		path = base + "/" + name
	}
	c.selfH = handle{node: n, key: refKey{node: n.uid, path: path, uuid: n.ids.newUUID()}, local: c}
	c.self = &c.selfH
	if err := n.actors.add(c.self.key.path, c.self, name == ""); err != nil {
		return Ref[T]{}, err
	}
	if parent != nil {
		if err := parent.addChild(c.self); err != nil {
			n.actors.remove(c.self.key.path)
			n.actors.live.Done() // the cell never runs, so it never terminates
			return Ref[T]{}, err
		}
	}
	if b.Setup != nil {
		c.sysPush(sysMsg{kind: sysStart})
	}
	if n.disc.discovering() && isPublic(path) {
		n.disc.registerActor(c.self)
	}
	return Ref[T]{h: c.self}, nil
}

func checkName(name string) error {
	if name == "" || name[0] == '$' || len(name) > 255 {
		return fmt.Errorf("%w: %q", ErrBadName, name)
	}
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_.", r)) {
			return fmt.Errorf("%w: %q (use letters, digits, '-', '_' and '.')", ErrBadName, name)
		}
	}
	return nil
}

func (c *cell[T]) path() string         { return c.self.key.path }
func (c *cell[T]) topLevel() bool       { return c.parent == nil }
func (c *cell[T]) nextChild() uint64    { l := c.linksFor(); l.childSeq++; return l.childSeq }
func (c *cell[T]) watchHandle() *handle { return c.self }
func (c *cell[T]) protocol() reflect.Type {
	return reflect.TypeFor[T]()
}

// addChild records a child; it runs on this actor's goroutine (Spawn from
// a handler), so children needs no lock.
func (c *cell[T]) addChild(h *handle) error {
	if c.stopping {
		return fmt.Errorf("Spawn under %s: %w", c.self.key.path, ErrActorStopped)
	}
	l := c.linksFor()
	if l.children == nil {
		l.children = make(map[*handle]struct{})
	}
	l.children[h] = struct{}{}
	return nil
}

// run handles messages until the mailbox is empty, then releases the
// goroutine.
func (c *cell[T]) run() {
	handled := 0
	for {
		c.mu.Lock()
		q := c.q // (set by the push that scheduled the cell)
		if len(q.sys) == 0 && (len(q.in) == 0 || c.held) {
			c.scheduled = false
			c.mu.Unlock()
			return
		}
		if c.held {
			c.mu.Unlock()
			if c.drainSys() && c.terminate(nil) {
				return
			}
			continue
		}
		q.batch, q.in = q.in, q.batch[:0]
		q.inBytes = 0
		var firstAt int64
		if c.waits != nil {
			if c.waits.room != nil {
				close(c.waits.room)
				c.waits.room = nil
			}
			if m := c.waits.more; m != nil {
				firstAt, m.firstAt = m.firstAt, 0
				if len(m.hdrs) > 0 {
					t := c.tooling()
					t.hdrs = append(t.hdrs, m.hdrs...)
					clear(m.hdrs)
					m.hdrs = m.hdrs[:0]
				}
			}
		}
		c.mu.Unlock()
		if c.n.credit.waiting.Load() > 0 {
			c.n.credit.wake(c.self)
		}
		// q.handled is brought up to date only where a signal needs it,
		// so that the loop writes nothing per message.
		var hist *latencyHist
		if lat := c.n.lat.Load(); lat != nil {
			hist = lat.handler.of(reflect.TypeFor[T]())
			if firstAt != 0 {
				lat.mailbox.of(reflect.TypeFor[T]()).observe(time.Since(c.n.epoch) - time.Duration(firstAt))
			}
		}
		base := q.handled
		n := len(q.batch)
		for i := 0; i < n; i++ {
			if c.hasSys.Load() || c.held {
				q.handled = base + uint64(i)
				if c.drainSys() {
					if c.terminate(q.batch[i:]) {
						return
					}
					n = i // (the rest became dead letters)
					break
				}
				if c.held {
					c.requeue(q.batch[i:])
					n = i
					break
				}
			}
			var hd Headers
			if t := c.tools; t != nil && len(t.hdrs) > 0 {
				hd = t.headersOf(base + uint64(i))
			}
			switch {
			case hd != nil:
				c.receiveHeaders(q.batch[i], hd, hist)
			case hist != nil:
				t0 := time.Now()
				c.receive(q.batch[i])
				hist.observe(time.Since(t0))
			default:
				c.receive(q.batch[i])
			}
			if c.tools != nil && len(c.tools.later) > 0 {
				if q.handled = base + uint64(i+1); c.tools.later[0].after <= q.handled {
					c.deliverLater()
				}
			}
			if c.stopping {
				if c.terminate(q.batch[i+1:]) {
					return
				}
				n = i + 1
				break
			}
			if handled++; handled%throughput == 0 {
				runtime.Gosched()
			}
		}
		q.handled = base + uint64(n)
		clear(q.batch)
		if c.hasSys.Load() && c.drainSys() && c.terminate(nil) {
			return
		}
	}
}

// drainSys handles every waiting signal; true if the actor must stop.
func (c *cell[T]) drainSys() bool {
	for {
		c.mu.Lock()
		q := c.q
		sys := q.sys
		q.sys = nil
		c.hasSys.Store(false)
		c.mu.Unlock()
		if len(sys) == 0 {
			return c.stopping
		}
		if len(sys) > 1 && stopIn(sys) {
			// A handler run for a signal ahead of the stop (Setup, a timer,
			// a Terminated) that first asks for its Context then gets one
			// already done: the stop's push found none to cancel.
			c.tooling().stopTaken = true
		}
		for _, m := range sys {
			if m.follows() && (m.after > q.handled || c.tools != nil && len(c.tools.later) > 0) {
				t := c.tooling()
				t.later = append(t.later, m)
				continue
			}
			c.handleSys(m)
		}
		if c.tools != nil && len(c.tools.later) > 0 && c.tools.later[0].after <= q.handled {
			c.deliverLater()
		}
		if c.stopping {
			return true
		}
	}
}

// stopIn says whether sys holds a stop that cancels the actor's context
// (see sysPush).
func stopIn(sys []sysMsg) bool {
	for _, m := range sys {
		if m.kind == sysStop && !m.drain {
			return true
		}
	}
	return false
}

// deliverLater handles the waiting terminations (and posts, draining
// stops) whose messages have all been handled, in the order they
// arrived.
func (c *cell[T]) deliverLater() {
	i := 0
	later := c.tools.later
	for ; i < len(later) && later[i].after <= c.q.handled && !c.stopping; i++ {
		c.handleSys(later[i])
	}
	c.tools.later = later[:copy(later, later[i:])]
}

func (c *cell[T]) handleSys(m sysMsg) {
	switch m.kind {
	case sysStart:
		c.runSetup()
	case sysStop:
		if !c.stopping {
			c.setStopping(m.reason)
		}
	case sysWatch:
		c.linksFor().addWatcher(m.ref)
	case sysUnwatch:
		if l := c.links; l != nil {
			l.removeWatcher(m.ref.key)
			c.dropLinksIfUnused()
		}
	case sysChildStopped:
		if c.links != nil {
			delete(c.links.children, m.ref)
		}
		c.childGone()
	case sysTimer:
		c.fireTimer(m.timerKey, m.timerGen)
	case sysPost:
		// A message of troupe's own that no full mailbox refuses, for
		// an actor that never restarts (it would be handed to a behavior
		// held for a restart): handled after the user messages that
		// entered before it, as a termination is.
		if msg, ok := m.timerKey.(T); ok && !c.stopping {
			c.receive(msg)
		}
	case sysRestart:
		c.restart(m.timerGen)
	case sysTerminated:
		if c.stopping {
			return // a stopping actor runs no more handlers but PostStop
		}
		if c.links == nil {
			return
		}
		watching := c.links.watching
		keys := []refKey{m.key}
		if _, ok := watching[m.key]; !ok {
			// A remote actor reports its own stop; what is watched here may
			// be one of its adapters (same node and uuid, a path below it).
			keys = keys[:0]
			for k := range watching {
				if k.node == m.key.node && k.uuid == m.key.uuid && strings.HasPrefix(k.path, m.key.path+"/$adapter") {
					keys = append(keys, k)
				}
			}
		}
		for _, k := range keys {
			r, ok := watching[k]
			if !ok {
				continue
			}
			delete(watching, k)
			if c.b.Signal != nil {
				c.guard(func() { c.b.Signal(&c.ctx, Terminated{Ref: r, Reason: m.reason}) })
			}
		}
		c.dropLinksIfUnused()
	}
}

func (c *cell[T]) receive(msg T) {
	defer c.recoverFailure(false)
	c.b.Receive(&c.ctx, msg)
}

// receiveHeaders handles msg, which carries headers hd: through
// Config.OnReceive when it is set, with Context.Context carrying them.
func (c *cell[T]) receiveHeaders(msg T, hd Headers, hist *latencyHist) {
	t := c.tools
	t.cur = hd
	defer func() { t.cur, t.curCtx = nil, nil }()
	on := c.n.cfg.OnReceive
	if on == nil || !userPath(c.self.key.path) {
		c.receiveTimed(msg, hist)
		return
	}
	defer c.recoverFailure(false) // (a panic in OnReceive itself)
	called, returned := false, false
	// Its own copy: the message's map may be its sender's too.
	on(c.ctx.Context(), c.self.key.path, maps.Clone(hd), func(ctx context.Context) {
		if called || returned {
			return // once, and only while OnReceive runs
		}
		called = true
		if ctx != nil {
			t.curCtx = ctx
		}
		c.receiveTimed(msg, hist)
	})
	returned = true
}

// receiveTimed is receive, observed by hist if not nil.
func (c *cell[T]) receiveTimed(msg T, hist *latencyHist) {
	if hist == nil {
		c.receive(msg)
		return
	}
	t0 := time.Now()
	c.receive(msg)
	hist.observe(time.Since(t0))
}

func (c *cell[T]) guard(f func()) {
	defer c.recoverFailure(false)
	f()
}

func (c *cell[T]) runSetup() {
	defer c.recoverFailure(true)
	c.b.Setup(&c.ctx)
}

// requeue puts messages taken from the mailbox back at its front, for a
// restart to handle.
func (c *cell[T]) requeue(rest []T) {
	c.mu.Lock()
	q := c.q
	in := make([]T, 0, len(rest)+len(q.in))
	q.in = append(append(in, rest...), q.in...)
	c.mu.Unlock()
	clear(q.batch)
}

// signal delivers a signal to the actor behind h, wherever it lives.
func (h *handle) signal(m sysMsg) {
	switch {
	case h.local != nil:
		h.local.sysPush(m)
	case h.assoc != nil:
		h.assoc.signal(h, m)
	}
}

// Fail reports that the current message (or signal, or Setup) failed with
// err. Once the handler returns, the actor's strategy handles the failure
// as it would a panic: by default the actor stops with a reason that
// wraps err ([IsFailure] reports it). A nil err is ignored; a second call
// in the same handler replaces the first.
func (c *Context[T]) Fail(err error) {
	if err != nil {
		c.c.tooling().failed = err
	}
}

// tooling returns the actor's tools, making them on first use.
func (c *cell[T]) tooling() *actorTools[T] {
	if c.tools == nil {
		c.tools = &actorTools[T]{}
	}
	return c.tools
}

// actorContext returns the actor's context, made on first use (see
// Context.Context).
func (c *cell[T]) actorContext() context.Context {
	t := c.tooling()
	if t.ctx == nil {
		t.ctx, t.cancel = context.WithCancel(c.n.lc.actorsCtx)
		if c.stopping || t.stopTaken {
			t.cancel() // asked for in PostStop, or after Stop
		}
		// A stop pushed from elsewhere cancels it at once, while a
		// handler may still be waiting on it (see sysPush).
		c.mu.Lock()
		c.moreFor().cancel = t.cancel
		pushed := c.stopPushedLocked() // before this call: nothing cancelled it
		c.mu.Unlock()
		if pushed {
			t.cancel()
		}
	}
	return t.ctx
}

// startTimer starts the timer with key, replacing the one running under
// it: msg is delivered after d, then every every if that is not 0.
func (c *cell[T]) startTimer(key any, d, every time.Duration, msg T) {
	tt := c.tooling()
	if old, ok := tt.timers[key]; ok {
		old.t.Stop()
	}
	if tt.timers == nil {
		tt.timers = make(map[any]*actorTimer[T])
	}
	tt.timerSeq++
	gen := tt.timerSeq
	at := &actorTimer[T]{msg: msg, every: every, gen: gen}
	at.t = time.AfterFunc(d, func() { c.sysPush(sysMsg{kind: sysTimer, timerKey: key, timerGen: gen}) })
	tt.timers[key] = at
}

// fireTimer handles a due timer on the actor's goroutine: its message is
// received unless the timer was cancelled or replaced meanwhile.
func (c *cell[T]) fireTimer(key any, gen uint64) {
	if c.tools == nil || c.stopping {
		return
	}
	at, ok := c.tools.timers[key]
	if !ok || at.gen != gen {
		return // cancelled or replaced after it fell due
	}
	if at.every > 0 {
		at.t.Reset(at.every)
	} else {
		delete(c.tools.timers, key)
	}
	c.receive(at.msg)
}

// stopTimers cancels every timer and the actor's context as it stops.
func (c *cell[T]) stopTimers() {
	if c.tools == nil {
		return
	}
	for _, at := range c.tools.timers {
		at.t.Stop()
	}
	c.tools.timers = nil
	if c.tools.cancel != nil {
		c.tools.cancel()
	}
	if st := c.tools.sup; st != nil && st.timer != nil {
		st.timer.Stop()
		st.timer = nil
	}
}

// holdHeaders keeps hd, the headers of the message about to enter the
// mailbox, beside it (mu held).
func (c *cell[T]) holdHeaders(hd Headers) {
	m := c.moreFor()
	m.hdrs = append(m.hdrs, heldHeaders{at: c.lanesFor().entered, h: hd})
}
