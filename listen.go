package troupe

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"time"
)

// Listening: binding each Config.Listen address (and a Unix socket's
// lock file), accepting connections, and the admission limits a
// connection meets before its handshake.

// listenerSet is a node's listeners and the addresses they bound. mu
// guards list and closed; addrs is replaced, never changed, under mu and
// read without it.
type listenerSet struct {
	n      *Node
	mu     mutex[lkListeners]
	list   []net.Listener
	closed bool // closeAll ran: no listener is added after it
	addrs  atomic.Pointer[[]Addr]
}

// add enters l, bound at a; false once the set is closed.
func (ls *listenerSet) add(l net.Listener, a Addr) bool {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.closed {
		return false
	}
	ls.list = append(ls.list, l)
	addrs := append(slices.Clone(ls.addrList()), a)
	ls.addrs.Store(&addrs)
	return true
}

// addrList returns the bound addresses; the slice is never changed.
func (ls *listenerSet) addrList() []Addr {
	if p := ls.addrs.Load(); p != nil {
		return *p
	}
	return nil
}

// all returns the listeners.
func (ls *listenerSet) all() []net.Listener {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return slices.Clone(ls.list)
}

// serve runs start, under the set's lock, unless the set is closed: a
// listener's accept loop never starts after closeAll.
func (ls *listenerSet) serve(start func()) bool {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.closed {
		return false
	}
	start()
	return true
}

// closeAll closes every listener (removing a Unix socket's lock file)
// and, if final, refuses every listener added after it; otherwise the
// set is empty again (a start that failed part way).
func (ls *listenerSet) closeAll(final bool) []error {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	var errs []error
	for _, l := range ls.list {
		if err := l.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
			errs = append(errs, err)
		}
		if a, ok := l.Addr().(*net.UnixAddr); ok && final {
			removeLockFile(a.Name + ".lock")
		}
	}
	if final {
		ls.closed = true
	} else {
		ls.list = nil
		ls.addrs.Store(nil)
	}
	return errs
}

// inboundLimits counts accepted connections against the node's limits:
// those open, those in their handshake, and those in their handshake by
// source; and it holds the connections in their handshake, so that Close
// need not wait for their deadline. mu guards bySource, inHandshake and
// closing, and orders the checks with the counts.
type inboundLimits struct {
	mu           mutex[lkInbound]
	open         atomic.Int64 // inbound connections open
	handshaking  atomic.Int64 // inbound connections in their handshake
	bySource     map[string]int
	inHandshake  map[net.Conn]struct{} // (from begin to handshakeDone)
	closing      bool                  // closeHandshakes was called: begin refuses
	acceptErrors atomic.Uint64         // failed Accept calls, retried
}

// listenAll binds every address in list.
func (ls *listenerSet) listenAll(ctx context.Context, list []string) error {
	for _, s := range list {
		a, err := ParseAddr(s)
		if err == nil {
			err = ls.listen(ctx, a)
		}
		if err != nil {
			return fmt.Errorf("listen on %q: %w", s, err)
		}
	}
	return nil
}

func (ls *listenerSet) listen(ctx context.Context, a Addr) error {
	_, err := ls.listenOne(ctx, a)
	return err
}

// listenOne binds a and adds it to the node's listeners and addresses;
// the caller starts its accept loop.
func (ls *listenerSet) listenOne(ctx context.Context, a Addr) (net.Listener, error) {
	var lc net.ListenConfig
	if a.isUnix() {
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
	if !a.isUnix() {
		bound = tcpAddr(l.Addr().String())
	}
	if ls.n.lc.isClosed() || !ls.add(l, bound) {
		l.Close()
		return nil, ErrNodeClosed
	}
	return l, nil
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
func (ls *listenerSet) acceptLoop(l net.Listener) {
	var backoff time.Duration
	for {
		c, err := l.Accept()
		if err == nil {
			sizeBuffers(c)
		}
		if err != nil {
			if errors.Is(err, net.ErrClosed) || ls.n.lc.isClosed() {
				return
			}
			ls.n.inbound.acceptErrors.Add(1)
			if backoff == 0 {
				backoff = acceptBackoffMin
				ls.n.log.Warn("troupe: accept failed; retrying with backoff", "addr", l.Addr().String(), "err", err)
			} else {
				backoff = min(2*backoff, acceptBackoffMax)
			}
			t := time.NewTimer(backoff)
			select {
			case <-t.C:
			case <-ls.n.lc.done:
				t.Stop()
				return
			}
			continue
		}
		if backoff != 0 {
			ls.n.log.Info("troupe: accepting again", "addr", l.Addr().String(), "failed", ls.n.inbound.acceptErrors.Load())
			backoff = 0
		}
		src, ok := ls.n.inbound.admit(c, ls.n.cfg.MaxInboundConns, ls.n.cfg.MaxPendingHandshakes)
		if !ok {
			ls.n.log.Debug("troupe: refused a connection over the limits", "remote", c.RemoteAddr().String(),
				"inbound", ls.n.inbound.open.Load(), "handshaking", ls.n.inbound.handshaking.Load())
			c.Close()
			continue
		}
		if f := ls.n.cfg.fault; f != nil {
			c = f.accepted(ls.n, c)
		}
		if ls.n.cfg.TLS != nil && c.LocalAddr().Network() == "tcp" {
			c = tls.Server(c, ls.n.cfg.TLS)
		}
		ls.n.wg.Go(func() {
			defer ls.n.inbound.open.Add(-1)
			ls.n.gate.serveInbound(c, src)
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
// one source flooding the node cannot keep everyone else out: at most
// maxOpen open and maxPending in their handshake. It returns the source
// to release with handshakeDone.
func (s *inboundLimits) admit(c net.Conn, maxOpen, maxPending int) (string, bool) {
	src := sourceOf(c)
	s.mu.Lock()
	defer s.mu.Unlock()
	share := max(4, maxPending/4)
	if s.open.Load() >= int64(maxOpen) || s.handshaking.Load() >= int64(maxPending) || s.bySource[src] >= share {
		return "", false
	}
	if s.bySource == nil {
		s.bySource = make(map[string]int)
	}
	s.bySource[src]++
	s.open.Add(1)
	s.handshaking.Add(1)
	return src, true
}

// begin records c as in its handshake; false once the node has closed
// the handshakes (closeHandshakes): the caller closes c.
func (s *inboundLimits) begin(c net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		return false
	}
	if s.inHandshake == nil {
		s.inHandshake = make(map[net.Conn]struct{})
	}
	s.inHandshake[c] = struct{}{}
	return true
}

// closeHandshakes closes every connection still in its handshake, and
// makes begin refuse those that come after.
func (s *inboundLimits) closeHandshakes() {
	s.mu.Lock()
	s.closing = true
	conns := make([]net.Conn, 0, len(s.inHandshake))
	for c := range s.inHandshake {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	for _, c := range conns { // (not under the lock: a TLS close writes)
		c.Close()
	}
}

// handshakeDone releases what admit counted for a handshake from src,
// and forgets c, which is in its handshake no longer.
func (s *inboundLimits) handshakeDone(c net.Conn, src string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.inHandshake, c)
	if s.bySource[src]--; s.bySource[src] <= 0 {
		delete(s.bySource, src)
	}
	s.handshaking.Add(-1)
}

// peerLabel names a connection's remote end for logs and errors.
func peerLabel(c net.Conn) string {
	if ra := c.RemoteAddr(); ra != nil && ra.String() != "" && ra.String() != "@" {
		return ra.Network() + "://" + ra.String()
	}
	return c.LocalAddr().Network() + "://" + strings.TrimPrefix(c.LocalAddr().String(), "@") + " (peer)"
}
