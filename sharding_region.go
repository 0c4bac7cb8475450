package troupe

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// A member's region of one sharded kind: the actor that runs the entities
// of the shards placed on this member, holds the messages of shards
// without a home, forwards the rest, and takes part in moving shards
// (the coordinator's side is sharding_coordinator.go).

// region is one kind's region on this member.
type region[T any] struct {
	c       *Cluster
	n       *Node
	name    string
	factory func(id string) Behavior[T]
	cfg     ShardingConfig
	prefix  string         // of its entities' paths
	path    string         // the region's own
	self    Ref[regionMsg] // the region actor
	h       regionHost     // its member, for the protocol with the coordinator and the other regions
	tick    time.Duration  // tickEvery
	clock   atomic.Uint32  // quarters of PassivateAfter, for idleness

	// mu guards over and each shard's mode, home and entities (written
	// on the region's goroutine only).
	mu     rwMutex[lkRegion]
	shards []*shard[T]
	over   bool // ended: messages are dead letters

	// The region's goroutine only.
	byPath   map[string]*entity[T]   // running entities by path
	held     int                     // messages held, over all shards
	flushed  map[int32]*shardFlushes // members that flushed a shard to this one
	epoch    uint64                  // the coordinator's this region answers
	clockAt  time.Time               // when clock last moved
	leaving  bool                    // giving its shards away before the member leaves
	leftWait []chan struct{}         // handOver callers
	endWait  int                     // entities still stopping then
	endOnce  sync.Once
	ended    chan struct{} // closed when the region has stopped

	stats struct{ shards, entities, held atomic.Int64 }
}

func (r *region[T]) addHeld(d int) {
	r.held += d
	r.stats.held.Store(int64(r.held))
}

// regionMsg is what a region actor takes.
type regionMsg interface{ regionMsg() }

// shardTick and shardLeave are a region's own messages.
type (
	shardTick  struct{}
	shardLeave struct{ done chan struct{} }
)

func (shardTick) regionMsg()  {}
func (shardLeave) regionMsg() {}

// errPassivated is the stop reason of a passivated entity.
var errPassivated = errors.New("troupe: entity passivated")

func (r *region[T]) behavior() Behavior[regionMsg] {
	return Behavior[regionMsg]{
		Setup: func(ctx *Context[regionMsg]) {
			r.clockAt = r.h.now()
			ctx.StartTicker("tick", r.tick, shardTick{})
		},
		Receive: r.receive,
		Signal: func(ctx *Context[regionMsg], s Signal) {
			switch s := s.(type) {
			case Terminated:
				r.entityStopped(ctx, s.Ref.Path())
			case PostStop:
				// Its entities (children) have stopped: the coordinator
				// may place its shards at once.
				r.mu.Lock()
				r.over = true
				r.mu.Unlock()
				r.dropHeld()
				r.h.tellCoord(shardRegionGone{Origin: r.h.self(), sentBy: sentBy{from: r.h.self()}})
				r.n.actors.dropKind(r.prefix)
				r.endOnce.Do(func() { close(r.ended) })
			}
		},
	}
}

// tickEvery is a region's tick: a gossip interval, shorter for short
// hand-over or passivation times.
func tickEvery(gossip time.Duration, cfg ShardingConfig) time.Duration {
	d := min(gossip, cfg.HandOffTimeout/4)
	if cfg.PassivateAfter > 0 {
		d = min(d, cfg.PassivateAfter/4)
	}
	return max(d, 10*time.Millisecond)
}

// regionHost is the member a region runs on, as the region's protocol
// with the coordinator and the other regions sees it: the node's
// cluster (clusterRegionHost), or a simulated member
// (clustersim_shard_test.go). The entities are the region's own.
type regionHost interface {
	now() time.Time
	self() NodeUID
	tellCoord(msg shardCoordMsg) // through the coordinator's station on this member
	// tellRegion sends msg to the region on the member uid at addr, on
	// the association that carried what this member sent it before.
	tellRegion(addr Addr, uid NodeUID, msg regionMsg)
	// regionAt returns a handle on the region of the member at addr,
	// and that member's uid; false while no association is up to it.
	regionAt(addr Addr) (*handle, NodeUID, bool)
	isGone(uid NodeUID) bool      // shardings.isGone
	liveOthers() map[NodeUID]Addr // Cluster.liveOthers
	logger() *slog.Logger
}

// clusterRegionHost is a region's member in a real cluster.
type clusterRegionHost struct {
	c     *Cluster
	coord Ref[shardCoordMsg] // the coordinator's singleton station here
	path  string             // the regions' path
}

func (h clusterRegionHost) now() time.Time               { return time.Now() }
func (h clusterRegionHost) self() NodeUID                { return h.c.n.uid }
func (h clusterRegionHost) tellCoord(msg shardCoordMsg)  { h.coord.Tell(msg) }
func (h clusterRegionHost) isGone(uid NodeUID) bool      { return h.c.shardings.isGone(uid) }
func (h clusterRegionHost) liveOthers() map[NodeUID]Addr { return h.c.liveOthers() }
func (h clusterRegionHost) logger() *slog.Logger         { return h.c.n.log }

func (h clusterRegionHost) tellRegion(addr Addr, uid NodeUID, msg regionMsg) {
	tellQueued(h.c.n, addr, uid, h.path, msg)
}

func (h clusterRegionHost) regionAt(addr Addr) (*handle, NodeUID, bool) {
	ref, ok := memberRef[regionMsg](h.c.n, addr, h.path)
	if !ok {
		return nil, NodeUID{}, false
	}
	return ref.h, ref.h.key.node, true
}

func (r *region[T]) receive(ctx *Context[regionMsg], m regionMsg) {
	switch m := m.(type) {
	case shardEnvelope[T]:
		r.onEnvelope(ctx, m)
	case shardPassivate:
		if e := r.byPath[m.path]; e != nil {
			r.passivate(e)
		}
	case shardTick:
		r.onTick()
	case shardHello:
		if m.Epoch >= r.epoch {
			r.epoch = m.Epoch
			r.register()
		}
	case shardHome:
		if r.current(m.Epoch) && r.valid(m.Shard) {
			r.onHome(ctx, m)
		}
	case shardMoving:
		if r.current(m.Epoch) && r.valid(m.Shard) {
			r.onMoving(m)
		}
	case shardHandOff:
		if r.current(m.Epoch) && r.valid(m.Shard) {
			r.onHandOff(m)
		}
	case shardFlush:
		if r.valid(m.Shard) {
			r.onFlush(m)
		}
	case shardLeave:
		r.leaving = true
		r.leftWait = append(r.leftWait, m.done)
		r.h.tellCoord(shardLeaving{Origin: r.h.self(), sentBy: sentBy{from: r.h.self()}})
		r.checkLeft()
	}
}

// current reports whether a coordinator's message is from the
// coordinator this region answers or a newer one (which it then answers).
func (r *region[T]) current(epoch uint64) bool {
	if epoch < r.epoch {
		return false // from a coordinator that has since moved
	}
	if epoch > r.epoch {
		r.epoch = epoch
		r.register()
	}
	return true
}

func (r *region[T]) valid(s int32) bool { return s >= 0 && int(s) < len(r.shards) }

// register tells the coordinator which shards run here.
func (r *region[T]) register() {
	var here []int32
	for _, sh := range r.shards {
		if sh.mode == shardHere || sh.mode == shardStopping {
			here = append(here, sh.id)
		}
	}
	r.h.tellCoord(shardRegister{Epoch: r.epoch, Count: int32(len(r.shards)), Shards: here, Leaving: r.leaving, Origin: r.h.self(), sentBy: sentBy{from: r.h.self()}})
}

// onEnvelope takes a message that came through the region.
func (r *region[T]) onEnvelope(ctx *Context[regionMsg], env shardEnvelope[T]) {
	sh := r.shards[r.shardOf(env.id)]
	r.mu.RLock()
	over := r.over
	r.mu.RUnlock()
	if over {
		sh.queued.Add(-1)
		r.n.dead.deadLetter(r.prefix+env.id, env.msg, ErrEntityUnavailable)
		return
	}
	switch r.routeOf(sh, env.relayed) {
	case routeHere:
		r.deliverHere(ctx, sh, env)
	case routeThere:
		h := &handle{node: r.n, key: refKey{node: sh.homeUID, path: r.prefix + env.id}, assoc: sh.home.assoc}
		err := sh.home.assoc.send(nil, h, env.msg, env.hd)
		if err != nil && sh.home.assoc.gone() {
			r.setMode(sh, shardNowhere, nil, NodeUID{}) // its member is gone
			r.hold(sh, env)
			return
		}
		sh.queued.Add(-1)
		if err != nil {
			r.n.dead.deadLetter(h.String(), env.msg, err)
		}
	default:
		r.hold(sh, env)
	}
}

// verifyEvery is how many ticks apart a region asks, at most, where a
// shard runs whose messages other members keep sending it (onTick).
const verifyEvery = 10

// envRoute is where a message the region takes goes (routeOf).
type envRoute uint8

const (
	routeHold  envRoute = iota // held until the shard has a home, asked for
	routeHere                  // to its entity here
	routeThere                 // to the member that runs its shard
)

// routeOf decides where a message for sh goes, relayed if another member
// sent it here; it forgets where the shard runs when that member is gone.
func (r *region[T]) routeOf(sh *shard[T], relayed bool) envRoute {
	switch {
	case sh.mode == shardHere:
		return routeHere
	case sh.mode == shardThere && r.h.isGone(sh.homeUID):
		r.setMode(sh, shardNowhere, nil, NodeUID{}) // its member is gone
		return routeHold
	case sh.mode == shardThere:
		if relayed {
			sh.relayed.Store(true) // (see route)
		}
		return routeThere
	}
	return routeHold
}

// deliverHere hands env to its entity, starting it if need be.
func (r *region[T]) deliverHere(ctx *Context[regionMsg], sh *shard[T], env shardEnvelope[T]) {
	e := sh.entities[env.id]
	if e == nil {
		if e = r.activate(ctx, sh, env.id); e == nil {
			sh.queued.Add(-1)
			r.n.dead.deadLetter(r.prefix+env.id, env.msg, ErrEntityUnavailable)
			return
		}
	}
	if e.going {
		env.relayed = false
		e.held = append(e.held, env) // it starts again once stopped
		r.addHeld(1)
		return
	}
	e.touch(r.clock.Load())
	err := deliverLocal(nil, e.cell, env.msg, env.hd)
	sh.queued.Add(-1)
	if err != nil {
		r.n.dead.deadLetter(e.ref.String(), env.msg, err)
	}
}

// activate starts the entity id, a child of the region.
func (r *region[T]) activate(ctx *Context[regionMsg], sh *shard[T], id string) *entity[T] {
	b, err := r.build(id)
	if err != nil {
		r.n.log.Warn("troupe: a sharded entity's factory panicked", "kind", r.name, "id", id, "err", err)
		return nil
	}
	ref, err := Spawn(ctx, "", withFence(b, sh.fence))
	if err != nil {
		r.n.log.Warn("troupe: could not start a sharded entity", "kind", r.name, "id", id, "err", err)
		return nil
	}
	ctx.Watch(ref)
	e := &entity[T]{id: id, ref: ref, cell: ref.h.local.(*cell[T]), open: true}
	e.last.Store(r.clock.Load())
	r.mu.Lock()
	sh.entities[id] = e
	r.mu.Unlock()
	r.byPath[ref.h.key.path] = e
	r.stats.entities.Add(1)
	return e
}

func (r *region[T]) build(id string) (b Behavior[T], err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("%v", p)
		}
	}()
	return r.factory(id), nil
}

// hold keeps env until its shard has a home, asking for it (the answer
// is fresh: what it holds goes where that says, relayed or not).
func (r *region[T]) hold(sh *shard[T], env shardEnvelope[T]) {
	env.relayed = false
	if r.held >= r.cfg.Buffer {
		sh.queued.Add(-1)
		r.n.dead.deadLetter(r.prefix+env.id, env.msg, fmt.Errorf("%w (its buffer of %d is full)", ErrEntityUnavailable, r.cfg.Buffer))
		return
	}
	sh.held = append(sh.held, env)
	r.addHeld(1)
	if sh.mode == shardNowhere {
		r.ask(sh, r.h.now())
	}
}

// ask asks the coordinator where sh runs: at most once a tick, and, with
// a tick under a second (a GossipInterval under a second), less often
// while it goes unanswered — the wait doubles, up to a second — so that
// a coordinator behind its mailbox is not buried under the same
// questions, a thousand shards' every tick from every member. (An ask is
// repeated only in case a word was lost; the coordinator tells every
// region where it places a shard.) At the default tick, a second, it
// asks once a second.
func (r *region[T]) ask(sh *shard[T], now time.Time) {
	again, wait := askAgain(sh.askedAt, sh.askWait, r.tick, now)
	if !again {
		return
	}
	sh.askedAt, sh.askWait = now, wait
	r.h.tellCoord(shardWhere{Shard: sh.id, Origin: r.h.self(), sentBy: sentBy{from: r.h.self()}})
}

// askAgain says whether a region that last asked at askedAt, to wait
// wait before it asks again (zero: the tick), asks at now, and if so how
// long it then waits: twice as long, up to a second or the tick.
func askAgain(askedAt time.Time, wait, tick time.Duration, now time.Time) (bool, time.Duration) {
	wait = max(wait, tick)
	if now.Sub(askedAt) < wait {
		return false, 0
	}
	return true, min(2*wait, max(tick, time.Second))
}

// release hands on what sh holds, in order, now that it has a home.
func (r *region[T]) release(ctx *Context[regionMsg], sh *shard[T]) {
	held := sh.held
	sh.held = nil
	r.addHeld(-len(held))
	for _, env := range held {
		r.onEnvelope(ctx, env)
	}
	r.checkLeft()
}

// setMode changes where sh's messages go, then waits for the senders
// that read the old mode to have handed their messages on.
func (r *region[T]) setMode(sh *shard[T], mode shardMode, home *handle, uid NodeUID) {
	r.mu.Lock()
	runs := func(m shardMode) bool { return m == shardHere || m == shardStopping }
	if runs(mode) != runs(sh.mode) {
		if runs(mode) {
			r.stats.shards.Add(1)
		} else {
			r.stats.shards.Add(-1)
		}
	}
	sh.mode, sh.home, sh.homeUID = mode, home, uid
	if mode != shardNowhere {
		sh.askWait = 0 // answered: the next time it is nowhere, asks start at the tick
	}
	if mode != shardHere {
		for _, e := range sh.entities {
			e.open = false
		}
	}
	r.mu.Unlock()
	waitInflight(&sh.inflight)
}

// waitInflight waits until no sender is between reading a shard's mode
// and handing its message on (a push or an enqueue: no wait on the
// network, so this is short).
func waitInflight(n *atomic.Int64) {
	for i := 0; n.Load() > 0; i++ {
		if i < 100 {
			runtime.Gosched()
		} else {
			time.Sleep(50 * time.Microsecond)
		}
	}
}

// onHome learns where a shard runs: here (start running it) or on
// another member.
func (r *region[T]) onHome(ctx *Context[regionMsg], m shardHome) {
	sh := r.shards[m.Shard]
	if m.Home == r.h.self() {
		if sh.mode == shardHere || sh.mode == shardStopping {
			return
		}
		r.mu.Lock()
		sh.entities = map[string]*entity[T]{}
		r.mu.Unlock()
		delete(r.flushed, sh.id) // (of moves before this one)
		sh.fence = Fence{Epoch: m.Epoch, Seq: m.Placed}
		r.setMode(sh, shardHere, nil, NodeUID{})
		r.release(ctx, sh)
		return
	}
	switch sh.mode {
	case shardStopping:
		return
	case shardHere:
		// The coordinator placed it elsewhere while it runs here: stop it
		// here at once (never two).
		r.h.logger().Warn("troupe: the sharding coordinator placed a shard that runs here elsewhere; stopping it here", "kind", r.name, "shard", m.Shard)
		r.onHandOff(shardHandOff{Epoch: m.Epoch, Shard: m.Shard, Move: m.Placed}) // (numbered as the placement: lower than any later)
		return
	case shardThere:
		if sh.homeUID == m.Home {
			return
		}
	}
	addr, err := ParseAddr(m.Addr)
	if err != nil || r.h.isGone(m.Home) {
		sh.askedAt = r.h.now() // (held until it is reachable, or moves)
		return
	}
	home, uid, ok := r.h.regionAt(addr)
	if !ok || uid != m.Home {
		r.setMode(sh, shardNowhere, nil, NodeUID{}) // ask again next tick
		sh.askWait = 0                              // (answered: not a question unanswered)
		return
	}
	r.setMode(sh, shardThere, home, m.Home)
	r.release(ctx, sh)
}

// onMoving is the coordinator's word that a shard leaves the member
// that runs it: hold its messages, and tell that member everything this
// one sent it has gone (on the same association as the messages, so it
// arrives after them).
func (r *region[T]) onMoving(m shardMoving) {
	sh := r.shards[m.Shard]
	if m.From == r.h.self() || sh.mode == shardHere || sh.mode == shardStopping {
		return
	}
	r.setMode(sh, shardNowhere, nil, NodeUID{})
	sh.askedAt = r.h.now() // its new home is told to every region
	if addr, err := ParseAddr(m.Addr); err == nil {
		r.h.tellRegion(addr, m.From, shardFlush{Shard: m.Shard, Epoch: m.Epoch, Move: m.Move})
	}
}

func (r *region[T]) onFlush(m shardFlush) {
	fl := r.flushed[m.Shard]
	if fl == nil || fl.epoch != m.Epoch || fl.move != m.Move {
		if fl != nil && (fl.epoch > m.Epoch || fl.epoch == m.Epoch && fl.move > m.Move) {
			return // (a flush of an earlier move, late)
		}
		fl = &shardFlushes{epoch: m.Epoch, move: m.Move, from: map[NodeUID]bool{}}
		r.flushed[m.Shard] = fl
	}
	fl.from[m.from] = true
	if sh := r.shards[m.Shard]; sh.handOff != nil {
		r.checkHandOff(sh)
	}
}

// shardFlushes are the members that flushed a shard to this one, for
// one move.
type shardFlushes struct {
	epoch, move uint64
	from        map[NodeUID]bool
}

// shardHandOffState is a hand-over of a shard run here.
type shardHandOffState struct {
	wait     []NodeUID // members whose flush it waits for
	epoch    uint64    // the coordinator's, and its number for this move
	move     uint64
	deadline time.Time
	stopping bool // its entities are stopping
}

// onHandOff starts giving a shard run here away: wait for the other
// members' flushes (or HandOffTimeout), then hold its messages, stop its
// entities (each after what its mailbox holds), and tell the
// coordinator.
func (r *region[T]) onHandOff(m shardHandOff) {
	sh := r.shards[m.Shard]
	switch {
	case sh.handOff != nil:
		return // under way
	case sh.mode != shardHere:
		r.h.tellCoord(shardStopped{Shard: m.Shard, Origin: r.h.self(), sentBy: sentBy{from: r.h.self()}, Epoch: m.Epoch, Move: m.Move}) // (a repeat: it has stopped)
		return
	}
	// Until every flush is in, the shard still runs here for everyone:
	// what the others sent before they held its messages is delivered.
	sh.handOff = &shardHandOffState{wait: m.Wait, epoch: m.Epoch, move: m.Move, deadline: r.h.now().Add(r.cfg.HandOffTimeout)}
	r.checkHandOff(sh)
}

func (r *region[T]) checkHandOff(sh *shard[T]) {
	ho := sh.handOff
	if ho.stopping {
		return
	}
	fl := r.flushed[sh.id]
	now := r.h.now()
	for _, uid := range ho.wait {
		if uid != r.h.self() && (fl == nil || fl.epoch != ho.epoch || fl.move != ho.move || !fl.from[uid]) && now.Before(ho.deadline) {
			return
		}
	}
	ho.stopping = true
	delete(r.flushed, sh.id)
	r.setMode(sh, shardStopping, nil, NodeUID{})
	for _, e := range sh.entities {
		sh.stopping++
		if !e.going {
			r.stopEntity(e)
		}
	}
	if sh.stopping == 0 {
		r.shardGone(sh)
	}
}

// shardGone ends a hand-over: every entity of sh has stopped.
func (r *region[T]) shardGone(sh *shard[T]) {
	r.mu.Lock()
	sh.entities = nil
	r.mu.Unlock()
	var ho shardHandOffState
	if sh.handOff != nil {
		ho = *sh.handOff
	}
	sh.handOff = nil
	r.setMode(sh, shardNowhere, nil, NodeUID{})
	sh.askedAt = r.h.now()
	r.h.tellCoord(shardStopped{Shard: sh.id, Origin: r.h.self(), sentBy: sentBy{from: r.h.self()}, Epoch: ho.epoch, Move: ho.move})
	r.checkLeft()
}

// passivate stops an idle entity (or one that asked to be).
func (r *region[T]) passivate(e *entity[T]) {
	if e.going {
		return
	}
	sh := r.shards[r.shardOf(e.id)]
	r.mu.Lock()
	e.open = false
	r.mu.Unlock()
	waitInflight(&sh.inflight)
	r.stopEntity(e)
}

// stopEntity stops e after the messages its mailbox holds.
func (r *region[T]) stopEntity(e *entity[T]) {
	e.going = true
	e.cell.sysPush(sysMsg{kind: sysStop, reason: errPassivated, drain: true})
}

// entityStopped is the region's word that an entity has stopped.
func (r *region[T]) entityStopped(ctx *Context[regionMsg], path string) {
	e := r.byPath[path]
	if e == nil {
		return
	}
	delete(r.byPath, path)
	r.stats.entities.Add(-1)
	sh := r.shards[r.shardOf(e.id)]
	r.mu.Lock()
	if sh.entities[e.id] == e {
		delete(sh.entities, e.id)
	}
	r.mu.Unlock()
	switch {
	case sh.mode == shardStopping:
		sh.held = append(e.held, sh.held...) // (they came first)
		if sh.handOff != nil && sh.handOff.stopping {
			if sh.stopping--; sh.stopping == 0 {
				r.shardGone(sh)
			}
		}
	default:
		held := e.held
		r.addHeld(-len(held))
		for _, env := range held {
			r.onEnvelope(ctx, env) // started again, with what came meanwhile
		}
	}
}

// onTick moves the idleness clock (passivating idle entities), asks again
// where held shards run, sees hand-overs past their timeout through,
// stops sending to members that are gone, and asks where a shard runs
// when another member took this one for its home.
func (r *region[T]) onTick() {
	now := r.h.now()
	if q := r.cfg.PassivateAfter / 4; q > 0 && now.Sub(r.clockAt) >= q {
		r.clockAt = now
		clock := r.clock.Add(1)
		var idle []*entity[T]
		r.mu.RLock() // (open is the region's mu's: end writes it from the cluster's goroutine)
		for _, e := range r.byPath {
			if e.open && clock-e.last.Load() > 4 {
				idle = append(idle, e)
			}
		}
		r.mu.RUnlock()
		for _, e := range idle {
			r.passivate(e)
		}
	}
	var live map[NodeUID]Addr
	for _, sh := range r.shards {
		if sh.handOff != nil {
			r.checkHandOff(sh)
		}
		switch sh.mode {
		case shardNowhere:
			if len(sh.held) > 0 {
				r.ask(sh, now)
			}
		case shardThere:
			if live == nil {
				live = r.h.liveOthers()
			}
			if _, ok := live[sh.homeUID]; !ok || r.h.isGone(sh.homeUID) {
				r.setMode(sh, shardNowhere, nil, NodeUID{})
			} else if sh.relayed.Swap(false) && now.Sub(sh.verifiedAt) >= verifyEvery*r.tick {
				// Another member took this one for the shard's home while
				// this one sends its messages on: a ref to the entity that
				// came from this member (the usual case), or one of the
				// two missed a word of the coordinator; two that each take
				// the other for the home pass the messages back and forth
				// until one asks. So ask, now and then (the answer changes
				// nothing when this one is right).
				sh.verifiedAt = now
				r.ask(sh, now)
			}
		}
	}
	if r.leaving {
		r.h.tellCoord(shardLeaving{Origin: r.h.self(), sentBy: sentBy{from: r.h.self()}})
	}
}

// checkLeft lets the handOver callers go once no shard runs here.
func (r *region[T]) checkLeft() {
	if !r.leaving || len(r.leftWait) == 0 || r.held > 0 {
		return // (what it holds goes to the shards' new homes first)
	}
	for _, sh := range r.shards {
		if sh.mode == shardHere || sh.mode == shardStopping {
			return
		}
	}
	for _, ch := range r.leftWait {
		close(ch)
	}
	r.leftWait = nil
}

// dropHeld turns what the region holds into dead letters.
func (r *region[T]) dropHeld() {
	for _, sh := range r.shards {
		waitInflight(&sh.inflight)
		for _, env := range sh.held {
			sh.queued.Add(-1)
			r.n.dead.deadLetter(r.prefix+env.id, env.msg, ErrEntityUnavailable)
		}
		r.addHeld(-len(sh.held))
		sh.held = nil
	}
	for _, e := range r.byPath {
		for _, env := range e.held {
			r.n.dead.deadLetter(r.prefix+env.id, env.msg, ErrEntityUnavailable)
		}
		r.addHeld(-len(e.held))
		e.held = nil
	}
	for _, ch := range r.leftWait {
		close(ch)
	}
	r.leftWait = nil
}

// handOver gives this member's shards away before it leaves, waiting
// at most twice HandOffTimeout (a cluster with no other member to take
// them, or a coordinator that cannot place them, must not hold a leave
// without a deadline).
func (r *region[T]) handOver(ctx context.Context, hurry <-chan struct{}) {
	done := make(chan struct{})
	if r.self.h.local.tellAny(shardLeave{done: done}) != nil {
		return
	}
	t := time.NewTimer(2 * r.cfg.HandOffTimeout)
	defer t.Stop()
	select {
	case <-done:
	case <-ctx.Done():
	case <-hurry:
	case <-t.C:
	case <-r.ended:
	}
}

func (r *region[T]) handOffTimeout() time.Duration { return r.cfg.HandOffTimeout }

func (r *region[T]) poke() { r.self.h.local.tellAny(shardTick{}) }

// end stops the region as the cluster stops, and waits (at most
// HandOffTimeout) until it and its entities have stopped. Senders get
// ErrEntityUnavailable from the moment it is called. The entities stop
// without handling what their mailboxes hold (dead letters), even under
// ShutdownDrain: their shards may run elsewhere once the region has
// stopped. The stops go on the system lane, which a full mailbox does
// not refuse.
func (r *region[T]) end() {
	defer r.c.shardings.drop(r.name)
	r.mu.Lock()
	r.over = true
	for _, sh := range r.shards {
		for _, e := range sh.entities {
			e.open = false
			e.cell.sysPush(sysMsg{kind: sysStop, reason: ErrEntityUnavailable})
		}
	}
	r.mu.Unlock()
	r.n.Stop(r.self)
	t := time.NewTimer(r.cfg.HandOffTimeout)
	defer t.Stop()
	select {
	case <-r.ended:
		stopAndWait(r.n, r.self)
	case <-t.C:
		r.n.log.Warn("troupe: a sharded kind's entities did not stop in HandOffTimeout as the cluster stopped; another member may start them after the removal margin", "kind", r.name)
	case <-r.n.lc.workDone():
	}
}
