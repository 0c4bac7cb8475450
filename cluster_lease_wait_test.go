package troupe

import (
	"context"
	"reflect"
	"sync/atomic"
	"testing"
	"time"
)

// scriptedLease answers Acquire as script says for the call's number
// (from 0), after taking took.
type scriptedLease struct {
	took   time.Duration
	script func(n int) (bool, error)
	calls  atomic.Int32
	lost   chan struct{}
}

func (l *scriptedLease) Acquire(ctx context.Context, _ string) (bool, error) {
	n := int(l.calls.Add(1) - 1)
	select {
	case <-time.After(l.took):
	case <-ctx.Done():
		return false, ctx.Err()
	}
	return l.script(n)
}
func (l *scriptedLease) Release(context.Context, string) error { return nil }
func (l *scriptedLease) CheckHeld(string) bool                 { return true }
func (l *scriptedLease) Lost() <-chan struct{}                 { return l.lost }

// decideWithLease runs a lone member's lease decision on a clean split
// in which it is the majority, and returns what it decided, failing
// the test if that takes longer than within.
func decideWithLease(t *testing.T, l *scriptedLease, limit, within time.Duration) Downing {
	t.Helper()
	l.lost = make(chan struct{})
	r := &clusterRig{t: t, f: new(FaultNet)}
	cfg := clusterCfg(LeaseMajority())
	cfg.StableAfter = time.Second
	cfg.Lease = l
	c := r.add("m0", cfg)
	if limit > 0 {
		c.leaseWaitLimit = limit
	}
	done := make(chan Downing, 1)
	go func() { done <- c.decide(LeaseMajority(), SplitView{Reachable: []Member{c.Self()}}) }()
	select {
	case d := <-done:
		return d
	case <-time.After(within):
		t.Fatalf("the decision took more than %v (%d lease calls)", within, l.calls.Load())
		return 0
	}
}

// A Lease whose LeaseWaitError says no time at all (a custom one) made
// the decision ask again at once, for ever: the side leader neither won
// nor downed itself. It is an answer that cannot be waited on: the side
// downs itself.
func TestALeaseWaitOfNoTimeIsNotWaitedOn(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	l := &scriptedLease{script: func(int) (bool, error) { return false, &LeaseWaitError{} }}
	if d := decideWithLease(t, l, 0, 5*time.Second); d != DownReachable {
		t.Fatalf("decided %v, want DownReachable", d)
	}
}

// maxLeaseWait bounds the time waited, not the sum of the waits the
// lease asked for: a lease that keeps asking for a moment, each call
// taking longer than that, was asked again long past it.
func TestMaxLeaseWaitBoundsTheTimeWaited(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	l := &scriptedLease{took: 20 * time.Millisecond, script: func(int) (bool, error) {
		return false, &LeaseWaitError{Wait: time.Millisecond}
	}}
	start := time.Now()
	if d := decideWithLease(t, l, 300*time.Millisecond, 5*time.Second); d != DownReachable {
		t.Fatalf("decided %v, want DownReachable", d)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("gave up after %v (%d lease calls), want about the limit, 300ms", took, l.calls.Load())
	}
}

// A lease granted after one wait, the calls quick: the side wins, and
// its wait is not taken for a pause.
func TestALeaseWaitedForIsWon(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	slowTest(t)
	l := &scriptedLease{took: 10 * time.Millisecond, script: func(n int) (bool, error) {
		if n == 0 {
			return false, &LeaseWaitError{Wait: 1500 * time.Millisecond}
		}
		return true, nil
	}}
	if d := decideWithLease(t, l, 0, 10*time.Second); d != leaseDecision(true) {
		t.Fatalf("decided %v, want leaseDecision(true)", d)
	}
	if n := l.calls.Load(); n != 2 {
		t.Fatalf("%d lease calls, want 2", n)
	}
}

// leaseReplyV1 is leaseReply as the release before Wait had it.
type leaseReplyV1 struct {
	Granted bool
	Owner   string
}

func init() {
	if err := registerType(reflect.TypeFor[leaseReplyV1](), "troupe.test.lease.reply.v1", nil); err != nil {
		panic(err)
	}
}

// A lease reply crosses between this release and the one before: Wait is
// skipped by the earlier receiver, and zero from the earlier sender (a
// plain refusal, as that release meant it).
func TestALeaseReplyCrossesReleases(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	old, err := sendAs[leaseReplyV1](t, leaseReply{Granted: false, Owner: "", Wait: time.Second})
	if err != nil || old != (leaseReplyV1{}) {
		t.Fatalf("to the earlier release: %+v, %v", old, err)
	}
	cur, err := sendAs[leaseReply](t, leaseReplyV1{Granted: false, Owner: "b"})
	if err != nil || cur != (leaseReply{Owner: "b"}) {
		t.Fatalf("from the earlier release: %+v, %v", cur, err)
	}
}
