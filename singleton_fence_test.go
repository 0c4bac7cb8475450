package troupe

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

// The pause fence holds back the messages of a supervised instance too:
// the behaviors its factory builds are fenced, at start and after a
// restart (a review found a supervised instance, whose Behavior has no
// Receive of its own, handling messages through a closed fence).
func TestTheFenceHoldsASupervisedInstance(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	cfg := failConfig("m", 20*time.Millisecond, 2*time.Second)
	cfg.Listen = []string{"tcp://127.0.0.1:0"}
	n := startNode(t, cfg)
	dead := make(chan DeadLetter, 16)
	SubscribeChan(n, dead)
	c, err := StartCluster(ctxT(t, 5*time.Second), n, clusterCfg(nil))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var handled atomic.Int64
	seen := make(chan int, 16)
	factory := func() Behavior[testPing] {
		return Supervise(func() Behavior[testPing] {
			return Behavior[testPing]{Receive: func(_ *Context[testPing], m testPing) {
				handled.Add(1)
				seen <- m.N
			}}
		}, RestartOnFailure())
	}
	ref, err := Singleton(c, "fenced", factory, SingletonConfig{})
	if err != nil {
		t.Fatal(err)
	}
	ref.Tell(testPing{N: 1})
	if got := recv(t, seen, "the instance handles a message"); got != 1 {
		t.Fatalf("handled %d", got)
	}
	c.singletons.mu.Lock()
	s := c.singletons.by["fenced"].(*singleton[testPing])
	c.singletons.mu.Unlock()
	s.fence.fenced.Store(true) // as if the loop saw this process stand still
	for i := range 3 {
		ref.Tell(testPing{N: 2 + i})
	}
	for range 3 {
		d := recv(t, dead, "a dead letter for a message the fence held back")
		if !errors.Is(d.Reason, ErrSingletonUnavailable) {
			t.Fatalf("dead letter %+v", d)
		}
	}
	if h := handled.Load(); h != 1 {
		t.Fatalf("the supervised instance handled %d messages through a closed fence", h-1)
	}
}

// The fence's answers: a recent beat lets a message run; a stale one
// waits for the loop's next turn, which tells; a turn that does not come
// in time tells nothing, and the message does not run (a review found it
// ran); a turn whose clock reading predates a pause leaves the beat
// stale.
func TestThePauseFenceAnswers(t *testing.T) {
	t.Parallel()
	never := make(chan struct{})
	f := newPauseFence()
	f.turn(time.Now(), false)
	if !f.mayRun(time.Hour, time.Millisecond, never) {
		t.Fatal("a recent beat: the message should run")
	}
	f.turn(time.Now().Add(-time.Second), false) // the loop read the clock, then stood still
	if f.mayRun(100*time.Millisecond, 10*time.Millisecond, never) {
		t.Fatal("a stale beat and no turn: the message ran")
	}
	go func() {
		time.Sleep(5 * time.Millisecond)
		f.turn(time.Now(), false)
	}()
	if !f.mayRun(100*time.Millisecond, time.Minute, never) {
		t.Fatal("a stale beat, then a turn that saw no pause: the message should run")
	}
	f.turn(time.Now().Add(-time.Second), false)
	go func() {
		time.Sleep(5 * time.Millisecond)
		f.turn(time.Now(), true)
	}()
	if f.mayRun(100*time.Millisecond, time.Minute, never) {
		t.Fatal("a turn that saw a pause: the message ran")
	}
	f.open()
	f.turn(time.Now(), false)
	if !f.mayRun(time.Hour, time.Millisecond, never) {
		t.Fatal("the fence reopened: the message should run")
	}
	done := make(chan struct{})
	close(done)
	f.turn(time.Now().Add(-time.Second), false)
	if f.mayRun(100*time.Millisecond, time.Minute, done) {
		t.Fatal("the cluster stopped while the message waited: it ran")
	}
	// A message waits; the loop's next turn read its clock before the
	// process stood still (its beat is as stale as the message's), and
	// the turn after sees the pause. The stale turn says nothing: the
	// message waits on, and does not run (it did, in a process test
	// beside two CPU burners).
	f.turn(time.Now().Add(-time.Second), false)
	go func() {
		time.Sleep(5 * time.Millisecond)
		f.turn(time.Now().Add(-time.Second), false)
		time.Sleep(5 * time.Millisecond)
		f.turn(time.Now(), true)
	}()
	if f.mayRun(100*time.Millisecond, time.Minute, never) {
		t.Fatal("a turn whose clock reading predates the pause let the message run")
	}
}
