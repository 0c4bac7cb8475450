package troupe_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"troupe"
)

// These tests use supervision as a user does: from outside the package,
// through Spawn, Supervise and the signals.

// sup is the supervised test actor's protocol.
type sup struct {
	Op    string // "count", "boom", "fail", "trigger", "spawn", "stop"
	N     int
	Reply chan<- string
}

// quietNode starts a node with no listener and its logs discarded (or
// sent to logTo), closed when the test ends.
func quietNode(t testing.TB, logTo io.Writer) *troupe.Node {
	t.Helper()
	if logTo == nil {
		logTo = io.Discard
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	n, err := troupe.Start(ctx, troupe.Config{Logger: slog.New(slog.NewTextHandler(logTo, nil))})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}

// watchOn spawns an actor on n that watches r and hands over the signals
// it gets.
func watchOn(t testing.TB, n *troupe.Node, r troupe.AnyRef) <-chan troupe.Terminated {
	t.Helper()
	got := make(chan troupe.Terminated, 4)
	watching := make(chan struct{})
	_, err := troupe.Spawn(n, "", troupe.Behavior[struct{}]{
		Setup: func(c *troupe.Context[struct{}]) {
			c.Watch(r)
			close(watching)
		},
		Receive: func(*troupe.Context[struct{}], struct{}) {},
		Signal: func(_ *troupe.Context[struct{}], s troupe.Signal) {
			if term, ok := s.(troupe.Terminated); ok {
				got <- term
			}
		},
	})
	if err != nil {
		t.Fatalf("Spawn watcher: %v", err)
	}
	within(t, watching, 10*time.Second, "the watch")
	return got
}

// within receives from ch or fails the test after d.
func within[T any](t testing.TB, ch <-chan T, d time.Duration, what string) T {
	t.Helper()
	d = slack(d)
	select {
	case v := <-ch:
		return v
	case <-time.After(d):
		t.Fatalf("no %s within %v", what, d)
		panic("unreachable")
	}
}

// ask sends op and waits for the reply.
func ask(t testing.TB, r troupe.Ref[sup], op string, n int) string {
	t.Helper()
	reply := make(chan string, 1)
	r.Tell(sup{Op: op, N: n, Reply: reply})
	return within(t, reply, 10*time.Second, "reply to "+op)
}

// counter is the supervised test behavior: its state is a count of the
// "count" messages it handled, and each build has a number. failIn names
// the handler that fails on "trigger" ("receive", "fail", "signal"), or
// "setup" for a Setup that fails in the first build only, once gate is
// closed. signals, if not nil, gets a line per lifecycle signal.
func counter(builds *atomic.Int32, failIn string, signals chan<- string, gate ...chan struct{}) func() troupe.Behavior[sup] {
	return func() troupe.Behavior[sup] {
		build := builds.Add(1)
		count := 0
		return troupe.Behavior[sup]{
			Setup: func(c *troupe.Context[sup]) {
				if failIn == "setup" && build == 1 {
					for _, g := range gate {
						<-g
					}
					panic("setup failed")
				}
			},
			Receive: func(c *troupe.Context[sup], m sup) {
				switch m.Op {
				case "count":
					count++
					m.Reply <- fmt.Sprintf("build %d count %d", build, count)
				case "trigger":
					switch failIn {
					case "receive":
						panic("receive failed")
					case "fail":
						c.Fail(errors.New("reported"))
					case "signal":
						// Watch a child that stops at once: the Terminated
						// makes Signal fail.
						child, _ := troupe.Spawn(c, "", troupe.Behavior[int]{
							Setup:   func(c *troupe.Context[int]) { c.Stop() },
							Receive: func(*troupe.Context[int], int) {},
						})
						c.Watch(child)
					}
				case "stop":
					c.Stop()
				}
			},
			Signal: func(c *troupe.Context[sup], s troupe.Signal) {
				switch s := s.(type) {
				case troupe.Terminated:
					if failIn == "signal" {
						if signals != nil {
							signals <- "failing in Signal"
						}
						panic("signal failed")
					}
				case troupe.PreRestart:
					if signals != nil {
						signals <- fmt.Sprintf("build %d PreRestart: %v", build, s.Reason)
					}
				case troupe.PostStop:
					if signals != nil {
						signals <- fmt.Sprintf("build %d PostStop: %v, context done: %v", build, s.Reason, c.Context().Err() != nil)
					}
				}
			},
		}
	}
}

// A failure in each handler, under each strategy: what the next message
// finds (the same state, a fresh one, or a stopped actor).
func TestSupervisionStrategies(t *testing.T) {
	t.Parallel()
	strategies := []struct {
		name string
		s    troupe.Strategy
	}{
		{"stop", troupe.Strategy{}},
		{"resume", troupe.ResumeOnFailure()},
		{"restart", troupe.RestartOnFailure()},
		{"backoff", troupe.RestartWithBackoff(20*time.Millisecond, 100*time.Millisecond, 0.2)},
	}
	for _, failIn := range []string{"receive", "fail", "signal", "setup"} {
		for _, st := range strategies {
			t.Run(failIn+"/"+st.name, func(t *testing.T) {
				n := quietNode(t, nil)
				var builds atomic.Int32
				signals := make(chan string, 8)
				gate := make(chan struct{})
				r, err := troupe.Spawn(n, "counter", troupe.Supervise(counter(&builds, failIn, signals, gate), st.s))
				if err != nil {
					t.Fatal(err)
				}
				term := watchOn(t, n, r)
				close(gate) // a failing Setup fails once the watch is made
				if failIn != "setup" {
					if got := ask(t, r, "count", 0); got != "build 1 count 1" {
						t.Fatalf("before the failure: %q", got)
					}
					r.Tell(sup{Op: "trigger"})
					if failIn == "signal" {
						// The failure comes with a later signal: wait for it.
						within(t, signals, 10*time.Second, "the failing signal")
					}
				}
				stops := st.name == "stop" || st.name == "resume" && failIn == "setup"
				if stops {
					tm := within(t, term, 10*time.Second, "Terminated")
					if !troupe.IsFailure(tm.Reason) {
						t.Fatalf("IsFailure = false for reason %v", tm.Reason)
					}
					var pe *troupe.PanicError
					if isPanic := errors.As(tm.Reason, &pe); failIn == "fail" && isPanic || failIn != "fail" && !isPanic {
						t.Fatalf("reason = %#v", tm.Reason)
					}
					if pe != nil && !bytes.Contains(pe.Stack, []byte("supervision_test.go")) {
						t.Fatalf("the panic's stack does not show where it happened:\n%s", pe.Stack)
					}
					return
				}
				want := "build 2 count 1"
				if st.name == "resume" {
					want = "build 1 count 2"
				}
				if got := ask(t, r, "count", 0); got != want {
					t.Fatalf("after the failure: %q, want %q", got, want)
				}
				select {
				case tm := <-term:
					t.Fatalf("a watcher saw the actor stop: %+v", tm)
				default:
				}
			})
		}
	}
}

// Past its limit, the actor stops with the last failure as its reason.
func TestRestartLimit(t *testing.T) {
	t.Parallel()
	n := quietNode(t, nil)
	var builds atomic.Int32
	r, _ := troupe.Spawn(n, "limited", troupe.Supervise(counter(&builds, "receive", nil), troupe.RestartOnFailure().WithLimit(3, time.Hour)))
	term := watchOn(t, n, r)
	for i := range 3 {
		r.Tell(sup{Op: "trigger"})
		if got, want := ask(t, r, "count", 0), fmt.Sprintf("build %d count 1", i+2); got != want {
			t.Fatalf("after failure %d: %q, want %q", i+1, got, want)
		}
	}
	r.Tell(sup{Op: "trigger"})
	tm := within(t, term, 10*time.Second, "Terminated after the fourth failure")
	var pe *troupe.PanicError
	if !errors.As(tm.Reason, &pe) || pe.Value != "receive failed" {
		t.Fatalf("reason = %v, want the fourth panic", tm.Reason)
	}
	if b := builds.Load(); b != 4 {
		t.Fatalf("%d builds, want 4 (the first and three restarts)", b)
	}
}

// Messages that arrive during a backoff wait for the restarted actor, in
// order, and the pause lasts at least its minimum.
func TestBackoffKeepsMessages(t *testing.T) {
	t.Parallel()
	n := quietNode(t, nil)
	var builds atomic.Int32
	const pause = 300 * time.Millisecond
	r, _ := troupe.Spawn(n, "slow", troupe.Supervise(counter(&builds, "receive", nil), troupe.RestartWithBackoff(pause, time.Second, 0)))
	replies := make(chan string, 200)
	start := time.Now()
	r.Tell(sup{Op: "trigger"})
	for range 100 {
		r.Tell(sup{Op: "count", Reply: replies})
	}
	for i := range 100 {
		if got, want := within(t, replies, 10*time.Second, "reply"), fmt.Sprintf("build 2 count %d", i+1); got != want {
			t.Fatalf("reply %d = %q, want %q", i, got, want)
		}
	}
	if waited := time.Since(start); waited < pause {
		t.Fatalf("restarted after %v, before the backoff's minimum %v", waited, pause)
	}
}

// Consecutive failures double the pause: the third restart comes at least
// min+2·min+4·min after the first failure.
func TestBackoffGrows(t *testing.T) {
	t.Parallel()
	n := quietNode(t, nil)
	var builds atomic.Int32
	const minPause = 50 * time.Millisecond
	r, _ := troupe.Spawn(n, "growing", troupe.Supervise(counter(&builds, "receive", nil), troupe.RestartWithBackoff(minPause, 10*time.Second, 0)))
	start := time.Now()
	for i := range 3 {
		r.Tell(sup{Op: "trigger"})
		if got, want := ask(t, r, "count", 0), fmt.Sprintf("build %d count 1", i+2); got != want {
			t.Fatalf("after failure %d: %q, want %q", i+1, got, want)
		}
	}
	if waited := time.Since(start); waited < 7*minPause {
		t.Fatalf("three restarts took %v, less than the pauses 1+2+4 × %v", waited, minPause)
	}
}

// A restart stops the children first and waits for them, so the fresh
// Setup can spawn a child with the same name; WithKeepChildren keeps them.
func TestRestartStopsChildren(t *testing.T) {
	t.Parallel()
	for _, keep := range []bool{false, true} {
		t.Run(fmt.Sprintf("keep=%v", keep), func(t *testing.T) {
			n := quietNode(t, nil)
			s := troupe.RestartOnFailure()
			if keep {
				s = s.WithKeepChildren()
			}
			children := make(chan troupe.Ref[int], 4)
			setupErr := make(chan error, 4)
			var builds atomic.Int32
			parent, _ := troupe.Spawn(n, "parent", troupe.Supervise(func() troupe.Behavior[string] {
				builds.Add(1)
				return troupe.Behavior[string]{
					Setup: func(c *troupe.Context[string]) {
						child, err := troupe.Spawn(c, "helper", troupe.Behavior[int]{Receive: func(*troupe.Context[int], int) {}})
						if err == nil {
							children <- child
						}
						setupErr <- err
					},
					Receive: func(c *troupe.Context[string], m string) { panic(m) },
				}
			}, s))
			if err := within(t, setupErr, 10*time.Second, "first Setup"); err != nil {
				t.Fatal(err)
			}
			first := within(t, children, time.Second, "first child")
			childTerm := watchOn(t, n, first)
			parent.Tell("boom")
			err := within(t, setupErr, 10*time.Second, "second Setup")
			if keep {
				if !errors.Is(err, troupe.ErrNameTaken) {
					t.Fatalf("second Setup's Spawn: %v, want ErrNameTaken (the kept child has the name)", err)
				}
				select {
				case tm := <-childTerm:
					t.Fatalf("the kept child stopped: %+v", tm)
				default:
				}
				return
			}
			if err != nil {
				t.Fatalf("second Setup's Spawn: %v (the old child was not stopped first)", err)
			}
			tm := within(t, childTerm, time.Second, "the old child's Terminated")
			if !errors.Is(tm.Reason, troupe.ErrParentStopped) {
				t.Fatalf("old child's reason = %v, want ErrParentStopped", tm.Reason)
			}
			if second := within(t, children, time.Second, "second child"); second.AID() == first.AID() {
				t.Fatalf("the second child is the first one: %v", second)
			}
		})
	}
}

// PreRestart goes to the build being dropped, PostStop to the last build
// once it stopped (its context done), and both before a watcher hears of
// the stop.
func TestLifecycleSignals(t *testing.T) {
	t.Parallel()
	n := quietNode(t, nil)
	signals := make(chan string, 8)
	var builds atomic.Int32
	r, _ := troupe.Spawn(n, "signals", troupe.Supervise(counter(&builds, "receive", signals), troupe.RestartOnFailure()))
	term := watchOn(t, n, r)
	r.Tell(sup{Op: "trigger"})
	if got := within(t, signals, 10*time.Second, "PreRestart"); got != "build 1 PreRestart: troupe: actor panicked: receive failed" {
		t.Fatalf("got %q", got)
	}
	r.Tell(sup{Op: "stop"})
	if got := within(t, signals, 10*time.Second, "PostStop"); got != "build 2 PostStop: <nil>, context done: true" {
		t.Fatalf("got %q", got)
	}
	if tm := within(t, term, 10*time.Second, "Terminated"); tm.Reason != nil || troupe.IsFailure(tm.Reason) {
		t.Fatalf("Terminated = %+v, want a normal stop (the restart is not a stop)", tm)
	}

	// An unsupervised actor gets PostStop too, with its failure.
	r2, _ := troupe.Spawn(n, "plain", counter(new(atomic.Int32), "receive", signals)())
	r2.Tell(sup{Op: "trigger"})
	if got := within(t, signals, 10*time.Second, "PostStop"); got != "build 1 PostStop: troupe: actor panicked: receive failed, context done: true" {
		t.Fatalf("got %q", got)
	}
}

// A restart cancels the actor's timers and drops its own watches and
// adapters: none of them reaches the fresh state.
func TestRestartDropsTimersAndWatches(t *testing.T) {
	t.Parallel()
	n := quietNode(t, nil)
	type msg struct{ Op string }
	seen := make(chan string, 8)
	victim, _ := troupe.Spawn(n, "victim", troupe.Behavior[string]{Receive: func(c *troupe.Context[string], _ string) { c.Stop() }})
	later, _ := troupe.Spawn(n, "later", troupe.Behavior[string]{Receive: func(c *troupe.Context[string], _ string) { c.Stop() }})
	var builds atomic.Int32
	adapters := make(chan troupe.Ref[int], 1)
	r, _ := troupe.Spawn(n, "forgetful", troupe.Supervise(func() troupe.Behavior[msg] {
		build := builds.Add(1)
		return troupe.Behavior[msg]{
			Setup: func(c *troupe.Context[msg]) {
				if build == 1 {
					adapters <- troupe.MessageAdapter(c, func(int) msg { return msg{Op: "via the old adapter"} })
					c.Watch(victim)
					c.StartTimer("old", 50*time.Millisecond, msg{Op: "old timer"})
					return
				}
				c.Watch(later)
				c.StartTimer("new", 300*time.Millisecond, msg{Op: "new timer"})
			},
			Receive: func(c *troupe.Context[msg], m msg) {
				if m.Op == "boom" {
					panic("boom")
				}
				seen <- fmt.Sprintf("build %d: %s", build, m.Op)
			},
			Signal: func(c *troupe.Context[msg], s troupe.Signal) {
				if tm, ok := s.(troupe.Terminated); ok {
					seen <- fmt.Sprintf("build %d: Terminated %s", build, tm.Ref.Path())
				}
			},
		}
	}, troupe.RestartOnFailure()))
	r.Tell(msg{Op: "boom"})
	r.Tell(msg{Op: "restarted"})
	if got := within(t, seen, 10*time.Second, "first message after the restart"); got != "build 2: restarted" {
		t.Fatalf("got %q", got)
	}
	// The first build's adapter is gone with it.
	dead := make(chan troupe.DeadLetter, 4)
	sub := troupe.SubscribeChan(n, dead)
	defer sub.Unsubscribe()
	old := within(t, adapters, time.Second, "the old adapter")
	old.Tell(1)
	if dl := within(t, dead, 10*time.Second, "a dead letter"); dl.Message != 1 || !strings.Contains(dl.Target, old.Path()) || !errors.Is(dl.Reason, troupe.ErrNoSuchActor) {
		t.Fatalf("dead letter %+v, want the message to the old adapter", dl)
	}

	// victim stops before later, and the old timer was due long before
	// the new one: had the first build's watch or timer survived, their
	// signals would be among the first two.
	victim.Tell("stop")
	within(t, watchOn(t, n, victim), 10*time.Second, "victim's stop")
	later.Tell("stop")
	got := map[string]bool{}
	for range 2 {
		got[within(t, seen, 10*time.Second, "signal")] = true
	}
	if !got["build 2: Terminated /user/later"] || !got["build 2: new timer"] {
		t.Fatalf("the fresh state saw %v, want only its own watch and timer", got)
	}
}

// A parent escalates its child's failure by failing itself in its Signal
// handler: the supervised parent restarts, and the fresh child with it.
func TestEscalation(t *testing.T) {
	t.Parallel()
	n := quietNode(t, nil)
	var parentBuilds atomic.Int32
	failures := make(chan error, 4)
	parent, _ := troupe.Spawn(n, "parent", troupe.Supervise(func() troupe.Behavior[string] {
		parentBuilds.Add(1)
		var child troupe.Ref[string]
		return troupe.Behavior[string]{
			Setup: func(c *troupe.Context[string]) {
				child, _ = troupe.Spawn(c, "child", troupe.Behavior[string]{Receive: func(_ *troupe.Context[string], m string) { panic(m) }})
				c.Watch(child)
			},
			Receive: func(_ *troupe.Context[string], m string) { child.Tell(m) },
			Signal: func(c *troupe.Context[string], s troupe.Signal) {
				if tm, ok := s.(troupe.Terminated); ok && troupe.IsFailure(tm.Reason) {
					failures <- tm.Reason
					c.Fail(fmt.Errorf("child %s failed: %w", tm.Ref.Path(), tm.Reason))
				}
			},
		}
	}, troupe.RestartOnFailure()))
	parent.Tell("bad input")
	var pe *troupe.PanicError
	if err := within(t, failures, 10*time.Second, "the child's failure"); !errors.As(err, &pe) || pe.Value != "bad input" {
		t.Fatalf("child's failure = %v", err)
	}
	parent.Tell("again")
	within(t, failures, 10*time.Second, "the second child's failure")
	if b := parentBuilds.Load(); b < 2 {
		t.Fatalf("the parent was built %d times; it did not restart", b)
	}
}

// Each failure is logged once, with its stack.
func TestFailureLoggedOnce(t *testing.T) {
	t.Parallel()
	var buf syncBuffer
	n := quietNode(t, &buf)
	var builds atomic.Int32
	r, _ := troupe.Spawn(n, "logged", troupe.Supervise(counter(&builds, "receive", nil), troupe.RestartOnFailure()))
	r.Tell(sup{Op: "trigger"})
	ask(t, r, "count", 0)
	logs := buf.String()
	if c := strings.Count(logs, "actor failed"); c != 1 {
		t.Fatalf("%d log lines about the failure, want 1:\n%s", c, logs)
	}
	if !strings.Contains(logs, "restarting it") || !strings.Contains(logs, "supervision_test.go") || !strings.Contains(logs, "path=/user/logged") {
		t.Fatalf("the log line does not say what, where and what was done:\n%s", logs)
	}
}

// A restart after a backoff says, on its log line, how long the actor
// will be away (#55): a user reading the log sees a pause, not a hang.
func TestARestartsLogLineSaysItsBackoff(t *testing.T) {
	t.Parallel()
	var buf syncBuffer
	n := quietNode(t, &buf)
	var builds atomic.Int32
	r, _ := troupe.Spawn(n, "paused", troupe.Supervise(counter(&builds, "receive", nil), troupe.RestartWithBackoff(20*time.Millisecond, 40*time.Millisecond, 0)))
	r.Tell(sup{Op: "trigger"})
	ask(t, r, "count", 0)
	logs := buf.String()
	if !strings.Contains(logs, "restarting it") || !strings.Contains(logs, "backoff=20ms") {
		t.Fatalf("the restart's log line does not give its 20ms backoff:\n%s", logs)
	}
}

// syncBuffer is a bytes.Buffer safe for a logger and a test to share.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Spawn refuses behaviors that cannot run, supervised or not.
func TestSpawnBadBehavior(t *testing.T) {
	t.Parallel()
	n := quietNode(t, nil)
	for name, b := range map[string]troupe.Behavior[int]{
		"no Receive":        {},
		"nil factory":       troupe.Supervise[int](nil, troupe.RestartOnFailure()),
		"factory panics":    troupe.Supervise(func() troupe.Behavior[int] { panic("no") }, troupe.RestartOnFailure()),
		"builds no Receive": troupe.Supervise(func() troupe.Behavior[int] { return troupe.Behavior[int]{} }, troupe.RestartOnFailure()),
	} {
		if _, err := troupe.Spawn(n, "", b); !errors.Is(err, troupe.ErrBadConfig) {
			t.Errorf("%s: Spawn = %v, want ErrBadConfig", name, err)
		}
	}
}

// Ten thousand restarts, each with a timer, a context, an adapter and a
// child, leave no goroutine behind and keep no memory of the old builds.
func TestManyRestartsLeakNothing(t *testing.T) {
	// Not beside other tests: it measures the process's heap, goroutines or
	// allocations, which tests running beside it would change.
	slowTest(t)
	n := quietNode(t, nil)
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	before, heapBefore := runtime.NumGoroutine(), heap()
	const restarts = 10000
	var builds, spawnFailures atomic.Int32
	done := make(chan struct{})
	r, _ := troupe.Spawn(n, "phoenix", troupe.Supervise(func() troupe.Behavior[int] {
		if builds.Add(1) == restarts+1 {
			close(done)
		}
		return troupe.Behavior[int]{
			Setup: func(c *troupe.Context[int]) {
				c.StartTimer("t", time.Hour, 0)
				_ = c.Context()
				troupe.MessageAdapter(c, func(s string) int { return len(s) })
				if _, err := troupe.Spawn(c, "child", troupe.Behavior[int]{Receive: func(*troupe.Context[int], int) {}}); err != nil {
					spawnFailures.Add(1)
				}
			},
			Receive: func(*troupe.Context[int], int) { panic("again") },
		}
	}, troupe.RestartOnFailure()))
	for i := range restarts {
		r.Tell(i)
	}
	within(t, done, 60*time.Second, "ten thousand restarts")
	if f := spawnFailures.Load(); f != 0 {
		t.Fatalf("%d Setups could not spawn their child: the old one was still there", f)
	}
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before+1 { // +1: the restarting actor itself may still be running
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines before, %d after the restarts:\n%s", before, runtime.NumGoroutine(), buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Each build's timer, context and child would be several hundred
	// bytes; a leak of them all is megabytes.
	grown := int64(heap()) - int64(heapBefore)
	if grown > 2<<20 {
		t.Fatalf("the heap grew by %d bytes over %d restarts", grown, restarts)
	}
}

// A panic in PreRestart or PostStop is logged and changes nothing: the
// restart goes on, and the stop keeps its reason.
func TestLifecycleSignalPanicsAreIgnored(t *testing.T) {
	t.Parallel()
	var logs syncBuffer
	n := quietNode(t, &logs)
	var builds atomic.Int32
	r, _ := troupe.Spawn(n, "clumsy", troupe.Supervise(func() troupe.Behavior[sup] {
		inner := counter(&builds, "receive", nil)()
		inner.Signal = func(*troupe.Context[sup], troupe.Signal) { panic("in a lifecycle signal") }
		return inner
	}, troupe.RestartOnFailure()))
	term := watchOn(t, n, r)
	r.Tell(sup{Op: "trigger"})
	if got := ask(t, r, "count", 0); got != "build 2 count 1" {
		t.Fatalf("after a panic in PreRestart: %q, want the restarted build", got)
	}
	r.Tell(sup{Op: "stop"})
	if tm := within(t, term, 10*time.Second, "Terminated"); tm.Reason != nil {
		t.Fatalf("a panic in PostStop changed the stop reason to %v", tm.Reason)
	}
	if c := strings.Count(logs.String(), "lifecycle signal; ignored"); c != 2 {
		t.Fatalf("%d log lines about the ignored panics, want 2:\n%s", c, logs.String())
	}
}

// During a backoff the mailbox keeps what arrives up to MailboxLimit; the
// rest become dead letters saying the mailbox is full.
func TestBackoffRespectsMailboxLimit(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	n, err := troupe.Start(ctx, troupe.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), MailboxLimit: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	dead := make(chan troupe.DeadLetter, 16)
	sub := troupe.SubscribeChan(n, dead)
	defer sub.Unsubscribe()
	var builds atomic.Int32
	signals := make(chan string, 4)
	r, _ := troupe.Spawn(n, "held", troupe.Supervise(counter(&builds, "receive", signals), troupe.RestartWithBackoff(300*time.Millisecond, time.Second, 0)))
	r.Tell(sup{Op: "trigger"})
	within(t, signals, 10*time.Second, "PreRestart") // the backoff has begun
	replies := make(chan string, 16)
	for range 5 {
		r.Tell(sup{Op: "count", Reply: replies})
	}
	for range 2 {
		if dl := within(t, dead, 10*time.Second, "a dead letter"); !errors.Is(dl.Reason, troupe.ErrMailboxFull) {
			t.Fatalf("dead letter %v, want mailbox full", dl.Reason)
		}
	}
	for i := range 3 {
		if got, want := within(t, replies, 10*time.Second, "a reply"), fmt.Sprintf("build 2 count %d", i+1); got != want {
			t.Fatalf("reply %q, want %q", got, want)
		}
	}
	select {
	case rep := <-replies:
		t.Fatalf("a fourth message was kept: %q", rep)
	case dl := <-dead:
		t.Fatalf("a third dead letter: %+v", dl)
	default:
	}
}
