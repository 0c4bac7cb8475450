package troupe_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"troupe"
)

// bigMsg is a message of realistic size: Pad is kilobytes to a megabyte.
type bigMsg struct {
	N   int
	Pad string
}

func init() { troupe.SetWireKey[bigMsg]("troupe.test.session.big") }

// defaultNode starts a node with the default Config but for its listen
// address and a quiet logger.
func defaultNode(t *testing.T, name string) *troupe.Node {
	t.Helper()
	n, err := troupe.Start(ctxFor(t), troupe.Config{Name: name, Listen: []string{"tcp://127.0.0.1:0"},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}

// countingSink spawns an actor that counts what it gets and the sum of
// the numbers, and records the first message out of order.
type countingSink struct {
	got, sum  atomic.Int64
	disorder  atomic.Int64
	lastSeen  int
	completed chan struct{}
	want      int64
}

func spawnCountingSink(t *testing.T, n *troupe.Node, name string, want int64) *countingSink {
	t.Helper()
	s := &countingSink{completed: make(chan struct{}), want: want}
	_, err := troupe.Spawn(n, name, troupe.Behavior[bigMsg]{Receive: func(_ *troupe.Context[bigMsg], m bigMsg) {
		if m.N != s.lastSeen+1 && s.disorder.Load() == 0 {
			s.disorder.Store(int64(m.N))
		}
		s.lastSeen = m.N
		s.sum.Add(int64(len(m.Pad)))
		if s.got.Add(1) == s.want {
			close(s.completed)
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// A burst of large messages at the default Config reaches a healthy,
// reading peer whole: no quarantine, no dead letter on either side, every
// message in order. (Issue #24, defect 1: the writer used to abort at
// UnackedLimit while the receiver acknowledged only every 1,024 tells.)
func TestABurstOfLargeMessagesNeverEndsAReadingPeer(t *testing.T) {
	longRun(t)
	for _, tc := range []struct {
		name  string
		count int
		size  int
	}{
		{"8192x64KiB", 8192, 64 << 10},
		{"2048x256KiB", 2048, 256 << 10},
		{"64x1MiB", 64, 1 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			home, away := defaultNode(t, "home"), defaultNode(t, "away")
			sink := spawnCountingSink(t, away, "sink", int64(tc.count))
			var trouble firstOf
			for _, n := range []*troupe.Node{home, away} {
				s1 := troupe.Subscribe(n, func(ev troupe.PeerUnreachable) { trouble.CompareAndSwap(nil, ev) })
				s2 := troupe.Subscribe(n, func(ev troupe.DeadLetter) { trouble.CompareAndSwap(nil, ev) })
				t.Cleanup(s1.Unsubscribe)
				t.Cleanup(s2.Unsubscribe)
			}
			ref, err := troupe.Resolve[bigMsg](ctxFor(t), home, troupe.FormatRef(away.Addrs()[0], "/user/sink"))
			if err != nil {
				t.Fatal(err)
			}
			pad := strings.Repeat("p", tc.size)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			for i := 1; i <= tc.count; i++ {
				// Send waits for room in the send budget rather than
				// make a dead letter: the burst is larger than it.
				if err := ref.Send(ctx, bigMsg{N: i, Pad: pad}); err != nil {
					t.Fatalf("message %d: %v (first trouble: %v)", i, err, trouble.Load())
				}
				if ev := trouble.Load(); ev != nil {
					t.Fatalf("after message %d: %#v", i, ev)
				}
			}
			select {
			case <-sink.completed:
			case <-ctx.Done():
				t.Fatalf("%d of %d arrived (first trouble: %v)", sink.got.Load(), tc.count, trouble.Load())
			}
			if d := sink.disorder.Load(); d != 0 {
				t.Fatalf("message %d arrived out of order", d)
			}
			if ev := trouble.Load(); ev != nil {
				t.Fatalf("%#v", ev)
			}
			if q := home.Stats().Quarantined; len(q) != 0 {
				t.Fatalf("quarantined: %+v", q)
			}
		})
	}
}

// chatty encodes itself, and its AppendWire tells another message to the
// same peer: user code that the send path must not run under a lock.
type chatty struct{ N int }

var chattyAside atomic.Pointer[troupe.Ref[string]]

func (c chatty) AppendWire(b []byte) []byte {
	if r := chattyAside.Load(); r != nil {
		r.Tell("aside")
	}
	return append(b, byte(c.N))
}

func (c *chatty) UnmarshalWire(b []byte) error {
	if len(b) != 1 {
		return errors.New("chatty: one byte")
	}
	c.N = int(b[0])
	return nil
}

func init() { troupe.SetWireKey[chatty]("troupe.test.session.chatty") }

// WireMarshaler.AppendWire runs on the sender's goroutine with no troupe
// lock held: an AppendWire that sends to the same peer neither deadlocks
// the sender nor keeps Close from returning (issue #24, defect 4).
func TestAppendWireMaySendToTheSamePeer(t *testing.T) {
	t.Parallel()
	home, away := defaultNode(t, "home"), defaultNode(t, "away")
	got := make(chan int, 4)
	asides := make(chan string, 4)
	if _, err := troupe.Spawn(away, "chatty", troupe.Behavior[chatty]{Receive: func(_ *troupe.Context[chatty], m chatty) { got <- m.N }}); err != nil {
		t.Fatal(err)
	}
	if _, err := troupe.Spawn(away, "aside", troupe.Behavior[string]{Receive: func(_ *troupe.Context[string], s string) { asides <- s }}); err != nil {
		t.Fatal(err)
	}
	target, err := troupe.Resolve[chatty](ctxFor(t), home, troupe.FormatRef(away.Addrs()[0], "/user/chatty"))
	if err != nil {
		t.Fatal(err)
	}
	aside, err := troupe.Resolve[string](ctxFor(t), home, troupe.FormatRef(away.Addrs()[0], "/user/aside"))
	if err != nil {
		t.Fatal(err)
	}
	chattyAside.Store(&aside)
	defer chattyAside.Store(nil)
	told := make(chan struct{})
	go func() {
		defer close(told)
		target.Tell(chatty{N: 7})
		target.Send(ctxFor(t), chatty{N: 8})
	}()
	select {
	case <-told:
	case <-time.After(10 * time.Second):
		t.Fatal("Tell of a message whose AppendWire sends to the same peer never returned")
	}
	for _, want := range []int{7, 8} {
		select {
		case n := <-got:
			if n != want {
				t.Fatalf("got %d, want %d", n, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("message %d never arrived", want)
		}
	}
	for range 2 {
		select {
		case <-asides:
		case <-time.After(10 * time.Second):
			t.Fatal("the message AppendWire sent never arrived")
		}
	}
}

// When a node gives up on a peer whose link still carries its bytes (a
// one-way blackhole), the peer is told at once, not at its own window
// (issue #24, defect 7).
func TestAQuarantinedPeerIsToldAtOnce(t *testing.T) {
	t.Parallel()
	f := new(troupe.FaultNet)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	home, err := f.Start(ctxFor(t), troupe.Config{Name: "home", Logger: quiet, HeartbeatInterval: 50 * time.Millisecond, UnreachableAfter: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { home.Close() })
	away, err := f.Start(ctxFor(t), troupe.Config{Name: "away", Logger: quiet, HeartbeatInterval: 50 * time.Millisecond, UnreachableAfter: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { away.Close() })
	t.Cleanup(f.Heal)
	if _, err := troupe.Spawn(away, "echo", troupe.Behavior[string]{Receive: func(*troupe.Context[string], string) {}}); err != nil {
		t.Fatal(err)
	}
	if _, err := troupe.Resolve[string](ctxFor(t), home, troupe.FormatRef(away.Addrs()[0], "/user/echo")); err != nil {
		t.Fatal(err)
	}
	homeSaw := make(chan troupe.PeerUnreachable, 1)
	troupe.SubscribeChan(home, homeSaw)
	awaySaw := make(chan troupe.PeerUnreachable, 1)
	troupe.SubscribeChan(away, awaySaw)
	f.Drop(away, home) // home hears nothing more; away still hears home
	ev := within(t, homeSaw, 10*time.Second, "home giving up on away")
	if !ev.Quarantined {
		t.Fatalf("home: %+v", ev)
	}
	gaveUp := time.Now()
	ev = within(t, awaySaw, 5*time.Second, "away learning that home gave up on it")
	if ev.UID != home.UID() || !errors.Is(ev.Reason, troupe.ErrQuarantinedByPeer) || !ev.Quarantined {
		t.Fatalf("away: %+v", ev)
	}
	if q := away.Stats().Quarantined; len(q) != 1 || q[0].UID != home.UID() {
		t.Fatalf("away quarantines %+v, want home, as it would have at its window", q)
	}
	t.Logf("away learned %v after home gave up", time.Since(gaveUp))
}

// firstOf keeps the first of several kinds of event: what went wrong
// first.
type firstOf struct {
	mu sync.Mutex
	v  any
}

func (f *firstOf) CompareAndSwap(_, v any) {
	f.mu.Lock()
	if f.v == nil {
		f.v = v
	}
	f.mu.Unlock()
}

func (f *firstOf) Load() any {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.v
}

// slowNode starts a node whose mailboxes take mailboxLimit messages.
func limitedNode(t *testing.T, name string, mailboxLimit int) *troupe.Node {
	t.Helper()
	n, err := troupe.Start(ctxFor(t), troupe.Config{Name: name, Listen: []string{"tcp://127.0.0.1:0"},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), MailboxLimit: mailboxLimit})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}

// Back-pressure end to end: Send to a remote actor waits for room in that
// actor's mailbox (2,000 Sends to an actor whose mailbox takes 50 are all
// handled, no dead letter anywhere), and a slow actor holds up only its
// own senders: a fast actor on the same connection gets a whole burst
// through while the slow actor's sender is still waiting.
func TestSendWaitsForRoomInARemoteMailbox(t *testing.T) {
	t.Parallel()
	slowTest(t)
	home := defaultNode(t, "home")
	away := limitedNode(t, "away", 50)
	var dead firstOf
	for _, n := range []*troupe.Node{home, away} {
		s := troupe.Subscribe(n, func(ev troupe.DeadLetter) { dead.CompareAndSwap(nil, ev) })
		t.Cleanup(s.Unsubscribe)
	}
	const slowN, fastN = 2000, 20000
	slowGot := make(chan int, slowN)
	// The slow actor holds its first message until the fast burst is
	// through: its mailbox fills, and its sender must wait all that time
	// (a millisecond of work per message raced the burst, which under
	// -race on a loaded machine took longer than the 2 s of work).
	release := make(chan struct{})
	if _, err := troupe.Spawn(away, "slow", troupe.Behavior[int]{Receive: func(_ *troupe.Context[int], n int) {
		slowGot <- n
		if n == 1 {
			<-release
		}
	}}); err != nil {
		t.Fatal(err)
	}
	fast := spawnCountingSink(t, away, "fast", fastN)
	slow, err := troupe.Resolve[int](ctxFor(t), home, troupe.FormatRef(away.Addrs()[0], "/user/slow"))
	if err != nil {
		t.Fatal(err)
	}
	fastRef, err := troupe.Resolve[bigMsg](ctxFor(t), home, troupe.FormatRef(away.Addrs()[0], "/user/fast"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	slowDone := make(chan error, 1)
	go func() {
		for i := 1; i <= slowN; i++ {
			if err := slow.Send(ctx, i); err != nil {
				slowDone <- fmt.Errorf("Send %d: %w", i, err)
				return
			}
		}
		slowDone <- nil
	}()
	// Once the slow actor's sender waits, a burst to the fast actor goes
	// through meanwhile.
	if n := within(t, slowGot, 10*time.Second, "the slow actor's first message"); n != 1 {
		t.Fatalf("the slow actor's first message is %d", n)
	}
	for i := 1; i <= fastN; i++ {
		if err := fastRef.Send(ctx, bigMsg{N: i}); err != nil {
			t.Fatal(err)
		}
	}
	within(t, fast.completed, 30*time.Second, "the fast actor's burst")
	select {
	case err := <-slowDone:
		t.Fatalf("the slow actor's sender finished (%v) while the actor held its first message: it did not wait for room", err)
	default:
	}
	close(release)
	if err := within(t, slowDone, time.Minute, "the slow actor's sender"); err != nil {
		t.Fatal(err)
	}
	for i := 2; i <= slowN; i++ {
		if n := within(t, slowGot, 10*time.Second, "a slow message"); n != i {
			t.Fatalf("slow message %d arrived as %d", i, n)
		}
	}
	if d := dead.Load(); d != nil {
		t.Fatalf("dead letter: %+v", d)
	}
}

// A Tell to a remote actor whose mailbox is full is a dead letter on the
// sending node, with the reason a local full mailbox gives.
func TestTellToAFullRemoteMailboxIsADeadLetterTheSenderSees(t *testing.T) {
	t.Parallel()
	home := defaultNode(t, "home")
	away := limitedNode(t, "away", 10)
	release := make(chan struct{})
	handled := make(chan int, 100)
	if _, err := troupe.Spawn(away, "stuck", troupe.Behavior[int]{Receive: func(_ *troupe.Context[int], n int) {
		<-release
		handled <- n
	}}); err != nil {
		t.Fatal(err)
	}
	homeDead := make(chan troupe.DeadLetter, 100)
	troupe.SubscribeChan(home, homeDead)
	awayDead := make(chan troupe.DeadLetter, 100)
	troupe.SubscribeChan(away, awayDead)
	ref, err := troupe.Resolve[int](ctxFor(t), home, troupe.FormatRef(away.Addrs()[0], "/user/stuck"))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 30 {
		ref.Tell(i)
	}
	d := within(t, homeDead, 10*time.Second, "a dead letter on the sending node")
	if !errors.Is(d.Reason, troupe.ErrMailboxFull) {
		t.Fatalf("dead letter %+v, want ErrMailboxFull", d)
	}
	close(release)
	got := 0
	for got < 10 {
		within(t, handled, 10*time.Second, "a handled message")
		got++
	}
	select {
	case d := <-awayDead:
		t.Fatalf("dead letter on the receiving node: %+v", d)
	default:
	}
}

// Credit reaches an actor whose mailbox takes a single message.
func TestSendWaitsForRoomInATinyRemoteMailbox(t *testing.T) {
	t.Parallel()
	home := defaultNode(t, "home")
	away := limitedNode(t, "away", 1)
	var dead firstOf
	for _, n := range []*troupe.Node{home, away} {
		s := troupe.Subscribe(n, func(ev troupe.DeadLetter) { dead.CompareAndSwap(nil, ev) })
		t.Cleanup(s.Unsubscribe)
	}
	got := make(chan int, 512)
	if _, err := troupe.Spawn(away, "tiny", troupe.Behavior[int]{Receive: func(_ *troupe.Context[int], n int) {
		time.Sleep(100 * time.Microsecond) // the work
		got <- n
	}}); err != nil {
		t.Fatal(err)
	}
	tiny, err := troupe.Resolve[int](ctxFor(t), home, troupe.FormatRef(away.Addrs()[0], "/user/tiny"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const total = 200
	for i := 1; i <= total; i++ {
		if err := tiny.Send(ctx, i); err != nil {
			t.Fatalf("Send %d: %v (dead letter: %v)", i, err, dead.Load())
		}
	}
	for i := 1; i <= total; i++ {
		if n := within(t, got, 10*time.Second, "a message"); n != i {
			t.Fatalf("message %d arrived as %d", i, n)
		}
	}
	if d := dead.Load(); d != nil {
		t.Fatalf("dead letter: %+v", d)
	}
}
