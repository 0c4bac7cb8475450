//go:build unix

package troupe

import (
	"bufio"
	"fmt"
	"os"
	"strings"
	"sync"
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
	if os.Getenv("TROUPE_HELPER_SHARDING") == "" {
		t.Skip("helper for the sharding process test")
	}
	cfg := failConfig("host", 20*time.Millisecond, 2*time.Second)
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
	if _, err := Sharding(c, "accounts", func(id string) Behavior[testPing] {
		return Behavior[testPing]{Receive: func(_ *Context[testPing], m testPing) {
			out.Lock()
			fmt.Printf("HANDLED %s %d\n", id, m.N)
			out.Unlock()
		}}
	}, ShardingConfig{Shards: 12}); err != nil {
		fmt.Println("ERR", err)
		return
	}
	out.Lock()
	fmt.Printf("READY %s\n", n.Addrs()[0])
	out.Unlock()
	bufio.NewScanner(os.Stdin).Scan() // until stdin closes
}

// A member in another process runs some shards and is killed -9. The two
// members here down it (KeepMajority) and, a removal margin later, run
// its shards; messages sent once they saw it unreachable are held and
// handled then, each once.
func TestShardsMoveWhenTheirProcessIsKilled(t *testing.T) {
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
	sub := SubscribeChan(nodes[0].Events(), unreachable)
	defer sub.Unsubscribe()
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for seen := false; !seen; {
		select {
		case e := <-unreachable:
			seen = e.Kind == EventMemberUnreachable && e.Member.Addr.String() == addr
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
