package troupe

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"
)

func TestLeaseHoldCoversTheOtherSidesDecision(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	cases := []struct {
		stable, unstable, delay, want time.Duration
	}{
		// The defaults: 20 s stable, 15 s unstable, 2 s delay, 20 s call, 10 s standing still.
		{20 * time.Second, 15 * time.Second, 2 * time.Second, 67 * time.Second},
		// The issue's: 1 s stable, 4 s unstable (the floor), 2 s delay, 1 s call, 0.5 s.
		{time.Second, 4 * time.Second, 2 * time.Second, 8500 * time.Millisecond},
		// A short StableAfter still allows a whole second for the call.
		{300 * time.Millisecond, 600 * time.Millisecond, 100 * time.Millisecond, 2150 * time.Millisecond},
	}
	for _, tc := range cases {
		if got := leaseHold(tc.stable, tc.unstable, tc.delay); got != tc.want {
			t.Errorf("leaseHold(%v, %v, %v) = %v, want %v", tc.stable, tc.unstable, tc.delay, got, tc.want)
		}
	}
	// The configured release time is raised to the hold, never lowered.
	n := &Node{cfg: Config{HeartbeatInterval: time.Second}}
	if got := (ClusterConfig{LeaseReleaseAfter: time.Second}).withDefaults(n).LeaseReleaseAfter; got != 67*time.Second {
		t.Errorf("LeaseReleaseAfter 1 s with default timings = %v, want the hold, 67 s", got)
	}
	if got := (ClusterConfig{LeaseReleaseAfter: time.Hour}).withDefaults(n).LeaseReleaseAfter; got != time.Hour {
		t.Errorf("LeaseReleaseAfter 1 h = %v, want 1 h", got)
	}
}

func TestPauseMeter(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	const interval, counted, keep = 20 * time.Millisecond, 250 * time.Millisecond, 8 * time.Second
	var p pauseMeter
	// Turns every 20 ms, one late by 100 ms (not a pause), then one that
	// follows a 3 s stop.
	ends := []int{0, 20, 40, 160, 180, 3180, 3200}
	for i, end := range ends {
		if i > 0 {
			p.turn(at(end), interval, counted, keep)
		}
		p.last = at(end)
	}
	if len(p.pauses) != 1 || !p.pauses[0].from.Equal(at(180)) || !p.pauses[0].to.Equal(at(3180)) {
		t.Fatalf("pauses = %v, want one from 180 ms to 3180 ms", p.pauses)
	}
	for _, tc := range []struct {
		since, now int
		want       time.Duration
	}{
		{0, 3200, 3 * time.Second},             // the whole pause
		{1180, 3200, 2 * time.Second},          // the part inside the window
		{3180, 3200, 0},                        // after it
		{0, 100, 0},                            // before it
		{-8000, 1180, 1000 * time.Millisecond}, // its start
	} {
		if got := p.within(at(tc.since), at(tc.now)); got != tc.want {
			t.Errorf("within(%d ms, %d ms) = %v, want %v", tc.since, tc.now, got, tc.want)
		}
	}
	// Forgotten once older than keep.
	p.last = at(3180 + 7981)
	p.turn(at(3180+8001), interval, counted, keep)
	if len(p.pauses) != 0 {
		t.Errorf("a pause older than keep is remembered: %v", p.pauses)
	}
}

// The minority's leader stands still (a stopped process, a long pause)
// as the split begins, before it notices, for longer than the winner
// holds the lease. When it moves again the lease is free, but it must not take it:
// its own clock no longer says what the other side's did. It downs its
// side instead, and there are never two sides.
func TestAMemberThatStoodStillDoesNotRaceForTheLease(t *testing.T) {
	// Not beside other tests: it sets a package-wide hook
	// (clusterTurnHook) that every cluster would call.
	slowTest(t)
	r := &clusterRig{t: t, f: new(FaultNet)}
	leaseNode := startOn(t, r.f, failConfig("lease", 20*time.Millisecond, 2*time.Second))
	if err := leaseNode.ServeLeases(); err != nil {
		t.Fatal(err)
	}
	serving := time.Now()
	r.addLeaseMembers(func(_ int, node *Node) Lease {
		return NewNodeLease(node, leaseNode.Addrs()[0].String(), "cluster", time.Second)
	})
	t.Cleanup(r.f.Heal)
	r.watchInvariant()
	time.Sleep(time.Until(serving.Add(time.Second))) // a fresh lease server grants nothing for one ttl
	minority := r.members[1]                         // the higher address: it waits LeaseMinorityDelay
	if lowerAddr(minority.Self(), r.members[0].Self()) < 0 {
		minority = r.members[0]
	}
	hold := minority.cfg.LeaseReleaseAfter
	var armed, stalled atomic.Bool
	stall := func(c *Cluster) {
		if c == minority && armed.Load() && stalled.CompareAndSwap(false, true) {
			time.Sleep(hold + time.Second)
		}
	}
	clusterTurnHook.Store(&stall)
	t.Cleanup(func() { clusterTurnHook.Store(nil) })
	armed.Store(true)
	r.f.Partition(r.nodes[0], r.nodes[1])
	waitFor(t, hold+15*time.Second, "the minority to stop", func() bool { return stopped(minority) })
	if !stalled.Load() {
		t.Fatal("the minority never stood still")
	}
	if err := minority.Err(); !errors.Is(err, ErrMemberDowned) {
		t.Errorf("the minority's Err() = %v, want ErrMemberDowned", err)
	}
}

// blindLease is a Lease whose CheckHeld can be made to say no while the
// lease it wraps is still held and kept alive: what a holder sees when a
// renewal takes longer than a fifth of the ttl and then succeeds.
type blindLease struct {
	Lease
	blind atomic.Bool
}

func (l *blindLease) CheckHeld(owner string) bool {
	return !l.blind.Load() && l.Lease.CheckHeld(owner)
}

// A member that took the lease for a split and then finds it no longer
// held (CheckHeld says no) downs its side; its node lives on, and its
// lease client would keep the lease alive for as long as it does (a
// server renews an owner's lease even when it has just run out), so every
// later split would find it held and both sides would down themselves.
// The lease is given back once the hold is over.
func TestALeaseLostInItsHoldIsGivenBack(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	r := &clusterRig{t: t, f: new(FaultNet)}
	leaseNode := startOn(t, r.f, failConfig("lease", 20*time.Millisecond, 2*time.Second))
	if err := leaseNode.ServeLeases(); err != nil {
		t.Fatal(err)
	}
	serving := time.Now()
	server := leaseNode.Addrs()[0].String()
	leases := make([]*blindLease, 2)
	for i := range 2 {
		cfg := clusterCfg(LeaseMajority())
		cfg.DownAllWhenUnstable, cfg.LeaseMinorityDelay = time.Second, 100*time.Millisecond
		node := startOn(t, r.f, failConfig(fmt.Sprintf("m%d", i), 20*time.Millisecond, 2*time.Second))
		leases[i] = &blindLease{Lease: NewNodeLease(node, server, "cluster", time.Second)}
		cfg.Lease = leases[i]
		if i > 0 {
			cfg.Seeds = []string{r.nodes[0].Addrs()[0].String()}
		}
		c, err := StartCluster(ctxT(t, 5*time.Second), node, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		r.nodes, r.members = append(r.nodes, node), append(r.members, c)
	}
	r.waitUp(2)
	t.Cleanup(r.f.Heal)
	time.Sleep(time.Until(serving.Add(time.Second))) // a fresh lease server grants nothing for one ttl
	r.f.Partition(r.nodes[0], r.nodes[1])
	holder := -1
	waitFor(t, 5*time.Second, "a member to take the lease", func() bool {
		for i, c := range r.members {
			c.mu.Lock()
			held := c.leaseHeld
			c.mu.Unlock()
			if held {
				holder = i
				return true
			}
		}
		return false
	})
	h := r.members[holder]
	h.mu.Lock()
	heldUntil := h.leaseAt.Add(h.cfg.LeaseReleaseAfter)
	h.mu.Unlock()
	leases[holder].blind.Store(true)
	waitFor(t, 5*time.Second, "the holder to down its side", func() bool { return stopped(h) })
	if err := h.Err(); !errors.Is(err, ErrMemberDowned) {
		t.Errorf("the holder's Err() = %v, want ErrMemberDowned", err)
	}
	other := NewNodeLease(leaseNode, server, "cluster", time.Second)
	acquire := func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		ok, err := other.Acquire(ctx, "another")
		return err == nil && ok
	}
	// Not before the hold is over: the other side may still be deciding.
	if time.Until(heldUntil) > 500*time.Millisecond && acquire() && time.Until(heldUntil) > 0 {
		t.Fatalf("another owner took the lease %v before the holder's hold ended", time.Until(heldUntil))
	}
	waitFor(t, time.Until(heldUntil)+2*time.Second, "the lease to be free for another owner", acquire)
	if err := other.Release(ctxT(t, time.Second), "another"); err != nil {
		t.Fatal(err)
	}
}
