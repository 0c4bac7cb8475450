package troupe_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"troupe"
)

// adaptedN is what a remote sender sends to a message adapter; the
// adapter turns it into the owner's adOwnerMsg.
type adaptedN struct{ N int }

// adOwnerMsg is the protocol of the actor behind the adapter: a number
// to work on, or (Offer set) a request for its adapter.
type adOwnerMsg struct {
	N     int
	Offer troupe.Ref[troupe.Ref[adaptedN]]
}

func init() {
	troupe.SetWireKey[adaptedN]("troupe.test.credit-adapter.n")
	troupe.SetWireKey[adOwnerMsg]("troupe.test.credit-adapter.owner")
	troupe.SetWireKey[troupe.Ref[adaptedN]]("troupe.test.credit-adapter.ref")
}

// spawnAdapterOwner spawns, on n, an actor that handles each number with
// work and hands its message adapter to whoever asks, and returns its
// ref, the adapter's ref on from (as an Ask from there got it; from may
// be n) and the channel of the numbers handled.
func spawnAdapterOwner(t *testing.T, from, n *troupe.Node, name string, work func(), want int) (troupe.Ref[adOwnerMsg], troupe.Ref[adaptedN], <-chan int) {
	t.Helper()
	got := make(chan int, want)
	var adapter troupe.Ref[adaptedN]
	local, err := troupe.Spawn(n, name, troupe.Behavior[adOwnerMsg]{
		Setup: func(c *troupe.Context[adOwnerMsg]) {
			adapter = troupe.MessageAdapter(c, func(m adaptedN) adOwnerMsg { return adOwnerMsg{N: m.N} })
		},
		Receive: func(_ *troupe.Context[adOwnerMsg], m adOwnerMsg) {
			if !m.Offer.IsZero() {
				m.Offer.Tell(adapter)
				return
			}
			work()
			got <- m.N
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	owner := local
	if from != n {
		owner = remoteRef[adOwnerMsg](t, from, n, "/user/"+name)
	}
	ref, err := troupe.Ask(ctxFor(t), owner, func(r troupe.Ref[troupe.Ref[adaptedN]]) adOwnerMsg { return adOwnerMsg{Offer: r} })
	if err != nil {
		t.Fatal(err)
	}
	if ref.IsZero() || ref.IsLocal() != (from == n) {
		t.Fatalf("the adapter ref %v is not where it should be (local %v)", ref, ref.IsLocal())
	}
	return local, ref, got
}

// deadCounter counts the dead letters of a node and keeps the first.
type deadCounter struct {
	n     atomic.Int64
	first firstOf
}

func countDead(t *testing.T, n *troupe.Node) *deadCounter {
	d := &deadCounter{}
	s := troupe.Subscribe(n, func(ev troupe.DeadLetter) {
		d.n.Add(1)
		d.first.CompareAndSwap(nil, ev)
	})
	t.Cleanup(s.Unsubscribe)
	return d
}

// Back-pressure reaches a message adapter as it reaches its actor: 2,000
// Sends from another node to the adapter of a slow actor whose mailbox
// takes 50 all wait for room, are all handled, in order, and make no dead
// letter anywhere.
func TestSendWaitsForRoomBehindARemoteAdapter(t *testing.T) {
	t.Parallel()
	slowTest(t)
	home := startQuiet(t, quietConfig("home"))
	cfg := quietConfig("away")
	cfg.MailboxLimit = 50
	away := startQuiet(t, cfg)
	const total = 2000
	_, ref, got := spawnAdapterOwner(t, home, away, "slow", func() { time.Sleep(time.Millisecond) }, total)
	homeDead, awayDead := countDead(t, home), countDead(t, away)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for i := 1; i <= total; i++ {
		if err := ref.Send(ctx, adaptedN{N: i}); err != nil {
			t.Fatalf("Send %d: %v", i, err)
		}
	}
	handled, inOrder := awaitHandled(t, got, total, homeDead, awayDead)
	if d := homeDead.n.Load() + awayDead.n.Load(); d > 0 {
		t.Fatalf("%d of %d Sends handled; dead letters: %d on the sending node, %d on the receiving node; the first: %s",
			handled, total, homeDead.n.Load(), awayDead.n.Load(), firstDead(homeDead, awayDead))
	}
	if !inOrder {
		t.Fatal("the adapter's messages were handled out of order")
	}
}

// awaitHandled receives from got until total messages are handled or
// dead letters, and says how many were handled and whether in order
// (1, 2, …).
func awaitHandled(t *testing.T, got <-chan int, total int, dead ...*deadCounter) (handled int, inOrder bool) {
	t.Helper()
	deadN := func() (n int) {
		for _, d := range dead {
			n += int(d.n.Load())
		}
		return n
	}
	inOrder = true
	deadline := time.After(time.Minute)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for handled+deadN() < total {
		select {
		case n := <-got:
			handled++
			inOrder = inOrder && n == handled
		case <-tick.C:
		case <-deadline:
			t.Fatalf("%d of %d handled and %d dead letters after a minute", handled, total, deadN())
		}
	}
	return handled, inOrder
}

// firstDead describes the first dead letter of ds.
func firstDead(ds ...*deadCounter) string {
	for _, d := range ds {
		if v := d.first.Load(); v != nil {
			ev := v.(troupe.DeadLetter)
			return fmt.Sprintf("%v to %s: %v (full mailbox: %v)", ev.Message, ev.Target, ev.Reason, errors.Is(ev.Reason, troupe.ErrMailboxFull))
		}
	}
	return "none"
}

// A session's first credit for an adapter can meet its owner's mailbox
// full (here, of messages from its own node): the mailbox takes those
// messages past its limit, as it would for the actor itself, rather than
// make them dead letters on the receiving node; past that credit, Send
// waits.
func TestARemoteAdaptersFirstCreditMeetsAFullMailbox(t *testing.T) {
	t.Parallel()
	const limit = 50
	home := startQuiet(t, quietConfig("home"))
	cfg := quietConfig("away")
	cfg.MailboxLimit = limit
	away := startQuiet(t, cfg)
	started, release := make(chan struct{}, 1), make(chan struct{})
	owner, ref, got := spawnAdapterOwner(t, home, away, "stuck", func() {
		select {
		case started <- struct{}{}:
		default:
		}
		<-release
	}, 2*limit+1)
	homeDead, awayDead := countDead(t, home), countDead(t, away)
	owner.Tell(adOwnerMsg{N: -1})
	within(t, started, 10*time.Second, "the owner's first message")
	for i := range limit {
		owner.Tell(adOwnerMsg{N: -2 - i}) // the mailbox is full
	}
	for i := 1; i <= limit; i++ {
		if err := ref.Send(ctxFor(t), adaptedN{N: i}); err != nil {
			t.Fatalf("Send %d, within the first credit: %v", i, err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if err := ref.Send(ctx, adaptedN{N: limit + 1}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Send past the first credit to a full mailbox returned %v, want it to wait", err)
	}
	close(release)
	handled, _ := awaitHandled(t, got, 2*limit+1, homeDead, awayDead)
	if d := homeDead.n.Load() + awayDead.n.Load(); d > 0 {
		t.Fatalf("%d of %d handled; dead letters: %d on the sending node, %d on the receiving node; the first: %s",
			handled, 2*limit+1, homeDead.n.Load(), awayDead.n.Load(), firstDead(homeDead, awayDead))
	}
}

// A Tell to a remote adapter whose owner has no room is a dead letter on
// the sending node (ErrMailboxFull), none on the receiving node, and what
// was taken is handled.
func TestTellToAFullRemoteAdapterIsADeadLetterTheSenderSees(t *testing.T) {
	t.Parallel()
	const limit = 10
	home := startQuiet(t, quietConfig("home"))
	cfg := quietConfig("away")
	cfg.MailboxLimit = limit
	away := startQuiet(t, cfg)
	release := make(chan struct{})
	_, ref, got := spawnAdapterOwner(t, home, away, "stuck", func() { <-release }, 100)
	homeDead := make(chan troupe.DeadLetter, 100)
	troupe.SubscribeChan(home, homeDead)
	awayDead := countDead(t, away)
	for i := range 30 {
		ref.Tell(adaptedN{N: i})
	}
	d := within(t, homeDead, 10*time.Second, "a dead letter on the sending node")
	if !errors.Is(d.Reason, troupe.ErrMailboxFull) {
		t.Fatalf("dead letter %+v, want ErrMailboxFull", d)
	}
	close(release)
	for range limit {
		within(t, got, 10*time.Second, "a handled message")
	}
	if awayDead.n.Load() > 0 {
		t.Fatalf("dead letter on the receiving node: %s", firstDead(awayDead))
	}
}

// Send to a local adapter waits for room in its actor's mailbox, as Send
// to the actor does: none of 500 Sends to the adapter of a slow actor
// whose mailbox takes 5 is a dead letter, and all are handled in order.
func TestSendWaitsForRoomBehindALocalAdapter(t *testing.T) {
	t.Parallel()
	cfg := quietConfig("solo")
	cfg.MailboxLimit = 5
	n := startQuiet(t, cfg)
	const total = 500
	_, ref, got := spawnAdapterOwner(t, n, n, "slow", func() { time.Sleep(100 * time.Microsecond) }, total)
	if !ref.IsLocal() {
		t.Fatal("the adapter is not local")
	}
	dead := countDead(t, n)
	for i := 1; i <= total; i++ {
		if err := ref.Send(ctxFor(t), adaptedN{N: i}); err != nil {
			t.Fatalf("Send %d: %v", i, err)
		}
	}
	handled, inOrder := awaitHandled(t, got, total, dead)
	if dead.n.Load() > 0 {
		t.Fatalf("%d of %d handled; %d dead letters, the first: %s", handled, total, dead.n.Load(), firstDead(dead))
	}
	if !inOrder {
		t.Fatal("handled out of order")
	}
}

// A Send to a local adapter that waits for room while the adapter's
// actor restarts is not taken by the restarted actor (the adapter was
// retired with the old one): it fails with ErrNoSuchActor, as a Tell to
// the retired adapter does.
func TestASendWaitingOnAnAdapterAcrossARestartIsNotTaken(t *testing.T) {
	t.Parallel()
	cfg := quietConfig("solo")
	cfg.MailboxLimit = 1
	n := startQuiet(t, cfg)
	started, release := make(chan struct{}, 1), make(chan struct{})
	got := make(chan int, 16)
	adapters := make(chan troupe.Ref[string], 4)
	owner, err := troupe.Spawn(n, "owner", troupe.Supervise(func() troupe.Behavior[int] {
		return troupe.Behavior[int]{
			Setup: func(c *troupe.Context[int]) {
				adapters <- troupe.MessageAdapter(c, func(string) int { return 1000 })
			},
			Receive: func(_ *troupe.Context[int], m int) {
				got <- m
				if m == -1 {
					started <- struct{}{}
					<-release
					panic("restart")
				}
			},
		}
	}, troupe.RestartOnFailure()))
	if err != nil {
		t.Fatal(err)
	}
	ad := within(t, adapters, 5*time.Second, "the first adapter")
	owner.Tell(-1)
	within(t, started, 5*time.Second, "the handler that fails")
	owner.Tell(5) // the mailbox is full
	sent := make(chan error, 1)
	go func() { sent <- ad.Send(ctxFor(t), "waits") }()
	// (Whether the Send already waits or not when the actor restarts, the
	// retired adapter must not deliver it.)
	time.Sleep(50 * time.Millisecond)
	close(release)
	if err := within(t, sent, 10*time.Second, "the Send"); !errors.Is(err, troupe.ErrNoSuchActor) {
		t.Fatalf("a Send to an adapter retired while it waited returned %v, want ErrNoSuchActor", err)
	}
	owner.Tell(6)
	for m := range got {
		if m == 1000 {
			t.Fatal("the restarted actor handled a message of its retired adapter")
		}
		if m == 6 {
			break
		}
	}
}
