package troupe

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// failConfig is the profile for failure tests: quick heartbeats and a
// short window.
func failConfig(name string, interval, window time.Duration) Config {
	cfg := testConfig()
	cfg.Name = name
	cfg.HeartbeatInterval = interval
	cfg.UnreachableAfter = window
	return cfg
}

// startOn starts a node on the fault network for the test.
func startOn(t testing.TB, f *FaultNet, cfg Config) *Node {
	t.Helper()
	checkLeaks(t)
	n, err := f.Start(ctxT(t, 5*time.Second), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}

func TestConfigRejectsShortWindow(t *testing.T) {
	cfg := testConfig()
	cfg.HeartbeatInterval = time.Second
	cfg.UnreachableAfter = 2 * time.Second
	if _, err := Start(ctxT(t, time.Second), cfg); !errors.Is(err, ErrBadConfig) {
		t.Fatalf("Start with a window of 2 intervals = %v, want ErrBadConfig", err)
	}
}

// pair starts two nodes on a fault network, an echo actor on each, and
// resolves each from the other.
type pair struct {
	f                  *FaultNet
	home, away         *Node
	toAway, toHome     Ref[testPing]
	homeEvents, awayEv chan PeerUnreachable
}

func newPair(t *testing.T, interval, window time.Duration) *pair {
	p := &pair{f: NewFaultNet()}
	p.home = startOn(t, p.f, failConfig("home", interval, window))
	p.away = startOn(t, p.f, failConfig("away", interval, window))
	spawnEcho(t, p.home, "echo")
	spawnEcho(t, p.away, "echo")
	p.homeEvents, p.awayEv = make(chan PeerUnreachable, 4), make(chan PeerUnreachable, 4)
	SubscribeChan(p.home.Events(), p.homeEvents)
	SubscribeChan(p.away.Events(), p.awayEv)
	var err error
	ctx := ctxT(t, 5*time.Second)
	if p.toAway, err = Resolve[testPing](ctx, p.home, FormatRef(p.away.Addrs()[0], "/user/echo")); err != nil {
		t.Fatal(err)
	}
	if p.toHome, err = Resolve[testPing](ctx, p.away, FormatRef(p.home.Addrs()[0], "/user/echo")); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestPartitionQuarantinesBothSidesUntilExplicitReconnect(t *testing.T) {
	p := newPair(t, 20*time.Millisecond, 300*time.Millisecond)
	homeSaw := watcher(t, p.home, "mourner", p.toAway)
	awaySaw := watcher(t, p.away, "mourner", p.toHome)
	roundTrip(t, p.home, p.away, "/user/echo")
	roundTrip(t, p.away, p.home, "/user/echo")

	p.f.Partition(p.home, p.away)
	for _, c := range []struct {
		node   string
		term   chan Terminated
		events chan PeerUnreachable
		peer   *Node
	}{{"home", homeSaw, p.homeEvents, p.away}, {"away", awaySaw, p.awayEv, p.home}} {
		ev := recv(t, c.events, c.node+" PeerUnreachable")
		if !ev.Quarantined || ev.UID != c.peer.UID() || ev.Name != c.peer.Name() || !errors.Is(ev.Reason, ErrPeerUnreachable) {
			t.Errorf("%s: PeerUnreachable = %+v", c.node, ev)
		}
		term := recv(t, c.term, c.node+" Terminated")
		if !errors.Is(term.Reason, ErrPeerUnreachable) || errors.Is(term.Reason, ErrPeerLeft) {
			t.Errorf("%s: Terminated reason = %v, want ErrPeerUnreachable", c.node, term.Reason)
		}
	}
	// Both still serve their own callers.
	for _, n := range []*Node{p.home, p.away} {
		local, _ := Resolve[testPing](ctxT(t, time.Second), n, FormatRef(n.Addrs()[0], "/user/echo"))
		if _, err := Ask(ctxT(t, 5*time.Second), local, func(r Ref[testPong]) testPing { return testPing{ReplyTo: r} }); err != nil {
			t.Fatalf("%s cannot serve itself during the partition: %v", n.Name(), err)
		}
	}

	// Healing repairs nothing: no association comes back on its own.
	connected := make(chan PeerConnected, 4)
	SubscribeChan(p.home.Events(), connected)
	SubscribeChan(p.away.Events(), connected)
	p.f.Heal()
	time.Sleep(3 * 300 * time.Millisecond) // three windows with nothing happening is the assertion
	select {
	case ev := <-connected:
		t.Fatalf("an association came back by itself after the heal: %+v", ev)
	default:
	}
	if _, err := Resolve[testPing](ctxT(t, time.Second), p.home, FormatRef(p.away.Addrs()[0], "/user/echo")); !errors.Is(err, ErrQuarantined) {
		t.Fatalf("Resolve to a quarantined peer = %v, want ErrQuarantined", err)
	}

	// Only an explicit repair works, and old refs stay dead.
	if !p.away.ClearQuarantine(p.home.Addrs()[0].String()) {
		t.Fatal("away had no quarantine of home to clear")
	}
	if err := p.home.Reconnect(ctxT(t, 5*time.Second), p.away.Addrs()[0].String()); err != nil {
		t.Fatalf("Reconnect: %v", err)
	}
	roundTrip(t, p.home, p.away, "/user/echo")
	dead := make(chan DeadLetter, 1)
	SubscribeChan(p.home.Events(), dead)
	p.toAway.Tell(testPing{})
	if dl := recv(t, dead, "dead letter through an old ref"); !errors.Is(dl.Reason, ErrSessionEnded) {
		t.Fatalf("old ref after reconnect: dead letter reason %v, want ErrSessionEnded", dl.Reason)
	}
}

func TestReconnectRefusedWhilePeerQuarantinesUs(t *testing.T) {
	p := newPair(t, 20*time.Millisecond, 300*time.Millisecond)
	p.f.Partition(p.home, p.away)
	recv(t, p.homeEvents, "home gives up")
	recv(t, p.awayEv, "away gives up")
	p.f.Heal()
	err := p.home.Reconnect(ctxT(t, 5*time.Second), p.away.Addrs()[0].String())
	if !errors.Is(err, ErrQuarantinedByPeer) {
		t.Fatalf("Reconnect while away still quarantines home = %v, want ErrQuarantinedByPeer", err)
	}
	// The refused attempt left home's own quarantine cleared; away's stands.
	if len(p.away.Quarantined()) != 1 || len(p.home.Quarantined()) != 0 {
		t.Fatalf("quarantines: away %v, home %v", p.away.Quarantined(), p.home.Quarantined())
	}
	p.away.ClearQuarantine(p.home.Addrs()[0].String())
	if err := p.home.Reconnect(ctxT(t, 5*time.Second), p.away.Addrs()[0].String()); err != nil {
		t.Fatalf("Reconnect after away cleared: %v", err)
	}
	roundTrip(t, p.home, p.away, "/user/echo")
	roundTrip(t, p.away, p.home, "/user/echo")
}

func TestDetectionTimeBounds(t *testing.T) {
	const interval, window = 50 * time.Millisecond, 500 * time.Millisecond
	p := newPair(t, interval, window)
	p.home.pmu.Lock()
	a := p.home.byUID[p.away.UID()]
	p.home.pmu.Unlock()
	detected := make(chan time.Time, 1)
	Subscribe(p.home.Events(), func(PeerUnreachable) { detected <- time.Now() })
	p.f.Kill(p.away)
	at := recv(t, detected, "detection")
	last := p.home.epoch.Add(time.Duration(a.in.heard.Load()))
	silent := at.Sub(last)
	if silent < window {
		t.Errorf("declared unreachable %v after the last frame, sooner than the window %v", silent, window)
	}
	if limit := window + interval + time.Second; silent > limit {
		t.Errorf("declared unreachable %v after the last frame, later than %v", silent, limit)
	}
	t.Logf("detected %v after the last frame (window %v, interval %v)", silent, window, interval)
}

type bulk struct {
	Seq  int
	Data []byte
}

func init() { RegisterMessage[bulk]("troupe.test.bulk") }

func TestNoFalsePositiveUnderHeavyLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("streams for several windows")
	}
	const interval, window = 100 * time.Millisecond, time.Second // the default ratio
	cfg := func(name string) Config {
		c := failConfig(name, interval, window)
		c.Listen = []string{"tcp://127.0.0.1:0"}
		return c
	}
	a, b := startNode(t, cfg("a")), startNode(t, cfg("b"))
	var events atomic.Int64
	for _, n := range []*Node{a, b} {
		Subscribe(n.Events(), func(PeerUnreachable) { events.Add(1) })
		Spawn(n, "sink", Behavior[bulk]{Receive: func(*Context[bulk], bulk) {}})
		spawnEcho(t, n, "echo")
	}
	payload := make([]byte, 64<<10)
	deadline := time.Now().Add(4 * window)
	var wg sync.WaitGroup
	var sent atomic.Int64
	for _, dir := range [][2]*Node{{a, b}, {b, a}} {
		from, to := dir[0], dir[1]
		ctx := ctxT(t, 30*time.Second)
		sink, err := Resolve[bulk](ctx, from, FormatRef(to.Addrs()[0], "/user/sink"))
		if err != nil {
			t.Fatal(err)
		}
		echo, err := Resolve[testPing](ctx, from, FormatRef(to.Addrs()[0], "/user/echo"))
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			for seq := 0; time.Now().Before(deadline); seq++ {
				sink.Tell(bulk{Seq: seq, Data: payload})
				sent.Add(1)
				if seq%32 == 31 { // keep the link full without an unbounded queue
					if _, err := Ask(ctx, echo, func(r Ref[testPong]) testPing { return testPing{ReplyTo: r} }); err != nil {
						t.Errorf("Ask during the stream: %v", err)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	if n := events.Load(); n != 0 {
		t.Fatalf("%d PeerUnreachable events on a busy but healthy link", n)
	}
	t.Logf("streamed %d messages of 64 KiB (%d MiB) in %v", sent.Load(), sent.Load()/16, 4*window)
}

func TestEveryMessageToAQuarantinedPeerIsOneDeadLetter(t *testing.T) {
	p := newPair(t, 20*time.Millisecond, 300*time.Millisecond)
	var mu sync.Mutex
	counted := map[int]int{}
	Subscribe(p.home.Events(), func(d DeadLetter) {
		if m, ok := d.Message.(testPing); ok && errors.Is(d.Reason, ErrQuarantined) {
			mu.Lock()
			counted[m.N]++
			mu.Unlock()
		}
	})
	sink, _ := spawnCollector[testPong](t, p.home, "sink", 1)
	p.f.Partition(p.home, p.away)
	// Sent while the partition is not yet detected: held by the network.
	for i := range 100 {
		p.toAway.Tell(testPing{N: i, ReplyTo: sink})
	}
	recv(t, p.homeEvents, "home gives up")
	// Sent to a quarantined peer.
	for i := 100; i < 200; i++ {
		p.toAway.Tell(testPing{N: i, ReplyTo: sink})
	}
	// The network never delivered any of them, so each must come back as
	// exactly one dead letter: those queued or stuck in a blocked write when
	// the quarantine hit, and those refused after it.
	waitFor(t, 5*time.Second, "a dead letter for each of 200 messages", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(counted) == 200
	})
	mu.Lock()
	defer mu.Unlock()
	for i := range 200 {
		if counted[i] != 1 {
			t.Fatalf("message %d has %d dead letters, want exactly 1", i, counted[i])
		}
	}
}

func TestPendingAskFailsAtOnceOnQuarantine(t *testing.T) {
	p := newPair(t, 20*time.Millisecond, 300*time.Millisecond)
	Spawn(p.away, "mute", Behavior[testPing]{Receive: func(*Context[testPing], testPing) {}})
	mute, err := Resolve[testPing](ctxT(t, 5*time.Second), p.home, FormatRef(p.away.Addrs()[0], "/user/mute"))
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		_, err := Ask(context.Background(), mute, func(r Ref[testPong]) testPing { return testPing{ReplyTo: r} })
		errc <- err
	}()
	p.f.Partition(p.home, p.away)
	if err := recv(t, errc, "the Ask to fail"); !errors.Is(err, ErrQuarantined) {
		t.Fatalf("Ask = %v, want ErrQuarantined", err)
	}
}

func TestKilledPeerOverLoopbackAfterClose(t *testing.T) {
	// Over plain loopback, a peer that closes says goodbye: the link ends,
	// nothing is quarantined, and resolving again works once it is back.
	a := startNode(t, testConfig("tcp://127.0.0.1:0"))
	b := startNode(t, testConfig("tcp://127.0.0.1:0"))
	spawnEcho(t, b, "echo")
	events := make(chan PeerUnreachable, 1)
	SubscribeChan(a.Events(), events)
	roundTrip(t, a, b, "/user/echo")
	b.Close()
	if ev := recv(t, events, "PeerUnreachable"); ev.Quarantined || !errors.Is(ev.Reason, ErrPeerLeft) {
		t.Fatalf("graceful close reported as %+v", ev)
	}
	if q := a.Quarantined(); len(q) != 0 {
		t.Fatalf("a graceful close quarantined %v", q)
	}
}

func TestEveryMessageIsDeliveredOrDeadLetteredAcrossAPartition(t *testing.T) {
	p := newPair(t, 20*time.Millisecond, 300*time.Millisecond)
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
	Subscribe(p.home.Events(), func(d DeadLetter) {
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

// An acknowledgement that arrives after the session ended (the node closed
// while the peer's last ack was in flight) is ignored.
func TestLateAckAfterTheSessionEnded(t *testing.T) {
	n := startNode(t, testConfig())
	a := newAssoc(n, false, Addr{})
	a.state = assocUp
	a.unacked = []inflightMsg{{h: &handle{node: n}, msg: count{}}, {h: &handle{node: n}, msg: count{}}}
	a.onAck([]byte{1})
	a.fail(ErrNodeClosed)
	if err := a.onAck([]byte{2}); err != nil {
		t.Fatalf("late ack: %v", err)
	}
}
