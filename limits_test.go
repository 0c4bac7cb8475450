package troupe

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// healthyTraffic keeps a round trip going from a to b's echo actor until
// stop is closed, and returns how many round trips completed.
func healthyTraffic(t *testing.T, a, b *Node, stop <-chan struct{}) func() int64 {
	echo, err := Resolve[testPing](ctxT(t, 5*time.Second), a, FormatRef(b.Addrs()[0], "/user/echo"))
	if err != nil {
		t.Fatal(err)
	}
	var n atomic.Int64
	var failed atomic.Value
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			_, err := Ask(ctx, echo, func(r Ref[testPong]) testPing { return testPing{ReplyTo: r} })
			cancel()
			if err != nil {
				failed.Store(err)
				return
			}
			n.Add(1)
		}
	})
	return func() int64 {
		wg.Wait()
		if err, _ := failed.Load().(error); err != nil {
			t.Fatalf("the healthy pair's traffic failed during the attack: %v", err)
		}
		return n.Load()
	}
}

func troupeGoroutines() int {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	return strings.Count(string(buf), "troupe.(*Node).serveInbound")
}

// soak makes TestAttacksDoNotDisturbHealthyPeers repeat each attack for
// this long (CI runs it for a few seconds each).
var soak = flag.Duration("troupe.soak", 0, "repeat each attack of TestAttacksDoNotDisturbHealthyPeers for this long")

func TestAttacksDoNotDisturbHealthyPeers(t *testing.T) {
	// Not beside other tests: it measures the process's heap, goroutines or
	// allocations, which tests running beside it would change.
	slowTest(t)
	if testing.Short() {
		t.Skip("runs each attack for about a second")
	}
	cfg := testConfig("tcp://127.0.0.1:0")
	cfg.HandshakeTimeout = 500 * time.Millisecond
	cfg.MaxPendingHandshakes = 32
	victim := startNode(t, cfg)
	spawnEcho(t, victim, "echo")
	friend := startNode(t, testConfig())
	addr := victim.Addrs()[0].Address()

	dial := func() net.Conn {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			return nil
		}
		return c
	}
	attacks := []struct {
		name string
		run  func(stop <-chan struct{}) // returns when the attack is over
	}{
		{"slow loris", func(stop <-chan struct{}) {
			var wg sync.WaitGroup
			for range 20 {
				wg.Go(func() {
					c := dial()
					if c == nil {
						return
					}
					defer c.Close()
					start := time.Now()
					for _, b := range appendFrame(nil, func(b []byte) []byte {
						return appendHello(b, frameHello, &hello{version: protocolVersion, name: "loris"})
					}) {
						if _, err := c.Write([]byte{b}); err != nil {
							break
						}
						time.Sleep(100 * time.Millisecond)
					}
					c.SetReadDeadline(time.Now().Add(5 * time.Second))
					c.Read(make([]byte, 1))
					if took := time.Since(start); took > 3*time.Second {
						t.Errorf("a slow-loris connection lived %v, the handshake limit is 500ms", took)
					}
				})
			}
			wg.Wait()
		}},
		{"connection flood", func(stop <-chan struct{}) {
			var conns []net.Conn
			peak := 0
			for range 300 {
				if c := dial(); c != nil {
					conns = append(conns, c)
				}
				peak = max(peak, troupeGoroutines())
			}
			time.Sleep(200 * time.Millisecond)
			peak = max(peak, troupeGoroutines())
			for _, c := range conns {
				c.Close()
			}
			if peak > 32+4 {
				t.Errorf("%d handshake goroutines during a flood, the limit is 32", peak)
			}
		}},
		{"garbage", func(stop <-chan struct{}) {
			for range 50 {
				if c := dial(); c != nil {
					junk := make([]byte, 4096)
					rand.Read(junk)
					c.Write(junk)
					c.Close()
				}
			}
		}},
		{"oversized length", func(stop <-chan struct{}) {
			for range 50 {
				c := rawHandshake(t, victim)
				c.Write([]byte{0xff, 0xff, 0xff, 0xff, 0x0f})
				expectClosed(t, c)
			}
		}},
		{"claimed lengths with a trickle", func(stop <-chan struct{}) {
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			var conns []net.Conn
			for range 50 {
				c := rawHandshake(t, victim)
				c.Write(append(binary.AppendUvarint(nil, defaultMaxFrameSize-1), byte(frameTell), 1, 2, 3))
				conns = append(conns, c)
			}
			for _, c := range conns { // a byte each, then nothing
				c.Write([]byte{4})
			}
			runtime.GC()
			runtime.ReadMemStats(&after)
			if grown := int64(after.HeapAlloc) - int64(before.HeapAlloc); grown > 32<<20 {
				t.Errorf("the heap grew by %d MB for 50 claims of 4 MiB with 4 bytes each", grown>>20)
			}
			for _, c := range conns {
				c.Close()
			}
		}},
		{"table flood", func(stop <-chan struct{}) {
			c := rawHandshake(t, victim)
			var batch []byte
			for id := 1; id <= maxTableSize+1; id++ {
				body := []byte{byte(frameTell)}
				body = binary.AppendUvarint(body, uint64(id)<<1|1)
				body = appendString(body, fmt.Sprintf("/user/flood-%d", id))
				body = append(body, make([]byte, 16)...)
				body = append(body, 0<<1|1)
				body = appendString(body, "no.such.key")
				batch = append(batch, appendFrame(nil, func(b []byte) []byte { return append(b, body...) })...)
			}
			c.Write(batch)
			expectClosed(t, c)
		}},
		{"refs to a thousand nodes", func(stop <-chan struct{}) {
			attacker := startNode(t, testConfig())
			sink, err := Spawn(victim, "bag-"+attacker.UID().String()[:8], Behavior[refBag]{Receive: func(*Context[refBag], refBag) {}})
			if err != nil {
				t.Fatal(err)
			}
			defer victim.Stop(sink)
			var bag refBag
			for i := range 1000 {
				a, err := attacker.peers.assocAt(tcpAddr(fmt.Sprintf("127.0.0.1:%d", 30000+i)), false, NodeUID{})
				if err != nil {
					t.Fatal(err)
				}
				bag.Refs = append(bag.Refs, Ref[int]{h: &handle{node: attacker, key: refKey{node: NodeUID{byte(i), byte(i >> 8), 1}, path: "/user/x"}, assoc: a}})
			}
			r, err := Resolve[refBag](ctxT(t, 5*time.Second), attacker, FormatRef(victim.Addrs()[0], sink.Path()))
			if err != nil {
				t.Fatal(err)
			}
			before := troupeGoroutines()
			r.Tell(bag)
			r.Tell(bag)
			if _, err := Resolve[testPing](ctxT(t, 5*time.Second), attacker, FormatRef(victim.Addrs()[0], "/user/echo")); err != nil {
				t.Fatal(err)
			}
			if grown := troupeGoroutines() - before; grown > 20 {
				t.Errorf("%d more goroutines after refs to 1000 nodes arrived", grown)
			}
			attacker.Close()
		}},
		{"frames for a missing actor", func(stop <-chan struct{}) {
			c := rawHandshake(t, victim)
			dead := make(chan DeadLetter, 1000)
			sub := SubscribeChan(victim, dead)
			defer sub.Unsubscribe()
			for range 1000 {
				c.Write(ghostTell())
			}
			// Each is a dead letter; none closes the connection.
			for i := range 1000 {
				recv(t, dead, fmt.Sprintf("dead letter %d", i))
			}
		}},
	}
	for _, at := range attacks {
		t.Run(strings.ReplaceAll(at.name, " ", "_"), func(t *testing.T) {
			stop := make(chan struct{})
			done := healthyTraffic(t, friend, victim, stop)
			before := time.Now()
			for rounds := 0; rounds == 0 || time.Since(before) < *soak; rounds++ {
				at.run(stop)
			}
			time.Sleep(100 * time.Millisecond) // let the healthy pair run past the end of the attack
			close(stop)
			if n := done(); n == 0 {
				t.Fatalf("no round trip completed during the attack (%v)", time.Since(before))
			}
		})
	}
	waitFor(t, 5*time.Second, "every attack connection to be gone", func() bool { return victim.inbound.handshaking.Load() == 0 && victim.inbound.open.Load() <= 2 })
}

// TestOneSourceCannotTakeEveryHandshake: a source holding every pending
// handshake it may (a quarter of them) leaves room for peers elsewhere.
func TestOneSourceCannotTakeEveryHandshake(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	cfg := testConfig("tcp://0.0.0.0:0")
	cfg.HandshakeTimeout = 30 * time.Second // the flood would hold its slots
	cfg.MaxPendingHandshakes = 16
	victim := startNode(t, cfg)
	spawnEcho(t, victim, "echo")
	_, port, _ := net.SplitHostPort(victim.Addrs()[0].Address())
	// The attacker dials from 127.0.0.2 and never says a word.
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}}
	var held []net.Conn
	t.Cleanup(func() {
		for _, c := range held {
			c.Close()
		}
	})
	for range 40 {
		c, err := d.Dial("tcp", "127.0.0.1:"+port)
		if err != nil {
			t.Skipf("cannot dial from 127.0.0.2 here: %v", err)
		}
		held = append(held, c)
	}
	waitFor(t, 5*time.Second, "the flood to be admitted or refused", func() bool {
		victim.inbound.mu.Lock()
		defer victim.inbound.mu.Unlock()
		return victim.inbound.bySource["127.0.0.2"] == cfg.MaxPendingHandshakes/4
	})
	// Peers from another source still get in, several of them.
	for i := range 8 {
		peer := startNode(t, testConfig())
		if _, err := Resolve[testPing](ctxT(t, 5*time.Second), peer, FormatRef(tcpAddr("127.0.0.1:"+port), "/user/echo")); err != nil {
			t.Fatalf("peer %d during the flood: %v", i, err)
		}
	}
}

// TestMailboxBytesBoundWireMessages: large messages from another node
// stop at MailboxBytes, long before MailboxLimit counts them.
func TestMailboxBytesBoundWireMessages(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	cfg := testConfig("tcp://127.0.0.1:0")
	cfg.MailboxBytes = 1 << 20
	home := startNode(t, cfg)
	gate := make(chan struct{})
	release := sync.OnceFunc(func() { close(gate) })
	t.Cleanup(release)
	sink, _ := Spawn(home, "sink", Behavior[string]{Receive: func(*Context[string], string) { <-gate }})
	full := make(chan DeadLetter, 1000)
	SubscribeChan(home, full)
	away := startNode(t, testConfig())
	r, err := Resolve[string](ctxT(t, 5*time.Second), away, FormatRef(home.Addrs()[0], sink.Path()))
	if err != nil {
		t.Fatal(err)
	}
	big := strings.Repeat("x", 16<<10)
	for range 200 { // 3.2 MB, 200 messages: far below MailboxLimit
		r.Tell(big)
	}
	d := recv(t, full, "a dead letter for the full mailbox")
	if !errors.Is(d.Reason, ErrMailboxFull) || !strings.Contains(d.Reason.Error(), "MailboxBytes") {
		t.Fatalf("dead letter %+v", d)
	}
	c := home.actors.get(sink.Path(), UUID{}).local.(*cell[string])
	c.mu.Lock()
	held := c.q.inBytes
	c.mu.Unlock()
	if held > cfg.MailboxBytes {
		t.Fatalf("%d bytes waiting, the limit is %d", held, cfg.MailboxBytes)
	}
	release()
}

func TestMaxInboundConns(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	cfg := testConfig("tcp://127.0.0.1:0")
	cfg.MaxInboundConns = 3
	n := startNode(t, cfg)
	spawnEcho(t, n, "echo")
	var peers []*Node
	for i := range 3 {
		p := startNode(t, testConfig())
		if _, err := Resolve[testPing](ctxT(t, 5*time.Second), p, FormatRef(n.Addrs()[0], "/user/echo")); err != nil {
			t.Fatalf("peer %d within the limit: %v", i, err)
		}
		peers = append(peers, p)
	}
	extra := startNode(t, testConfig())
	if _, err := Resolve[testPing](ctxT(t, 5*time.Second), extra, FormatRef(n.Addrs()[0], "/user/echo")); err == nil {
		t.Fatal("a fourth inbound connection was accepted with MaxInboundConns 3")
	}
	peers[0].Close()
	waitFor(t, 5*time.Second, "room for another peer", func() bool {
		_, err := Resolve[testPing](ctxT(t, 5*time.Second), extra, FormatRef(n.Addrs()[0], "/user/echo"))
		return err == nil
	})
}

func TestRegistryTimeout(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	addr, _ := silentListener(t)
	cfg := testConfig()
	cfg.RegistryTimeout = 300 * time.Millisecond
	cfg.HandshakeTimeout = time.Minute
	n := startNode(t, cfg)
	start := time.Now()
	_, err := n.QueryActor(context.Background(), "x", WithRegistries("tcp://"+addr))
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 5*time.Second {
		t.Fatalf("a lookup at a registrar that never answers: %v after %v", err, time.Since(start))
	}
}
