package troupe

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime/debug"
	"time"
)

// How an actor stops: what is left in its mailbox, its children, the
// watchers it tells (Terminated), and those waiting for it to stop.

// terminate stops the actor: it refuses further messages, turns waiting
// ones into dead letters, stops its children, tells its watchers and its
// parent, and leaves the node's tables. As in Akka, an actor with
// children stops them first and waits: its PostStop runs, and its
// watchers and parent hear of it, only once every child has stopped
// (each after its own children), so a tree stops as a tree and its names
// are free when its watchers learn it. terminate reports whether the
// actor is gone; false while it waits (it holds its mailbox meanwhile,
// and is called again when its last child has stopped).
func (c *cell[T]) terminate(rest []T) bool {
	l := c.links
	if l == nil {
		l = &cellLinks{} // (read only: an actor without links)
	}
	if len(l.children) > 0 {
		t := c.tooling()
		target := c.self.String()
		for _, m := range rest {
			c.n.dead.deadLetter(target, m, ErrActorStopped)
		}
		if !t.awaitingChildren {
			t.awaitingChildren = true
			c.stopTimers()
			c.mu.Lock()
			c.held = true // user messages wait, to be dead letters at the end
			c.mu.Unlock()
			for ch := range l.children {
				ch.local.sysPush(sysMsg{kind: sysStop, reason: ErrParentStopped, drain: c.n.lc.drainingMailboxes.Load()})
			}
		}
		return false
	}
	c.stopTimers()
	// Kept before the cell refuses watches: a watch from now on finds
	// the reason (recentStops), not a bare ErrActorStopped.
	c.n.actors.stops.record(c.self.key.path, c.self.key.uuid, l.stopReason)
	c.mu.Lock()
	c.closed = true
	var waiting []T
	var sys []sysMsg
	var asker pendingAsk
	var askers map[pendingAsk]struct{}
	if q := c.q; q != nil {
		waiting, sys = q.in, q.sys
		q.in, q.sys = nil, nil
		asker, askers = q.asker, q.askers
		q.asker, q.askers = nil, nil
	}
	var note *stopNote
	if w := c.waits; w != nil {
		if w.room != nil {
			close(w.room)
			w.room = nil
		}
		note, w.stop = w.stop, nil
	}
	c.mu.Unlock()
	if c.n.credit.waiting.Load() > 0 {
		c.n.credit.wake(c.self)
	}
	if note != nil {
		note.reason = l.stopReason
		close(note.ch) // the Asks waiting on this actor fail now
	}
	target := c.self.String()
	if asker != nil {
		asker.fail(&AskError{Target: target, Reason: l.stopReason})
	}
	for p := range askers {
		p.fail(&AskError{Target: target, Reason: l.stopReason})
	}

	for _, m := range rest {
		c.n.dead.deadLetter(target, m, ErrActorStopped)
	}
	for _, m := range waiting {
		c.n.dead.deadLetter(target, m, ErrActorStopped)
	}
	if q := c.q; q != nil {
		clear(q.batch)
		q.batch = nil
	}
	for _, m := range sys {
		if m.kind == sysWatch { // it came before the stop: the real reason
			m.ref.signal(sysMsg{kind: sysTerminated, key: c.self.key, reason: l.stopReason})
		}
	}
	for ch := range l.children {
		ch.local.sysPush(sysMsg{kind: sysStop, reason: ErrParentStopped, drain: c.n.lc.drainingMailboxes.Load()})
	}
	c.dropWatches()
	if c.b.Signal != nil && (c.tools == nil || c.tools.sup == nil || c.tools.sup.phase == restartNone) {
		c.signalQuietly(PostStop{Reason: l.stopReason})
	}
	if c.links != nil {
		l = c.links // (PostStop may have made them)
	}
	for _, a := range l.adapters {
		c.n.actors.remove(a.key.path)
	}
	c.n.actors.remove(c.self.key.path)
	c.n.services.stopServices(c.self)
	c.n.serviceSubs.stopServiceSubs(c.self)
	c.n.topics.stopTopics(c.self)
	if c.n.disc.discovering() && isPublic(c.self.key.path) {
		if !c.n.lc.isClosed() { // (a closing node unregistered everything at once)
			c.n.disc.unregisterActor(c.self)
		}
	}
	l.eachWatcher(func(w *handle) {
		w.signal(sysMsg{kind: sysTerminated, key: c.self.key, reason: l.stopReason})
	})
	if c.parent != nil {
		c.parent.sysPush(sysMsg{kind: sysChildStopped, ref: c.self})
	}
	c.n.actors.live.Done()
	return true
}

// stopNote tells the Asks waiting on an actor that it stopped, and why.
type stopNote struct {
	ch     chan struct{}
	reason error // set before ch is closed
	asks   int   // the Asks waiting on it (the cell's mu)
}

// stopNotice returns the note closed when the actor stops, or nil if it
// has stopped already.
func (c *cell[T]) stopNotice() *stopNote {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	w := c.waitsFor()
	if w.stop == nil {
		w.stop = &stopNote{ch: make(chan struct{})}
	}
	w.stop.asks++
	return w.stop
}

// releaseStopNotice says that an Ask no longer waits on note: the last
// one leaves the actor at its idle size.
func (c *cell[T]) releaseStopNotice(note *stopNote) {
	c.mu.Lock()
	defer c.mu.Unlock()
	w := c.waits
	if w == nil || w.stop != note {
		return // (the actor stopped: the note was taken)
	}
	if note.asks--; note.asks == 0 {
		w.stop = nil
		if w.room == nil && w.more == nil {
			c.waits = nil
		}
	}
}

// cellWaits is what waiters on a mailbox wait on (mu).
type cellWaits struct {
	// room, made by a sender waiting for room (Ref.Send), is closed when
	// the mailbox is emptied into a batch or the actor stops.
	room chan struct{}
	// stop, made for an Ask through an adapter or for a caller that
	// waits for the actor to stop (stopAndWait), is closed when it stops.
	// (A local Ask to the actor itself is failed through its lanes: see
	// lanes.asker.)
	stop *stopNote
	// more holds what fewer actors need, made on first use: this struct
	// is made for such a wait (and dropped after it), so it stays at 24
	// bytes.
	more *cellMore
}

// cellMore is the part of an actor's waits that, once made, stays.
type cellMore struct {
	// cancel cancels the actor's Context (see Context.Context): a stop
	// pushed to the actor calls it at once.
	cancel context.CancelFunc
	// firstAt is when the oldest message waiting arrived in an empty
	// mailbox, in nanoseconds since the node's epoch, set only while the
	// node keeps latency histograms (latency.go): the batch that takes it
	// observes the mailbox wait.
	firstAt int64
	// hdrs are the headers of the messages waiting that carry some, in
	// the order of their index (see heldHeaders).
	hdrs []heldHeaders
}

// waitsFor returns the cell's waits, made on first use (mu held).
func (c *cell[T]) waitsFor() *cellWaits {
	if c.waits == nil {
		c.waits = &cellWaits{}
	}
	return c.waits
}

// moreFor returns the cell's lasting waits, made on first use (mu held).
func (c *cell[T]) moreFor() *cellMore {
	w := c.waitsFor()
	if w.more == nil {
		w.more = &cellMore{}
	}
	return w.more
}

// stopAndWait stops the local actor r and waits until it has stopped (or
// the node's work is over).
func stopAndWait[T any](n *Node, r Ref[T]) {
	var note *stopNote
	if cl, ok := r.h.local.(*cell[T]); ok {
		note = cl.stopNotice()
	}
	n.Stop(r)
	if note == nil {
		return
	}
	select {
	case <-note.ch:
	case <-n.lc.workDone():
		return
	}
	t := time.NewTicker(time.Millisecond)
	defer t.Stop()
	for n.actors.get(r.h.key.path, r.h.key.uuid) != nil { // (PostStop, then out of the table)
		select {
		case <-t.C:
		case <-n.lc.workDone():
			return
		}
	}
}

// cellLinks is who an actor is linked to: its watchers, whom it watches,
// its children and its message adapters, and why it stops. Owned by the
// goroutine running the cell; most actors have none.
type cellLinks struct {
	stopReason error
	// who watches this actor: one watcher (the common case: a parent,
	// a region, a remote Ask) is held without a map, a second makes one
	watcher    *handle
	watchers   map[refKey]*handle
	watching   map[refKey]AnyRef // whom this actor watches
	children   map[*handle]struct{}
	adapters   []*handle // adapters to unregister at stop or restart
	adapterSeq uint64
	childSeq   uint64
}

// addWatcher records a watcher of the actor.
func (l *cellLinks) addWatcher(h *handle) {
	switch {
	case l.watchers != nil:
		l.watchers[h.key] = h
	case l.watcher == nil || l.watcher.key == h.key:
		l.watcher = h
	default:
		l.watchers = map[refKey]*handle{l.watcher.key: l.watcher, h.key: h}
		l.watcher = nil
	}
}

// removeWatcher forgets the watcher with key k.
func (l *cellLinks) removeWatcher(k refKey) {
	if l.watcher != nil && l.watcher.key == k {
		l.watcher = nil
	}
	delete(l.watchers, k)
	if len(l.watchers) == 0 {
		l.watchers = nil // an actor asked from afar goes back to its idle size
	}
}

// eachWatcher calls f for every watcher of the actor.
func (l *cellLinks) eachWatcher(f func(*handle)) {
	if l.watcher != nil {
		f(l.watcher)
	}
	for _, w := range l.watchers {
		f(w)
	}
}

// dropLinksIfUnused gives the links back once they hold nothing, so
// that an actor watched for a while (asked from afar) goes back to its
// idle size. Links that named a child or an adapter stay: their sequence
// numbers keep generated names from being given twice.
func (c *cell[T]) dropLinksIfUnused() {
	l := c.links
	if l != nil && l.watcher == nil && l.watchers == nil && len(l.watching) == 0 && len(l.children) == 0 &&
		len(l.adapters) == 0 && l.adapterSeq == 0 && l.childSeq == 0 && l.stopReason == nil {
		c.links = nil
	}
}

// linksFor returns the actor's links, made on first use.
func (c *cell[T]) linksFor() *cellLinks {
	if c.links == nil {
		c.links = &cellLinks{}
	}
	return c.links
}

// setStopping marks the actor as stopping, for reason.
func (c *cell[T]) setStopping(reason error) {
	c.stopping = true
	if reason != nil || c.links != nil {
		c.linksFor().stopReason = reason
	}
}

// recentStops keeps why this node's last actors stopped, for a watch
// that reaches an actor only after it stopped (a remote watch frame the
// stop overtook, a Watch placed late): such a watcher gets the real
// reason (ErrParentStopped, a panic) rather than a bare ErrActorStopped.
// Only stops with a reason are kept, the last maxRecentStops of them.
type recentStops struct {
	mu   mutex[lkRecentStops]
	ring []stopKey // maxRecentStops slots, made by the first stop kept
	next int
	by   map[stopKey]stoppedAt
}

const maxRecentStops = 1024

type stopKey struct {
	path string
	uuid UUID
}

// stoppedAt is a kept reason and the ring slot that holds its key.
type stoppedAt struct {
	reason error
	slot   int
}

// record keeps that the actor at path with uuid stopped for reason.
func (s *recentStops) record(path string, uuid UUID, reason error) {
	if reason == nil {
		return
	}
	if pe, ok := reason.(*PanicError); ok && pe.Stack != nil {
		reason = &PanicError{Value: pe.Value} // (a late watcher gets no stack: 1,024 of them would cost megabytes)
	}
	k := stopKey{path, uuid}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.by == nil {
		s.by, s.ring = make(map[stopKey]stoppedAt), make([]stopKey, maxRecentStops)
	}
	if old, ok := s.by[s.ring[s.next]]; ok && old.slot == s.next {
		delete(s.by, s.ring[s.next]) // (the oldest goes)
	}
	s.ring[s.next] = k
	s.by[k] = stoppedAt{reason, s.next}
	s.next = (s.next + 1) % maxRecentStops
}

// reason says why the actor at path with uuid stopped, if it is one of
// the last kept; otherwise def.
func (s *recentStops) reason(path string, uuid UUID, def error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r, ok := s.by[stopKey{path, uuid}]; ok {
		return r.reason
	}
	return def
}

// recoverFailure, deferred around every handler call, turns a panic or a
// failure reported with Fail into the strategy's action. inSetup says
// whether the handler was Setup.
func (c *cell[T]) recoverFailure(inSetup bool) {
	if p := recover(); p != nil {
		c.onFailure(&PanicError{Value: p, Stack: debug.Stack()}, inSetup)
		return
	}
	if c.tools != nil && c.tools.failed != nil {
		err := c.tools.failed
		c.tools.failed = nil
		c.onFailure(&failureError{Err: err}, inSetup)
	}
}

// onFailure applies the strategy to a failure, logging it once.
func (c *cell[T]) onFailure(reason error, inSetup bool) {
	c.n.totals.actorFailures.Add(1)
	if c.tools != nil {
		c.tools.failed = nil
	}
	if c.stopping {
		// It was stopping anyway (Stop, then a panic): the failure is
		// the better reason.
		c.linksFor().stopReason = reason
		c.n.log.Error("troupe: actor failed while stopping", "path", c.self.key.path, "error", reason)
		return
	}
	s := Strategy{}
	if c.b.sup != nil {
		s = c.b.sup.strategy
	}
	action, why := actStop, ""
	if s.action != actStop {
		st := c.supervision()
		action, st.failures, why = s.decide(st.failures, inSetup, time.Now())
	}
	attrs := []any{"path", c.self.key.path, "error", reason}
	if pe, ok := reason.(*PanicError); ok {
		attrs = append(attrs, stackAttr(pe.Stack))
	}
	switch action {
	case actResume:
		c.n.log.Error("troupe: actor failed; resuming it", attrs...)
	case actRestart:
		if pause := c.choosePause(s); pause > 0 {
			attrs = append(attrs, "backoff", pause)
		}
		c.n.log.Error("troupe: actor failed; restarting it", attrs...)
		c.beginRestart(reason, s)
	default:
		c.n.log.Error("troupe: actor failed; stopping it"+why, append(attrs, "strategy", s.String())...)
		c.setStopping(reason)
	}
}

// supervision returns the actor's supervision state, making it on first
// use.
func (c *cell[T]) supervision() *supState {
	t := c.tooling()
	if t.sup == nil {
		t.sup = &supState{}
	}
	return t.sup
}

// beginRestart holds the mailbox, tells the old behavior, drops what a
// restart drops and then waits for the children, the backoff, or nothing.
func (c *cell[T]) beginRestart(reason error, s Strategy) {
	c.mu.Lock()
	c.held = true
	c.mu.Unlock()
	if c.b.Signal != nil {
		c.signalQuietly(PreRestart{Reason: reason})
	}
	st := c.supervision()
	c.stopTimers()
	c.tools.ctx, c.tools.cancel = nil, nil // the fresh state gets a new one
	c.mu.Lock()
	if c.waits != nil && c.waits.more != nil {
		c.waits.more.cancel = nil
	}
	c.mu.Unlock()
	c.dropWatches()
	l := c.links
	if l == nil {
		l = &cellLinks{} // (read only: an actor without links)
	}
	for _, a := range l.adapters {
		a.local.(retirable).retire()
		c.n.actors.remove(a.key.path)
	}
	l.adapters = nil
	st.reason = reason
	st.gen++
	if !s.keepChildren && len(l.children) > 0 {
		st.phase = restartChildren
		for ch := range l.children {
			ch.local.sysPush(sysMsg{kind: sysStop, reason: ErrParentStopped})
		}
		return
	}
	c.afterChildren(s)
}

// afterChildren starts the backoff, or makes the restart due at once.
func (c *cell[T]) afterChildren(s Strategy) {
	st := c.tools.sup
	if s.minBackoff <= 0 {
		st.phase = restartDue
		c.sysPush(sysMsg{kind: sysRestart, timerGen: st.gen})
		return
	}
	st.phase = restartBackoff
	gen := st.gen
	st.timer = time.AfterFunc(st.pause, func() { c.sysPush(sysMsg{kind: sysRestart, timerGen: gen}) })
}

// choosePause picks the backoff of the restart that begins now (0 for a
// strategy without one), so that the log line announcing the restart can
// say how long the actor will be away.
func (c *cell[T]) choosePause(s Strategy) time.Duration {
	st := c.supervision()
	st.pause = 0
	if s.minBackoff <= 0 {
		return 0
	}
	if !st.lastRestart.IsZero() && time.Since(st.lastRestart) > s.maxBackoff {
		st.backoffs = 0 // it ran long enough to count as recovered
	}
	st.pause = backoff(s, st.backoffs, rand.Float64())
	st.backoffs++
	return st.pause
}

// childGone notes a stopped child during a restart that waits for them.
func (c *cell[T]) childGone() {
	if c.tools != nil && c.tools.sup != nil && c.tools.sup.phase == restartChildren && (c.links == nil || len(c.links.children) == 0) {
		c.afterChildren(c.b.sup.strategy)
	}
}

// restart builds the behavior again and runs its Setup; gen names the
// restart the message belongs to.
func (c *cell[T]) restart(gen uint64) {
	if c.tools == nil || c.tools.sup == nil || c.tools.sup.gen != gen || c.stopping {
		return
	}
	st := c.tools.sup
	if st.phase != restartDue && st.phase != restartBackoff {
		return
	}
	st.phase, st.timer, st.reason = restartNone, nil, nil
	st.lastRestart = time.Now()
	b, err := c.b.behavior()
	if err != nil {
		c.n.log.Error("troupe: actor could not be restarted; stopping it", "path", c.self.key.path, "error", err)
		c.setStopping(err)
		return
	}
	c.b = b
	c.n.totals.actorRestarts.Add(1)
	c.n.actors.restarted(c.self.key.path)
	c.mu.Lock()
	c.held = false
	c.mu.Unlock()
	if b.Setup != nil {
		c.runSetup()
	}
}

// signalQuietly delivers a lifecycle signal; a failure in its handler is
// logged and changes nothing.
func (c *cell[T]) signalQuietly(s Signal) {
	defer func() {
		if p := recover(); p != nil {
			c.n.log.Error("troupe: actor panicked handling a lifecycle signal; ignored", "path", c.self.key.path, "signal", fmt.Sprintf("%T", s), "panic", p)
		}
		if c.tools != nil {
			c.tools.failed = nil
		}
	}()
	c.b.Signal(&c.ctx, s)
}

// dropWatches cancels every watch this actor holds.
func (c *cell[T]) dropWatches() {
	if c.links == nil {
		return
	}
	for key, r := range c.links.watching {
		if h := r.handle(); h.assoc != nil {
			h.assoc.unwatch(h, c.self)
		} else if h.local != nil {
			h.local.watchHandle().local.sysPush(sysMsg{kind: sysUnwatch, ref: c.self})
		}
		delete(c.links.watching, key)
	}
	c.dropLinksIfUnused()
}
