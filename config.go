package troupe

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// defaultEtcdElectionTimeout is etcd's own default election timeout (its
// --election-timeout), which Config.EtcdElectionTimeout assumes when it
// is zero.
const defaultEtcdElectionTimeout = time.Second

// Config: what a node can be told, its defaults, and what Start refuses.

// Config configures a node. The zero value of every field means its
// documented default, so Config{} starts a local-only node.
type Config struct {
	// Name is a human-readable name for logs and handshakes. Default:
	// "node-" and the first 8 hex digits of the node's uid.
	Name string

	// AppVersion is the version of the program running this node, for
	// people: it travels in the handshake and in cluster membership, and
	// is shown by [Node.Stats] (AppVersion in [Stats].Peers and
	// [Stats].Members), the debug page and troupe peers, so that
	// during a rolling upgrade an operator sees which peer runs what. At
	// most 128 bytes of printable UTF-8. Default: empty.
	// troupe never compares versions: whether two versions talk is
	// decided per message type (see docs/upgrades.md).
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
	// anything is allocated for it. Default: 4 MiB.
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
	// counted. A [Worker]'s mailbox takes its room of the largest frames
	// from each producer (WorkConfig.Room × MaxFrameSize × producers)
	// where that is more. Default: 64 MiB. Negative means no limit.
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
	// the most it writes to its peer before the peer acknowledges (it
	// may pass it by one block of frames: 64 KiB, or one message larger
	// than that). Past it the writer waits for an acknowledgement (a reading peer
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

	// QuarantineExpiry is how long a quarantined peer is listed in
	// [Stats].Quarantined (and found by its addresses for
	// [Node.ClearQuarantine]); its uid stays refused after it, as a
	// tombstone. A quarantine binds the incarnation, never the address: a
	// new incarnation at the same address is admitted at any time.
	// Default: 1 h.
	QuarantineExpiry time.Duration

	// RegistryTimeout bounds one request to a registrar: a lookup, a
	// registration, a wait's registration of its waiter. Default: 5 s.
	RegistryTimeout time.Duration

	// EtcdElectionTimeout is the election timeout of the etcd cluster
	// that RegistryAddrs names (etcd's --election-timeout), if it does.
	// The etcd client derives its bounds from it: a member silent for
	// one EtcdElectionTimeout is passed over for the next, and a request
	// goes on trying the members for 3.5 of them, which outlasts an
	// election (see docs/discovery.md, etcd). Default:
	// 1 s, etcd's own default.
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
	// its registrations to it. See docs/discovery.md.
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

	// Observer marks a node that only inspects others, as the troupe
	// command does (Erlang calls such a node hidden): the nodes it
	// connects to do not list it among their peers (Stats counts it under
	// Observers), publish no peer events about it, never resume or
	// quarantine its session, and end it quietly when its connection
	// breaks; what they could not deliver to it is counted as dead letters
	// and logged at debug level only. An observer cannot listen, serve a
	// registry or register with one; it asks through [WithRegistries].
	Observer bool

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
	// not logged; troupe's own messages (gossip, stats, registry traffic)
	// and those an Observer's session could not deliver are logged at
	// debug level, outside the count. Default: 10. Negative turns the log
	// off; the
	// [DeadLetter] events are published either way.
	DeadLetterLog int

	// OnSend, if set, is called by every [Ref.Send] and [Ask] of this
	// node, before the message goes, with the send's context, the
	// target's path, and the headers the message will carry (those of
	// ctx, see [WithHeaders]; an empty map if none), which it may change:
	// a tracer injects the current span there. It runs on the sending
	// goroutine, with no troupe lock held. [Ref.Tell] takes no context
	// and carries no headers. Headers past their bounds fail the send
	// with [ErrBadHeaders].
	OnSend func(ctx context.Context, to string, h Headers)

	// OnReceive, if set, is called on the actor's goroutine for each
	// message that carries headers, in place of the handler: it must call
	// handle once, on its own goroutine before it returns, with the
	// context the handler's [Context.Context] is to return (ctx, the
	// actor's context with the message's headers, or one derived from it:
	// a tracer extracts the remote span from h and starts one of its
	// own). A message it does not hand on is not handled; a second call,
	// or one after OnReceive returned, does nothing. h is a copy of the
	// message's headers. A panic in the handler is the actor's failure,
	// as always, and handle returns normally after it; a panic in
	// OnReceive itself is the actor's failure too.
	//
	// OnSend and OnReceive run for user actors only (paths under
	// "/user/"): troupe's own requests carry no headers.
	OnReceive func(ctx context.Context, to string, h Headers, handle func(ctx context.Context))

	// attachHook (tests) is called with each connection whose handshake
	// completed, and the uid its peer claims, before the node decides
	// what becomes of it (done false) and after (done true), on the
	// connection's goroutine: a test holds it there to force an order.
	attachHook func(a *assoc, peer NodeUID, done bool)

	// fault routes the node's connections through a fault network (set
	// by FaultNet.Start).
	fault *FaultNet
	// priorRelease (tests) makes the node speak the protocol as a node of
	// the release before session tokens and dial numbers did: no hello
	// extensions 4 and 5, no token frames, no token challenge (see
	// token.go).
	priorRelease bool
}

func (c Config) withDefaults() Config {
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.MaxFrameSize == 0 {
		c.MaxFrameSize = defaultMaxFrameSize
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
		c.EtcdElectionTimeout = defaultEtcdElectionTimeout
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
	case len(c.AppVersion) > maxAppVersion:
		return fmt.Errorf("%w: AppVersion is %d bytes, at most %d", ErrBadConfig, len(c.AppVersion), maxAppVersion)
	case strings.ContainsFunc(c.AppVersion, func(r rune) bool { return r == utf8.RuneError || !unicode.IsPrint(r) }):
		return fmt.Errorf("%w: AppVersion %q is not printable UTF-8", ErrBadConfig, c.AppVersion)
	case len(c.Name) > 255:
		return fmt.Errorf("%w: Name longer than 255 bytes", ErrBadConfig)
	case c.Observer && (len(c.Listen) > 0 || c.ServeRegistry || c.EnsureRegistry || len(c.RegistryAddrs) > 0 || c.Discovery):
		return fmt.Errorf("%w: an Observer cannot listen, serve a registry or register with one (set none of Listen, ServeRegistry, EnsureRegistry, RegistryAddrs, Discovery)", ErrBadConfig)
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

// mailboxCredit is what this node announces: its MailboxLimit, or 0 for
// none (no credit is counted).
func (cfg *Config) mailboxCredit() int64 { return min(int64(cfg.MailboxLimit), maxCredit) }
