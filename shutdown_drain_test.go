package troupe_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"troupe"
)

type drainJob struct{ N int }

// drainRig starts a node (ShutdownDrain as given) with a parent and its
// child; each handles its first message only once gate opens (or its
// context ends), and counts what it handles with a live context.
type drainRig struct {
	n              *troupe.Node
	parent, child  troupe.Ref[drainJob]
	handled, stale atomic.Int64
	dead           chan troupe.DeadLetter
}

func newDrainRig(t *testing.T, drain bool, gate <-chan struct{}) *drainRig {
	t.Helper()
	n, err := troupe.Start(ctxFor(t), troupe.Config{Name: "drained", ShutdownDrain: drain,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	r := &drainRig{n: n, dead: make(chan troupe.DeadLetter, 1024)}
	troupe.SubscribeChan(n, r.dead)
	work := func(c *troupe.Context[drainJob], m drainJob) {
		if m.N == 0 {
			select {
			case <-gate:
			case <-c.Context().Done():
				return
			}
		}
		if c.Context().Err() != nil {
			r.stale.Add(1)
			return
		}
		r.handled.Add(1)
	}
	childRef := make(chan troupe.Ref[drainJob], 1)
	r.parent, err = troupe.Spawn(n, "parent", troupe.Behavior[drainJob]{
		Setup: func(c *troupe.Context[drainJob]) {
			ch, err := troupe.Spawn(c, "child", troupe.Behavior[drainJob]{Receive: work})
			if err != nil {
				t.Error(err)
			}
			childRef <- ch
		},
		Receive: work,
	})
	if err != nil {
		t.Fatal(err)
	}
	r.child = <-childRef
	return r
}

// fill sends each actor 100 jobs, the first of which holds its handler.
func (r *drainRig) fill() {
	for i := range 100 {
		r.parent.Tell(drainJob{N: i})
		r.child.Tell(drainJob{N: i})
	}
}

// With ShutdownDrain, Shutdown lets every actor, a child as well as its
// parent, handle what its mailbox held when the stop came, with its
// context live; a message sent after that is a dead letter (issue #26:
// "let mailboxes drain, opt-in").
func TestShutdownDrainHandlesWhatTheMailboxesHold(t *testing.T) {
	t.Parallel()
	gate := make(chan struct{})
	r := newDrainRig(t, true, gate)
	r.fill()
	if err := r.n.OnShutdown(troupe.PhaseActors, func(context.Context) error {
		close(gate) // the handlers go on; the stops are queued behind the mailboxes
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := r.n.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if got, stale := r.handled.Load(), r.stale.Load(); got != 200 || stale != 0 {
		t.Fatalf("handled %d of 200 queued jobs with a live context (%d with a cancelled one)", got, stale)
	}
	r.parent.Tell(drainJob{N: 1})
	if d := within(t, r.dead, 5*time.Second, "the dead letter of a job sent after Shutdown"); !errors.Is(d.Reason, troupe.ErrNodeClosed) && !errors.Is(d.Reason, troupe.ErrActorStopped) {
		t.Fatalf("a job sent after Shutdown: %v", d.Reason)
	}
}

// What a draining parent sends its child is drained too: the stop goes
// to the top of the tree, and a parent stops its children once it has
// drained (from the review of #26's drain: each actor drained its own
// mailbox at once, and the child stopped before its parent's jobs came).
func TestShutdownDrainFollowsTheTree(t *testing.T) {
	t.Parallel()
	n, err := troupe.Start(ctxFor(t), troupe.Config{Name: "tree", ShutdownDrain: true,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	gate := make(chan struct{})
	var forwarded, handled atomic.Int64
	var child troupe.Ref[drainJob] // the parent's own state
	set := make(chan struct{})
	parent, err := troupe.Spawn(n, "parent", troupe.Behavior[drainJob]{
		Setup: func(c *troupe.Context[drainJob]) {
			var err error
			if child, err = troupe.Spawn(c, "child", troupe.Behavior[drainJob]{Receive: func(*troupe.Context[drainJob], drainJob) {
				handled.Add(1)
			}}); err != nil {
				t.Error(err)
			}
			close(set)
		},
		Receive: func(c *troupe.Context[drainJob], m drainJob) {
			if m.N == 0 {
				<-gate
			}
			child.Tell(m)
			forwarded.Add(1)
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	within(t, set, 5*time.Second, "the parent's Setup")
	for i := range 10 {
		parent.Tell(drainJob{N: i})
	}
	n.OnShutdown(troupe.PhaseActors, func(context.Context) error { close(gate); return nil })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := n.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if f, h := forwarded.Load(), handled.Load(); f != 10 || h != 10 {
		t.Fatalf("the parent forwarded %d of 10 jobs, the child handled %d", f, h)
	}
}

// A drain longer than a peer's window keeps the node's heartbeats going:
// the peer does not give up on it, and the replies of the drained
// handlers reach it (from the review of #26's drain: heartbeats stopped
// when Shutdown began).
func TestALongDrainKeepsPeersInTouch(t *testing.T) {
	t.Parallel()
	slowTest(t)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	fast := func(name string, drain bool) troupe.Config {
		return troupe.Config{Name: name, Listen: []string{"tcp://127.0.0.1:0"}, Logger: quiet, ShutdownDrain: drain,
			HeartbeatInterval: 50 * time.Millisecond, UnreachableAfter: 500 * time.Millisecond}
	}
	served, err := troupe.Start(ctxFor(t), fast("served", true))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { served.Close() })
	gate := make(chan struct{})
	arrived := make(chan struct{}, 3)
	for i := range 3 {
		if _, err := troupe.Spawn(served, fmt.Sprintf("slow%d", i), troupe.Behavior[adaptedAsk]{Receive: func(c *troupe.Context[adaptedAsk], m adaptedAsk) {
			arrived <- struct{}{}
			select {
			case <-gate:
				m.ReplyTo.Tell("done")
			case <-c.Context().Done(): // (only if the test fails)
			}
		}}); err != nil {
			t.Fatal(err)
		}
	}
	asker, err := troupe.Start(ctxFor(t), fast("asker", false))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { asker.Close() })
	gaveUp := make(chan troupe.PeerUnreachable, 1)
	troupe.SubscribeChan(asker, gaveUp)
	replies := make(chan error, 3)
	for i := range 3 {
		slow, err := troupe.Resolve[adaptedAsk](ctxFor(t), asker, troupe.FormatRef(served.Addrs()[0], fmt.Sprintf("/user/slow%d", i)))
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			_, err := troupe.Ask(ctx, slow, func(r troupe.Ref[string]) adaptedAsk { return adaptedAsk{ReplyTo: r} })
			replies <- err
		}()
	}
	for range 3 {
		within(t, arrived, 5*time.Second, "a handler under way")
	}
	// The drain lasts three of the peer's windows: the handlers run on.
	served.OnShutdown(troupe.PhaseActors, func(context.Context) error {
		time.AfterFunc(1500*time.Millisecond, func() { close(gate) })
		return nil
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := served.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	for range 3 {
		if err := within(t, replies, 10*time.Second, "a reply"); err != nil {
			t.Fatalf("an Ask of a drained handler: %v", err)
		}
	}
	select {
	case e := <-gaveUp:
		if !errors.Is(e.Reason, troupe.ErrPeerLeft) {
			t.Fatalf("the peer gave up on the draining node: %v", e.Reason)
		}
	default:
	}
}

// Without it, each actor stops after the handler it runs: the rest of its
// mailbox is dead letters.
func TestShutdownWithoutDrainStopsAfterTheCurrentHandler(t *testing.T) {
	t.Parallel()
	r := newDrainRig(t, false, nil) // the first handlers return when their contexts end
	r.fill()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := r.n.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if got := r.handled.Load(); got != 0 {
		t.Fatalf("handled %d queued jobs after the stop", got)
	}
	for range 198 {
		d := within(t, r.dead, 5*time.Second, "a dead letter per queued job")
		if !errors.Is(d.Reason, troupe.ErrNodeClosed) && !errors.Is(d.Reason, troupe.ErrActorStopped) && !errors.Is(d.Reason, troupe.ErrParentStopped) {
			t.Fatalf("dead letter: %v", d.Reason)
		}
	}
}

// A drain that ctx cannot wait for ends with ctx: the actors stop as
// without it, and Shutdown says the mailboxes did not drain.
func TestShutdownDrainEndsWithItsContext(t *testing.T) {
	t.Parallel()
	r := newDrainRig(t, true, nil) // the first handlers wait for their contexts
	r.fill()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- r.n.Shutdown(ctx) }()
	err := within(t, done, 10*time.Second, "Shutdown past its context")
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "did not drain") {
		t.Fatalf("Shutdown: %v", err)
	}
	if got := r.handled.Load(); got != 0 {
		t.Fatalf("handled %d jobs behind a handler that never returned", got)
	}
}

type adaptedAsk struct {
	ReplyTo troupe.Ref[string]
}

func init() { troupe.SetWireKey[adaptedAsk]("troupe.test.adapted-ask") }

// An Ask through a message adapter of a local actor ends as soon as the
// actor stops, as an Ask to the actor itself does (issue #26, item 5: the
// Ask waited for its whole deadline).
func TestAnAskThroughAnAdapterEndsWhenItsActorStops(t *testing.T) {
	t.Parallel()
	n := defaultNode(t, "adapted")
	adapters := make(chan troupe.Ref[adaptedAsk], 1)
	if _, err := troupe.Spawn(n, "owner", troupe.Behavior[string]{
		Setup: func(c *troupe.Context[string]) {
			adapters <- troupe.MessageAdapter(c, func(adaptedAsk) string { return "boom" })
		},
		Receive: func(_ *troupe.Context[string], m string) {
			if m == "boom" {
				panic("the request stops the actor")
			}
		},
	}); err != nil {
		t.Fatal(err)
	}
	ad := within(t, adapters, 5*time.Second, "the adapter")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	_, err := troupe.Ask(ctx, ad, func(r troupe.Ref[string]) adaptedAsk { return adaptedAsk{ReplyTo: r} })
	var ae *troupe.AskError
	if !errors.As(err, &ae) || time.Since(start) > 10*time.Second {
		t.Fatalf("an Ask through the adapter of an actor that panicked returned %v after %v", err, time.Since(start))
	}
}
