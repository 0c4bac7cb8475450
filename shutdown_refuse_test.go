package troupe_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"troupe"
)

type refuseReq struct {
	N       int
	ReplyTo troupe.Ref[refuseRep]
}

type refuseRep struct{ N int }

func init() {
	troupe.SetWireKey[refuseReq]("troupe.test.refuseReq")
	troupe.SetWireKey[refuseRep]("troupe.test.refuseRep")
}

// spawnRefuseEcho spawns an actor that answers every request with its
// number, a request numbered 1 only once gate opens.
func spawnRefuseEcho(t *testing.T, n *troupe.Node, name string, gate <-chan struct{}, started chan<- struct{}) {
	t.Helper()
	_, err := troupe.Spawn(n, name, troupe.Behavior[refuseReq]{
		Receive: func(c *troupe.Context[refuseReq], m refuseReq) {
			if m.N == 1 {
				started <- struct{}{}
				<-gate // (ignores its context: a handler Shutdown lets finish)
			}
			m.ReplyTo.Tell(refuseRep{N: m.N})
		},
	})
	if err != nil {
		t.Fatal(err)
	}
}

// holdPhase holds n's Shutdown at the start of phase until release is
// called (or the shutdown's context ends); holding is closed when it
// gets there.
func holdPhase(t *testing.T, n *troupe.Node, phase troupe.ShutdownPhase) (holding <-chan struct{}, release func()) {
	t.Helper()
	hold, at := make(chan struct{}), make(chan struct{})
	if err := n.OnShutdown(phase, func(ctx context.Context) error {
		close(at)
		select {
		case <-hold:
		case <-ctx.Done():
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	return at, func() { once.Do(func() { close(hold) }) }
}

var closeMu sync.Mutex

// closeOnce closes ch unless it is closed already.
func closeOnce(ch chan struct{}) {
	closeMu.Lock()
	defer closeMu.Unlock()
	select {
	case <-ch:
	default:
		close(ch)
	}
}

func askRefuse(ctx context.Context, to troupe.Ref[refuseReq], n int) (refuseRep, error) {
	return troupe.Ask(ctx, to, func(r troupe.Ref[refuseRep]) refuseReq { return refuseReq{N: n, ReplyTo: r} })
}

// Once a node's Shutdown has passed PhaseRefuse, another node's Ask or
// Resolve of its actors fails at once with ErrPeerShuttingDown, while the
// handler it is still running replies to the Ask it took before.
func TestAShuttingDownNodeRefusesNewAsks(t *testing.T) {
	t.Parallel()
	svc := defaultNode(t, "svc")
	client := defaultNode(t, "client")
	gate, started := make(chan struct{}), make(chan struct{}, 1)
	spawnRefuseEcho(t, svc, "slow", gate, started)
	spawnRefuseEcho(t, svc, "echo", nil, nil)
	// The shutdown holds at the start of PhaseActors until the test lets
	// it go: the node is refusing, and its actors still run.
	holding, release := holdPhase(t, svc, troupe.PhaseActors)
	t.Cleanup(func() { release(); closeOnce(gate) })
	ctx := ctxFor(t)
	at := func(path string) string { return troupe.FormatRef(svc.Addrs()[0], path) }
	slow, err := troupe.Resolve[refuseReq](ctx, client, at("/user/slow"))
	if err != nil {
		t.Fatal(err)
	}
	echo, err := troupe.Resolve[refuseReq](ctx, client, at("/user/echo"))
	if err != nil {
		t.Fatal(err)
	}
	if r, err := askRefuse(ctx, echo, 7); err != nil || r.N != 7 {
		t.Fatalf("ask before the shutdown: %v, %v", r, err)
	}
	inHand := make(chan error, 1)
	go func() {
		r, err := askRefuse(ctx, slow, 1)
		if err == nil && r.N != 1 {
			err = errors.New("wrong reply")
		}
		inHand <- err
	}()
	within(t, started, 5*time.Second, "the slow handler starting")

	shut := make(chan error, 1)
	go func() { shut <- svc.Shutdown(ctx) }()
	within(t, holding, 5*time.Second, "PhaseActors")

	// The draining frame travels behind what svc queued before it: ask
	// until it has arrived (each earlier ask is answered).
	var refused error
	waitUntil(t, 5*time.Second, "an ask refused with ErrPeerShuttingDown", func() bool {
		actx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		start := time.Now()
		_, err := askRefuse(actx, echo, 2)
		if err != nil && time.Since(start) > 500*time.Millisecond {
			t.Fatalf("an ask of a refusing node took %v to fail: %v", time.Since(start), err)
		}
		refused = err
		return errors.Is(err, troupe.ErrPeerShuttingDown)
	})
	if _, err := troupe.Resolve[refuseReq](ctx, client, at("/user/echo")); !errors.Is(err, troupe.ErrPeerShuttingDown) {
		t.Fatalf("Resolve of a refusing node's actor: %v, want ErrPeerShuttingDown", err)
	}
	t.Logf("refused: %v", refused)

	// The handler in progress finishes, and its reply arrives.
	closeOnce(gate)
	release()
	if err := within(t, inHand, 5*time.Second, "the reply of the handler in progress"); err != nil {
		t.Fatalf("the ask taken before the shutdown: %v", err)
	}
	if err := within(t, shut, 10*time.Second, "Shutdown"); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
}

// A handler running during a Shutdown may still resolve a ref on another
// node and ask it, until its Context is cancelled (PhaseActors).
func TestAHandlerShutdownLetsFinishMayStillAsk(t *testing.T) {
	t.Parallel()
	svc := defaultNode(t, "svc")
	other := defaultNode(t, "other")
	spawnRefuseEcho(t, other, "echo", nil, nil)
	ctx := ctxFor(t)
	echoAt := troupe.FormatRef(other.Addrs()[0], "/user/echo")
	if _, err := troupe.Resolve[refuseReq](ctx, svc, echoAt); err != nil {
		t.Fatal(err) // (the association is up before the shutdown)
	}
	gate, started := make(chan struct{}), make(chan struct{}, 1)
	result := make(chan error, 1)
	caller, err := troupe.Spawn(svc, "caller", troupe.Behavior[int]{
		Receive: func(c *troupe.Context[int], _ int) {
			started <- struct{}{}
			<-gate
			actx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			echo, err := troupe.Resolve[refuseReq](actx, svc, echoAt)
			if err != nil {
				result <- err
				return
			}
			r, err := askRefuse(actx, echo, 3)
			if err == nil && r.N != 3 {
				err = errors.New("wrong reply")
			}
			result <- err
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	caller.Tell(1)
	within(t, started, 5*time.Second, "the handler starting")
	holding, release := holdPhase(t, svc, troupe.PhaseActors)
	t.Cleanup(func() { release(); closeOnce(gate) })
	shut := make(chan error, 1)
	go func() { shut <- svc.Shutdown(ctx) }()
	within(t, holding, 5*time.Second, "PhaseActors")
	closeOnce(gate) // the handler asks while the shutdown is under way
	if err := within(t, result, 10*time.Second, "the handler's ask"); err != nil {
		t.Fatalf("a handler that Shutdown lets finish could not ask: %v", err)
	}
	release()
	if err := within(t, shut, 10*time.Second, "Shutdown"); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
}

// With ShutdownDrain, the handlers that drain a mailbox may ask another
// node: the replies come, and every queued job is handled.
func TestADrainingHandlerMayAskAnotherNode(t *testing.T) {
	t.Parallel()
	svc, err := troupe.Start(ctxFor(t), troupe.Config{Name: "drainer", ShutdownDrain: true,
		Listen: []string{"tcp://127.0.0.1:0"}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { svc.Close() })
	other := defaultNode(t, "other")
	spawnRefuseEcho(t, other, "echo", nil, nil)
	ctx := ctxFor(t)
	echo, err := troupe.Resolve[refuseReq](ctx, svc, troupe.FormatRef(other.Addrs()[0], "/user/echo"))
	if err != nil {
		t.Fatal(err)
	}
	gate, started := make(chan struct{}), make(chan struct{}, 1)
	t.Cleanup(func() { closeOnce(gate) })
	results := make(chan error, 20)
	worker, err := troupe.Spawn(svc, "worker", troupe.Behavior[int]{
		Receive: func(c *troupe.Context[int], n int) {
			if n == 0 {
				started <- struct{}{}
				<-gate
			}
			r, err := askRefuse(c.Context(), echo, n+10)
			if err == nil && r.N != n+10 {
				err = errors.New("wrong reply")
			}
			results <- err
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		worker.Tell(i)
	}
	within(t, started, 5*time.Second, "the first job")
	shut := make(chan error, 1)
	go func() { shut <- svc.Shutdown(ctx) }()
	<-svc.Done()
	closeOnce(gate)
	for i := range 20 {
		if err := within(t, results, 10*time.Second, "a drained job's ask"); err != nil {
			t.Fatalf("job %d: a draining handler's ask failed: %v", i, err)
		}
	}
	if err := within(t, shut, 10*time.Second, "Shutdown"); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
}

// A handler that asks without a deadline an actor that never answers
// does not hold a Shutdown without one: its ask ends with ErrNodeClosed
// when the actors' contexts are cancelled.
func TestAnAskWithoutDeadlineDoesNotHoldShutdown(t *testing.T) {
	t.Parallel()
	svc := defaultNode(t, "svc")
	other := defaultNode(t, "other")
	if _, err := troupe.Spawn(other, "mute", troupe.Behavior[refuseReq]{
		Receive: func(*troupe.Context[refuseReq], refuseReq) {},
	}); err != nil {
		t.Fatal(err)
	}
	ctx := ctxFor(t)
	mute, err := troupe.Resolve[refuseReq](ctx, svc, troupe.FormatRef(other.Addrs()[0], "/user/mute"))
	if err != nil {
		t.Fatal(err)
	}
	asking, result := make(chan struct{}), make(chan error, 1)
	caller, err := troupe.Spawn(svc, "caller", troupe.Behavior[int]{
		Receive: func(c *troupe.Context[int], _ int) {
			close(asking)
			_, err := askRefuse(context.Background(), mute, 1)
			result <- err
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	caller.Tell(1)
	within(t, asking, 5*time.Second, "the handler asking")
	shut := make(chan error, 1)
	go func() { shut <- svc.Shutdown(context.Background()) }()
	if err := within(t, shut, 10*time.Second, "Shutdown"); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if err := within(t, result, time.Second, "the ask's end"); !errors.Is(err, troupe.ErrNodeClosed) {
		t.Fatalf("the ask ended with %v, want ErrNodeClosed", err)
	}
}
