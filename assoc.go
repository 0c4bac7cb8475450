package troupe

import (
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Errors about associations.
var (
	// ErrPeerLeft is the reason watchers get in [Terminated], and pending
	// asks and dead letters carry, when a peer node closed gracefully.
	ErrPeerLeft = errors.New("troupe: peer node left")
	// ErrSessionEnded is the dead-letter reason for a message sent through
	// a ref whose association has ended; the error also wraps the cause.
	// Resolve the actor again to reach it over a new association.
	ErrSessionEnded = errors.New("troupe: association session ended")
	// ErrSendQueueFull is the dead-letter reason when an association holds
	// [Config.SendQueueLimit] bytes for its peer (waiting to be written,
	// or not yet acknowledged).
	ErrSendQueueFull = errors.New("troupe: send queue full")
	// ErrPeerShuttingDown is the error of an [Ask] (or a [Resolve]) of an
	// actor on a node that is shutting down: it said so (Shutdown's
	// [PhaseRefuse]) and takes no new work, while it finishes what it
	// has. Find the name again: the registry no longer lists that node.
	ErrPeerShuttingDown = errors.New("troupe: peer node is shutting down")
	// errSessionReplaced ends a suspended session whose peer connected
	// again without resuming it (the peer holds it no more), or a session
	// the dialer refused after the welcome.
	errSessionReplaced = errors.New("the peer started a new session")
	// ErrTooManyConns is wrapped by the error of a dial past
	// [Config.MaxOutboundConns].
	ErrTooManyConns = errors.New("troupe: too many connections")
	// ErrRejected is wrapped by the error of a connection the peer refused
	// in the handshake; the text says why.
	ErrRejected = errors.New("troupe: connection rejected by peer")
)

// sessionError says that an association ended and why.
type sessionError struct {
	peer  string
	cause error
	// observer: the peer was an Observer; what could not be delivered to
	// it is logged at debug level only.
	observer bool
}

// Error says what ended. A dial that failed is reported by its cause
// alone ("cannot connect: connection refused"): every caller names the
// address already.
func (e *sessionError) Error() string {
	if op, ok := errors.AsType[*net.OpError](e.cause); ok && op.Op == "dial" {
		cause := op.Err
		if sc, ok := cause.(*os.SyscallError); ok {
			cause = sc.Err
		}
		return fmt.Sprintf("cannot connect: %v", cause)
	}
	return fmt.Sprintf("association with %s ended: %v", e.peer, e.cause)
}

func (e *sessionError) Unwrap() []error { return []error{ErrSessionEnded, e.cause} }

// outRec is one frame waiting to be written: a user message for h, or
// (h nil) a control frame already encoded, kind byte first, in msg.
type outRec struct {
	h   *handle
	msg any
	mt  *msgType
	pb  *payloadBuf // msg already encoded (for this session's peer), if not nil
	// wait: sent with Send, which waits for credit rather than fail.
	wait bool
	hd   Headers // the message's headers, if any
}

// ctlFrame is the body of a control frame in an outRec; answerFrame the
// body of an answer to one of the peer's requests.
type (
	ctlFrame    []byte
	answerFrame []byte
)

// inWatch is a watch a remote actor placed on a local one: the local
// target's path and uuid, and the remote watcher's path.
type inWatch struct {
	target  string
	uuid    UUID
	watcher string
}

// watchPair records that a local watcher watches an actor over this
// association, so that a lost link can tell the watcher.
type watchPair struct {
	target  refKey
	watcher *handle
}

// assoc is one association session with a peer node: one connection, one
// reader and one writer goroutine, and the tables that frames refer to. A
// new connection is a new session; refs obtained through a session keep
// pointing at it.
type assoc struct {
	n        *Node
	outbound bool // this node dialed
	dialAddr Addr // the address dialed (outbound only)

	// Set once when the handshake completes, before ready is closed.
	peerUID  NodeUID
	peerName string
	// peerAppVersion is the peer's Config.AppVersion, from its hello.
	peerAppVersion string
	// What the connections of this session before this one carried (a
	// resumed session's counts go on; mu).
	bytesInBase, bytesOutBase, tellsOutBase uint64
	peerFlags                               uint8  // the peer's hello flags
	peerAddrs                               []Addr // as the peer announced them: claims, not proof
	// proven (peers.mu) are the addresses this node dialed and found this
	// peer at: this session's, and those of duplicates merged into it.
	proven []Addr
	conn   net.Conn
	// resumable: both sides sequence every queued frame, and a broken
	// connection suspends the session instead of ending it (set by the
	// handshake, before the reader and writer start).
	resumable bool
	// observer: the peer is an Observer (Config.Observer): it is not
	// listed, published, resumed or quarantined (set by the handshake).
	observer bool
	// peerHeaders: the peer takes tells with headers (set by the
	// handshake); another gets messages without their headers.
	peerHeaders bool
	// credit: both sides grant and heed per-actor credit (set by the
	// handshake, before the reader and writer start).
	credit bool
	// inShapes (the reader's) holds the shapes the peer sent for wire
	// keys it has not yet defined in the session; shapeBytes counts
	// their bytes (at most maxShapeSession are held).
	inShapes   map[string]*rawShape
	shapeBytes int
	// incompatLogged (the reader's) holds the wire keys whose
	// incompatible messages this session has logged.
	incompatLogged map[string]struct{}
	// peerDraining (mu): the peer said it is shutting down (a draining
	// frame): asks and resolves of its users' actors are refused.
	peerDraining bool
	// The credit due to the peer's senders (credit.go): accounts for the
	// writer to consider granting.
	cmu    mutex[lkAssocCredit]
	due    []*creditAcct
	hasDue atomic.Bool
	// Session tokens (token.go), set by the handshake before attach.
	// tokens: the peer speaks them. nonce: the dialer's nonce in this
	// connection's hello. challenged: the nonce of the token challenge
	// this node sent as the acceptor, if it sent one. proof: the peer's
	// proof of its claim (the acceptor's, from its welcome; the dialer's,
	// answering the challenge).
	tokens                   bool
	nonce, challenged, proof []byte
	// sendToken: this node's token goes first on the connection (it
	// founds the session, or its peer proved it: token.go).
	sendToken bool
	// peerToken (mu) is the token the peer gave this node for the
	// session: a new connection that would take the session over must
	// prove that it holds it.
	peerToken []byte
	// dialNum is the number of the dial that made this connection (hello
	// extension 5): this node's for an outbound one, the peer's for an
	// inbound one; 0 when the peer does not order dials by them (set by
	// the handshake, before attach decides).
	dialNum   uint64
	resumeOf  *assoc // outbound: the suspended session this connection was dialed to resume
	resumed   bool   // this connection resumes a session: its first frame is a resume
	resumeRcv uint64 // what that resume frame says this side received
	// resumes (peers.mu) is the suspended session this connection takes
	// over, set by attach before the merge.
	resumes   *assoc
	ready     chan struct{} // closed (once, by closeReady) when up, merged or closed
	readyOnce sync.Once
	stopOnce  sync.Once
	dialOnce  sync.Once // an outbound association dials on first use
	// binding (peers.mu): an outbound association made for a ref read from
	// a message, not yet dialed: counted in peers.bindings, not
	// peers.outbound.
	binding bool
	// bound (peers.mu) counts the refs bound to this binding that are still
	// reachable: at zero, undialed and not pinned, it is forgotten
	// (releaseBinding). pinned: this node's own use found it.
	bound  int
	pinned bool
	// mergedTo is mergedInto, for readers that hold the peer table's lock, not mu.
	mergedTo atomic.Pointer[assoc]
	// refsOf (peers.mu) is the peer whose refs made this binding; dialFor
	// is that peer once the binding dials, counted in peers.refDials until
	// the association ends. Zero for this node's own dials.
	refsOf, dialFor NodeUID

	// mu guards everything below up to the writer's fields.
	mu   mutex[lkAssoc]
	life life   // the session's state: moved only by transition (assoc_transition.go)
	qgen uint64 // counts the times queue was taken (see encodeQueued)
	// queue holds frames as records until the writer has started, so
	// that the session's tables are final (a resume takes them over);
	// from then on (encoding) senders encode into out on their own
	// goroutines, and the writer moves queued records into out first.
	queue recQueue
	// creditStalled: the queue's head is a Send that waits for the
	// peer's credit (its actor takes no messages), holding up everything
	// queued behind it — answers among them, which are then not the
	// peer's unread answers (see answer).
	creditStalled bool
	out           frameChain // encoded frames waiting to be written
	pending       map[pendingAsk]struct{}
	resolves      map[uint64]chan resolveAnswer
	watches       map[watchPair]struct{}
	// watchedBy holds the watches the peer's actors placed on this node's
	// actors, so that they are dropped when the session ends.
	watchedBy watchSet

	wake       chan struct{} // capacity 1: the writer has work
	stop       chan struct{} // closed when the session ends or is suspended: the writer exits
	writerDone chan struct{} // closed when the writer has exited
	readerDone chan struct{} // closed when the reader has exited
	// room (mu), made by a sender waiting for room in the queue (Send), is
	// closed when the writer takes the queue, or the session ends or moves.
	room chan struct{}
	// credited (mu), made by a Send waiting for a remote actor's credit,
	// is closed by a grant, or when the session ends or moves.
	credited chan struct{}

	written  atomic.Uint64 // bytes written to the connection
	in       *stampReader  // the connection's reading side; nil until connected
	tellsOut atomic.Uint64 // tell frames written to the connection
	rtt      time.Duration // the handshake's round trip (outbound; under mu)
	beat     atomic.Bool   // the writer owes the peer a heartbeat
	ackTo    atomic.Uint64 // tell frames received that the writer should acknowledge

	// Delivery confirmation, guarded by mu: unacked holds the frames
	// written and not yet acknowledged by the peer, in order (unackedSeq
	// counts the sequenced ones), and acked counts those acknowledged.
	// While the writer writes (writing), blocks an acknowledgement frees
	// wait in freed.
	unacked frameChain
	acked   uint64
	writing bool
	freed   []*frameBlock

	// The out tables and the encoder, guarded by mu: the senders encode.
	// outTargetKeys and outTypeList are the tables by id less one, to
	// decode a held frame again for its dead letter.
	outTypes      map[*msgType]uint32
	outTargets    map[refKey]uint32
	outTargetKeys []refKey
	outTypeList   []*msgType
	// Credit (mu; see credit.go): how many messages the peer's mailboxes
	// take (0 not yet known, -1 no limit), and, for each target in
	// outTargetKeys, the messages sent to it and the credit granted for
	// it besides that.
	peerMailbox int64
	outSent     []int64
	outGranted  []int64
	lastType    *msgType // the type of the last message encoded, if in the table
	lastTypeID  uint32
	hdr         []byte // scratch for a tell's header
	// The window (mu): the writer stalled with UnackedLimit bytes
	// unacknowledged, and when the peer's acknowledgements last moved
	// (or something became outstanding).
	stalled  bool
	ackMoved time.Time
	// writeDeadline (mu) is the connection's write deadline, moved ahead
	// as the writer writes.
	writeDeadline time.Time
	// endingAt (Unix ns) is when this node gave up on the peer; the
	// heartbeat loop closes the connection byeGrace after it, if the
	// writer has not (see abort).
	endingAt atomic.Int64

	// Owned by the node's heartbeat goroutine.
	det      windowDetector
	lastBeat time.Time
	// judged: the window decides about this peer (it is no member whose
	// liveness the cluster judges, or this node flushes); when it becomes
	// so, the window starts then, not at the last bytes heard.
	judged bool

	// Owned by the writer goroutine.
	iov     net.Buffers   // the buffers of one write
	bufs    [][]byte      // the blocks it writes
	prio    []byte        // its heartbeat and acknowledgement
	ackSent uint64        // the last acknowledgement written
	spent   []*frameBlock // blocks a write copied, to recycle after it
	wiov    net.Buffers   // what WriteTo consumes

	// Owned by the reader goroutine.
	inTypes   []inType
	inTargets []inTarget
	dec       decoder
	rcvTells  uint64 // tell frames received
	batch     []wireMsg
	batchTo   batchTarget // the target of batch
	batchID   uint64      // its table id (0: none, or defined inline)
	batchPath string      // its path, for dead letters
	arena     []uint64    // the plain values of batch
	ackQueued uint64      // the last count handed to the writer to acknowledge
	ackBytes  int         // bytes received since then
}

// inTarget is an entry of the receive-side target table.
type inTarget struct {
	path   string
	uuid   UUID
	target localTarget // nil if no such actor
	batch  batchTarget // target, if it takes batches
	acct   *creditAcct // its credit (a session with credit, a tabled target)
}

type resolveAnswer struct {
	status byte
	uuid   UUID
	proto  string
	err    error // the session ended before the answer came
}

func newAssoc(n *Node, outbound bool, dial Addr) *assoc {
	a := &assoc{
		n:          n,
		outbound:   outbound,
		dialAddr:   dial,
		ready:      make(chan struct{}),
		wake:       make(chan struct{}, 1),
		stop:       make(chan struct{}),
		writerDone: make(chan struct{}),
		readerDone: make(chan struct{}),
		pending:    make(map[pendingAsk]struct{}),
		resolves:   make(map[uint64]chan resolveAnswer),
		watches:    make(map[watchPair]struct{}),
		outTypes:   make(map[*msgType]uint32),
		outTargets: make(map[refKey]uint32),
	}
	a.dec.binder = a
	return a
}

// addr is the address to show for the peer: the one dialed, else its first
// listen address.
func (a *assoc) addr() Addr {
	if a.outbound {
		return a.dialAddr
	}
	if len(a.peerAddrs) > 0 {
		return a.peerAddrs[0]
	}
	return Addr{}
}

func (a *assoc) label() string {
	if ad := a.addr(); !ad.IsZero() {
		return ad.String()
	}
	return a.peerName + " (" + a.peerUID.String()[:8] + ")"
}

// finish releases what every ended session releases: its place in the
// node's tables and anyone waiting on ready or stop.
func (a *assoc) finish() {
	n := a.n
	if n.credit.waiting.Load() > 0 {
		a.forgetCredit()
	}
	n.peers.untable(a)
	n.peers.mu.Lock()
	n.peers.forgetAssoc(a)
	if w := n.peers.awaiting[a.peerUID]; len(w) > 0 {
		// A duplicate parked for the winner it never saw: it must not
		// hold its association for ever.
		if w = slices.DeleteFunc(w, func(x *assoc) bool { return x == a }); len(w) == 0 {
			delete(n.peers.awaiting, a.peerUID)
		} else {
			n.peers.awaiting[a.peerUID] = w
		}
	}
	n.peers.mu.Unlock()
	a.closeReady()
	a.stopOnce.Do(func() { close(a.stop) })
}

// lastHeard is when bytes from the peer last arrived; zero if never.
func (a *assoc) lastHeard() time.Time {
	if a.in == nil {
		return time.Time{}
	}
	at := a.in.heard.Load()
	if at == 0 {
		return time.Time{}
	}
	return a.n.epoch.Add(time.Duration(at))
}

func (a *assoc) closeReady() { a.readyOnce.Do(func() { close(a.ready) }) }

// run starts the writer and runs the reader on the calling goroutine.
func (a *assoc) run(fr *frameReader) {
	a.n.wg.Go(a.writeLoop)
	a.readLoop(fr)
	close(a.readerDone)
}

// failure returns the error a send through this session gets once it has
// ended.
func (a *assoc) failure() error {
	a = a.lockTarget()
	defer a.mu.Unlock()
	if a.life.state < assocLeaving {
		return nil
	}
	if a.life.state == assocLeaving || a.life.err == nil {
		return &sessionError{peer: a.label(), cause: ErrNodeClosed, observer: a.observer}
	}
	return &sessionError{peer: a.label(), cause: a.life.err, observer: a.observer}
}

// target returns the association that frames for a go to (following
// merges), locked. The caller unlocks it.
func (a *assoc) lockTarget() *assoc {
	a.mu.Lock()
	for a.life.mergedInto != nil {
		next := a.life.mergedInto
		a.mu.Unlock()
		a = next
		a.mu.Lock()
	}
	return a
}

// addPending records an ask waiting on the peer, or says why it cannot
// be made: the session ended, or (for new work, an ask of an actor the
// peer's users spawned) the peer said it is shutting down.
func (a *assoc) addPending(p pendingAsk, work bool) error {
	a = a.lockTarget()
	if a.life.state >= assocLeaving {
		a.mu.Unlock()
		return a.failure()
	}
	if work && a.peerDraining {
		err := a.drainingError()
		a.mu.Unlock()
		return err
	}
	a.pending[p] = struct{}{}
	a.mu.Unlock()
	return nil
}

// shuttingDown says whether the peer said it is shutting down.
func (a *assoc) shuttingDown() bool {
	t := a.lockTarget()
	defer t.mu.Unlock()
	return t.peerDraining
}

// drainingError is the error of new work refused because the peer is
// shutting down (a.mu held).
func (a *assoc) drainingError() error {
	return fmt.Errorf("%w: %s takes no new asks", ErrPeerShuttingDown, a.label())
}

// isWork says whether path names an actor that users spawned (new work
// for its node), not a system actor or an ask's reply address.
func isWork(path string) bool { return strings.HasPrefix(path, "/user/") }

func (a *assoc) removePending(p pendingAsk) {
	a = a.lockTarget()
	delete(a.pending, p)
	a.mu.Unlock()
}

// watch registers watcher's interest in the remote actor target.
func (a *assoc) watch(target, watcher *handle) error {
	if len(watcher.key.path) > maxWatchPath {
		return fmt.Errorf("%w: the watcher's path is %d bytes; at most %d cross to another node", ErrWatchRefused, len(watcher.key.path), maxWatchPath)
	}
	var scratch [watchScratch]byte
	body := appendWatch(scratch[:0], frameWatch, watchBody{path: target.key.path, uuid: target.key.uuid, watcher: watcher.key.path})
	a = a.lockTarget()
	if a.life.state >= assocLeaving {
		a.mu.Unlock()
		return a.failure()
	}
	a.watches[watchPair{target.key, watcher}] = struct{}{}
	if a.life.state >= assocEnding {
		a.mu.Unlock() // (recorded: the end tells the watcher)
		return nil
	}
	a.controlLocked(body)
	return nil
}

func (a *assoc) unwatch(target, watcher *handle) {
	var scratch [watchScratch]byte
	body := appendWatch(scratch[:0], frameUnwatch, watchBody{path: target.key.path, uuid: target.key.uuid, watcher: watcher.key.path})
	a = a.lockTarget()
	delete(a.watches, watchPair{target.key, watcher})
	if a.life.state >= assocEnding {
		a.mu.Unlock()
		return
	}
	a.controlLocked(body)
}

// watchScratch is room, on the stack, for the watch and unwatch frames of
// the usual paths (an Ask's among them): no allocation for them.
const watchScratch = 192

// dropWatchedBy ends the peer's watches of this node's actors, with the
// session they were placed in.
func (a *assoc) dropWatchedBy(ws map[inWatch]*handle) {
	for w, target := range ws {
		target.local.sysPush(sysMsg{kind: sysUnwatch, ref: &handle{node: a.n, key: refKey{node: a.peerUID, path: w.watcher}, assoc: a}})
	}
}

// signal sends a signal to the remote actor h; only terminations cross.
func (a *assoc) signal(h *handle, m sysMsg) {
	if m.kind != sysTerminated {
		return
	}
	t := a.lockTarget() // the session that holds the peer's watches now
	t.watchedBy.remove(inWatch{m.key.path, m.key.uuid, h.key.path})
	t.mu.Unlock()
	ask := strings.HasPrefix(h.key.path, "/temp/")
	if m.reason == ErrNodeClosed && a.n.lc.isClosed() && !ask {
		// This node is shutting down: the goodbye that follows tells the
		// peer's watchers, as ErrPeerLeft, rather than one frame each.
		// (A peer's Ask is told at once.)
		return
	}
	code, text := reasonCode(m.reason)
	if ask {
		// One per Ask in flight, which the peer's own Asks bound: not an
		// answer the peer could pile up without reading.
		a.control(appendWatch(nil, frameTerminated, watchBody{path: m.key.path, uuid: m.key.uuid, watcher: h.key.path, code: code, text: text}))
		return
	}
	a.answer(appendWatch(nil, frameTerminated, watchBody{path: m.key.path, uuid: m.key.uuid, watcher: h.key.path, code: code, text: text}))
}
