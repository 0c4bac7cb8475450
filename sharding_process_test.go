//go:build unix

package troupe

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// TestHelperShardingProcess is not a test: TestShardsMoveWhenTheirProcessIsKilled
// runs it in a child process. It starts a node that founds a cluster and
// runs the kind "accounts", whose entities print "HANDLED id N" for each
// testPing they take, then prints "READY addr" and waits for stdin to
// close.
func TestHelperShardingProcess(t *testing.T) {
	t.Parallel()
	if os.Getenv("TROUPE_HELPER_SHARDING") == "" {
		t.Skip("helper for the sharding process test")
	}
	n, _ := shardingChild(t, "host", "accounts", ShardingConfig{Shards: 12})
	if n == nil {
		return
	}
	defer n.Close()
	bufio.NewScanner(os.Stdin).Scan() // until stdin closes
}

// A member in another process runs some shards and is killed -9. The two
// members here down it (KeepMajority) and, a removal margin later, run
// its shards; messages sent once they saw it unreachable are held and
// handled then, each once.
func TestShardsMoveWhenTheirProcessIsKilled(t *testing.T) {
	t.Parallel()
	slowTest(t)
	cmd, stdout := startHelperProcess(t, "TestHelperShardingProcess", "TROUPE_HELPER_SHARDING")
	var mu sync.Mutex
	inChild := map[string]bool{}
	lines := make(chan string, 64)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if rest, ok := strings.CutPrefix(sc.Text(), "HANDLED "); ok {
				mu.Lock()
				inChild[strings.Fields(rest)[0]] = true
				mu.Unlock()
				continue
			}
			lines <- sc.Text()
		}
		close(lines)
	}()
	var ready string
	select {
	case ready = <-lines:
	case <-time.After(20 * time.Second):
		t.Fatal("the child said nothing")
	}
	addr, ok := strings.CutPrefix(ready, "READY ")
	if !ok {
		t.Fatalf("child said %q", ready)
	}

	handled := map[string][]string{} // by id, the members that handled it
	var nodes []*Node
	var kinds []*Sharded[testPing]
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
		k, err := Sharding(c, "accounts", func(id string) Behavior[testPing] {
			return Behavior[testPing]{Receive: func(*Context[testPing], testPing) {
				mu.Lock()
				handled[id] = append(handled[id], name)
				mu.Unlock()
			}}
		}, ShardingConfig{Shards: 12})
		if err != nil {
			t.Fatal(err)
		}
		nodes, kinds = append(nodes, n), append(kinds, k)
	}
	const ids = 24
	for i := range ids {
		kinds[i%2].Entity(fmt.Sprint("id-", i)).Tell(testPing{N: i})
	}
	var onChild []string
	waitFor(t, 20*time.Second, "every id handled once", func() bool {
		mu.Lock()
		defer mu.Unlock()
		onChild = onChild[:0]
		for i := range ids {
			id := fmt.Sprint("id-", i)
			if inChild[id] {
				onChild = append(onChild, id)
			} else if len(handled[id]) == 0 {
				return false
			}
		}
		return true
	})
	if len(onChild) == 0 {
		t.Fatal("no entity ran in the child")
	}
	unreachable := make(chan MemberEvent, 64)
	sub := SubscribeChan(nodes[0], unreachable)
	defer sub.Unsubscribe()
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for seen := false; !seen; {
		select {
		case e := <-unreachable:
			seen = e.Kind == eventMemberUnreachable && e.Member.Addr.String() == addr
		case <-time.After(20 * time.Second):
			t.Fatal("b never saw the child unreachable")
		}
	}
	for _, id := range onChild {
		kinds[0].Entity(id).Tell(testPing{N: -1})
	}
	waitFor(t, 60*time.Second, "the child's entities to run here", func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, id := range onChild {
			if len(handled[id]) != 1 {
				return false
			}
		}
		return true
	})
}

// shardingRollConfig is the kind every process of the rolling restart runs.
var shardingRollConfig = ShardingConfig{Shards: 24, RebalanceInterval: 300 * time.Millisecond}

// TestHelperShardingMember is not a test: TestARollingRestartOfProcessesLosesNothing
// runs it in child processes. It joins the cluster at the seed in
// TROUPE_HELPER_SHARDING_MEMBER as TROUPE_HELPER_NAME, runs the kind
// "ledger", whose entities print "HANDLED id N" for each testPing, prints
// "READY addr", and on SIGTERM shuts its node down (Shutdown: its shards
// are handed over first) and prints "STOPPED" and Shutdown's error.
func TestHelperShardingMember(t *testing.T) {
	t.Parallel()
	seed := os.Getenv("TROUPE_HELPER_SHARDING_MEMBER")
	if seed == "" {
		t.Skip("helper for the rolling restart of processes")
	}
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)
	n, say := shardingChild(t, os.Getenv("TROUPE_HELPER_NAME"), "ledger", shardingRollConfig, seed)
	if n == nil {
		return
	}
	defer n.Close()
	<-term
	say("STOPPED %v\n", n.Shutdown(ctxT(t, 30*time.Second)))
}

// shardingChild is a helper process's member: it starts a node named name,
// joins the cluster at seeds (or founds one), runs the sharded kind whose
// entities print "HANDLED id N" for each testPing, and prints "READY
// addr"; say prints a line among the entities'. On failure it prints
// "ERR" and why, and returns a nil node.
func shardingChild(t *testing.T, name, kind string, scfg ShardingConfig, seeds ...string) (n *Node, say func(format string, args ...any)) {
	var out sync.Mutex
	say = func(format string, args ...any) {
		out.Lock()
		defer out.Unlock()
		fmt.Printf(format, args...)
	}
	cfg := failConfig(name, 20*time.Millisecond, 2*time.Second)
	cfg.Listen = []string{"tcp://127.0.0.1:0"}
	n, err := Start(ctxT(t, 5*time.Second), cfg)
	if err != nil {
		fmt.Println("ERR", err)
		return nil, say
	}
	c, err := StartCluster(ctxT(t, 10*time.Second), n, singletonProcessCluster(seeds...))
	if err == nil {
		_, err = Sharding(c, kind, func(id string) Behavior[testPing] {
			return Behavior[testPing]{Receive: func(_ *Context[testPing], m testPing) { say("HANDLED %s %d\n", id, m.N) }}
		}, scfg)
	}
	if err != nil {
		fmt.Println("ERR", err)
		n.Close()
		return nil, say
	}
	say("READY %s\n", n.Addrs()[0])
	return n, say
}

// rollLedger is what the entities of every process handled: for each id,
// the N of each message in the order its process handled them, and the
// process.
type rollLedger struct {
	mu      sync.Mutex
	by      map[string][]rollEntry
	count   int
	handled map[string]int // by process
}

type rollEntry struct {
	n    int
	proc string
}

func (l *rollLedger) add(id string, n int, proc string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.by[id] = append(l.by[id], rollEntry{n, proc})
	l.count++
	l.handled[proc]++
}

func (l *rollLedger) on(proc string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.handled[proc]
}

// rollMember is a child process of the rolling restart.
type rollMember struct {
	cmd     *exec.Cmd
	ready   chan string
	stopped chan string
	exited  chan struct{}
}

func startRollMember(t *testing.T, seed, name string, l *rollLedger) *rollMember {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	m := &rollMember{ready: make(chan string, 1), stopped: make(chan string, 1), exited: make(chan struct{})}
	m.cmd = exec.Command(exe, "-test.run=^TestHelperShardingMember$")
	m.cmd.Env = append(os.Environ(), "TROUPE_HELPER_SHARDING_MEMBER="+seed, "TROUPE_HELPER_NAME="+name)
	m.cmd.Stderr = os.Stderr
	stdout, _ := m.cmd.StdoutPipe()
	if err := m.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(m.exited)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			line := sc.Text()
			switch {
			case strings.HasPrefix(line, "HANDLED "):
				f := strings.Fields(line)
				var n int
				fmt.Sscan(f[2], &n)
				l.add(f[1], n, name)
			case strings.HasPrefix(line, "READY "):
				m.ready <- strings.TrimPrefix(line, "READY ")
			case strings.HasPrefix(line, "STOPPED"):
				m.stopped <- strings.TrimSpace(strings.TrimPrefix(line, "STOPPED"))
			case strings.HasPrefix(line, "ERR"):
				m.ready <- line
			}
		}
		m.cmd.Wait()
	}()
	t.Cleanup(func() {
		m.cmd.Process.Kill()
		<-m.exited
	})
	select {
	case r := <-m.ready:
		if strings.HasPrefix(r, "ERR") {
			t.Fatalf("%s: %s", name, r)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("%s said nothing", name)
	}
	return m
}

// stop sends m SIGTERM and waits for its Shutdown and its exit.
func (m *rollMember) stop(t *testing.T, name string) {
	t.Helper()
	if err := m.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-m.stopped:
		if err != "<nil>" {
			t.Errorf("%s's Shutdown: %s", name, err)
		}
	case <-time.After(40 * time.Second):
		t.Fatalf("%s's Shutdown did not end", name)
	}
	select {
	case <-m.exited:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s did not exit", name)
	}
}

// Members in other processes are replaced one at a time, each stopped
// with SIGTERM and Shutdown, while this one sends to 20 entities: every
// message is handled exactly once, and each process handles an entity's
// messages in the order they were sent.
func TestARollingRestartOfProcessesLosesNothing(t *testing.T) {
	t.Parallel()
	slowTest(t)
	l := &rollLedger{by: map[string][]rollEntry{}, handled: map[string]int{}}
	cfg := failConfig("a", 20*time.Millisecond, 2*time.Second)
	cfg.Listen = []string{"tcp://127.0.0.1:0"}
	n := startNode(t, cfg)
	c, err := StartCluster(ctxT(t, 10*time.Second), n, singletonProcessCluster())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	k, err := Sharding(c, "ledger", func(id string) Behavior[testPing] {
		return Behavior[testPing]{Receive: func(_ *Context[testPing], m testPing) { l.add(id, m.N, "a") }}
	}, shardingRollConfig)
	if err != nil {
		t.Fatal(err)
	}
	seed := n.Addrs()[0].String()
	ups := func(want int) {
		t.Helper()
		waitFor(t, 30*time.Second, fmt.Sprint(want, " members up"), func() bool {
			up := 0
			for _, m := range c.Members() {
				if m.Status == MemberUp {
					up++
				}
			}
			return up == want
		})
	}
	b := startRollMember(t, seed, "b", l)
	d := startRollMember(t, seed, "d", l)
	ups(3)

	const ids = 20
	var sent atomic.Int64
	stopSending := make(chan struct{})
	sending := make(chan struct{})
	go func() {
		defer close(sending)
		for round := 0; ; round++ {
			select {
			case <-stopSending:
				return
			default:
			}
			for i := range ids {
				k.Entity(fmt.Sprint("id-", i)).Tell(testPing{N: round})
			}
			sent.Add(ids)
			time.Sleep(5 * time.Millisecond)
		}
	}()
	for _, name := range []string{"b", "d"} {
		waitFor(t, 30*time.Second, "entities on "+name, func() bool { return l.on(name) > 0 })
	}
	for i, old := range []*rollMember{b, d} {
		name := []string{"b2", "d2"}[i]
		startRollMember(t, seed, name, l)
		ups(4)
		waitFor(t, 30*time.Second, "entities on "+name, func() bool { return l.on(name) > 0 })
		old.stop(t, []string{"b", "d"}[i])
		ups(3)
	}
	close(stopSending)
	<-sending
	want := int(sent.Load())
	waitFor(t, 60*time.Second, fmt.Sprint("all ", want, " messages handled"), func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.count >= want
	})
	l.mu.Lock()
	defer l.mu.Unlock()
	t.Logf("%d messages, handled by process: %v", want, l.handled)
	if l.count != want {
		t.Errorf("%d messages handled; %d sent", l.count, want)
	}
	rounds := want / ids
	for i := range ids {
		id := fmt.Sprint("id-", i)
		seen := make([]int, rounds)
		last := map[string]int{}
		for _, e := range l.by[id] {
			if e.n < 0 || e.n >= rounds {
				t.Fatalf("%s: message %d handled; only %d sent", id, e.n, rounds)
			}
			seen[e.n]++
			if prev, ok := last[e.proc]; ok && e.n <= prev {
				t.Errorf("%s: %s handled #%d after #%d", id, e.proc, e.n, prev)
			}
			last[e.proc] = e.n
		}
		for n, times := range seen {
			if times != 1 {
				t.Errorf("%s: message #%d handled %d times", id, n, times)
			}
		}
	}
}
