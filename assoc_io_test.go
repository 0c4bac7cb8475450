package troupe

import (
	"errors"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// An acknowledgement that arrives after the session ended (the node closed
// while the peer's last ack was in flight) is ignored.
func TestLateAckAfterTheSessionEnded(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	n := startNode(t, testConfig())
	a := newAssoc(n, false, Addr{})
	a.life.state = assocUp
	for range 2 {
		b := a.win.unacked.room(64)
		b = appendWhole(b, appendTellHeader(nil, &tellHeader{target: 1, typ: 1}))
		a.win.unacked.commit(b, true)
	}
	a.rd.onAck([]byte{1})
	a.fail(ErrNodeClosed)
	if err := a.rd.onAck([]byte{2}); err != nil {
		t.Fatalf("late ack: %v", err)
	}
}

func TestEveryMessageIsDeliveredOrDeadLetteredAcrossAPartition(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	p := newPair(t, 20*time.Millisecond, time.Second) // (300 ms ran out in the setup beside two CPU burners)
	const total = 20000
	var mu sync.Mutex
	delivered := make([]int, 0, total)
	dead := map[int]bool{}
	unconfirmed := map[int]bool{}
	Spawn(p.away, "sink", Behavior[count]{Receive: func(_ *Context[count], m count) {
		mu.Lock()
		delivered = append(delivered, m.N)
		mu.Unlock()
	}})
	Subscribe(p.home, func(d DeadLetter) {
		if m, ok := d.Message.(count); ok {
			mu.Lock()
			if dead[m.N] {
				t.Errorf("message %d has two dead letters", m.N)
			}
			dead[m.N] = true
			if d.Unconfirmed {
				unconfirmed[m.N] = true
			}
			mu.Unlock()
		}
	})
	sink, err := Resolve[count](ctxT(t, 5*time.Second), p.home, FormatRef(p.away.Addrs()[0], "/user/sink"))
	if err != nil {
		t.Fatal(err)
	}
	for i := range total / 2 {
		sink.Tell(count{N: i})
	}
	// Cut the network while the first half is still streaming.
	waitFor(t, 10*time.Second, "part of the stream to arrive", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(delivered) >= total/8
	})
	p.f.Partition(p.home, p.away)
	for i := total / 2; i < total; i++ {
		sink.Tell(count{N: i})
	}
	waitFor(t, 10*time.Second, "every message to be accounted for", func() bool {
		mu.Lock()
		defer mu.Unlock()
		seen := map[int]bool{}
		for _, n := range delivered {
			seen[n] = true
		}
		for n := range dead {
			seen[n] = true
		}
		return len(seen) == total
	})
	mu.Lock()
	defer mu.Unlock()
	for i := 1; i < len(delivered); i++ {
		if delivered[i] <= delivered[i-1] {
			t.Fatalf("delivered out of order or twice: %d after %d", delivered[i], delivered[i-1])
		}
	}
	both := 0
	for _, n := range delivered {
		if dead[n] {
			if !unconfirmed[n] {
				t.Fatalf("message %d was delivered and reported as certainly undelivered", n)
			}
			both++
		}
	}
	t.Logf("%d delivered, %d dead letters (%d unconfirmed, %d of those delivered after all)", len(delivered), len(dead), len(unconfirmed), both)
}

// TestTheWindowBoundsWhatIsUnacknowledged: for a peer that reads
// everything and confirms nothing, the writer keeps at most UnackedLimit
// (plus one block of frames) unacknowledged, waits with the rest, and
// the peer is given up on once it has confirmed nothing for
// UnreachableAfter.
func TestTheWindowBoundsWhatIsUnacknowledged(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	slowTest(t)
	cfg := testConfig("tcp://127.0.0.1:0")
	cfg.UnackedLimit = 256 << 10
	victim := startNode(t, cfg)
	unreachable := make(chan PeerUnreachable, 1)
	SubscribeChan(victim, unreachable)
	_, uid := rawPeer(t, victim, true) // reads everything, acknowledges nothing
	var a *assoc
	waitFor(t, 5*time.Second, "the association", func() bool {
		victim.peers.mu.Lock()
		defer victim.peers.mu.Unlock()
		a = victim.peers.byUID[uid]
		return a != nil
	})
	ref := Ref[string]{h: &handle{node: victim, key: refKey{node: a.peer.uid, path: "/user/sink", uuid: UUID{1}}, assoc: a}}
	payload := strings.Repeat("x", 1000)
	start := time.Now()
	for i := 0; ; i++ {
		select {
		case e := <-unreachable:
			if !e.Quarantined || !strings.Contains(e.Reason.Error(), "acknowledged nothing") {
				t.Fatalf("PeerUnreachable = %+v", e)
			}
			return
		default:
		}
		if time.Since(start) > 5*cfg.UnreachableAfter {
			t.Fatalf("%v of sending to a peer that acknowledges nothing, and it is still connected", time.Since(start))
		}
		ref.Tell(payload)
		a.mu.Lock()
		held := a.win.unacked.bytes
		a.mu.Unlock()
		if held > cfg.UnackedLimit+blockSize {
			t.Fatalf("%d bytes kept unacknowledged, the window is %d (plus one block)", held, cfg.UnackedLimit)
		}
		if i%100 == 99 {
			time.Sleep(time.Millisecond) // a steady producer, not a flood
		}
	}
}

func TestSendQueueLimit(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	f := new(FaultNet)
	cfg := failConfig("home", 50*time.Millisecond, 5*time.Second)
	cfg.SendQueueLimit = 100
	home := startOn(t, f, cfg)
	away := startOn(t, f, failConfig("away", 50*time.Millisecond, 5*time.Second))
	sink := spawnEcho(t, away, "sink")
	r, err := Resolve[testPing](ctxT(t, 5*time.Second), home, FormatRef(away.Addrs()[0], sink.Path()))
	if err != nil {
		t.Fatal(err)
	}
	full := make(chan DeadLetter, 10_000)
	SubscribeChan(home, full)
	f.Pause(away) // nothing drains: the writer blocks and the queue fills
	defer f.Resume(away)
	for range 10_000 {
		r.Tell(testPing{})
	}
	d := recv(t, full, "a dead letter for the full queue")
	if !errors.Is(d.Reason, ErrSendQueueFull) {
		t.Fatalf("dead letter %+v, want ErrSendQueueFull", d)
	}
}

// TestABurstHeldCostsAboutItsEncodedSize tells a burst of 1,000,000 small
// messages, with the default send budget, to a node that is paused: none
// is refused, the sender's heap grows by at most twice the encoded bytes
// it holds for the peer (plus a constant), and once the peer resumes all
// arrive, in order.
func TestABurstHeldCostsAboutItsEncodedSize(t *testing.T) {
	// Not beside other tests: it measures the process's heap, goroutines or
	// allocations, which tests running beside it would change.
	if testing.Short() {
		t.Skip("a large burst")
	}
	f := new(FaultNet)
	home := startOn(t, f, failConfig("home", 100*time.Millisecond, 30*time.Second))
	away := startOn(t, f, failConfig("away", 100*time.Millisecond, 30*time.Second))
	const total = 1_000_000
	c := spawnCounting(t, away, "sink", total)
	sink, err := Resolve[count](ctxT(t, 5*time.Second), home, FormatRef(away.Addrs()[0], "/user/sink"))
	if err != nil {
		t.Fatal(err)
	}
	dead := make(chan DeadLetter, 4)
	SubscribeChan(home, dead)
	f.Pause(away)
	heap := func() uint64 {
		var ms runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	before := heap()
	for i := range total {
		sink.Tell(count{N: i})
	}
	grown := int64(heap()) - int64(before)
	held := home.Stats().Peers[0].Held
	const constant = 2 << 20 // a block being filled, pools, the writer's buffers
	t.Logf("held %d bytes (%.1f a message); the heap grew by %d", held, float64(held)/total, grown)
	if held < 5*total || grown > 2*int64(held)+constant {
		t.Fatalf("holding %d encoded bytes grew the heap by %d (at most twice, plus %d)", held, grown, constant)
	}
	f.Resume(away)
	select {
	case <-c.done:
	case <-time.After(60 * time.Second):
		t.Fatalf("%d of %d arrived", c.seen.Load(), total)
	}
	if c.disorder.Load() != 0 {
		t.Fatalf("%d messages out of order", c.disorder.Load())
	}
	select {
	case d := <-dead:
		t.Fatalf("dead letter: %+v", d)
	default:
	}
}

// TestFlatMessagesCostNoAllocations: at steady state, telling a flat
// message (a struct of scalars) to an actor of that type on another node
// allocates nothing on either side. Both nodes are in this process, so
// the count covers the sender, the writer, the reader and the actor.
func TestFlatMessagesCostNoAllocations(t *testing.T) {
	// Not beside other tests: it measures the process's heap, goroutines or
	// allocations, which tests running beside it would change.
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	home := startNode(t, testConfig("tcp://127.0.0.1:0"))
	away := startNode(t, testConfig("tcp://127.0.0.1:0"))
	var seen atomic.Int64
	if _, err := Spawn(away, "sink", Behavior[count]{Receive: func(*Context[count], count) { seen.Add(1) }}); err != nil {
		t.Fatal(err)
	}
	sink, err := Resolve[count](ctxT(t, 5*time.Second), home, FormatRef(away.Addrs()[0], "/user/sink"))
	if err != nil {
		t.Fatal(err)
	}
	const burst = 10_000
	sent := 0
	run := func() {
		for range burst {
			sink.Tell(count{N: sent})
			sent++
		}
		for seen.Load() < int64(sent) {
			runtime.Gosched()
		}
	}
	run() // warm up: tables, blocks, buffers
	perBurst := testing.AllocsPerRun(20, run)
	t.Logf("%.4f allocations a message", perBurst/burst)
	if perMsg := perBurst / burst; perMsg > 0.01 {
		t.Fatalf("%.3f allocations a message (%.0f a burst of %d)", perMsg, perBurst, burst)
	}
}
