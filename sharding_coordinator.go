package troupe

import (
	"log/slog"
	"maps"
	"slices"
	"sync/atomic"
	"time"
)

// The coordinator of a sharded kind: a cluster singleton that places
// shards on members' regions and moves them. It keeps nothing durable:
// a coordinator that starts (after the last one stopped) asks every
// member's region which shards it runs, and places a shard that none
// runs only once every up member has answered and every member downed
// before it could answer was downed RemovalMargin ago.

// Messages to the coordinator, through its station on the sender's
// member; the association stamps the sending member on each.
// Each carries its region's member (Origin) besides the member whose
// association delivered it (from): a station passes what it cannot
// deliver to the station of the member it takes for the oldest, so a
// word can reach the coordinator through a member other than its own.
type (
	shardRegister struct {
		Epoch   uint64
		Count   int32 // the region's Shards
		Shards  []int32
		Leaving bool
		Origin  NodeUID
		sentBy
	}
	shardWhere struct {
		Shard  int32
		Origin NodeUID
		sentBy
	}
	shardStopped struct {
		Shard  int32
		Origin NodeUID
		sentBy
		// Epoch and Move are those of the hand-off the stop answers (0
		// from a region of an earlier version, or for a stop no
		// hand-off asked for): a stop that answers an earlier hand-off
		// than the shard's latest placement says nothing of it.
		Epoch, Move uint64
	}
	shardLeaving struct {
		Origin NodeUID
		sentBy
	}
	shardRegionGone struct {
		Origin NodeUID
		sentBy
	}
	coordTick struct{}
)

// Messages to regions.
type (
	shardHello struct{ Epoch uint64 }
	shardHome  struct {
		Epoch uint64
		Shard int32
		Home  NodeUID
		Addr  string
		// Placed numbers the placement under this coordinator (0 from a
		// coordinator of an earlier version): with Epoch, its entities'
		// Fence.
		Placed uint64
	}
	shardMoving struct {
		Epoch uint64
		Shard int32
		Move  uint64 // the move's number
		From  NodeUID
		Addr  string
	}
	shardHandOff struct {
		Epoch uint64
		Shard int32
		Move  uint64
		Wait  []NodeUID
	}
	shardFlush struct {
		Shard int32
		Epoch uint64
		Move  uint64
		sentBy
	}
)

// shardCoordMsg is what a coordinator takes.
type shardCoordMsg interface{ shardCoordMsg() }

func (shardRegister) shardCoordMsg()   {}
func (shardWhere) shardCoordMsg()      {}
func (shardStopped) shardCoordMsg()    {}
func (shardLeaving) shardCoordMsg()    {}
func (shardRegionGone) shardCoordMsg() {}
func (coordTick) shardCoordMsg()       {}
func (shardHello) regionMsg()          {}
func (shardHome) regionMsg()           {}
func (shardMoving) regionMsg()         {}
func (shardHandOff) regionMsg()        {}
func (shardFlush) regionMsg()          {}

func init() {
	SetWireKey[shardRegister]("troupe.sharding.register")
	SetWireKey[shardWhere]("troupe.sharding.where")
	SetWireKey[shardStopped]("troupe.sharding.stopped")
	SetWireKey[shardLeaving]("troupe.sharding.leaving")
	SetWireKey[shardRegionGone]("troupe.sharding.gone")
	SetWireKey[shardHello]("troupe.sharding.hello")
	SetWireKey[shardHome]("troupe.sharding.home")
	SetWireKey[shardMoving]("troupe.sharding.moving")
	SetWireKey[shardHandOff]("troupe.sharding.handoff")
	SetWireKey[shardFlush]("troupe.sharding.flush")
}

// The regions' words carry their sender, stamped by the association they
// arrive on (sender.go).
func (m shardRegister) stamped(s sentBy) any   { m.sentBy = s; return m }
func (m shardWhere) stamped(s sentBy) any      { m.sentBy = s; return m }
func (m shardStopped) stamped(s sentBy) any    { m.sentBy = s; return m }
func (m shardLeaving) stamped(s sentBy) any    { m.sentBy = s; return m }
func (m shardRegionGone) stamped(s sentBy) any { m.sentBy = s; return m }
func (m shardFlush) stamped(s sentBy) any      { m.sentBy = s; return m }

// coordinator is one kind's coordinator, on the goroutine of its actor.
// It reads the clock only as its callers give it (now), and sees its
// member through a coordHost: the real one's cluster, or a simulated
// member (clustersim_shard_test.go).
type coordinator struct {
	h       coordHost
	cfg     ShardingConfig
	epoch   uint64
	regions map[NodeUID]*coordRegion
	homes   map[int32]NodeUID
	moves   map[int32]*coordMove
	asks    map[int32][]NodeUID
	goneAt  map[NodeUID]time.Time
	balAt   time.Time
	moveSeq uint64
	placed  map[int32]uint64 // the number of each shard's placement (with the moves')
	refused map[NodeUID]bool // members with another Shards
}

// coordRegion is a member's region as the coordinator knows it.
type coordRegion struct {
	leaving bool // gives its shards away; takes none
	gone    bool // said it stopped: runs nothing
}

// coordMove is a shard on its way from one region to another.
type coordMove struct {
	from, to NodeUID
	seq      uint64    // its number: flushes of another move do not count
	at       time.Time // when the hand-off was last asked for
}

// coordHost is the member a coordinator runs on, as the coordinator
// sees it.
type coordHost interface {
	self() NodeUID
	members() []Member                          // Cluster.Members
	downs() map[NodeUID]time.Time               // Cluster.downs
	listable() map[NodeUID]Addr                 // Cluster.listable
	logger() *slog.Logger                       // the node's
	tellRegion(uid NodeUID, msg regionMsg) bool // false if it could not be sent
}

// clusterCoordHost is a coordinator's member in a real cluster.
type clusterCoordHost struct {
	c    *Cluster
	path string // the regions' path
}

func (h clusterCoordHost) self() NodeUID                { return h.c.n.uid }
func (h clusterCoordHost) members() []Member            { return h.c.Members() }
func (h clusterCoordHost) downs() map[NodeUID]time.Time { return h.c.downs() }
func (h clusterCoordHost) listable() map[NodeUID]Addr   { return h.c.listable() }
func (h clusterCoordHost) logger() *slog.Logger         { return h.c.n.log }

// tellRegion sends msg to the region of the member uid; false if it
// could not be sent (no association up to it yet).
func (h clusterCoordHost) tellRegion(uid NodeUID, msg regionMsg) bool {
	n := h.c.n
	if uid == n.uid {
		if a := n.actors.get(h.path, UUID{}); a != nil {
			return a.local.tellAny(msg) == nil
		}
		return false
	}
	for _, m := range h.c.Members() {
		if m.UID == uid {
			return tellQueued(n, m.Addr, uid, h.path, msg)
		}
	}
	return false
}

var coordSeq atomic.Uint32

func newCoordinator(c *Cluster, name string, cfg ShardingConfig) Behavior[shardCoordMsg] {
	k := newCoordinatorState(clusterCoordHost{c: c, path: "/system/sharding-" + name}, cfg)
	return Behavior[shardCoordMsg]{
		Setup: func(ctx *Context[shardCoordMsg]) {
			k.start(c.Self().UpNumber, coordSeq.Add(1), time.Now())
			ctx.StartTicker("tick", min(c.cfg.GossipInterval, cfg.RebalanceInterval), coordTick{})
		},
		Receive: func(_ *Context[shardCoordMsg], m shardCoordMsg) { k.receive(m, time.Now()) },
	}
}

func newCoordinatorState(h coordHost, cfg ShardingConfig) *coordinator {
	return &coordinator{h: h, cfg: cfg,
		regions: map[NodeUID]*coordRegion{}, homes: map[int32]NodeUID{}, moves: map[int32]*coordMove{},
		asks: map[int32][]NodeUID{}, goneAt: map[NodeUID]time.Time{}, refused: map[NodeUID]bool{}, placed: map[int32]uint64{}}
}

// start begins the coordinator's work on a member whose up number is up,
// the seq-th coordinator started in its process. A coordinator that
// starts later runs on a younger member (a higher up number) or on the
// same one again: its epoch is higher, and regions drop the words of the
// one before.
func (k *coordinator) start(up int, seq uint32, now time.Time) {
	k.epoch = uint64(up)<<32 | uint64(seq)
	k.balAt = now
	k.tick(now)
}

func (k *coordinator) receive(m shardCoordMsg, now time.Time) {
	var ok bool
	switch m := m.(type) {
	case shardRegister:
		if m.from, ok = k.sender(m.Origin, m.from); ok {
			k.onRegister(m, now)
		}
	case shardWhere:
		if m.from, ok = k.sender(m.Origin, m.from); ok {
			k.onWhere(m, now)
		}
	case shardStopped:
		if m.from, ok = k.sender(m.Origin, m.from); ok && k.valid(m.Shard) {
			k.onStopped(m)
			k.serve(now)
		}
	case shardLeaving:
		if from, ok := k.sender(m.Origin, m.from); ok {
			k.onLeaving(from, now)
		}
	case shardRegionGone:
		if from, ok := k.sender(m.Origin, m.from); ok {
			k.dropRegion(from)
			k.serve(now)
		}
	case coordTick:
		k.tick(now)
	}
}

// sender returns the member a region's word is from: the one it names
// (Origin) when a member delivered it (members relay for each other
// through their stations), the one whose association delivered it when
// the word names none (a member from before Origin) or that one. A word
// that names another member but came from a node that is no member now
// (a relaying member removed meanwhile, or a node that is none) is
// dropped (false): the relayer is not its sender, and every such word is
// said again (a hello until the region registers, an ask each tick,
// leaving each tick, stopped when the hand-off is asked again).
func (k *coordinator) sender(origin, via NodeUID) (NodeUID, bool) {
	if origin == (NodeUID{}) || origin == via {
		return via, true
	}
	for _, m := range k.h.members() {
		if m.UID == via {
			return origin, true
		}
	}
	return NodeUID{}, false
}

func (k *coordinator) onWhere(m shardWhere, now time.Time) {
	if !k.valid(m.Shard) {
		return
	}
	if !slices.Contains(k.asks[m.Shard], m.from) {
		k.asks[m.Shard] = append(k.asks[m.Shard], m.from)
	}
	k.serve(now)
}

func (k *coordinator) onLeaving(from NodeUID, now time.Time) {
	if r := k.regions[from]; r != nil && !r.leaving {
		r.leaving = true
		k.balAt = time.Time{} // at once
		k.rebalance(now)
	}
}

func (k *coordinator) valid(s int32) bool { return s >= 0 && int(s) < k.cfg.Shards }

// onRegister takes a region's answer: the shards it runs.
func (k *coordinator) onRegister(m shardRegister, now time.Time) {
	if m.Epoch != k.epoch {
		return
	}
	if int(m.Count) != k.cfg.Shards {
		// A different hash: the same id would be in another shard, run
		// elsewhere. Such a member is never registered, so nothing new is
		// placed until it is gone: loud, not twice.
		if !k.refused[m.from] {
			k.refused[m.from] = true
			k.h.logger().Error("troupe: a member runs a sharded kind with another Shards; nothing is placed or moved until it is gone", "shards", m.Count, "want", k.cfg.Shards)
		}
		return
	}
	r := k.regions[m.from]
	if r == nil {
		r = &coordRegion{}
		k.regions[m.from] = r
	}
	r.leaving = r.leaving || m.Leaving
	for _, s := range m.Shards {
		if !k.valid(s) {
			continue
		}
		if h, ok := k.homes[s]; ok && h != m.from {
			// Two members say they run it: the one that answered later
			// stops it (never two).
			k.h.logger().Warn("troupe: two members run one shard; stopping it on one", "shard", s)
			k.tellRegion(m.from, shardHandOff{Epoch: k.epoch, Shard: s, Move: k.nextMove()})
			continue
		}
		k.homes[s] = m.from
	}
	k.serve(now)
}

// tick greets the regions that have not answered, follows the
// membership, asks again for hand-offs that take long, and rebalances.
func (k *coordinator) tick(now time.Time) {
	members := k.h.members()
	present := map[NodeUID]bool{}
	for _, m := range members {
		present[m.UID] = true
		switch {
		case m.Status >= MemberDown:
			if k.goneAt[m.UID].IsZero() {
				k.goneAt[m.UID] = now
			}
		case m.Status >= MemberUp:
			if r := k.regions[m.UID]; r == nil {
				k.tellRegion(m.UID, shardHello{Epoch: k.epoch})
			} else if m.Status >= MemberLeaving && !r.leaving {
				r.leaving = true
			}
		}
	}
	for uid := range k.regions {
		if !present[uid] && k.goneAt[uid].IsZero() {
			k.goneAt[uid] = now
		}
	}
	for _, uid := range slices.SortedFunc(maps.Keys(k.goneAt), compareUID) { // (in an order of its own: a replay decides the same)
		if at := k.goneAt[uid]; now.Sub(at) >= k.cfg.RemovalMargin {
			if k.regions[uid] != nil {
				k.dropRegion(uid) // its side has stopped its entities by now
			}
			if !present[uid] {
				delete(k.goneAt, uid)
				delete(k.regions, uid)
			}
		}
	}
	for _, s := range slices.Sorted(maps.Keys(k.moves)) {
		if mv := k.moves[s]; now.Sub(mv.at) >= k.cfg.HandOffTimeout {
			mv.at = now
			k.tellRegion(mv.from, shardHandOff{Epoch: k.epoch, Shard: s, Move: mv.seq, Wait: k.others(mv.from)})
		}
	}
	k.serve(now)
	k.rebalance(now)
}

// ready reports whether the coordinator may place a shard no region
// says it runs: every up member's region has answered, and every member
// downed that had not answered was downed RemovalMargin ago.
func (k *coordinator) ready(now time.Time) bool {
	for _, m := range k.h.members() {
		if m.Status >= MemberUp && m.Status < MemberDown && k.regions[m.UID] == nil {
			return false
		}
	}
	for uid, at := range k.h.downs() {
		if k.regions[uid] == nil && now.Sub(at) < k.cfg.RemovalMargin {
			return false
		}
	}
	return true // (a gone member's own shards wait for the margin: serve)
}

// serve answers the regions waiting to know where a shard runs, placing
// the shards no one runs.
func (k *coordinator) serve(now time.Time) {
	if len(k.asks) == 0 || !k.ready(now) {
		return
	}
	// The loads are counted only to place a shard: an ask for a shard
	// that has a home (every ask but the first of each shard) is answered
	// without them, so that a burst of asks costs the coordinator each a
	// look-up, not a count of every shard (which, in a burst to a
	// thousand new entities under the race detector, once left it
	// minutes behind its mailbox).
	var loads []shardLoad
	counted := false
	for _, s := range slices.Sorted(maps.Keys(k.asks)) { // (in an order of its own, as each placement counts for the next)
		askers := k.asks[s]
		if k.moves[s] != nil {
			continue // answered when the move ends
		}
		home, ok := k.homes[s]
		if !ok {
			if !counted {
				loads, counted = k.loads(), true
			}
			if home, ok = leastShards(loads); !ok {
				continue // no member can take a shard now (the asks for placed ones are still answered)
			}
			k.homes[s], k.placed[s] = home, k.nextMove()
			for i := range loads {
				if loads[i].uid == home {
					loads[i].shards = append(loads[i].shards, s)
				}
			}
			askers = k.others(NodeUID{}) // (every region learns a placement)
		}
		if r := k.regions[home]; r == nil || k.goneAt[home] != (time.Time{}) {
			continue // its member is gone: placed again after the margin
		}
		for _, uid := range askers {
			k.tellHome(uid, s, home) // (the home too, if it asks: a word to it was lost)
		}
		delete(k.asks, s)
	}
}

// loads returns the regions that may run shards, with what they run.
func (k *coordinator) loads() []shardLoad {
	reach := k.h.listable()
	up := map[NodeUID]Member{}
	for _, m := range k.h.members() {
		up[m.UID] = m
	}
	var out []shardLoad
	at := map[NodeUID]int{}
	for uid, r := range k.regions {
		m, ok := up[uid]
		_, reached := reach[uid]
		if r.gone || !ok || m.Status < MemberUp || m.Status >= MemberDown || !reached && uid != k.h.self() {
			continue
		}
		at[uid] = len(out)
		out = append(out, shardLoad{uid: uid, addr: m.Addr, leaving: r.leaving || m.Status >= MemberLeaving})
	}
	for s, h := range k.homes { // (one pass, not one per region)
		if i, ok := at[h]; ok {
			out[i].shards = append(out[i].shards, s)
		}
	}
	for i := range out {
		slices.Sort(out[i].shards)
	}
	slices.SortFunc(out, func(a, b shardLoad) int { return compareUID(a.uid, b.uid) }) // (the plan follows their order)
	return out
}

// rebalance moves shards: all of a leaving member's, and some toward the
// members with the fewest, once every RebalanceInterval while no move is
// under way.
func (k *coordinator) rebalance(now time.Time) {
	if len(k.moves) > 0 || now.Sub(k.balAt) < k.cfg.RebalanceInterval || !k.ready(now) {
		return
	}
	k.balAt = now
	for _, mv := range planRebalance(k.loads(), max(1, k.cfg.Shards/10)) {
		k.startMove(mv, now)
	}
}

// startMove asks every other region to hold the shard's messages and
// flush what it sent to its member, and that member to hand it off.
func (k *coordinator) startMove(mv plannedMove, now time.Time) {
	seq := k.nextMove()
	k.moves[mv.shard] = &coordMove{from: mv.from, to: mv.to, seq: seq, at: now}
	addr := k.addrOf(mv.from)
	wait := k.others(mv.from)
	for _, uid := range wait {
		k.tellRegion(uid, shardMoving{Epoch: k.epoch, Shard: mv.shard, Move: seq, From: mv.from, Addr: addr})
	}
	k.tellRegion(mv.from, shardHandOff{Epoch: k.epoch, Shard: mv.shard, Move: seq, Wait: wait})
}

func (k *coordinator) nextMove() uint64 {
	k.moveSeq++
	return k.moveSeq
}

// others returns every region but that of uid that has not stopped: a
// hand-off waits for the flush of each (one not told it moves, its
// association down, is waited for until HandOffTimeout).
func (k *coordinator) others(uid NodeUID) []NodeUID {
	reach := k.h.listable()
	status := map[NodeUID]MemberStatus{}
	for _, m := range k.h.members() {
		status[m.UID] = m.Status
	}
	var out []NodeUID
	for u, r := range k.regions {
		_, reached := reach[u]
		st, member := status[u]
		// (an exiting member's cluster stops: it sends nothing more)
		if u != uid && !r.gone && member && st < MemberExiting && (reached || u == k.h.self()) {
			out = append(out, u)
		}
	}
	slices.SortFunc(out, compareUID)
	return out
}

// onStopped hears that a region no longer runs a shard. A region
// answers every hand-off it is asked for, again too once it has stopped
// the shard; such an answer may arrive after the coordinator placed the
// shard on that member again (where its move was headed could no longer
// take it), and must then not unplace it: it is known by its hand-off's
// number, lower than the placement's. A stop without numbers (a region
// of an earlier version) is taken as it says.
func (k *coordinator) onStopped(m shardStopped) {
	s, from := m.Shard, m.from
	numbered := m.Move != 0
	if numbered && m.Epoch != k.epoch {
		// An earlier coordinator's hand-off: taken only for a shard this
		// one has from the region's word (it registered the shard while
		// stopping it), never for one it placed.
		if k.homes[s] == from && k.placed[s] == 0 && k.moves[s] == nil {
			delete(k.homes, s)
		}
		return
	}
	if mv := k.moves[s]; mv != nil && mv.from == from {
		if !numbered || m.Move == mv.seq {
			k.endMove(s, mv)
		}
		return
	}
	if k.homes[s] == from && (!numbered || m.Move > k.placed[s]) {
		delete(k.homes, s)
	}
}

// endMove places a shard that stopped where it was headed (elsewhere if
// that member can no longer take it) and tells every region.
func (k *coordinator) endMove(s int32, mv *coordMove) {
	delete(k.moves, s)
	delete(k.homes, s)
	to := mv.to
	ok := false
	for _, l := range k.loads() {
		if l.uid == to && !l.leaving {
			ok = true
		}
	}
	if !ok {
		if to, ok = leastShards(k.loads()); !ok {
			return // placed when asked for
		}
	}
	k.homes[s], k.placed[s] = to, k.nextMove()
	for uid, r := range k.regions {
		if !r.gone {
			k.tellHome(uid, s, to)
		}
	}
}

// dropRegion forgets a region that stopped (or whose member was downed a
// margin ago): its shards may be placed again.
func (k *coordinator) dropRegion(uid NodeUID) {
	r := k.regions[uid]
	if r == nil {
		return
	}
	r.gone = true
	for s, h := range k.homes {
		if h == uid {
			delete(k.homes, s)
		}
	}
	for _, s := range slices.Sorted(maps.Keys(k.moves)) {
		if mv := k.moves[s]; mv.from == uid {
			k.endMove(s, mv)
		}
	}
}

func (k *coordinator) addrOf(uid NodeUID) string {
	for _, m := range k.h.members() {
		if m.UID == uid {
			return m.Addr.String()
		}
	}
	return ""
}

// tellHome tells the region of uid where shard s runs.
func (k *coordinator) tellHome(uid NodeUID, s int32, home NodeUID) {
	k.tellRegion(uid, shardHome{Epoch: k.epoch, Shard: s, Home: home, Addr: k.addrOf(home), Placed: k.placed[s]})
}

// tellRegion sends msg to the region of the member uid.
func (k *coordinator) tellRegion(uid NodeUID, msg regionMsg) bool { return k.h.tellRegion(uid, msg) }
