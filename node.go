package troupe

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode"
	"unicode/utf8"
)

// Version is this release of troupe.
const Version = "0.10.0"

// Errors about nodes.
var (
	// ErrNodeClosed is returned by calls on a node that has been closed,
	// and is the dead-letter reason for messages it can no longer deliver.
	ErrNodeClosed = errors.New("troupe: node closed")
	// ErrBadConfig is wrapped by the error [Start] returns for an invalid
	// [Config].
	ErrBadConfig = errors.New("troupe: bad config")
)

// Config configures a node. The zero value of every field means its
// documented default, so Config{} starts a local-only node.
type Config struct {
	// Name is a human-readable name for logs and handshakes. Default:
	// "node-" and the first 8 hex digits of the node's uid.
	Name string

	// AppVersion is the version of the program running this node, for
	// people: it travels in the handshake and in cluster membership, and
	// is shown by [Node.Stats] ([PeerStats.AppVersion],
	// [MemberStats.AppVersion]), the debug page and troupe peers, so that
	// during a rolling upgrade an operator sees which peer runs what. At
	// most [MaxAppVersion] bytes of printable UTF-8. Default: empty.
	// troupe never compares versions: whether two versions talk is
	// decided per message type (see "Changing a message type during a
	// rolling upgrade" in the README).
	AppVersion string

	// Listen lists the addresses to listen on, in any form [ParseAddr]
	// accepts: "tcp://127.0.0.1:0" (port 0 picks a free port),
	// "unix:///run/app/a.sock", "/ip4/127.0.0.1/tcp/7001", … Default:
	// none. A node that listens nowhere can still dial other nodes, and
	// they can reply over the same association.
	Listen []string

	// Logger receives the node's logs. Default: slog.Default().
	Logger *slog.Logger

	// MaxFrameSize is the largest frame, in bytes, this node sends or
	// accepts; a peer announcing a larger one is disconnected before
	// anything is allocated for it. Default: [DefaultMaxFrameSize] (4 MiB).
	MaxFrameSize int

	// MailboxLimit is how many user messages may wait in one actor's
	// mailbox (beyond the batch it is handling); a message past it becomes a
	// [DeadLetter] with [ErrMailboxFull]. Default: 1,048,576. Negative means
	// no limit.
	MailboxLimit int

	// MailboxBytes bounds, in encoded bytes, the messages from other nodes
	// waiting in one actor's mailbox, so that a few large messages cannot
	// hold far more memory than MailboxLimit suggests; one past it becomes
	// a [DeadLetter] with [ErrMailboxFull]. Local messages are not
	// counted. Default: 64 MiB. Negative means no limit.
	MailboxBytes int

	// SendQueueLimit is the send budget of one association, in encoded
	// bytes: the messages to its peer that wait to be written, and those
	// written that the peer has not yet acknowledged (each is kept, as
	// bytes, until then, to be reported if the link fails). It bounds the
	// memory a slow or stalled peer, or a producer faster than the
	// network, can make this node hold. A Tell past it becomes a
	// [DeadLetter] with [ErrSendQueueFull]; [Ref.Send] waits for room.
	// Control frames (watches, terminations, answers to the peer's
	// lookups) are not refused for it: they may take the association 1 MiB
	// past it, and a peer that provokes more than that without reading
	// is ended with a [ProtocolError]. Default: 64 MiB, room for a burst
	// of several million small messages. Negative means no limit.
	SendQueueLimit int

	// UnackedLimit is the window of one association, in encoded bytes:
	// the most it writes to its peer before the peer acknowledges. Past
	// it the writer waits for an acknowledgement (a reading peer
	// acknowledges at least every 256 KiB), so a peer that reads is never
	// dropped for what it has not yet confirmed. A peer that acknowledges
	// nothing for UnreachableAfter while something waits for it is
	// unreachable and quarantined. Default: 64 MiB. Negative means no
	// window.
	UnackedLimit int

	// DialTimeout bounds connecting to a peer. Default: 5 s.
	DialTimeout time.Duration

	// HandshakeTimeout bounds the handshake of a new connection, in both
	// directions, and nothing else. Default: 5 s.
	HandshakeTimeout time.Duration

	// QuarantineExpiry is how long a quarantine refuses the peer's proven
	// addresses; after it, a new node may listen there and be reached,
	// while the quarantined uid stays refused. Default: 1 h.
	QuarantineExpiry time.Duration

	// RegistryTimeout bounds one request to a registrar: a lookup, a
	// registration, a wait's registration of its waiter. Default: 5 s.
	RegistryTimeout time.Duration

	// EtcdElectionTimeout is the election timeout of the etcd cluster
	// that RegistryAddrs names (etcd's --election-timeout), if it does.
	// The etcd client derives its bounds from it: a member silent for
	// one EtcdElectionTimeout is passed over for the next, and a request
	// goes on trying the members for 3.5 of them, which outlasts an
	// election (see the README's etcd section). Default:
	// [DefaultEtcdElectionTimeout], etcd's own default.
	EtcdElectionTimeout time.Duration

	// HeartbeatInterval is how often each association sends a heartbeat.
	// Default: 1 s.
	HeartbeatInterval time.Duration

	// UnreachableAfter is how long a peer may stay silent (nothing at all
	// arriving from it) before it is declared unreachable and quarantined.
	// It also bounds how long a peer may leave a write undrained, or what
	// was written unacknowledged. It must be at least three heartbeat
	// intervals. Default: 10 s.
	UnreachableAfter time.Duration

	// AllowUIDs lists the user ids, besides this process's own, whose
	// processes may connect over this node's Unix sockets. Default: none
	// (only the same user). Peer credentials exist on Linux, macOS and
	// FreeBSD; elsewhere Start refuses a non-empty AllowUIDs with
	// [ErrBadConfig], and Unix sockets rely on their directory's
	// permissions.
	AllowUIDs []int

	// RegistryAddrs lists the registrars this node uses for discovery, in
	// any form ParseAddr accepts. Setting it turns discovery on: at Start
	// the node probes every address, joins the registrars that answer, and
	// becomes the registrar itself (binding the addresses) when none does.
	// Default with Discovery on: tcp://127.0.0.1:1616, or, for a node that
	// listens only on Unix sockets, registry@1616.sock in [RuntimeDir].
	//
	// Alternatively it names one etcd cluster as the registry:
	// "etcd://host:port,host:port/prefix" (plain HTTP) or "etcds://…"
	// (HTTPS with [Config.RegistryTLS]: its RootCAs verify etcd, its Certificates
	// are the client certificate), or several such entries with the same
	// scheme and prefix, one per member. The endpoints are tried in turn; the
	// node holds one etcd lease of [Config.UnreachableAfter] and attaches
	// its registrations to it. See the README's discovery section.
	RegistryAddrs []string

	// Discovery turns discovery on with the default RegistryAddrs. It is
	// off by default so that a plain node never binds a well-known port
	// behind its user's back.
	Discovery bool

	// EnsureRegistry makes Start fail with [ErrRegistryRunning] if a
	// registrar already answers: this node must be the registrar (a
	// dedicated registrar daemon sets it).
	EnsureRegistry bool

	// ServeRegistry makes this node serve a registry on its own Listen
	// addresses, whether or not it uses other registrars.
	ServeRegistry bool

	// Secret, if set, is a shared secret every peer must know: each new
	// connection runs a mutual HMAC-SHA256 challenge-response with fresh
	// nonces on both sides (the secret itself never crosses the wire), and a
	// peer with a wrong or missing secret is refused before any of its
	// messages is delivered. Nodes with and without a secret cannot talk.
	Secret []byte

	// TLS, if set, wraps every TCP connection in TLS with this config, in
	// both directions: give it Certificates, RootCAs, ClientCAs and
	// ClientAuth: tls.RequireAndVerifyClientCert for mutual authentication.
	// When ServerName is empty, a dialed server is verified against the host
	// it was dialed by. Unix sockets are not wrapped; they rely on peer
	// credentials.
	TLS *tls.Config

	// RegistryTLS is the client TLS config for an etcd registry named
	// "etcds://…" in RegistryAddrs: RootCAs verify etcd's certificate,
	// Certificates hold the client certificate etcd's --client-cert-auth
	// asks for. Nil means TLS (and, that nil too, the system's roots and no
	// client certificate).
	RegistryTLS *tls.Config

	// MaxInboundConns bounds the inbound connections open at once; one
	// more is closed as soon as it is accepted. Default: 4096.
	MaxInboundConns int

	// MaxOutboundConns bounds the outbound associations at once (dialing
	// or up); one more fails with [ErrTooManyConns]. It bounds, apart,
	// the associations bound to refs to new nodes that arrived in messages
	// and were never used (one past that is a dead ref; one that no
	// reachable ref holds is forgotten): such refs do not take the room of
	// this node's own dials. Default: 4096.
	MaxOutboundConns int

	// MaxRefDialsPerPeer bounds the outbound associations (dialing or up)
	// that refs received from one peer may cause at once: refs inside its
	// messages to nodes this node had no association with, once used. A
	// send through one more is a [DeadLetter] whose reason wraps
	// [ErrTooManyConns]; this node's own dials (Resolve, lookups, the
	// cluster) never count. Default: 256.
	MaxRefDialsPerPeer int

	// MaxWatchesPerPeer bounds the watches one peer's actors may place on
	// this node's actors (and, whatever their count, they may hold at most
	// 16 MiB of watcher paths; one watcher path is at most 1 KiB). One
	// more is answered at once with a [Terminated] whose reason wraps
	// [ErrWatchRefused]. Default: 65,536.
	MaxWatchesPerPeer int

	// MaxPendingHandshakes bounds the inbound connections still in their
	// handshake, and one source IP may hold at most a quarter of them (at
	// least 4); one more is closed at once. Each is also closed after
	// HandshakeTimeout. Default: 128.
	MaxPendingHandshakes int

	// ShutdownDrain makes [Node.Shutdown] let every actor handle the
	// messages already in its mailbox before it stops (in PhaseActors, its
	// context live, within Shutdown's ctx; a parent first, then its
	// children); a message that arrives after that is a [DeadLetter]
	// ([ErrActorStopped]). A draining handler may Tell, Ask, Resolve,
	// look up and Send, to this node or others. Past ctx,
	// the actors stop as without it, and Shutdown's error says that the
	// mailboxes did not drain. Default false: every actor stops after the
	// handler it is running. Close never drains.
	ShutdownDrain bool

	// DeadLetterLog is how many dead letters are logged one by one through
	// Logger (target, reason, message type) before the rest are only
	// counted, with one line a minute saying how many were not logged.
	// Dead letters of a node that is closing (reason [ErrNodeClosed]) are
	// not logged. Default: 10. Negative turns the log off; the
	// [DeadLetter] events are published either way.
	DeadLetterLog int

	// fault routes the node's connections through a fault network (set
	// by FaultNet.Start).
	fault *FaultNet
}

func (c Config) withDefaults() Config {
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.MaxFrameSize == 0 {
		c.MaxFrameSize = DefaultMaxFrameSize
	}
	switch {
	case c.MailboxLimit == 0:
		c.MailboxLimit = 1 << 20
	case c.MailboxLimit < 0:
		c.MailboxLimit = 0
	}
	switch {
	case c.MailboxBytes == 0:
		c.MailboxBytes = 64 << 20
	case c.MailboxBytes < 0:
		c.MailboxBytes = 0
	}
	switch {
	case c.SendQueueLimit == 0:
		c.SendQueueLimit = 64 << 20
	case c.SendQueueLimit < 0:
		c.SendQueueLimit = 0
	}
	switch {
	case c.UnackedLimit == 0:
		c.UnackedLimit = 64 << 20
	case c.UnackedLimit < 0:
		c.UnackedLimit = 0
	}
	if c.DialTimeout == 0 {
		c.DialTimeout = 5 * time.Second
	}
	if c.HandshakeTimeout == 0 {
		c.HandshakeTimeout = 5 * time.Second
	}
	if c.QuarantineExpiry == 0 {
		c.QuarantineExpiry = time.Hour
	}
	if c.RegistryTimeout == 0 {
		c.RegistryTimeout = 5 * time.Second
	}
	if c.EtcdElectionTimeout == 0 {
		c.EtcdElectionTimeout = DefaultEtcdElectionTimeout
	}
	if c.HeartbeatInterval == 0 {
		c.HeartbeatInterval = time.Second
	}
	if c.UnreachableAfter == 0 {
		c.UnreachableAfter = 10 * time.Second
	}
	if c.DeadLetterLog == 0 {
		c.DeadLetterLog = 10
	}
	if c.MaxOutboundConns == 0 {
		c.MaxOutboundConns = 4096
	}
	if c.MaxInboundConns == 0 {
		c.MaxInboundConns = 4096
	}
	if c.MaxPendingHandshakes == 0 {
		c.MaxPendingHandshakes = 128
	}
	if c.MaxRefDialsPerPeer == 0 {
		c.MaxRefDialsPerPeer = 256
	}
	if c.MaxWatchesPerPeer == 0 {
		c.MaxWatchesPerPeer = 65536
	}
	return c
}

func (c Config) validate() error {
	switch {
	case c.MaxFrameSize < 1024 || c.MaxFrameSize > 1<<30:
		return fmt.Errorf("%w: MaxFrameSize %d is outside 1 KiB to 1 GiB", ErrBadConfig, c.MaxFrameSize)
	case c.MaxRefDialsPerPeer < 0 || c.MaxWatchesPerPeer < 0 || c.MaxInboundConns < 0 || c.MaxOutboundConns < 0 || c.MaxPendingHandshakes < 0:
		return fmt.Errorf("%w: a negative connection or watch bound", ErrBadConfig)
	case c.DialTimeout < 0 || c.HandshakeTimeout < 0 || c.RegistryTimeout < 0 || c.EtcdElectionTimeout < 0:
		return fmt.Errorf("%w: negative timeout", ErrBadConfig)
	case len(c.AppVersion) > MaxAppVersion:
		return fmt.Errorf("%w: AppVersion is %d bytes, at most %d", ErrBadConfig, len(c.AppVersion), MaxAppVersion)
	case strings.ContainsFunc(c.AppVersion, func(r rune) bool { return r == utf8.RuneError || !unicode.IsPrint(r) }):
		return fmt.Errorf("%w: AppVersion %q is not printable UTF-8", ErrBadConfig, c.AppVersion)
	case len(c.Name) > 255:
		return fmt.Errorf("%w: Name longer than 255 bytes", ErrBadConfig)
	case c.Secret != nil && len(c.Secret) < 16:
		return fmt.Errorf("%w: Secret must be at least 16 bytes", ErrBadConfig)
	case c.HeartbeatInterval < time.Millisecond:
		return fmt.Errorf("%w: HeartbeatInterval %v is below 1 ms", ErrBadConfig, c.HeartbeatInterval)
	case len(c.AllowUIDs) > 0 && !peerCredSupported:
		return fmt.Errorf("%w: AllowUIDs needs Unix socket peer credentials, which %s does not offer", ErrBadConfig, runtime.GOOS)
	case c.UnreachableAfter < 3*c.HeartbeatInterval:
		return fmt.Errorf("%w: UnreachableAfter %v must be at least 3 heartbeat intervals (%v); a shorter window mistakes an ordinary pause for a dead peer", ErrBadConfig, c.UnreachableAfter, 3*c.HeartbeatInterval)
	}
	return nil
}

// Node is one running troupe node: it hosts actors, listens on its
// addresses, and keeps one association with each peer node it talks to.
// Start one with [Start] and stop it with [Node.Close].
//
// All methods are safe for concurrent use.
type Node struct {
	// Set once in Start, then read-only.
	cfg       Config
	uid       NodeUID
	name      string
	log       *slog.Logger
	addrsP    atomic.Pointer[[]Addr] // bound listen addresses (see addrList)
	lmu       sync.Mutex             // guards listeners, and changes of addrsP
	listeners []net.Listener
	events    Events
	uuidBase  [16]byte // actor uuids are this with a counter mixed in
	ctx       context.Context
	cancel    context.CancelFunc
	// actorsCtx is the parent of every actor's Context: cancelled when
	// the node starts stopping its actors, so that a handler waiting on
	// it returns.
	actorsCtx    context.Context
	cancelActors context.CancelFunc
	// creditWaiters (creditMu) holds, by actor, the credit accounts that
	// wait for its mailbox to make room (see credit.go).
	creditMu      sync.Mutex
	creditWaiters map[*handle][]*creditAcct
	creditWaiting atomic.Int32 // len(creditWaiters), read without the lock
	epoch         time.Time    // the zero of the monotonic stamps in connections

	uuidSeq atomic.Uint64
	// reqSeq numbers resolve requests node-wide, so that an answer that
	// arrives on the association a request moved to by a merge can never
	// be taken for another request's.
	reqSeq  atomic.Uint64
	anonSeq atomic.Uint64

	inbound      atomic.Int64  // inbound connections open
	acceptErrors atomic.Uint64 // failed Accept calls, retried
	handshaking  atomic.Int64  // inbound connections in their handshake
	hsMu         sync.Mutex
	hsBySource   map[string]int // handshakes in progress by source (hsMu)

	// amu guards actors and closing; actors maps a path to the handle of
	// the actor, adapter or exported ask promise that lives there.
	amu     sync.RWMutex
	actors  map[string]*handle
	byName  map[string][]*handle // public actors by name, for the lookup fast path
	closing bool

	// pmu guards the peer tables.
	pmu      sync.Mutex
	byUID    map[NodeUID]*assoc  // the live association with each peer incarnation
	byAddr   map[Addr]*assoc     // the association to use for an address
	all      map[*assoc]struct{} // every association not yet finished
	awaiting map[NodeUID][]*assoc
	pclosing bool
	outbound int // outbound associations dialing or up, not yet finished
	bindings int // outbound associations bound to refs read from messages, never dialed
	// refDials counts, by peer, the outbound associations its refs made
	// dial, live (see Config.MaxRefDialsPerPeer).
	refDials map[NodeUID]int
	// claims are the announced addresses of inbound peers being checked
	// by a dial-back probe (proveClaims).
	claims map[Addr]*claim
	// handshaking holds inbound connections still in their handshake, so
	// that Close need not wait for their deadline.
	inHandshake map[net.Conn]struct{}
	// quarantine holds the peer incarnations this node has given up on.
	quarantine quarantineTable

	// Discovery, set in Start.
	regP       atomic.Pointer[regTable] // the registry this node serves, if any (see reg)
	registrars []Addr                   // the remote registrars this node registers with
	etcd       *etcdRegistry            // the etcd registry this node registers with, if any
	etcdSync   etcdSync                 // what etcd confirmed of this node's entries (etcd_sync.go)
	etcdOthers sync.Map                 // URL -> *etcdRegistry: those named in WithRegistries
	regRefs    sync.Map                 // Addr -> Ref[regRequest], resolved registrar actors
	found      map[string][]foundRef    // guarded by pmu: actors lookups found on peers

	dlog deadLetterLog

	// regEpoch is closed (and replaced) each time this node registers
	// again with a registrar; parked waits park again then.
	regEpochMu sync.Mutex
	// regPending (regEpochMu) holds the registrars whose copy of this
	// node's registrations is known to be incomplete: a registration
	// failed, or the registrar was lost. keepRegistrars sends them all
	// again; Ready is false meanwhile.
	regPending map[Addr]bool
	regEpoch   chan struct{}

	// members holds the uids of cluster members (NodeUID -> struct{}):
	// peers exempt from quarantine while they are members.
	members sync.Map
	// quarantinedBy, set while a cluster runs, hears that a peer refused
	// this node because it has quarantined it.
	quarantinedBy atomic.Pointer[func(NodeUID)]
	// beatMembers, set while a cluster runs, is the set of members that
	// watch this one: the only members its associations heartbeat.
	beatMembers atomic.Pointer[map[NodeUID]bool]
	// cluster is the cluster this node is a member of, if any (Stats).
	cluster atomic.Pointer[Cluster]
	dlCount deadLetterCounts

	// Lifecycle.
	closeOnce sync.Once
	closeErr  error
	done      chan struct{} // closed when Close or Shutdown begins
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
	// hmu guards hooks, the work users added to Shutdown's phases.
	hmu   sync.Mutex
	hooks map[ShutdownPhase][]func(context.Context) error
	// dialCtx ends every dial in progress when Close begins, or when a
	// Shutdown reaches PhaseFlush.
	dialCtx    context.Context
	dialCancel context.CancelFunc
	live       sync.WaitGroup // one count per actor not yet terminated
	wg         sync.WaitGroup // every goroutine the node started
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
		cfg:         cfg,
		log:         cfg.Logger,
		actors:      make(map[string]*handle),
		byName:      make(map[string][]*handle),
		byUID:       make(map[NodeUID]*assoc),
		byAddr:      make(map[Addr]*assoc),
		all:         make(map[*assoc]struct{}),
		awaiting:    make(map[NodeUID][]*assoc),
		inHandshake: make(map[net.Conn]struct{}),
		done:        make(chan struct{}),
		flushing:    make(chan struct{}),
		hurry:       make(chan struct{}),
	}
	n.events.node = n
	rand.Read(n.uid[:])
	rand.Read(n.uuidBase[:])
	n.name = cfg.Name
	if n.name == "" {
		n.name = "node-" + n.uid.String()[:8]
	}
	n.log = n.log.With("node", n.name)
	n.ctx, n.cancel = context.WithCancel(context.Background())
	n.actorsCtx, n.cancelActors = context.WithCancel(n.ctx)
	n.dialCtx, n.dialCancel = context.WithCancel(n.ctx)
	n.epoch = time.Now()
	var err error
	switch {
	case n.etcdConfigured():
		err = n.startEtcdRegistry(ctx)
	case cfg.Discovery || len(cfg.RegistryAddrs) > 0 || cfg.EnsureRegistry:
		err = n.bootstrap(ctx)
	default:
		err = n.listenAll(ctx, cfg.Listen)
	}
	if err == nil && cfg.ServeRegistry && n.reg() == nil {
		err = n.startRegistrar()
	}
	if err == nil {
		err = n.startStatsActor()
	}
	if err != nil {
		n.Close()
		return nil, err
	}
	for _, l := range n.listeners {
		n.wg.Go(func() { n.acceptLoop(l) })
	}
	n.wg.Go(n.heartbeatLoop)
	if err := n.registerNode(ctx); err != nil {
		n.Close()
		return nil, err
	}
	return n, nil
}

// listenAll binds every address in list.
func (n *Node) listenAll(ctx context.Context, list []string) error {
	for _, s := range list {
		a, err := ParseAddr(s)
		if err == nil {
			err = n.listen(ctx, a)
		}
		if err != nil {
			return fmt.Errorf("listen on %q: %w", s, err)
		}
	}
	return nil
}

func (n *Node) listen(ctx context.Context, a Addr) error {
	_, err := n.listenOne(ctx, a)
	return err
}

// listenOne binds a and adds it to the node's listeners and addresses;
// the caller starts its accept loop.
func (n *Node) listenOne(ctx context.Context, a Addr) (net.Listener, error) {
	var lc net.ListenConfig
	if a.IsUnix() {
		if err := checkSocketPath(a.address); err != nil {
			return nil, err
		}
		// A missing directory is created for the socket, private to this
		// user; an existing one is left as it is.
		if err := os.MkdirAll(filepath.Dir(a.address), 0o700); err != nil {
			return nil, err
		}
		// Hold a lock beside the socket while deciding whether an existing
		// file is stale: another process may be between its bind and its
		// listen, when the file exists but refuses connections.
		unlock, err := lockFile(a.address + ".lock")
		if err != nil {
			return nil, err
		}
		defer unlock()
		if err := removeStaleSocket(a.address); err != nil {
			return nil, err
		}
	}
	l, err := lc.Listen(ctx, a.network, a.address)
	if err != nil {
		return nil, err
	}
	bound := a
	if !a.IsUnix() {
		bound = TCPAddr(l.Addr().String())
	}
	n.lmu.Lock()
	if n.isClosed() {
		n.lmu.Unlock()
		l.Close()
		return nil, ErrNodeClosed
	}
	n.listeners = append(n.listeners, l)
	addrs := append(slices.Clone(n.addrList()), bound)
	n.addrsP.Store(&addrs)
	n.lmu.Unlock()
	return l, nil
}

// addrList returns the node's bound addresses; the slice is never
// changed (a node that binds another address stores a new one).
func (n *Node) addrList() []Addr {
	if p := n.addrsP.Load(); p != nil {
		return *p
	}
	return nil
}

// maxSocketPath is the longest Unix socket path the platform accepts
// (sun_path less its terminating NUL): 107 bytes on Linux and Windows,
// 103 on the BSDs and macOS.
var maxSocketPath = func() int {
	switch runtime.GOOS {
	case "linux", "windows", "android":
		return 107
	}
	return 103
}()

// checkSocketPath refuses a Unix socket path the kernel cannot bind,
// naming the path and the limit.
func checkSocketPath(path string) error {
	if len(path) > maxSocketPath {
		return fmt.Errorf("unix socket path %s is %d bytes; %s allows at most %d (use a shorter path, or a shorter XDG_RUNTIME_DIR)", path, len(path), runtime.GOOS, maxSocketPath)
	}
	return nil
}

// lockFile takes an exclusive advisory lock on path (creating it) and
// returns its release. A lock file may be removed by [removeLockFile]
// while another process waits for it, so once locked, the file must still
// be the one at path; otherwise the lock is taken again on the new one.
func lockFile(path string) (func(), error) {
	for {
		f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
		if err != nil {
			return nil, err
		}
		if err := flock(f, true); err != nil {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		if stillAt(f, path) {
			return func() {
				flock(f, false)
				f.Close()
			}, nil
		}
		flock(f, false)
		f.Close()
	}
}

// stillAt reports whether the open file f is the file path names now.
func stillAt(f *os.File, path string) bool {
	held, err1 := f.Stat()
	now, err2 := os.Stat(path)
	return err1 == nil && err2 == nil && os.SameFile(held, now)
}

// removeLockFile deletes the lock file beside a Unix socket this node
// listened on, under the lock itself, so that no other process is between
// its lock and its listen; a process that opened the file before it went
// sees that it is gone and locks a new one ([lockFile]).
func removeLockFile(path string) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return
	}
	defer f.Close()
	if flock(f, true) != nil {
		return
	}
	if stillAt(f, path) {
		os.Remove(path)
	}
	flock(f, false)
}

// removeStaleSocket deletes a Unix socket file that nobody listens on any
// more (left by a crashed process). A live socket or any other kind of
// file is left alone, and the listen fails.
func removeStaleSocket(path string) error {
	fi, err := os.Lstat(path)
	if err != nil || fi.Mode()&os.ModeSocket == 0 {
		return nil
	}
	c, err := net.DialTimeout("unix", path, time.Second)
	if err == nil {
		c.Close()
		return fmt.Errorf("unix socket %s: %w", path, errAddrInUse)
	}
	return os.Remove(path)
}

// UID returns this node incarnation's uid.
func (n *Node) UID() NodeUID { return n.uid }

// Name returns the node's name.
func (n *Node) Name() string { return n.name }

// Addrs returns the addresses the node actually bound, in the order of
// [Config.Listen] (with real ports in place of port 0).
func (n *Node) Addrs() []Addr { return slices.Clone(n.addrList()) }

// Events returns the node's event stream.
func (n *Node) Events() *Events { return &n.events }

// reg returns the registry this node serves, or nil. A node may become a
// registrar while it runs (taking over a registry address whose registrar
// is gone), so it is read atomically.
func (n *Node) reg() *regTable { return n.regP.Load() }

// isClosed reports whether Close or Shutdown has begun.
func (n *Node) isClosed() bool {
	select {
	case <-n.done:
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
func (n *Node) workDone() <-chan struct{} { return n.actorsCtx.Done() }

// workOver reports whether workDone is closed.
func (n *Node) workOver() bool { return n.actorsCtx.Err() != nil }

// flushBegun reports whether the shutdown reached PhaseFlush (at once for
// Close): sessions are no longer resumed.
func (n *Node) flushBegun() bool {
	select {
	case <-n.flushing:
		return true
	default:
		return false
	}
}

// Done returns a channel that is closed when the node begins to close.
func (n *Node) Done() <-chan struct{} { return n.done }

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

// addActor enters a new cell in the path table.
func (n *Node) addActor(path string, h *handle) error {
	n.amu.Lock()
	defer n.amu.Unlock()
	if n.closing {
		return ErrNodeClosed
	}
	if _, ok := n.actors[path]; ok {
		return fmt.Errorf("%w: %s", ErrNameTaken, path)
	}
	n.actors[path] = h
	if isPublic(path) {
		n.byName[h.name()] = append(n.byName[h.name()], h)
	}
	n.live.Add(1)
	return nil
}

// registerPath enters an adapter or an ask promise in the path table.
func (n *Node) registerPath(path string, h *handle) {
	n.amu.Lock()
	n.actors[path] = h
	n.amu.Unlock()
}

func (n *Node) removeActor(path string) {
	n.amu.Lock()
	defer n.amu.Unlock()
	h := n.actors[path]
	delete(n.actors, path)
	if h == nil || !isPublic(path) {
		return
	}
	name := h.name()
	list := slices.DeleteFunc(n.byName[name], func(x *handle) bool { return x == h })
	if len(list) == 0 {
		delete(n.byName, name)
	} else {
		n.byName[name] = list
	}
}

// lookup returns the handle of the local actor at path, checking the uuid
// when one is given. nil if there is none (or another incarnation lives
// there).
func (n *Node) lookup(path string, uuid UUID) *handle {
	n.amu.RLock()
	h := n.actors[path]
	n.amu.RUnlock()
	if h == nil || uuid != (UUID{}) && h.key.uuid != uuid {
		return nil
	}
	return h
}

func (n *Node) newUUID() UUID {
	u := UUID(n.uuidBase)
	seq := n.uuidSeq.Add(1)
	binary.BigEndian.PutUint64(u[8:], binary.BigEndian.Uint64(u[8:])^seq)
	return u
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

// Accept errors other than a closed listener (out of file descriptors, a
// connection aborted before it was accepted, …) pass: the loop waits
// acceptBackoffMin, doubling up to acceptBackoffMax while they last, as
// net/http's server does, so that a moment without descriptors never stops
// the listener for good.
const (
	acceptBackoffMin = 5 * time.Millisecond
	acceptBackoffMax = time.Second
)

// unixBuffer is the socket buffer asked for on a Unix-socket connection
// (the kernel caps it at its maximum, on Linux net.core.wmem_max and
// rmem_max). Loopback TCP's buffers grow by themselves; a Unix socket's
// stay at the default, about 200 KiB on Linux, and a stream of small
// messages then waits on the socket more often (about 5 % of the
// cross-process throughput, see BENCHMARKS.md).
const unixBuffer = 1 << 20

// sizeBuffers sets the socket buffers of a Unix-socket connection.
func sizeBuffers(c net.Conn) {
	if uc, ok := c.(*net.UnixConn); ok {
		uc.SetReadBuffer(unixBuffer)
		uc.SetWriteBuffer(unixBuffer)
	}
}

// acceptLoop accepts connections on l until the node closes it.
func (n *Node) acceptLoop(l net.Listener) {
	var backoff time.Duration
	for {
		c, err := l.Accept()
		if err == nil {
			sizeBuffers(c)
		}
		if err != nil {
			if errors.Is(err, net.ErrClosed) || n.isClosed() {
				return
			}
			n.acceptErrors.Add(1)
			if backoff == 0 {
				backoff = acceptBackoffMin
				n.log.Warn("troupe: accept failed; retrying with backoff", "addr", l.Addr().String(), "err", err)
			} else {
				backoff = min(2*backoff, acceptBackoffMax)
			}
			t := time.NewTimer(backoff)
			select {
			case <-t.C:
			case <-n.done:
				t.Stop()
				return
			}
			continue
		}
		if backoff != 0 {
			n.log.Info("troupe: accepting again", "addr", l.Addr().String(), "failed", n.acceptErrors.Load())
			backoff = 0
		}
		src, ok := n.admit(c)
		if !ok {
			n.log.Debug("troupe: refused a connection over the limits", "remote", c.RemoteAddr().String(),
				"inbound", n.inbound.Load(), "handshaking", n.handshaking.Load())
			c.Close()
			continue
		}
		if f := n.cfg.fault; f != nil {
			c = f.accepted(n, c)
		}
		if n.cfg.TLS != nil && c.LocalAddr().Network() == "tcp" {
			c = tls.Server(c, n.cfg.TLS)
		}
		n.wg.Go(func() {
			defer n.inbound.Add(-1)
			n.serveInbound(c, src)
		})
	}
}

// sourceOf names where an accepted connection comes from, for the fair
// share of handshakes: its IP address, or "unix" for a Unix socket.
func sourceOf(c net.Conn) string {
	if ta, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		return ta.IP.String()
	}
	return "unix"
}

// admit counts an accepted connection against the limits: open inbound
// connections, pending handshakes, and the pending handshakes of its
// source, which may hold at most a quarter of them (at least 4), so that
// one source flooding the node cannot keep everyone else out. It returns
// the source to release with endHandshake.
func (n *Node) admit(c net.Conn) (string, bool) {
	src := sourceOf(c)
	n.hsMu.Lock()
	defer n.hsMu.Unlock()
	share := max(4, n.cfg.MaxPendingHandshakes/4)
	if n.inbound.Load() >= int64(n.cfg.MaxInboundConns) || n.handshaking.Load() >= int64(n.cfg.MaxPendingHandshakes) || n.hsBySource[src] >= share {
		return "", false
	}
	if n.hsBySource == nil {
		n.hsBySource = make(map[string]int)
	}
	n.hsBySource[src]++
	n.inbound.Add(1)
	n.handshaking.Add(1)
	return src, true
}

// handshakeDone releases what admit counted for a handshake from src.
func (n *Node) handshakeDone(src string) {
	n.hsMu.Lock()
	defer n.hsMu.Unlock()
	if n.hsBySource[src]--; n.hsBySource[src] <= 0 {
		delete(n.hsBySource, src)
	}
	n.handshaking.Add(-1)
}

// peerLabel names a connection's remote end for logs and errors.
func peerLabel(c net.Conn) string {
	if ra := c.RemoteAddr(); ra != nil && ra.String() != "" && ra.String() != "@" {
		return ra.Network() + "://" + ra.String()
	}
	return c.LocalAddr().Network() + "://" + strings.TrimPrefix(c.LocalAddr().String(), "@") + " (peer)"
}

var _ io.Closer = (*Node)(nil)

// liveAssocs counts associations that are up and not retired (for tests
// and introspection).
func (n *Node) liveAssocs() int {
	n.pmu.Lock()
	defer n.pmu.Unlock()
	return len(n.byUID)
}

// bytesWritten sums the bytes written on every live association.
func (n *Node) bytesWritten() uint64 {
	n.pmu.Lock()
	defer n.pmu.Unlock()
	var sum uint64
	for a := range n.all {
		sum += a.written.Load()
	}
	return sum
}

// dial connects to addr, through the fault network if the node is on one.
func (n *Node) dial(addr Addr) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(n.dialCtx, n.cfg.DialTimeout)
	defer cancel()
	if f := n.cfg.fault; f != nil {
		return f.dial(ctx, n, addr)
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, addr.network, addr.address)
	if err == nil {
		sizeBuffers(c)
	}
	if err != nil || n.cfg.TLS == nil || addr.IsUnix() {
		return c, err
	}
	tc := n.clientTLS(c, addr)
	if err := tc.HandshakeContext(ctx); err != nil {
		c.Close()
		return nil, fmt.Errorf("tls: %w", err)
	}
	return tc, nil
}

// endMemberAssoc ends the association to a cluster member's uid, if any,
// without quarantine (members are never quarantined).
func (n *Node) endMemberAssoc(uid NodeUID, cause error) {
	n.pmu.Lock()
	a := n.byUID[uid]
	n.pmu.Unlock()
	if a != nil {
		a.fail(cause)
	}
}

// isMember reports whether uid is a member of a cluster this node is in.
func (n *Node) isMember(uid NodeUID) bool {
	_, ok := n.members.Load(uid)
	return ok
}
