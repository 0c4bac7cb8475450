package troupe

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
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

	// LeaseReleaseAfter is how long a member that took the lease keeps it
	// at least (and until the members it downed are removed): long enough
	// for the other side, which may not know it was downed, to have made
	// its own decision and stopped. It is never less than that decision
	// time, StableAfter + DownAllWhenUnstable + LeaseMinorityDelay + the
	// lease call's timeout (max(StableAfter, 1 s)) + StableAfter/2: 67 s
	// with the defaults; a smaller value is raised to it. Default: that
	// time. Every member must use the same timings.
	LeaseReleaseAfter time.Duration

	// GossipInterval is how often a member sends its view to the others.
	// Default: the node's HeartbeatInterval.
	GossipInterval time.Duration

	// Detector makes the failure detector for each member. Default: a
	// phi-accrual detector scaled to the node's heartbeat interval
	// (first estimate one interval, acceptable pause three).
	Detector func() FailureDetector

	// MonitoredMembers is how many other members each member watches with
	// a failure detector (they heartbeat it; the rest of the cluster
	// learns what it finds through gossip): the next ones on a ring
	// ordered by a hash of their uids. Default: 9, as in Akka. A cluster
	// of at most MonitoredMembers+1 members watches everyone.
	MonitoredMembers int

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
	mu sync.Mutex
	membership
	detectors map[NodeUID]FailureDetector
	lastHeard map[NodeUID]int64
	stopped   bool

	leaseHeld   bool                   // this member took the lease for a decision
	leaseAt     time.Time              // when
	leaseDowned []Member               // whom it downed under the lease
	leaseLost   <-chan struct{}        // the lease's Lost channel while held
	releasing   chan struct{}          // closed when the last release of the lease is done
	turnHook    atomic.Pointer[func()] // tests only: runs at the start of each turn
	paused      pauseMeter             // how long this process stood still in a split
	blocked     blockedNote            // why convergence is blocked, with no strategy to act
	leftSeen    map[NodeUID]bool       // members seen leaving: their removal does not end their association

	ref   Ref[clusterMsg] // this member's cluster actor
	seeds []Addr          // where to knock until some member answers
	stop  chan struct{}
	done  chan struct{} // closed when the cluster has stopped
	once  sync.Once
}

// gossipMsg is the whole state, sent between members.
type gossipMsg struct {
	From    NodeUID
	Members []gossipMember
	Reach   []gossipReach
	Seen    []NodeUID // members known to hold exactly this state
	// ReplyTo is the sender's cluster actor: answers go back over the
	// connection the gossip came on.
	ReplyTo Ref[clusterMsg]
}

// gossipStatus is what a member sends instead of its state when every
// member has seen it: the state's digest, a few bytes. A receiver whose
// digest differs answers with its state.
type gossipStatus struct {
	From    NodeUID
	Digest  uint64
	ReplyTo Ref[clusterMsg] // the sender's cluster actor
	// Seen, in a confirmation of a gossip received, is who the sender
	// knows holds this state, so that a member that gossips a state many
	// have already seen learns it in one round (empty in the periodic
	// status: it would cost bytes in proportion to the cluster).
	Seen []NodeUID
}

func (gossipStatus) isClusterMsg() {}

// gossipFanout is how many members get the state in a round in which some
// have not seen it: enough to spread a change to a hundred members in a
// few rounds (about log₃ n), few enough that the bytes per member do not
// grow with the cluster.
const gossipFanout = 5

type gossipMember struct {
	Addr       string
	UID        NodeUID
	Status     uint8
	UpNumber   int
	AppVersion string
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
	RegisterMessage[gossipStatus]("troupe.cluster.status")
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
	c.LeaseReleaseAfter = max(c.LeaseReleaseAfter, leaseHold(c.StableAfter, c.DownAllWhenUnstable, c.LeaseMinorityDelay))
	if c.MonitoredMembers <= 0 {
		c.MonitoredMembers = 9
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
	first := len(seeds) == 0 || len(seeds) == 1 && n.isOwnAddr(seeds[0])
	self := Member{Addr: n.addrList()[0], UID: n.uid, Status: MemberJoining, AppVersion: n.cfg.AppVersion}
	if first {
		self.Status, self.UpNumber = MemberUp, 1
	}
	c := &Cluster{
		n: n, cfg: cfg.withDefaults(n), membership: newMembership(self, time.Now()),
		detectors: map[NodeUID]FailureDetector{}, lastHeard: map[NodeUID]int64{}, leftSeen: map[NodeUID]bool{},
		stop: make(chan struct{}), done: make(chan struct{}),
	}
	n.members.Store(n.uid, struct{}{})
	ref, err := Spawn(systemParent{n}, "cluster", Behavior[clusterMsg]{
		Receive: func(_ *Context[clusterMsg], m clusterMsg) {
			switch m := m.(type) {
			case gossipMsg:
				c.receive(m)
			case gossipStatus:
				c.status(m)
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
	c.mu.Lock() // the actor may already be answering gossip, which reads ref
	c.ref = ref
	c.mu.Unlock()
	onQuarantine := c.quarantinedBy
	n.quarantinedBy.Store(&onQuarantine)
	n.cluster.Store(c)
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

// Close leaves the cluster, as [Cluster.Leave] does, waiting at most a
// few gossip intervals (3, at least 1 s and at most 5 s) for the leader to
// move this member on, and then stops this member's participation. The
// others see a leave rather than a crash; if the leave could not finish
// (the cluster is split, say), they see this member unreachable.
func (c *Cluster) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), c.leaveWait())
	defer cancel()
	if err := c.leaveAndWait(ctx, nil); err != nil {
		c.n.log.Warn("troupe: stopping without the cluster confirming this member's leave; the others may see it as unreachable", "err", err)
	}
	c.once.Do(func() { close(c.stop) })
	<-c.done
	return nil
}

// Leave asks the cluster to remove this member gracefully and waits until
// the leader has moved it to exiting and this member has stopped (or ctx
// ends). The others then remove it.
func (c *Cluster) Leave(ctx context.Context) error {
	return c.leaveAndWait(ctx, nil)
}

// leaveWait bounds the leave of Close: 3 gossip intervals, at least 1 s
// and at most 5 s.
func (c *Cluster) leaveWait() time.Duration {
	return min(max(3*c.cfg.GossipInterval, time.Second), 5*time.Second)
}

// leaveAndWait marks this member leaving, tells the others, and waits
// until this member has stopped, ctx ends or hurry is closed.
func (c *Cluster) leaveAndWait(ctx context.Context, hurry <-chan struct{}) error {
	select {
	case <-c.done:
		return nil // stopped already: downed, removed or closed
	default:
	}
	c.mu.Lock()
	c.leave(time.Now())
	c.mu.Unlock()
	c.gossip()
	select {
	case <-c.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-hurry:
		return errors.New("the node was closed during the leave")
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
	for uid := range c.unreachable() {
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
	l := c.leader()
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
		case <-c.lostLease():
			c.leaseLostInHold()
		case <-t.C:
			// The tick's value is when it was due, which after a long
			// turn or a stopped process is in the past: decide on the
			// clock.
			now := time.Now()
			c.meterPause(now)
			if h := c.turnHook.Load(); h != nil {
				(*h)() // tests: the loop stands still here
			}
			c.detect(now)
			c.lead()
			if c.downing(now) {
				return
			}
			c.gossip()
			c.knock()
			c.turnDone()
		}
	}
}

func (c *Cluster) cleanup() {
	c.keepLeaseThroughHold()
	c.n.quarantinedBy.Store(nil)
	c.n.beatMembers.Store(nil)
	if c.n.cluster.CompareAndSwap(c, nil) {
		c.n.clusterEnded.Store(true)
	}
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

// gossip sends the state to a few members that have not seen it, or,
// when all have, its digest to one (dialing anew when an association has
// ended: members keep knocking).
func (c *Cluster) gossip() {
	c.mu.Lock()
	if c.stopped {
		c.mu.Unlock()
		return
	}
	targets, full := c.gossipTargets(gossipFanout, rand.IntN)
	var msg clusterMsg = gossipStatus{From: c.self, Digest: c.digested, ReplyTo: c.ref}
	if full {
		g := c.snapshot()
		g.ReplyTo = c.ref
		msg = g
	}
	addrs := make([]Addr, len(targets))
	for i, uid := range targets {
		addrs[i] = c.members[uid].Addr
	}
	c.mu.Unlock()
	for _, a := range addrs {
		c.tell(a, msg)
	}
}

// status handles a member's digest: a differing one gets this member's
// state in return; an equal one says the sender holds this state.
func (c *Cluster) status(s gossipStatus) {
	c.mu.Lock()
	m := c.members[s.From]
	same := s.Digest == c.digested
	if same && m != nil {
		c.seen[s.From] = true
		for _, uid := range s.Seen {
			c.seen[uid] = true
		}
	}
	var g gossipMsg
	if !same {
		g = c.snapshot()
		g.ReplyTo = c.ref
	}
	c.mu.Unlock()
	if !same && m != nil {
		c.reply(s.ReplyTo, m.Addr, g)
	}
}

// reply sends msg back to the member that sent this one: through its
// ReplyTo ref, over the connection the message came on, or failing that
// to its address.
func (c *Cluster) reply(to Ref[clusterMsg], addr Addr, msg clusterMsg) {
	if !to.IsZero() {
		to.Tell(msg)
		return
	}
	c.tell(addr, msg)
}

// knock sends this member's state to the seeds while it knows no other
// member.
func (c *Cluster) knock() {
	c.mu.Lock()
	alone := len(c.members) == 1
	c.mu.Unlock()
	if alone {
		for _, s := range c.seeds {
			c.sendTo(s)
		}
	}
}

// sendTo sends this member's state to the member at addr.
func (c *Cluster) sendTo(addr Addr) {
	c.mu.Lock()
	g := c.snapshot()
	g.ReplyTo = c.ref
	c.mu.Unlock()
	c.tell(addr, g)
}

// tell sends msg to the cluster actor of the node at addr, once an
// association with it is up.
func (c *Cluster) tell(addr Addr, msg clusterMsg) {
	a, err := c.n.assocFor(addr)
	if err != nil {
		return
	}
	t := a.lockTarget()
	up := t.state == assocUp
	var peer NodeUID
	if up {
		peer = t.peerUID // written by the handshake before it set the state, under mu
	}
	t.mu.Unlock()
	if !up {
		return // still dialing (or gone): knock again next round
	}
	Ref[clusterMsg]{h: &handle{node: c.n, key: refKey{node: peer, path: ClusterPath}, assoc: a}}.Tell(msg)
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
	events := c.down([]Member{*self}, time.Now())
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
	events := c.membership.down(down, time.Now())
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
	c.mu.Lock()
	if c.stopped {
		c.mu.Unlock()
		return
	}
	out := c.merge(g, time.Now())
	confirm := gossipStatus{From: c.self, Digest: c.digested, ReplyTo: c.ref}
	if out.confirm {
		for uid := range c.seen {
			confirm.Seen = append(confirm.Seen, uid)
		}
	}
	var state gossipMsg
	if out.tellTo != nil {
		state = c.snapshot()
		state.ReplyTo = c.ref
	}
	sender := c.members[g.From]
	c.mu.Unlock()
	if out.confirm && sender != nil {
		c.reply(g.ReplyTo, sender.Addr, confirm) // so that it counts this member as having seen it
	}
	for _, uid := range out.added {
		c.n.members.Store(uid, struct{}{})
	}
	for _, uid := range out.ended {
		c.n.log.Info("troupe: cluster member restarted; its earlier incarnation is downed", "uid", uid.String())
		c.n.endMemberAssoc(uid, errors.New("a new incarnation of this cluster member joined at its address"))
	}
	c.publish(out.events)
	if out.tellTo != nil {
		c.reply(g.ReplyTo, out.tellTo.Addr, state)
	}
	if out.changed {
		// Pass news on at once rather than at the next tick: a change
		// reaches a hundred members in a few hops, not a few intervals.
		c.gossip()
	}
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
	var dial []Addr
	defer func() { // outside the lock
		c.publish(events)
		for _, a := range dial {
			c.n.assocFor(a)
		}
	}()
	c.mu.Lock()
	defer c.mu.Unlock()
	monitored := c.monitorsOf(c.self, c.cfg.MonitoredMembers, c.ring())
	for uid := range c.detectors {
		if !slices.Contains(monitored, uid) {
			delete(c.detectors, uid) // watched afresh if it comes back on the ring
			delete(c.lastHeard, uid)
		}
	}
	watchers := c.watchers(c.cfg.MonitoredMembers)
	c.n.beatMembers.Store(&watchers)
	var mine []NodeUID
	for _, uid := range monitored {
		if heard[uid] == 0 {
			// No association yet: dial it, so that its heartbeats reach
			// this member (gossip alone may never have connected them).
			dial = append(dial, c.members[uid].Addr)
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
	events = c.observe(mine, now)
}

// lead performs the leader's transitions once the state has converged.
func (c *Cluster) lead() {
	c.mu.Lock()
	events := c.membership.lead(time.Now())
	c.mu.Unlock()
	c.publish(events)
}

// downing applies the strategy; it returns true when this member is down
// or removed and the cluster must stop.
func (c *Cluster) downing(now time.Time) bool {
	c.mu.Lock()
	held := c.leaseHeld
	c.mu.Unlock()
	if held && !c.cfg.Lease.CheckHeld(c.n.uid.String()) { // (user code: not under c.mu)
		c.leaseLostInHold()
	}
	c.mu.Lock()
	c.noteBlockedLocked(now)
	defer c.logBlocked()
	c.releaseLeaseLocked(now)
	step := c.nextDowning(now, c.cfg.Downing != nil, timing{c.cfg.StableAfter, c.cfg.DownAllWhenUnstable})
	self := *c.members[c.self]
	switch step {
	case stepWait:
		c.mu.Unlock()
		return false
	case stepStop:
		c.mu.Unlock()
		// Tell the others before going: this member may have been the
		// leader that moved itself on, and nobody else knows it yet.
		c.gossip()
		c.selfDowned(self)
		return true
	case stepSelf:
		c.decided, c.decidedOn = true, c.unreachableKey()
		events := c.down([]Member{self}, now)
		c.mu.Unlock()
		c.publish(events)
		c.n.log.Warn("troupe: cluster unstable for too long and no side leader; downing this member")
		c.gossip()
		return false
	}
	c.decided, c.decidedOn = true, c.unreachableKey()
	view := c.splitView()
	strategy := c.cfg.Downing
	c.mu.Unlock()

	decision, down := DownEveryone, view.members(DownEveryone)
	if step == stepDecide {
		decision, down = resolve(view, func(v SplitView) Downing { return c.decide(strategy, v) })
	}
	c.n.log.Warn("troupe: cluster split resolved", "decision", decision.String(), "downed", len(down),
		"reachable", len(view.Reachable), "unreachable", len(view.Unreachable), "strategy", fmt.Sprintf("%T", strategy))
	c.mu.Lock()
	events := c.down(down, time.Now())
	if c.leaseHeld && c.leaseDowned == nil {
		c.leaseDowned = down
	}
	c.mu.Unlock()
	c.publish(events)
	c.gossip() // tell this side before stopping
	return false
}

// noteBlockedLocked tells, once per blocking set and after StableAfter,
// that an unreachable member blocks the cluster and no downing strategy
// will act, with the command that unblocks it; Stats shows it meanwhile.
func (c *Cluster) noteBlockedLocked(now time.Time) {
	var by []string
	if c.cfg.Downing == nil {
		by = c.blockedBy()
	}
	key := strings.Join(by, " ")
	if key != c.blocked.key {
		c.blocked = blockedNote{key: key, since: now}
	}
	if key == "" || c.blocked.text != "" || now.Sub(c.blocked.since) < c.cfg.StableAfter {
		return
	}
	self := c.members[c.self].Addr.String()
	cmds := make([]string, len(by))
	for i, a := range by {
		cmds[i] = fmt.Sprintf("troupe down %s --node %s", a, self)
	}
	c.blocked.logged = false
	c.blocked.text = fmt.Sprintf("unreachable for %v and no downing strategy: %s; no member becomes up or is removed until it is reachable again or downed (%s)",
		now.Sub(c.blocked.since).Round(time.Second), key, strings.Join(cmds, "; "))
}

// logBlocked logs a new blocked note once, outside c.mu (the log
// handler is user code).
func (c *Cluster) logBlocked() {
	c.mu.Lock()
	text, log := c.blocked.text, c.blocked.text != "" && !c.blocked.logged
	c.blocked.logged = true
	c.mu.Unlock()
	if log {
		c.n.log.Warn("troupe: cluster blocked: " + text)
	}
}

// publish hands events to the node's stream; call it without c.mu held,
// for subscribers run on the publishing goroutine.
func (c *Cluster) publish(events []MemberEvent) {
	for _, e := range events {
		if e.Kind == EventMemberStatus && e.Member.UID != c.n.uid {
			c.forgetDowned(e.Member)
		}
		c.n.events.Publish(e)
	}
}

// forgetDowned ends this node's association with a member that was
// downed (removed without leaving), once it is removed (not at once: the gossip that tells a
// reachable downed member it is down goes over that association): what
// was queued for it becomes dead letters, and watchers of its actors get
// [Terminated] with [ErrPeerUnreachable] — exactly once, as for any peer
// given up on. It is not quarantined: if it knocks again, the cluster
// tells it it is down.
func (c *Cluster) forgetDowned(m Member) {
	c.mu.Lock()
	switch m.Status {
	case MemberLeaving, MemberExiting:
		c.leftSeen[m.UID] = true // a graceful leave: its node may go on as a plain peer
		c.mu.Unlock()
		return
	case MemberRemoved:
	default:
		c.mu.Unlock()
		return
	}
	left := c.leftSeen[m.UID]
	delete(c.leftSeen, m.UID)
	c.mu.Unlock()
	if left {
		return
	}
	c.n.endMemberAssoc(m.UID, fmt.Errorf("%w: cluster member %s was downed", ErrPeerUnreachable, m.Addr))
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
