package troupe

import (
	"context"
	"net"
	"os"
	"slices"
	"sync"
	"time"
)

// FaultNet runs several nodes in one process over real loopback TCP
// connections that pass through a fault-injecting layer, for tests and
// examples. It can cut the network between two nodes — the connections stay
// open and bytes simply stop flowing, the case no node can tell from its
// peer's death — heal it, pause a node's network, and kill a node silently.
//
// The zero FaultNet is a fault network with nothing cut: make one with
// new(troupe.FaultNet), and start nodes with [FaultNet.Start]; close them
// as usual. FaultNet has no goroutines of its own (a write deadline on a
// cut link is a timer) and needs no closing. A write waiting on a cut
// link honours the connection's write deadline. It is safe for concurrent
// use, and must not be copied after first use.
type FaultNet struct {
	once sync.Once // makes the maps and cond, on first use
	// mu guards everything below; cond is signalled on every change.
	mu      mutex[lkFaultNet]
	cond    *sync.Cond
	byAddr  map[Addr]*Node   // listen address -> node
	dialers map[string]*Node // local address of an outbound connection -> its node
	cuts    map[[2]*Node]bool
	drops   map[[2]*Node]bool // one way: {from, to}
	sent    map[*Node]uint64  // bytes each node wrote
	paused  map[*Node]bool
	killed  map[*Node]bool
	conns   map[*faultConn]struct{} // open connections, for Reset
}

// lock takes f.mu, making f's tables on first use.
func (f *FaultNet) lock() {
	f.once.Do(func() {
		f.byAddr = make(map[Addr]*Node)
		f.dialers = make(map[string]*Node)
		f.cuts = make(map[[2]*Node]bool)
		f.drops = make(map[[2]*Node]bool)
		f.sent = make(map[*Node]uint64)
		f.paused = make(map[*Node]bool)
		f.killed = make(map[*Node]bool)
		f.conns = make(map[*faultConn]struct{})
		f.cond = sync.NewCond(&f.mu)
	})
	f.mu.Lock()
}

// Start starts a node on the fault network. Its Listen addresses must be
// loopback TCP; when cfg.Listen is empty it listens on tcp://127.0.0.1:0,
// but for an Observer, which only dials.
func (f *FaultNet) Start(ctx context.Context, cfg Config) (*Node, error) {
	if len(cfg.Listen) == 0 && !cfg.Observer {
		cfg.Listen = []string{"tcp://127.0.0.1:0"}
	}
	cfg.fault = f
	n, err := Start(ctx, cfg)
	if err != nil {
		return nil, err
	}
	f.lock()
	for _, a := range n.addrList() {
		f.byAddr[a] = n
	}
	f.mu.Unlock()
	return n, nil
}

func pairOf(a, b *Node) [2]*Node {
	if a.uid.String() > b.uid.String() {
		a, b = b, a
	}
	return [2]*Node{a, b}
}

func (f *FaultNet) change(fn func()) {
	f.lock()
	fn()
	f.cond.Broadcast()
	f.mu.Unlock()
}

// Partition cuts the network between a and b in both directions. Their
// connections stay open; nothing written on them arrives until [FaultNet.Heal].
func (f *FaultNet) Partition(a, b *Node) {
	f.change(func() { f.cuts[pairOf(a, b)] = true })
}

// Drop cuts the network one way: what from sends to to is held until
// [FaultNet.Heal], while to's traffic to from still flows — the
// asymmetric failure a firewall rule or a half-broken link causes.
func (f *FaultNet) Drop(from, to *Node) {
	f.change(func() { f.drops[[2]*Node{from, to}] = true })
}

// bytesSent reports how many bytes n has written to its connections on
// f: what troupe puts on the wire (frames, handshakes), not TCP/IP
// headers. Bytes held by a cut count once they are written; bytes
// swallowed because a node at either end was killed do not count.
func (f *FaultNet) bytesSent(n *Node) uint64 {
	f.lock()
	defer f.mu.Unlock()
	return f.sent[n]
}

// isolate cuts n off from every other node started on f so far.
func (f *FaultNet) isolate(n *Node) {
	f.change(func() {
		for _, other := range f.byAddr {
			if other != n {
				f.cuts[pairOf(n, other)] = true
			}
		}
	})
}

// Heal restores every cut link and resumes every paused node. Bytes held
// while the network was cut are delivered.
func (f *FaultNet) Heal() {
	f.change(func() {
		clear(f.cuts)
		clear(f.drops)
		clear(f.paused)
	})
}

// Pause stops all of n's network traffic, in and out, as if its process
// were stopped; its actors keep running. [FaultNet.Resume] or Heal undoes it.
func (f *FaultNet) Pause(n *Node) { f.change(func() { f.paused[n] = true }) }

// Resume undoes [FaultNet.Pause].
func (f *FaultNet) Resume(n *Node) { f.change(func() { delete(f.paused, n) }) }

// Kill stops n dead: it vanishes from the network without a goodbye (its
// peers hear nothing more, not even the connection closing, and must find
// out by their failure detectors), then it is closed.
func (f *FaultNet) Kill(n *Node) error {
	f.change(func() { f.killed[n] = true })
	return n.lc.crash()
}

// dial connects n to addr through the fault layer.
func (f *FaultNet) dial(ctx context.Context, n *Node, addr Addr) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, addr.network, addr.address)
	if err != nil {
		return nil, err
	}
	f.lock()
	f.dialers[c.LocalAddr().String()] = n
	remote := f.byAddr[addr]
	if remote == nil || remote.lc.isClosed() {
		// The address may have changed hands (a node that took over a
		// registry address): find who listens there now.
		for _, nd := range f.byAddr {
			if !nd.lc.isClosed() && slices.Contains(nd.addrList(), addr) {
				remote = nd
				f.byAddr[addr] = nd
				break
			}
		}
	}
	fc := &faultConn{Conn: c, f: f, local: n, remote: remote}
	f.conns[fc] = struct{}{}
	f.mu.Unlock()
	return fc, nil
}

// accepted wraps a connection n accepted.
func (f *FaultNet) accepted(n *Node, c net.Conn) net.Conn {
	fc := &faultConn{Conn: c, f: f, local: n, remoteKey: c.RemoteAddr().String()}
	f.lock()
	f.conns[fc] = struct{}{}
	f.mu.Unlock()
	return fc
}

// Reset breaks every connection between a and b the way a middlebox or a
// flapping link does: both ends see it reset, without a goodbye, while
// both nodes keep running. It reports how many connection ends it broke.
// A resumable session (every session between two nodes of this version
// that are not Observers) is then resumed by the side that dialed; see
// [PeerLinkLost]. An Observer's session ends quietly, and its next call
// dials again.
func (f *FaultNet) Reset(a, b *Node) int {
	pair := pairOf(a, b)
	f.lock()
	var ends []*faultConn
	for c := range f.conns {
		if r := c.peerLocked(); r != nil && pairOf(c.local, r) == pair {
			ends = append(ends, c)
		}
	}
	f.mu.Unlock()
	for _, c := range ends {
		if tc, ok := c.Conn.(*net.TCPConn); ok {
			tc.SetLinger(0) // close with a reset, not a goodbye
		}
		c.Conn.Close()
	}
	return len(ends)
}

// faultConn is one end of a connection on the fault network.
type faultConn struct {
	net.Conn
	f         *FaultNet
	local     *Node
	remoteKey string // for an accepted connection: the dialer's local address

	// Guarded by f.mu.
	remote *Node // nil until known
	closed bool
	// The write deadline: a write waiting on a cut link ends at it, as a
	// blocked write on a real connection does. wake wakes the waiters then.
	wdl  time.Time
	wake *time.Timer
	// The read deadline, which a read held on a cut or dead link honours
	// as a read on a real connection does: rwake wakes it then, and what
	// it had read (held, heldErr) waits for the next Read.
	rdl     time.Time
	rwake   *time.Timer
	held    []byte
	heldErr error
}

// SetWriteDeadline sets the write deadline, which a write waiting for a
// cut link honours too.
func (c *faultConn) SetWriteDeadline(t time.Time) error {
	c.setWriteDeadline(t)
	return c.Conn.SetWriteDeadline(t)
}

// SetReadDeadline sets the read deadline, which a read held on a cut
// link, or one to a killed node, honours too.
func (c *faultConn) SetReadDeadline(t time.Time) error {
	c.setReadDeadline(t)
	return c.Conn.SetReadDeadline(t)
}

// SetDeadline sets both deadlines; see SetWriteDeadline.
func (c *faultConn) SetDeadline(t time.Time) error {
	c.setWriteDeadline(t)
	c.setReadDeadline(t)
	return c.Conn.SetDeadline(t)
}

func (c *faultConn) setWriteDeadline(t time.Time) {
	c.f.lock()
	defer c.f.mu.Unlock()
	c.wdl = t
	c.wake = c.f.wakeAt(c.wake, t, c.closed)
}

func (c *faultConn) setReadDeadline(t time.Time) {
	c.f.lock()
	defer c.f.mu.Unlock()
	c.rdl = t
	c.rwake = c.f.wakeAt(c.rwake, t, c.closed)
}

// wakeAt replaces the timer old with one that wakes the waiters at t
// (none for the zero time or a closed connection); f.mu held.
func (f *FaultNet) wakeAt(old *time.Timer, t time.Time, closed bool) *time.Timer {
	if old != nil {
		old.Stop()
	}
	if t.IsZero() || closed {
		return nil
	}
	return time.AfterFunc(time.Until(t), func() { f.change(func() {}) })
}

// peerLocked returns the node at the other end, if known.
func (c *faultConn) peerLocked() *Node {
	if c.remote == nil && c.remoteKey != "" {
		c.remote = c.f.dialers[c.remoteKey]
	}
	return c.remote
}

// stateLocked says whether traffic on c in one direction (out: written
// by this end) is cut (held until healed) or dead (a killed node at either
// end).
func (c *faultConn) stateLocked(out bool) (cut, dead bool) {
	f, r := c.f, c.peerLocked()
	if f.killed[c.local] || r != nil && f.killed[r] {
		return false, true
	}
	if r == nil {
		return false, false
	}
	dir := [2]*Node{r, c.local}
	if out {
		dir = [2]*Node{c.local, r}
	}
	return f.cuts[pairOf(c.local, r)] || f.drops[dir] || f.paused[c.local] || f.paused[r], false
}

// Write waits while the link is cut; to or from a killed node it swallows
// the bytes.
func (c *faultConn) Write(p []byte) (int, error) {
	f := c.f
	f.lock()
	for {
		if c.closed {
			f.mu.Unlock()
			return 0, net.ErrClosed
		}
		if !c.wdl.IsZero() && !time.Now().Before(c.wdl) {
			f.mu.Unlock()
			return 0, os.ErrDeadlineExceeded
		}
		cut, dead := c.stateLocked(true)
		if dead {
			f.mu.Unlock()
			return len(p), nil
		}
		if !cut {
			break
		}
		f.cond.Wait()
	}
	f.sent[c.local] += uint64(len(p))
	f.mu.Unlock()
	return c.Conn.Write(p)
}

// Read holds what arrives (bytes, or the peer closing) while the link is
// cut; from a killed node nothing ever arrives. A held read ends at the
// read deadline, as a read on a real connection that hears nothing does;
// what it had read is kept for the next Read.
func (c *faultConn) Read(p []byte) (int, error) {
	f := c.f
	f.lock()
	heldBack := len(c.held) > 0 || c.heldErr != nil
	f.mu.Unlock()
	var n int
	var err error
	if !heldBack {
		n, err = c.Conn.Read(p)
		if ne, ok := err.(net.Error); ok && ne.Timeout() && n == 0 {
			return n, err // a deadline passed: nothing to hold
		}
	}
	f.lock()
	defer f.mu.Unlock()
	if !heldBack {
		if cut, dead := c.stateLocked(false); !cut && !dead && !c.closed {
			return n, err
		}
		c.held, c.heldErr = append(c.held, p[:n]...), err
	}
	for {
		if c.closed {
			return 0, net.ErrClosed
		}
		cut, dead := c.stateLocked(false)
		if !cut && !dead {
			n = copy(p, c.held)
			c.held = c.held[n:]
			if len(c.held) > 0 {
				return n, nil // the rest, and any error, next time
			}
			c.held, err, c.heldErr = nil, c.heldErr, nil
			return n, err
		}
		if !c.rdl.IsZero() && !time.Now().Before(c.rdl) {
			return 0, os.ErrDeadlineExceeded
		}
		f.cond.Wait()
	}
}

// CloseWrite ends this end's writing side, as a TCP connection's does:
// the peer reads the end of the stream after what was written (held, as
// the bytes are, while the link is cut; never, from a killed node).
func (c *faultConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return c.Close()
}

// Close closes this end and wakes anything waiting on it.
func (c *faultConn) Close() error {
	c.f.change(func() {
		c.closed = true
		delete(c.f.conns, c)
		c.wake = c.f.wakeAt(c.wake, time.Time{}, true)
		c.rwake = c.f.wakeAt(c.rwake, time.Time{}, true)
	})
	return c.Conn.Close()
}
