package troupe

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

type testPing struct {
	N       int
	ReplyTo Ref[testPong]
}

type testPong struct {
	N    int
	From string
}

func init() {
	SetWireKey[testPing]("troupe.test.ping")
	SetWireKey[testPong]("troupe.test.pong")
}

// spawnEcho spawns an actor that answers each ping with a pong.
func spawnEcho(t testing.TB, n *Node, name string) Ref[testPing] {
	t.Helper()
	r, err := Spawn(n, name, Behavior[testPing]{Receive: func(c *Context[testPing], m testPing) {
		// A ping without a ReplyTo gets no answer: a reply to the zero
		// Ref is a dead letter on every node of the process, where the
		// tests beside this one would see it.
		if !m.ReplyTo.IsZero() {
			m.ReplyTo.Tell(testPong{N: m.N, From: c.Node().Name()})
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// spawnCollector spawns an actor that forwards what it receives to a channel.
func spawnCollector[T any](t testing.TB, n *Node, name string, size int) (Ref[T], chan T) {
	t.Helper()
	ch := make(chan T, size)
	r, err := Spawn(n, name, Behavior[T]{Receive: func(_ *Context[T], m T) { ch <- m }})
	if err != nil {
		t.Fatal(err)
	}
	return r, ch
}

// counting is a sink that counts numbered messages, expecting 0, 1, 2, …
// in that order.
type counting struct {
	seen, disorder atomic.Int64
	done           chan struct{} // closed at the total
}

// spawnCounting spawns a counting sink at /user/name that closes done
// once it has taken total messages.
func spawnCounting(t testing.TB, n *Node, name string, total int64) *counting {
	t.Helper()
	c := &counting{done: make(chan struct{})}
	if _, err := Spawn(n, name, Behavior[count]{Receive: func(_ *Context[count], m count) {
		if int64(m.N) != c.seen.Load() {
			c.disorder.Add(1)
		}
		if c.seen.Add(1) == total {
			close(c.done)
		}
	}}); err != nil {
		t.Fatal(err)
	}
	return c
}

func TestRemoteAskAndOrderedTell(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	forEachTransport(t, func(t *testing.T, listen func(testing.TB) string) {
		a := startNode(t, testConfig(listen(t)))
		b := startNode(t, testConfig(listen(t)))
		spawnEcho(t, b, "echo")

		echo, err := Resolve[testPing](ctxT(t, 5*time.Second), a, FormatRef(b.Addrs()[0], "/user/echo"))
		if err != nil {
			t.Fatalf("Resolve: %v", err)
		}
		if echo.IsLocal() || echo.NodeUID() != b.UID() {
			t.Fatalf("resolved ref = %v (local %v), want a remote ref to %v", echo, echo.IsLocal(), b.UID())
		}
		pong, err := Ask(ctxT(t, 5*time.Second), echo, func(r Ref[testPong]) testPing { return testPing{N: 7, ReplyTo: r} })
		if err != nil {
			t.Fatalf("Ask: %v", err)
		}
		if pong.N != 7 || pong.From != b.Name() {
			t.Fatalf("Ask reply = %+v, want N=7 from %s", pong, b.Name())
		}

		sink, got := spawnCollector[testPong](t, a, "sink", 2000)
		const count = 2000
		for i := range count {
			echo.Tell(testPing{N: i, ReplyTo: sink})
		}
		for i := range count {
			if p := recv(t, got, "pong"); p.N != i {
				t.Fatalf("pong %d has N=%d: messages arrived out of order", i, p.N)
			}
		}
	})
}

func TestResolveErrors(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	forEachTransport(t, func(t *testing.T, listen func(testing.TB) string) {
		a := startNode(t, testConfig(listen(t)))
		b := startNode(t, testConfig(listen(t)))
		spawnEcho(t, b, "echo")
		ctx := ctxT(t, 5*time.Second)
		if _, err := Resolve[testPing](ctx, a, FormatRef(b.Addrs()[0], "/user/nobody")); !errors.Is(err, ErrNoSuchActor) {
			t.Errorf("Resolve of a missing actor: err = %v, want ErrNoSuchActor", err)
		}
		if _, err := Resolve[testPong](ctx, a, FormatRef(b.Addrs()[0], "/user/echo")); !errors.Is(err, ErrWrongType) {
			t.Errorf("Resolve with the wrong protocol: err = %v, want ErrWrongType", err)
		}
		if _, err := Resolve[testPing](ctx, a, "troupe://127.0.0.1:1/user/echo"); err == nil {
			t.Errorf("Resolve of an address nobody listens on succeeded")
		}
	})
}

func TestRemoteWatch(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	forEachTransport(t, func(t *testing.T, listen func(testing.TB) string) {
		a := startNode(t, testConfig(listen(t)))
		b := startNode(t, testConfig(listen(t)))
		ctx := ctxT(t, 5*time.Second)
		worker, _ := Spawn(b, "worker", Behavior[count]{Receive: func(c *Context[count], m count) {
			if m.N < 0 {
				panic("negative")
			}
			c.Stop()
		}})
		spawnEcho(t, b, "other")
		remote, err := Resolve[count](ctx, a, FormatRef(b.Addrs()[0], "/user/worker"))
		if err != nil {
			t.Fatal(err)
		}
		got := watcher(t, a, "w", remote)
		roundTrip(t, a, b, "/user/other")
		worker.Tell(count{N: -1})
		term := recv(t, got, "remote Terminated")
		var re *remoteError
		if !errors.As(term.Reason, &re) || re.Text != "troupe: actor panicked: negative" || !re.Failed || !IsFailure(term.Reason) {
			t.Fatalf("remote stop reason = %#v, want the panic's text, marked as a failure", term.Reason)
		}
		if term.Ref.Path() != "/user/worker" {
			t.Fatalf("Terminated.Ref = %v", term.Ref)
		}
		select {
		case extra := <-got:
			t.Fatalf("second Terminated: %+v", extra)
		case <-time.After(50 * time.Millisecond):
		}
		// Watching a remote actor that no longer exists terminates at once,
		// with the reason it stopped for (its node keeps the reasons of its
		// last stops for such late watchers).
		late := watcher(t, a, "late", remote)
		if term := recv(t, late, "late Terminated"); !errors.As(term.Reason, &re) || re.Text != "troupe: actor panicked: negative" || !IsFailure(term.Reason) {
			t.Fatalf("late remote watch reason = %v, want the panic's text", term.Reason)
		}
		// One never seen there: ErrNoSuchActor.
		ghost := Ref[count]{h: &handle{node: a, key: refKey{node: remote.h.key.node, path: "/user/never", uuid: UUID{9}}, assoc: remote.h.assoc}}
		if term := recv(t, watcher(t, a, "ghost", ghost), "a never-seen actor's Terminated"); !errors.Is(term.Reason, ErrNoSuchActor) {
			t.Fatalf("watch of an actor never there = %v, want ErrNoSuchActor", term.Reason)
		}
	})
}

// roundTrip asks the echo actor at path on b from a, so that every frame a
// sent b before it has been handled by b's reader.
func roundTrip(t testing.TB, a, b *Node, path string) {
	t.Helper()
	ctx := ctxT(t, 5*time.Second)
	echo, err := Resolve[testPing](ctx, a, FormatRef(b.Addrs()[0], path))
	if err == nil {
		_, err = Ask(ctx, echo, func(r Ref[testPong]) testPing { return testPing{ReplyTo: r} })
	}
	if err != nil {
		t.Fatalf("round trip to %s: %v", path, err)
	}
}

func TestPeerCloseTerminatesWatchersWithPeerLeft(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	forEachTransport(t, func(t *testing.T, listen func(testing.TB) string) {
		a := startNode(t, testConfig(listen(t)))
		b := startNode(t, testConfig(listen(t)))
		spawnEcho(t, b, "echo")
		remote, err := Resolve[testPing](ctxT(t, 5*time.Second), a, FormatRef(b.Addrs()[0], "/user/echo"))
		if err != nil {
			t.Fatal(err)
		}
		gone := make(chan PeerUnreachable, 1)
		SubscribeChan(a, gone)
		dead := make(chan DeadLetter, 4)
		SubscribeChan(a, dead)
		got := watcher(t, a, "w", remote)
		if err := b.Close(); err != nil {
			t.Fatal(err)
		}
		if term := recv(t, got, "Terminated"); !errors.Is(term.Reason, ErrPeerLeft) {
			t.Fatalf("reason = %v, want ErrPeerLeft", term.Reason)
		}
		if ev := recv(t, gone, "PeerUnreachable"); ev.UID != b.UID() || ev.Quarantined || !errors.Is(ev.Reason, ErrPeerLeft) {
			t.Fatalf("PeerUnreachable = %+v, want an unquarantined goodbye", ev)
		}
		remote.Tell(testPing{N: 1})
		if dl := recv(t, dead, "dead letter"); !errors.Is(dl.Reason, ErrSessionEnded) || !errors.Is(dl.Reason, ErrPeerLeft) {
			t.Fatalf("dead letter reason = %v, want ErrSessionEnded and ErrPeerLeft", dl.Reason)
		}
	})
}

type coordMsg interface{ isCoord() }
type assign struct{ N int }
type done struct{ N int }

func (assign) isCoord() {}
func (done) isCoord()   {}

type job struct {
	N       int
	ReplyTo Ref[done]
}

func init() {
	SetWireKey[job]("troupe.test.job")
	SetWireKey[done]("troupe.test.done")
}

func TestAdapterRefAcrossTheWire(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	forEachTransport(t, func(t *testing.T, listen func(testing.TB) string) {
		a := startNode(t, testConfig(listen(t)))
		b := startNode(t, testConfig(listen(t)))
		Spawn(b, "worker", Behavior[job]{Receive: func(_ *Context[job], j job) { j.ReplyTo.Tell(done{N: j.N * 10}) }})
		worker, err := Resolve[job](ctxT(t, 5*time.Second), a, FormatRef(b.Addrs()[0], "/user/worker"))
		if err != nil {
			t.Fatal(err)
		}
		results := make(chan int, 1)
		boss, _ := Spawn(a, "boss", Behavior[coordMsg]{
			Receive: func(c *Context[coordMsg], m coordMsg) {
				switch m := m.(type) {
				case assign:
					worker.Tell(job{N: m.N, ReplyTo: MessageAdapter(c, func(d done) coordMsg { return d })})
				case done:
					results <- m.N
				}
			},
		})
		boss.Tell(assign{N: 4})
		if got := recv(t, results, "result"); got != 40 {
			t.Fatalf("result = %d, want 40", got)
		}
	})
}

func TestPendingAskFailsWhenPeerLeaves(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	a := startNode(t, testConfig("tcp://127.0.0.1:0"))
	b := startNode(t, testConfig("tcp://127.0.0.1:0"))
	asked := make(chan struct{})
	Spawn(b, "mute", Behavior[testPing]{Receive: func(*Context[testPing], testPing) { close(asked) }})
	mute, err := Resolve[testPing](ctxT(t, 5*time.Second), a, FormatRef(b.Addrs()[0], "/user/mute"))
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		_, err := Ask(context.Background(), mute, func(r Ref[testPong]) testPing { return testPing{ReplyTo: r} })
		errc <- err
	}()
	<-asked
	b.Close()
	if err := recv(t, errc, "Ask to fail"); !errors.Is(err, ErrPeerLeft) {
		t.Fatalf("Ask = %v, want ErrPeerLeft", err)
	}
}

func TestAskWithUnregisteredReplyTypeFailsFast(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	a := startNode(t, testConfig("tcp://127.0.0.1:0"))
	b := startNode(t, testConfig("tcp://127.0.0.1:0"))
	type private struct{ N int }
	type req struct{ ReplyTo Ref[private] }
	Spawn(b, "x", Behavior[testPing]{Receive: func(*Context[testPing], testPing) {}})
	r, err := Resolve[testPing](ctxT(t, 5*time.Second), a, FormatRef(b.Addrs()[0], "/user/x"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = Ask(ctxT(t, 5*time.Second), r, func(Ref[private]) testPing { return testPing{} })
	if !errors.Is(err, ErrNoWireKey) {
		t.Fatalf("Ask with an unregistered reply type = %v, want ErrNoWireKey at once", err)
	}
}

func init() { SetWireKey[Ref[testPong]]("troupe.test.pong-ref") }

func TestWatchARemoteAdapterRef(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	a := startNode(t, testConfig("tcp://127.0.0.1:0"))
	b := startNode(t, testConfig("tcp://127.0.0.1:0"))
	spawnEcho(t, b, "echo")
	_, inbox := spawnCollector[Ref[testPong]](t, a, "inbox", 1)
	toInbox, err := Resolve[Ref[testPong]](ctxT(t, 5*time.Second), b, FormatRef(a.Addrs()[0], "/user/inbox"))
	if err != nil {
		t.Fatal(err)
	}
	owner, _ := Spawn(b, "owner", Behavior[count]{
		Setup: func(c *Context[count]) {
			toInbox.Tell(MessageAdapter(c, func(p testPong) count { return count{N: p.N} }))
		},
		Receive: func(c *Context[count], _ count) { c.Stop() },
	})
	adapter := recv(t, inbox, "the adapter ref")
	got := watcher(t, a, "w", adapter)
	roundTrip(t, a, b, "/user/echo") // the watch has reached b
	owner.Tell(count{})
	term := recv(t, got, "Terminated for the adapter's actor")
	if term.Ref.Path() != adapter.Path() || term.Reason != nil {
		t.Fatalf("Terminated = %v (%v), want the adapter ref with a normal stop", term.Ref, term.Reason)
	}
}

// TestWatchesOfAPeerThatLeftAreDropped: watches that a peer's actors
// placed on this node's actors end with the peer's session, gracefully or
// not.
func TestWatchesOfAPeerThatLeftAreDropped(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	slowTest(t)
	for _, abrupt := range []bool{false, true} {
		t.Run(fmt.Sprintf("abrupt=%v", abrupt), func(t *testing.T) {
			f := new(FaultNet)
			home := startOn(t, f, failConfig("home", 50*time.Millisecond, 2*time.Second))
			peer, err := f.Start(ctxT(t, 5*time.Second), failConfig("peer", 50*time.Millisecond, 2*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			const targets = 50
			var refs []AnyRef
			var counters []Ref[chan int]
			for i := range targets {
				r, _ := Spawn(home, fmt.Sprintf("t%d-%s", i, strings.Repeat("x", 200)), Behavior[chan int]{
					Receive: func(c *Context[chan int], ch chan int) {
						if c.c.links == nil {
							ch <- 0
							return
						}
						n := len(c.c.links.watchers)
						if c.c.links.watcher != nil {
							n++
						}
						ch <- n
					},
				})
				counters = append(counters, r)
				rr, err := Resolve[chan int](ctxT(t, 5*time.Second), peer, FormatRef(home.Addrs()[0], r.Path()))
				if err != nil {
					t.Fatal(err)
				}
				refs = append(refs, rr)
			}
			Spawn(peer, "watcher", Behavior[int]{
				Setup: func(c *Context[int]) {
					for _, r := range refs {
						c.Watch(r)
					}
				},
				Receive: func(*Context[int], int) {},
			})
			watchers := func() int {
				total := 0
				for _, r := range counters {
					ch := make(chan int, 1)
					r.Tell(ch)
					total += <-ch
				}
				return total
			}
			waitFor(t, 5*time.Second, "every watch to arrive", func() bool { return watchers() == targets })
			if abrupt {
				f.Kill(peer)
			} else {
				peer.Close()
			}
			waitFor(t, 5*time.Second, "the peer's watches to be dropped", func() bool { return watchers() == 0 })
		})
	}
}

// refBag carries refs to other nodes.
type refBag struct{ Refs []Ref[int] }

func init() { SetWireKey[refBag]("troupe.test.refbag") }

// TestRefsInAMessageDialNothing: a peer naming thousands of third nodes in
// a message makes this node dial none of them; a ref dials when it is
// used, and new outbound associations stay within MaxOutboundConns.
func TestRefsInAMessageDialNothing(t *testing.T) {
	t.Parallel()
	checkLeaks(t) // first: it runs after the listeners are gone
	var watched []string
	var accepted []chan struct{}
	for range 3 {
		addr, acc := silentListener(t)
		watched = append(watched, addr)
		accepted = append(accepted, acc)
	}
	cfg := testConfig("tcp://127.0.0.1:0")
	cfg.MaxOutboundConns = 100
	victim := startNode(t, cfg)
	attacker := startNode(t, testConfig())
	got := make(chan []Ref[int], 1)
	sink, _ := Spawn(victim, "sink", Behavior[refBag]{Receive: func(_ *Context[refBag], b refBag) { got <- b.Refs }})
	var bag refBag
	for i := range 2000 {
		addr := fmt.Sprintf("127.0.0.1:%d", 20000+i)
		if i < len(watched) {
			addr = watched[i]
		}
		var uid NodeUID
		uid[0], uid[1] = byte(i), byte(i>>8)
		a, err := attacker.peers.assocAt(tcpAddr(addr), false, NodeUID{}) // bound lazily: the attacker dials nothing either
		if err != nil {
			t.Fatal(err)
		}
		bag.Refs = append(bag.Refs, Ref[int]{h: &handle{node: attacker, key: refKey{node: uid, path: "/user/x"}, assoc: a}})
	}
	r, err := Resolve[refBag](ctxT(t, 5*time.Second), attacker, FormatRef(victim.Addrs()[0], sink.Path()))
	if err != nil {
		t.Fatal(err)
	}
	r.Tell(bag)
	refs := recv(t, got, "the bag of refs")
	victim.peers.mu.Lock()
	outbound := victim.peers.outbound
	victim.peers.mu.Unlock()
	if outbound > 100 {
		t.Fatalf("%d outbound associations, over MaxOutboundConns 100", outbound)
	}
	for i, acc := range accepted {
		select {
		case <-acc:
			t.Fatalf("decoding a ref to %s dialed it", watched[i])
		default:
		}
	}
	refs[0].Tell(1) // first use: now it dials
	recv(t, accepted[0], "the dial on first use")
}
