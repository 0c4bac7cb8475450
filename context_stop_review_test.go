package troupe_test

import (
	"fmt"
	"testing"
	"time"

	"troupe"
)

// A stop can already be out of the mailbox's signal lane when a handler
// first asks for its Context: the actor's goroutine takes every waiting
// signal at once (drainSys) and handles them in order, so a Terminated
// (or a timer, or the Setup of a start or a restart) taken together with
// a stop runs its handler before the stop is handled. Node.Stop has
// returned, the stop no longer waits in the lane (stopPushedLocked does
// not see it) and the actor is not yet stopping: the context made then
// is never cancelled, and a handler that waits on it (as the README
// recommends) holds the actor, and its parent's stop, until the node
// closes. (Review of 755aed8, which covers a stop still in the lane.)
func TestAStopTakenWithASignalStillCancelsTheFirstContext(t *testing.T) {
	t.Parallel()
	n := defaultNode(t, "n")
	gone, err := troupe.Spawn(n, "gone", troupe.Behavior[string]{Receive: func(*troupe.Context[string], string) {}})
	if err != nil {
		t.Fatal(err)
	}
	goneStopped := watchOn(t, n, gone)
	if err := n.Stop(gone); err != nil {
		t.Fatal(err)
	}
	within(t, goneStopped, 10*time.Second, "the watched actor's Terminated")

	watched, proceed := make(chan struct{}), make(chan struct{})
	r, err := troupe.Spawn(n, "late-context-signal", troupe.Behavior[string]{
		Receive: func(c *troupe.Context[string], _ string) {
			c.Watch(gone) // stopped already: its Terminated waits in the lane now
			close(watched)
			<-proceed
		},
		Signal: func(c *troupe.Context[string], s troupe.Signal) {
			if _, ok := s.(troupe.Terminated); ok {
				<-c.Context().Done() // the first call: after the stop
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	stopped := watchOn(t, n, r)
	r.Tell("watch")
	within(t, watched, 10*time.Second, "the watch")
	if err := n.Stop(r); err != nil { // queued behind the Terminated
		t.Fatal(err)
	}
	close(proceed)
	within(t, stopped, 10*time.Second, "the actor's Terminated")
}

// The same with a timer that fell due while the handler ran: its message
// and the stop are taken from the lane together. (The sleep only makes
// the order likely; if the timer fires late the test passes anyway.)
func TestAStopTakenWithATimerStillCancelsTheFirstContext(t *testing.T) {
	t.Parallel()
	n := defaultNode(t, "n")
	running, proceed := make(chan struct{}), make(chan struct{})
	r, err := troupe.Spawn(n, "late-context-timer", troupe.Behavior[string]{
		Receive: func(c *troupe.Context[string], m string) {
			if m == "tick" {
				<-c.Context().Done() // the first call: after the stop
				return
			}
			c.StartTimer("t", time.Millisecond, "tick")
			close(running)
			<-proceed
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	stopped := watchOn(t, n, r)
	r.Tell("block")
	within(t, running, 10*time.Second, "the handler to run")
	time.Sleep(200 * time.Millisecond) // the timer falls due: its signal waits
	if err := n.Stop(r); err != nil {
		t.Fatal(err)
	}
	close(proceed)
	within(t, stopped, 10*time.Second, "the actor's Terminated")
}

// The same for Setup: Spawn pushes the start, a stop right after it (a
// parent stopping just after it spawned the child, Node.Stop) is taken
// with it, and a Setup that waits on its context (a dial, a query) holds
// the actor until the node closes. The order is likely, not forced: the
// actor's goroutine must not have taken the start before the stop came.
func TestAStopRightAfterSpawnCancelsSetupsContext(t *testing.T) {
	t.Parallel()
	n := defaultNode(t, "n")
	for i := range 20 {
		r, err := troupe.Spawn(n, "", troupe.Behavior[string]{
			Setup: func(c *troupe.Context[string]) {
				<-c.Context().Done()
			},
			Receive: func(*troupe.Context[string], string) {},
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := n.Stop(r); err != nil {
			t.Fatal(err)
		}
		within(t, watchOn(t, n, r), 10*time.Second, fmt.Sprintf("the Terminated of actor %d", i))
	}
}
