package troupe

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// ShutdownPhase is one of the ordered phases of [Node.Shutdown]. Work
// added with [Node.OnShutdown] runs at the start of its phase.
type ShutdownPhase int

// The phases of [Node.Shutdown], in order.
const (
	// PhaseLeave: the node is no longer ready ([Node.Ready]); a cluster
	// member leaves its cluster (leaving, exiting, removed).
	PhaseLeave ShutdownPhase = iota + 1
	// PhaseUnregister: every name this node holds is removed from the
	// registrar or etcd, so lookups stop returning it while it still
	// answers.
	PhaseUnregister
	// PhaseRefuse: the listeners close; no new association is accepted.
	// Every peer is told that this node takes no new work: an [Ask] or a
	// [Resolve] of one of its users' actors made there from now on fails
	// at once with [ErrPeerShuttingDown] (Tells still go: they may be
	// replies to the handlers still running). The node's own handlers
	// may still ask, look up, send and dial until their contexts are
	// cancelled in PhaseActors (with ShutdownDrain, after the drain).
	PhaseRefuse
	// PhaseActors: every actor stops after the handler it is running
	// (whose replies still reach the nodes that asked), or with
	// [Config.ShutdownDrain] after the messages its mailbox holds, within
	// ctx.
	PhaseActors
	// PhaseFlush: every association writes what it holds and says
	// goodbye, within ctx; then the node closes.
	PhaseFlush
)

var phaseNames = [...]string{PhaseLeave: "leave", PhaseUnregister: "unregister", PhaseRefuse: "refuse", PhaseActors: "actors", PhaseFlush: "flush"}

// String returns the phase's name: "leave", "unregister", "refuse",
// "actors" or "flush".
func (p ShutdownPhase) String() string {
	if p >= PhaseLeave && p <= PhaseFlush {
		return phaseNames[p]
	}
	return fmt.Sprintf("ShutdownPhase(%d)", int(p))
}

// OnShutdown adds fn to phase of a graceful [Node.Shutdown]: it runs at the
// start of the phase, after the work added before it to the same phase,
// with Shutdown's ctx. Its error is part of what Shutdown returns; the
// phases go on regardless. [Node.Close] runs no hooks: it is the stop that
// does not wait. Adding work to a node that is shutting down or closed,
// or to a phase that does not exist, returns an error.
func (n *Node) OnShutdown(phase ShutdownPhase, fn func(ctx context.Context) error) error {
	if phase < PhaseLeave || phase > PhaseFlush {
		return fmt.Errorf("%w: no shutdown phase %d", ErrBadConfig, int(phase))
	}
	if n.lc.draining.Load() {
		return ErrNodeClosed
	}
	n.lc.hooksMu.Lock()
	defer n.lc.hooksMu.Unlock()
	if n.lc.hooks == nil {
		n.lc.hooks = map[ShutdownPhase][]func(context.Context) error{}
	}
	n.lc.hooks[phase] = append(n.lc.hooks[phase], fn)
	return nil
}

// runHooks runs the work added to phase, in order, outside any lock.
func (l *lifecycle) runHooks(ctx context.Context, phase ShutdownPhase) error {
	l.hooksMu.Lock()
	hooks := l.hooks[phase]
	l.hooksMu.Unlock()
	var errs []error
	for _, fn := range hooks {
		if err := fn(ctx); err != nil {
			errs = append(errs, fmt.Errorf("shutdown phase %v: %w", phase, err))
		}
	}
	return errors.Join(errs...)
}

// ErrNotReady is wrapped by [Node.Ready]'s answer when the node is not
// ready for work.
var ErrNotReady = errors.New("troupe: node not ready")

// Ready says whether the node is ready for work: nil, or an error wrapping
// [ErrNotReady] that says why not — it is shutting down or closed, or it
// is a cluster member that is not up (still joining, or leaving), or its
// membership ended (it left, or was downed), or a registrar it registers
// with lacks some of its names (a registration failed, or the registrar
// was lost; they are all sent again until it confirms). A readiness
// probe should route traffic to the node only while it is nil.
func (n *Node) Ready() error {
	if n.lc.draining.Load() {
		return fmt.Errorf("%w: shutting down", ErrNotReady)
	}
	if c := n.cl.cluster.Load(); c != nil {
		if s := c.Self().Status; s != MemberUp {
			return fmt.Errorf("%w: cluster member %v", ErrNotReady, s)
		}
	} else if n.lc.clusterEnded.Load() {
		return fmt.Errorf("%w: no longer a cluster member", ErrNotReady)
	}
	if a, ok := n.disc.pendingAt(); ok {
		return fmt.Errorf("%w: the registrar at %s lacks some of this node's names (registering again)", ErrNotReady, a)
	}
	if k := n.disc.store.pending(); k > 0 {
		return fmt.Errorf("%w: %d of this node's registrations or removals are not yet in the etcd registry (trying again)", ErrNotReady, k)
	}
	return nil
}

// Alive says whether the node is alive: nil until its Close or Shutdown
// has finished, [ErrNodeClosed] after. A liveness probe that fails
// restarts the process; only a node that has stopped should fail it.
func (n *Node) Alive() error {
	select {
	case <-n.lc.ctx.Done():
		return ErrNodeClosed
	default:
		return nil
	}
}

// ProbeHandler serves the node's probes for an orchestrator: GET /readyz
// answers 200 "ok" while [Node.Ready] is nil and 503 with the reason
// otherwise; GET /livez does the same with [Node.Alive]. Mount it where
// the probes look, e.g. mux.Handle("/readyz", n.ProbeHandler()) and
// mux.Handle("/livez", n.ProbeHandler()).
func (n *Node) ProbeHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var err error
		switch r.URL.Path {
		case "/readyz":
			err = n.Ready()
		case "/livez":
			err = n.Alive()
		default:
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintln(w, err)
			return
		}
		fmt.Fprintln(w, "ok")
	})
}

// ShutdownOnSignal waits until the process receives one of signals (by
// default SIGINT and, where it exists, SIGTERM — what Kubernetes sends
// before it kills), or until the node closes, and then shuts the node
// down gracefully within grace: the way a service's main ends. It returns
// what [Node.Shutdown] returns, or nil when something else closed the node
// (a Close, a Shutdown, a downed member's CloseNodeOnDown) — and then
// only once that close has finished, so a main that returns it never
// exits while actors are still stopping or goodbyes are unwritten.
func (n *Node) ShutdownOnSignal(grace time.Duration, signals ...os.Signal) error {
	if len(signals) == 0 {
		signals = []os.Signal{os.Interrupt, syscall.SIGTERM}
	}
	ctx, stop := signal.NotifyContext(context.Background(), signals...)
	defer stop()
	select {
	case <-ctx.Done():
	case <-n.lc.done:
		stop() // (the signals are the process's again: a second Ctrl-C ends it)
		<-n.lc.closed
		return nil
	}
	n.log.Info("troupe: signal received; shutting down", "grace", grace.String())
	sctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	return n.Shutdown(sctx)
}

// lifecycle is a node's life from Start to the end of Close: the
// channels and flags that say how far a shutdown has gone, the contexts
// it cancels, and the hooks users add to its phases. The channels and
// contexts are made in Start and closed or cancelled once; hooksMu
// guards hooks.
type lifecycle struct {
	n      *Node
	ctx    context.Context
	cancel context.CancelFunc
	// actorsCtx is the parent of every actor's Context: cancelled when
	// the node starts stopping its actors, so that a handler waiting on
	// it returns.
	actorsCtx    context.Context
	cancelActors context.CancelFunc
	// dialCtx ends every dial in progress when Close begins, or when a
	// Shutdown reaches PhaseFlush.
	dialCtx    context.Context
	dialCancel context.CancelFunc

	closeOnce sync.Once
	closeErr  error
	done      chan struct{} // closed when Close or Shutdown begins
	closed    chan struct{} // closed when the Close or Shutdown has finished
	// flushing is closed when the shutdown reaches PhaseFlush: heartbeats
	// go on until then, through a long drain of mailboxes.
	flushing chan struct{}
	// refusing is set when the shutdown reaches PhaseRefuse: peers that
	// understand it are told (a draining frame) that this node takes no
	// new asks.
	refusing atomic.Bool
	// drainingMailboxes: Shutdown lets mailboxes drain (ShutdownDrain),
	// and a stopping parent's children drain theirs too.
	drainingMailboxes atomic.Bool
	hurry             chan struct{} // closed by Close: a Shutdown in progress stops waiting
	hurryOnce         sync.Once
	// draining is set when a Shutdown begins: the node is no longer ready.
	draining atomic.Bool
	// clusterEnded is set when this node's cluster membership ended (it
	// left, or was downed): it is no longer ready.
	clusterEnded atomic.Bool

	hooksMu mutex[lkHooks]
	hooks   map[ShutdownPhase][]func(context.Context) error // the work users added to Shutdown's phases
}

// isClosed reports whether Close or Shutdown has begun.
func (l *lifecycle) isClosed() bool {
	select {
	case <-l.done:
		return true
	default:
		return false
	}
}

// workDone is closed when a closing node cancels its actors' contexts
// (Close at once; Shutdown at PhaseActors, or after the drain with
// ShutdownDrain): until then, the handlers a Shutdown lets finish may
// still ask, look up, send and dial, and a wait of theirs ends then with
// ErrNodeClosed, so that none holds the shutdown.
func (l *lifecycle) workDone() <-chan struct{} { return l.actorsCtx.Done() }

// workOver reports whether workDone is closed.
func (l *lifecycle) workOver() bool { return l.actorsCtx.Err() != nil }

// flushBegun reports whether the shutdown reached PhaseFlush (at once for
// Close): sessions are no longer resumed.
func (l *lifecycle) flushBegun() bool {
	select {
	case <-l.flushing:
		return true
	default:
		return false
	}
}
