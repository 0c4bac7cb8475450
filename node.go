package troupe

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Version is this release of troupe.
const Version = "0.12.0"

// Errors about nodes.
var (
	// ErrNodeClosed is returned by calls on a node that has been closed,
	// and is the dead-letter reason for messages it can no longer deliver.
	ErrNodeClosed = errors.New("troupe: node closed")
	// ErrBadConfig is wrapped by the error [Start] returns for an invalid
	// [Config], and by that of a call given an argument it cannot use (a
	// behavior without Receive, or whose factory fails, for [Spawn]; a ref
	// that is not an actor of this node for [ServiceKey.Register],
	// [ServiceKey.Subscribe] or [Topic.Subscribe]; [Reconnect] with
	// [OnNode]; a
	// shutdown phase that does not exist; a router strategy that cannot
	// choose).
	ErrBadConfig = errors.New("troupe: bad config")
)

// Node is one running troupe node: it hosts actors, listens on its
// addresses, and keeps one association with each peer node it talks to.
// Start one with [Start] and stop it with [Node.Close].
//
// All methods are safe for concurrent use.
type Node struct {
	totals nodeTotals // counted since Start (see Totals)

	// cfg, uid, name, log and epoch are set in Start, then read-only;
	// every other field is a subsystem that says who guards it.
	cfg    Config
	uid    NodeUID
	name   string
	log    *slog.Logger
	lis    listenerSet // its listeners and bound addresses (listen.go)
	events eventStream
	ids    idSource      // actor uuids and the node-wide sequence numbers
	credit creditWaiters // the credit accounts waiting for room in a mailbox (credit.go)
	epoch  time.Time     // the zero of the monotonic stamps in connections

	// gate admits peers: the handshake, its proofs and the decision
	// (handshake.go, token.go, auth.go).
	gate gate

	inbound inboundLimits // accepted connections against the limits (listen.go)

	// actors is the table of local actors (actor_table.go).
	actors actorTable

	// peers is the table of associations with peers, and what the
	// node holds about peers beside them (assoc_table.go).
	peers peerTable

	// disc is how this node reaches its registries (register.go).
	disc registryClient
	// registrar is this node as a registrar, if it is one (registrar.go).
	registrar   registrarRole
	services    services    // its actors under service keys (service.go)
	serviceSubs serviceSubs // its actors following service keys (service_subscribe.go)
	topics      topics      // its topics' relays and publishers (topic.go)

	// dead counts and samples the dead letters, and paces their log
	// (deadletters.go).
	dead deadLetters

	// cl is what a running cluster tells the core (seams.go).
	cl clusterSeam
	// lat holds the latency histograms once a MetricsHandler exists
	// (latency.go); nil until then.
	lat atomic.Pointer[nodeLatencies]

	// lc is the node's life: started, shutting down by phases, closed
	// (lifecycle.go).
	lc lifecycle
	wg sync.WaitGroup // every goroutine the node started
}

// Start starts a node: it binds every address in cfg.Listen and returns
// once they accept connections. ctx bounds only the start-up; the node runs
// until [Node.Close]. Errors wrap [ErrBadConfig] or [ErrBadAddr], or are
// the listener's error.
func Start(ctx context.Context, cfg Config) (*Node, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	n := &Node{
		cfg:    cfg,
		log:    cfg.Logger,
		actors: actorTable{byPath: make(map[string]*handle), byName: make(map[string][]*handle)},
		peers: peerTable{
			byUID:    make(map[NodeUID]*assoc),
			byAddr:   make(map[Addr]*assoc),
			all:      make(map[*assoc]struct{}),
			awaiting: make(map[NodeUID][]*assoc),
		},
	}
	n.lc.done, n.lc.closed = make(chan struct{}), make(chan struct{})
	n.lc.flushing, n.lc.hurry = make(chan struct{}), make(chan struct{})
	n.events.node = n
	n.disc.n = n
	n.gate.n = n
	n.peers.n = n
	n.lis.n = n
	n.dead.n = n
	n.disc.store = installStore(n)
	n.services.n, n.serviceSubs.n, n.topics.n = n, n, n
	n.lc.n = n
	n.registrar.n = n
	rand.Read(n.uid[:])
	rand.Read(n.ids.base[:])
	n.name = cfg.Name
	if n.name == "" {
		n.name = "node-" + n.uid.String()[:8]
	}
	n.log = n.log.With("node", n.name)
	n.lc.ctx, n.lc.cancel = context.WithCancel(context.Background())
	n.lc.actorsCtx, n.lc.cancelActors = context.WithCancel(n.lc.ctx)
	n.lc.dialCtx, n.lc.dialCancel = context.WithCancel(n.lc.ctx)
	n.epoch = time.Now()
	var err error
	switch {
	case n.disc.store.configured():
		err = n.disc.store.start(ctx)
	case cfg.Discovery || len(cfg.RegistryAddrs) > 0 || cfg.EnsureRegistry:
		err = n.bootstrap(ctx)
	default:
		err = n.lis.listenAll(ctx, cfg.Listen)
	}
	if err == nil && cfg.ServeRegistry && n.registrar.reg() == nil {
		err = n.registrar.startRegistrar()
	}
	if err == nil {
		err = n.startStatsActor()
	}
	if err != nil {
		n.Close()
		return nil, err
	}
	for _, l := range n.lis.all() {
		n.wg.Go(func() { n.lis.acceptLoop(l) })
	}
	n.wg.Go(n.heartbeatLoop)
	if err := n.disc.registerNode(ctx); err != nil {
		n.Close()
		return nil, err
	}
	rememberNode(n)
	return n, nil
}

// addrList returns the node's bound addresses; the slice is never
// changed (a node that binds another address stores a new one).
func (n *Node) addrList() []Addr {
	return n.lis.addrList()
}

// UID returns this node incarnation's uid.
func (n *Node) UID() NodeUID { return n.uid }

// Name returns the node's name.
func (n *Node) Name() string { return n.name }

// Addrs returns the addresses the node actually bound, in the order of
// [Config.Listen] (with real ports in place of port 0).
func (n *Node) Addrs() []Addr { return slices.Clone(n.addrList()) }

// Done returns a channel that is closed when the node begins to close.
func (n *Node) Done() <-chan struct{} { return n.lc.done }

func (n *Node) spawnParent() (*Node, parentCell) { return n, nil }

// Stop asks a local actor to stop, as if it had called [Context.Stop]:
// after the message it is handling, its children stop, waiting messages
// become dead letters, and its watchers get [Terminated] with a nil
// reason. Stop returns [ErrNoSuchActor] for an actor that is not on this
// node or has already stopped.
func (n *Node) Stop(r AnyRef) error {
	h := r.handle()
	if h == nil || h.local == nil || h.node != n {
		return fmt.Errorf("Stop %v: %w (not a local actor)", r, ErrNoSuchActor)
	}
	if !h.local.watchHandle().local.sysPush(sysMsg{kind: sysStop}) {
		return fmt.Errorf("Stop %s: %w", h.key.path, ErrNoSuchActor)
	}
	return nil
}

// isOwnAddr reports whether a is one of this node's bound addresses.
func (n *Node) isOwnAddr(a Addr) bool {
	for _, x := range n.addrList() {
		if x == a {
			return true
		}
	}
	return false
}

var _ io.Closer = (*Node)(nil)

// idSource draws actor uuids and the node-wide sequence numbers; every
// field is set once (base) or atomic.
type idSource struct {
	base UUID // actor uuids are this with a counter mixed in
	uuid atomic.Uint64
	// dial numbers the connections this node dials (hello extension
	// 5; see chooseDuplicate).
	dial atomic.Uint64
	// req numbers resolve requests node-wide, so that an answer that
	// arrives on the association a request moved to by a merge can never
	// be taken for another request's.
	req  atomic.Uint64
	anon atomic.Uint64 // anonymous actors' names
}

// newUUID returns a new actor uuid.
func (s *idSource) newUUID() UUID {
	u := s.base
	seq := s.uuid.Add(1)
	binary.BigEndian.PutUint64(u[8:], binary.BigEndian.Uint64(u[8:])^seq)
	return u
}

// heartbeatLoop is the node's one liveness goroutine: every quarter
// interval it feeds each association's detector the time it last heard from
// the peer, quarantines the silent ones, and asks each writer for a
// heartbeat once per interval. It runs until the node's last writer has
// ended (n.lc.ctx): a closing node's leaving writers wait for their peers'
// acknowledgements, and a peer that stopped answering must not hold that
// wait past UnreachableAfter.
func (n *Node) heartbeatLoop() {
	t := time.NewTicker(n.cfg.HeartbeatInterval / 4)
	defer t.Stop()
	for {
		select {
		case <-n.lc.ctx.Done():
			return
		case now := <-t.C:
			for _, a := range n.peers.live() {
				a.hb.checkLiveness(now)
			}
			n.dead.log.summarize(n, now)
		}
	}
}

// localRefString is the ref string of a local path, for dead letters.
func (n *Node) localRefString(path string) string {
	if len(n.addrList()) > 0 {
		return FormatRef(n.addrList()[0], path)
	}
	return "troupe:" + path
}
