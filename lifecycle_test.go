package troupe_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"troupe"
)

// blockedOnContext spawns an actor whose handler waits on its
// c.Context(), as the README recommends for blocking calls, and returns
// once the handler is waiting.
func blockedOnContext(t *testing.T, n *troupe.Node) {
	t.Helper()
	waiting := make(chan struct{})
	ref, err := troupe.Spawn(n, "blocked", troupe.Behavior[string]{Receive: func(c *troupe.Context[string], _ string) {
		close(waiting)
		<-c.Context().Done()
	}})
	if err != nil {
		t.Fatal(err)
	}
	ref.Tell("wait")
	within(t, waiting, 10*time.Second, "the handler to wait")
}

// Close and Shutdown end a handler that waits on its actor's context:
// the context is cancelled when closing begins, not after the actors
// stopped (issue #26, defect 1: both hung for ever).
func TestCloseEndsAHandlerWaitingOnItsContext(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"Close", "Shutdown"} {
		t.Run(how, func(t *testing.T) {
			n, err := troupe.Start(context.Background(), troupe.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
			if err != nil {
				t.Fatal(err)
			}
			blockedOnContext(t, n)
			done := make(chan error, 1)
			go func() {
				if how == "Close" {
					done <- n.Close()
					return
				}
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				done <- n.Shutdown(ctx)
			}()
			if err := within(t, done, 10*time.Second, how+" to return"); err != nil {
				t.Fatalf("%s: %v", how, err)
			}
		})
	}
}

// A failure that wraps one of troupe's own errors reaches a remote
// watcher as a failure, with its text (issue #26, defect 7: it arrived as
// a bare ErrActorStopped, Failed() false).
func TestAFailureWrappingASentinelCrossesAsAFailure(t *testing.T) {
	t.Parallel()
	_, a, b := faultPair(t)
	failing, err := troupe.Spawn(b, "failing", troupe.Behavior[string]{Receive: func(c *troupe.Context[string], _ string) {
		c.Fail(fmt.Errorf("downstream gone: %w", troupe.ErrActorStopped))
	}})
	if err != nil {
		t.Fatal(err)
	}
	remote, err := troupe.Resolve[string](ctxFor(t), a, troupe.FormatRef(b.Addrs()[0], "/user/failing"))
	if err != nil {
		t.Fatal(err)
	}
	local := watchOn(t, b, failing)
	got := watchOn(t, a, remote)
	remote.Tell("go")
	for where, ch := range map[string]<-chan troupe.Terminated{"local": local, "remote": got} {
		term := within(t, ch, 10*time.Second, where+" Terminated")
		if !troupe.IsFailure(term.Reason) || !strings.Contains(term.Reason.Error(), "downstream gone") {
			t.Fatalf("%s watcher: Failed() = %v, reason %v", where, troupe.IsFailure(term.Reason), term.Reason)
		}
	}
}

// askReq asks for a reply; Mode says what the actor does with it.
type askReq struct {
	Mode    string
	ReplyTo troupe.Ref[string]
}

func init() { troupe.SetWireKey[askReq]("troupe.test.lifecycle.ask") }

func askable(t *testing.T, n *troupe.Node, name string) troupe.Ref[askReq] {
	t.Helper()
	ref, err := troupe.Spawn(n, name, troupe.Behavior[askReq]{Receive: func(c *troupe.Context[askReq], r askReq) {
		switch r.Mode {
		case "panic":
			panic("no answer for you")
		case "stop":
			c.Stop()
		case "fail":
			c.Fail(errors.New("cannot answer"))
		case "reply-then-stop":
			r.ReplyTo.Tell("bye")
			c.Stop()
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	return ref
}

// An Ask fails at once, with the stop's reason, when its target stops
// before replying — a panic, a failure or a stop, on this node or on
// another (issue #26, defect 5: the caller waited for its whole
// deadline). A reply sent before the stop still wins.
func TestAskFailsWhenItsTargetStops(t *testing.T) {
	t.Parallel()
	_, a, b := faultPair(t)
	for _, where := range []string{"local", "remote"} {
		for _, mode := range []string{"panic", "stop", "fail", "reply-then-stop"} {
			t.Run(where+"/"+mode, func(t *testing.T) {
				name := where + "-" + mode
				target := askable(t, b, name)
				if where == "remote" {
					var err error
					if target, err = troupe.Resolve[askReq](ctxFor(t), a, troupe.FormatRef(b.Addrs()[0], "/user/"+name)); err != nil {
						t.Fatal(err)
					}
				}
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				start := time.Now()
				got, err := troupe.Ask(ctx, target, func(r troupe.Ref[string]) askReq { return askReq{Mode: mode, ReplyTo: r} })
				if took := time.Since(start); took > 10*time.Second {
					t.Fatalf("Ask took %v", took)
				}
				if mode == "reply-then-stop" {
					if err != nil || got != "bye" {
						t.Fatalf("Ask = %q, %v; want the reply", got, err)
					}
					return
				}
				var ae *troupe.AskError
				if !errors.Is(err, troupe.ErrActorStopped) || !errors.As(err, &ae) {
					t.Fatalf("Ask = %q, %v; want an AskError wrapping ErrActorStopped", got, err)
				}
				switch mode {
				case "panic", "fail":
					var term troupe.Terminated
					term.Reason = ae.Reason
					if !troupe.IsFailure(term.Reason) {
						t.Fatalf("reason %v is not a failure", ae.Reason)
					}
				case "stop":
					if ae.Reason != nil {
						t.Fatalf("reason %v for a normal stop", ae.Reason)
					}
				}
			})
		}
	}
}

// A graceful Shutdown lets a handler in progress finish and its reply
// reach the node that asked, before it says goodbye (issue #26, defect 2:
// the goodbye went first, the Ask failed with ErrPeerLeft and the reply
// was a dead letter).
func TestShutdownDeliversTheReplyOfAHandlerInProgress(t *testing.T) {
	t.Parallel()
	_, a, b := faultPair(t)
	started := make(chan struct{})
	if _, err := troupe.Spawn(b, "slowpoke", troupe.Behavior[askReq]{Receive: func(_ *troupe.Context[askReq], r askReq) {
		close(started)
		time.Sleep(300 * time.Millisecond) // the work in progress
		r.ReplyTo.Tell("done")
	}}); err != nil {
		t.Fatal(err)
	}
	ref, err := troupe.Resolve[askReq](ctxFor(t), a, troupe.FormatRef(b.Addrs()[0], "/user/slowpoke"))
	if err != nil {
		t.Fatal(err)
	}
	type answer struct {
		reply string
		err   error
	}
	got := make(chan answer, 1)
	go func() {
		r, err := troupe.Ask(ctxFor(t), ref, func(r troupe.Ref[string]) askReq { return askReq{ReplyTo: r} })
		got <- answer{r, err}
	}()
	within(t, started, 10*time.Second, "the handler to start")
	if err := b.Shutdown(ctxFor(t)); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if ans := within(t, got, 10*time.Second, "the Ask"); ans.err != nil || ans.reply != "done" {
		t.Fatalf("Ask = %q, %v; want the reply", ans.reply, ans.err)
	}
}

// Trees stop as trees (issue #26, defect 6): an actor's PostStop runs,
// and its watchers hear of it, only after all its children, transitively,
// have stopped; so a restart that re-creates a grandchild under its old
// name finds the name free (477 of 1,000 restarts failed with
// ErrNameTaken on main).
func TestTreesStopAsTrees(t *testing.T) {
	t.Parallel()
	n, err := troupe.Start(context.Background(), troupe.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	order := make(chan string, 8)
	leaf := func(name string, inner func(c *troupe.Context[string])) troupe.Behavior[string] {
		return troupe.Behavior[string]{
			Setup:   inner,
			Receive: func(*troupe.Context[string], string) {},
			Signal: func(_ *troupe.Context[string], s troupe.Signal) {
				if _, ok := s.(troupe.PostStop); ok {
					order <- name
				}
			},
		}
	}
	spawnErrs := make(chan error, 16)
	grand := leaf("grandchild", nil)
	child := leaf("child", func(c *troupe.Context[string]) {
		if _, err := troupe.Spawn(c, "grandchild", grand); err != nil {
			spawnErrs <- err
		}
	})
	root, err := troupe.Spawn(n, "root", leaf("root", func(c *troupe.Context[string]) {
		if _, err := troupe.Spawn(c, "child", child); err != nil {
			spawnErrs <- err
		}
	}))
	if err != nil {
		t.Fatal(err)
	}
	stopped := watchOn(t, n, root)
	if err := n.Stop(root); err != nil {
		t.Fatal(err)
	}
	within(t, stopped, 10*time.Second, "the root's Terminated")
	for _, want := range []string{"grandchild", "child", "root"} {
		if got := within(t, order, 10*time.Second, "a PostStop"); got != want {
			t.Fatalf("PostStop of %s, want %s first", got, want)
		}
	}

	// A restarting parent re-creates the tree under the same names.
	const failures = 200
	setups := make(chan struct{}, failures+1)
	parent, err := troupe.Spawn(n, "parent", troupe.Supervise(func() troupe.Behavior[string] {
		return troupe.Behavior[string]{
			Setup: func(c *troupe.Context[string]) {
				if _, err := troupe.Spawn(c, "child", troupe.Behavior[string]{
					Setup: func(c *troupe.Context[string]) {
						if _, err := troupe.Spawn(c, "grandchild", troupe.Behavior[string]{Receive: func(*troupe.Context[string], string) {}}); err != nil {
							spawnErrs <- err
						}
					},
					Receive: func(*troupe.Context[string], string) {},
				}); err != nil {
					spawnErrs <- err
				}
				setups <- struct{}{}
			},
			Receive: func(*troupe.Context[string], string) { panic("again") },
		}
	}, troupe.RestartOnFailure()))
	if err != nil {
		t.Fatal(err)
	}
	within(t, setups, 10*time.Second, "the first Setup")
	for i := range failures {
		parent.Tell("fail")
		within(t, setups, 10*time.Second, fmt.Sprintf("Setup after failure %d", i+1))
	}
	select {
	case err := <-spawnErrs:
		t.Fatalf("a restart could not re-create its tree: %v", err)
	default:
	}
}

// A parent whose child is in a handler waiting on its context stops:
// the stop cancels the child's context at once, so the tree's stop is
// not held up by it.
func TestAParentStopsWhileItsChildWaitsOnItsContext(t *testing.T) {
	t.Parallel()
	n, err := troupe.Start(context.Background(), troupe.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	waiting := make(chan struct{})
	parent, err := troupe.Spawn(n, "parent", troupe.Behavior[string]{
		Setup: func(c *troupe.Context[string]) {
			child, err := troupe.Spawn(c, "child", troupe.Behavior[string]{Receive: func(c *troupe.Context[string], _ string) {
				close(waiting)
				<-c.Context().Done()
			}})
			if err != nil {
				t.Error(err)
				return
			}
			child.Tell("block")
		},
		Receive: func(*troupe.Context[string], string) {},
	})
	if err != nil {
		t.Fatal(err)
	}
	within(t, waiting, 10*time.Second, "the child to wait on its context")
	stopped := watchOn(t, n, parent)
	if err := n.Stop(parent); err != nil {
		t.Fatal(err)
	}
	within(t, stopped, 10*time.Second, "the parent's Terminated")
}

// A handler that first asks for its Context after a stop was pushed to
// it (the stop came while the handler ran, before its first call to
// Context) gets a context that is already done. Found beside two CPU
// burners: TestAParentStopsWhileItsChildWaitsOnItsContext's child closed
// its channel, the parent's stop reached it, and only then did it ask for
// its context, made fresh and never cancelled: the tree never stopped.
func TestAStopBeforeTheFirstContextCallStillCancelsIt(t *testing.T) {
	t.Parallel()
	n := defaultNode(t, "n")
	running, proceed := make(chan struct{}), make(chan struct{})
	r, err := troupe.Spawn(n, "late-context", troupe.Behavior[string]{Receive: func(c *troupe.Context[string], _ string) {
		close(running)
		<-proceed
		<-c.Context().Done()
	}})
	if err != nil {
		t.Fatal(err)
	}
	stopped := watchOn(t, n, r)
	r.Tell("block")
	within(t, running, 10*time.Second, "the handler to run")
	if err := n.Stop(r); err != nil { // pushed while the handler runs
		t.Fatal(err)
	}
	close(proceed)
	within(t, stopped, 10*time.Second, "the actor's Terminated")
}

// Many Asks waiting on one local actor at once all fail with its stop's
// reason when it stops before replying, and an Ask that got its reply
// leaves nothing waiting behind (#33: the asks waiting on an actor are
// held by its mailbox, the first without a map).
func TestManyLocalAsksWaitingOnOneActorAllFailWhenItStops(t *testing.T) {
	t.Parallel()
	n, err := troupe.Start(context.Background(), troupe.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	gate, started := make(chan struct{}), make(chan struct{}, 1)
	var open sync.Once
	release := func() { open.Do(func() { close(gate) }) }
	defer release() // (before Close, should the test fail)
	target, err := troupe.Spawn(n, "busy", troupe.Behavior[askReq]{Receive: func(_ *troupe.Context[askReq], r askReq) {
		if r.Mode == "reply" {
			r.ReplyTo.Tell("ok")
			return
		}
		started <- struct{}{}
		<-gate
		panic("gave up")
	}})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 { // asks that end with their reply, before the others
		if got, err := troupe.Ask(ctxFor(t), target, func(r troupe.Ref[string]) askReq { return askReq{Mode: "reply", ReplyTo: r} }); err != nil || got != "ok" {
			t.Fatalf("Ask = %q, %v", got, err)
		}
	}
	const k = 20
	errs := make(chan error, k+1)
	ask := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, err := troupe.Ask(ctx, target, func(r troupe.Ref[string]) askReq { return askReq{ReplyTo: r} })
		errs <- err
	}
	go ask()
	within(t, started, 10*time.Second, "the first request to be handled")
	for range k {
		go ask()
	}
	waitUntil(t, 10*time.Second, "every other request in the mailbox", func() bool {
		for _, m := range n.Stats().Mailboxes {
			if m.Path == target.Path() {
				return m.Waiting == k
			}
		}
		return false
	})
	release()
	for range k + 1 {
		err := within(t, errs, 10*time.Second, "an Ask to end")
		var ae *troupe.AskError
		if !errors.As(err, &ae) || !errors.Is(err, troupe.ErrActorStopped) {
			t.Fatalf("Ask = %v; want an AskError", err)
		}
		var pe *troupe.PanicError
		if !errors.As(ae.Reason, &pe) {
			t.Fatalf("the reason is %v, not the panic", ae.Reason)
		}
	}
}

// A node closed by something else (here Close, as a downed member's
// CloseNodeOnDown does) makes ShutdownOnSignal return only once that
// close is over: a main that returns it never exits while an actor is
// still stopping.
func TestShutdownOnSignalReturnsOnlyWhenTheCloseItSawIsOver(t *testing.T) {
	t.Parallel()
	n := defaultNode(t, "closed-by-another")
	started, release := make(chan struct{}), make(chan struct{})
	t.Cleanup(func() { closeOnce(release) })
	var handlerDone atomic.Bool
	busy, err := troupe.Spawn(n, "busy", troupe.Behavior[int]{
		Receive: func(c *troupe.Context[int], _ int) {
			close(started)
			<-release // ignores its context: the close waits for it
			handlerDone.Store(true)
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	busy.Tell(1)
	within(t, started, 5*time.Second, "the handler starting")

	returned := make(chan error, 1)
	go func() { returned <- n.ShutdownOnSignal(time.Minute, os.Interrupt) }()
	closed := make(chan error, 1)
	go func() { closed <- n.Close() }()
	within(t, n.Done(), 5*time.Second, "the close beginning")
	// Give ShutdownOnSignal every chance to return early, then let the
	// handler end: it may return only after that.
	select {
	case err := <-returned:
		t.Fatalf("ShutdownOnSignal returned %v while an actor was still in its handler", err)
	case <-time.After(200 * time.Millisecond):
	}
	closeOnce(release)
	select {
	case err := <-returned:
		if !handlerDone.Load() {
			t.Fatal("ShutdownOnSignal returned while an actor was still in its handler")
		}
		if err != nil {
			t.Fatalf("ShutdownOnSignal after another close: %v, want nil", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("ShutdownOnSignal did not return after the close ended")
	}
	within(t, closed, 10*time.Second, "Close to return")
	if err := n.Alive(); err == nil {
		t.Fatal("Alive is nil after ShutdownOnSignal returned")
	}
}
