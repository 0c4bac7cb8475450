package troupe

import (
	"cmp"
	"context"
	"errors"
	"time"
)

// How a cluster uses its lease (LeaseMajority), and why it is safe.
//
// The side that acquires the lease downs the other side, which is
// partitioned away and may never hear it. That side is still running its
// own decision: it notices the split (within StableAfter of this side, we
// assume: StableAfter is the margin for the difference), waits until its
// view is stable — at most StableAfter + DownAllWhenUnstable after its
// first unreachable member, when instability makes it down itself —
// waits LeaseMinorityDelay if it is the minority, and asks for the lease
// with a timeout of leaseCallTimeout. So the winner holds the lease for
// at least leaseHold after taking it: by then the other side has been
// denied (the lease was held) or given up (the lease was unreachable), and
// has downed itself. A member whose own process stood still (SIGSTOP, a
// long pause: gaps of StableAfter/4 or more) for more than StableAfter/2
// in all within the last hold does not race for the lease, nor keeps one
// granted after such a pause: its clock no longer says what the other
// side's did. The hold has StableAfter/2 more for that.
// A holder that loses the lease while holding it downs its own side.

// leaseCallTimeout bounds one lease call of a downing decision.
func leaseCallTimeout(stableAfter time.Duration) time.Duration {
	return max(stableAfter, time.Second)
}

// leaseHold is the least time a side that took the lease keeps it: the
// other side's whole decision time, with StableAfter as the margin for
// when each side noticed the split, and StableAfter/2 for the time the
// other side's process may have stood still (pauseBudget).
func leaseHold(stableAfter, unstableAfter, minorityDelay time.Duration) time.Duration {
	return stableAfter + unstableAfter + minorityDelay + leaseCallTimeout(stableAfter) + stableAfter/2
}

// pauseMeter remembers when this member's loop stood still for longer
// than it should, to tell how much of a recent window it missed.
type pauseMeter struct {
	last      time.Time // when the loop last finished a turn
	turnStart time.Time // when the current turn began
	decided   bool      // the current turn raced for the lease: its wait is no pause
	pauses    []pause
}

type pause struct{ from, to time.Time }

// turn records a turn of the loop that began at now, after the previous
// one ended at p.last: a gap of at least counted beyond the loop's
// interval is a pause. Pauses older than keep are forgotten.
func (p *pauseMeter) turn(now time.Time, interval, counted, keep time.Duration) {
	if !p.last.IsZero() && now.Sub(p.last)-interval >= counted {
		p.pauses = append(p.pauses, pause{p.last, now})
	}
	for len(p.pauses) > 0 && now.Sub(p.pauses[0].to) > keep {
		p.pauses = p.pauses[1:]
	}
}

// within is how long the loop stood still in (since, now].
func (p *pauseMeter) within(since, now time.Time) time.Duration {
	var d time.Duration
	for _, q := range p.pauses {
		from, to := q.from, q.to
		if from.Before(since) {
			from = since
		}
		if to.After(now) {
			to = now
		}
		if to.After(from) {
			d += to.Sub(from)
		}
	}
	return d
}

// pauseBudget is how long a member may have stood still within the last
// hold and still race for the lease.
func (c *Cluster) pauseBudget() time.Duration { return c.cfg.StableAfter / 2 }

// meterPause is called at the start of each turn of the loop, with the
// clock's time; c.paused.last is set at the end of each turn.
func (c *Cluster) meterPause(now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.paused.turn(now, c.cfg.GossipInterval, c.cfg.StableAfter/4, c.cfg.LeaseReleaseAfter)
	c.paused.turnStart, c.paused.decided = now, false
}

// turnDone marks the end of a turn of the loop; a turn that took
// StableAfter/4 or more, and did not race for the lease, stood still.
func (c *Cluster) turnDone() {
	c.mu.Lock()
	defer c.mu.Unlock()
	end := time.Now()
	if p := &c.paused; !p.decided && !p.turnStart.IsZero() && end.Sub(p.turnStart) >= c.cfg.StableAfter/4 {
		p.pauses = append(p.pauses, pause{p.turnStart, end})
	}
	c.paused.last = end
}

// decide runs the strategy on a clean split; LeaseMajority races for the
// lease.
func (c *Cluster) decide(s DowningStrategy, v SplitView) Downing {
	if _, ok := s.(leaseMajority); !ok {
		return s.Decide(v)
	}
	start := time.Now()
	c.mu.Lock()
	if ts := c.paused.turnStart; !ts.IsZero() && start.Sub(ts) >= c.cfg.StableAfter/4 {
		// This turn stood still before it got here.
		c.paused.pauses = append(c.paused.pauses, pause{ts, start})
	}
	c.paused.decided = true
	stood := c.paused.within(start.Add(-c.cfg.LeaseReleaseAfter), start)
	c.mu.Unlock()
	if stood > c.pauseBudget() {
		c.n.log.Warn("troupe: this process stood still during the split; the other side may have decided meanwhile, so this side downs itself",
			"stood", stood.String())
		return DownReachable
	}
	delay := time.Duration(0)
	if minorityDelay(v) {
		delay = c.cfg.LeaseMinorityDelay
		t := time.NewTimer(delay)
		defer t.Stop()
		select {
		case <-t.C:
		case <-c.stop:
			return DownReachable
		case <-c.n.lc.done:
			return DownReachable
		}
	}
	// A release of this member's earlier hold still on its way must land
	// first, or it would give up the lease about to be granted.
	c.mu.Lock()
	releasing := c.releasing
	c.mu.Unlock()
	if releasing != nil {
		select {
		case <-releasing:
		case <-c.stop:
			return DownReachable
		case <-c.n.lc.done:
			return DownReachable
		}
	}
	callTimeout := leaseCallTimeout(c.cfg.StableAfter)
	owner := c.n.uid.String()
	acquired, waited, err := c.acquireLease(owner, callTimeout, delay)
	delay += waited
	if err != nil {
		c.n.log.Warn("troupe: could not reach the lease; downing this side", "err", err)
		return DownReachable
	}
	if !acquired {
		c.n.log.Warn("troupe: the lease was denied (the other side holds it); downing this side")
		return DownReachable
	}
	if late := time.Since(start) - delay - callTimeout; stood+late > c.pauseBudget() {
		// The answer came, but this process stood still on the way: the
		// other side's hold may have ended before the lease was granted.
		c.n.log.Warn("troupe: the lease was granted after this process stood still; giving it back and downing this side", "took", late.String())
		c.releaseLease(owner)
		return DownReachable
	}
	lost := c.cfg.Lease.Lost() // (user code: not under c.mu)
	c.mu.Lock()
	c.leaseHeld, c.leaseAt, c.leaseDowned, c.leaseLost = true, time.Now(), nil, lost
	c.mu.Unlock()
	return leaseDecision(true)
}

// acquireLease asks for the lease with a timeout of callTimeout. A lease
// that nobody holds but that cannot be granted yet (a lease server that
// has just started: [LeaseWaitError]) is asked again once it can be, and
// a side that waited its minority delay before asking waits it again
// then, so that the majority still asks first. It returns how long it
// waited so. (Both sides wait for the same moment and then race as they
// would have, so the hold still covers the other side's decision.) It
// gives up, returning the LeaseWaitError, when the wait would end more
// than maxLeaseWait after it first asked (the time, not the sum of the
// waits asked for: calls take time too), or says no time at all (a
// custom Lease's: asking again at once could go on for ever).
func (c *Cluster) acquireLease(owner string, callTimeout, delay time.Duration) (acquired bool, waited time.Duration, err error) {
	first := time.Now()
	limit := cmp.Or(c.leaseWaitLimit, maxLeaseWait)
	for {
		ctx, cancel := context.WithTimeout(c.n.lc.ctx, callTimeout)
		go func() { // Close does not wait for the call
			select {
			case <-c.stop:
				cancel()
			case <-ctx.Done():
			}
		}()
		acquired, err = c.cfg.Lease.Acquire(ctx, owner) // (user code: not under c.mu)
		cancel()
		var notYet *LeaseWaitError
		if !errors.As(err, &notYet) {
			return acquired, waited, err
		}
		if notYet.Wait <= 0 || time.Since(first)+notYet.Wait > limit {
			return false, waited, err
		}
		d := notYet.Wait + delay
		c.n.log.Info("troupe: the lease cannot be granted yet (its server has just started); asking again then", "in", d.String())
		c.announceLeaseWait(d + callTimeout)
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-c.stop:
			t.Stop()
			return false, waited, ErrClusterStopped
		case <-c.n.lc.done:
			t.Stop()
			return false, waited, ErrNodeClosed
		}
		waited += d
	}
}

// announceLeaseWait tells every member of this side that this member
// waits for the lease and will have decided within d, so that they do
// not down themselves meanwhile for a split unstable too long (the
// others, not leading, would: see membership.heardLeaseWait). It goes
// straight to each, not by gossip: this member's loop is waiting.
func (c *Cluster) announceLeaseWait(d time.Duration) {
	c.mu.Lock()
	msg := gossipStatus{From: c.self, Digest: c.digested, ReplyTo: c.ref, LeaseWait: d}
	var to []Addr
	for _, m := range c.splitView().Reachable {
		if m.UID != c.self {
			to = append(to, m.Addr)
		}
	}
	c.mu.Unlock()
	for _, a := range to {
		c.tell(a, msg)
	}
}

// lostLease is the held lease's Lost channel, or nil.
func (c *Cluster) lostLease() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.leaseHeld {
		return nil
	}
	return c.leaseLost
}

// leaseLostInHold: the lease this member took for a decision was lost
// before the other side must have stopped. That side may take it now and
// down this one, so this side downs itself: no side at all is better than
// two. The lease is given back once the hold is over: CheckHeld says no
// as soon as a renewal is late, while the client may still hold it and
// keep it alive for as long as this node runs, which would deny every
// later split to both sides.
func (c *Cluster) leaseLostInHold() {
	c.mu.Lock()
	if !c.leaseHeld {
		c.mu.Unlock()
		return
	}
	c.releaseLeaseAfterLocked(c.n.uid.String(), time.Until(c.leaseAt.Add(c.cfg.LeaseReleaseAfter)))
	c.leaseHeld, c.leaseDowned, c.leaseLost = false, nil, nil
	side := c.ownSide()
	events := c.down(side, time.Now())
	c.mu.Unlock()
	c.n.log.Warn("troupe: the cluster lease was lost while the other side may still be deciding; downing this side", "members", len(side))
	c.publish(events)
	c.gossip()
}

// releaseLeaseLocked gives the lease back once what it was taken for is
// done: ClusterConfig.LeaseReleaseAfter has passed since it was taken
// (the other side has decided by then) and every member downed under it
// is removed. Holding it longer would let this side win the next split by
// an old victory.
func (c *Cluster) releaseLeaseLocked(now time.Time) {
	if !c.leaseHeld || now.Sub(c.leaseAt) < c.cfg.LeaseReleaseAfter {
		return
	}
	for _, d := range c.leaseDowned {
		if m := c.members[d.UID]; m != nil && m.Status != MemberRemoved {
			return
		}
	}
	c.leaseHeld, c.leaseDowned, c.leaseLost = false, nil, nil
	c.releaseLeaseAfterLocked(c.n.uid.String(), 0)
}

// releaseLease gives the lease up on a goroutine of the node's.
func (c *Cluster) releaseLease(owner string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.releaseLeaseAfterLocked(owner, 0)
}

// releaseLeaseAfterLocked gives the lease up on a goroutine of the
// node's, after wait; c.releasing is closed once it is done.
func (c *Cluster) releaseLeaseAfterLocked(owner string, wait time.Duration) {
	lease, timeout := c.cfg.Lease, leaseCallTimeout(c.cfg.StableAfter)
	done := make(chan struct{})
	c.releasing = done
	c.n.wg.Go(func() {
		defer close(done)
		if wait > 0 {
			t := time.NewTimer(wait)
			defer t.Stop()
			select {
			case <-t.C:
			case <-c.n.lc.done:
				return // NewNodeLease's keep-alive ends with the node, and the lease expires by its TTL (another Lease's, when its owner closes it)
			}
		}
		ctx, cancel := context.WithTimeout(c.n.lc.ctx, timeout)
		defer cancel()
		if err := lease.Release(ctx, owner); err != nil {
			c.n.log.Warn("troupe: could not release the cluster lease", "err", err)
		}
	})
}

// keepLeaseThroughHold: this member stops while holding the lease for a
// decision; it is released once the hold has passed, not before (the
// other side may still be deciding), nor never (it would decide the next
// split).
func (c *Cluster) keepLeaseThroughHold() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.leaseHeld {
		c.leaseHeld, c.leaseDowned, c.leaseLost = false, nil, nil
		c.releaseLeaseAfterLocked(c.n.uid.String(), time.Until(c.leaseAt.Add(c.cfg.LeaseReleaseAfter)))
	}
}

// LeaseMajority returns the downing strategy that lets a lease decide:
// the side that acquires [ClusterConfig.Lease] downs the other; the
// minority side (more than half of the members, up or leaving, are
// unreachable from it, or exactly half and the lowest address is among
// them) waits [ClusterConfig.LeaseMinorityDelay] before trying, so the
// majority wins a fair race; a side that cannot acquire it — including
// when the lease is unreachable — downs itself. Never two surviving
// sides. Its Decide, the rule without a lease, is only used when the
// lease cannot be consulted, and then downs this side.
func LeaseMajority() DowningStrategy { return leaseMajority{} }

type leaseMajority struct{}

func (leaseMajority) String() string { return "LeaseMajority()" }

func (leaseMajority) Decide(SplitView) Downing { return DownReachable }
