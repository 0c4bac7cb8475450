package troupe

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"sync/atomic"
	"testing"
	"time"
)

func TestRefStrings(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	for _, a := range []Addr{tcpAddr("127.0.0.1:7001"), unixAddr("/run/app/a.sock"), tcpAddr("[::1]:5")} {
		s := FormatRef(a, "/user/worker")
		got, path, err := ParseRef(s)
		if err != nil || got != a || path != "/user/worker" {
			t.Errorf("ParseRef(%q) = %v, %q, %v; want %v, /user/worker", s, got, path, err, a)
		}
	}
	for _, bad := range []string{"http://x/y", "troupe://127.0.0.1:1", "troupe://127.0.0.1:1/", "troupe+unix://rel.sock/a", "troupe://nohost/a"} {
		if _, _, err := ParseRef(bad); !errors.Is(err, ErrBadAddr) {
			t.Errorf("ParseRef(%q) = %v, want ErrBadAddr", bad, err)
		}
	}
}

// TestSendWaitsForRoomInTheMailbox fills a local actor's mailbox while its
// handler is held: Send waits rather than drop, a Send whose context ends
// returns its error and leaves no dead letter, and once the handler moves
// every message arrives, in order.
func TestSendWaitsForRoomInTheMailbox(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	cfg := testConfig()
	cfg.MailboxLimit = 4
	n := startNode(t, cfg)
	gate, taken := make(chan struct{}), make(chan struct{}, 1)
	got := make(chan int, 64)
	r, err := Spawn(n, "slow", Behavior[int]{Receive: func(_ *Context[int], m int) {
		select {
		case taken <- struct{}{}:
		default:
		}
		<-gate
		got <- m
	}})
	if err != nil {
		t.Fatal(err)
	}
	dead := make(chan DeadLetter, 4)
	SubscribeChan(n, dead)
	ctx := ctxT(t, 10*time.Second)
	if err := r.Send(ctx, 1); err != nil { // taken at once: the handler holds it
		t.Fatal(err)
	}
	recv(t, taken, "the handler to take the first message")
	for i := 2; i <= 5; i++ { // fills the mailbox
		if err := r.Send(ctx, i); err != nil {
			t.Fatal(err)
		}
	}
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if err := r.Send(short, 99); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Send to a full mailbox with an ending context = %v", err)
	}
	sent := make(chan error, 1)
	go func() { sent <- r.Send(ctx, 6) }()
	select {
	case err := <-sent:
		t.Fatalf("Send to a full mailbox returned %v without waiting", err)
	case <-time.After(100 * time.Millisecond):
	}
	close(gate)
	if err := <-sent; err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 6; i++ {
		if m := recv(t, got, "message"); m != i {
			t.Fatalf("message %d arrived as %d", i, m)
		}
	}
	select {
	case d := <-dead:
		t.Fatalf("dead letter: %+v", d)
	default:
	}
}

// TestSendWaitsForRoomOnTheWire streams numbered messages with Send over
// a link that is cut for a while: the producer waits with at most
// SendQueueLimit bytes held instead of making dead letters, and when the
// link heals every message arrives once, in order.
func TestSendWaitsForRoomOnTheWire(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	slowTest(t)
	f := new(FaultNet)
	cfg := failConfig("home", 50*time.Millisecond, 10*time.Second)
	cfg.SendQueueLimit = 512
	home := startOn(t, f, cfg)
	away := startOn(t, f, failConfig("away", 50*time.Millisecond, 10*time.Second))
	_, got := spawnCollector[count](t, away, "sink", 1<<16)
	sink, err := Resolve[count](ctxT(t, 5*time.Second), home, FormatRef(away.Addrs()[0], "/user/sink"))
	if err != nil {
		t.Fatal(err)
	}
	dead := make(chan DeadLetter, 4)
	SubscribeChan(home, dead)
	f.Partition(home, away)
	const total = 20000
	ctx := ctxT(t, 60*time.Second)
	done := make(chan error, 1)
	go func() {
		for i := 1; i <= total; i++ {
			if err := sink.Send(ctx, count{N: i}); err != nil {
				done <- fmt.Errorf("Send %d: %w", i, err)
				return
			}
		}
		done <- nil
	}()
	waitFor(t, 10*time.Second, "the queue to fill while the link is cut", func() bool {
		p := home.Stats().Peers
		return len(p) == 1 && p[0].Held >= cfg.SendQueueLimit
	})
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if err := sink.Send(short, count{N: -1}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Send with a full queue and an ending context = %v", err)
	}
	if p := home.Stats().Peers; p[0].Held >= cfg.SendQueueLimit+maxCountFrame {
		t.Fatalf("%d bytes held, the limit is %d", p[0].Held, cfg.SendQueueLimit)
	}
	f.Heal()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= total; i++ {
		if m := recv(t, got, "message"); m.N != i {
			t.Fatalf("message %d arrived as %d", i, m.N)
		}
	}
	select {
	case d := <-dead:
		t.Fatalf("dead letter: %+v", d)
	default:
	}
}

// TestSendToAGonePeerFails: Send to a quarantined peer returns why, at
// once, and publishes the dead letter Tell would.
func TestSendToAGonePeerFails(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	p := newPair(t, 20*time.Millisecond, 300*time.Millisecond)
	dead := make(chan DeadLetter, 4)
	SubscribeChan(p.home, dead)
	p.f.Partition(p.home, p.away)
	recv(t, p.homeEvents, "PeerUnreachable")
	err := p.toAway.Send(ctxT(t, 5*time.Second), testPing{N: 1})
	if !errors.Is(err, ErrQuarantined) {
		t.Fatalf("Send to a quarantined peer = %v", err)
	}
	if d := recv(t, dead, "DeadLetter"); !errors.Is(d.Reason, ErrQuarantined) {
		t.Fatalf("dead letter reason %v", d.Reason)
	}
}

// maxCountFrame bounds the encoded size of a tell frame of count: the
// most a send past a full budget's last room can add to it.
const maxCountFrame = 64

// burst is how many messages TestSendCarriesABurst sends; CI's default
// keeps the race-detector run short, -troupe.burst=10000000 is the full
// figure.
var burst = flag.Int("troupe.burst", 1_000_000, "messages TestSendCarriesABurst sends")

// TestSendCarriesABurst sends a burst far larger than the send budget
// from a producer that outruns the connection, with the default Config
// but for a budget of 32 KiB (the default is 64 MiB), so that the
// producer waits often: Tell would turn the overflow into dead letters;
// Send waits, the association never holds more than SendQueueLimit bytes
// (and one message), and the receiver counts every message, in order.
func TestSendCarriesABurst(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	slowTest(t)
	if testing.Short() {
		t.Skip("a large burst")
	}
	// The default window (testConfig's 2 s is for tests of liveness): a
	// million messages under -race beside the suite once kept the
	// receiving process from reading for 2 s, and the burst, not the
	// window, is what this test is about.
	cfg := testConfig("tcp://127.0.0.1:0")
	cfg.UnreachableAfter = 0
	cfg.SendQueueLimit = 32 << 10 // the default is 64 MiB: a smaller budget makes the producer wait often
	home := startNode(t, cfg)
	awayCfg := testConfig("tcp://127.0.0.1:0")
	awayCfg.UnreachableAfter = 0
	away := startNode(t, awayCfg)
	total := int64(*burst)
	c := spawnCounting(t, away, "sink", total)
	sink, err := Resolve[count](ctxT(t, 5*time.Second), home, FormatRef(away.Addrs()[0], "/user/sink"))
	if err != nil {
		t.Fatal(err)
	}
	dead := make(chan DeadLetter, 4)
	SubscribeChan(home, dead)
	stop := make(chan struct{})
	var maxHeld atomic.Int64
	go func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
			if p := home.Stats().Peers; len(p) == 1 && int64(p[0].Held) > maxHeld.Load() {
				maxHeld.Store(int64(p[0].Held))
			}
		}
	}()
	defer close(stop)
	ctx := ctxT(t, 5*time.Minute)
	for i := range total {
		if err := sink.Send(ctx, count{N: int(i)}); err != nil {
			t.Fatalf("Send %d: %v", i, err)
		}
	}
	select {
	case <-c.done:
	case <-ctx.Done():
		t.Fatalf("the receiver counted %d of %d", c.seen.Load(), total)
	}
	if c.disorder.Load() != 0 {
		t.Fatalf("%d messages out of order", c.disorder.Load())
	}
	if h := maxHeld.Load(); h >= int64(cfg.SendQueueLimit+maxCountFrame) {
		t.Fatalf("%d bytes held, the limit is %d", h, cfg.SendQueueLimit)
	}
	select {
	case d := <-dead:
		t.Fatalf("dead letter: %+v", d)
	default:
	}
}
