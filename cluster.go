package troupe

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"sync"
	"time"
)

// ClusterPath is where a node's cluster actor lives.
const ClusterPath = "/system/cluster"

// ErrClusterStopped is returned by Cluster methods after the cluster has
// stopped (closed, or this member was downed).
var ErrClusterStopped = errors.New("troupe: cluster stopped")

// ClusterConfig configures a [Cluster]. The zero value of each field means
// its documented default.
type ClusterConfig struct {
	// Seeds are addresses of members to join through, in any form
	// [ParseAddr] accepts. A node whose seeds are empty, or only itself,
	// starts a new cluster.
	Seeds []string

	// SeedsFromRegistry finds the seeds through the node's registrar
	// instead (the node must have discovery on): the member registers under
	// "troupe.cluster."+Name, and the member that registered first starts
	// the cluster while every later one joins the earlier ones. The
	// registrar's order makes concurrent starts agree.
	SeedsFromRegistry bool

	// Name names the cluster for SeedsFromRegistry. Default: "default".
	Name string

	// Downing decides who is downed when members stay unreachable. nil
	// means no downing: an unreachable member blocks the cluster — no
	// joining member becomes up and no leaving member is removed — until
	// it is reachable again or someone downs it. That is the safe default.
	Downing DowningStrategy

	// Lease is the lease a LeaseMajority strategy competes for.
	Lease Lease

	// StableAfter is how long the membership and reachability must stay
	// unchanged before the downing strategy decides. Default: 20 s.
	StableAfter time.Duration

	// DownAllWhenUnstable: if the situation is still unstable this long
	// after members first became unreachable (beyond StableAfter), every
	// member is downed. Default: 3/4 of StableAfter, at least 4 s.
	DownAllWhenUnstable time.Duration

	// LeaseMinorityDelay is how long the minority side waits before trying
	// to acquire the lease, so that the majority wins a fair race. Default:
	// 2 s.
	LeaseMinorityDelay time.Duration

	// LeaseReleaseAfter is how long a member that took the lease and
	// downed nobody keeps it; one that downed members releases it as soon
	// as they are removed. Default: 40 s.
	LeaseReleaseAfter time.Duration

	// GossipInterval is how often a member sends its view to the others.
	// Default: the node's HeartbeatInterval.
	GossipInterval time.Duration

	// Detector makes the failure detector for each member. Default: a
	// phi-accrual detector scaled to the node's heartbeat interval
	// (first estimate one interval, acceptable pause three).
	Detector func() FailureDetector

	// CloseNodeOnDown closes the node when this member is downed. Without
	// it, watch [Cluster.Done] and decide yourself.
	CloseNodeOnDown bool
}

// MemberEvent is published on the node's event stream for every change of
// a member's status, and every change of its reachability as this member
// sees it.
type MemberEvent struct {
	Member    Member
	Reachable bool // as seen from this member (reachability changes)
	Kind      string
}

// Member event kinds.
const (
	EventMemberStatus      = "status"
	EventMemberUnreachable = "unreachable"
	EventMemberReachable   = "reachable"
)

// Cluster is this node's membership in a cluster: gossiped state, a
// failure detector per member, a deterministic leader that moves members
// through their statuses once everyone has seen the same state, and an
// optional downing strategy that resolves splits.
//
// Cluster members are exempt from the plain association's quarantine: they
// keep knocking on each other, and reachability is a reversible flag until
// a member is downed. A downed member can never come back with the same
// uid; its node must restart.
type Cluster struct {
	n   *Node
	cfg ClusterConfig

	// mu guards the state below.
	mu        sync.Mutex
	self      NodeUID
	members   map[NodeUID]*Member
	reach     map[NodeUID]reachRecord // per observer: whom it cannot reach
	seen      map[NodeUID]uint64      // digest of the last state received from each member
	changed   time.Time               // when the state last changed
	unstable  time.Time               // when members first became unreachable (zero if none)
	decided   bool                    // the downing strategy already acted for this split
	detectors map[NodeUID]FailureDetector
	lastHeard map[NodeUID]int64
	stopped   bool

	leaseHeld   bool      // this member took the lease for a decision
	leaseAt     time.Time // when
	leaseDowned []Member  // whom it downed under the lease

	ref   Ref[clusterMsg] // this member's cluster actor
	seeds []Addr          // where to knock until some member answers
	stop  chan struct{}
	done  chan struct{} // closed when the cluster has stopped
	once  sync.Once
}

// reachRecord is one observer's view: whom it cannot reach, versioned so
// that the newest view of each observer wins a merge.
type reachRecord struct {
	version     uint64
	unreachable []NodeUID
}

// gossipMsg is the whole state, sent between members.
type gossipMsg struct {
	From    NodeUID
	Members []gossipMember
	Reach   []gossipReach
}

type gossipMember struct {
	Addr     string
	UID      NodeUID
	Status   uint8
	UpNumber int
}

type gossipReach struct {
	Observer    NodeUID
	Version     uint64
	Unreachable []NodeUID
}

// clusterMsg is the cluster actor's protocol: gossip between members, and
// requests from outside.
type clusterMsg interface{ isClusterMsg() }

func (gossipMsg) isClusterMsg() {}

// downRequest asks a member to down the member at Addr (DownMember).
type downRequest struct {
	Addr    string
	ReplyTo Ref[downReply]
}

func (downRequest) isClusterMsg() {}

// downReply answers a downRequest; Err is empty on success.
type downReply struct{ Err string }

func init() {
	RegisterMessage[gossipMsg]("troupe.cluster.gossip")
	RegisterMessage[downRequest]("troupe.cluster.down")
	RegisterMessage[downReply]("troupe.cluster.down-reply")
}

// DownMember asks the cluster member listening at node to down the member
// at member (both in any form [ParseAddr] accepts) and waits for its
// answer: manual downing from outside the cluster, as troupe down does.
// n is any node that can reach node; the member checks n's credentials
// (Config.Secret, TLS, peer credentials) like any peer's, and any peer it
// admits may down members. Errors: the member's answer (such as
// [ErrNotMember]'s text), or why it could not be asked.
func DownMember(ctx context.Context, n *Node, node, member string) error {
	addr, err := ParseAddr(node)
	if err != nil {
		return err
	}
	if _, err := ParseAddr(member); err != nil {
		return err
	}
	ref, err := Resolve[clusterMsg](ctx, n, FormatRef(addr, ClusterPath))
	if err != nil {
		return fmt.Errorf("no cluster member at %s: %w", addr, err)
	}
	reply, err := Ask(ctx, ref, func(r Ref[downReply]) clusterMsg { return downRequest{Addr: member, ReplyTo: r} })
	if err != nil {
		return err
	}
	if reply.Err != "" {
		return &RemoteError{Text: reply.Err}
	}
	return nil
}

func (c ClusterConfig) withDefaults(n *Node) ClusterConfig {
	if c.StableAfter == 0 {
		c.StableAfter = 20 * time.Second
	}
	if c.DownAllWhenUnstable == 0 {
		c.DownAllWhenUnstable = max(4*time.Second, c.StableAfter*3/4)
	}
	if c.LeaseMinorityDelay == 0 {
		c.LeaseMinorityDelay = 2 * time.Second
	}
	if c.LeaseReleaseAfter == 0 {
		c.LeaseReleaseAfter = 40 * time.Second
	}
	if c.GossipInterval == 0 {
		c.GossipInterval = n.cfg.HeartbeatInterval
	}
	if c.Detector == nil {
		hb := n.cfg.HeartbeatInterval
		c.Detector = func() FailureDetector {
			d := NewPhiAccrual()
			d.FirstHeartbeatEstimate = hb
			d.AcceptableHeartbeatPause = 3 * hb
			d.MinStdDeviation = max(hb/10, time.Millisecond)
			return d
		}
	}
	return c
}

// StartCluster makes n a member of a cluster: it joins through the seeds
// (or starts a new cluster) and runs until [Cluster.Close], the node's
// Close, or this member being downed. n must listen on at least one
// address.
func StartCluster(ctx context.Context, n *Node, cfg ClusterConfig) (*Cluster, error) {
	if len(n.addrList()) == 0 {
		return nil, fmt.Errorf("%w: a cluster member must listen on an address", ErrBadConfig)
	}
	if _, ok := cfg.Downing.(LeaseMajority); ok && cfg.Lease == nil {
		return nil, fmt.Errorf("%w: LeaseMajority needs ClusterConfig.Lease", ErrBadConfig)
	}
	var seeds []Addr
	for i, s := range cfg.Seeds {
		a, err := ParseAddr(s)
		if err != nil {
			return nil, fmt.Errorf("ClusterConfig.Seeds[%d]: %w", i, err)
		}
		seeds = append(seeds, a)
	}
	if cfg.SeedsFromRegistry {
		var err error
		if seeds, err = n.clusterSeeds(ctx, cfg.Name); err != nil {
			return nil, err
		}
	}
	c := &Cluster{
		n: n, cfg: cfg.withDefaults(n), self: n.uid,
		members: map[NodeUID]*Member{}, reach: map[NodeUID]reachRecord{}, seen: map[NodeUID]uint64{},
		detectors: map[NodeUID]FailureDetector{}, lastHeard: map[NodeUID]int64{},
		changed: time.Now(), stop: make(chan struct{}), done: make(chan struct{}),
	}
	first := len(seeds) == 0 || len(seeds) == 1 && n.isOwnAddr(seeds[0])
	status := MemberJoining
	upNumber := 0
	if first {
		status, upNumber = MemberUp, 1
	}
	c.members[n.uid] = &Member{Addr: n.addrList()[0], UID: n.uid, Status: status, UpNumber: upNumber}
	n.members.Store(n.uid, struct{}{})
	ref, err := Spawn(systemParent{n}, "cluster", Behavior[clusterMsg]{
		Receive: func(_ *Context[clusterMsg], m clusterMsg) {
			switch m := m.(type) {
			case gossipMsg:
				c.receive(m)
			case downRequest:
				var reply downReply
				if err := c.Down(m.Addr); err != nil {
					reply.Err = err.Error()
				}
				m.ReplyTo.Tell(reply)
			}
		},
	})
	if err != nil {
		return nil, err
	}
	c.ref = ref
	onQuarantine := c.quarantinedBy
	n.quarantinedBy.Store(&onQuarantine)
	for _, s := range seeds {
		if !n.isOwnAddr(s) {
			c.seeds = append(c.seeds, s)
		}
	}
	n.wg.Go(c.run)
	return c, nil
}

// clusterSeeds registers this node as a member of the named cluster with
// its first registrar and returns the addresses of the members registered
// before it (none: this node starts the cluster).
func (n *Node) clusterSeeds(ctx context.Context, name string) ([]Addr, error) {
	if name == "" {
		name = "default"
	}
	srcs, _, err := n.lookupSources(nil)
	if err != nil {
		return nil, fmt.Errorf("cluster seeds from the registry: %w", err)
	}
	src := srcs[0]
	me := Registration{Name: "troupe.cluster." + name, UUID: UUID(n.uid), Path: ClusterPath, Node: n.uid, NodeName: n.name, Addrs: n.Addrs()}
	if src.local {
		n.registryRegister(me)
	} else if _, err := n.askRegistrar(ctx, src, regRequest{Op: regOpRegister, Regs: toWire([]Registration{me})}); err != nil {
		return nil, err
	}
	regs, err := n.askRegistrar(ctx, src, regRequest{Op: regOpFind, Name: me.Name})
	if err != nil {
		return nil, err
	}
	var mine uint64
	for _, r := range regs {
		if r.Node == n.uid {
			mine = r.Seq
		}
	}
	var seeds []Addr
	for _, r := range regs {
		if r.Node != n.uid && r.Seq < mine && len(r.Addrs) > 0 {
			seeds = append(seeds, r.Addrs[0])
		}
	}
	return seeds, nil
}

// Done returns a channel closed when this member has stopped: closed, or
// downed.
func (c *Cluster) Done() <-chan struct{} { return c.done }

// Close stops this member's participation without leaving (the others
// will see it unreachable); use Leave to leave gracefully.
func (c *Cluster) Close() error {
	c.once.Do(func() { close(c.stop) })
	<-c.done
	return nil
}

// Leave asks the cluster to remove this member gracefully and waits until
// it has been removed (or ctx ends).
func (c *Cluster) Leave(ctx context.Context) error {
	c.mu.Lock()
	if m := c.members[c.self]; m != nil && m.Status <= MemberUp {
		m.Status = MemberLeaving
		c.changed = time.Now()
	}
	c.mu.Unlock()
	c.gossip()
	select {
	case <-c.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Members returns the current membership as this member sees it, ordered
// by address.
func (c *Cluster) Members() []Member {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]Member, 0, len(c.members))
	for _, m := range c.members {
		out = append(out, *m)
	}
	slices.SortFunc(out, lowerAddr)
	return out
}

// Self returns this member.
func (c *Cluster) Self() Member {
	c.mu.Lock()
	defer c.mu.Unlock()
	return *c.members[c.self]
}

// Unreachable returns the members some member cannot reach, as far as this
// member knows.
func (c *Cluster) Unreachable() []Member {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []Member
	for uid := range c.unreachableLocked() {
		if m := c.members[uid]; m != nil {
			out = append(out, *m)
		}
	}
	slices.SortFunc(out, lowerAddr)
	return out
}

// Leader returns the member that currently performs status transitions, as
// this member sees it.
func (c *Cluster) Leader() (Member, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	l := c.leaderLocked()
	if l == nil {
		return Member{}, false
	}
	return *l, true
}

// run is the member's one goroutine: it gossips, feeds the failure
// detectors, moves members through their statuses when leader, and applies
// the downing strategy.
func (c *Cluster) run() {
	defer close(c.done)
	defer c.cleanup()
	t := time.NewTicker(c.cfg.GossipInterval)
	defer t.Stop()
	for {
		select {
		case <-c.stop:
			return
		case <-c.n.done:
			return
		case now := <-t.C:
			c.detect(now)
			c.lead()
			if c.downing(now) {
				return
			}
			c.gossip()
			c.knock()
		}
	}
}

func (c *Cluster) cleanup() {
	c.n.quarantinedBy.Store(nil)
	c.mu.Lock()
	c.stopped = true
	uids := make([]NodeUID, 0, len(c.members))
	for uid := range c.members {
		uids = append(uids, uid)
	}
	c.mu.Unlock()
	for _, uid := range uids {
		c.n.members.Delete(uid)
	}
	c.n.Stop(c.ref)
	if c.cfg.SeedsFromRegistry {
		name := "troupe.cluster." + cmp.Or(c.cfg.Name, "default")
		if c.n.reg() != nil {
			c.n.reg().unregister(name, UUID(c.n.uid))
		}
		for _, a := range c.n.remoteRegistrars() {
			c.n.tellRegistrar(a, regRequest{Op: regOpUnregister, Regs: []regWire{{Name: name, UUID: UUID(c.n.uid)}}})
		}
	}
}

// live reports whether a member is still part of the membership.
func live(m *Member) bool { return m.Status < MemberDown }

// unreachableLocked is the set of live members some up or leaving member
// cannot reach. A joining member's observations do not count: it is not
// yet part of the cluster, and one that reaches only its seed must not
// make the whole cluster look unreachable.
func (c *Cluster) unreachableLocked() map[NodeUID]bool {
	out := map[NodeUID]bool{}
	for obs, r := range c.reach {
		if m := c.members[obs]; m == nil || !m.counts() {
			continue
		}
		for _, u := range r.unreachable {
			if m := c.members[u]; m != nil && live(m) {
				out[u] = true
			}
		}
	}
	return out
}

// digestLocked summarizes the state, so members can tell they have seen
// the same one.
func (c *Cluster) digestLocked() uint64 {
	h := fnv.New64a()
	uids := make([]NodeUID, 0, len(c.members))
	for uid := range c.members {
		uids = append(uids, uid)
	}
	slices.SortFunc(uids, func(a, b NodeUID) int { return cmp.Compare(string(a[:]), string(b[:])) })
	for _, uid := range uids {
		m := c.members[uid]
		fmt.Fprintf(h, "%x:%d:%d;", uid, m.Status, m.UpNumber)
	}
	obs := make([]NodeUID, 0, len(c.reach))
	for o := range c.reach {
		obs = append(obs, o)
	}
	slices.SortFunc(obs, func(a, b NodeUID) int { return cmp.Compare(string(a[:]), string(b[:])) })
	for _, o := range obs {
		fmt.Fprintf(h, "%x:%d;", o, c.reach[o].version)
	}
	return h.Sum64()
}

// convergedLocked reports whether every live member is reachable and has
// seen this member's state.
func (c *Cluster) convergedLocked() bool {
	if len(c.unreachableLocked()) > 0 {
		return false
	}
	d := c.digestLocked()
	for uid, m := range c.members {
		if uid == c.self || m.Status >= MemberExiting {
			continue // an exiting member has stopped listening
		}
		if c.seen[uid] != d {
			return false
		}
	}
	return true
}

// leaderLocked is the lowest-addressed up or leaving member this member can
// reach. (The first member of a cluster starts up; joiners never lead.)
func (c *Cluster) leaderLocked() *Member {
	unreachable := c.unreachableLocked()
	var best *Member
	for uid, m := range c.members {
		if !m.counts() || unreachable[uid] && uid != c.self {
			continue
		}
		if best == nil || lowerAddr(*m, *best) < 0 {
			best = m
		}
	}
	return best
}

func (c *Cluster) snapshotLocked() gossipMsg {
	g := gossipMsg{From: c.self}
	for _, m := range c.members {
		g.Members = append(g.Members, gossipMember{Addr: m.Addr.String(), UID: m.UID, Status: uint8(m.Status), UpNumber: m.UpNumber})
	}
	for o, r := range c.reach {
		g.Reach = append(g.Reach, gossipReach{Observer: o, Version: r.version, Unreachable: r.unreachable})
	}
	return g
}

// gossip sends the state to every other live member (dialing anew when
// an association has ended: members keep knocking).
func (c *Cluster) gossip() {
	c.mu.Lock()
	if c.stopped {
		c.mu.Unlock()
		return
	}
	type dest struct {
		addr Addr
		uid  NodeUID
	}
	var to []dest
	for uid, m := range c.members {
		if uid != c.self && m.Status < MemberRemoved {
			to = append(to, dest{m.Addr, uid})
		}
	}
	c.mu.Unlock()
	for _, d := range to {
		c.sendTo(d.addr, d.uid)
	}
}

// knock sends this member's state to the seeds while it knows no other
// member.
func (c *Cluster) knock() {
	c.mu.Lock()
	alone := len(c.members) == 1
	c.mu.Unlock()
	if alone {
		for _, s := range c.seeds {
			c.sendTo(s, NodeUID{})
		}
	}
}

func (c *Cluster) sendTo(addr Addr, uid NodeUID) {
	c.mu.Lock()
	g := c.snapshotLocked()
	c.mu.Unlock()
	a, err := c.n.assocFor(addr)
	if err != nil {
		return
	}
	t := a.lockTarget()
	peer, up := t.peerUID, t.state == assocUp
	t.mu.Unlock()
	if !up {
		return // still dialing (or gone): knock again next round
	}
	Ref[gossipMsg]{h: &handle{node: c.n, key: refKey{node: peer, path: ClusterPath}, assoc: a}}.Tell(g)
}

// replaceIncarnationLocked handles a member new to this member: if a live
// member with another uid has its address, that is an earlier incarnation
// of the same process, which is gone — two processes cannot listen on one
// address. It is downed (the leader then removes it) and its association
// is ended, so that sends to the address reach the new incarnation. The
// uids to end are added to ended, for after the lock is released.
func (c *Cluster) replaceIncarnationLocked(m *Member, ended *[]NodeUID) []MemberEvent {
	var events []MemberEvent
	for uid, old := range c.members {
		if uid == m.UID || uid == c.self || old.Status >= MemberDown || old.Addr != m.Addr {
			continue
		}
		old.Status = MemberDown
		c.changed = time.Now()
		events = append(events, MemberEvent{Member: *old, Kind: EventMemberStatus})
		*ended = append(*ended, uid)
		c.n.log.Info("troupe: cluster member restarted; its earlier incarnation is downed", "addr", m.Addr.String(), "old", uid.String(), "new", m.UID.String())
	}
	return events
}

// quarantinedBy hears that the peer uid refused this node because it
// has quarantined it. If uid is a current member (up or leaving), this
// member can never be heard by it again: it downs itself, and only
// itself (Akka's rule for a member quarantined by a remote).
func (c *Cluster) quarantinedBy(uid NodeUID) {
	c.mu.Lock()
	m, self := c.members[uid], c.members[c.self]
	if c.stopped || m == nil || !m.counts() || self.Status >= MemberDown {
		c.mu.Unlock()
		return
	}
	events := c.downLocked([]Member{*self})
	c.mu.Unlock()
	c.n.log.Warn("troupe: a cluster member has quarantined this node; downing this member", "by", m.Addr.String())
	c.publish(events)
}

// ErrMemberDowned is what [Cluster.Err] returns once this member has been
// downed or removed: it can never rejoin with this node's uid, so the
// node must restart (a new uid) to join again.
var ErrMemberDowned = errors.New("troupe: this cluster member was downed; restart its node to join again")

// ErrNotMember is returned by [Cluster.Down] for an address no live member
// has.
var ErrNotMember = errors.New("troupe: no such cluster member")

// Err reports why this member stopped: nil while it runs,
// [ErrMemberDowned] when it was downed or removed (including when it
// tried to join with a uid the cluster had downed), [ErrClusterStopped]
// after Close or Leave.
func (c *Cluster) Err() error {
	select {
	case <-c.done:
	default:
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.members[c.self].Status >= MemberDown {
		return ErrMemberDowned
	}
	return ErrClusterStopped
}

// Down marks the member listening at addr (in any form [ParseAddr]
// accepts) down: manual downing, for an operator (troupe down) or a
// program that knows the member is gone — the only way to unblock a
// cluster without a downing strategy when a member has crashed. The
// leader removes it once the others have seen the change; its node must
// restart to join again. Downing this member itself stops it.
func (c *Cluster) Down(addr string) error {
	a, err := ParseAddr(addr)
	if err != nil {
		return err
	}
	c.mu.Lock()
	if c.stopped {
		c.mu.Unlock()
		return ErrClusterStopped
	}
	var down []Member
	for _, m := range c.members {
		if m.Addr == a && m.Status < MemberDown {
			down = append(down, *m)
		}
	}
	events := c.downLocked(down)
	c.mu.Unlock()
	if len(down) == 0 {
		return fmt.Errorf("%w at %s", ErrNotMember, a)
	}
	c.n.log.Warn("troupe: cluster member downed by hand", "addr", a.String())
	c.publish(events)
	c.gossip()
	return nil
}

// receive merges a gossiped state into this member's.
func (c *Cluster) receive(g gossipMsg) {
	var events []MemberEvent
	var ended []NodeUID // earlier incarnations whose associations to end
	c.mu.Lock()
	if c.stopped {
		c.mu.Unlock()
		return
	}
	before := c.digestLocked()
	oldUnreach := c.unreachableLocked()
	for _, gm := range g.Members {
		addr, err := ParseAddr(gm.Addr)
		if err != nil {
			continue
		}
		m := c.members[gm.UID]
		if m == nil {
			m = &Member{Addr: addr, UID: gm.UID, Status: MemberStatus(gm.Status), UpNumber: gm.UpNumber}
			c.members[gm.UID] = m
			c.n.members.Store(gm.UID, struct{}{})
			events = append(events, MemberEvent{Member: *m, Kind: EventMemberStatus})
			if m.Status < MemberDown {
				events = append(events, c.replaceIncarnationLocked(m, &ended)...)
			}
			continue
		}
		changed := false
		if s := MemberStatus(gm.Status); s > m.Status {
			m.Status, changed = s, true
		}
		if gm.UpNumber != 0 && (m.UpNumber == 0 || gm.UpNumber < m.UpNumber) {
			m.UpNumber, changed = gm.UpNumber, true
		}
		if changed {
			events = append(events, MemberEvent{Member: *m, Kind: EventMemberStatus})
		}
	}
	for _, r := range g.Reach {
		if r.Observer == c.self {
			continue // only this member speaks for itself
		}
		if cur, ok := c.reach[r.Observer]; !ok || r.Version > cur.version {
			c.reach[r.Observer] = reachRecord{version: r.Version, unreachable: r.Unreachable}
		}
	}
	after := c.digestLocked()
	c.seen[g.From] = digestOf(g)
	// A sender this member has downed or removed may not know: tell it,
	// so that it stops instead of knocking as a joiner for ever.
	var tell *Member
	if m := c.members[g.From]; m != nil && m.Status >= MemberDown && g.From != c.self {
		tell = &Member{Addr: m.Addr, UID: m.UID}
	}
	defer func() {
		for _, uid := range ended {
			c.n.endMemberAssoc(uid, errors.New("a new incarnation of this cluster member joined at its address"))
		}
		if tell != nil {
			c.sendTo(tell.Addr, tell.UID)
		}
	}()
	if before != after {
		c.changed = time.Now()
	}
	events = append(events, c.reachEventsLocked(oldUnreach)...)
	c.mu.Unlock()
	for _, e := range events {
		c.n.events.Publish(e)
	}
}

// digestOf computes the digest of a gossiped state the way digestLocked
// does for this member's own.
func digestOf(g gossipMsg) uint64 {
	tmp := &Cluster{members: map[NodeUID]*Member{}, reach: map[NodeUID]reachRecord{}}
	for _, gm := range g.Members {
		tmp.members[gm.UID] = &Member{UID: gm.UID, Status: MemberStatus(gm.Status), UpNumber: gm.UpNumber}
	}
	for _, r := range g.Reach {
		tmp.reach[r.Observer] = reachRecord{version: r.Version}
	}
	return tmp.digestLocked()
}

func (c *Cluster) reachEventsLocked(old map[NodeUID]bool) []MemberEvent {
	var out []MemberEvent
	now := c.unreachableLocked()
	for uid := range now {
		if !old[uid] {
			out = append(out, MemberEvent{Member: *c.members[uid], Kind: EventMemberUnreachable})
		}
	}
	for uid := range old {
		if !now[uid] && c.members[uid] != nil {
			out = append(out, MemberEvent{Member: *c.members[uid], Kind: EventMemberReachable, Reachable: true})
		}
	}
	if len(now) > 0 && c.unstable.IsZero() {
		c.unstable = time.Now()
	}
	if len(now) == 0 {
		c.unstable, c.decided = time.Time{}, false
	}
	return out
}

// detect feeds each member's failure detector the last time anything
// arrived from it, and publishes this member's reachability view.
func (c *Cluster) detect(now time.Time) {
	c.n.pmu.Lock()
	heard := map[NodeUID]int64{}
	for uid, a := range c.n.byUID {
		if a.in != nil {
			heard[uid] = a.in.heard.Load()
		}
	}
	c.n.pmu.Unlock()

	var events []MemberEvent
	defer func() {
		for _, e := range events { // published outside the lock
			c.n.events.Publish(e)
		}
	}()
	c.mu.Lock()
	defer c.mu.Unlock()
	old := c.unreachableLocked()
	var mine []NodeUID
	for uid, m := range c.members {
		if uid == c.self || !live(m) {
			continue
		}
		d := c.detectors[uid]
		if d == nil {
			d = c.cfg.Detector()
			d.Heartbeat(now) // count from when this member learned of it
			c.detectors[uid] = d
		}
		if at := heard[uid]; at != 0 && at != c.lastHeard[uid] {
			c.lastHeard[uid] = at
			d.Heartbeat(c.n.epoch.Add(time.Duration(at)))
		}
		if !d.Available(now) {
			mine = append(mine, uid)
		}
	}
	slices.SortFunc(mine, func(a, b NodeUID) int { return cmp.Compare(string(a[:]), string(b[:])) })
	cur := c.reach[c.self]
	if !slices.Equal(cur.unreachable, mine) {
		c.reach[c.self] = reachRecord{version: cur.version + 1, unreachable: mine}
		c.changed = now
		events = c.reachEventsLocked(old)
	}
}

// lead performs the leader's transitions once the state has converged.
func (c *Cluster) lead() {
	var events []MemberEvent
	c.mu.Lock()
	if l := c.leaderLocked(); l == nil || l.UID != c.self || !c.convergedLocked() {
		c.mu.Unlock()
		return
	}
	maxUp := 0
	for _, m := range c.members {
		maxUp = max(maxUp, m.UpNumber)
	}
	// Joining members in address order, so up numbers are deterministic.
	var joining []*Member
	for _, m := range c.members {
		if m.Status == MemberJoining {
			joining = append(joining, m)
		}
	}
	slices.SortFunc(joining, func(a, b *Member) int { return lowerAddr(*a, *b) })
	for _, m := range joining {
		maxUp++
		m.Status, m.UpNumber = MemberUp, maxUp
		events = append(events, MemberEvent{Member: *m, Kind: EventMemberStatus})
	}
	for _, m := range c.members {
		switch m.Status {
		case MemberLeaving:
			m.Status = MemberExiting
		case MemberExiting, MemberDown:
			m.Status = MemberRemoved
		default:
			continue
		}
		events = append(events, MemberEvent{Member: *m, Kind: EventMemberStatus})
	}
	if len(events) > 0 {
		c.changed = time.Now()
	}
	c.mu.Unlock()
	for _, e := range events {
		c.n.events.Publish(e)
	}
}

// downing applies the strategy; it returns true when this member is down
// or removed and the cluster must stop.
func (c *Cluster) downing(now time.Time) bool {
	c.mu.Lock()
	self := c.members[c.self]
	if self.Status >= MemberExiting {
		c.mu.Unlock()
		// Tell the others before going: this member may have been the
		// leader that moved itself on, and nobody else knows it yet.
		c.gossip()
		c.selfDowned(*self)
		return true
	}
	c.releaseLeaseLocked(now)
	unreachable := c.unreachableLocked()
	if c.cfg.Downing == nil || len(unreachable) == 0 || c.decided {
		c.mu.Unlock()
		return false
	}
	view := c.splitViewLocked(unreachable)
	// The leader of this side decides: the lowest-addressed counting
	// member it can reach.
	var sideLeader *Member
	for i := range view.Reachable {
		m := &view.Reachable[i]
		if m.counts() && (sideLeader == nil || lowerAddr(*m, *sideLeader) < 0) {
			sideLeader = m
		}
	}
	tooLong := !c.unstable.IsZero() && now.Sub(c.unstable) > c.cfg.StableAfter+c.cfg.DownAllWhenUnstable
	stable := now.Sub(c.changed) >= c.cfg.StableAfter
	if !stable && !tooLong || sideLeader != nil && sideLeader.UID != c.self && !tooLong {
		c.mu.Unlock()
		return false
	}
	if sideLeader == nil || sideLeader.UID != c.self {
		// Unstable for too long, and no leader of this side to say so
		// (this member is itself reported unreachable): it can always
		// down itself, which never leaves two sides.
		c.decided = true
		events := c.downLocked([]Member{*self})
		c.mu.Unlock()
		c.publish(events)
		c.n.log.Warn("troupe: cluster unstable for too long and no side leader; downing this member")
		c.gossip()
		return false
	}
	c.decided = true
	strategy := c.cfg.Downing
	c.mu.Unlock()

	decision, down := DownEveryone, view.members(DownEveryone)
	if !tooLong {
		decision, down = resolve(view, func(v SplitView) Downing { return c.decide(strategy, v) })
	}
	c.n.log.Warn("troupe: cluster split resolved", "decision", decision.String(), "downed", len(down),
		"reachable", len(view.Reachable), "unreachable", len(view.Unreachable), "strategy", fmt.Sprintf("%T", strategy))
	c.mu.Lock()
	events := c.downLocked(down)
	if c.leaseHeld && c.leaseDowned == nil {
		c.leaseDowned = down
	}
	c.mu.Unlock()
	c.publish(events)
	c.gossip() // tell this side before stopping
	return false
}

// splitViewLocked is this member's view of the split, with the
// observations of the members that count.
func (c *Cluster) splitViewLocked(unreachable map[NodeUID]bool) SplitView {
	var view SplitView
	for uid, m := range c.members {
		if !live(m) {
			continue
		}
		if unreachable[uid] {
			view.Unreachable = append(view.Unreachable, *m)
		} else {
			view.Reachable = append(view.Reachable, *m)
		}
	}
	for obs, r := range c.reach {
		if m := c.members[obs]; m == nil || !m.counts() {
			continue
		}
		for _, u := range r.unreachable {
			view.Observations = append(view.Observations, Observation{Observer: obs, Subject: u})
		}
	}
	return view
}

// downLocked marks members down and returns the events to publish once
// the lock is released.
func (c *Cluster) downLocked(down []Member) []MemberEvent {
	var events []MemberEvent
	for _, d := range down {
		if m := c.members[d.UID]; m != nil && m.Status < MemberDown {
			m.Status = MemberDown
			events = append(events, MemberEvent{Member: *m, Kind: EventMemberStatus})
		}
	}
	c.changed = time.Now()
	return events
}

// publish hands events to the node's stream; call it without c.mu held,
// for subscribers run on the publishing goroutine.
func (c *Cluster) publish(events []MemberEvent) {
	for _, e := range events {
		c.n.events.Publish(e)
	}
}

// releaseLeaseLocked gives the lease back once what it was taken for is
// done: every member downed under it removed, or, when it downed nobody,
// ClusterConfig.LeaseReleaseAfter after it was taken. Holding it longer
// would let this side win the next split by an old victory.
func (c *Cluster) releaseLeaseLocked(now time.Time) {
	if !c.leaseHeld {
		return
	}
	done := len(c.leaseDowned) > 0
	for _, d := range c.leaseDowned {
		if m := c.members[d.UID]; m != nil && m.Status != MemberRemoved {
			done = false
		}
	}
	if !done && (len(c.leaseDowned) > 0 || now.Sub(c.leaseAt) < c.cfg.LeaseReleaseAfter) {
		return
	}
	c.leaseHeld, c.leaseDowned = false, nil
	lease, owner := c.cfg.Lease, c.n.uid.String()
	c.n.wg.Go(func() {
		ctx, cancel := context.WithTimeout(c.n.ctx, max(c.cfg.StableAfter, time.Second))
		defer cancel()
		if err := lease.Release(ctx, owner); err != nil {
			c.n.log.Warn("troupe: could not release the cluster lease", "err", err)
		}
	})
}

// decide runs the strategy on a clean split; LeaseMajority races for the
// lease.
func (c *Cluster) decide(s DowningStrategy, v SplitView) Downing {
	if _, ok := s.(LeaseMajority); !ok {
		return s.Decide(v)
	}
	if MinorityDelay(v) {
		t := time.NewTimer(c.cfg.LeaseMinorityDelay)
		defer t.Stop()
		select {
		case <-t.C:
		case <-c.stop:
			return DownReachable
		case <-c.n.done:
			return DownReachable
		}
	}
	ctx, cancel := context.WithTimeout(c.n.ctx, max(c.cfg.StableAfter, time.Second))
	defer cancel()
	acquired, err := c.cfg.Lease.Acquire(ctx, c.n.uid.String())
	if err != nil {
		c.n.log.Warn("troupe: could not reach the lease; downing this side", "err", err)
	}
	if acquired && err == nil {
		c.mu.Lock()
		c.leaseHeld, c.leaseAt, c.leaseDowned = true, time.Now(), nil
		c.mu.Unlock()
	}
	return LeaseDecision(acquired && err == nil)
}

// selfDowned ends this member's membership.
func (c *Cluster) selfDowned(m Member) {
	c.n.log.Info("troupe: this member is no longer in the cluster", "status", m.Status.String())
	c.n.events.Publish(MemberEvent{Member: m, Kind: EventMemberStatus})
	if c.cfg.CloseNodeOnDown {
		// Close waits for the node's goroutines, this one among them, so it
		// runs on its own goroutine; it ends when the node is closed.
		go c.n.Close()
	}
}

// LeaseMajority is the downing strategy that lets a lease decide: the side
// that acquires [ClusterConfig.Lease] downs the other; the minority side
// (see [MinorityDelay]) waits [ClusterConfig.LeaseMinorityDelay]
// before trying, so the majority wins a fair race; a side that cannot
// acquire it — including when the lease is unreachable — downs itself.
// Never two surviving sides.
type LeaseMajority struct{}

// Decide is the rule without a lease: it is only used when the lease
// cannot be consulted, and then downs this side.
func (LeaseMajority) Decide(SplitView) Downing { return DownReachable }
