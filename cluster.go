package troupe

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"
)

// clusterPath is where a node's cluster actor lives.
const clusterPath = "/system/cluster"

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
	// Kind is "status" for a change of Member.Status, and "unreachable"
	// or "reachable" for a change of reachability.
	Kind string
}

// The kinds of a MemberEvent.
const (
	eventMemberStatus      = "status"
	eventMemberUnreachable = "unreachable"
	eventMemberReachable   = "reachable"
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
	mu mutex[lkCluster]
	membership
	watching // the failure detectors, one for each member this one watches
	stopped  bool
	// closedMidLeave: Close stopped this member before its leave finished,
	// and it moved itself on to exiting on the way out (farewell).
	closedMidLeave bool

	leaseHeld   bool            // this member took the lease for a decision
	leaseAt     time.Time       // when
	leaseDowned []Member        // whom it downed under the lease
	leaseLost   <-chan struct{} // the lease's Lost channel while held
	releasing   chan struct{}   // closed when the last release of the lease is done
	// leaseWaitLimit is maxLeaseWait, or less in a test (zero: maxLeaseWait).
	leaseWaitLimit time.Duration
	paused         pauseMeter       // how long this process stood still in a split
	blocked        blockedNote      // why convergence is blocked, with no strategy to act
	leftSeen       map[NodeUID]bool // members seen leaving: their removal does not end their association
	downed         downedMembers    // members seen downed (or removed without leaving), lately

	// recep is the cluster's registry of service keys and topics, when
	// the node uses no other (nil otherwise).
	recep *receptionist
	// plug is what this cluster installed in the node's seam (set by
	// StartCluster before the loop starts; the loop's end removes it).
	plug *clusterPlug

	singletons singletons // the singletons this member takes part in
	shardings  shardings  // the sharded kinds this member runs, and the members they avoid

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
	// LeaseWait, when not zero, says that the sender is deciding a split
	// for its side and waits for a lease that cannot be granted yet: it
	// will have decided within LeaseWait (see membership.heardLeaseWait).
	// Sent only by the waiting member, to its side; a node that predates
	// the field skips it (shapes match fields by name).
	LeaseWait time.Duration
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
	SetWireKey[gossipMsg]("troupe.cluster.gossip")
	SetWireKey[gossipStatus]("troupe.cluster.status")
	SetWireKey[downRequest]("troupe.cluster.down")
	SetWireKey[downReply]("troupe.cluster.down-reply")
}

// DownMember asks the cluster member listening at node to down the member
// at member (both in any form [ParseAddr] accepts) and waits for its
// answer: manual downing from outside the cluster, as troupe down does.
// n is any node that can reach node; the member checks n's credentials
// (Config.Secret, TLS, peer credentials) like any peer's, and any peer it
// admits may down members. Errors: the member's answer (such as "not
// found: no such cluster member at …"), or why it could not be asked.
func (n *Node) DownMember(ctx context.Context, node, member string) error {
	addr, err := ParseAddr(node)
	if err != nil {
		return err
	}
	if _, err := ParseAddr(member); err != nil {
		return err
	}
	ref, err := Resolve[clusterMsg](ctx, n, FormatRef(addr, clusterPath))
	if err != nil {
		return fmt.Errorf("no cluster member at %s: %w", addr, err)
	}
	reply, err := Ask(ctx, ref, func(r Ref[downReply]) clusterMsg { return downRequest{Addr: member, ReplyTo: r} })
	if err != nil {
		return err
	}
	if reply.Err != "" {
		return &remoteError{Text: reply.Err}
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
			return &PhiAccrual{FirstHeartbeatEstimate: hb, AcceptableHeartbeatPause: 3 * hb, MinStdDeviation: max(hb/10, time.Millisecond)}
		}
	}
	return c
}

// StartCluster makes n a member of a cluster: it joins through the seeds
// (or starts a new cluster) and runs until [Cluster.Close], the node's
// Close, or this member being downed. n must listen on at least one
// address. A node that uses no registry (no registrar, no etcd) keeps
// its service keys and topics in the cluster while it runs: every
// member holds every member's entries, pushed as they change (see
// [ServiceKey.Register] and [ServiceKey.Watch]).
func StartCluster(ctx context.Context, n *Node, cfg ClusterConfig) (*Cluster, error) {
	if n.lc.isClosed() {
		return nil, ErrNodeClosed
	}
	if len(n.addrList()) == 0 {
		return nil, fmt.Errorf("%w: a cluster member must listen on an address", ErrBadConfig)
	}
	if _, ok := cfg.Downing.(leaseMajority); ok && cfg.Lease == nil {
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
		if seeds, err = clusterSeeds(ctx, n, cfg.Name); err != nil {
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
		leftSeen: map[NodeUID]bool{},
		stop:     make(chan struct{}), done: make(chan struct{}),
	}
	c.watchedBy = c.cfg.MonitoredMembers
	c.watching = newWatching(c.cfg.Detector)
	if !n.disc.discovering() {
		// No registrar and no etcd: the members keep the service keys
		// and topics. (Made before the cluster actor, whose gossip may
		// publish events that reach it.)
		var err error
		if c.recep, err = startReceptionist(c); err != nil {
			return nil, err
		}
	}
	if stop := n.cl.tomb.Swap(nil); stop != nil {
		(*stop)() // (what a cluster closed mid-leave left at the path)
	}
	n.cl.members.Store(n.uid, struct{}{})
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
		n.cl.members.Delete(n.uid)
		if c.recep != nil {
			c.recep.stop()
		}
		return nil, err
	}
	c.mu.Lock() // the actor may already be answering gossip, which reads ref
	c.ref = ref
	c.mu.Unlock()
	n.cl.former.Clear() // (this cluster's members are its own)
	onQuarantine := c.quarantinedBy
	n.cl.quarantinedBy.Store(&onQuarantine)
	onDowned := c.downedBy
	n.cl.downedBy.Store(&onDowned)
	n.cl.cluster.Store(c)
	c.plug = &clusterPlug{leave: c.stepOut, addStats: c.addStats}
	if c.recep != nil {
		c.plug.entries = clusterSource{n, c.recep}
	}
	n.cl.plug.Store(c.plug)
	if c.recep != nil {
		c.recep.adopt()
		n.cl.starts.signal()
	}
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
func clusterSeeds(ctx context.Context, n *Node, name string) ([]Addr, error) {
	if name == "" {
		name = "default"
	}
	srcs, err := n.disc.lookupSources(nil)
	if err != nil {
		return nil, fmt.Errorf("cluster seeds from the registry: %w", err)
	}
	src := srcs[0]
	me := Registration{Name: "troupe.cluster." + name, UUID: UUID(n.uid), Path: clusterPath, Node: n.uid, NodeName: n.name, Addrs: n.Addrs()}
	if src.isLocal() {
		if err := n.registrar.registryRegister(me); err != nil {
			return nil, err
		}
	} else if _, err := src.ask(ctx, regRequest{Op: regOpRegister, Regs: toWire([]Registration{me})}); err != nil {
		return nil, err
	}
	regs, err := src.ask(ctx, regRequest{Op: regOpFind, Name: me.Name})
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

// Close leaves the cluster, as [Cluster.Leave] does, and then stops this
// member's participation. It waits at most the leave wait — a few gossip
// intervals (3, at least 1 s and at most 5 s) — for this member's shards
// to be handed over, and as long again for the leader to move this member
// on; then its entities stop (each after the handler it is running). The
// others see a leave rather than a crash. If the leave could not finish
// (the cluster is split, say), this member moves itself on to exiting as
// it stops (its entities have stopped) and tells every other member it
// reaches; one it does not reach (across a cut) sees it unreachable, and
// learns of it when it reaches the node again. The leader removes it once
// the cluster converges, and shards not handed over in time start
// elsewhere then. Err still reports [ErrClusterStopped]. Its node runs
// on: once the others have removed a member they saw leaving, its node
// is a plain peer of theirs.
// [Cluster.Leave] and [Node.Shutdown] wait longer for the hand-over.
func (c *Cluster) Close() error {
	c.stepOut(context.Background(), nil, false)
	c.once.Do(func() { close(c.stop) })
	<-c.done
	return nil
}

// stepOut hands this member's shards over and leaves, as Close and the
// node's Close and Shutdown do: the hand-over waits at most twice
// HandOffTimeout if patient, else the leave wait; the leave at most the
// leave wait. ctx and hurry cut both short.
func (c *Cluster) stepOut(ctx context.Context, hurry <-chan struct{}, patient bool) {
	wait := c.leaveWait()
	if patient {
		wait = c.handOverWait()
	}
	hctx, hcancel := context.WithTimeout(ctx, wait)
	c.handOverShards(hctx, hurry)
	hcancel()
	lctx, cancel := context.WithTimeout(ctx, c.leaveWait())
	defer cancel()
	if err := c.leaveAndWait(lctx, hurry); err != nil {
		c.n.log.Warn("troupe: stopping without the cluster confirming this member's leave; the others may see it as unreachable", "err", err)
	}
}

// Leave asks the cluster to remove this member gracefully and waits until
// the leader has moved it to exiting and this member has stopped (or ctx
// ends). The others then remove it.
func (c *Cluster) Leave(ctx context.Context) error {
	c.handOverShards(ctx, nil)
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
// member knows. An exiting member may be among them once it has stopped
// (it blocks nothing, and no "unreachable" MemberEvent is published for
// it: its silence is its exit).
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

// ErrMemberDowned is what [Cluster.Err] returns once this member has been
// downed or removed: it can never rejoin with this node's uid, so the
// node must restart (a new uid) to join again.
var ErrMemberDowned = errors.New("troupe: this cluster member was downed; restart its node to join again")

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
		return fmt.Errorf("%w: no such cluster member at %s", ErrNotFound, a)
	}
	c.n.log.Warn("troupe: cluster member downed by hand", "addr", a.String())
	c.publish(events)
	c.gossip()
	return nil
}

// addStats adds the cluster's view to s, a snapshot of the node's Stats
// taken at now (its peers and quarantine already in): each peer's phi,
// what blocks the cluster, and the members as this one sees them.
func (c *Cluster) addStats(s *Stats, now time.Time) {
	c.mu.Lock()
	for i := range s.Peers {
		if d, ok := c.detectors[s.Peers[i].UID].(*PhiAccrual); ok {
			s.Peers[i].Phi = d.suspicion(now)
		}
	}
	unreachable := c.unreachable()
	s.ClusterBlocked = c.blocked.text
	var leader NodeUID
	if l := c.leader(); l != nil {
		leader = l.UID
	}
	for _, m := range c.members {
		reachable := !unreachable[m.UID] && m.Status != MemberRemoved // (a removed member is no longer watched)
		s.Members = append(s.Members, memberStats{Member: *m, Reachable: reachable, Self: m.UID == c.n.uid, Leader: m.UID == leader})
	}
	c.mu.Unlock()
	names := map[NodeUID]string{}
	for _, q := range s.Quarantined {
		names[q.UID] = q.Name
	}
	for _, p := range s.Peers {
		names[p.UID] = p.Name
	}
	for i := range s.Members {
		s.Members[i].Name = names[s.Members[i].UID]
		if s.Members[i].Self {
			s.Members[i].Name = c.n.name
		}
	}
	slices.SortFunc(s.Members, func(a, b memberStats) int { return lowerAddr(a.Member, b.Member) })
}

// handOverWait bounds the hand-over of a leave by Shutdown (Close gives
// it the leave's wait alone): the leave's wait, and twice the longest HandOffTimeout of the member's kinds (a
// move may wait that long for a member's flush, then for its entities).
func (c *Cluster) handOverWait() time.Duration {
	d := c.leaveWait()
	for _, r := range c.shardings.regions() {
		d = max(d, 2*r.handOffTimeout()+c.leaveWait())
	}
	return d
}

// handOverShards has every region of this member give its shards away
// before the member leaves, waiting until they have or ctx ends.
func (c *Cluster) handOverShards(ctx context.Context, hurry <-chan struct{}) {
	select {
	case <-c.done:
		return
	default:
	}
	var wg sync.WaitGroup
	for _, r := range c.shardings.regions() {
		wg.Go(func() { r.handOver(ctx, hurry) })
	}
	wg.Wait()
}

// liveOthers is membership.liveOthers under the cluster's lock.
func (c *Cluster) liveOthers() map[NodeUID]Addr {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.membership.liveOthers()
}

// listable is membership.listable under the cluster's lock.
func (c *Cluster) listable() map[NodeUID]Addr {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.membership.listable()
}
