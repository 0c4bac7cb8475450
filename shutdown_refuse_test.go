package troupe_test

import (
	"context"
	"errors"
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
	troupe.RegisterMessage[refuseReq]("troupe.test.refuseReq")
	troupe.RegisterMessage[refuseRep]("troupe.test.refuseRep")
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

// A handler that a Shutdown lets finish may still ask another node,
// look a name up and resolve a ref: the node stops waiting on them only
// when its actors have stopped (PhaseFlush).
func TestAHandlerShutdownLetsFinishMayStillAsk(t *testing.T) {
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
	release()
	closeOnce(gate) // the handler goes on after the actors' stop came
	if err := within(t, result, 10*time.Second, "the handler's ask"); err != nil {
		t.Fatalf("a handler that Shutdown lets finish could not ask: %v", err)
	}
	if err := within(t, shut, 10*time.Second, "Shutdown"); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
}
