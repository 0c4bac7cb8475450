//go:build unix

package troupe

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// singletonProcessCluster is the cluster configuration of the singleton
// and sharding process tests (every process uses it). Their removal
// margin, which is never less than LeaseReleaseAfter (StableAfter +
// DownAllWhenUnstable + LeaseMinorityDelay + max(StableAfter, 1 s) +
// StableAfter/2), is 5.6 s, not the 8.5 s of the defaults: they use no
// lease, so the minority's delay would only lengthen it, and a cluster
// may stay unstable 3 s (three StableAfters, not the 4 s floor) before
// every member is downed, as in the tests' marginCluster.
func singletonProcessCluster(seeds ...string) ClusterConfig {
	return ClusterConfig{Seeds: seeds, Downing: KeepMajority(), StableAfter: time.Second,
		DownAllWhenUnstable: 3 * time.Second, LeaseMinorityDelay: 100 * time.Millisecond}
}

// TestHelperSingletonProcess is not a test: TestASingletonMovesWhenItsProcessIsKilled
// runs it in a child process. It starts a node that founds a cluster and
// runs the singleton "clock", whose instance prints "HANDLED N" for each
// testPing it takes, then prints "READY addr" and waits for stdin to
// close.
func TestHelperSingletonProcess(t *testing.T) {
	t.Parallel()
	if os.Getenv("TROUPE_HELPER_SINGLETON") == "" {
		t.Skip("helper for the singleton process test")
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
	var out sync.Mutex
	if _, err := Singleton(c, "clock", func() Behavior[testPing] {
		return Behavior[testPing]{Receive: func(_ *Context[testPing], m testPing) {
			out.Lock()
			fmt.Printf("HANDLED %d\n", m.N)
			out.Unlock()
		}}
	}, SingletonConfig{}); err != nil {
		fmt.Println("ERR", err)
		return
	}
	out.Lock()
	fmt.Printf("READY %s\n", n.Addrs()[0])
	out.Unlock()
	bufio.NewScanner(os.Stdin).Scan() // until stdin closes
}

// startHelperProcess runs the test helper (a Test function that acts
// only when env is set) in a child process of this test binary, and
// returns it with its standard output (extraEnv: more of the child's
// environment, as "KEY=value"). The child runs until the test
// ends: its standard input is closed then, and it is killed.
func startHelperProcess(t *testing.T, helper, env string, extraEnv ...string) (*exec.Cmd, io.ReadCloser) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^"+helper+"$")
	cmd.Env = append(append(os.Environ(), env+"=1"), extraEnv...)
	cmd.Stderr = os.Stderr
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stdin.Close()
		cmd.Process.Kill()
		cmd.Wait()
	})
	return cmd, stdout
}

// The oldest member runs in another process and holds the singleton; it
// is killed -9. The two members here down it (KeepMajority) and, a
// removal margin later, the next oldest starts the instance; messages
// sent through either member reach it.
func TestASingletonMovesWhenItsProcessIsKilled(t *testing.T) {
	t.Parallel()
	slowTest(t)
	cmd, stdout := startHelperProcess(t, "TestHelperSingletonProcess", "TROUPE_HELPER_SINGLETON")
	lines := make(chan string, 64)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	next := func(what string) string {
		t.Helper()
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("the child ended before %s", what)
			}
			return l
		case <-time.After(20 * time.Second):
			t.Fatalf("the child said nothing before %s", what)
			return ""
		}
	}
	ready := next("READY")
	addr, ok := strings.CutPrefix(ready, "READY ")
	if !ok {
		t.Fatalf("child said %q", ready)
	}

	var mu sync.Mutex
	var starts []string
	handled := map[string]int{}
	var members []*Cluster
	var refs []Ref[testPing]
	for _, name := range []string{"b", "c"} {
		cfg := failConfig(name, 20*time.Millisecond, 2*time.Second)
		cfg.Listen = []string{"tcp://127.0.0.1:0"}
		n := startNode(t, cfg)
		c, err := StartCluster(ctxT(t, 10*time.Second), n, singletonProcessCluster(addr))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		members = append(members, c)
		waitFor(t, 10*time.Second, name+" up", func() bool { return c.Self().Status == MemberUp })
		r, err := Singleton(c, "clock", func() Behavior[testPing] {
			return Behavior[testPing]{
				Setup: func(*Context[testPing]) {
					mu.Lock()
					starts = append(starts, name)
					mu.Unlock()
				},
				Receive: func(*Context[testPing], testPing) {
					mu.Lock()
					handled[name]++
					mu.Unlock()
				},
			}
		}, SingletonConfig{})
		if err != nil {
			t.Fatal(err)
		}
		refs = append(refs, r)
	}
	refs[1].Tell(testPing{N: 1})
	if l := next("the first message"); l != "HANDLED 1" {
		t.Fatalf("the child said %q, want HANDLED 1", l)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 40*time.Second, "the instance to start on b", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(starts) > 0
	})
	for i := range 10 {
		refs[i%2].Tell(testPing{N: 10 + i})
	}
	waitFor(t, 10*time.Second, "ten messages handled on b", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return handled["b"] == 10
	})
	mu.Lock()
	defer mu.Unlock()
	if len(starts) != 1 || starts[0] != "b" || handled["c"] != 0 {
		t.Fatalf("started on %v, handled %v; want one start, on b", starts, handled)
	}
}
