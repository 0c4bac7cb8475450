package troupe

import (
	"bufio"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"runtime/pprof"
	"strconv"
	"sync/atomic"
	"testing"
	"time"
)

// idleAssociationBudget is what an idle association may cost the node
// that holds it: its buffers, its state and its goroutines' stacks
// (issue #34, item 4).
const idleAssociationBudget = 16 << 10

// idleBurst is how many tells each of k idle sessions carries first:
// 300,000 in all, so that the one actor they go to keeps up.
func idleBurst(k int) int { return max(300000/k, 10) }

// TestAnIdleAssociationIsCheap holds many idle inbound associations,
// opened by a separate process, and measures what each costs the node
// (heap and stacks, after a collection). TROUPE_IDLE_ASSOCS sets how many
// (default 5,000; BENCHMARKS.md records 10,000).
func TestAnIdleAssociationIsCheap(t *testing.T) {
	// Not beside other tests: it measures the process's heap, goroutines or
	// allocations, which tests running beside it would change.
	slowTest(t)
	if raceEnabled {
		t.Skip("memory figures under the race detector are not the node's")
	}
	k := 5000
	if s := os.Getenv("TROUPE_IDLE_ASSOCS"); s != "" {
		k, _ = strconv.Atoi(s)
	}
	cfg := Config{Listen: []string{"tcp://127.0.0.1:0"}, MaxInboundConns: k + 16} // the one deviation
	n := startNode(t, cfg)
	// Each session first carries a burst of tells, as a used association
	// has: what the burst grew must go back when the link falls quiet.
	received := make(chan struct{}, 1)
	var got atomic.Int64
	sink, err := Spawn(n, "sink", Behavior[count]{Receive: func(*Context[count], count) {
		if got.Add(1) == int64(k*idleBurst(k)) {
			received <- struct{}{}
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	peers := func() int {
		n.peers.mu.Lock()
		defer n.peers.mu.Unlock()
		return len(n.peers.byUID)
	}
	heapStacks := func() (uint64, uint64) {
		runtime.GC()
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapInuse, ms.StackInuse
	}
	h0, s0 := heapStacks()
	g0 := runtime.NumGoroutine()

	cmd := exec.Command(os.Args[0], "-test.run=^TestIdleAssociationsClient$")
	cmd.Env = append(os.Environ(), "TROUPE_IDLE_CLIENT="+n.Addrs()[0].Address(), fmt.Sprintf("TROUPE_IDLE_ASSOCS=%d", k))
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		stdin.Close() // the client closes its connections and exits
		cmd.Wait()
	}()
	ready := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if sc.Text() == "READY" {
				ready <- nil
				io.Copy(io.Discard, stdout)
				return
			}
		}
		ready <- fmt.Errorf("the client process ended before its %d connections were up", k)
	}()
	select {
	case err := <-ready:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("the client process did not open its connections")
	}
	waitFor(t, 30*time.Second, "every association up", func() bool { return peers() >= k })
	select {
	case <-received:
	case <-time.After(time.Minute):
		t.Fatalf("%d of %d tells arrived", got.Load(), k*idleBurst(k))
	}
	// The one actor's mailbox, grown by the bursts, is not the
	// associations' cost.
	if err := n.Stop(sink); err != nil {
		t.Fatal(err)
	}
	// The links are quiet now but for heartbeats, every 500 ms: each
	// reader gives back what the burst grew at the next one.
	var heap, stacks int64
	deadline := time.Now().Add(15 * time.Second)
	for {
		h1, s1 := heapStacks()
		heap, stacks = (int64(h1)-int64(h0))/int64(k), (int64(s1)-int64(s0))/int64(k)
		if heap+stacks <= idleAssociationBudget || time.Now().After(deadline) {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	g1 := runtime.NumGoroutine()
	if f := os.Getenv("TROUPE_IDLE_PROFILE"); f != "" {
		w, _ := os.Create(f)
		pprof.WriteHeapProfile(w)
		w.Close()
	}
	t.Logf("%d idle associations, each after a burst of %d tells: %d B of heap and %d B of stacks each (%.1f goroutines each)", k, idleBurst(k), heap, stacks, float64(g1-g0)/float64(k))
	if heap+stacks > idleAssociationBudget {
		t.Fatalf("an idle association costs %d bytes (heap %d, stacks %d), more than %d", heap+stacks, heap, stacks, idleAssociationBudget)
	}
	if got := peers(); got < k {
		t.Fatalf("%d of %d associations were still up at the end", got, k)
	}
}

// TestIdleAssociationsClient is the client process of
// TestAnIdleAssociationIsCheap: it opens TROUPE_IDLE_ASSOCS sessions with
// the node at TROUPE_IDLE_CLIENT, heartbeats them, prints READY, and holds
// them until its standard input closes.
func TestIdleAssociationsClient(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	addr := os.Getenv("TROUPE_IDLE_CLIENT")
	if addr == "" {
		t.Skip("the client process of TestAnIdleAssociationIsCheap")
	}
	k, _ := strconv.Atoi(os.Getenv("TROUPE_IDLE_ASSOCS"))
	conns := make([]net.Conn, 0, k)
	tell := []byte{byte(frameTell), 1} // target and type inline
	tell = appendString(tell, "/user/sink")
	tell = append(tell, make([]byte, 16)...)
	tell = append(tell, 1)
	tell = appendString(tell, "troupe.test.count")
	var burst []byte
	for i := range idleBurst(k) {
		burst = appendWhole(burst, binary.AppendVarint(tell[:len(tell):len(tell)], int64(i)))
	}
	for range k {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		h := &hello{version: protocolVersion, name: "idle", flags: helloResumable}
		rand.Read(h.uid[:])
		c.Write(appendFrame(nil, func(b []byte) []byte { return appendHello(b, frameHello, h) }))
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if body, err := newFrameReader(c, defaultMaxFrameSize).next(); err != nil || frameKind(body[0]) != frameWelcome {
			t.Fatalf("handshake %d: %v", len(conns), err)
		}
		c.SetReadDeadline(time.Time{})
		go io.Copy(io.Discard, c) // heartbeats
		conns = append(conns, c)
	}
	for _, c := range conns {
		c.Write(burst)
	}
	done := make(chan struct{})
	go func() {
		io.Copy(io.Discard, os.Stdin)
		close(done)
	}()
	fmt.Println("READY")
	beat := appendWhole(nil, appendHeartbeat(nil))
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-done:
			for _, c := range conns {
				c.Close()
			}
			return
		case <-tick.C:
			for _, c := range conns {
				c.Write(beat)
			}
		}
	}
}

// idleActorBudget is what an actor that was never sent anything may cost
// its node: its cell, its path and its entry in the node's table (#33);
// usedActorBudget, one idle again after it handled a message, which also
// holds its mailbox's lanes and their buffers.
const (
	idleActorBudget = 300
	usedActorBudget = 480
)

// TestAnIdleActorIsSmall spawns many actors under the default Config and
// measures the heap each holds while idle: one never sent anything, and
// one that has handled a message.
func TestAnIdleActorIsSmall(t *testing.T) {
	// Not beside other tests: it measures the process's heap, goroutines or
	// allocations, which tests running beside it would change.
	if raceEnabled {
		t.Skip("memory figures under the race detector are not the node's")
	}
	const k = 100000
	n := startNode(t, Config{})
	heap := func() uint64 {
		runtime.GC()
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	var handled atomic.Int64
	all := make(chan struct{})
	beh := Behavior[count]{Receive: func(*Context[count], count) {
		if handled.Add(1) == k {
			close(all)
		}
	}}
	refs := make([]Ref[count], 0, k)
	h0 := heap()
	for range k {
		r, err := Spawn(n, "", beh)
		if err != nil {
			t.Fatal(err)
		}
		refs = append(refs, r)
	}
	fresh := (int64(heap()) - int64(h0)) / k
	h1 := heap()
	g0 := runtime.NumGoroutine()
	for i, r := range refs {
		r.Tell(count{N: i})
	}
	select {
	case <-all:
	case <-time.After(time.Minute):
		t.Fatalf("%d of %d messages handled", handled.Load(), k)
	}
	// The goroutines that ran the actors end once their mailboxes are empty.
	waitFor(t, 30*time.Second, "the actors' goroutines to end", func() bool { return runtime.NumGoroutine() <= g0 })
	used := (int64(heap()) - int64(h1)) / k
	t.Logf("an idle actor holds %d B; one that has handled a message, %d B more", fresh, used)
	if fresh > idleActorBudget {
		t.Fatalf("an idle actor holds %d bytes, more than %d", fresh, idleActorBudget)
	}
	if fresh+used > usedActorBudget {
		t.Fatalf("an actor idle after a message holds %d bytes, more than %d", fresh+used, usedActorBudget)
	}
	runtime.KeepAlive(refs)
}
