package troupe

import (
	"errors"
	"fmt"
	"time"
)

// A cluster singleton: one instance of an actor in the whole cluster, on
// its oldest up member, reached from every member through a station (an
// actor at the same path on each) that forwards to the oldest member's
// station, or holds messages while no instance runs where they are
// headed. The instance moves on when its member leaves (stopped there
// first, then started on the next oldest member: a hand-over) or is
// downed (started on the next oldest only a margin after the downing,
// time for a downed side that does not know it yet to decide and stop its
// own).

// SingletonConfig configures a [Singleton]. The zero value of each field
// means its documented default.
type SingletonConfig struct {
	// Buffer bounds the messages a member holds for the singleton while
	// no instance runs where they are headed (a hand-over, or before the
	// first start); past it, a message is a dead letter with
	// ErrSingletonUnavailable. Default: 10,000.
	Buffer int

	// RemovalMargin is how long the next oldest member waits, after a
	// member that may run the instance is seen downed or removed without
	// handing over, before it starts the instance: time for the downed
	// side, which may not know it was downed, to decide and stop its own.
	// It is never less than the cluster's LeaseReleaseAfter (67 s with
	// the default timings), the longest that decision takes (an unstable
	// side, a minority waiting for the lease, a process that stood
	// still); a smaller value is raised to it. Default: that time.
	RemovalMargin time.Duration
}

// ErrSingletonUnavailable is the reason of a dead letter for a message a
// singleton's station could not hold: its buffer was full, or the
// member's cluster stopped.
var ErrSingletonUnavailable = errors.New("troupe: the cluster singleton is not running where this member can hand it the message")

// singletonCtl is a member's word to the others about a singleton: it
// does not run the instance, and will not (it stopped it, or leaves).
type singletonCtl struct {
	Name string
	// Cleared are older members the sender knows handed the singleton
	// over, so that a member that joined after their hand-over does not
	// wait the margin for them.
	Cleared []NodeUID
	sentBy  // stamped by the association
}

func init() {
	SetWireKey[singletonCtl]("troupe.singleton.handover")
}

func (m singletonCtl) stamped(s sentBy) any { m.sentBy = s; return m }

const singletonCtlPath = "/system/singletons"

// Singleton makes this member one of the members that can run the
// singleton name of the cluster c, an actor made by factory, and returns
// the ref through which this member sends to it, wherever it runs. Every
// member of the cluster must call it with the same name and factory (a
// member that does not is still counted as the oldest: messages sent
// toward it are dead letters). The instance runs on the oldest up member
// (the lowest up number) only; it starts once every older member has
// handed it over (it stopped its instance, or leaves) or was downed at
// least RemovalMargin ago. Messages sent while no instance runs where
// they are headed are held (up to Buffer) and delivered, in order, when
// it starts. It returns [ErrBadName], [ErrNameTaken] (a singleton of
// this name runs here already) or [ErrClusterStopped].
func Singleton[T any](c *Cluster, name string, factory func() Behavior[T], cfg SingletonConfig) (Ref[T], error) {
	if err := checkName(name); err != nil {
		return Ref[T]{}, err
	}
	if cfg.Buffer <= 0 {
		cfg.Buffer = 10000
	}
	cfg.RemovalMargin = max(cfg.RemovalMargin, c.cfg.LeaseReleaseAfter)
	select {
	case <-c.done:
		return Ref[T]{}, ErrClusterStopped
	default:
	}
	s := &singleton[T]{c: c, n: c.n, name: name, factory: factory, cfg: cfg,
		place: newPlacement(cfg.RemovalMargin),
		wake:  make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}), fence: newPauseFence()}
	if err := c.singletons.add(c.n, name, s); err != nil {
		return Ref[T]{}, err
	}
	ref, err := Spawn(systemParent{c.n}, "singleton-"+name, Behavior[T]{Receive: func(_ *Context[T], m T) { s.receive(m) }})
	if err != nil {
		c.singletons.drop(name)
		return Ref[T]{}, err
	}
	s.station = ref
	c.n.wg.Go(s.run)
	return ref, nil
}

// singletonRunner is a singleton of any message type, as the cluster
// keeps them.
type singletonRunner interface {
	handedOver(from NodeUID, cleared []NodeUID)
	poke()
}

// singletons are the singletons this member takes part in.
type singletons struct {
	mu  mutex[lkSingletons]
	by  map[string]singletonRunner
	ctl *Ref[singletonCtl]
}

// add records s under name, starting the member's control actor
// with the first.
func (ss *singletons) add(n *Node, name string, s singletonRunner) error {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if _, ok := ss.by[name]; ok {
		return fmt.Errorf("%w: singleton %s", ErrNameTaken, name)
	}
	if ss.ctl == nil {
		ref, err := Spawn(systemParent{n}, "singletons", Behavior[singletonCtl]{Receive: func(_ *Context[singletonCtl], m singletonCtl) {
			ss.mu.Lock()
			r := ss.by[m.Name]
			ss.mu.Unlock()
			if r != nil {
				r.handedOver(m.from, m.Cleared)
			}
		}})
		if err != nil {
			return err
		}
		ss.ctl = &ref
	}
	if ss.by == nil {
		ss.by = map[string]singletonRunner{}
	}
	ss.by[name] = s
	return nil
}

func (ss *singletons) drop(name string) {
	ss.mu.Lock()
	delete(ss.by, name)
	ss.mu.Unlock()
}

// stop stops the member's control actor as the cluster stops
// (the singletons' own goroutines end when it has): a cluster started
// next on the node makes its own.
func (ss *singletons) stop(n *Node) {
	ss.mu.Lock()
	ctl := ss.ctl
	ss.ctl = nil
	ss.mu.Unlock()
	if ctl != nil {
		stopAndWait(n, *ctl)
	}
}

// poke has every singleton look at the membership again.
func (ss *singletons) poke() {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	for _, s := range ss.by {
		s.poke()
	}
}

// singleton is one singleton's side on this member.
type singleton[T any] struct {
	c       *Cluster
	n       *Node
	name    string
	factory func() Behavior[T]
	cfg     SingletonConfig
	station Ref[T]

	// mu guards where the station sends (the instance here, a member's
	// station, or the buffer) and the buffer.
	mu       mutex[lkSingleton]
	instance *Ref[T] // running here, taking messages
	fwd      *Ref[T] // the oldest member's station
	buf      []T
	ended    bool

	// The run goroutine's own state.
	place     placement     // where the instance belongs (its handed under mu: the control actor writes it)
	target    NodeUID       // the member the station sends to (zero: none)
	pm        pauseMeter    // when this goroutine stood still
	waited    bool          // this turn waited for the instance to stop
	inFactory time.Duration // this turn's time in the user's factory (not a pause)
	fence     *pauseFence   // what it tells the instance of a pause (singleton_fence.go)

	wake chan struct{} // capacity 1
	stop chan struct{}
	done chan struct{}
}

func (s *singleton[T]) poke() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func (s *singleton[T]) handedOver(from NodeUID, cleared []NodeUID) {
	s.mu.Lock()
	s.place.handedOver(from, cleared)
	s.mu.Unlock()
	s.poke()
}

// receive takes a message sent to the singleton through this member's
// station.
func (s *singleton[T]) receive(m T) {
	s.mu.Lock()
	switch {
	case s.ended:
		s.mu.Unlock()
		s.n.dead.deadLetter(s.station.String(), m, ErrSingletonUnavailable)
	case s.instance != nil && len(s.buf) == 0:
		r := *s.instance
		s.mu.Unlock()
		r.Tell(m)
	case s.fwd != nil && len(s.buf) == 0:
		r := *s.fwd
		s.mu.Unlock()
		r.Tell(m)
	case len(s.buf) < s.cfg.Buffer:
		s.buf = append(s.buf, m)
		s.mu.Unlock()
	default:
		s.mu.Unlock()
		s.n.dead.deadLetter(s.station.String(), m, fmt.Errorf("%w (its buffer of %d is full)", ErrSingletonUnavailable, s.cfg.Buffer))
	}
}

// run follows the membership, on its own goroutine, until the cluster
// stops: it starts and stops the instance here and points the station.
func (s *singleton[T]) run() {
	defer close(s.done)
	t := time.NewTicker(s.c.cfg.GossipInterval)
	defer t.Stop()
	var inst *singletonInstance[T]
	for {
		select {
		case <-s.c.done:
			s.end(inst)
			return
		default:
		}
		now := time.Now()
		s.pm.turn(now, s.c.cfg.GossipInterval, s.c.cfg.StableAfter/4, s.cfg.RemovalMargin)
		stood := s.pm.within(now.Add(-s.cfg.RemovalMargin), now) > s.c.pauseBudget()
		s.fence.turn(now, stood)
		s.waited, s.inFactory = false, 0
		inst = s.step(inst, now, stood)
		// The next turn measures its gap from this one's start, so a
		// pause during the step counts — but for the time the step spent
		// in the user's factory (a slow factory is no pause; a pause
		// within it cannot be told from one); a step that waited for the
		// instance to stop measures from its end (that wait is no pause).
		s.pm.last = now.Add(s.inFactory)
		if s.waited {
			s.pm.last = time.Now()
		}
		select {
		case <-s.wake:
		case <-t.C:
		case <-s.c.done:
		}
	}
}

// singletonInstance is the instance running on this member.
type singletonInstance[T any] struct {
	ref Ref[T]
}

// gone reports whether the instance has stopped (its PostStop done: it
// left the node's table after it).
func (i *singletonInstance[T]) gone(n *Node) bool {
	return n.actors.get(i.ref.h.key.path, i.ref.h.key.uuid) == nil
}

// step looks at the membership once (stood: this process stood still
// within the removal margin); it returns the instance running here, if
// any.
func (s *singleton[T]) step(inst *singletonInstance[T], now time.Time, stood bool) *singletonInstance[T] {
	members := s.c.Members()
	self := s.c.Self()
	target := s.place.see(members, now) // (not under mu: it leaves handed alone, which is all mu guards of place)
	if inst != nil && inst.gone(s.n) {
		inst = nil // it stopped by itself: started again below
		s.point(nil, nil)
	}
	if stood && inst != nil {
		// This process stood still: the others may have downed this
		// member and started the instance elsewhere meanwhile. Stop
		// first; start again only once the pause is a margin old.
		s.n.log.Warn("troupe: this member stood still; stopping its cluster singleton until the pause is RemovalMargin old", "singleton", s.name)
		s.point(nil, nil)
		if !s.stopInstance(inst) {
			return inst
		}
		inst = nil
	}
	if self.Status != MemberUp || target == nil || target.UID != self.UID {
		// Not this member's to run: stop it here first, then say so.
		if inst != nil {
			s.point(nil, nil)
			if !s.stopInstance(inst) {
				return inst // the node is closing: no word of a stop not seen through
			}
			inst = nil
		}
		if self.Status >= MemberLeaving {
			// Leaving: this member will not run it again (a joining one
			// says nothing: it may become the oldest later).
			s.tellHandedOver()
		}
		if target == nil || target.UID == self.UID {
			s.point(nil, nil)
			return nil
		}
		// Forward only to a member this one reaches: else hold (a
		// session to an unreachable member would take messages it cannot
		// deliver).
		if _, reached := s.c.listable()[target.UID]; reached {
			if r, ok := memberRef[T](s.n, target.Addr, s.station.h.key.path); ok {
				s.point(nil, &r)
				return nil
			}
		}
		s.point(nil, nil)
		return nil
	}
	if inst == nil {
		if stood || !s.mayStart(self, now) {
			s.point(nil, nil)
			return nil
		}
		inst = s.startInstance()
		if inst == nil {
			return nil
		}
	}
	s.point(&inst.ref, nil)
	return inst
}

// mayStart reports whether every member older than self has handed the
// singleton over, or was seen downed or removed RemovalMargin ago.
func (s *singleton[T]) mayStart(self Member, now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.place.mayStart(self, now)
}

// point sets where the station sends: the instance here, a member's
// station, or (both nil) the buffer. What the buffer holds goes first, in
// order.
func (s *singleton[T]) point(inst, fwd *Ref[T]) {
	for {
		s.mu.Lock()
		if len(s.buf) == 0 || inst == nil && fwd == nil {
			s.instance, s.fwd = inst, fwd
			s.mu.Unlock()
			return
		}
		s.instance, s.fwd = nil, nil // the station holds what comes meanwhile
		held := s.buf
		s.buf = nil
		s.mu.Unlock()
		for _, m := range held {
			if inst != nil {
				inst.Tell(m)
			} else {
				fwd.Tell(m)
			}
		}
	}
}

var singletonSeq struct {
	mutex[lkSingletonSeq]
	n uint64
}

// startInstance starts the instance on this member.
func (s *singleton[T]) startInstance() *singletonInstance[T] {
	began := time.Now()
	b, err := s.build()
	s.inFactory += time.Since(began) // (the user's time, not a pause: see run)
	if err != nil {
		s.n.log.Warn("troupe: a cluster singleton's factory panicked; trying again", "singleton", s.name, "err", err)
		return nil
	}
	singletonSeq.Lock()
	singletonSeq.n++
	seq := singletonSeq.n
	singletonSeq.Unlock()
	// Its fencing token: a later instance runs on a younger member (a
	// higher up number) or on this one again (a higher count).
	b = withFence(s.fenced(b), Fence{Epoch: uint64(s.c.Self().UpNumber)<<32 | seq&0xffffffff})
	s.fence.open()
	inst := &singletonInstance[T]{}
	ref, err := Spawn(systemParent{s.n}, fmt.Sprintf("singleton-%s-%d", s.name, seq), b)
	if err != nil {
		s.n.log.Warn("troupe: could not start a cluster singleton; trying again", "singleton", s.name, "err", err)
		return nil
	}
	inst.ref = ref
	s.n.log.Info("troupe: cluster singleton started on this member", "singleton", s.name)
	return inst
}

// fenced wraps the instance's handler in the pause fence: a message the
// fence holds back becomes a dead letter (the instance is being stopped;
// the singleton runs on another member). A supervised behavior's factory
// is wrapped, so that every behavior it builds, at start and at each
// restart, is fenced. The loop turns every GossipInterval, so a beat up
// to that old, plus the pause budget, is recent.
func (s *singleton[T]) fenced(b Behavior[T]) Behavior[T] {
	if b.sup != nil {
		sup := *b.sup
		if build := sup.build; build != nil {
			sup.build = func() Behavior[T] { return s.fenced(build()) }
		}
		b.sup = &sup
		return b
	}
	recv := b.Receive
	if recv == nil {
		return b
	}
	budget := s.c.cfg.GossipInterval + s.c.pauseBudget()
	wait := 2*s.c.cfg.GossipInterval + s.c.pauseBudget()
	b.Receive = func(c *Context[T], m T) {
		if !s.fence.mayRun(budget, wait, s.c.done) {
			s.n.dead.deadLetter(s.station.String(), m, fmt.Errorf("%w: this member stood still, and the instance here is being stopped", ErrSingletonUnavailable))
			return
		}
		recv(c, m)
	}
	return b
}

// build calls the factory; a panic is its error.
func (s *singleton[T]) build() (b Behavior[T], err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("%v", p)
		}
	}()
	return s.factory(), nil
}

// stopInstance stops the instance here and waits until it has stopped
// (its PostStop has run, and it left the node's table), unless the node
// is closing (its actors stop with it); it reports whether the stop was
// seen through.
func (s *singleton[T]) stopInstance(inst *singletonInstance[T]) bool {
	s.waited = true
	stopAndWait(s.n, inst.ref)
	return inst.gone(s.n)
}

// tellHandedOver tells every other member that this one does not run the
// singleton and will not.
func (s *singleton[T]) tellHandedOver() {
	s.mu.Lock()
	cleared := s.place.cleared()
	s.mu.Unlock()
	for _, addr := range s.c.liveOthers() {
		tellMember(s.n, addr, singletonCtlPath, singletonCtl{Name: s.name, Cleared: cleared})
	}
}

// end stops the instance here when the cluster stops (left, downed or
// closed), tells the others, and turns what the station holds into dead
// letters.
func (s *singleton[T]) end(inst *singletonInstance[T]) {
	s.mu.Lock()
	s.ended = true
	held := s.buf
	s.buf, s.instance, s.fwd = nil, nil, nil
	s.mu.Unlock()
	if inst == nil || s.stopInstance(inst) {
		s.tellHandedOver() // (else the others wait for the margin)
	}
	for _, m := range held {
		s.n.dead.deadLetter(s.station.String(), m, ErrSingletonUnavailable)
	}
	s.n.Stop(s.station)
	s.c.singletons.drop(s.name)
}
