package troupe

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"reflect"
	"slices"
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
	// ErrSendQueueFull is the dead-letter reason when an association has
	// [Config.SendQueueLimit] frames waiting to be written.
	ErrSendQueueFull = errors.New("troupe: send queue full")
	// ErrRejected is wrapped by the error of a connection the peer refused
	// in the handshake; the text says why.
	ErrRejected = errors.New("troupe: connection rejected by peer")
)

// sessionError says that an association ended and why.
type sessionError struct {
	peer  string
	cause error
}

func (e *sessionError) Error() string {
	return fmt.Sprintf("troupe: association with %s ended: %v", e.peer, e.cause)
}

func (e *sessionError) Unwrap() []error { return []error{ErrSessionEnded, e.cause} }

type assocState uint8

const (
	assocConnecting assocState = iota // dialing or in handshake
	assocUp                           // handshake done, frames flow
	assocLeaving                      // bye queued: nothing new accepted
	assocClosed                       // finished; err says why
)

// outRec is one frame waiting to be written: a user message for h, or
// (h nil) a control frame already encoded, kind byte first, in msg.
type outRec struct {
	h   *handle
	msg any
	mt  *msgType
}

// ctlFrame is the body of a control frame in an outRec.
type ctlFrame []byte

// inflightMsg remembers a message encoded into the write buffer, so that a
// write that fails can turn the messages it did not hand to the kernel into
// dead letters.
type inflightMsg struct {
	h   *handle
	msg any
	end int // offset just past its frame in the buffer
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
	peerUID   NodeUID
	peerName  string
	peerAddrs []Addr
	conn      net.Conn
	ready     chan struct{} // closed (once, by closeReady) when up, merged or closed
	readyOnce sync.Once
	stopOnce  sync.Once

	// mu guards everything below up to the writer's fields.
	mu       sync.Mutex
	state    assocState
	queue    recQueue
	fwd      *assoc // merged into this association; send there
	err      error  // why it ended (closed only)
	pending  map[pendingAsk]struct{}
	resolves map[uint64]chan resolveAnswer
	watches  map[watchPair]struct{}
	reqSeq   uint64

	wake       chan struct{} // capacity 1: the writer has work
	stop       chan struct{} // closed when the session ends
	writerDone chan struct{} // closed when the writer has exited

	written atomic.Uint64 // bytes written to the connection
	in      *stampReader  // the connection's reading side; nil until connected
	beat    atomic.Bool   // the writer owes the peer a heartbeat
	doom    error         // why the session must end, set before its conn is closed (mu)
	unsent  []inflightMsg // messages a failed write did not send (mu)
	ackTo   atomic.Uint64 // tell frames received that the writer should acknowledge

	// Delivery confirmation, guarded by mu: unacked[unackedHead:] are the
	// tell frames written but not yet acknowledged by the peer, in order;
	// acked counts those acknowledged.
	unacked     []inflightMsg
	unackedHead int
	acked       uint64

	// Owned by the node's heartbeat goroutine.
	det      WindowDetector
	lastBeat time.Time

	// Owned by the writer goroutine.
	outTypes   map[*msgType]uint32
	outTargets map[refKey]uint32
	wbuf       []byte
	enc        encoder
	inflight   []inflightMsg // the messages encoded in wbuf, until it is written
	ackSent    uint64        // the last acknowledgement written

	// Owned by the reader goroutine.
	inTypes   []inType
	inTargets []inTarget
	dec       decoder
	rcvTells  uint64 // tell frames received
	ackQueued uint64 // the last count handed to the writer to acknowledge
}

// inTarget is an entry of the receive-side target table.
type inTarget struct {
	path   string
	uuid   UUID
	target localTarget // nil if no such actor
}

type resolveAnswer struct {
	status byte
	uuid   UUID
	proto  string
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
		pending:    make(map[pendingAsk]struct{}),
		resolves:   make(map[uint64]chan resolveAnswer),
		watches:    make(map[watchPair]struct{}),
		outTypes:   make(map[*msgType]uint32),
		outTargets: make(map[refKey]uint32),
	}
	a.enc.a = a
	a.dec.a, a.dec.n = a, n
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

// assocFor returns the association to use for addr, starting a dial if
// there is none. Messages may be queued on it at once.
func (n *Node) assocFor(addr Addr) (*assoc, error) {
	n.pmu.Lock()
	defer n.pmu.Unlock()
	if n.pclosing {
		return nil, ErrNodeClosed
	}
	if a := n.byAddr[addr]; a != nil {
		return a, nil
	}
	if q := n.quarantineFor(NodeUID{}, addr); q != nil {
		return nil, fmt.Errorf("troupe: %s: %w since %s (%v); call Reconnect to try again", addr, ErrQuarantined, q.Since.Format(time.RFC3339), q.Cause)
	}
	a := newAssoc(n, true, addr)
	n.byAddr[addr] = a
	n.all[a] = struct{}{}
	n.wg.Go(a.runOutbound)
	return a, nil
}

// runOutbound dials, handshakes and then runs the reader.
func (a *assoc) runOutbound() {
	n := a.n
	c, err := n.dial(a.dialAddr)
	if err != nil {
		a.fail(fmt.Errorf("troupe: dial %s: %w", a.dialAddr, err))
		return
	}
	a.mu.Lock()
	merged := a.state == assocClosed
	if !merged {
		a.conn = c
	}
	a.mu.Unlock()
	if merged {
		c.Close()
		return
	}
	c.SetDeadline(time.Now().Add(n.cfg.HandshakeTimeout))
	a.in = &stampReader{c: c, epoch: n.epoch}
	fr := newFrameReader(a.in, n.cfg.MaxFrameSize)
	body, err := n.dialHandshake(c, fr, n.hello())
	if err != nil {
		a.fail(fmt.Errorf("troupe: handshake with %s: %w", a.dialAddr, err))
		return
	}
	switch frameKind(body[0]) {
	case frameWelcome:
	case frameReject:
		d := decoder{b: body[1:]}
		code := d.byte()
		var uid NodeUID
		copy(uid[:], d.take(16))
		text := d.string()
		if code == rejectDuplicate && d.err == nil {
			c.Close()
			n.awaitWinner(a, uid)
			return
		}
		if code == rejectQuarantined {
			a.fail(fmt.Errorf("%w: %w: %s: %s", ErrRejected, ErrQuarantinedByPeer, a.dialAddr, text))
			return
		}
		if code == rejectAuth {
			a.fail(fmt.Errorf("%w: %w: %s: %s", ErrRejected, ErrAuth, a.dialAddr, text))
			return
		}
		a.fail(fmt.Errorf("%w: %s: %s", ErrRejected, a.dialAddr, text))
		return
	default:
		a.fail(&FrameError{Peer: a.dialAddr.String(), Kind: frameKind(body[0]).String(), Reason: fmt.Errorf("%w: expected a welcome", ErrMalformed)})
		return
	}
	h, err := parseHello(body)
	if err != nil {
		a.fail(&FrameError{Peer: a.dialAddr.String(), Kind: "welcome", Reason: err})
		return
	}
	c.SetDeadline(time.Time{})
	if !n.attach(a, h) {
		return
	}
	a.run(fr)
}

// serveInbound handshakes an accepted connection and then runs its reader.
func (n *Node) serveInbound(c net.Conn) {
	n.pmu.Lock()
	if n.pclosing {
		n.pmu.Unlock()
		c.Close()
		n.handshaking.Add(-1)
		return
	}
	n.inHandshake[c] = struct{}{}
	n.pmu.Unlock()
	handshaking := true
	endHandshake := func() {
		n.pmu.Lock()
		delete(n.inHandshake, c)
		n.pmu.Unlock()
		n.handshaking.Add(-1)
	}
	defer func() {
		if handshaking {
			endHandshake()
		}
	}()
	label := peerLabel(c)
	c.SetDeadline(time.Now().Add(n.cfg.HandshakeTimeout))
	if err := n.checkPeerCred(c); err != nil {
		c.Write(rejectFrame(rejectAuth, n.uid, err.Error()))
		c.Close()
		return
	}
	in := &stampReader{c: c, epoch: n.epoch}
	fr := newFrameReader(in, n.cfg.MaxFrameSize)
	body, err := fr.hello()
	var h *hello
	if err == nil {
		h, err = parseHello(body)
	}
	if err != nil {
		if h != nil && h.version != protocolVersion {
			c.Write(rejectFrame(rejectVersion, n.uid, err.Error()))
		}
		c.Close()
		if !errors.Is(err, io.EOF) {
			n.protocolError(label, "hello", err)
		}
		return
	}
	if err := n.acceptAuth(c, fr, h); err != nil {
		n.log.Warn("troupe: refused a peer that failed authentication", "peer", label, "claimed_name", h.name, "err", err)
		c.Write(rejectFrame(rejectAuth, n.uid, err.Error()))
		c.Close()
		n.events.Publish(ProtocolError{Remote: label, Err: err})
		return
	}
	if h.flags&helloProbe != 0 {
		// A registry probe: answer who we are, and forget it.
		c.Write(appendFrame(nil, func(b []byte) []byte { return appendHello(b, frameWelcome, n.hello()) }))
		c.Close()
		return
	}
	a := newAssoc(n, false, Addr{})
	a.conn, a.in = c, in
	n.pmu.Lock()
	n.all[a] = struct{}{}
	n.pmu.Unlock()
	if !n.attach(a, h) {
		return
	}
	handshaking = false
	endHandshake()
	c.SetDeadline(time.Time{})
	a.run(fr)
}

func rejectFrame(code byte, uid NodeUID, text string) []byte {
	return appendFrame(nil, func(b []byte) []byte {
		b = append(b, byte(frameReject), code)
		b = append(b, uid[:]...)
		return appendString(b, text)
	})
}

func (n *Node) hello() *hello {
	h := &hello{version: protocolVersion, uid: n.uid, name: n.name}
	if n.reg != nil {
		h.flags |= helloRegistrar
	}
	for _, a := range n.addrs {
		h.addrs = append(h.addrs, a.String())
	}
	return h
}

func (n *Node) protocolError(remote, kind string, err error) {
	fe := &FrameError{Peer: remote, Kind: kind, Reason: err}
	n.log.Warn("troupe: closing connection after a protocol error", "peer", remote, "err", err)
	n.events.Publish(ProtocolError{Remote: remote, Err: fe})
}

// attach decides whether a connection whose handshake just completed
// becomes the association with that peer. When both nodes dial each other
// at once, the connection dialed by the node with the lower uid wins on
// both sides; the loser is merged into the winner. For an inbound
// connection attach also sends the welcome or the rejection. It returns
// whether the caller should run the connection.
func (n *Node) attach(a *assoc, h *hello) bool {
	a.mu.Lock()
	merged := a.state == assocClosed
	a.mu.Unlock()
	if merged {
		// Merged into the peer's own connection while this one was in its
		// handshake.
		a.conn.Close()
		return false
	}
	a.peerUID, a.peerName = h.uid, h.name
	for _, s := range h.addrs {
		if ad, err := ParseAddr(s); err == nil {
			a.peerAddrs = append(a.peerAddrs, ad)
		}
	}
	n.pmu.Lock()
	var reject byte = 255
	var text string
	var loser, winner *assoc
	switch {
	case n.pclosing:
		reject, text = rejectClosing, "node is closing"
	case h.uid == n.uid:
		reject, text = rejectOther, "a node cannot associate with itself"
	case n.quarantineFor(h.uid, a.peerAddrs...) != nil:
		q := n.quarantineFor(h.uid, a.peerAddrs...)
		reject, text = rejectQuarantined, fmt.Sprintf("%s quarantined you at %s (%v); it must call ClearQuarantine or Reconnect first", n.name, q.Since.Format(time.RFC3339), q.Cause)
	default:
		ex := n.byUID[h.uid]
		if ex == nil && !a.outbound {
			for _, ad := range a.peerAddrs {
				if e := n.byAddr[ad]; e != nil && e.outbound && e != a {
					ex = e
					break
				}
			}
		}
		switch {
		case ex == nil || ex == a:
		case !a.outbound && !ex.outbound:
			// The peer dialed again: its old connection is gone for it.
			loser = ex
		case dialedByLower(a, n.uid, h.uid):
			loser, winner = ex, a
		default:
			if !a.outbound {
				reject, text = rejectDuplicate, "the other connection between these nodes wins"
			} else {
				loser, winner = a, ex
			}
		}
	}
	if reject != 255 {
		delete(n.all, a)
		n.pmu.Unlock()
		if a.outbound {
			a.fail(fmt.Errorf("troupe: dial %s: %s", a.dialAddr, text))
			return false
		}
		a.conn.Write(rejectFrame(reject, n.uid, text))
		a.conn.Close()
		a.finish()
		return false
	}
	if !a.outbound {
		a.conn.Write(appendFrame(nil, func(b []byte) []byte { return appendHello(b, frameWelcome, n.hello()) }))
	}
	a.mu.Lock()
	if a.state == assocConnecting {
		a.state = assocUp
	}
	a.mu.Unlock()
	a.det = WindowDetector{Window: n.cfg.UnreachableAfter, Start: time.Now()}
	if loser == a {
		// This connection lost to one that is already up: retire it
		// (the peer is told, and both ends drain it).
		n.pmu.Unlock()
		a.mergeInto(winner)
		return true
	}
	n.byUID[h.uid] = a
	if a.outbound {
		n.byAddr[a.dialAddr] = a
	}
	for _, ad := range a.peerAddrs {
		n.byAddr[ad] = a
	}
	waiting := n.awaiting[h.uid]
	delete(n.awaiting, h.uid)
	a.closeReady()
	n.pmu.Unlock()

	for _, w := range waiting {
		w.mergeInto(a)
	}
	if loser != nil {
		if winner == a {
			loser.mergeInto(a)
		} else {
			loser.fail(errors.New("troupe: replaced by a new connection from the peer"))
		}
	}
	n.events.Publish(PeerConnected{Addr: a.addr(), UID: a.peerUID, Name: a.peerName})
	return true
}

// dialedByLower reports whether a's connection was dialed by the node with
// the lower uid of the pair (self, peer).
func dialedByLower(a *assoc, self, peer NodeUID) bool {
	selfLower := string(self[:]) < string(peer[:])
	return a.outbound == selfLower
}

// awaitWinner parks an outbound association whose connection lost a
// simultaneous dial: it is merged into the peer's connection once that is
// attached, or fails after the handshake timeout.
func (n *Node) awaitWinner(a *assoc, uid NodeUID) {
	n.pmu.Lock()
	if w := n.byUID[uid]; w != nil {
		n.pmu.Unlock()
		a.mergeInto(w)
		return
	}
	n.awaiting[uid] = append(n.awaiting[uid], a)
	n.pmu.Unlock()
	t := time.NewTimer(n.cfg.HandshakeTimeout)
	defer t.Stop()
	select {
	case <-a.stop:
	case <-t.C:
		n.pmu.Lock()
		n.awaiting[uid] = slices.DeleteFunc(n.awaiting[uid], func(x *assoc) bool { return x == a })
		n.pmu.Unlock()
		a.fail(fmt.Errorf("troupe: dial %s: the peer chose its own connection, which never arrived", a.dialAddr))
	}
}

// mergeInto retires a, which lost a simultaneous dial, in favour of the
// winning association w with the same peer: sends through a go to w from
// now on, and its pending asks and watches move there. A connection that
// never came up is dropped with its queue moved to w; one that is up
// writes what it has queued and a duplicate-bye, and keeps reading until
// the peer answers with its own bye, so nothing in flight is lost.
func (a *assoc) mergeInto(w *assoc) {
	a.mu.Lock()
	if a.state == assocClosed || a.fwd != nil {
		a.mu.Unlock()
		return
	}
	up := a.state == assocUp
	conn := a.conn
	a.fwd = w
	var moved recQueue
	if up {
		a.state = assocLeaving
		a.queue.push(outRec{msg: ctlFrame(appendBye(nil, byeDuplicate, ""))})
	} else {
		a.state = assocClosed
		moved = a.queue.take()
	}
	pending, watches := a.pending, a.watches
	a.pending, a.watches = map[pendingAsk]struct{}{}, map[watchPair]struct{}{}
	t := w.lockTarget() // lock order: a, then the winner
	if t.state >= assocLeaving {
		t.mu.Unlock()
		a.mu.Unlock()
		a.endMoved(moved, pending, watches, t.failure())
	} else {
		t.queue.appendQueue(moved)
		for p := range pending {
			t.pending[p] = struct{}{}
		}
		for p := range watches {
			t.watches[p] = struct{}{}
		}
		t.mu.Unlock()
		a.mu.Unlock()
		t.notify()
	}
	a.n.untable(a)
	a.closeReady()
	if up {
		a.notify()
		conn.SetReadDeadline(time.Now().Add(a.n.cfg.HandshakeTimeout))
		return
	}
	if conn != nil {
		conn.Close()
	}
	a.finish()
}

// endMoved fails what a merge could not hand over because the winner had
// ended too.
func (a *assoc) endMoved(queue recQueue, pending map[pendingAsk]struct{}, watches map[watchPair]struct{}, err error) {
	a.deadLetters(queue, err)
	for p := range pending {
		p.fail(err)
	}
	for w := range watches {
		w.watcher.signal(sysMsg{kind: sysTerminated, key: w.target, reason: err})
	}
}

// untable removes a from the node's lookup tables, so no new ref binds to it.
func (n *Node) untable(a *assoc) {
	n.pmu.Lock()
	defer n.pmu.Unlock()
	if n.byUID[a.peerUID] == a {
		delete(n.byUID, a.peerUID)
	}
	if a.outbound && n.byAddr[a.dialAddr] == a {
		delete(n.byAddr, a.dialAddr)
	}
	for _, ad := range a.peerAddrs {
		if n.byAddr[ad] == a {
			delete(n.byAddr, ad)
		}
	}
}

// finish releases what every ended session releases: its place in the
// node's tables and anyone waiting on ready or stop.
func (a *assoc) finish() {
	n := a.n
	n.untable(a)
	n.pmu.Lock()
	delete(n.all, a)
	n.pmu.Unlock()
	a.closeReady()
	a.stopOnce.Do(func() { close(a.stop) })
}

func (a *assoc) closeReady() { a.readyOnce.Do(func() { close(a.ready) }) }

// run starts the writer and runs the reader on the calling goroutine.
func (a *assoc) run(fr *frameReader) {
	a.n.wg.Go(a.writeLoop)
	a.readLoop(fr)
}

// failure returns the error a send through this session gets once it has
// ended.
func (a *assoc) failure() error {
	a = a.lockTarget()
	defer a.mu.Unlock()
	if a.state != assocClosed && a.state != assocLeaving {
		return nil
	}
	if a.state == assocLeaving || a.err == nil {
		return &sessionError{peer: a.label(), cause: ErrNodeClosed}
	}
	return &sessionError{peer: a.label(), cause: a.err}
}

// target returns the association that frames for a go to (following
// merges), locked. The caller unlocks it.
func (a *assoc) lockTarget() *assoc {
	a.mu.Lock()
	for a.fwd != nil {
		next := a.fwd
		a.mu.Unlock()
		a = next
		a.mu.Lock()
	}
	return a
}

// tell queues a user message for the remote actor h.
func (a *assoc) tell(h *handle, msg any) error {
	mt := typeOf(reflect.TypeOf(msg))
	if mt == nil {
		return fmt.Errorf("%w: %T (call RegisterMessage to send it to another node)", ErrNotRegistered, msg)
	}
	return a.enqueue(outRec{h: h, msg: msg, mt: mt})
}

func (a *assoc) enqueue(r outRec) error {
	a = a.lockTarget()
	if a.state >= assocLeaving {
		a.mu.Unlock()
		return a.failure()
	}
	if lim := a.n.cfg.SendQueueLimit; lim > 0 && a.queue.len() >= lim {
		a.mu.Unlock()
		return fmt.Errorf("%w: %d frames waiting for %s", ErrSendQueueFull, lim, a.label())
	}
	a.queue.push(r)
	first := a.queue.len() == 1
	a.mu.Unlock()
	if first {
		a.notify()
	}
	return nil
}

// control queues a control frame; false if the session has ended.
func (a *assoc) control(body []byte) bool {
	return a.enqueue(outRec{msg: ctlFrame(body)}) == nil
}

func (a *assoc) notify() {
	select {
	case a.wake <- struct{}{}:
	default:
	}
}

func (a *assoc) addPending(p pendingAsk) bool {
	a = a.lockTarget()
	defer a.mu.Unlock()
	if a.state >= assocLeaving {
		return false
	}
	a.pending[p] = struct{}{}
	return true
}

func (a *assoc) removePending(p pendingAsk) {
	a = a.lockTarget()
	delete(a.pending, p)
	a.mu.Unlock()
}

// watch registers watcher's interest in the remote actor target.
func (a *assoc) watch(target, watcher *handle) error {
	a = a.lockTarget()
	if a.state >= assocLeaving {
		a.mu.Unlock()
		return a.failure()
	}
	a.watches[watchPair{target.key, watcher}] = struct{}{}
	a.mu.Unlock()
	a.control(appendWatch(nil, frameWatch, target.key, watcher.key.path))
	return nil
}

func (a *assoc) unwatch(target, watcher *handle) {
	a = a.lockTarget()
	delete(a.watches, watchPair{target.key, watcher})
	a.mu.Unlock()
	a.control(appendWatch(nil, frameUnwatch, target.key, watcher.key.path))
}

func appendWatch(b []byte, kind frameKind, target refKey, watcher string) []byte {
	b = append(b, byte(kind))
	b = appendString(b, target.path)
	b = append(b, target.uuid[:]...)
	return appendString(b, watcher)
}

// signal sends a signal to the remote actor h; only terminations cross.
func (a *assoc) signal(h *handle, m sysMsg) {
	if m.kind != sysTerminated {
		return
	}
	code, text := reasonCode(m.reason)
	b := appendWatch(nil, frameTerminated, m.key, h.key.path)
	b = append(b, code)
	a.control(appendString(b, text))
}

// Bye codes. Append only: values are on the wire.
const (
	byeLeaving   byte = iota // the node is closing
	byeDuplicate             // this connection lost a simultaneous dial
)

func appendBye(b []byte, code byte, text string) []byte {
	b = append(b, byte(frameBye), code)
	return appendString(b, text)
}

// leave queues a bye: the peer learns this node is closing. Nothing more is
// accepted for sending.
func (a *assoc) leave() {
	a.mu.Lock()
	if a.state >= assocLeaving || a.fwd != nil {
		a.mu.Unlock()
		return
	}
	up := a.state == assocUp
	a.state = assocLeaving
	if up {
		a.queue.push(outRec{msg: ctlFrame(appendBye(nil, byeLeaving, ""))})
	}
	pend := a.pending
	a.pending = map[pendingAsk]struct{}{}
	a.mu.Unlock()
	for p := range pend {
		p.fail(ErrNodeClosed)
	}
	a.notify()
	if !up {
		a.fail(ErrNodeClosed)
	}
}

// fail ends the session with err: queued messages become dead letters,
// pending asks and resolves fail, and every local watcher of an actor on
// the peer gets Terminated. A session that was up and did not end by a
// goodbye from either side (the peer went silent, its connection broke, or
// it sent something malformed) quarantines the peer.
func (a *assoc) fail(err error) {
	a.mu.Lock()
	if a.state == assocClosed {
		a.mu.Unlock()
		return
	}
	conn := a.conn
	if a.fwd != nil {
		// A retired duplicate: its work moved to the winner already.
		a.state = assocClosed
		unacked := a.unacked[a.unackedHead:]
		a.unacked, a.unackedHead = nil, 0
		a.mu.Unlock()
		if conn != nil {
			conn.Close()
		}
		a.finish()
		for _, m := range unacked {
			a.n.deadLetterUnconfirmed(m.h.String(), m.msg, &sessionError{peer: a.label(), cause: errors.New("duplicate connection retired before the peer confirmed")})
		}
		return
	}
	wasUp := a.state == assocUp || a.state == assocLeaving
	leaving := a.state == assocLeaving
	if a.doom != nil {
		err = a.doom
	}
	a.state = assocClosed
	a.err = err
	queue, pending, resolves, watches := a.queue.take(), a.pending, a.resolves, a.watches
	unsent, unacked := a.unsent, a.unacked[a.unackedHead:]
	a.pending, a.resolves, a.watches, a.unsent, a.unacked, a.unackedHead = nil, nil, nil, nil, nil, 0
	a.mu.Unlock()

	closing := leaving || errors.Is(err, ErrNodeClosed)
	select {
	case <-a.n.done:
		closing = true
	default:
	}
	// Cluster members are never quarantined: they keep knocking on each
	// other until one is downed.
	quarantine := wasUp && !closing && !errors.Is(err, ErrPeerLeft) && !a.n.isMember(a.peerUID)
	reason := err
	if quarantine {
		a.n.addQuarantine(a, err)
		reason = &quarantineError{peer: a.label(), uid: a.peerUID, cause: err}
		a.mu.Lock()
		a.err = reason
		a.mu.Unlock()
		a.n.log.Warn("troupe: peer unreachable; quarantined until Reconnect or ClearQuarantine", "peer", a.label(), "uid", a.peerUID.String(), "cause", err)
	}
	if conn != nil {
		conn.Close()
	}
	a.finish()
	serr := &sessionError{peer: a.label(), cause: reason}
	if wasUp && !closing {
		a.n.events.Publish(PeerUnreachable{Addr: a.addr(), UID: a.peerUID, Name: a.peerName, Quarantined: quarantine, Reason: reason})
	}
	for _, m := range unacked {
		a.n.deadLetterUnconfirmed(m.h.String(), m.msg, serr)
	}
	for _, m := range unsent {
		a.n.deadLetter(m.h.String(), m.msg, serr)
	}
	a.deadLetters(queue, serr)
	for p := range pending {
		p.fail(serr)
	}
	for _, ch := range resolves {
		close(ch)
	}
	for w := range watches {
		w.watcher.signal(sysMsg{kind: sysTerminated, key: w.target, reason: reason})
	}
	if wasUp {
		a.n.log.Debug("troupe: association ended", "peer", a.label(), "reason", reason)
	}
}

// stampReader is a connection's reading side; it records when bytes last
// arrived, for the failure detector. Any bytes count as a sign of life.
type stampReader struct {
	c     net.Conn
	epoch time.Time
	heard atomic.Int64 // nanoseconds after epoch of the last read, 0 if none
}

func (r *stampReader) Read(p []byte) (int, error) {
	n, err := r.c.Read(p)
	if n > 0 {
		r.heard.Store(int64(time.Since(r.epoch)))
	}
	return n, err
}

// writeLoop is the association's only writer: it takes everything queued,
// encodes it into one buffer and writes it with one call.
func (a *assoc) writeLoop() {
	defer close(a.writerDone)
	for {
		select {
		case <-a.wake:
		case <-a.stop:
			return
		}
		a.mu.Lock()
		recs := a.queue.take()
		leaving := a.state == assocLeaving
		a.mu.Unlock()
		buf := a.writePriority(a.wbuf[:0]) // heartbeat and acknowledgement first
		ok := true
		recs.each(func(r *outRec) {
			if !ok {
				if r.h != nil {
					a.n.deadLetter(r.h.String(), r.msg, a.failure())
				}
				return
			}
			var sent bool
			buf, sent = a.encodeRec(buf, r)
			if sent && r.h != nil {
				a.inflight = append(a.inflight, inflightMsg{r.h, r.msg, len(buf)})
			}
			if len(buf) >= 256<<10 {
				ok = a.write(buf)
				buf = a.writePriority(buf[:0])
			}
		})
		if !ok || len(buf) > 0 && !a.write(buf) {
			return
		}
		if cap(buf) <= 1<<20 {
			a.wbuf = buf
		}
		if leaving {
			a.mu.Lock()
			empty := a.queue.len() == 0
			a.mu.Unlock()
			if empty {
				return
			}
		}
	}
}

// ackEvery bounds how many tell frames a busy reader receives before it
// acknowledges them, so that a sender's unacknowledged backlog stays small
// under a steady stream.
const ackEvery = 1024

// writePriority appends what goes ahead of queued frames: a heartbeat when
// one is due, and the acknowledgement of the tell frames received so far.
func (a *assoc) writePriority(buf []byte) []byte {
	if a.beat.Swap(false) {
		buf = append(buf, 1, byte(frameHeartbeat))
	}
	if v := a.ackTo.Load(); v != a.ackSent {
		a.ackSent = v
		start := len(buf)
		buf = append(buf, 0, byte(frameAck))
		buf = binary.AppendUvarint(buf, v)
		buf = fixLength(buf, start)
	}
	return buf
}

// write writes b. The messages it carries wait for the peer's
// acknowledgement (they are recorded before the write, since the ack may
// come back before Write returns); what the kernel did not take becomes
// dead letters with the session's final reason.
func (a *assoc) write(b []byte) bool {
	if len(a.inflight) > 0 {
		a.mu.Lock()
		ended := a.state == assocClosed
		if !ended {
			a.unacked = append(a.unacked, a.inflight...)
		}
		a.mu.Unlock()
		if ended {
			reason := a.failure()
			for _, m := range a.inflight {
				a.n.deadLetter(m.h.String(), m.msg, reason)
			}
			clear(a.inflight)
			a.inflight = a.inflight[:0]
			return false
		}
	}
	n, err := a.conn.Write(b)
	a.written.Add(uint64(n))
	if err != nil {
		a.abort(fmt.Errorf("troupe: write to %s: %w", a.label(), err))
		cut := len(a.inflight)
		for i, m := range a.inflight {
			if m.end > n {
				cut = i
				break
			}
		}
		if unsent := len(a.inflight) - cut; unsent > 0 {
			a.mu.Lock()
			if a.state != assocClosed && len(a.unacked)-a.unackedHead >= unsent {
				tail := len(a.unacked) - unsent
				a.unsent = append(a.unsent, a.unacked[tail:]...)
				clear(a.unacked[tail:])
				a.unacked = a.unacked[:tail]
			}
			a.mu.Unlock()
		}
	}
	clear(a.inflight)
	a.inflight = a.inflight[:0]
	return err == nil
}

// onAck releases the messages the peer confirmed it received.
func (a *assoc) onAck(b []byte) error {
	d := decoder{b: b}
	count := d.uvarint()
	if d.err != nil || d.remaining() != 0 {
		return fmt.Errorf("%w: bad acknowledgement", ErrMalformed)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.state == assocClosed {
		return nil // the session ended; its unacknowledged messages are reported
	}
	waiting := uint64(len(a.unacked) - a.unackedHead)
	if count < a.acked || count-a.acked > waiting {
		if a.state == assocClosed || a.fwd != nil {
			return nil
		}
		return fmt.Errorf("%w: acknowledgement of %d frames, %d were sent", ErrMalformed, count, a.acked+waiting)
	}
	release := int(count - a.acked)
	clear(a.unacked[a.unackedHead : a.unackedHead+release])
	a.unackedHead += release
	a.acked = count
	if a.unackedHead == len(a.unacked) {
		a.unacked, a.unackedHead = a.unacked[:0], 0
	} else if a.unackedHead > 1024 && a.unackedHead > len(a.unacked)/2 {
		n := copy(a.unacked, a.unacked[a.unackedHead:])
		a.unacked, a.unackedHead = a.unacked[:n], 0
	}
	return nil
}

// abort ends an up session from a goroutine other than its reader: it
// records why and closes the connection, and the reader ends the session
// after its last delivery.
func (a *assoc) abort(cause error) {
	a.mu.Lock()
	if a.doom == nil {
		a.doom = cause
	}
	conn := a.conn
	a.mu.Unlock()
	conn.Close()
}

// encodeRec appends the frame for r and reports whether it did. A message
// that cannot be encoded becomes a dead letter and adds nothing.
func (a *assoc) encodeRec(buf []byte, r *outRec) ([]byte, bool) {
	if r.h == nil {
		start := len(buf)
		buf = append(buf, 0)
		buf = append(buf, r.msg.(ctlFrame)...)
		return fixLength(buf, start), true
	}
	if r.h.key.node != a.peerUID {
		a.n.deadLetter(r.h.String(), r.msg, fmt.Errorf("%w: the node incarnation %s is gone", ErrNoSuchActor, r.h.key.node.String()[:8]))
		return buf, false
	}
	start := len(buf)
	buf = append(buf, 0, byte(frameTell))
	// New table entries are committed only once the frame is complete,
	// so a message that fails to encode leaves the tables as they were.
	id, knownTarget := a.outTargets[r.h.key]
	newTarget := !knownTarget && r.h.key.uuid != (UUID{}) && len(a.outTargets) < maxTableSize
	if newTarget {
		id = uint32(len(a.outTargets) + 1)
	}
	if knownTarget {
		buf = binary.AppendUvarint(buf, uint64(id)<<1)
	} else {
		buf = binary.AppendUvarint(buf, uint64(id)<<1|1)
		buf = appendString(buf, r.h.key.path)
		buf = append(buf, r.h.key.uuid[:]...)
	}
	tid, knownType := a.outTypes[r.mt]
	newType := !knownType && len(a.outTypes) < maxTableSize
	if newType {
		tid = uint32(len(a.outTypes) + 1)
	}
	if knownType {
		buf = binary.AppendUvarint(buf, uint64(tid)<<1)
	} else {
		buf = binary.AppendUvarint(buf, uint64(tid)<<1|1)
		buf = appendString(buf, r.mt.key)
	}
	buf, err := a.enc.payload(buf, r.mt, r.msg)
	if err == nil && len(buf)-start-1 > a.n.cfg.MaxFrameSize {
		err = fmt.Errorf("%w: %d bytes, the limit is %d", ErrFrameTooBig, len(buf)-start-1, a.n.cfg.MaxFrameSize)
	}
	if err != nil {
		a.n.deadLetter(r.h.String(), r.msg, err)
		return buf[:start], false
	}
	if newTarget {
		a.outTargets[r.h.key] = id
	}
	if newType {
		a.outTypes[r.mt] = tid
	}
	return fixLength(buf, start), true
}

// deadLetters publishes a dead letter for every message in q.
func (a *assoc) deadLetters(q recQueue, err error) {
	q.each(func(r *outRec) {
		if r.h != nil {
			a.n.deadLetter(r.h.String(), r.msg, err)
		}
	})
}

// readLoop reads frames until the connection ends or misbehaves.
func (a *assoc) readLoop(fr *frameReader) {
	for {
		body, err := fr.next()
		if err != nil {
			switch {
			case errors.Is(err, ErrMalformed) || errors.Is(err, ErrFrameTooBig):
				a.n.protocolError(a.label(), "", err)
				a.fail(&FrameError{Peer: a.label(), Reason: err})
			case errors.Is(err, io.EOF):
				a.fail(fmt.Errorf("troupe: connection to %s closed by the peer: %w", a.label(), io.EOF))
			default:
				a.fail(fmt.Errorf("troupe: read from %s: %w", a.label(), err))
			}
			return
		}
		kind := frameKind(body[0])
		done, err := a.handleFrame(kind, body[1:])
		if err != nil {
			a.n.protocolError(a.label(), kind.String(), err)
			a.fail(&FrameError{Peer: a.label(), Kind: kind.String(), Reason: err})
			return
		}
		if done {
			return
		}
		if a.rcvTells != a.ackQueued && (fr.r.Buffered() == 0 || a.rcvTells-a.ackQueued >= ackEvery) {
			// About to wait for more, or a steady stream: confirm what
			// arrived. The acknowledgement rides on the next frame this node
			// writes (a reply, at the latest the next heartbeat); only a
			// large backlog wakes the writer for it alone.
			a.ackTo.Store(a.rcvTells)
			if a.rcvTells-a.ackQueued >= ackEvery {
				a.notify()
			}
			a.ackQueued = a.rcvTells
		}
	}
}
