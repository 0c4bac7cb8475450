package troupe

import (
	"cmp"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"
)

// Sharding in the simulator (clustersim_test.go). With simCluster.shards
// set, every member runs a region of one sharded kind — the real region
// (sharding_region.go) through a simulated regionHost — and the member
// whose singleton instance runs (the coordinator is a cluster singleton)
// runs the kind's real coordinator (sharding_coordinator.go) through a
// simulated coordHost. The coordinator's words go through the stations
// as the real ones do: to the member that runs it, or to the member a
// member takes for the oldest, which passes on once what it cannot take.
// Between two members, shard words arrive in the order they were sent
// (they share an association), or not at all.
//
// The entities themselves are not simulated: a member "has messages"
// for a few random shards at each tick, and its region asks the
// coordinator where each runs, as it does for the messages it holds,
// until the answer is here or another member; what goes to another
// member is then its region's to route (it may no longer run the
// shard, and holds and asks in turn). A shard runs on a member
// from the word that places it there until it is handed off or the
// member's cluster stops (when its region stops every entity).
//
// Checked at every placement and at every resumed pause: never two
// running members on which one shard runs. A member paused past the
// pause budget is not held to it for a removal margin after it resumes:
// the regions do not yet apply the singleton's rule for a process that
// stood still (docs/cluster.md, "Sharded entities"); such overlaps are
// counted (simShards.overlaps), not failed. After the faults end and the
// cluster has converged: every shard asked for runs on exactly one
// member, and every member sends its messages to a running member.

// simEntity is the message type of the simulated kind.
type simEntity struct{}

// simShards is the simulated kind's state, per cluster.
type simShards struct {
	cfg    ShardingConfig
	wants  int                  // shards each member has messages for, drawn at each tick
	fifo   map[[2]int]time.Time // per way between two members: the last delivery
	coords uint32               // coordinators started
	outbox []simShardOut        // the words of the step under way
	log    *slog.Logger

	placed   int // shards placed on a member (a region heard it runs one)
	moves    int // hand-offs completed (a region gave a shard away)
	overlaps int // shards that ran twice after a pause past the budget (documented)
}

// simShardMember is a member's side of the simulated kind.
type simShardMember struct {
	region *region[simEntity]
	coord  *coordinator     // while its singleton instance runs
	wants  map[int32]bool   // shards it has messages for, without a home yet
	gone   map[NodeUID]bool // shardings.gone
	downed downedMembers
	left   map[NodeUID]bool // Cluster.leftSeen
	// The coordinator's Cluster.Members (by address), for the state
	// whose digest is listedOf.
	listed   []Member
	listedOf uint64
	listedOK bool
	// leaveDone is a leave's hand-over of shards under way (closed when
	// done), leaveBy its bound (Cluster.Leave: handOverShards first).
	leaveDone chan struct{}
	leaveBy   time.Time
	// pausedAt, resumedAt and stood: when its last pause began and
	// ended, and how long it was.
	pausedAt  time.Time
	resumedAt time.Time
	stood     time.Duration
}

// simEntityMsg stands for the messages for a shard's entities that
// another member passes on to this one, taking it for the shard's home.
type simEntityMsg struct{ Shard int32 }

// simShardWord is a word for the coordinator on its way between two
// stations (relayed: the second station passes on no more).
type simShardWord struct {
	msg     shardCoordMsg
	relayed bool
}

// withShards has every member run a kind of the given number of shards,
// each with messages for wants random shards at each tick.
func (s *simCluster) withShards(shards, wants int) {
	cfg := ShardingConfig{Shards: shards}.withDefaults(&Cluster{cfg: s.cfg})
	s.shards = &simShards{cfg: cfg, wants: wants, fifo: map[[2]int]time.Time{},
		log: slog.New(slog.NewTextHandler(io.Discard, nil))}
}

// bootShards gives m's new incarnation a region (Sharding, called as its
// process starts).
func (s *simCluster) bootShards(m *simMember) {
	cfg := s.shards.cfg
	r := &region[simEntity]{name: "sim", cfg: cfg, prefix: "/system/sharding-sim/entity/", path: "/system/sharding-sim",
		shards: make([]*shard[simEntity], cfg.Shards), byPath: map[string]*entity[simEntity]{},
		flushed: map[int32]*shardFlushes{}, ended: make(chan struct{}), tick: tickEvery(s.cfg.GossipInterval, cfg),
		h: simRegionHost{s, m}}
	for i := range r.shards {
		r.shards[i] = &shard[simEntity]{id: int32(i)}
	}
	r.clockAt = s.now
	m.shard = simShardMember{region: r, wants: map[int32]bool{}, gone: map[NodeUID]bool{}, left: map[NodeUID]bool{}}
}

// shardTurn is the region's tick and, where the singleton runs, the
// coordinator's (both tick each GossipInterval at the defaults), and a
// leave's hand-over.
func (s *simCluster) shardTurn(m *simMember) {
	sm := &m.shard
	if m.inst && sm.coord == nil {
		s.shards.coords++
		sm.coord = newCoordinatorState(simCoordHost{s, m}, s.shards.cfg)
		sm.coord.start(m.ms.members[m.uid].UpNumber, s.shards.coords, s.now)
	} else if !m.inst {
		sm.coord = nil // (the instance stopped: the actor with it)
	}
	if sm.coord != nil && s.liveInstance(m) {
		sm.coord.receive(coordTick{}, s.now)
	}
	r := sm.region
	for range s.shards.wants {
		sm.wants[int32(s.rng.IntN(len(r.shards)))] = true
	}
	for _, id := range slices.Sorted(mapKeys(sm.wants)) {
		switch sh := r.shards[id]; r.routeOf(sh, false) {
		case routeHere:
			delete(sm.wants, id) // delivered
		case routeThere:
			// Handed on to the home's region (entityTarget.tellWire from
			// the association: relayed).
			if to := s.shardTo(sh.homeUID); to != nil && !to.stopped {
				s.shardSend(m, to, simEntityMsg{Shard: id})
			}
			delete(sm.wants, id)
		default:
			if sh.mode == shardNowhere {
				r.ask(sh, s.now) // (hold)
			}
		}
	}
	r.onTick()
	if sm.leaveDone != nil {
		select {
		case <-sm.leaveDone:
		default:
			if s.now.Before(sm.leaveBy) {
				return
			}
		}
		sm.leaveDone = nil
		m.ms.leave(s.now)
		s.gossip(m)
	}
}

// leaveShards starts a leave as Cluster.Leave does: the region hands its
// shards over (at most twice HandOffTimeout), then the member leaves.
func (s *simCluster) leaveShards(m *simMember) {
	sm := &m.shard
	if sm.leaveDone != nil {
		return
	}
	sm.leaveDone, sm.leaveBy = make(chan struct{}), s.now.Add(2*s.shards.cfg.HandOffTimeout)
	sm.region.receive(nil, shardLeave{done: sm.leaveDone})
}

// stopShards is the region's end as m's cluster stops: every entity
// stops, and the region tells the coordinator it is gone (PostStop).
func (s *simCluster) stopShards(m *simMember) {
	r := m.shard.region
	r.over = true
	for _, sh := range r.shards {
		sh.mode = shardNowhere
	}
	m.shard.coord = nil
	r.h.tellCoord(shardRegionGone{Origin: m.uid, sentBy: sentBy{from: m.uid}})
}

// noteShardEvents is what the cluster's loop does for the shardings on
// membership events: the members to avoid (shardings.noteGone), the
// members seen downed (forgetDowned).
func (s *simCluster) noteShardEvents(m *simMember, events []MemberEvent) {
	sm := &m.shard
	p := &sm.gone
	if g := goneAfter(p, events, m.uid); g != nil {
		sm.gone = g
	}
	for _, e := range events {
		if e.Kind != eventMemberStatus || e.Member.UID == m.uid {
			continue
		}
		mm := e.Member
		if mm.Status == MemberDown || mm.Status == MemberRemoved && !sm.left[mm.UID] {
			sm.downed.note(mm, s.now, 2*s.shards.cfg.RemovalMargin)
		}
		switch mm.Status {
		case MemberLeaving, MemberExiting:
			sm.left[mm.UID] = true
		case MemberRemoved:
			delete(sm.left, mm.UID)
		}
	}
}

// shardSend queues a shard word from m to the member to; the words of a
// step leave at its end (flushShards).
func (s *simCluster) shardSend(m, to *simMember, msg any) {
	s.shards.outbox = append(s.shards.outbox, simShardOut{m, to, msg})
}

// simShardOut is a shard word sent during a step.
type simShardOut struct {
	from, to *simMember
	msg      any
}

// flushShards sends the words of the step that ends, by destination:
// the real code sends to several members in a map's order, any of which
// the network may see, and a replay must draw the same delays. What goes
// to one member keeps the order it was sent in: an association's.
func (s *simCluster) flushShards() {
	out := s.shards.outbox
	s.shards.outbox = s.shards.outbox[:0]
	slices.SortStableFunc(out, func(a, b simShardOut) int {
		return cmp.Or(cmp.Compare(a.from.slot, b.from.slot), cmp.Compare(a.to.slot, b.to.slot))
	})
	for _, o := range out {
		s.shardDeliver(o.from, o.to, o.msg)
	}
}

// shardDeliver puts a shard word on its way from m to the member to: in
// order after what m sent to before it, unless the network drops it.
func (s *simCluster) shardDeliver(m, to *simMember, msg any) {
	inner := msg
	if w, ok := msg.(simShardWord); ok {
		inner = w.msg
	}
	kind, size := fmt.Sprintf("%T", inner), 16 // (an entity's message: its payload is the application's)
	if _, ok := inner.(simEntityMsg); !ok {
		size = s.encodedSize(inner)
	}
	s.sent[kind]++
	s.bytes[kind] += int64(size)
	if m != to && (s.cut[[2]int{m.slot, to.slot}] || s.loss > 0 && s.rng.Float64() < s.loss) {
		return
	}
	at := s.now
	if m != to {
		at = at.Add(s.latency)
		if s.jitter > 0 {
			at = at.Add(time.Duration(s.rng.Int64N(int64(s.jitter))))
		}
	}
	way := [2]int{m.slot, to.slot}
	if last := s.shards.fifo[way]; at.Before(last) {
		at = last
	}
	s.shards.fifo[way] = at
	s.at(at, simEvent{kind: simDeliver, slot: to.slot, gen: to.gen, from: m.uid, msg: msg})
}

// shardTo is the member incarnation uid, if its process runs: a shard
// word names its member.
func (s *simCluster) shardTo(uid NodeUID) *simMember {
	if to := s.byUID[uid]; to != nil && to.running && to.uid == uid {
		return to
	}
	return nil
}

// deliverShard takes a shard word that reached m from the member from.
func (s *simCluster) deliverShard(m *simMember, from NodeUID, msg any) {
	if m.shard.region.over {
		return
	}
	switch msg := msg.(type) {
	case simShardWord:
		s.station(m, from, msg)
	case simEntityMsg:
		// The region's routing of a relayed message (route, onEnvelope):
		// delivered here, passed on, or held and asked for.
		r := m.shard.region
		switch sh := r.shards[msg.Shard]; r.routeOf(sh, true) {
		case routeHere:
		case routeThere:
			if to := s.shardTo(sh.homeUID); to != nil && !to.stopped {
				s.shardSend(m, to, msg)
			}
		default:
			m.shard.wants[msg.Shard] = true
		}
	case regionMsg:
		if st, ok := msg.(interface{ stamped(sentBy) any }); ok {
			msg = st.stamped(sentBy{from: from}).(regionMsg)
		}
		r := m.shard.region
		var home shardHome
		if h, ok := msg.(shardHome); ok {
			home = h
		}
		before := s.shardModes(m)
		r.receive(nil, msg)
		s.noteShardModes(m, before)
		if home.Home == m.uid && r.valid(home.Shard) {
			s.checkOneShard(m, home.Shard)
		}
	}
}

// station is the coordinator's singleton station on m: the coordinator
// here takes the word (if its instance may run: the fence), else it goes
// to the member m takes for the oldest, once.
func (s *simCluster) station(m *simMember, from NodeUID, w simShardWord) {
	if st, ok := w.msg.(interface{ stamped(sentBy) any }); ok {
		w.msg = st.stamped(sentBy{from: from}).(shardCoordMsg)
	}
	if k := m.shard.coord; k != nil && m.inst {
		if s.liveInstance(m) {
			k.receive(w.msg, s.now)
		}
		return
	}
	if w.relayed || m.target == nil || m.target.UID == m.uid {
		return // (the real station holds it until it knows where: every word is said again)
	}
	if to := s.shardTo(m.target.UID); to != nil {
		w.relayed = true
		s.shardSend(m, to, w)
	}
}

// shardModes is which shards run on m (here or stopping).
func (s *simCluster) shardModes(m *simMember) []bool {
	out := make([]bool, len(m.shard.region.shards))
	for i, sh := range m.shard.region.shards {
		out[i] = sh.mode == shardHere || sh.mode == shardStopping
	}
	return out
}

// noteShardModes counts the placements and hand-offs a step made on m,
// in the trace too.
func (s *simCluster) noteShardModes(m *simMember, before []bool) {
	for i, was := range before {
		now := m.shard.region.shards[i].mode
		runs := now == shardHere || now == shardStopping
		switch {
		case runs && !was:
			s.shards.placed++
			s.trace.add(fmt.Sprintf("%d runs shard %d", m.slot, i))
		case was && !runs:
			s.shards.moves++
			s.trace.add(fmt.Sprintf("%d gave shard %d away", m.slot, i))
		}
	}
}

// shardRuns reports whether shard id runs on o and may take a message:
// its process runs and its cluster has not stopped; a paused process
// runs nothing until it resumes.
func (s *simCluster) shardRuns(o *simMember, id int32) bool {
	if !o.running || o.stopped || o.paused || o.shard.region == nil {
		return false
	}
	mode := o.shard.region.shards[id].mode
	return mode == shardHere || mode == shardStopping
}

// stoodStill reports whether o resumed, within a removal margin, from a
// pause longer than the pause budget: the rule regions do not apply yet.
func (s *simCluster) stoodStill(o *simMember) bool {
	return o.shard.stood > s.cfg.StableAfter/2 && s.now.Sub(o.shard.resumedAt) < s.shards.cfg.RemovalMargin
}

// checkOneShard checks, when shard id runs on m, that it runs on no
// other member.
func (s *simCluster) checkOneShard(m *simMember, id int32) {
	if !s.shardRuns(m, id) {
		return
	}
	for _, o := range s.members {
		if o == m || !s.shardRuns(o, id) || s.violation != "" {
			continue
		}
		if s.stoodStill(o) || s.stoodStill(m) {
			s.shards.overlaps++
			continue
		}
		s.violation = fmt.Sprintf("shard %d runs on two members at %v (seed %d): on %s and on %s; faults:\n%s",
			id, s.now.Sub(simEpoch), s.seed, o.addr, m.addr, strings.Join(s.log, "\n"))
	}
}

// resumeShards notes the pause m resumes from, and checks its shards.
func (s *simCluster) resumeShards(m *simMember) {
	m.shard.stood, m.shard.resumedAt = s.now.Sub(m.shard.pausedAt), s.now
	for i := range m.shard.region.shards {
		s.checkOneShard(m, int32(i))
	}
}

// shardsSettled runs, after the cluster converged, until every shard any
// member has messages for runs on exactly one member and every member
// sends its messages to a running member (a removal margin and a minute
// at most).
func (s *simCluster) shardsSettled() error {
	var why string
	if _, ok := s.until(s.shards.cfg.RemovalMargin+time.Minute, func() bool {
		why = ""
		for _, m := range s.running() {
			for _, id := range slices.Sorted(mapKeys(m.shard.wants)) {
				why = fmt.Sprintf("%s has had messages for shard %d without a home", m.addr, id)
				return false
			}
		}
		for id := range s.shards.cfg.Shards {
			var on []*simMember
			for _, m := range s.running() {
				if s.shardRuns(m, int32(id)) {
					on = append(on, m)
				}
			}
			if len(on) > 1 {
				why = fmt.Sprintf("shard %d runs on %d members", id, len(on))
				return false
			}
			for _, m := range s.running() {
				// (One that missed the word of a move sends to the old
				// home, which holds what it gets and asks, as any
				// member does for a shard without a home.)
				sh := m.shard.region.shards[id]
				if sh.mode == shardThere && len(on) == 0 {
					why = fmt.Sprintf("%s sends shard %d's messages to a member, and none runs it", m.addr, id)
					return false
				}
				if to := s.shardTo(sh.homeUID); sh.mode == shardThere && (to == nil || to.stopped) {
					why = fmt.Sprintf("%s sends shard %d's messages to a member that is gone", m.addr, id)
					return false
				}
			}
		}
		return true
	}); !ok || s.violation != "" {
		if s.violation != "" {
			return fmt.Errorf("%s", s.violation)
		}
		return fmt.Errorf("the shards did not settle %v after the cluster converged (seed %d): %s; faults:\n%s",
			s.shards.cfg.RemovalMargin+time.Minute, s.seed, why, strings.Join(s.log, "\n"))
	}
	return nil
}

// simRegionHost is a region's simulated member.
type simRegionHost struct {
	s *simCluster
	m *simMember
}

func (h simRegionHost) now() time.Time               { return h.s.now }
func (h simRegionHost) self() NodeUID                { return h.m.uid }
func (h simRegionHost) isGone(uid NodeUID) bool      { return hasKey(h.m.shard.gone, uid) }
func (h simRegionHost) liveOthers() map[NodeUID]Addr { return h.m.ms.liveOthers() }
func (h simRegionHost) logger() *slog.Logger         { return h.s.shards.log }
func (h simRegionHost) tellCoord(msg shardCoordMsg)  { h.s.shardSend(h.m, h.m, simShardWord{msg: msg}) }

func (h simRegionHost) tellRegion(_ Addr, uid NodeUID, msg regionMsg) {
	if to := h.s.shardTo(uid); to != nil {
		h.s.shardSend(h.m, to, msg)
	}
}

// regionAt is memberRef: the member at addr, as m knows it, if its
// process runs (an association to it is up).
func (h simRegionHost) regionAt(addr Addr) (*handle, NodeUID, bool) {
	for _, o := range h.s.members {
		if o.addr == addr && o.running {
			return nil, o.uid, true
		}
	}
	return nil, NodeUID{}, false
}

func hasKey[K comparable, V any](m map[K]V, k K) bool {
	_, ok := m[k]
	return ok
}

// simCoordHost is a coordinator's simulated member.
type simCoordHost struct {
	s *simCluster
	m *simMember
}

func (h simCoordHost) self() NodeUID                { return h.m.uid }
func (h simCoordHost) downs() map[NodeUID]time.Time { return h.m.shard.downed.times() }
func (h simCoordHost) listable() map[NodeUID]Addr   { return h.m.ms.listable() }
func (h simCoordHost) logger() *slog.Logger         { return h.s.shards.log }

func (h simCoordHost) members() []Member {
	sm := &h.m.shard
	if !sm.listedOK || sm.listedOf != h.m.ms.digested {
		sm.listed = sm.listed[:0]
		for _, mm := range h.m.ms.members {
			sm.listed = append(sm.listed, *mm)
		}
		slices.SortFunc(sm.listed, lowerAddr)
		sm.listedOf, sm.listedOK = h.m.ms.digested, true
	}
	return slices.Clone(sm.listed)
}

func (h simCoordHost) tellRegion(uid NodeUID, msg regionMsg) bool {
	if uid == h.m.uid {
		h.s.shardSend(h.m, h.m, msg)
		return true
	}
	for _, mm := range h.m.ms.members {
		if mm.UID == uid {
			if to := h.s.shardTo(uid); to != nil {
				h.s.shardSend(h.m, to, msg)
			}
			return true // (queued on its association)
		}
	}
	return false
}

// A random fault schedule on a few seeds, with a sharded kind of 60
// shards: never one shard on two running members; after the faults,
// every shard asked for runs on one member, and every member knows which.
func TestClusterSimShardsUnderFaults(t *testing.T) {
	t.Parallel()
	for seed := uint64(1); seed <= 4; seed++ {
		s := newSimCluster(7, seed, simTestConfig(KeepMajority()), time.Second)
		s.withShards(60, 2)
		s.longFaults = true
		if _, ok := s.startAll(time.Minute); !ok {
			t.Fatalf("seed %d: not formed", seed)
		}
		s.simFaults(5 * time.Minute)
		if s.violation != "" {
			t.Fatal(s.violation)
		}
		if err := s.settleOrWhy(2 * time.Minute); err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		if err := s.shardsSettled(); err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		t.Logf("seed %d: %d placements, %d hand-offs, %d coordinators, %d overlaps after a pause", seed, s.shards.placed, s.shards.moves, s.shards.coords, s.shards.overlaps)
	}
}

// A split with shards on both sides, the coordinator with the majority:
// the shards of the minority run on the majority only a removal margin
// after it downed the minority, once the minority has stopped them;
// without the margin, the simulator catches a shard on two members.
func TestClusterSimCatchesAShardOnTwoMembers(t *testing.T) {
	t.Parallel()
	split := func(seed uint64, margin bool) *simCluster {
		s := newSimCluster(5, seed, simTestConfig(KeepMajority()), time.Second)
		s.withShards(20, 3)
		if !margin {
			s.shards.cfg.RemovalMargin = 0
		}
		s.startFormed()
		s.runFor(20 * time.Second)                      // (every member asks for shards)
		s.partition([]int{3, 4}, []int{0, 1, 2}, false) // (the coordinator, on the oldest, with the majority)
		s.runFor(2 * time.Minute)
		return s
	}
	for seed := uint64(1); seed <= 5; seed++ {
		if s := split(seed, true); s.violation != "" {
			t.Fatalf("with the removal margin, seed %d: %s", seed, s.violation)
		} else if s.shards.placed == 0 {
			t.Fatalf("seed %d: no shard placed", seed)
		}
	}
	caught := 0
	for seed := uint64(1); seed <= 5; seed++ {
		s := split(seed, false)
		if strings.Contains(s.violation, "runs on two members") {
			if !strings.Contains(s.violation, fmt.Sprintf("seed %d", seed)) {
				t.Fatalf("violation %q does not name the seed", s.violation)
			}
			caught++
		}
	}
	if caught == 0 {
		t.Fatal("no removal margin, five splits: a shard on two members never caught")
	}
	t.Logf("caught on %d of 5 seeds", caught)
}

// Two members that each take the other for a shard's home (each missed a
// word of the coordinator) do not pass its messages back and forth: the
// one that gets a message from the other asks the coordinator, and the
// shard runs.
func TestClusterSimAShardsMessagesDoNotCircle(t *testing.T) {
	t.Parallel()
	s := newSimCluster(3, 1, simTestConfig(KeepMajority()), time.Second)
	s.withShards(4, 0)
	s.startFormed()
	s.runFor(5 * time.Second)
	m1, m2 := s.members[1], s.members[2]
	var epoch uint64
	for _, m := range s.members {
		if m.shard.coord != nil {
			epoch = m.shard.coord.epoch
		}
	}
	if epoch == 0 || m1.shard.region.epoch != epoch || m2.shard.region.epoch != epoch {
		t.Fatalf("no coordinator, or regions that have not heard it (epoch %x)", epoch)
	}
	m1.shard.region.receive(nil, shardHome{Epoch: epoch, Shard: 0, Home: m2.uid, Addr: m2.addr.String()})
	m2.shard.region.receive(nil, shardHome{Epoch: epoch, Shard: 0, Home: m1.uid, Addr: m1.addr.String()})
	if m1.shard.region.shards[0].mode != shardThere || m2.shard.region.shards[0].mode != shardThere {
		t.Fatal("the two members do not take each other for shard 0's home")
	}
	m1.shard.wants[0] = true
	if err := s.shardsSettled(); err != nil {
		t.Fatal(err)
	}
	on := 0
	for _, m := range s.members {
		if s.shardRuns(m, 0) {
			on++
		}
	}
	if on != 1 {
		t.Fatalf("shard 0 runs on %d members; want 1", on)
	}
}

// The same seed replays a run with shards step for step.
func TestClusterSimReplaysShardsFromItsSeed(t *testing.T) {
	t.Parallel()
	run := func(seed uint64) (uint64, int, int) {
		s := newSimCluster(7, seed, simTestConfig(KeepMajority()), time.Second)
		s.withShards(40, 2)
		s.startAll(time.Minute)
		s.simFaults(2 * time.Minute)
		return s.trace.h, s.steps, s.shards.placed
	}
	h1, n1, p1 := run(42)
	h2, n2, p2 := run(42)
	if h1 != h2 || n1 != n2 || p1 != p2 {
		t.Fatalf("seed 42 twice: %x in %d steps (%d placements), then %x in %d steps (%d)", h1, n1, p1, h2, n2, p2)
	}
	if p1 == 0 {
		t.Fatal("no shard placed")
	}
}
