package troupe

import (
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
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
	// peer is what the handshake learned of the peer and agreed with it
	// (handshake.go): complete before ready is closed and the reader and
	// writer start, read-only from then on.
	peer peerInfo
	// open is what the writer sends first, as attach decided.
	open opening

	conn net.Conn
	// peerDraining (mu): the peer said it is shutting down (a draining
	// frame): asks and resolves of its users' actors are refused.
	peerDraining bool
	due          creditDue // the credit due to the peer's senders (credit.go)
	// peerToken (mu) is the token the peer gave this node for the
	// session: a new connection that would take the session over must
	// prove that it holds it.
	peerToken []byte
	resumeOf  *assoc        // outbound: the suspended session this connection was dialed to resume
	ready     chan struct{} // closed (once, by closeReady) when up, merged or closed
	readyOnce sync.Once
	stopOnce  sync.Once
	dialOnce  sync.Once // an outbound association dials on first use
	// mergedTo is mergedInto, for readers that hold the peer table's lock, not mu.
	mergedTo atomic.Pointer[assoc]

	// mu guards the session's state and everything below it up to wake.
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
	// dup is what orders this session's frames against a duplicate
	// connection retired into it, or, retiring, against its winner.
	dup  dupOrder
	reqs requests   // what each side asked of the other and awaits
	enc  outTables  // the senders' tables and encoder (send.go)
	win  sendWindow // what was written and not yet acknowledged (assoc_io.go)

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

	in      *stampReader  // the connection's reading side; nil until connected
	traffic trafficCounts // what the session carried (stats.go)
	beat    atomic.Bool   // the writer owes the peer a heartbeat
	ackTo   atomic.Uint64 // tell frames received that the writer should acknowledge

	// endingAt (Unix ns) is when this node gave up on the peer; the
	// heartbeat loop closes the connection byeGrace after it, if the
	// writer has not (see abort).
	endingAt atomic.Int64

	hb liveness    // the node's heartbeat goroutine's (detector.go)
	wr assocWriter // the writer goroutine's (assoc_io.go)
	// rd is the reader goroutine's (assoc_reader.go); a session that
	// resumes takes its tables over before its reader starts.
	rd assocReader
	// tab is the peer table's (peers.mu; assoc_table.go).
	tab tableEntry
}

// dupOrder keeps each sender's messages in order across a simultaneous
// dial: the peer reads what a retired duplicate carried before what its
// winner carries, and the retired connection ends with an
// acknowledgement of everything read (see mergeInto, onBye).
type dupOrder struct {
	// behind (mu) counts the duplicates retired into this session whose
	// frames may still be on their way: the writer holds out until none
	// is. ahead (mu) is the winner a retiring session holds back so,
	// until it ends (finish).
	behind int
	ahead  *assoc
	// hold (mu) ends the hold retireHold after it began, if the retiring
	// session has not ended by then.
	hold *time.Timer
	// peerBye: the peer's duplicate-bye was read on this retiring
	// connection (set by the reader): once its own is written, the
	// writer acknowledges all it read and half-closes.
	peerBye atomic.Bool
}

// releaseAhead ends the hold this retiring session put on its winner
// (once: when it ends, or retireHold after it began).
func (a *assoc) releaseAhead() {
	a.mu.Lock()
	w := a.dup.ahead
	a.dup.ahead = nil
	if a.dup.hold != nil {
		a.dup.hold.Stop()
		a.dup.hold = nil
	}
	a.mu.Unlock()
	if w != nil {
		w.mu.Lock()
		w.dup.behind--
		w.mu.Unlock()
		w.notify() // what it held goes now
	}
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

// requests is what each side of a session asked of the other and awaits,
// guarded by the association's lock (mu): when the session ends, the
// asks fail, the resolves are answered and the watches fire or are
// dropped.
type requests struct {
	asks     map[pendingAsk]struct{}       // this node's asks awaiting the peer's answers
	resolves map[uint64]chan resolveAnswer // this node's resolves, by request id
	watches  map[watchPair]struct{}        // this node's actors' watches of the peer's
	// watchedBy holds the watches the peer's actors placed on this
	// node's actors, so that they are dropped when the session ends.
	watchedBy watchSet
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
		reqs: requests{
			asks:     make(map[pendingAsk]struct{}),
			resolves: make(map[uint64]chan resolveAnswer),
			watches:  make(map[watchPair]struct{}),
		},
		enc: outTables{
			types:   make(map[*msgType]uint32),
			targets: make(map[refKey]uint32),
		},
	}
	a.rd.a, a.wr.a, a.hb.a, a.due.a = a, a, a, a
	a.rd.dec.binder = a
	return a
}

// addr is the address to show for the peer: the one dialed, else its first
// listen address.
func (a *assoc) addr() Addr {
	if a.outbound {
		return a.dialAddr
	}
	if len(a.peer.addrs) > 0 {
		return a.peer.addrs[0]
	}
	return Addr{}
}

func (a *assoc) label() string {
	if ad := a.addr(); !ad.IsZero() {
		return ad.String()
	}
	return a.peer.name + " (" + a.peer.uid.String()[:8] + ")"
}

// finish releases what every ended session releases: its place in the
// node's tables and anyone waiting on ready or stop.
func (a *assoc) finish() {
	n := a.n
	a.releaseAhead()
	if n.credit.waiting.Load() > 0 {
		// a stuck actor must not keep an ended session alive
		a.n.credit.forget(a)
	}
	n.peers.untable(a)
	n.peers.mu.Lock()
	n.peers.forgetAssoc(a)
	if w := n.peers.awaiting[a.peer.uid]; len(w) > 0 {
		// A duplicate parked for the winner it never saw: it must not
		// hold its association for ever.
		if w = slices.DeleteFunc(w, func(x *assoc) bool { return x == a }); len(w) == 0 {
			delete(n.peers.awaiting, a.peer.uid)
		} else {
			n.peers.awaiting[a.peer.uid] = w
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
	a.n.wg.Go(a.wr.writeLoop)
	a.rd.readLoop(fr)
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
		return &sessionError{peer: a.label(), cause: ErrNodeClosed, observer: a.peer.observer}
	}
	return &sessionError{peer: a.label(), cause: a.life.err, observer: a.peer.observer}
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
	a.reqs.asks[p] = struct{}{}
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
	delete(a.reqs.asks, p)
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
	a.reqs.watches[watchPair{target.key, watcher}] = struct{}{}
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
	delete(a.reqs.watches, watchPair{target.key, watcher})
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
		target.local.sysPush(sysMsg{kind: sysUnwatch, ref: &handle{node: a.n, key: refKey{node: a.peer.uid, path: w.watcher}, assoc: a}})
	}
}

// signal sends a signal to the remote actor h; only terminations cross.
func (a *assoc) signal(h *handle, m sysMsg) {
	if m.kind != sysTerminated {
		return
	}
	t := a.lockTarget() // the session that holds the peer's watches now
	t.reqs.watchedBy.remove(inWatch{m.key.path, m.key.uuid, h.key.path})
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

// use starts an outbound association's dial, once; the caller has seen it
// not yet leaving.
func (a *assoc) use() {
	if a.outbound {
		a.dialOnce.Do(func() { a.n.wg.Go(func() { a.n.gate.runOutbound(a) }) })
	}
}

// gone reports whether the association has ended (or is ending).
func (a *assoc) gone() bool {
	t := a.lockTarget()
	defer t.mu.Unlock()
	return t.life.state >= assocLeaving
}

// exemptFromQuarantine reports whether a's peer is never quarantined
// when the session ends (quarantine.go). Cluster members are never
// quarantined: they keep knocking on each other until one is downed
// (and the members of a cluster closed here mid-leave, which may not
// know it yet).
// Registrars neither: a registrar is infrastructure, not a peer whose
// actors anyone relies on, and discovery must come back with it.
func (a *assoc) exemptFromQuarantine() bool {
	return a.n.cl.isMember(a.peer.uid) || a.n.cl.wasMember(a.peer.uid) || a.n.disc.isRegistrarAssoc(a)
}

// bindRef binds a ref read from a payload that came over a: to an actor
// of this node, to the peer's actor through a, or to a third node's actor
// through an association that dials on first use (never from the reader).
func (a *assoc) bindRef(kind byte, key refKey, addr string) *handle {
	return a.bindRefFrom(kind, key, addr, a.peer.uid)
}

// bindRefFrom is bindRef, a new node's binding charged to the peer from
// once it dials (see [Config.MaxRefDialsPerPeer]).
func (a *assoc) bindRefFrom(kind byte, key refKey, addr string, from NodeUID) *handle {
	n := a.n
	if kind == refThird && key.node == n.uid {
		kind = refReceiver
	}
	if kind == refThird && key.node == a.peer.uid {
		kind = refSender
	}
	switch kind {
	case refReceiver:
		key.node = n.uid
		if h := n.actors.get(key.path, key.uuid); h != nil {
			return h
		}
		return deadHandle(n, key)
	case refSender:
		key.node = a.peer.uid
		return &handle{node: n, key: key, assoc: a}
	}
	ad, err := ParseAddr(addr)
	if err != nil || n.isOwnAddr(ad) {
		return deadHandle(n, key)
	}
	via, held, err := n.peers.assocHeld(ad, false, from)
	if err != nil {
		return deadHandle(n, key)
	}
	h := &handle{node: n, key: key, assoc: via}
	if held {
		runtime.AddCleanup(h, n.peers.releaseBinding, via)
	}
	return h
}
