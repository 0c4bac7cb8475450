package troupe

import (
	"cmp"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync/atomic"
	"time"
)

// clusterTurnHook is for tests alone (set from an internal _test.go file,
// nil otherwise): when set, it runs at the start of every turn of every
// member's loop in the process, given the member.
var clusterTurnHook atomic.Pointer[func(*Cluster)]

// run is the member's one goroutine: it gossips, feeds the failure
// detectors, moves members through their statuses when leader, and applies
// the downing strategy.
func (c *Cluster) run() {
	defer close(c.done)
	closed := false // by Close, before this member stopped of itself
	defer func() { c.cleanup(closed) }()
	t := time.NewTicker(c.cfg.GossipInterval)
	defer t.Stop()
	for {
		select {
		case <-c.stop:
			select {
			case <-c.n.lc.done: // the node closes too: it falls silent
			default:
				closed = true
			}
			return
		case <-c.n.lc.done:
			return
		case <-c.lostLease():
			c.leaseLostInHold()
		case <-t.C:
			// The tick's value is when it was due, which after a long
			// turn or a stopped process is in the past: decide on the
			// clock.
			now := time.Now()
			c.meterPause(now)
			if h := clusterTurnHook.Load(); h != nil {
				(*h)(c) // tests: the loop stands still here
			}
			c.detect(now)
			c.lead()
			if c.downing(now) {
				return
			}
			c.gossip()
			c.tellDowned(now)
			if c.recep != nil {
				c.recep.tick()
			}
			c.knock()
			c.turnDone()
		}
	}
}

func (c *Cluster) cleanup(closed bool) {
	c.keepLeaseThroughHold()
	c.n.cl.quarantinedBy.Store(nil)
	c.n.cl.downedBy.Store(nil)
	c.n.cl.beat.Store(nil)
	c.n.cl.plug.CompareAndSwap(c.plug, nil) // (a cluster started since has its own)
	if c.n.cl.cluster.CompareAndSwap(c, nil) {
		c.n.lc.clusterEnded.Store(true)
	}
	if c.recep != nil {
		c.recep.stop()
	}
	c.shardings.end() // (entities stop before their coordinator hands over)
	c.singletons.stop(c.n)
	if closed {
		c.farewell()
	}
	c.mu.Lock()
	c.stopped = true
	tomb := c.closedMidLeave
	uids := make([]NodeUID, 0, len(c.members))
	var former []NodeUID // (the live members, which may not know)
	for uid, m := range c.members {
		uids = append(uids, uid)
		if tomb && uid != c.self && live(m) && m.Status < MemberExiting {
			former = append(former, uid)
		}
	}
	c.mu.Unlock()
	for _, uid := range former {
		c.n.cl.former.Store(uid, struct{}{}) // (before the exemption as a member ends)
	}
	for _, uid := range uids {
		c.n.cl.members.Delete(uid)
	}
	if tomb {
		// Its actor stays, answering the members that did not hear the
		// farewell (across a cut) with it when they knock (receive);
		// a cluster started next on this node stops it first.
		ref := c.ref
		stop := func() { stopAndWait(c.n, ref) }
		c.n.cl.tomb.Store(&stop)
	} else {
		stopAndWait(c.n, c.ref) // a cluster started next on this node takes its path
	}
	if c.cfg.SeedsFromRegistry {
		name := "troupe.cluster." + cmp.Or(c.cfg.Name, "default")
		if c.n.registrar.reg() != nil {
			c.n.registrar.reg().unregister(name, UUID(c.n.uid), c.n.uid)
		}
		for _, a := range c.n.disc.remoteRegistrars() {
			c.n.disc.tellRegistrar(a, regRequest{Op: regOpUnregister, Regs: []regWire{{Name: name, UUID: UUID(c.n.uid)}}})
		}
	}
}

// farewell moves this member on to exiting, its cluster closed before its
// leave finished (nothing of it runs any more: its entities and
// singletons have stopped), and tells every other member so. Its node
// may run on, answering heartbeats: the others would never find it
// unreachable, and a member that never again says it holds a state keeps
// the cluster from converging, and so from removing anyone, for as long
// as it runs. Exiting, as at the end of a leave, it counts no more: the
// leader removes it, and the others keep its node as a plain peer
// (forgetDowned). Those it does not reach (across a cut) hear it from
// what it leaves answering at its path (cleanup, receive).
func (c *Cluster) farewell() {
	c.mu.Lock()
	self := c.members[c.self]
	if self.Status >= MemberExiting {
		c.mu.Unlock()
		return // its leave finished, or it is down already
	}
	self.Status = MemberExiting // (no event: Close's caller knows, and a subscriber that closed again would wait for this goroutine)
	c.touched(time.Now())
	c.closedMidLeave = true
	g := c.snapshot()
	var addrs []Addr
	uids, entries := c.memberOrder()
	for i, uid := range uids {
		if m := entries[i]; uid != c.self && live(m) {
			addrs = append(addrs, m.Addr)
		}
	}
	c.mu.Unlock()
	c.n.log.Warn("troupe: the cluster was closed before this member's leave finished; it tells the others it is exiting", "told", len(addrs))
	for _, a := range addrs {
		c.tell(a, g)
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
	if c.stopped {
		knows := s.Digest == c.digested // (the final state)
		former := c.closedMidLeave
		c.mu.Unlock()
		if former {
			c.answerFormer(s.From, s.ReplyTo, knows)
		}
		return
	}
	m := c.members[s.From]
	if s.LeaseWait > 0 {
		limit := maxLeaseWait + c.cfg.LeaseMinorityDelay + leaseCallTimeout(c.cfg.StableAfter)
		c.heardLeaseWait(s.From, s.LeaseWait, c.cfg.StableAfter/2, limit, time.Now())
	}
	same := s.Digest == c.digested
	if same && m != nil {
		c.heldBy(s.From, s.Seen)
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

// answerFormer answers a member that knocks on this stopped cluster, closed
// mid-leave (what cleanup left at its path): one that does not know this
// member is exiting gets the final state; one that knows needs no
// exemption from quarantine any more.
func (c *Cluster) answerFormer(from NodeUID, replyTo Ref[clusterMsg], knows bool) {
	if knows {
		c.n.cl.former.Delete(from)
		return
	}
	c.mu.Lock()
	m := c.members[from]
	var final gossipMsg
	if m != nil {
		final = c.snapshot()
		final.ReplyTo = c.ref
	}
	c.mu.Unlock()
	if m != nil {
		c.reply(replyTo, m.Addr, final)
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

// knock sends this member's state to the seeds while it knows no member
// that can admit it (none up or leaving): knowing only other joiners — ones
// that joined through it, say — is still being alone, and none of them
// will ever carry this member's state to the cluster.
func (c *Cluster) knock() {
	c.mu.Lock()
	alone := true
	for _, m := range c.members {
		alone = alone && !m.counts()
	}
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
func (c *Cluster) tell(addr Addr, msg clusterMsg) { tellMember(c.n, addr, clusterPath, msg) }

// tellMember tells msg to the actor at path on the member at addr, if
// the association to it is up; it reports whether it was (the
// association is dialed if there is none: members keep knocking).
func tellMember[T any](n *Node, addr Addr, path string, msg T) bool {
	r, ok := memberRef[T](n, addr, path)
	if ok {
		r.Tell(msg)
	}
	return ok
}

// memberRef returns a ref to the actor at path on the member at addr, if
// the association to it is up (dialing it if there is none).
func memberRef[T any](n *Node, addr Addr, path string) (Ref[T], bool) {
	a, err := n.peers.assocFor(addr)
	if err != nil {
		return Ref[T]{}, false
	}
	t := a.lockTarget()
	up := t.life.state == assocUp
	var peer NodeUID
	if up {
		peer = t.peer.uid // written by the handshake before it set the state, under mu
	}
	t.mu.Unlock()
	if !up {
		return Ref[T]{}, false // still dialing (or gone): knock again next round
	}
	return Ref[T]{h: &handle{node: n, key: refKey{node: peer, path: path}, assoc: a}}, true
}

// quarantinedBy hears that the peer uid refused this node because it
// has quarantined it. If uid is a current member (up or leaving), this
// member can never be heard by it again: it downs itself, and only
// itself (Akka's rule for a member quarantined by a remote).
func (c *Cluster) quarantinedBy(uid NodeUID) {
	c.downedSelf(uid, "troupe: a cluster member has quarantined this node; downing this member")
}

// downedBy hears, from a hello's notice, that the peer uid's cluster
// downed this member (cluster_downed.go): if uid is a current member, it
// downs itself, unless it is on its way out already (leaving or exiting:
// a member that missed its leave may take its removal for a downing). It
// runs on the handshake's goroutine, as quarantinedBy runs on the dial's;
// the events it publishes reach their subscribers from there.
func (c *Cluster) downedBy(uid NodeUID) {
	c.mu.Lock()
	leaving := c.members[c.self].Status >= MemberLeaving
	c.mu.Unlock()
	if !leaving {
		c.downedSelf(uid, "troupe: a cluster member says its side downed this member; downing this member")
	}
}

// downedSelf downs this member, and only it, if uid is another current
// member (up or leaving) and this one is not down already.
func (c *Cluster) downedSelf(uid NodeUID, why string) {
	c.mu.Lock()
	m, self := c.members[uid], c.members[c.self]
	if c.stopped || uid == c.self || m == nil || !m.counts() || self.Status >= MemberDown {
		c.mu.Unlock()
		return
	}
	events := c.down([]Member{*self}, time.Now())
	c.mu.Unlock()
	c.n.log.Warn(why, "by", m.Addr.String())
	c.publish(events)
}

// tellDowned tells the members this one remembers downed that they are
// down, if it leads its side (cluster_downed.go).
func (c *Cluster) tellDowned(now time.Time) {
	c.mu.Lock()
	var due []downedTarget
	if l := c.leader(); !c.stopped && l != nil && l.UID == c.self {
		due = c.downed.due(now, c.cfg.GossipInterval/2, func(a Addr) bool {
			for _, m := range c.members {
				if m.Addr == a && m.Status < MemberDown {
					return true // (a later incarnation holds the address)
				}
			}
			return false
		})
	}
	c.mu.Unlock()
	for _, t := range due {
		c.n.wg.Go(func() {
			answered, dialed := c.n.peers.tellDowned(t.addr, t.uid)
			c.mu.Lock()
			c.downed.done(t.uid, time.Now(), answered, dialed)
			c.mu.Unlock()
		})
	}
}

// receive merges a gossiped state into this member's.
func (c *Cluster) receive(g gossipMsg) {
	c.mu.Lock()
	if c.stopped {
		former := c.closedMidLeave
		c.mu.Unlock()
		if former {
			knows := slices.ContainsFunc(g.Members, func(m gossipMember) bool {
				return m.UID == c.self && MemberStatus(m.Status) >= MemberExiting
			})
			c.answerFormer(g.From, g.ReplyTo, knows)
		}
		return
	}
	now := time.Now()
	out := c.merge(g, now)
	pass := out.changed && c.passOn(now, c.cfg.GossipInterval)
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
	var joined []NodeUID // (one first heard of as down or removed is no member of this node's: its node, if it runs, is a plain peer)
	for _, uid := range out.added {
		if live(c.members[uid]) {
			joined = append(joined, uid)
		}
	}
	c.mu.Unlock()
	if out.confirm && sender != nil {
		c.reply(g.ReplyTo, sender.Addr, confirm) // so that it counts this member as having seen it
	}
	for _, uid := range joined {
		c.n.cl.members.Store(uid, struct{}{})
	}
	for _, uid := range out.ended {
		c.n.log.Info("troupe: cluster member restarted; its earlier incarnation is downed", "uid", uid.String())
		c.n.peers.endMemberAssoc(uid, errors.New("a new incarnation of this cluster member joined at its address"))
	}
	c.publish(out.events)
	if out.tellTo != nil {
		c.reply(g.ReplyTo, out.tellTo.Addr, state)
	}
	if pass {
		c.gossip() // news on at once, not at the next turn (passOn)
	}
}

// detect feeds each member's failure detector the last time anything
// arrived from it, and publishes this member's reachability view.
func (c *Cluster) detect(now time.Time) {
	heard := c.n.peers.heardFrom()

	var events []MemberEvent
	var dial []Addr
	var seen bool  // this member's own view changed
	defer func() { // outside the lock
		c.publish(events)
		if seen && len(events) == 0 && c.recep != nil {
			// The cluster's view is the same, this member's not: its
			// listings follow its own view.
			c.recep.membersChanged()
		}
		for _, a := range dial {
			c.n.peers.assocFor(a)
		}
	}()
	c.mu.Lock()
	defer c.mu.Unlock()
	monitored := c.monitorsOf(c.self, c.cfg.MonitoredMembers, c.ring())
	watchers := c.watchers(c.cfg.MonitoredMembers)
	for uid, m := range c.members {
		if uid != c.self && (m.Status == MemberExiting || m.Status == MemberDown) {
			// Its cluster stops, or has, and its node may run on as a
			// plain peer, which judges this node by its heartbeats.
			watchers[uid] = true
		}
	}
	c.n.cl.beat.Store(&watchers)
	mine, silent := c.watching.turn(monitored, func(uid NodeUID) time.Time {
		if at := heard[uid]; at != 0 {
			return c.n.epoch.Add(time.Duration(at))
		}
		return time.Time{}
	}, now)
	for _, uid := range silent {
		dial = append(dial, c.members[uid].Addr)
	}
	before := c.reach[c.self].version
	events = c.observe(mine, now)
	seen = c.reach[c.self].version != before
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
	case stepOwnView:
		key := c.ownKey()
		view := c.ownView()
		strategy := c.cfg.Downing
		c.mu.Unlock()
		loses := ownViewLoses(strategy, view) // (user code: not under c.mu)
		c.mu.Lock()
		if !loses || c.ownKey() != key {
			// Kept (the wait for DownAllWhenUnstable goes on), or the
			// view moved meanwhile: the next turn looks again.
			if !loses {
				c.ownKept = key
			}
			c.mu.Unlock()
			return false
		}
		c.decided, c.decidedOn = true, c.unreachableKey()
		events := c.down([]Member{self}, time.Now())
		c.mu.Unlock()
		c.publish(events)
		c.n.log.Warn("troupe: the others report this member unreachable and, in its own view, its side loses; downing this member",
			"reachable", len(view.Reachable), "unreachable", len(view.Unreachable), "strategy", strategyName(strategy))
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
		"reachable", len(view.Reachable), "unreachable", len(view.Unreachable), "strategy", strategyName(strategy))
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
	if c.shardings.noteGone(events, c.n.uid) {
		c.shardings.poke() // (before the events: who sees one finds its shards held)
	}
	for _, e := range events {
		if e.Kind == eventMemberStatus && e.Member.UID != c.n.uid {
			c.forgetDowned(e.Member)
		}
		c.n.events.emit(e)
	}
	if c.recep != nil && len(events) > 0 {
		c.recep.membersChanged() // a listing follows membership and reachability
	}
	if len(events) > 0 {
		c.singletons.poke()
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
	c.noteDownedLocked(m, time.Now())
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
		// Its node, if it runs on, is a plain peer from now on: judged
		// by its heartbeats, as it judges this node.
		c.n.cl.members.Delete(m.UID)
		return
	}
	if !c.n.cl.isMember(m.UID) {
		return // first heard of as down or removed: never a member of this node's, its node a plain peer
	}
	c.n.peers.endMemberAssoc(m.UID, fmt.Errorf("%w: cluster member %s was downed", ErrPeerUnreachable, m.Addr))
}

// selfDowned ends this member's membership.
func (c *Cluster) selfDowned(m Member) {
	c.n.log.Info("troupe: this member is no longer in the cluster", "status", m.Status.String())
	c.n.events.emit(MemberEvent{Member: m, Kind: eventMemberStatus})
	if c.cfg.CloseNodeOnDown {
		// Close waits for the node's goroutines, this one among them, so it
		// runs on its own goroutine; it ends when the node is closed.
		go c.n.Close()
	}
}

// strategyName names a downing strategy in the logs: a built-in one as the
// call that made it (StaticQuorum(3)), one of the user's by its String
// method or, without one, its type.
func strategyName(s DowningStrategy) string {
	if st, ok := s.(fmt.Stringer); ok {
		return st.String()
	}
	return fmt.Sprintf("%T", s)
}

// noteDownedLocked records when a member was seen downed (or removed
// without leaving), for the sharding coordinators' margin; entries older
// than two margins are dropped.
func (c *Cluster) noteDownedLocked(m Member, now time.Time) {
	if m.Status != MemberDown && (m.Status != MemberRemoved || c.leftSeen[m.UID]) {
		return
	}
	c.downed.note(m, now, 2*max(c.cfg.LeaseReleaseAfter, time.Duration(c.shardings.maxMargin.Load())))
}

// downs returns when members were lately seen downed.
func (c *Cluster) downs() map[NodeUID]time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.downed.times()
}
