//go:build unix

package troupe

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// tickingInstance is a singleton instance that, every 20 ms, appends
// "pid unix-nanoseconds" (when its handler began) to the file at path: the instances themselves
// say when they ran, whatever their members believe.
func tickingInstance(path string) func() Behavior[testPing] {
	return func() Behavior[testPing] {
		return Behavior[testPing]{
			Setup: func(c *Context[testPing]) { c.StartTicker("tick", 20*time.Millisecond, testPing{}) },
			Receive: func(*Context[testPing], testPing) {
				// When the handler began, read first: a process stopped
				// in the middle of the file's syscalls wakes inside a
				// handler that was already running, which the fence does
				// not stop (README: only a fencing token does).
				began := time.Now()
				f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
				if err != nil {
					return
				}
				fmt.Fprintf(f, "%d %d\n", os.Getpid(), began.UnixNano())
				f.Close()
			},
		}
	}
}

// TestHelperPausedSingletonProcess is not a test:
// TestASingletonNeverRunsTwiceAcrossAProcessPause runs it in a child
// process. It founds a cluster and runs the singleton "clock" (a
// tickingInstance writing to TROUPE_SINGLETON_LOG), prints "READY addr",
// prints "DOWNED" when its membership ends, and waits for stdin to close.
func TestHelperPausedSingletonProcess(t *testing.T) {
	// Not beside other tests: it is the body of a child process, and
	// returns at once anywhere else.
	if os.Getenv("TROUPE_HELPER_PAUSED_SINGLETON") == "" {
		t.Skip("helper for the paused singleton process test")
	}
	cfg := failConfig("holder", 20*time.Millisecond, 2*time.Second)
	cfg.Listen = []string{"tcp://127.0.0.1:0"}
	n, err := Start(ctxT(t, 5*time.Second), cfg)
	if err != nil {
		fmt.Println("ERR", err)
		return
	}
	defer n.Close()
	c, err := StartCluster(ctxT(t, 5*time.Second), n, singletonProcessCluster())
	if err != nil {
		fmt.Println("ERR", err)
		return
	}
	if _, err := Singleton(c, "clock", tickingInstance(os.Getenv("TROUPE_SINGLETON_LOG")), SingletonConfig{}); err != nil {
		fmt.Println("ERR", err)
		return
	}
	fmt.Printf("READY %s\n", n.Addrs()[0])
	go func() {
		<-c.Done()
		fmt.Println("DOWNED")
	}()
	bufio.NewScanner(os.Stdin).Scan() // until stdin closes
}

// Issue #51, item 3: the oldest member runs in another process and holds
// the singleton; the process is stopped with SIGSTOP for longer than the
// removal margin. The two members here down it (KeepMajority) and start
// the instance on b; then the process is continued with SIGCONT. Its
// instance's ticker is long overdue when it wakes: measured by the
// instances themselves (each appends its pid and the time to one file),
// no line of the paused process may come after the first line of b's.
func TestASingletonNeverRunsTwiceAcrossAProcessPause(t *testing.T) {
	t.Parallel()
	slowTest(t)
	// Two pauses side by side: whether the paused instance's goroutines
	// run before its loop's is a matter of scheduling (without the
	// fence, one run of three caught nothing).
	for i := range 2 {
		t.Run(fmt.Sprint(i+1), func(t *testing.T) {
			t.Parallel()
			checkLeaks(t)
			pausedSingletonProcess(t)
		})
	}
}

func pausedSingletonProcess(t *testing.T) {
	path := t.TempDir() + "/instances"
	cmd, stdout := startHelperProcess(t, "TestHelperPausedSingletonProcess", "TROUPE_HELPER_PAUSED_SINGLETON", "TROUPE_SINGLETON_LOG="+path)
	lines := make(chan string, 64)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	next := func(what string, within time.Duration) string {
		t.Helper()
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("the child ended before %s", what)
			}
			return l
		case <-time.After(within):
			t.Fatalf("the child said nothing within %v: %s", within, what)
			return ""
		}
	}
	addr, ok := strings.CutPrefix(next("READY", 20*time.Second), "READY ")
	if !ok {
		t.Fatal("the child did not say READY")
	}
	child, me := cmd.Process.Pid, os.Getpid()
	for _, name := range []string{"b", "c"} {
		cfg := failConfig(name, 20*time.Millisecond, 2*time.Second)
		cfg.Listen = []string{"tcp://127.0.0.1:0"}
		n := startNode(t, cfg)
		c, err := StartCluster(ctxT(t, 10*time.Second), n, singletonProcessCluster(addr))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		waitFor(t, 10*time.Second, name+" up", func() bool { return c.Self().Status == MemberUp })
		if _, err := Singleton(c, "clock", tickingInstance(path), SingletonConfig{}); err != nil {
			t.Fatal(err)
		}
	}
	ran := func(pid int) (first, last time.Time, n int) {
		b, _ := os.ReadFile(path)
		for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			f := strings.Fields(l)
			if len(f) != 2 || f[0] != strconv.Itoa(pid) {
				continue
			}
			ns, _ := strconv.ParseInt(f[1], 10, 64)
			at := time.Unix(0, ns)
			if n == 0 {
				first = at
			}
			last, n = at, n+1
		}
		return first, last, n
	}
	waitFor(t, 10*time.Second, "the child's instance to tick", func() bool { _, _, n := ran(child); return n > 0 })
	if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	waitFor(t, 40*time.Second, "the instance to start here", func() bool { _, _, n := ran(me); return n > 0 })
	if err := cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	t.Logf("b's instance started %v after the SIGSTOP", time.Since(stopped).Round(time.Millisecond))
	if l := next("DOWNED", 20*time.Second); l != "DOWNED" {
		t.Fatalf("the child said %q, want DOWNED", l)
	}
	// Whatever the child's instance wrote, it has written once the child
	// is gone.
	cmd.Process.Kill()
	cmd.Wait()
	mine, _, _ := ran(me)
	_, last, _ := ran(child)
	if !last.Before(mine) {
		t.Fatalf("the paused process's instance ran at %v, %v after this process's instance started: two instances at once", last.Format(time.StampMicro), last.Sub(mine))
	}
}
