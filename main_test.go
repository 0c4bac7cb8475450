package troupe

import (
	"context"
	"flag"
	"fmt"
	"os"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestMain runs the tests, then fails the run if any goroutine started by
// the package is still alive.
//
// Most tests spend their time waiting for a node's timers, not computing,
// so unless -parallel is given it runs up to testParallel tests side by
// side instead of go test's default of one per processor.
func TestMain(m *testing.M) {
	flag.Parse()
	helper := os.Getenv("TROUPE_TEST_PROCESS") != ""
	exitWithParent()
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == "test.parallel" })
	// (-parallel is also the number of fuzzing workers: a fuzz run keeps
	// go test's default of one per processor.)
	if fz := flag.Lookup("test.fuzz"); !given && (fz == nil || fz.Value.String() == "") {
		n := testParallel
		if raceEnabled {
			n = testParallelRace
		}
		_ = flag.Set("test.parallel", strconv.Itoa(n))
	}
	record := os.Getenv("TROUPE_LOCKRANK_RECORD") // a file: see lockrank.go
	lockTrack.on, lockTrack.record = lockCheckInTests(), record != ""
	code := m.Run()
	if record != "" && !helper {
		os.WriteFile(record, []byte(lockOrderSeen()+"\n"), 0o644)
	}
	if code == 0 {
		if leaked := waitNoLeaks("", 5*time.Second); leaked != "" {
			fmt.Fprintf(os.Stderr, "goroutines leaked after the tests:\n%s\n", leaked)
			code = 1
		}
	}
	os.Exit(code)
}

// exitWithParent makes a helper process (this test binary run again by a
// process test: a process that inherited TROUPE_TEST_PROCESS) end when
// the process that started it ends: a test binary killed by its timeout, or by kill -9, would leave
// its helpers running, holding ports and both cores for the next run. The
// parent is polled: on Unix an orphan is adopted by another process; on
// Windows the parent's pid stays, and nothing happens.
func exitWithParent() {
	// The test process put its pid in the environment the helper
	// inherited: a helper that only watched its parent change from when
	// it started might already have been orphaned by then. (Its parent
	// may also be another process, such as ip netns exec.)
	start := os.Getppid()
	inherited := os.Getenv("TROUPE_TEST_PROCESS")
	os.Setenv("TROUPE_TEST_PROCESS", strconv.Itoa(os.Getpid())) // (for this process's helpers)
	test, err := strconv.Atoi(inherited)
	if err != nil {
		return // a test process, not a helper: only a test process sets it
	}
	go func() {
		for {
			if os.Getppid() != start || processGone(test) {
				fmt.Fprintln(os.Stderr, "the test process that started this helper is gone: exiting")
				os.Exit(3)
			}
			time.Sleep(250 * time.Millisecond)
		}
	}()
}

// leakedStacks returns the stacks of goroutines running troupe code that a
// test did not start itself. With test empty it looks at every goroutine;
// otherwise only at those labelled with that test's name (see checkLeaks),
// so that tests running side by side do not see each other's nodes.
func leakedStacks(test string) string {
	var buf strings.Builder
	_ = pprof.Lookup("goroutine").WriteTo(&buf, 1)
	label := `"test":` + strconv.Quote(test)
	var out []string
	for _, g := range strings.Split(buf.String(), "\n\n") {
		if !strings.Contains(g, "troupe.") {
			continue
		}
		if test != "" && !strings.Contains(g, label) {
			continue
		}
		if strings.Contains(g, "troupe.Test") || strings.Contains(g, "troupe.Benchmark") ||
			strings.Contains(g, "troupe.Fuzz") || strings.Contains(g, "troupe.leakedStacks") || strings.Contains(g, "troupe.exitWithParent") ||
			strings.Contains(g, "troupe.Example") || strings.Contains(g, "testing.(*M)") {
			continue
		}
		out = append(out, g)
	}
	return strings.Join(out, "\n\n")
}

// waitNoLeaks polls until no troupe goroutine of test (of any test, if
// test is empty) is left or d passes, and returns what was left.
func waitNoLeaks(test string, d time.Duration) string {
	deadline := time.Now().Add(d)
	for {
		s := leakedStacks(test)
		if s == "" || time.Now().After(deadline) {
			return s
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// testParallel is how many tests run side by side when -parallel is not
// given; testParallelRace under the race detector, which makes each test
// compute several times more: eight side by side starved the timing of
// some (a registrar's write-stall check, a singleton's pause fence) in
// CI's race runs on the 2-core machine.
const testParallel, testParallelRace = 8, 4

var leakChecked sync.Map // *testing.T -> struct{}

// checkLeaks registers, once per test, a cleanup that runs after every
// node of the test has closed and fails the test if goroutines are left.
// It labels the test's goroutine with the test's name; every goroutine it
// starts from then on, and theirs in turn, carries the label, which is how
// the cleanup tells this test's goroutines from those of tests running
// beside it. (Goroutines the runtime starts for time.AfterFunc carry no
// label; TestMain's check at the end of the run sees those.)
func checkLeaks(t testing.TB) {
	t.Helper()
	if _, loaded := leakChecked.LoadOrStore(t, struct{}{}); loaded {
		return
	}
	pprof.SetGoroutineLabels(pprof.WithLabels(context.Background(), pprof.Labels("test", t.Name())))
	t.Cleanup(func() {
		leakChecked.Delete(t)
		if s := waitNoLeaks(t.Name(), 2*time.Second); s != "" {
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

// slack stretches a wait's deadline: a wait ends at its event, so its
// deadline only says how long a failure takes to be reported, and on a
// loaded machine (CI, two CPU burners beside the suite) events come
// later. TROUPE_WAIT_SCALE sets the factor (default 3).
func slack(d time.Duration) time.Duration {
	if f, err := strconv.ParseFloat(os.Getenv("TROUPE_WAIT_SCALE"), 64); err == nil && f > 0 {
		return time.Duration(float64(d) * f)
	}
	return 3 * d
}

// waitFor polls cond until it holds or d (stretched by slack) passes.
func waitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	d = slack(d)
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
