package troupe

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"
)

// The order a watcher sees: Terminated(X) after every message from X that
// reached its node, and nothing from X after it — locally and across the
// wire, idle or with a backlog, for a graceful stop and for an
// unreachable peer.

// orderGo tells a sender to send 1..N to To, then stop.
type orderGo struct {
	To Ref[int]
	N  int
}

func init() { SetWireKey[orderGo]("troupe.test.ordergo") }

// orderSender sends 1..N to the ref it is given, then stops.
var orderSender = Behavior[orderGo]{
	Receive: func(c *Context[orderGo], g orderGo) {
		for i := 1; i <= g.N; i++ {
			g.To.Tell(i)
		}
		c.Stop()
	},
}

// orderLog is what the watcher saw: positive numbers from the sender,
// zero for a backlog message from elsewhere, and -1 for Terminated.
type orderLog struct {
	mu     sync.Mutex
	seen   []int
	reason error
	done   chan struct{}
}

// spawnOrderWatcher spawns a watcher of target on n which records what
// it sees. With held, its first message (a 0) blocks until release is
// called (or the test ends).
func spawnOrderWatcher(t *testing.T, n *Node, target AnyRef, held bool) (w Ref[int], log *orderLog, release func()) {
	t.Helper()
	log = &orderLog{done: make(chan struct{})}
	var gate chan struct{}
	release = func() {}
	if held {
		gate = make(chan struct{})
		release = sync.OnceFunc(func() { close(gate) })
		t.Cleanup(release) // before the node's Close, which waits for the watcher
	}
	watching := make(chan struct{})
	first := true
	ref, err := Spawn(n, "watcher", Behavior[int]{
		Setup: func(c *Context[int]) { c.Watch(target); close(watching) },
		Receive: func(_ *Context[int], m int) {
			if first && gate != nil {
				first = false
				<-gate
			}
			log.mu.Lock()
			log.seen = append(log.seen, m)
			log.mu.Unlock()
		},
		Signal: func(_ *Context[int], s Signal) {
			if tm, ok := s.(Terminated); ok {
				log.mu.Lock()
				log.seen = append(log.seen, -1)
				log.reason = tm.Reason
				log.mu.Unlock()
				close(log.done)
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	<-watching
	return ref, log, release
}

// check verifies that the sender's 1..want arrived in order, and that
// Terminated came after all of them and last.
func (l *orderLog) check(t *testing.T, want int) {
	t.Helper()
	select {
	case <-l.done:
	case <-time.After(20 * time.Second):
		t.Fatal("no Terminated")
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	next := 1
	for i, m := range l.seen {
		switch {
		case m == -1 && i != len(l.seen)-1:
			t.Fatalf("Terminated at position %d of %d, before %v", i, len(l.seen), l.seen[i+1:min(i+6, len(l.seen))])
		case m == -1:
		case m > 0 && m != next:
			t.Fatalf("message %d arrived where %d was due", m, next)
		case m > 0:
			next++
		}
	}
	if next-1 != want {
		t.Fatalf("%d of the sender's %d messages arrived before Terminated", next-1, want)
	}
}

// backlog fills the watcher's mailbox with n messages from another sender
// (beyond the one it is held at).
func backlog(w Ref[int], n int) {
	for range n + 1 {
		w.Tell(0)
	}
}

// TestTerminatedAfterTheSendersMessages: a sender on the watcher's node or
// on another node sends 1..1000 and stops; the watcher, idle or behind a
// backlog of 100,000 messages from elsewhere, sees 1..1000, then
// Terminated with a nil reason.
func TestTerminatedAfterTheSendersMessages(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	setups := map[string]func(t *testing.T) (home, away *Node, sender Ref[orderGo]){
		"local": func(t *testing.T) (*Node, *Node, Ref[orderGo]) {
			n := startNode(t, testConfig())
			sender, err := Spawn(n, "sender", orderSender)
			if err != nil {
				t.Fatal(err)
			}
			return n, n, sender
		},
		"remote": func(t *testing.T) (*Node, *Node, Ref[orderGo]) {
			home := startNode(t, testConfig("tcp://127.0.0.1:0"))
			away := startNode(t, testConfig("tcp://127.0.0.1:0"))
			if _, err := Spawn(away, "sender", orderSender); err != nil {
				t.Fatal(err)
			}
			sender, err := Resolve[orderGo](ctxT(t, 5*time.Second), home, FormatRef(away.Addrs()[0], "/user/sender"))
			if err != nil {
				t.Fatal(err)
			}
			return home, away, sender
		},
	}
	for where, setup := range setups {
		for _, busy := range []int{0, 100_000} {
			t.Run(fmt.Sprintf("%s/backlog=%d", where, busy), func(t *testing.T) {
				home, away, sender := setup(t)
				w, log, release := spawnOrderWatcher(t, home, sender, busy > 0)
				if busy > 0 {
					backlog(w, busy)
				}
				sender.Tell(orderGo{To: w, N: 1000})
				if busy > 0 {
					waitFor(t, 10*time.Second, "the sender to stop", func() bool { return away.actors.get("/user/sender", UUID{}) == nil })
				}
				release()
				log.check(t, 1000)
				if log.reason != nil {
					t.Fatalf("reason = %v, want nil", log.reason)
				}
			})
		}
	}
}

// mailboxLen is how many user messages wait in the actor at path.
func mailboxLen(n *Node, path string) int {
	h := n.actors.get(path, UUID{})
	if h == nil {
		return -1
	}
	c := h.local.(*cell[int])
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.q.in)
}

func TestTerminatedAfterMessagesFromAnUnreachablePeer(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	slowTest(t)
	f := new(FaultNet)
	// A window a loaded machine does not run out while 1,000 messages
	// cross (400 ms did once under -race beside the whole suite).
	const window = 2 * time.Second
	home := startOn(t, f, failConfig("home", 20*time.Millisecond, window))
	away := startOn(t, f, failConfig("away", 20*time.Millisecond, window))
	unreachable := make(chan PeerUnreachable, 1)
	SubscribeChan(home, unreachable)
	// The sender sends its messages and then waits, alive, to be cut off.
	if _, err := Spawn(away, "sender", Behavior[orderGo]{
		Receive: func(_ *Context[orderGo], g orderGo) {
			for i := 1; i <= g.N; i++ {
				g.To.Tell(i)
			}
		},
	}); err != nil {
		t.Fatal(err)
	}
	sender, err := Resolve[orderGo](ctxT(t, 5*time.Second), home, FormatRef(away.Addrs()[0], "/user/sender"))
	if err != nil {
		t.Fatal(err)
	}
	w, log, release := spawnOrderWatcher(t, home, sender, true)
	w.Tell(0) // holds the watcher at the gate
	sender.Tell(orderGo{To: w, N: 1000})
	waitFor(t, 10*time.Second, "the 1000 messages to reach the watcher's mailbox", func() bool { return mailboxLen(home, "/user/watcher") >= 1000 })
	before := time.Now()
	f.Partition(home, away)
	after := time.Now()
	e := recv(t, unreachable, "PeerUnreachable")
	// LastHeard is when the last bytes arrived: within the window before
	// the cut (heartbeats cross every 20 ms), and not after it (a read
	// that returned just as the cut came may stamp a moment later). It
	// need not be a whole window before the event: a peer that stops
	// acknowledging what this node sent is written off a window after the
	// acknowledgements stopped, which may be a little before the last
	// bytes came (CI saw 1.85 s of a 2 s window).
	if e.LastHeard.IsZero() || e.LastHeard.Before(before.Add(-window)) || e.LastHeard.After(after.Add(250*time.Millisecond)) {
		t.Fatalf("PeerUnreachable.LastHeard = %v, want between a window before the cut (%v) and the cut (%v); reason %v", e.LastHeard, before, after, e.Reason)
	}
	// And it came no sooner than most of a window after the cut: the
	// acknowledgements, like the bytes, flowed until the cut.
	if d := time.Since(after); d < window/2 {
		t.Fatalf("PeerUnreachable %v after the cut, want at least half the %v window; reason %v", d, window, e.Reason)
	}
	release()
	log.check(t, 1000)
	if !errors.Is(log.reason, ErrPeerUnreachable) {
		t.Fatalf("reason = %v, want ErrPeerUnreachable", log.reason)
	}
	f.Heal()
}
