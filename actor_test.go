package troupe

import (
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

type count struct{ N int }

func TestLocalTellAndAsk(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	n := startNode(t, testConfig())
	echo := spawnEcho(t, n, "echo")
	if !echo.IsLocal() || echo.Path() != "/user/echo" || echo.AID().Name != "echo" {
		t.Fatalf("ref = %v path %q aid %+v", echo, echo.Path(), echo.AID())
	}
	for i := range 100 {
		p, err := Ask(ctxT(t, 5*time.Second), echo, func(r Ref[testPong]) testPing { return testPing{N: i, ReplyTo: r} })
		if err != nil || p.N != i {
			t.Fatalf("Ask %d = %+v, %v", i, p, err)
		}
	}
}

func TestAskTimesOutAndLateReplyIsDeadLetter(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	n := startNode(t, testConfig())
	held := make(chan Ref[testPong], 1)
	silent, err := Spawn(n, "silent", Behavior[testPing]{Receive: func(_ *Context[testPing], m testPing) { held <- m.ReplyTo }})
	if err != nil {
		t.Fatal(err)
	}
	dead := make(chan DeadLetter, 4)
	SubscribeChan(n, dead)
	ctx := ctxT(t, 50*time.Millisecond)
	if _, err := Ask(ctx, silent, func(r Ref[testPong]) testPing { return testPing{ReplyTo: r} }); !errors.Is(err, ctxErr(ctx)) {
		t.Fatalf("Ask = %v, want the context's error", err)
	}
	recv(t, held, "the reply ref").Tell(testPong{N: 1})
	if dl := recv(t, dead, "dead letter"); !errors.Is(dl.Reason, ErrActorStopped) {
		t.Fatalf("late reply dead letter reason = %v", dl.Reason)
	}
}

func ctxErr(ctx interface {
	Done() <-chan struct{}
	Err() error
}) error {
	<-ctx.Done()
	return ctx.Err()
}

func TestAnonymousAndNamedSpawn(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	n := startNode(t, testConfig())
	b := Behavior[count]{Receive: func(*Context[count], count) {}}
	r1, err1 := Spawn(n, "", b)
	r2, err2 := Spawn(n, "", b)
	if err1 != nil || err2 != nil || r1.Path() == r2.Path() || !strings.HasPrefix(r1.AID().Name, "$") {
		t.Fatalf("anonymous spawns: %v %v, %v %v", r1, err1, r2, err2)
	}
	if r1.AID().UUID == r2.AID().UUID {
		t.Fatalf("two actors share uuid %v", r1.AID().UUID)
	}
	if _, err := Spawn(n, "x", b); err != nil {
		t.Fatal(err)
	}
	if _, err := Spawn(n, "x", b); !errors.Is(err, ErrNameTaken) {
		t.Errorf("second spawn of x: %v, want ErrNameTaken", err)
	}
	for _, bad := range []string{"$x", "a/b", "a b", strings.Repeat("a", 256)} {
		if _, err := Spawn(n, bad, b); !errors.Is(err, ErrBadName) {
			t.Errorf("Spawn(%q) = %v, want ErrBadName", bad, err)
		}
	}
}

// watcher spawns an actor that watches target from Setup and reports
// every Terminated it gets.
func watcher(t testing.TB, n *Node, name string, target AnyRef) chan Terminated {
	t.Helper()
	got := make(chan Terminated, 4)
	watching := make(chan struct{})
	_, err := Spawn(n, name, Behavior[count]{
		Setup:   func(c *Context[count]) { c.Watch(target); c.Watch(target); close(watching) },
		Receive: func(*Context[count], count) {},
		Signal: func(_ *Context[count], s Signal) {
			if term, ok := s.(Terminated); ok {
				got <- term
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	recv(t, watching, "the watch to be set up")
	return got
}

func TestWatchLocalStopPanicAndChildren(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	n := startNode(t, testConfig())
	var child Ref[count]
	childReady := make(chan struct{})
	parent, err := Spawn(n, "parent", Behavior[count]{
		Setup: func(c *Context[count]) {
			var err error
			child, err = Spawn(c, "child", Behavior[count]{Receive: func(*Context[count], count) {}})
			if err != nil {
				panic(err)
			}
			close(childReady)
		},
		Receive: func(c *Context[count], m count) {
			if m.N < 0 {
				panic(fmt.Sprintf("bad count %d", m.N))
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	<-childReady
	if child.Path() != "/user/parent/child" {
		t.Fatalf("child path = %q", child.Path())
	}
	pw := watcher(t, n, "pw", parent)
	cw := watcher(t, n, "cw", child)
	parent.Tell(count{N: -1})

	pt := recv(t, pw, "parent's Terminated")
	var pe *PanicError
	if !errors.As(pt.Reason, &pe) || pe.Value != "bad count -1" {
		t.Fatalf("parent stop reason = %v, want the panic", pt.Reason)
	}
	if pt.Ref.Path() != "/user/parent" {
		t.Errorf("Terminated.Ref = %v", pt.Ref)
	}
	if ct := recv(t, cw, "child's Terminated"); !errors.Is(ct.Reason, ErrParentStopped) {
		t.Fatalf("child stop reason = %v, want ErrParentStopped", ct.Reason)
	}
	// Exactly once, even though each watcher called Watch twice.
	select {
	case extra := <-pw:
		t.Fatalf("second Terminated: %+v", extra)
	case <-time.After(50 * time.Millisecond):
	}
	// The node survives the panic.
	echo := spawnEcho(t, n, "echo")
	if _, err := Ask(ctxT(t, 5*time.Second), echo, func(r Ref[testPong]) testPing { return testPing{ReplyTo: r} }); err != nil {
		t.Fatalf("node unusable after a panic: %v", err)
	}
}

func TestWatchStoppedActorAndUnwatch(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	n := startNode(t, testConfig())
	target, _ := Spawn(n, "target", Behavior[count]{Receive: func(c *Context[count], _ count) { c.Stop() }})
	tw := watcher(t, n, "w1", target)
	target.Tell(count{})
	if term := recv(t, tw, "Terminated"); term.Reason != nil {
		t.Fatalf("normal stop reason = %v, want nil", term.Reason)
	}
	// Watching an actor that is already gone terminates at once.
	late := watcher(t, n, "w2", target)
	if term := recv(t, late, "Terminated for a dead actor"); !errors.Is(term.Reason, ErrActorStopped) {
		t.Fatalf("late watch reason = %v", term.Reason)
	}

	// Unwatch: no Terminated afterwards.
	other, _ := Spawn(n, "other", Behavior[count]{Receive: func(*Context[count], count) {}})
	got := make(chan Terminated, 1)
	unwatched := make(chan struct{})
	w, _ := Spawn(n, "w3", Behavior[count]{
		Setup: func(c *Context[count]) { c.Watch(other) },
		Receive: func(c *Context[count], _ count) {
			c.Unwatch(other)
			close(unwatched)
		},
		Signal: func(_ *Context[count], s Signal) { got <- s.(Terminated) },
	})
	w.Tell(count{})
	<-unwatched
	n.Stop(other)
	probe := watcher(t, n, "probe", other)
	recv(t, probe, "other's Terminated")
	select {
	case term := <-got:
		t.Fatalf("Terminated after Unwatch: %+v", term)
	case <-time.After(50 * time.Millisecond):
	}
}

// TestTerminatedWaitsBehindTheMailbox: a termination is handled after the
// user messages already waiting when it arrived, whoever sent them.
func TestTerminatedWaitsBehindTheMailbox(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	n := startNode(t, testConfig())
	release := make(chan struct{})
	var order []string
	done := make(chan []string, 1)
	victim, _ := Spawn(n, "victim", Behavior[count]{Receive: func(c *Context[count], _ count) { c.Stop() }})
	w, _ := Spawn(n, "w", Behavior[count]{
		Setup: func(c *Context[count]) { c.Watch(victim) },
		Receive: func(_ *Context[count], m count) {
			if m.N == 0 {
				<-release
				return
			}
			order = append(order, fmt.Sprint("user", m.N))
		},
		Signal: func(_ *Context[count], s Signal) {
			order = append(order, "terminated")
			done <- order
		},
	})
	w.Tell(count{N: 0}) // blocks the watcher
	w.Tell(count{N: 1})
	w.Tell(count{N: 2})
	w.Tell(count{N: 3})
	victim.Tell(count{})
	probe := watcher(t, n, "probe", victim)
	recv(t, probe, "victim stopped")
	close(release)
	got := recv(t, done, "order")
	if strings.Join(got, ",") != "user1,user2,user3,terminated" {
		t.Fatalf("handling order = %v, want the waiting user messages before the signal", got)
	}
}

func TestDeadLettersForStoppedActorAndClosedNode(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	n := startNode(t, testConfig())
	dead := make(chan DeadLetter, 8)
	sub := SubscribeChan(n, dead)
	defer sub.Unsubscribe()
	r, _ := Spawn(n, "short", Behavior[count]{Receive: func(c *Context[count], _ count) { c.Stop() }})
	probe := watcher(t, n, "probe", r)
	r.Tell(count{N: 1})
	recv(t, probe, "stop")
	r.Tell(count{N: 2})
	dl := recv(t, dead, "dead letter")
	if !errors.Is(dl.Reason, ErrActorStopped) || dl.Message.(count).N != 2 || !strings.HasSuffix(dl.Target, "/user/short") {
		t.Fatalf("dead letter = %+v", dl)
	}
}

func TestMailboxLimit(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	cfg := testConfig()
	cfg.MailboxLimit = 2
	n := startNode(t, cfg)
	var full atomic.Int64
	Subscribe(n, func(d DeadLetter) {
		if errors.Is(d.Reason, ErrMailboxFull) {
			full.Add(1)
		}
	})
	gate := make(chan struct{})
	r, _ := Spawn(n, "slow", Behavior[count]{Receive: func(*Context[count], count) { <-gate }})
	r.Tell(count{}) // taken into the batch, blocks
	waitFor(t, 5*time.Second, "the first message to be taken", func() bool {
		c := r.h.local.(*cell[count])
		c.mu.Lock()
		defer c.mu.Unlock()
		return len(c.q.in) == 0
	})
	for range 5 {
		r.Tell(count{})
	}
	close(gate)
	if got := full.Load(); got != 3 {
		t.Fatalf("%d dead letters for a full mailbox, want 3", got)
	}
}

func TestMessageAdapterLocal(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	n := startNode(t, testConfig())
	type wrapped struct{ p testPong }
	got := make(chan wrapped, 1)
	adapterCh := make(chan Ref[testPong], 1)
	_, err := Spawn(n, "owner", Behavior[wrapped]{
		Setup: func(c *Context[wrapped]) {
			adapterCh <- MessageAdapter(c, func(p testPong) wrapped { return wrapped{p} })
		},
		Receive: func(_ *Context[wrapped], m wrapped) { got <- m },
	})
	if err != nil {
		t.Fatal(err)
	}
	ad := recv(t, adapterCh, "adapter")
	ad.Tell(testPong{N: 5})
	if m := recv(t, got, "adapted message"); m.p.N != 5 {
		t.Fatalf("adapted = %+v", m)
	}
}

func TestCloseIsIdempotentAndStopsEverything(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	n, err := Start(ctxT(t, 5*time.Second), testConfig("tcp://127.0.0.1:0", "unix://"+shortSocket(t)))
	if err != nil {
		t.Fatal(err)
	}
	r := spawnEcho(t, n, "echo")
	watcher(t, n, "w", r)
	if err := n.Close(); err != nil {
		t.Fatalf("first Close: %v", err)
	}
	if err := n.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := Spawn(n, "late", Behavior[count]{Receive: func(*Context[count], count) {}}); !errors.Is(err, ErrNodeClosed) {
		t.Fatalf("Spawn after Close = %v, want ErrNodeClosed", err)
	}
	if _, err := Ask(ctxT(t, time.Second), r, func(rr Ref[testPong]) testPing { return testPing{ReplyTo: rr} }); err == nil {
		t.Fatal("Ask after Close succeeded")
	}
}

func TestSpawnUnderAStoppingParentFailsAndCloseStillReturns(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	n, err := Start(ctxT(t, 5*time.Second), testConfig())
	if err != nil {
		t.Fatal(err)
	}
	spawned := make(chan error, 1)
	p, _ := Spawn(n, "parent", Behavior[count]{Receive: func(c *Context[count], _ count) {
		c.Stop()
		_, err := Spawn(c, "late", Behavior[count]{Receive: func(*Context[count], count) {}})
		spawned <- err
	}})
	p.Tell(count{})
	if err := recv(t, spawned, "the spawn"); !errors.Is(err, ErrActorStopped) {
		t.Fatalf("Spawn under a stopping parent = %v, want ErrActorStopped", err)
	}
	closed := make(chan error, 1)
	go func() { closed <- n.Close() }()
	if err := recv(t, closed, "Close to return"); err != nil {
		t.Fatal(err)
	}
}

// TestIdleActorCostsAtMost500Bytes spawns 20,000 idle actors and checks
// the heap they hold: an actor with an empty mailbox holds no goroutine
// and at most 500 bytes (466 today; a field too many pushes the cell into
// the next allocation size class, which this catches).
func TestIdleActorCostsAtMost500Bytes(t *testing.T) {
	// Not beside other tests: it measures the process's heap, goroutines or
	// allocations, which tests running beside it would change.
	if testing.Short() {
		t.Skip("measures the heap")
	}
	n := startNode(t, testConfig())
	beh := Behavior[count]{Receive: func(*Context[count], count) {}}
	const actors = 20000
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for range actors {
		if _, err := Spawn(n, "", beh); err != nil {
			t.Fatal(err)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	per := float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / actors
	if per > 500 {
		t.Fatalf("an idle actor holds %.0f bytes, more than 500", per)
	}
	if g := runtime.NumGoroutine(); g > 1000 {
		t.Fatalf("%d goroutines for %d idle actors", g, actors)
	}
	t.Logf("%.0f bytes per idle actor", per)
}

// TestCellLinksWatchers walks an actor's watchers through one held
// without a map, a second that makes one, and back.
func TestCellLinksWatchers(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	h := func(path string) *handle { return &handle{key: refKey{path: path}} }
	a, b, c := h("/a"), h("/b"), h("/c")
	var l cellLinks
	got := func() []string {
		var ps []string
		l.eachWatcher(func(w *handle) { ps = append(ps, w.key.path) })
		slices.Sort(ps)
		return ps
	}
	steps := []struct {
		add, remove *handle
		want        []string
	}{
		{add: a, want: []string{"/a"}},
		{add: a, want: []string{"/a"}},
		{add: b, want: []string{"/a", "/b"}},
		{add: c, want: []string{"/a", "/b", "/c"}},
		{remove: a, want: []string{"/b", "/c"}},
		{remove: a, want: []string{"/b", "/c"}},
		{remove: b, want: []string{"/c"}},
		{remove: c, want: nil},
		{add: b, want: []string{"/b"}},
		{remove: c, want: []string{"/b"}},
		{remove: b, want: nil},
	}
	for i, s := range steps {
		if s.add != nil {
			l.addWatcher(s.add)
		} else {
			l.removeWatcher(s.remove.key)
		}
		if g := got(); !slices.Equal(g, s.want) {
			t.Fatalf("step %d: watchers %v, want %v", i, g, s.want)
		}
	}
	if l.watcher != nil || l.watchers != nil {
		t.Fatalf("no watcher left, but the links hold %v and %v", l.watcher, l.watchers)
	}
}

// recentStops keeps the last maxRecentStops reasons, the oldest going
// first, and compares no errors (a reason of an uncomparable type is kept
// like any other).
func TestRecentStopsKeepsTheLastReasons(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	type unhashable struct{ parts []string }
	var s recentStops
	s.record("/user/normal", UUID{1}, nil)
	if got := s.reason("/user/normal", UUID{1}, ErrActorStopped); got != ErrActorStopped {
		t.Fatalf("a normal stop was kept: %v", got)
	}
	odd := fmt.Errorf("wrapped: %w", ErrParentStopped)
	for i := range maxRecentStops + 10 {
		var r error = odd
		if i == maxRecentStops+5 {
			r = uncomparableErr{unhashable{[]string{"x"}}}
		}
		s.record(fmt.Sprintf("/user/a%d", i), UUID{}, r)
	}
	if got := s.reason("/user/a0", UUID{}, ErrActorStopped); got != ErrActorStopped {
		t.Fatalf("the oldest stop was still kept: %v", got)
	}
	if got := s.reason(fmt.Sprintf("/user/a%d", maxRecentStops+9), UUID{}, nil); !errors.Is(got, ErrParentStopped) {
		t.Fatalf("the newest stop: %v", got)
	}
	if len(s.by) != maxRecentStops {
		t.Fatalf("%d reasons kept, want %d", len(s.by), maxRecentStops)
	}
}

type uncomparableErr struct{ v any }

func (e uncomparableErr) Error() string { return fmt.Sprint(e.v) }

// A watch placed while the actor stops (here during its PostStop, after
// it refuses watches) gets the real reason too.
func TestAWatchDuringPostStopGetsTheRealReason(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	n := startNode(t, testConfig())
	inPostStop, release := make(chan struct{}), make(chan struct{})
	children := make(chan Ref[count], 1)
	parent, err := Spawn(n, "parent", Behavior[count]{
		Setup: func(c *Context[count]) {
			ch, _ := Spawn(c, "child", Behavior[count]{Receive: func(*Context[count], count) {},
				Signal: func(_ *Context[count], s Signal) {
					if _, ok := s.(PostStop); ok {
						close(inPostStop)
						<-release
					}
				}})
			children <- ch
		},
		Receive: func(*Context[count], count) {},
	})
	if err != nil {
		t.Fatal(err)
	}
	child := recv(t, children, "the child")
	n.Stop(parent)
	recv(t, inPostStop, "PostStop")
	term := make(chan Terminated, 1)
	if _, err := Spawn(n, "late", Behavior[count]{Setup: func(c *Context[count]) { c.Watch(child) }, Receive: func(*Context[count], count) {},
		Signal: func(_ *Context[count], s Signal) {
			if tm, ok := s.(Terminated); ok {
				term <- tm
			}
		}}); err != nil {
		t.Fatal(err)
	}
	tm := recv(t, term, "Terminated")
	close(release)
	if !errors.Is(tm.Reason, ErrParentStopped) {
		t.Fatalf("got %v, want ErrParentStopped", tm.Reason)
	}
}
