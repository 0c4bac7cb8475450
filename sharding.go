package troupe

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"reflect"
	"sync"
	"sync/atomic"
	"time"
)

// Sharded entities: actors of one kind addressed by an id from any
// member, grouped into a fixed number of shards, each shard run by one
// member at a time. A coordinator (a cluster singleton per kind) places
// shards on members and moves them; each member's region (an actor at
// /system/sharding-NAME) runs the entities of the shards placed on it and
// hands every other message to the member that runs its shard.
//
// This file holds the API and the sending side: the route a message
// takes from Entity(id).Tell to an entity, on the sender's goroutine.

// ShardingConfig configures [Sharding]. The zero value of each field
// means its documented default.
type ShardingConfig struct {
	// Shards is the number of shards the ids are spread over (an id's
	// shard is a hash of it). Every member must use the same number.
	// Default: 1,000 (ten times the members of a large cluster, so that
	// shards even out).
	Shards int

	// PassivateAfter stops an entity that has had no message for that
	// long (give or take a quarter); its next message starts it again. A
	// negative value never passivates. Default: 2 minutes.
	PassivateAfter time.Duration

	// Buffer bounds the messages this member holds for shards without a
	// home it can send to (being placed, or moving); past it a message is
	// a dead letter with [ErrEntityUnavailable]. Default: 100,000.
	Buffer int

	// HandOffTimeout bounds how long a member that gives a shard away
	// waits for the other members to say they sent it everything they
	// had for it (a member that does not answer, being cut off or gone,
	// is waited for no longer). Default: 10 s.
	HandOffTimeout time.Duration

	// RebalanceInterval is how often the coordinator evens out the
	// shards over the members (it moves at most a tenth of them, at least
	// one, per round). Default: 2 s.
	RebalanceInterval time.Duration

	// RemovalMargin is how long the coordinator waits, after a member
	// that ran shards was downed or removed without handing them over,
	// before it places them elsewhere: time for the downed side, which
	// may not know yet, to stop its entities. As for [Singleton], it is
	// never less than the cluster's LeaseReleaseAfter. Default: that.
	RemovalMargin time.Duration
}

// ErrEntityUnavailable is the reason of a dead letter for a message to a
// sharded entity that this member could not hold: its buffer was full,
// or the member's cluster (or its sharding of the kind) stopped.
var ErrEntityUnavailable = errors.New("troupe: the sharded entity's shard has no home this member can hand the message to")

// Sharded is one kind of sharded entity as this member sees it.
type Sharded[T any] struct {
	r *region[T]
}

// Sharding makes this member one of the members that run entities of the
// kind name, each an actor made by factory for its id, and returns what
// addresses them. Every member of the cluster must call it with the same
// name, factory and Shards: the coordinator places shards only once every
// up member has a region for the kind (see the README, "Sharded
// entities"). It returns [ErrBadName], [ErrNameTaken] (a kind of this
// name runs here already) or [ErrClusterStopped].
func Sharding[T any](c *Cluster, name string, factory func(id string) Behavior[T], cfg ShardingConfig) (*Sharded[T], error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults(c)
	select {
	case <-c.done:
		return nil, ErrClusterStopped
	default:
	}
	r := &region[T]{c: c, n: c.n, name: name, factory: factory, cfg: cfg,
		prefix: "/system/sharding-" + name + "/entity/", path: "/system/sharding-" + name,
		shards: make([]*shard[T], cfg.Shards), byPath: map[string]*entity[T]{},
		flushed: map[int32]*shardFlushes{}, ended: make(chan struct{}), tick: tickEvery(c.cfg.GossipInterval, cfg)}
	for i := range r.shards {
		r.shards[i] = &shard[T]{id: int32(i)}
	}
	if err := c.shardings.add(name, nil); err != nil { // (reserved: set once whole)
		return nil, err
	}
	coord, err := Singleton(c, "sharding-"+name, func() Behavior[shardCoordMsg] { return newCoordinator(c, name, cfg) },
		SingletonConfig{RemovalMargin: cfg.RemovalMargin})
	if err != nil {
		c.shardings.drop(name)
		return nil, err
	}
	r.h = clusterRegionHost{c: c, coord: coord, path: r.path}
	ref, err := Spawn(systemParent{c.n}, "sharding-"+name, r.behavior())
	if err != nil {
		c.shardings.drop(name)
		return nil, err
	}
	r.self = ref
	c.shardings.mu.Lock()
	if c.shardings.ended {
		// The cluster stopped meanwhile: its regions were ended already.
		c.shardings.mu.Unlock()
		stopAndWait(c.n, ref)
		return nil, ErrClusterStopped
	}
	c.shardings.by[name] = r
	c.shardings.mu.Unlock()
	c.shardings.noteMargin(cfg.RemovalMargin)
	c.n.actors.addKind(r.prefix, r.entityHandle)
	return &Sharded[T]{r: r}, nil
}

func (cfg ShardingConfig) withDefaults(c *Cluster) ShardingConfig {
	if cfg.Shards <= 0 {
		cfg.Shards = 1000
	}
	if cfg.PassivateAfter == 0 {
		cfg.PassivateAfter = 2 * time.Minute
	}
	if cfg.Buffer <= 0 {
		cfg.Buffer = 100000
	}
	if cfg.HandOffTimeout <= 0 {
		cfg.HandOffTimeout = 10 * time.Second
	}
	if cfg.RebalanceInterval <= 0 {
		cfg.RebalanceInterval = 2 * time.Second
	}
	cfg.RemovalMargin = max(cfg.RemovalMargin, c.cfg.LeaseReleaseAfter)
	return cfg
}

// Entity returns the ref of the entity id, usable from any goroutine and
// any member: the entity starts on its first message, on the member that
// runs its shard. Messages from one sender to one entity arrive in the
// order they were sent, across the moves of its shard too. The ref can
// travel inside messages: sent from another node, it goes through this
// member. Watching it watches this member's region of the kind (an
// entity comes and goes by itself: it is not watched).
func (s *Sharded[T]) Entity(id string) Ref[T] {
	return Ref[T]{h: s.r.entityHandle(id)}
}

// Stats returns what this member's region of the kind holds now: the
// shards it runs (stopping ones included), the entities running on it,
// and the messages it holds for shards without a home to send to.
func (s *Sharded[T]) Stats() struct{ Shards, Entities, Held int } {
	st := &s.r.stats
	return struct{ Shards, Entities, Held int }{int(st.shards.Load()), int(st.entities.Load()), int(st.held.Load())}
}

// Shard returns the shard of id (0 to Shards-1).
func (s *Sharded[T]) Shard(id string) int { return int(s.r.shardOf(id)) }

// Passivate asks the sharding that runs the entity of c to stop it: the
// messages already in its mailbox are handled first, and a message sent
// meanwhile starts it again afterwards. An entity calls it from its own
// handler to go idle (Akka's passivation by the entity's request). For an
// actor that is not a sharded entity it does what [Context.Stop] does.
func Passivate[T any](c *Context[T]) {
	if p, ok := c.c.parent.(*cell[regionMsg]); ok && p.push(shardPassivate{path: c.c.self.key.path}) == nil {
		return
	}
	c.Stop()
}

// shardOf returns the shard of id: FNV-1a, modulo the shard count.
func (r *region[T]) shardOf(id string) int32 {
	h := fnv.New32a()
	h.Write([]byte(id))
	return int32(h.Sum32() % uint32(len(r.shards)))
}

// entityHandle returns a handle for the entity id on this member.
func (r *region[T]) entityHandle(id string) *handle {
	t := &entityTarget[T]{r: r, id: id}
	return &handle{node: r.n, key: refKey{node: r.n.uid, path: r.prefix + id}, local: t}
}

// entityTarget is where an entity ref of this member delivers: the route.
type entityTarget[T any] struct {
	r  *region[T]
	id string
}

func (e *entityTarget[T]) tellAny(msg any) error { return e.tellWire(msg, 0, nil) }

// tellWire takes a message sent here; one with a size came from another
// member (the association's reader gives it).
func (e *entityTarget[T]) tellWire(msg any, size int, hd Headers) error {
	m, ok := msg.(T)
	if !ok {
		return fmt.Errorf("%w: entity wants %s, got %T", ErrWrongType, reflect.TypeFor[T](), msg)
	}
	return e.r.route(nil, e.id, m, hd, size > 0)
}

func (e *entityTarget[T]) sendWait(ctx context.Context, msg any, hd Headers) error {
	m, ok := msg.(T)
	if !ok {
		return e.tellAny(msg)
	}
	return e.r.route(ctx, e.id, m, hd, false)
}

func (e *entityTarget[T]) sysPush(m sysMsg) bool  { return e.r.self.h.local.sysPush(m) }
func (e *entityTarget[T]) watchHandle() *handle   { return e.r.self.h }
func (e *entityTarget[T]) protocol() reflect.Type { return reflect.TypeFor[T]() }

// route hands msg for the entity id on: straight to the entity when its
// shard runs here and the entity is running, straight to the member that
// runs the shard when that is known, else through the region, which
// holds it until the shard has a home. A message goes straight only
// while the region holds nothing for the shard (queued), so a sender's
// messages never overtake each other; the region waits for the senders
// between reading the shard's state and handing a message on (inflight)
// before it changes where the shard's messages go. A message that came
// from another member (relayed) and goes on to a third is noted
// (shard.relayed): the region then asks the coordinator whether it still
// runs there.
func (r *region[T]) route(_ context.Context, id string, m T, hd Headers, relayed bool) error {
	sh := r.shards[r.shardOf(id)]
	r.mu.RLock()
	if r.over {
		r.mu.RUnlock()
		return ErrEntityUnavailable
	}
	if sh.queued.Load() == 0 {
		switch sh.mode {
		case shardHere:
			if e := sh.entities[id]; e != nil && e.open {
				sh.inflight.Add(1)
				r.mu.RUnlock()
				defer sh.inflight.Add(-1)
				e.touch(r.clock.Load())
				return deliverLocal(nil, e.cell, m, hd) // (no wait while counted)
			}
		case shardThere:
			if r.c.shardings.isGone(sh.homeUID) {
				break // (the region holds it until the shard runs elsewhere)
			}
			if relayed && !sh.relayed.Load() {
				sh.relayed.Store(true)
			}
			sh.inflight.Add(1)
			home := sh.home
			r.mu.RUnlock()
			h := &handle{node: r.n, key: refKey{node: home.key.node, path: r.prefix + id}, assoc: home.assoc}
			err := home.assoc.send(nil, h, m, hd)
			if err == nil || !home.assoc.gone() {
				sh.inflight.Add(-1)
				return err
			}
			// Its member is gone, and the region has not seen it yet: the
			// region holds the message until the shard runs elsewhere.
			r.mu.RLock()
			sh.queued.Add(1)
			sh.inflight.Add(-1)
			r.mu.RUnlock()
			return r.viaRegion(sh, id, m, hd, false)
		}
	}
	sh.queued.Add(1)
	r.mu.RUnlock()
	return r.viaRegion(sh, id, m, hd, relayed)
}

// viaRegion hands a message counted in sh.queued to the region.
func (r *region[T]) viaRegion(sh *shard[T], id string, m T, hd Headers, relayed bool) error {
	if err := r.self.h.local.tellAny(shardEnvelope[T]{id: id, msg: m, hd: hd, to: r.prefix + id, relayed: relayed}); err != nil {
		sh.queued.Add(-1)
		return fmt.Errorf("%w: %w", ErrEntityUnavailable, err)
	}
	return nil
}

// tellQueued sends msg to the actor at path on the member uid at addr,
// through the association to it, dialing one if there is none: unlike
// tellMember it does not wait for the association to be up (what is sent
// before it is up is queued in order, ahead of this). false if there is
// no association to be had (the address is refused, or the node closes).
func tellQueued[M any](n *Node, addr Addr, uid NodeUID, path string, msg M) bool {
	a, err := n.peers.assocFor(addr)
	if err != nil {
		return false
	}
	h := &handle{node: n, key: refKey{node: uid, path: path}, assoc: a}
	return a.send(nil, h, msg, nil) == nil
}

// deliverLocal pushes m into the entity's mailbox (waiting for room when
// ctx is set, as Send does).
func deliverLocal[T any](ctx context.Context, c *cell[T], m T, hd Headers) error {
	if ctx != nil {
		return c.pushWait(ctx, m, hd)
	}
	if hd != nil {
		return c.tellWire(m, 0, hd)
	}
	return c.push(m)
}

// shardMode is where a shard's messages go from this member.
type shardMode uint8

const (
	shardNowhere  shardMode = iota // no home known: the region holds them
	shardHere                      // this member runs it
	shardThere                     // another member runs it
	shardStopping                  // this member stops it, handing it over: held
)

// shard is one shard as this member's region sees it. mode, home and
// entities change under the region's mu, on its goroutine only.
type shard[T any] struct {
	id       int32
	mode     shardMode
	home     *handle               // shardThere: a handle bound to the home's association
	homeUID  NodeUID               // shardThere
	entities map[string]*entity[T] // shardHere, shardStopping
	queued   atomic.Int64          // messages for it in the region's mailbox or buffer
	inflight atomic.Int64          // senders handing a message on straight
	// relayed: a message came from another member, which took this one
	// for the shard's home, and went on to the home this one knows: one
	// of them may have missed a word of the coordinator (onTick asks).
	relayed    atomic.Bool
	verifiedAt time.Time // when the region last asked for it (onTick)

	// The region's goroutine only.
	held     []shardEnvelope[T] // while nowhere or stopping, in order
	askedAt  time.Time          // when the region last asked the coordinator
	askWait  time.Duration      // how long after askedAt it asks again, unanswered (ask)
	stopping int                // entities still stopping in a hand-over
	handOff  *shardHandOffState
	fence    Fence // shardHere: the placement's, its entities' (fence.go)
}

// entity is a running (or stopping) entity of a shard run here.
type entity[T any] struct {
	id    string
	ref   Ref[T]
	cell  *cell[T]
	open  bool          // takes messages straight (under the region's mu)
	last  atomic.Uint32 // the region's clock at its last message
	held  []shardEnvelope[T]
	going bool // stopping (passivated or handed over)
}

func (e *entity[T]) touch(now uint32) {
	if e.last.Load() != now {
		e.last.Store(now)
	}
}

// shardEnvelope is a message for an entity on its way through a region.
type shardEnvelope[T any] struct {
	id  string
	msg T
	hd  Headers
	to  string // the entity's path on this member (its dead letter's target)
	// relayed: it came from another member, which takes this one for its
	// shard's home.
	relayed bool
}

func (shardEnvelope[T]) regionMsg() {}

func (e shardEnvelope[T]) unwrap() (string, any) { return e.to, e.msg }

// shardPassivate is an entity's request to be passivated.
type shardPassivate struct{ path string }

func (shardPassivate) regionMsg() {}

// shardings are the kinds of sharded entity this member runs.
type shardings struct {
	mu    mutex[lkShardings]
	by    map[string]regionRunner
	ended bool // the cluster stopped: no kind is added

	// gone are the members seen unreachable, downed or removed (true:
	// for good), read without a lock on the sharded entities' send path
	// (copied on write; the cluster's loop writes it).
	gone      atomic.Pointer[map[NodeUID]bool]
	maxMargin atomic.Int64 // the longest RemovalMargin of the member's sharded kinds
}

func (ss *shardings) add(name string, r regionRunner) error {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.ended {
		return ErrClusterStopped
	}
	if _, ok := ss.by[name]; ok {
		return fmt.Errorf("%w: sharding %s", ErrNameTaken, name)
	}
	if ss.by == nil {
		ss.by = map[string]regionRunner{}
	}
	ss.by[name] = r
	return nil
}

func (ss *shardings) drop(name string) {
	ss.mu.Lock()
	delete(ss.by, name)
	ss.mu.Unlock()
}

func (ss *shardings) regions() []regionRunner {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	out := make([]regionRunner, 0, len(ss.by))
	for _, r := range ss.by {
		if r != nil {
			out = append(out, r)
		}
	}
	return out
}

// noteMargin keeps the longest RemovalMargin of the member's kinds: the
// downings the coordinators look back on are kept that long.
func (ss *shardings) noteMargin(d time.Duration) {
	for {
		old := ss.maxMargin.Load()
		if int64(d) <= old || ss.maxMargin.CompareAndSwap(old, int64(d)) {
			return
		}
	}
}

// noteGone follows the members events show unreachable, downed or
// removed (the shards they run are held, not sent to them); true if the
// set changed.
func (ss *shardings) noteGone(events []MemberEvent, self NodeUID) bool {
	for {
		p := ss.gone.Load()
		m := goneAfter(p, events, self)
		if m == nil {
			return false
		}
		if ss.gone.CompareAndSwap(p, &m) {
			return true
		}
	}
}

// isGone reports whether the member uid is unreachable, downed or
// removed, as this member last heard.
func (ss *shardings) isGone(uid NodeUID) bool {
	p := ss.gone.Load()
	if p == nil {
		return false
	}
	_, ok := (*p)[uid]
	return ok
}

// poke has every region look at the membership again.
func (ss *shardings) poke() {
	for _, r := range ss.regions() {
		r.poke()
	}
}

// end stops every region's entities as the cluster stops, before
// its singletons (the coordinators among them) hand over.
func (ss *shardings) end() {
	ss.mu.Lock()
	ss.ended = true
	ss.mu.Unlock()
	var wg sync.WaitGroup
	for _, r := range ss.regions() {
		wg.Go(r.end)
	}
	wg.Wait()
}

// regionRunner is a region of any message type, as the cluster keeps
// them.
type regionRunner interface {
	end()
	handOver(ctx context.Context, hurry <-chan struct{})
	poke()
	handOffTimeout() time.Duration
}

// goneAfter returns the set p after events, or nil if they change
// nothing.
func goneAfter(p *map[NodeUID]bool, events []MemberEvent, self NodeUID) map[NodeUID]bool {
	var old map[NodeUID]bool
	if p != nil {
		old = *p
	}
	var m map[NodeUID]bool
	for _, e := range events {
		uid := e.Member.UID
		var away bool
		switch {
		case uid == self:
			continue
		case e.Kind == eventMemberUnreachable || e.Kind == eventMemberStatus && e.Member.Status >= MemberDown:
			away = true
		case e.Kind == eventMemberReachable && e.Member.Status < MemberDown:
		default:
			continue
		}
		forGood := e.Kind == eventMemberStatus
		if was, ok := old[uid]; away && ok && (was || !forGood) || !away && (!ok || was) {
			continue // (no change; a downed member stays away)
		}
		if m == nil {
			m = maps.Clone(old)
			if m == nil {
				m = map[NodeUID]bool{}
			}
		}
		if away {
			m[uid] = forGood
		} else {
			delete(m, uid)
		}
	}
	if len(m) > 4096 {
		for uid := range m { // (removed long ago; the regions' ticks cover them)
			delete(m, uid)
			if len(m) <= 2048 {
				break
			}
		}
	}
	return m
}
