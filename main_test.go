package troupe

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestMain runs the tests, then fails the run if any goroutine started by
// the package is still alive.
func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		if leaked := waitNoLeaks(2 * time.Second); leaked != "" {
			fmt.Fprintf(os.Stderr, "goroutines leaked after the tests:\n%s\n", leaked)
			code = 1
		}
	}
	os.Exit(code)
}

// leakedStacks returns the stacks of goroutines running troupe code that a
// test did not start itself.
func leakedStacks() string {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var out []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if !strings.Contains(g, "troupe.") {
			continue
		}
		if strings.Contains(g, "troupe.Test") || strings.Contains(g, "troupe.Benchmark") ||
			strings.Contains(g, "troupe.Fuzz") || strings.Contains(g, "troupe.leakedStacks") ||
			strings.Contains(g, "troupe.Example") || strings.Contains(g, "testing.(*M)") {
			continue
		}
		out = append(out, g)
	}
	return strings.Join(out, "\n\n")
}

// waitNoLeaks polls until no troupe goroutine is left or d passes, and
// returns what was left.
func waitNoLeaks(d time.Duration) string {
	deadline := time.Now().Add(d)
	for {
		s := leakedStacks()
		if s == "" || time.Now().After(deadline) {
			return s
		}
		time.Sleep(20 * time.Millisecond)
	}
}

var leakChecked sync.Map // *testing.T -> struct{}

// checkLeaks registers, once per test, a cleanup that runs after every
// node of the test has closed and fails the test if goroutines are left.
func checkLeaks(t testing.TB) {
	t.Helper()
	if _, loaded := leakChecked.LoadOrStore(t, struct{}{}); loaded {
		return
	}
	t.Cleanup(func() {
		leakChecked.Delete(t)
		if s := waitNoLeaks(2 * time.Second); s != "" {
			t.Errorf("goroutines leaked:\n%s", s)
		}
	})
}

// testConfig is the fast profile for tests: short timeouts, quiet logs.
func testConfig(listen ...string) Config {
	return Config{
		Listen:            listen,
		Logger:            quietLogger(),
		DialTimeout:       2 * time.Second,
		HandshakeTimeout:  2 * time.Second,
		HeartbeatInterval: 100 * time.Millisecond,
		UnreachableAfter:  2 * time.Second,
	}
}

// startNode starts a node for the test and closes it at the end.
func startNode(t testing.TB, cfg Config) *Node {
	t.Helper()
	checkLeaks(t)
	if cfg.Logger == nil {
		cfg.Logger = quietLogger()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	n, err := Start(ctx, cfg)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() {
		if err := n.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return n
}

// transport describes how a test node listens.
type transport struct {
	name   string
	listen func(t testing.TB) string
}

var transports = []transport{
	{"tcp", func(testing.TB) string { return "tcp://127.0.0.1:0" }},
	{"unix", func(t testing.TB) string { return "unix://" + shortSocket(t) }},
}

// forEachTransport runs body once over loopback TCP and once over Unix
// sockets.
func forEachTransport(t *testing.T, body func(t *testing.T, listen func(testing.TB) string)) {
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) { body(t, tr.listen) })
	}
}

// shortSocket returns a fresh socket path short enough for sun_path.
func shortSocket(t testing.TB) string {
	return shortDir(t) + "/n.sock"
}

// shortDir returns a fresh directory with a short path (t.TempDir's can be
// too long for a Unix socket), removed when the test ends.
func shortDir(t testing.TB) string {
	dir, err := os.MkdirTemp("", "trp")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// ctxT returns a context that ends with the test or after d.
func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// waitFor polls cond until it holds or d passes.
func waitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// recv waits for a value on ch.
func recv[T any](t testing.TB, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}
