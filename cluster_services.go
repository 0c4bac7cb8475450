package troupe

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"
)

// The cluster as the registry of service keys and topics, for a node
// that uses no other (no registrar, no etcd): each member keeps its own
// entries and a copy of every other member's. A member pushes each
// change of its own to every member, numbered; a member that finds a
// number missing (a session lost on the way) asks the owner for its
// whole set, and a digest of the numbers each member holds, sent to a few
// members every gossip interval, finds what a lost push left behind. A
// listing holds this member's own entries and those of the live members
// it reaches.

// receptionistPath is where a member's receptionist actor lives.
const receptionistPath = "/system/receptionist"

// recepPiece is how many entries one message carries.
const recepPiece = 256

// recepDigestFanout is how many members get this member's digest every
// gossip interval.
const recepDigestFanout = 2

// recepMsg is the receptionist actor's protocol.
type recepMsg interface{ isRecepMsg() }

// recepEntry is one entry of a member's own, on the wire: the member is
// the sender, its address the one membership knows.
type recepEntry struct {
	Name string
	UUID UUID
	Path string // empty in a removal
}

// recepDelta is a change of the sender's own entries, from version Base
// to Version.
type recepDelta struct {
	Base, Version  uint64
	Added, Removed []recepEntry
	sentBy         // the sender, stamped by the association
}

// recepFull is piece Part (from 0) of Parts of the sender's whole set at
// Version.
type recepFull struct {
	Version     uint64
	Part, Parts uint32
	Entries     []recepEntry
	sentBy      // the sender, stamped by the association
}

// recepDigest lists the versions of the members' sets the sender holds,
// its own included.
type recepDigest struct {
	Versions []recepVersion
	sentBy   // the sender, stamped by the association
}

// recepVersion is the version of one member's set.
type recepVersion struct {
	Node    NodeUID
	Version uint64
}

// recepPull asks a member for its whole set; Have is the version the
// sender holds.
type recepPull struct {
	Have   uint64
	sentBy // the sender, stamped by the association
}

// recepFlush asks the actor to push this member's changes (local only:
// it is not registered, so no peer can send it).
type recepFlush struct{}

// recepGreet asks the actor to send the whole set to a member that has
// not had it (local only).
type recepGreet struct {
	uid  NodeUID
	addr Addr
}

func (recepDelta) isRecepMsg()  {}
func (recepFull) isRecepMsg()   {}
func (recepDigest) isRecepMsg() {}
func (recepPull) isRecepMsg()   {}
func (recepFlush) isRecepMsg()  {}
func (recepGreet) isRecepMsg()  {}

// A member takes entries only from their owner: the association stamps
// who sent each message (sender.go).
func (m recepDelta) stamped(s sentBy) any  { m.sentBy = s; return m }
func (m recepFull) stamped(s sentBy) any   { m.sentBy = s; return m }
func (m recepDigest) stamped(s sentBy) any { m.sentBy = s; return m }
func (m recepPull) stamped(s sentBy) any   { m.sentBy = s; return m }

func init() {
	SetWireKey[recepDelta]("troupe.receptionist.delta")
	SetWireKey[recepFull]("troupe.receptionist.full")
	SetWireKey[recepDigest]("troupe.receptionist.digest")
	SetWireKey[recepPull]("troupe.receptionist.pull")

}

// recepKey is an entry of one member: a name and an actor.
type recepKey struct {
	name string
	uuid UUID
}

// receptionist is a member's side of the cluster's registry.
type receptionist struct {
	c   *Cluster
	n   *Node
	ref Ref[recepMsg]

	// sendMu orders what this member sends of its own set: a whole set,
	// then the changes after it, to each member.
	sendMu mutex[lkRecepSend]

	mu       mutex[lkRecep] // guards the state below
	own      map[recepKey]Registration
	version  uint64 // of own, as last pushed
	pending  map[recepKey]struct{}
	flushing bool // a recepFlush is on its way to the actor
	copies   map[NodeUID]*recepCopy
	greeted  map[NodeUID]bool      // members sent the whole set
	served   map[NodeUID]time.Time // when a member's pull was last answered
	changed  chan struct{}         // closed (and made anew) when a listing may differ
	stopped  bool
}

// startReceptionist makes c's receptionist, holding what the node has
// listed so far (its topic relays).
func startReceptionist(c *Cluster) (*receptionist, error) {
	rc := &receptionist{
		c: c, n: c.n, own: map[recepKey]Registration{}, pending: map[recepKey]struct{}{},
		copies: map[NodeUID]*recepCopy{}, greeted: map[NodeUID]bool{}, served: map[NodeUID]time.Time{}, changed: make(chan struct{}),
	}
	ref, err := Spawn(systemParent{c.n}, "receptionist", Behavior[recepMsg]{
		Receive: func(_ *Context[recepMsg], m recepMsg) { rc.receive(m) },
	})
	if err != nil {
		return nil, err
	}
	rc.ref = ref
	return rc, nil
}

// adopt takes the node's entries made before the cluster started. An
// entry taken out between the snapshot and its add (its actor stopped,
// its topic's last subscriber left) found nothing to remove: a second
// snapshot finds it gone.
func (rc *receptionist) adopt() {
	snapshot := func() []Registration {
		return append(rc.n.services.serviceRegistrations(), rc.n.topics.topicRegistrations()...)
	}
	adopted := snapshot()
	for _, r := range adopted {
		rc.add(r)
	}
	now := map[recepKey]bool{}
	for _, r := range snapshot() {
		now[recepKey{r.Name, r.UUID}] = true
	}
	for _, r := range adopted {
		if !now[recepKey{r.Name, r.UUID}] {
			rc.remove(r.Name, r.UUID)
		}
	}
}

// stop ends the receptionist: this member's entries are taken out of
// the others' listings (at once, rather than when membership removes
// it), and its own listings end with ErrClusterStopped.
func (rc *receptionist) stop() {
	rc.mu.Lock()
	if rc.stopped {
		rc.mu.Unlock()
		return
	}
	rc.stopped = true // (no add after this: it would be pushed after the removals)
	close(rc.changed)
	for k := range rc.own {
		rc.pending[k] = struct{}{}
	}
	clear(rc.own)
	rc.mu.Unlock()
	rc.flush()
	stopAndWait(rc.n, rc.ref) // a cluster started next on this node takes its path
}

// bump says that listings may differ (rc.mu held).
func (rc *receptionist) bump() {
	if !rc.stopped {
		close(rc.changed)
		rc.changed = make(chan struct{})
	}
}

// add lists r, an entry of this node, and has the change pushed.
func (rc *receptionist) add(r Registration) error {
	k := recepKey{r.Name, r.UUID}
	rc.mu.Lock()
	if rc.stopped {
		rc.mu.Unlock()
		return ErrClusterStopped
	}
	if _, ok := rc.own[k]; !ok && len(rc.own) >= maxRegistrationsPerPeer {
		rc.mu.Unlock()
		return fmt.Errorf("%w: this member lists %d entries, as many as a member takes of another", ErrRegistrationRefused, maxRegistrationsPerPeer)
	}
	rc.own[k] = r
	rc.changedOwn(k)
	return nil
}

// remove takes the entry name of the actor uuid out of this node's.
func (rc *receptionist) remove(name string, uuid UUID) {
	k := recepKey{name, uuid}
	rc.mu.Lock()
	if _, ok := rc.own[k]; !ok || rc.stopped {
		rc.mu.Unlock()
		return
	}
	delete(rc.own, k)
	rc.changedOwn(k)
}

// changedOwn records that k changed and asks the actor to push it; it
// unlocks rc.mu.
func (rc *receptionist) changedOwn(k recepKey) {
	rc.pending[k] = struct{}{}
	rc.bump()
	flush := !rc.flushing
	rc.flushing = true
	rc.mu.Unlock()
	if flush {
		rc.ref.Tell(recepFlush{})
	}
}

// receive handles one message, on the actor's goroutine.
func (rc *receptionist) receive(m recepMsg) {
	switch m := m.(type) {
	case recepFlush:
		rc.flush()
	case recepDelta:
		rc.onCopy(m.from, func(cp *recepCopy) (bool, bool) { return cp.delta(m) })
	case recepFull:
		rc.onCopy(m.from, func(cp *recepCopy) (bool, bool) { return cp.full(m), false })
	case recepDigest:
		rc.onDigest(m)
	case recepPull:
		rc.onPull(m)
	case recepGreet:
		if rc.sendFull(m.addr) {
			rc.mu.Lock()
			rc.greeted[m.uid] = true
			rc.mu.Unlock()
		}
	}
}

// onPull sends the whole set to a member that asks for it, at most once
// per two gossip intervals to each, and not when it holds this version.
func (rc *receptionist) onPull(m recepPull) {
	addr, ok := rc.c.liveOthers()[m.from]
	if !ok {
		return
	}
	now := time.Now()
	rc.mu.Lock()
	due := m.Have != rc.version || len(rc.pending) > 0
	if last := rc.served[m.from]; due && !last.IsZero() && now.Sub(last) < 2*rc.c.cfg.GossipInterval {
		due = false
	}
	if due {
		rc.served[m.from] = now
	}
	rc.mu.Unlock()
	if due {
		rc.sendFull(addr)
	}
}

// flush pushes the changes of this member's own entries to every other
// live member, in pieces.
func (rc *receptionist) flush() {
	rc.sendMu.Lock()
	defer rc.sendMu.Unlock()
	to := rc.c.liveOthers()
	rc.mu.Lock()
	rc.flushing = false
	var added, removed []recepEntry
	for k := range rc.pending {
		if r, ok := rc.own[k]; ok {
			added = append(added, recepEntry{Name: k.name, UUID: k.uuid, Path: r.Path})
		} else {
			removed = append(removed, recepEntry{Name: k.name, UUID: k.uuid})
		}
	}
	clear(rc.pending)
	var deltas []recepDelta
	// Removals first: a copy at its bound takes an addition only after
	// them.
	for piece := range slices.Chunk(removed, recepPiece) {
		deltas = append(deltas, recepDelta{Base: rc.version, Version: rc.version + 1, Removed: piece})
		rc.version++
	}
	for piece := range slices.Chunk(added, recepPiece) {
		deltas = append(deltas, recepDelta{Base: rc.version, Version: rc.version + 1, Added: piece})
		rc.version++
	}
	rc.mu.Unlock()
	for _, addr := range to {
		for _, d := range deltas {
			tellMember[recepMsg](rc.n, addr, receptionistPath, d)
		}
	}
}

// sendFull sends this member's whole set to the member at addr; it
// reports whether the association could take it (false: not up yet).
func (rc *receptionist) sendFull(addr Addr) bool {
	rc.sendMu.Lock()
	defer rc.sendMu.Unlock()
	rc.mu.Lock()
	v := rc.version
	entries := make([]recepEntry, 0, len(rc.own))
	for k, r := range rc.own {
		entries = append(entries, recepEntry{Name: k.name, UUID: k.uuid, Path: r.Path})
	}
	rc.mu.Unlock()
	if v == 0 && len(entries) == 0 {
		return true // nothing to say
	}
	parts := uint32(max(1, (len(entries)+recepPiece-1)/recepPiece))
	for i := range parts {
		piece := entries[int(i)*recepPiece : min(len(entries), int(i+1)*recepPiece)]
		if !tellMember[recepMsg](rc.n, addr, receptionistPath, recepFull{Version: v, Part: i, Parts: parts, Entries: piece}) {
			return false
		}
	}
	return true
}

// onCopy applies a message of the member from to its copy, if from is a
// live member; step reports whether the copy changed and whether it is
// to be pulled whole.
func (rc *receptionist) onCopy(from NodeUID, step func(*recepCopy) (changed, pull bool)) {
	addr, ok := rc.c.liveOthers()[from]
	if !ok {
		return // not a member (or no longer): nothing of it is kept
	}
	rc.mu.Lock()
	cp := rc.copyOf(from)
	changed, pull := step(cp)
	if changed {
		rc.bump()
	}
	pull = pull && rc.pullDue(cp)
	have := cp.version
	rc.mu.Unlock()
	if pull {
		tellMember[recepMsg](rc.n, addr, receptionistPath, recepPull{Have: have})
	}
}

// copyOf returns the copy of uid's set, made empty if there is none
// (rc.mu held).
func (rc *receptionist) copyOf(uid NodeUID) *recepCopy {
	cp := rc.copies[uid]
	if cp == nil {
		cp = &recepCopy{entries: map[recepKey]string{}}
		rc.copies[uid] = cp
	}
	return cp
}

// pullDue reports whether cp may be asked for again now, and records it
// (rc.mu held): once per two gossip intervals.
func (rc *receptionist) pullDue(cp *recepCopy) bool {
	now := time.Now()
	if !cp.pulled.IsZero() && now.Sub(cp.pulled) < 2*rc.c.cfg.GossipInterval {
		return false
	}
	cp.pulled = now
	return true
}

// onDigest asks the owner of every set the sender holds newer than this
// member does for it whole.
func (rc *receptionist) onDigest(g recepDigest) {
	live := rc.c.liveOthers()
	if _, ok := live[g.from]; !ok {
		return
	}
	type pull struct {
		addr Addr
		have uint64
	}
	var pulls []pull
	rc.mu.Lock()
	for _, v := range g.Versions {
		addr, ok := live[v.Node]
		if !ok {
			continue // this member itself, or not a member it knows
		}
		cp := rc.copyOf(v.Node)
		if cp.version < v.Version && rc.pullDue(cp) {
			pulls = append(pulls, pull{addr, cp.version})
		}
	}
	rc.mu.Unlock()
	for _, p := range pulls {
		tellMember[recepMsg](rc.n, p.addr, receptionistPath, recepPull{Have: p.have})
	}
}

// tick runs every gossip interval on the cluster's loop: it forgets the
// sets of members that are gone, sends the whole set to members that
// have not had it, and the digest to a few.
func (rc *receptionist) tick() {
	live := rc.c.liveOthers()
	rc.mu.Lock()
	if rc.stopped {
		rc.mu.Unlock()
		return
	}
	rc.forget(live)
	var greet []NodeUID
	nothing := rc.version == 0 && len(rc.own) == 0
	for uid := range live {
		switch {
		case rc.greeted[uid]:
		case nothing:
			// Nothing to say (the first change reaches it as a push):
			// no association is dialed for it.
			rc.greeted[uid] = true
		default:
			greet = append(greet, uid)
		}
	}
	d := recepDigest{Versions: []recepVersion{{rc.n.uid, rc.version}}}
	quiet := rc.version == 0
	for uid, cp := range rc.copies {
		d.Versions = append(d.Versions, recepVersion{uid, cp.version})
		quiet = quiet && cp.version == 0
	}
	rc.mu.Unlock()
	for _, uid := range greet {
		if _, up := memberRef[recepMsg](rc.n, live[uid], receptionistPath); up {
			// On the actor's goroutine, not the cluster's: a whole set
			// costs in proportion to it.
			rc.ref.Tell(recepGreet{uid, live[uid]})
		}
	}
	if quiet {
		return // nothing registered anywhere: nothing to compare
	}
	others := make([]Addr, 0, len(live))
	for _, a := range live {
		others = append(others, a)
	}
	for range min(recepDigestFanout, len(others)) {
		i := rand.IntN(len(others))
		tellMember[recepMsg](rc.n, others[i], receptionistPath, d)
		others = slices.Delete(others, i, i+1)
	}
}

// forget drops the sets of members not in live (rc.mu held).
func (rc *receptionist) forget(live map[NodeUID]Addr) {
	for uid, cp := range rc.copies {
		if _, ok := live[uid]; !ok {
			delete(rc.copies, uid)
			if len(cp.entries) > 0 {
				rc.bump()
			}
		}
	}
	for uid := range rc.greeted {
		if _, ok := live[uid]; !ok {
			delete(rc.greeted, uid)
		}
	}
	for uid := range rc.served {
		if _, ok := live[uid]; !ok {
			delete(rc.served, uid)
		}
	}
}

// membersChanged hears every member event: a listing follows
// membership and reachability.
func (rc *receptionist) membersChanged() {
	live := rc.c.liveOthers()
	rc.mu.Lock()
	rc.forget(live)
	rc.bump()
	rc.mu.Unlock()
}

// listing returns the entries sel picks that a listing may hold now, and
// a channel closed when that may change. It returns ErrClusterStopped
// once the cluster has stopped.
func (rc *receptionist) listing(sel regSelector) ([]Registration, <-chan struct{}, error) {
	rc.mu.Lock()
	ch, stopped := rc.changed, rc.stopped
	rc.mu.Unlock()
	if stopped {
		return nil, nil, ErrClusterStopped
	}
	// Membership after the channel: a change that comes between closes
	// it.
	ok := rc.c.listable()
	var out []Registration
	rc.mu.Lock()
	defer rc.mu.Unlock()
	for _, r := range rc.own {
		if sel.match(r.Name) {
			out = append(out, r)
		}
	}
	for uid, cp := range rc.copies {
		addr, listed := ok[uid]
		if !listed {
			continue
		}
		for k, path := range cp.entries {
			if sel.match(k.name) {
				out = append(out, Registration{Name: k.name, UUID: k.uuid, Path: path, Node: uid, Addrs: []Addr{addr}})
			}
		}
	}
	return out, ch, nil
}

// clusterSource is the cluster's registry as lookups and watches of
// service keys and topics ask it (see registries.go): it answers lookups
// of a name and follows, nothing else.
type clusterSource struct {
	n  *Node
	rc *receptionist
}

func (s clusterSource) String() string                           { return "the cluster's members" }
func (s clusterSource) register(_ *handle, r Registration) error { return s.rc.add(r) }
func (s clusterSource) unregister(name string, uuid UUID)        { s.rc.remove(name, uuid) }
func (s clusterSource) addr() Addr                               { return Addr{} }
func (s clusterSource) isLocal() bool                            { return false }

func (s clusterSource) ask(_ context.Context, req regRequest) ([]Registration, error) {
	if req.Op != regOpFind {
		return nil, errNoClusterRegistry
	}
	regs, _, err := s.rc.listing(regSelector{name: req.Name})
	return regs, err
}

func (s clusterSource) deleteAddr(context.Context, NodeUID, Addr) {}

func (s clusterSource) park(context.Context, context.Context, *regWaiter) ([]Registration, error) {
	return nil, errNoClusterRegistry
}

func (s clusterSource) repark(context.Context, *regWaiter)         {}
func (s clusterSource) unpark(*regWaiter)                          {}
func (s clusterSource) answer(*regWaiter, regReply) []Registration { return nil }

func (s clusterSource) watch(context.Context, func(RegistryChange)) error {
	return errNoClusterRegistry
}

// follow follows the entries sel picks in the cluster's registry: set
// gets them at once and after each change among them, until ctx ends,
// the node closes or the cluster stops.
func (s clusterSource) follow(ctx context.Context, sel regSelector, set func([]Registration), _ func()) error {
	var last []regKey
	first := true
	for {
		regs, changed, err := s.rc.listing(sel)
		if err != nil {
			return err
		}
		keys := make([]regKey, len(regs))
		for i := range regs {
			keys[i] = keyOf(&regs[i])
		}
		slices.SortFunc(keys, compareRegKey)
		if first || !slices.Equal(keys, last) {
			first, last = false, keys
			set(regs)
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		case <-s.n.lc.workDone():
			return ErrNodeClosed
		}
	}
}

func compareRegKey(a, b regKey) int {
	return cmp.Or(cmp.Compare(a.name, b.name), cmp.Compare(string(a.uuid[:]), string(b.uuid[:])), compareUID(a.node, b.node))
}

// errNoClusterRegistry is why the cluster cannot serve a request other
// than a lookup of a name.
var errNoClusterRegistry = errors.New("troupe: the cluster's registry answers lookups of service keys and topics only")
