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
	"time"
)

// Listening: binding each Config.Listen address (and a Unix socket's
// lock file), accepting connections, and the admission limits a
// connection meets before its handshake.

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
