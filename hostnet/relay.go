//go:build linux

package hostnet

import (
	"math/rand/v2"
	"net"
	"os"
	"runtime"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// inNamespace runs f on a fresh OS thread switched into namespace ns;
// sockets made in f stay in ns. The thread is never switched back: it ends
// with its goroutine, so no other goroutine ever runs in the wrong
// namespace.
func inNamespace(ns string, f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread exits with this goroutine
		target, err := os.Open("/var/run/netns/" + ns)
		if err != nil {
			errc <- err
			return
		}
		defer target.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- err
			return
		}
		errc <- f()
	}()
	return <-errc
}

// Relay is a userspace TCP relay that delays what it forwards, in both
// directions, by Delay plus a uniformly random Jitter in [-Jitter, +Jitter]
// per chunk, keeping byte order. It stands in for netem where the kernel
// has none.
type Relay struct {
	Addr string // host:port to dial instead of the target

	l      net.Listener
	wg     sync.WaitGroup
	mu     sync.Mutex
	conns  []net.Conn
	closed bool
}

// NewRelay listens on host from's address (on a free port) and forwards
// each connection to target, dialed from inside from's namespace, with the
// given delay and jitter each way. A program on from dials r.Addr instead
// of target. The relay is closed by the test's cleanup.
func NewRelay(t testing.TB, from *Host, target string, delay, jitter time.Duration) *Relay {
	t.Helper()
	r := &Relay{}
	err := inNamespace(from.Name, func() error {
		l, err := net.Listen("tcp", from.IP.String()+":0")
		r.l = l
		return err
	})
	if err != nil {
		t.Fatalf("hostnet relay: %v", err)
	}
	r.Addr = r.l.Addr().String()
	t.Cleanup(r.Close)
	r.wg.Go(func() {
		for {
			c, err := r.l.Accept()
			if err != nil {
				return
			}
			var up net.Conn
			err = inNamespace(from.Name, func() error {
				var err error
				up, err = net.Dial("tcp", target)
				return err
			})
			if err != nil {
				c.Close()
				continue
			}
			r.mu.Lock()
			if r.closed {
				r.mu.Unlock()
				c.Close()
				up.Close()
				return
			}
			r.conns = append(r.conns, c, up)
			r.mu.Unlock()
			r.wg.Go(func() { pipe(up, c, delay, jitter) })
			r.wg.Go(func() { pipe(c, up, delay, jitter) })
		}
	})
	return r
}

// pipe copies src to dst, holding each chunk until its release time.
func pipe(dst, src net.Conn, delay, jitter time.Duration) {
	type chunk struct {
		b  []byte
		at time.Time
	}
	q := make(chan chunk, 1024)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for c := range q {
			if d := time.Until(c.at); d > 0 {
				time.Sleep(d)
			}
			if _, err := dst.Write(c.b); err != nil {
				return
			}
		}
		if tc, ok := dst.(*net.TCPConn); ok {
			tc.CloseWrite()
		}
	}()
	var last time.Time
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			at := time.Now().Add(delay)
			if jitter > 0 {
				at = at.Add(time.Duration(rand.Int64N(int64(2*jitter))) - jitter)
			}
			if at.Before(last) {
				at = last // keep the stream in order
			}
			last = at
			q <- chunk{append([]byte(nil), buf[:n]...), at}
		}
		if err != nil {
			break
		}
	}
	close(q)
	<-done
}

// Close stops the relay and closes every connection through it.
func (r *Relay) Close() {
	r.mu.Lock()
	r.closed = true
	for _, c := range r.conns {
		c.Close()
	}
	r.mu.Unlock()
	r.l.Close()
	r.wg.Wait()
}
