package troupe

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

func TestUnixSocketPathTooLongIsAnError(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	for _, long := range []string{
		"/tmp/" + strings.Repeat("d", maxSocketPath-len("/tmp/")+1), // one byte past this platform's limit
		"/tmp/" + strings.Repeat("d", 120),                          // past every platform's
	} {
		_, err := Start(ctxT(t, 5*time.Second), testConfig("unix://"+long))
		if err == nil || !strings.Contains(err.Error(), long) || !strings.Contains(err.Error(), strconv.Itoa(len(long))+" bytes") {
			t.Fatalf("Start on a %d-byte socket path: %v", len(long), err)
		}
	}
}

func TestLongRuntimeDirIsAnErrorNotAPanic(t *testing.T) {
	// Not beside other tests: it sets environment variables (t.Setenv),
	// which belong to the whole process.
	base := filepath.Join(t.TempDir(), strings.Repeat("r", 100))
	if err := os.MkdirAll(base, 0o700); err != nil {
		t.Fatal(err)
	}
	t.Setenv("XDG_RUNTIME_DIR", base)
	cfg := testConfig("unix://" + shortSocket(t))
	cfg.Discovery = true // the default registry socket goes in the runtime directory
	_, err := Start(ctxT(t, 5*time.Second), cfg)
	if err == nil || !strings.Contains(err.Error(), base) {
		t.Fatalf("Start with a long XDG_RUNTIME_DIR: %v", err)
	}
}

func TestUnixSocketDirectoryIsCreated(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	dir := filepath.Join(shortDir(t), "a", "b")
	n := startNode(t, testConfig("unix://"+filepath.Join(dir, "n.sock")))
	fi, err := os.Stat(dir)
	if err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("socket directory: %v, %v", fi, err)
	}
	if _, err := Resolve[int](ctxT(t, 5*time.Second), startNode(t, testConfig()), FormatRef(n.Addrs()[0], "/user/none")); !errors.Is(err, ErrNoSuchActor) {
		t.Fatalf("the node in the created directory does not answer: %v", err)
	}
}

func TestUnixSocketDirectoryThatCannotBeCreated(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	file := filepath.Join(shortDir(t), "f")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := Start(context.Background(), testConfig("unix://"+filepath.Join(file, "n.sock")))
	if err == nil || !strings.Contains(err.Error(), file) {
		t.Fatalf("Start under a plain file: %v", err)
	}
}

func TestUnixSocketLockFilesAreRemovedOnClose(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	dir := shortDir(t)
	for i := range 5 {
		n := startNode(t, testConfig("unix://"+filepath.Join(dir, "n.sock")))
		if err := n.Close(); err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
	}
	left, _ := filepath.Glob(filepath.Join(dir, "*"))
	if len(left) != 0 {
		t.Fatalf("files left in the socket directory after Close: %v", left)
	}
}

// flakyListener fails its first fails Accept calls with "too many open
// files", then accepts for real.
type flakyListener struct {
	net.Listener
	fails atomic.Int32
}

func (l *flakyListener) Accept() (net.Conn, error) {
	if l.fails.Add(-1) >= 0 {
		return nil, &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", syscall.EMFILE)}
	}
	return l.Listener.Accept()
}

func TestAcceptErrorsDoNotStopTheListener(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	n := startNode(t, testConfig())
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fl := &flakyListener{Listener: l}
	fl.fails.Store(6)
	// The node serves this listener as it serves its own; Close ends it.
	n.lis.mu.Lock()
	n.lis.list = append(n.lis.list, fl)
	n.lis.mu.Unlock()
	n.wg.Go(func() { n.lis.acceptLoop(fl) })
	spawnEcho(t, n, "echo")
	other := startNode(t, testConfig())
	r, err := Resolve[testPing](ctxT(t, 10*time.Second), other, FormatRef(tcpAddr(l.Addr().String()), "/user/echo"))
	if err != nil {
		t.Fatalf("a peer after six failed accepts: %v", err)
	}
	if _, err := Ask(ctxT(t, 5*time.Second), r, func(rr Ref[testPong]) testPing { return testPing{ReplyTo: rr} }); err != nil {
		t.Fatal(err)
	}
	if got := n.inbound.acceptErrors.Load(); got != 6 {
		t.Fatalf("acceptErrors = %d, want 6", got)
	}
}
