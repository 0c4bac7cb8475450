package troupe

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"
)

// A job handed out that becomes a dead letter on the producer's node
// after its send was accepted (a queued record refused when encoded, or
// dropped when its session ended) goes back to the producer: for want of
// room on the way it is handed again, and no dead letter is reported;
// when it cannot travel, the producer gives it up (Wait returns) and the
// dead letter is the job's. Before, the producer counted such a job as
// held by its worker until the worker stopped.
func TestWorkJobDeadAfterItsSendIsTakenBack(t *testing.T) {
	t.Parallel()
	n := startOwnRegistrar(t, Config{Name: "taken-back"})
	key := ServiceKey[testPing]{Name: "taken-back"}
	got := make(chan Delivery[testPing], 10)
	if _, err := Worker(n, "worker", key, Behavior[Delivery[testPing]]{Receive: func(_ *Context[Delivery[testPing]], d Delivery[testPing]) {
		got <- d // confirmed by the test
	}}, WorkConfig{}); err != nil {
		t.Fatal(err)
	}
	dead := make(chan DeadLetter, 10)
	sub := SubscribeChan(n, dead)
	defer sub.Unsubscribe()
	p, err := Produce(n, key, WorkConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	next := func() Delivery[testPing] {
		select {
		case d := <-got:
			return d
		case <-ctx.Done():
			t.Fatal("no delivery")
		}
		panic("unreachable")
	}
	ctls, err := workersKey(key).Find(ctx, n)
	if err != nil || len(ctls) != 1 {
		t.Fatalf("the worker's controller: %v, %v", ctls, err)
	}
	to := ctls[0].h.key
	for _, reason := range []error{ErrSendQueueFull, errors.New("troupe: AppendWire of a job panicked: boom")} {
		if err := p.Send(ctx, testPing{N: 1}); err != nil {
			t.Fatal(err)
		}
		d := next()
		// What an association would report of the job it took: for
		// another actor (a stale report: the job was handed on since),
		// then for the worker's.
		job := workJob[testPing]{Producer: p.self, ID: p.id, Seq: d.Seq, Job: d.Job}
		n.dead.deadLetterTo(refKey{node: to.node, path: "/user/another"}, "troupe://elsewhere/user/another", job, reason, true)
		select {
		case again := <-got:
			t.Fatalf("a report for another worker took the job back: %+v", again)
		case dl := <-dead:
			t.Fatalf("a report for another worker was a dead letter of the job: %+v", dl)
		case <-time.After(200 * time.Millisecond): // (the producer handles it meanwhile)
		}
		n.dead.deadLetterTo(to, "troupe://elsewhere/user/worker", job, reason, true)
		if errors.Is(reason, ErrSendQueueFull) {
			again := next()
			if again.Seq != d.Seq || !again.Redelivered {
				t.Fatalf("after a refusal for want of room: %+v, want job %d again", again, d.Seq)
			}
			again.Confirm()
			d.Confirm() // (a second confirmation of the job changes nothing)
			select {
			case dl := <-dead:
				t.Fatalf("a job handed again was reported as a dead letter: %+v", dl)
			default:
			}
		} else {
			select {
			case dl := <-dead:
				if m, ok := dl.Message.(testPing); !ok || m.N != 1 {
					t.Fatalf("dead letter %+v, want the job", dl)
				}
			case <-ctx.Done():
				t.Fatal("the job given up made no dead letter")
			}
		}
		if err := p.Wait(ctx); err != nil {
			t.Fatalf("Wait after a %v: %v (stats %+v)", reason, err, p.Stats())
		}
		select {
		case dl := <-dead:
			t.Fatalf("a second dead letter: %+v", dl)
		default:
		}
	}
}

// A post on the system lane (a take-back) is handled after the user
// messages that entered the mailbox before it, so that a confirmation
// already on its way to a producer is not overtaken by the take-back of
// the same job.
func TestPostFollowsTheMessagesBeforeIt(t *testing.T) {
	t.Parallel()
	n := startNode(t, testConfig())
	gate := make(chan struct{})
	got := make(chan int, 10)
	r, err := Spawn(n, "posted", Behavior[int]{Receive: func(_ *Context[int], m int) {
		if m == 0 {
			<-gate // the messages below enter meanwhile
		}
		got <- m
	}})
	if err != nil {
		t.Fatal(err)
	}
	r.Tell(0)
	r.Tell(1)
	r.Tell(2)
	if !r.h.local.sysPush(sysMsg{kind: sysPost, timerKey: 3}) {
		t.Fatal("the post was refused")
	}
	close(gate)
	for want := range 4 {
		select {
		case m := <-got:
			if m != want {
				t.Fatalf("handled %d, want %d: the post overtook the messages before it", m, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("nothing handled")
		}
	}
}

// A worker's mailbox is bounded in bytes by its room of the largest
// frames from each producer it knows, where Config.MailboxBytes is less.
func TestWorkerMailboxBoundGrowsWithItsProducers(t *testing.T) {
	t.Parallel()
	n := startOwnRegistrar(t, Config{Name: "bound", MailboxBytes: 1 << 20, MaxFrameSize: 1 << 20})
	key := ServiceKey[testPing]{Name: "bound"}
	if _, err := Worker(n, "worker", key, Behavior[Delivery[testPing]]{Receive: func(_ *Context[Delivery[testPing]], d Delivery[testPing]) { d.Confirm() }},
		WorkConfig{Room: 4}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ctls, err := workersKey(key).Find(ctx, n)
	if err != nil || len(ctls) != 1 {
		t.Fatalf("the worker's controller: %v, %v", ctls, err)
	}
	c := ctls[0].h.local.(*cell[workerMsg])
	limit := func() int {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.byteLimit()
	}
	if got := limit(); got != 4<<20 {
		t.Fatalf("bound with no producer: %d, want 4 MiB", got)
	}
	for i := range 2 {
		p, err := Produce(n, key, WorkConfig{})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		want := (i + 1) * 4 << 20
		for limit() != want {
			if ctx.Err() != nil {
				t.Fatalf("bound with %d producers: %d, want %d", i+1, limit(), want)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
}

// startOwnRegistrar starts a node, quiet, that is its own registrar at a
// free address; the test's end closes it.
func startOwnRegistrar(t *testing.T, cfg Config) *Node {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg.RegistryAddrs = []string{l.Addr().String()}
	l.Close()
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	n, err := Start(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}
