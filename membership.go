package troupe

import (
	"cmp"
	"encoding/binary"
	"encoding/hex"
	"hash/fnv"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"
)

// This file holds the pure half of a cluster member: its membership as
// plain data, and the functions that change it — merging gossip, recording
// what this member cannot reach, the leader's transitions, downing — each
// given the time explicitly, like etcd raft's Step. cluster_loop.go runs them
// on its goroutine with the network and the timers; it decides nothing.

// membership is the state of a cluster as one member knows it.
type membership struct {
	self     NodeUID
	members  map[NodeUID]*Member
	reach    map[NodeUID]reachRecord // per observer: whom it cannot reach
	seen     map[NodeUID]bool        // who is known to hold exactly this state
	digested uint64                  // the digest seen is about
	changed  time.Time               // when the state last changed
	unstable time.Time               // when members first became unreachable (zero if none)
	decided  bool                    // the downing strategy already acted for this split
	// decidedOn is the unreachable set the decision was about: when it
	// changes (a member fails after the decision), there is a new split.
	decidedOn string
	// watchedBy is how many members watch each member with a failure
	// detector (ClusterConfig.MonitoredMembers; zero: all of them)
	watchedBy int
	// ownKept is what a keep on this member's own view was about (the
	// unreachable set and its own record's version): it is not run again
	// for the same, and unlike a decision it leaves the wait for
	// DownAllWhenUnstable running (see stepOwnView).
	ownKept string
	// ringCache is ring's answer for the state whose digest is ringOf.
	ringCache []NodeUID
	ringOf    uint64
	// unreach is unreachable's answer for the state whose digest is
	// unreachOf (nil: not computed).
	unreach   map[NodeUID]bool
	unreachOf uint64
	// leading is leader's answer for the state whose digest is
	// leadingOf (leadingSet: computed).
	leading    *Member
	leadingOf  uint64
	leadingSet bool
	// shared is snapshot's members and records for the state whose
	// digest is sharedOf (nil: not built, or an app version moved,
	// which the digest leaves out); never changed once built, since
	// messages in flight share it.
	shared   *gossipMsg
	sharedOf uint64
	// order keeps the members' and observers' uids sorted (memberOrder).
	order uidOrder
	// passedOn is when a merged change was last passed on at once (see
	// passOn).
	passedOn time.Time
	// leaseWait is until when a member of this side said it waits for
	// a lease that cannot be granted yet, and decides (see
	// heardLeaseWait); leaseWaitOn is the unreachable set it was about.
	leaseWait   time.Time
	leaseWaitOn string
}

// uidOrder is the members' and the observers' uids in uid order, the
// order the digest, a gossiped state and the choice of gossip targets
// take them in. Neither map ever loses a key (a removed member stays, as
// a tombstone; an observer's record is replaced, not dropped), so a list
// is current while it is as long as its map: sorted again only when a
// member or an observer is new, not at every gossip.
// A member's entry is changed in place, never replaced, so its pointer
// is kept beside its uid.
type uidOrder struct {
	members, observers []NodeUID
	entries            []*Member  // members' entries, in the order of members
	hexes              [][64]byte // members' uids as the digest writes them
	ring               []NodeUID  // every member in ring order (ring)
}

// memberOrder is every member's uid in uid order, and each one's entry;
// callers must change neither slice.
func (ms *membership) memberOrder() ([]NodeUID, []*Member) {
	if len(ms.order.members) != len(ms.members) || len(ms.order.entries) != len(ms.members) {
		ms.order.members = slices.SortedFunc(maps.Keys(ms.members), compareUID)
		ms.order.entries = make([]*Member, len(ms.order.members))
		for i, uid := range ms.order.members {
			ms.order.entries[i] = ms.members[uid]
		}
	}
	return ms.order.members, ms.order.entries
}

// observerUIDs is every observer's uid in uid order; callers must not
// change it.
func (ms *membership) observerUIDs() []NodeUID {
	if len(ms.order.observers) != len(ms.reach) {
		ms.order.observers = slices.SortedFunc(maps.Keys(ms.reach), compareUID)
	}
	return ms.order.observers
}

// heardLeaseWait records that member from, reachable here, waits for
// the lease for d more and has decided by then: until then plus margin
// this member, not leading its side, does not down itself for
// instability (see nextDowning). Safe because a lease that cannot be
// granted yet is granted to nobody before the wait ends
// ([LeaseWaitError]): a side that wins takes it then at the earliest and
// holds it for leaseHold, past this member's wait plus margin, with
// StableAfter + DownAllWhenUnstable to spare for the notice's way here
// (d counts from when it arrives). A notice longer than limit (the
// longest a lease wait, a minority delay and a call take), about another
// split (this member's unreachable set when it arrives), or from a
// member this one finds unreachable, is ignored.
func (ms *membership) heardLeaseWait(from NodeUID, d, margin, limit time.Duration, now time.Time) {
	if d <= 0 || d > limit || from == ms.self {
		return
	}
	if m := ms.members[from]; m == nil || !live(m) || ms.unreachable()[from] {
		return
	}
	key := ms.unreachableKey()
	until := now.Add(d + margin)
	if key != ms.leaseWaitOn || until.After(ms.leaseWait) {
		ms.leaseWait, ms.leaseWaitOn = until, key
	}
}

// ownKey names what an own-view decision is about.
func (ms *membership) ownKey() string {
	return ms.unreachableKey() + strconv.FormatUint(ms.reach[ms.self].version, 10)
}

// unreachableKey names the current set of unreachable live members.
func (ms *membership) unreachableKey() string {
	var b strings.Builder
	for _, uid := range slices.SortedFunc(maps.Keys(ms.unreachable()), compareUID) {
		b.Write(uid[:])
	}
	return b.String()
}

// reachRecord is one observer's view: whom it cannot reach, versioned so
// that the newest view of each observer wins a merge.
type reachRecord struct {
	version     uint64
	unreachable []NodeUID
}

// newMembership is the membership of a member that knows only itself.
func newMembership(self Member, now time.Time) membership {
	ms := membership{
		self:    self.UID,
		members: map[NodeUID]*Member{self.UID: &self},
		reach:   map[NodeUID]reachRecord{},
		changed: now,
	}
	ms.resetSeen()
	return ms
}

// resetSeen notes that the state changed: only this member has seen it.
func (ms *membership) resetSeen() {
	ms.seen = map[NodeUID]bool{ms.self: true}
	ms.digested = ms.digest()
}

// touched is called after anything that may have changed the state: when
// the digest moved, the seen set starts again and the time is noted.
func (ms *membership) touched(now time.Time) bool {
	d := ms.digest()
	if d == ms.digested {
		return false
	}
	ms.seen = map[NodeUID]bool{ms.self: true}
	ms.digested = d
	ms.changed = now
	return true
}

// passOn says whether a change just merged is passed on at once, before
// the next turn: the first change in a gossip interval is, so that news
// reaches a hundred members in a few hops rather than a few intervals;
// later ones in the same interval wait for the turn, whose one state
// carries them all. Without the bound every member sent its whole state
// to 5 others at every change of any member's view, and a split, in which
// every watcher of every lost member reports at its own turn, cost each
// member a number of whole states that grew with the cluster
// (BENCHMARKS.md, "The cluster in the simulator").
func (ms *membership) passOn(now time.Time, interval time.Duration) bool {
	if !ms.passedOn.IsZero() && now.Sub(ms.passedOn) < interval {
		return false
	}
	ms.passedOn = now
	return true
}

// live reports whether a member is still part of the membership.
func live(m *Member) bool { return m.Status < MemberDown }

// unreachable is the set of live members some up or leaving member cannot
// reach. A joining member's observations do not count: it is not yet part
// of the cluster, and one that reaches only its seed must not make the
// whole cluster look unreachable. It is kept until the state changes
// (keyed by the digest, which every change moves: see touched); callers
// must not change it.
func (ms *membership) unreachable() map[NodeUID]bool {
	if ms.unreach != nil && ms.unreachOf == ms.digested {
		return ms.unreach
	}
	out := ms.weighUnreachable()
	ms.unreach, ms.unreachOf = out, ms.digested
	return out
}

// weighUnreachable computes unreachable.
func (ms *membership) weighUnreachable() map[NodeUID]bool {
	out := map[NodeUID]bool{}
	if !ms.anyUnreachable() {
		return out // (the usual case, and no need to weigh the observers)
	}
	off := ms.discounted()
	for obs, r := range ms.reach {
		if m := ms.members[obs]; m == nil || !m.counts() || off[obs] && obs != ms.self {
			continue
		}
		for _, u := range r.unreachable {
			if m := ms.members[u]; m != nil && live(m) {
				out[u] = true
			}
		}
	}
	return out
}

// anyUnreachable reports whether any observer reports any member
// unreachable.
func (ms *membership) anyUnreachable() bool {
	for _, r := range ms.reach {
		if len(r.unreachable) > 0 {
			return true
		}
	}
	return false
}

// discounted is the observers whose reports do not count: each is itself
// reported unreachable by more than half of the members that watch it (all
// the others, or MonitoredMembers of them on the ring), and together they
// are fewer than half of the members that count. A member that can send
// but not receive loses everyone and says so, while everyone loses it:
// were its reports counted, every member would be unreachable to someone
// and no side would have a leader to decide. Counted without them, the
// others are one side and it is the other. (Were most members
// discounted, the rule would decide nothing of the split: it is not
// applied, and the reports all count.) A member's own reports count in
// its own view whatever this says (unreachable, splitView).
func (ms *membership) discounted() map[NodeUID]bool {
	counting := 0
	for _, m := range ms.members {
		if live(m) && m.counts() {
			counting++
		}
	}
	watchers := counting - 1
	if ms.watchedBy > 0 {
		watchers = min(watchers, ms.watchedBy)
	}
	var reported map[NodeUID]int
	var once map[NodeUID]bool // (a record from the wire may name a member twice)
	for obs, r := range ms.reach {
		if m := ms.members[obs]; m == nil || !live(m) || !m.counts() {
			continue
		}
		clear(once)
		for _, u := range r.unreachable {
			if u == obs || once[u] {
				continue
			}
			if reported == nil {
				reported, once = map[NodeUID]int{}, map[NodeUID]bool{}
			}
			once[u] = true
			reported[u]++
		}
	}
	var off map[NodeUID]bool
	for u, k := range reported {
		if m := ms.members[u]; m != nil && live(m) && m.counts() && 2*k > watchers {
			if off == nil {
				off = map[NodeUID]bool{}
			}
			off[u] = true
		}
	}
	if 2*len(off) >= counting {
		return nil
	}
	return off
}

func compareUID(a, b NodeUID) int {
	// bytes.Compare's order, in two word compares: the digest sorts every
	// member with it.
	if c := cmp.Compare(binary.BigEndian.Uint64(a[:8]), binary.BigEndian.Uint64(b[:8])); c != 0 {
		return c
	}
	return cmp.Compare(binary.BigEndian.Uint64(a[8:]), binary.BigEndian.Uint64(b[8:]))
}

// digest summarizes the state, so members can tell they have seen the same
// one. Its value is part of the protocol (members of different versions
// compare digests): an FNV-1a hash of each member's "%x:%d:%d;" (the hex
// of its uid's hex form, its status, its up number) in uid order, then of
// each observer's "%x:%d;" (uid, record version). It is built here without
// fmt: it runs twice for every gossip a member merges.
func (ms *membership) digest() uint64 {
	h := uint64(fnvOffset64)
	uids, entries := ms.memberOrder()
	if len(ms.order.hexes) != len(uids) { // (the uids' text is kept with their order)
		ms.order.hexes = make([][64]byte, len(uids))
		for i, uid := range uids {
			appendDigestUID(ms.order.hexes[i][:0], uid)
		}
	}
	var scratch [48]byte
	for i, m := range entries {
		h = digestMember(h, scratch[:], ms.order.hexes[i][:], m.Status, m.UpNumber)
	}
	for _, o := range ms.observerUIDs() {
		h = digestObserver(h, o, ms.reach[o].version)
	}
	return h
}

// digestMember adds a member's entry to a digest: its uid's text (see
// appendDigestUID), status and up number. scratch is the caller's, for
// the numbers' text (48 bytes hold any).
func digestMember(h uint64, scratch, uidText []byte, status MemberStatus, up int) uint64 {
	h = fnvAdd(h, uidText)
	b := append(scratch[:0], ':')
	b = strconv.AppendInt(b, int64(status), 10)
	b = append(b, ':')
	b = strconv.AppendInt(b, int64(up), 10)
	return fnvAdd(h, append(b, ';'))
}

// digestObserver adds an observer's record to a digest: its uid and the
// record's version.
func digestObserver(h uint64, uid NodeUID, version uint64) uint64 {
	var buf [96]byte
	b := appendDigestUID(buf[:0], uid)
	b = append(b, ':')
	b = strconv.AppendUint(b, version, 10)
	return fnvAdd(h, append(b, ';'))
}

// FNV-1a, 64 bits (hash/fnv's New64a), a byte at a time in a loop the
// digest's thousand members do not call through an interface.
const (
	fnvOffset64 = 14695981039346656037
	fnvPrime64  = 1099511628211
)

func fnvAdd(h uint64, b []byte) uint64 {
	for _, c := range b {
		h ^= uint64(c)
		h *= fnvPrime64
	}
	return h
}

// appendDigestUID appends what fmt's %x makes of a NodeUID: the hex of its
// String, itself hex.
func appendDigestUID(b []byte, uid NodeUID) []byte {
	var x [32]byte
	hex.Encode(x[:], uid[:])
	return hex.AppendEncode(b, x[:])
}

// digestOf computes the digest of a gossiped state the way digest does
// for a member's own.
func digestOf(g gossipMsg) uint64 {
	if d, ok := digestOfSorted(g); ok {
		return d
	}
	tmp := membership{members: map[NodeUID]*Member{}, reach: map[NodeUID]reachRecord{}}
	for _, gm := range g.Members {
		tmp.members[gm.UID] = &Member{UID: gm.UID, Status: MemberStatus(gm.Status), UpNumber: gm.UpNumber}
	}
	for _, r := range g.Reach {
		tmp.reach[r.Observer] = reachRecord{version: r.Version}
	}
	return tmp.digest()
}

// heldBy notes that from holds this member's state, and so do the
// members it says have seen it.
func (ms *membership) heldBy(from NodeUID, seen []NodeUID) {
	ms.seen[from] = true
	for _, uid := range seen {
		if !ms.seen[uid] { // (mostly known already: a lookup is cheaper)
			ms.seen[uid] = true
		}
	}
}

// holds reports whether digestOf(g) is this member's digest: whether g is
// the state it holds. A state in strictly increasing uid order, as
// snapshot sends it, is compared entry by entry, without hashing.
func (ms *membership) holds(g gossipMsg) bool {
	for i := 1; i < len(g.Members); i++ {
		if compareUID(g.Members[i-1].UID, g.Members[i].UID) >= 0 {
			return ms.digested == digestOf(g)
		}
	}
	for i := 1; i < len(g.Reach); i++ {
		if compareUID(g.Reach[i-1].Observer, g.Reach[i].Observer) >= 0 {
			return ms.digested == digestOf(g)
		}
	}
	if len(g.Members) != len(ms.members) || len(g.Reach) != len(ms.reach) {
		return false // (in strictly increasing order, no uid twice)
	}
	// Two lists in strictly increasing order and of one length hold the
	// same uids only place by place.
	uids, entries := ms.memberOrder()
	for i, gm := range g.Members {
		if m := entries[i]; uids[i] != gm.UID || m.Status != MemberStatus(gm.Status) || m.UpNumber != gm.UpNumber {
			return false
		}
	}
	for _, r := range g.Reach {
		if cur, ok := ms.reach[r.Observer]; !ok || cur.version != r.Version {
			return false
		}
	}
	return true
}

// digestOfSorted is digestOf for a state whose members and records are
// each in strictly increasing uid order, as snapshot sends them: it needs
// neither maps nor sorting. ok is false for any other state.
func digestOfSorted(g gossipMsg) (d uint64, ok bool) {
	for i := 1; i < len(g.Members); i++ {
		if compareUID(g.Members[i-1].UID, g.Members[i].UID) >= 0 {
			return 0, false
		}
	}
	for i := 1; i < len(g.Reach); i++ {
		if compareUID(g.Reach[i-1].Observer, g.Reach[i].Observer) >= 0 {
			return 0, false
		}
	}
	h := uint64(fnvOffset64)
	var x [64]byte
	var scratch [48]byte
	for _, m := range g.Members {
		h = digestMember(h, scratch[:], appendDigestUID(x[:0], m.UID), MemberStatus(m.Status), m.UpNumber)
	}
	for _, r := range g.Reach {
		h = digestObserver(h, r.Observer, r.Version)
	}
	return h, true
}

// converged reports whether every live member is reachable and has seen
// this member's state.
func (ms *membership) converged() bool {
	for uid := range ms.unreachable() {
		if ms.members[uid].Status < MemberExiting {
			return false // an unreachable exiting member has just stopped
		}
	}
	for uid, m := range ms.members {
		if m.Status >= MemberExiting {
			continue // an exiting member has stopped listening
		}
		if !ms.seen[uid] {
			return false
		}
	}
	return true
}

// leader is the lowest-addressed up member this member can reach, or when
// none is, the lowest-addressed leaving one. (The first member of a
// cluster starts up; joiners never lead.) A leaving member leads only when
// it must: a leader that moved itself to exiting would stop before the
// others heard of it, and they would see a crash.
// It is kept until the state changes, as unreachable is.
func (ms *membership) leader() *Member {
	if ms.leadingSet && ms.leadingOf == ms.digested {
		return ms.leading
	}
	ms.leading, ms.leadingOf, ms.leadingSet = ms.chooseLeader(), ms.digested, true
	return ms.leading
}

// chooseLeader computes leader.
func (ms *membership) chooseLeader() *Member {
	unreachable := ms.unreachable()
	var best *Member
	for uid, m := range ms.members {
		if !m.counts() || unreachable[uid] && uid != ms.self {
			continue
		}
		if best == nil || (m.Status == MemberUp) != (best.Status == MemberUp) && m.Status == MemberUp ||
			m.Status == best.Status && lowerAddr(*m, *best) < 0 {
			best = m
		}
	}
	return best
}

// snapshot is the whole state, to gossip.
func (ms *membership) snapshot() gossipMsg {
	g := gossipMsg{From: ms.self}
	for uid := range ms.seen {
		g.Seen = append(g.Seen, uid)
	}
	// In uid order, not the maps': a receiver merges in the order it
	// reads, and the simulator replays a run only if that is the same.
	slices.SortFunc(g.Seen, compareUID)
	if ms.shared == nil || ms.sharedOf != ms.digested {
		sh := &gossipMsg{Members: make([]gossipMember, 0, len(ms.members))}
		_, entries := ms.memberOrder()
		for _, m := range entries {
			sh.Members = append(sh.Members, gossipMember{Addr: m.Addr.String(), UID: m.UID, Status: uint8(m.Status), UpNumber: m.UpNumber, AppVersion: m.AppVersion})
		}
		for _, o := range ms.observerUIDs() {
			r := ms.reach[o]
			sh.Reach = append(sh.Reach, gossipReach{Observer: o, Version: r.version, Unreachable: r.unreachable})
		}
		sh.Reach = slices.Clip(sh.Reach)
		ms.shared, ms.sharedOf = sh, ms.digested
	}
	g.Members, g.Reach = ms.shared.Members, ms.shared.Reach
	return g
}

// merged is what merging a gossiped state changed besides the state.
type merged struct {
	events  []MemberEvent
	added   []NodeUID // members this member had not known
	ended   []NodeUID // earlier incarnations, downed: end their associations
	tellTo  *Member   // the sender, downed or removed here: tell it so
	confirm bool      // the sender does not know this member now holds its state
	changed bool
}

// merge folds a gossiped state into this one: a member's status only moves
// forward, its up number keeps the lowest seen, and each observer's newest
// reachability record wins (only this member speaks for itself).
func (ms *membership) merge(g gossipMsg, now time.Time) merged {
	var out merged
	oldUnreach := ms.unreachable()
	// A state in uid order, as snapshot sends it, is read alongside this
	// member's own list rather than looked up entry by entry (a thousand
	// map look-ups a merge); any other order, through the map.
	uids, entries := ms.memberOrder()
	j, inOrder := 0, true
	for i, gm := range g.Members {
		var m *Member
		if inOrder && i > 0 && compareUID(g.Members[i-1].UID, gm.UID) >= 0 {
			inOrder = false
		}
		if inOrder {
			for j < len(uids) && compareUID(uids[j], gm.UID) < 0 {
				j++
			}
			if j < len(uids) && uids[j] == gm.UID {
				m = entries[j]
			}
		} else {
			m = ms.members[gm.UID]
		}
		if m == nil {
			addr, err := ParseAddr(gm.Addr) // (a member's address never changes)
			if err != nil {
				continue
			}
			m = &Member{Addr: addr, UID: gm.UID, Status: MemberStatus(gm.Status), UpNumber: gm.UpNumber, AppVersion: boundedAppVersion(gm.AppVersion)}
			ms.members[gm.UID] = m
			out.added = append(out.added, gm.UID)
			out.events = append(out.events, MemberEvent{Member: *m, Kind: eventMemberStatus})
			if live(m) {
				out.events = append(out.events, ms.replaceIncarnation(m, &out.ended)...)
			}
			continue
		}
		changed := false
		if m.AppVersion == "" || gm.UID == g.From && gm.UID != ms.self {
			// Heard late, or from the member itself, which speaks for
			// its own version (a relay's copy may be a stale one).
			if v := boundedAppVersion(gm.AppVersion); v != m.AppVersion {
				m.AppVersion, ms.shared = v, nil
			}
		}
		if s := MemberStatus(gm.Status); s > m.Status {
			m.Status, changed = s, true
		}
		if gm.UpNumber != 0 && (m.UpNumber == 0 || gm.UpNumber < m.UpNumber) {
			m.UpNumber, changed = gm.UpNumber, true
		}
		if changed {
			out.events = append(out.events, MemberEvent{Member: *m, Kind: eventMemberStatus})
		}
	}
	news := len(out.events) > 0 // (a member added, or a status or up number moved)
	for _, r := range g.Reach {
		if r.Observer == ms.self {
			continue // only this member speaks for itself
		}
		if cur, ok := ms.reach[r.Observer]; !ok || r.Version > cur.version {
			ms.reach[r.Observer] = reachRecord{version: r.Version, unreachable: r.Unreachable}
			news = true
		}
	}
	// Most gossip brings nothing new, and then the digest is the same:
	// it is not computed again.
	out.changed = news && ms.touched(now)
	if ms.holds(g) {
		// Both hold the same state now: whoever had seen the sender's has
		// seen this one.
		ms.heldBy(g.From, g.Seen)
		out.confirm = !slices.Contains(g.Seen, ms.self)
	}
	// A sender this member has downed or removed may not know: tell it,
	// so that it stops instead of knocking as a joiner for ever. (One
	// whose own gossip says it is down knows, and stops at its next turn.)
	knows := slices.ContainsFunc(g.Members, func(gm gossipMember) bool {
		return gm.UID == g.From && !live(&Member{Status: MemberStatus(gm.Status)})
	})
	if m := ms.members[g.From]; m != nil && !live(m) && g.From != ms.self && !knows {
		out.tellTo = &Member{Addr: m.Addr, UID: m.UID}
	}
	out.events = append(out.events, ms.reachEvents(oldUnreach, now)...)
	return out
}

// replaceIncarnation handles a member new to this one: a member with
// another uid at its address is an earlier incarnation of the same
// process, which is gone — two processes cannot listen on one address. It
// is downed if it was live (the leader then removes it), and its uid
// added to ended.
func (ms *membership) replaceIncarnation(m *Member, ended *[]NodeUID) []MemberEvent {
	if self := ms.members[ms.self]; m.UID != ms.self && m.Addr == self.Addr {
		// At this member's own address: an earlier incarnation of this
		// very process, gossiped by those that have not noticed yet.
		m.Status = MemberDown
		*ended = append(*ended, m.UID)
		return []MemberEvent{{Member: *m, Kind: eventMemberStatus}}
	}
	var events []MemberEvent
	for uid, old := range ms.members {
		if uid == m.UID || uid == ms.self || old.Addr != m.Addr {
			continue
		}
		if live(old) {
			old.Status = MemberDown
			events = append(events, MemberEvent{Member: *old, Kind: eventMemberStatus})
		}
		// Ended even when already downed (the same gossip may have said
		// so): sends to the address must reach the new incarnation, not
		// a connection to the old one.
		*ended = append(*ended, uid)
	}
	return events
}

// reachEvents compares the unreachable set with old, and notes when the
// cluster became unstable (or stable again). An exiting member gets no
// event either way: it stops as soon as it learns it may, so its silence
// is its exit, not a failure (it stays in the set, where it blocks
// nothing: see converged, and the leader removes it).
func (ms *membership) reachEvents(old map[NodeUID]bool, now time.Time) []MemberEvent {
	var out []MemberEvent
	cur := ms.unreachable()
	for uid := range cur {
		if !old[uid] && ms.members[uid].Status != MemberExiting {
			out = append(out, MemberEvent{Member: *ms.members[uid], Kind: eventMemberUnreachable})
		}
	}
	for uid := range old {
		// (A member downed meanwhile left the set without being
		// reached: its status event says what happened.)
		if m := ms.members[uid]; !cur[uid] && m != nil && m.Status != MemberExiting && live(m) {
			out = append(out, MemberEvent{Member: *ms.members[uid], Kind: eventMemberReachable, Reachable: true})
		}
	}
	if len(cur) > 0 && ms.unstable.IsZero() {
		ms.unstable = now
	}
	if len(cur) == 0 {
		ms.unstable, ms.decided = time.Time{}, false
	}
	return out
}

// observe records the members this member's detectors find unreachable.
func (ms *membership) observe(unreachable []NodeUID, now time.Time) []MemberEvent {
	mine := slices.SortedFunc(slices.Values(unreachable), compareUID)
	cur := ms.reach[ms.self]
	if slices.Equal(cur.unreachable, mine) {
		return nil
	}
	old := ms.unreachable()
	ms.reach[ms.self] = reachRecord{version: cur.version + 1, unreachable: mine}
	ms.touched(now)
	return ms.reachEvents(old, now)
}

// lead performs the leader's transitions, if this member is the leader
// and the state has converged: joining members become up (up numbers in
// address order), leaving ones exiting, exiting and down ones removed.
func (ms *membership) lead(now time.Time) []MemberEvent {
	if l := ms.leader(); l == nil || l.UID != ms.self || !ms.converged() {
		return nil
	}
	old := ms.unreachable() // (a joiner's reports count once it is up)
	var events []MemberEvent
	maxUp := 0
	for _, m := range ms.members {
		maxUp = max(maxUp, m.UpNumber)
	}
	var joining []*Member
	for _, m := range ms.members {
		if m.Status == MemberJoining {
			joining = append(joining, m)
		}
	}
	slices.SortFunc(joining, func(a, b *Member) int { return lowerAddr(*a, *b) })
	for _, m := range joining {
		maxUp++
		m.Status, m.UpNumber = MemberUp, maxUp
		events = append(events, MemberEvent{Member: *m, Kind: eventMemberStatus})
	}
	for _, m := range ms.members {
		switch m.Status {
		case MemberLeaving:
			m.Status = MemberExiting
		case MemberExiting, MemberDown:
			m.Status = MemberRemoved
		default:
			continue
		}
		events = append(events, MemberEvent{Member: *m, Kind: eventMemberStatus})
	}
	ms.touched(now)
	return append(events, ms.reachEvents(old, now)...)
}

// leave marks this member leaving, if it is not already on its way out.
func (ms *membership) leave(now time.Time) {
	if m := ms.members[ms.self]; m.Status <= MemberUp {
		m.Status = MemberLeaving
		ms.touched(now)
	}
}

// down marks members down (the members only they reported unreachable
// are reachable again).
func (ms *membership) down(down []Member, now time.Time) []MemberEvent {
	old := ms.unreachable()
	var events []MemberEvent
	for _, d := range down {
		if m := ms.members[d.UID]; m != nil && live(m) {
			m.Status = MemberDown
			events = append(events, MemberEvent{Member: *m, Kind: eventMemberStatus})
		}
	}
	ms.touched(now)
	if !live(ms.members[ms.self]) {
		// Its own side went down: the others' reports stop counting with
		// it, which reaches nobody across the split.
		return events
	}
	return append(events, ms.reachEvents(old, now)...)
}

// splitView is this member's view of a split, with the observations of
// the members that count.
func (ms *membership) splitView() SplitView {
	unreachable := ms.unreachable()
	var view SplitView
	for uid, m := range ms.members {
		if !live(m) {
			continue
		}
		if unreachable[uid] {
			view.Unreachable = append(view.Unreachable, *m)
		} else {
			view.Reachable = append(view.Reachable, *m)
		}
	}
	off := ms.discounted()
	for obs, r := range ms.reach {
		if m := ms.members[obs]; m == nil || !m.counts() || off[obs] && obs != ms.self {
			continue
		}
		for _, u := range r.unreachable {
			view.Observations = append(view.Observations, observation{Observer: obs, Subject: u})
		}
	}
	return view
}

// ownSide is what this member downs when its side gives up (a lease
// lost in its hold): the members it can reach but the exiting ones, as a
// side that downs itself does (downable), and itself, which its view may
// count among the unreachable (others reported it so, and their reports
// that it is back have not come: they are across a new split).
func (ms *membership) ownSide() []Member {
	side := downable(ms.splitView().Reachable)
	if !slices.ContainsFunc(side, func(m Member) bool { return m.UID == ms.self }) {
		side = append(side, *ms.members[ms.self])
	}
	return side
}

// downingStep is what a member's downing must do at a moment.
type downingStep uint8

const (
	stepWait    downingStep = iota // nothing to decide (yet), or not this member's to decide
	stepStop                       // this member is exiting, down or removed: stop
	stepSelf                       // unstable too long and no side leader speaks for it: down itself
	stepDecide                     // this member leads its side: run the strategy
	stepDownAll                    // this member leads its side, unstable too long: down everyone
	// stepOwnView: the others report this member (one that counts)
	// unreachable and it has found some of them unreachable, its view
	// stable: it is on no side of the merged view, so it runs the
	// strategy on its own view and downs itself if that side loses;
	// if it does not, it waits on, as before, for DownAllWhenUnstable.
	// It is what a member cut off one way needs: it hears that the
	// others lost it, they may never tell it that they downed it (their
	// node layer gives it up first).
	stepOwnView
)

// timing is the downing's clock settings.
type timing struct {
	stableAfter   time.Duration // ClusterConfig.StableAfter
	unstableAfter time.Duration // ClusterConfig.DownAllWhenUnstable
}

// nextDowning says what downing must do now, given whether a strategy is
// configured: decide once the state has been stable for stableAfter, and
// only on the leader of this side (the lowest-addressed counting member
// nobody reports unreachable); when the cluster has stayed unstable for
// stableAfter+unstableAfter, down everyone, or, with no side leader,
// this member (unless a member of its side said it waits for the lease:
// heardLeaseWait). A split is decided once until it heals.
func (ms *membership) nextDowning(now time.Time, strategy bool, t timing) downingStep {
	self := ms.members[ms.self]
	if self.Status >= MemberExiting {
		return stepStop
	}
	if ms.decided && ms.unreachableKey() != ms.decidedOn {
		ms.decided = false // members failed after the decision: a new split
	}
	if !strategy || ms.decided || len(ms.unreachable()) == 0 {
		return stepWait
	}
	view := ms.splitView()
	var sideLeader *Member
	for i := range view.Reachable {
		m := &view.Reachable[i]
		if m.counts() && (sideLeader == nil || lowerAddr(*m, *sideLeader) < 0) {
			sideLeader = m
		}
	}
	leads := sideLeader != nil && sideLeader.UID == ms.self
	tooLong := !ms.unstable.IsZero() && now.Sub(ms.unstable) > t.stableAfter+t.unstableAfter
	stable := now.Sub(ms.changed) >= t.stableAfter
	switch {
	case tooLong && leads:
		return stepDownAll
	case tooLong && now.Before(ms.leaseWait) && ms.leaseWaitOn == ms.unreachableKey():
		return stepWait // a member of this side waits for the lease and decides for it
	case tooLong:
		return stepSelf
	case stable && leads:
		return stepDecide
	case stable && self.counts() && ms.unreachable()[ms.self] && len(ms.reach[ms.self].unreachable) > 0 && ms.ownKept != ms.ownKey():
		return stepOwnView
	}
	return stepWait
}

// ownView is the split as this member sees it itself: the members it
// has found unreachable against itself and the rest. A member that the
// others report unreachable is on no side of the merged view (it leads
// none); this is the view it decides for itself on (see stepOwnView).
func (ms *membership) ownView() SplitView {
	lost := map[NodeUID]bool{}
	for _, u := range ms.reach[ms.self].unreachable {
		lost[u] = true
	}
	var view SplitView
	for uid, m := range ms.members {
		switch {
		case !live(m):
		case lost[uid] && uid != ms.self:
			view.Unreachable = append(view.Unreachable, *m)
			view.Observations = append(view.Observations, observation{Observer: ms.self, Subject: uid})
		default:
			view.Reachable = append(view.Reachable, *m)
		}
	}
	return view
}

// ringPos is a member's place on the monitoring ring: a hash of its uid,
// so that the ring is the same on every member and spreads neighbours
// evenly whatever the addresses.
func ringPos(uid NodeUID) uint64 {
	h := fnv.New64a()
	h.Write(uid[:])
	return h.Sum64()
}

// ring is the live members in ring order. It is kept until the state
// changes (the cache is keyed by the state's digest); callers must not
// change it.
func (ms *membership) ring() []NodeUID {
	if ms.ringCache != nil && ms.ringOf == ms.digested {
		return ms.ringCache
	}
	if len(ms.order.ring) != len(ms.members) { // (members are never dropped: see uidOrder)
		type placed struct {
			pos uint64
			uid NodeUID
		}
		ps := make([]placed, 0, len(ms.members))
		for uid := range ms.members {
			ps = append(ps, placed{ringPos(uid), uid})
		}
		slices.SortFunc(ps, func(a, b placed) int {
			if c := cmp.Compare(a.pos, b.pos); c != 0 {
				return c
			}
			return compareUID(a.uid, b.uid)
		})
		ms.order.ring = ms.order.ring[:0]
		for _, p := range ps {
			ms.order.ring = append(ms.order.ring, p.uid)
		}
	}
	r := make([]NodeUID, 0, len(ms.order.ring))
	for _, uid := range ms.order.ring {
		if live(ms.members[uid]) {
			r = append(r, uid)
		}
	}
	ms.ringCache, ms.ringOf = r, ms.digested
	return r
}

// monitorsOf is whom member uid watches with a failure detector: the
// members after it on ring r until k of them are ones it has not found
// unreachable, and the unreachable ones among them (so that it sees them
// come back). With k or fewer other members, that is all of them.
func (ms *membership) monitorsOf(uid NodeUID, k int, r []NodeUID) []NodeUID {
	i := slices.Index(r, uid)
	if i < 0 {
		return nil
	}
	lost := map[NodeUID]bool{}
	for _, u := range ms.reach[uid].unreachable {
		lost[u] = true
	}
	var out []NodeUID
	for j, reachable := 1, 0; j < len(r) && reachable < k; j++ {
		v := r[(i+j)%len(r)]
		out = append(out, v)
		if !lost[v] {
			reachable++
		}
	}
	return out
}

// watchers is the set of members that watch this member, and so need its
// heartbeats: the members before it on the ring that reach it before they
// have k others they have not found unreachable (see monitorsOf). Only
// the k+L members before it can (L: the most members one observer has
// found unreachable), so it costs that squared, not the cluster's size
// squared: it runs on every turn of every member.
func (ms *membership) watchers(k int) map[NodeUID]bool {
	r := ms.ring()
	out := map[NodeUID]bool{}
	i := slices.Index(r, ms.self)
	if i < 0 {
		return out
	}
	most := 0
	for _, rec := range ms.reach {
		most = max(most, len(rec.unreachable))
	}
	for j := 1; j < len(r) && j <= k+most; j++ {
		u := r[(i-j+len(r))%len(r)]
		lost := ms.reach[u].unreachable
		between := 0 // members between u and this one that u has not lost
		for b := 1; b < j; b++ {
			if !slices.Contains(lost, r[(i-j+b+len(r))%len(r)]) {
				between++
			}
		}
		if between < k {
			out[u] = true
		}
	}
	return out
}

// gossipTargets picks whom to send the state to this round: up to fanout
// members that have not seen it (they need it), chosen with pick. While
// a reachable live member has not seen it, those are the candidates,
// with the exiting members and the downed ones not yet removed; once
// every reachable one has, one unreachable member a turn (a live member
// some cannot reach may still hear) goes first, the exiting and downed
// ones besides.
// Exiting and downed members must hear it but may never say they have:
// a crashed member is dead, and an exiting one's cluster stops (its node
// may go on answering heartbeats). Counted with the reachable ones, they
// kept the state from the members across a cut until they were removed,
// which the cut itself holds up: two members that lost each other never
// heard each other's report through the members that reach both, and
// each could lead its side of its own partial view and down the other.
// When every member has seen it, one member, for a digest only (the
// state costs nothing to confirm). full says which of the two.
func (ms *membership) gossipTargets(fanout int, pick func(n int) int) (to []NodeUID, full bool) {
	unreachable := ms.unreachable()
	// held: of the addresses of members down but not yet removed (few,
	// if any), those a live member listens on.
	var held map[Addr]bool
	for _, m := range ms.members {
		if !live(m) && m.Status != MemberRemoved {
			if held == nil {
				held = map[Addr]bool{}
			}
			held[m.Addr] = false
		}
	}
	if held != nil {
		for _, m := range ms.members {
			if _, ok := held[m.Addr]; ok && live(m) {
				held[m.Addr] = true
			}
		}
	}
	all := make([]NodeUID, 0, len(ms.members))
	var unseen, gone []NodeUID
	// In uid order (pick decides, not map order), those that can be
	// reached first.
	var cut []NodeUID
	uids, entries := ms.memberOrder()
	for i, uid := range uids {
		m := entries[i]
		if uid == ms.self || m.Status == MemberRemoved {
			continue // a member just downed still needs to hear it
		}
		if !live(m) && held[m.Addr] {
			// ... but not one whose address a later incarnation holds:
			// it is gone, and what is sent there reaches that one.
			continue
		}
		all = append(all, uid)
		switch {
		case ms.seen[uid]:
		case m.Status >= MemberExiting:
			gone = append(gone, uid)
		case unreachable[uid]:
			cut = append(cut, uid)
		default:
			unseen = append(unseen, uid)
		}
	}
	if len(unseen) == 0 && len(cut) > 0 {
		to = append(to, cut[pick(len(cut))]) // across a cut: one a turn, most of it is lost
	}
	unseen = append(unseen, gone...)
	if len(unseen) > 0 || len(to) > 0 {
		for len(to) < fanout && len(unseen) > 0 {
			i := pick(len(unseen))
			to = append(to, unseen[i])
			unseen = slices.Delete(unseen, i, i+1)
		}
		return to, true
	}
	if len(all) == 0 {
		return nil, false
	}
	return []NodeUID{all[pick(len(all))]}, false
}

// blockedNote is what a member without a downing strategy says about an
// unreachable member that blocks convergence: once, when it has blocked
// it for StableAfter, in the log, and for as long as it lasts in Stats.
type blockedNote struct {
	key    string    // the blocking members' addresses, "" when not blocked
	since  time.Time // when this set began to block
	text   string    // what Stats shows
	logged bool      // text was logged
}

// blockedBy is the sorted addresses of the live members that are
// unreachable and not exiting: the ones that keep the cluster from
// converging.
func (ms *membership) blockedBy() []string {
	var addrs []string
	for uid := range ms.unreachable() {
		if m := ms.members[uid]; m.Status < MemberExiting {
			addrs = append(addrs, m.Addr.String())
		}
	}
	slices.Sort(addrs)
	return addrs
}

// boundedAppVersion is a gossiped app version, or "" past maxAppVersion.
func boundedAppVersion(v string) string {
	if len(v) > maxAppVersion {
		return ""
	}
	return v
}

// liveOthers returns the address of every other member that is not down
// or removed.
func (ms *membership) liveOthers() map[NodeUID]Addr {
	out := make(map[NodeUID]Addr, len(ms.members))
	for uid, m := range ms.members {
		if uid != ms.self && live(m) {
			out[uid] = m.Addr
		}
	}
	return out
}

// listable returns the address of every other live member whose entries
// a listing holds: those this member reaches, as far as it knows. A
// member it watches with a failure detector is judged by its own
// detector alone (a partition between two others hides neither from
// it); one it does not watch (a cluster larger than MonitoredMembers+1)
// by what its watchers report.
func (ms *membership) listable() map[NodeUID]Addr {
	mine := ms.reach[ms.self].unreachable
	watched := ms.monitorsOf(ms.self, ms.watchedBy, ms.ring())
	gone := ms.unreachable()
	out := make(map[NodeUID]Addr, len(ms.members))
	for uid, m := range ms.members {
		switch {
		case uid == ms.self || !live(m), slices.Contains(mine, uid):
		case gone[uid] && !slices.Contains(watched, uid):
		default:
			out[uid] = m.Addr
		}
	}
	return out
}
