package troupe

import (
	"errors"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestResetsResumeExactlyOnceInOrder resets the connection between two
// running nodes 100 times while one streams numbered messages to the
// other: every message arrives once and in order, the watch placed before
// the first reset survives them all (no Terminated, no quarantine), and
// after the last one the watched actor's stop is seen once.
func TestResetsResumeExactlyOnceInOrder(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	slowTest(t)
	f := new(FaultNet)
	home := startOn(t, f, failConfig("home", 50*time.Millisecond, 5*time.Second))
	away := startOn(t, f, failConfig("away", 50*time.Millisecond, 5*time.Second))
	sinkHere, got := spawnCollector[count](t, away, "sink", 1<<20)
	unreachable := make(chan PeerUnreachable, 4)
	SubscribeChan(home, unreachable)
	SubscribeChan(away, unreachable)
	resumed := make(chan PeerResumed, 256)
	SubscribeChan(home, resumed)
	dead := make(chan DeadLetter, 16)
	SubscribeChan(home, dead)

	sink, err := Resolve[count](ctxT(t, 5*time.Second), home, FormatRef(away.Addrs()[0], "/user/sink"))
	if err != nil {
		t.Fatal(err)
	}
	mourner := watcher(t, home, "mourner", sink)

	const resets, perRound = 100, 200
	next := 0
	for r := range resets {
		for range perRound {
			next++
			sink.Tell(count{N: next})
		}
		if f.Reset(home, away) == 0 {
			t.Fatalf("reset %d found no connection", r)
		}
		select {
		case <-resumed:
		case ev := <-unreachable:
			t.Fatalf("reset %d: %+v", r, ev)
		case <-time.After(10 * time.Second):
			t.Fatalf("reset %d: no resume", r)
		}
	}
	for i := 1; i <= next; i++ {
		select {
		case m := <-got:
			if m.N != i {
				t.Fatalf("message %d arrived as %d", i, m.N)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("message %d of %d never arrived", i, next)
		}
	}
	select {
	case m := <-got:
		t.Fatalf("message %d arrived twice", m.N)
	case d := <-dead:
		t.Fatalf("dead letter: %+v", d)
	case ev := <-unreachable:
		t.Fatalf("%+v", ev)
	case tm := <-mourner:
		t.Fatalf("Terminated across resets: %+v", tm)
	default:
	}
	if q := home.peers.quarantined(); len(q) != 0 {
		t.Fatalf("quarantined: %+v", q)
	}
	// The session's counts went on across its connections.
	s := home.Stats()
	if s.Totals.LinksResumed < resets {
		t.Fatalf("Totals.LinksResumed %d after %d resumes", s.Totals.LinksResumed, resets)
	}
	for _, p := range s.Peers {
		if p.UID == away.UID() && (p.MessagesOut < uint64(next) || p.BytesOut < uint64(next)) {
			t.Fatalf("after %d resumes, %d messages and %d bytes out, want at least %d of each: the counts started again", resets, p.MessagesOut, p.BytesOut, next)
		}
	}
	if err := away.Stop(sinkHere); err != nil {
		t.Fatal(err)
	}
	select {
	case tm := <-mourner:
		if tm.Reason != nil {
			t.Fatalf("Terminated reason %v, want a normal stop", tm.Reason)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the stop after the resets was never seen")
	}
}

// TestResetThenSilenceIsDetectedByTheWindow resets the link and cuts it
// before the redial can get through: the suspended session ends when
// UnreachableAfter has passed since the peer was last heard.
func TestResetThenSilenceIsDetectedByTheWindow(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	p := newPair(t, 20*time.Millisecond, 400*time.Millisecond)
	lost := make(chan PeerLinkLost, 4)
	SubscribeChan(p.home, lost)
	// The link is cut the moment the flap is seen, before the redial.
	Subscribe(p.home, func(PeerLinkLost) { p.f.Partition(p.home, p.away) })
	cut := time.Now()
	p.f.Reset(p.home, p.away)
	ev := recv(t, p.homeEvents, "PeerUnreachable")
	if !ev.Quarantined || !errors.Is(ev.Reason, ErrPeerUnreachable) {
		t.Fatalf("PeerUnreachable = %+v", ev)
	}
	if waited := time.Since(cut); waited < 300*time.Millisecond {
		t.Fatalf("declared unreachable %v after the cut, before the window", waited)
	}
	select {
	case <-lost:
	default:
		t.Fatal("no PeerLinkLost before the window ran out")
	}
	recv(t, p.awayEv, "PeerUnreachable")
}

// TestAPeerThatCannotResumeEndsAtOnce speaks as a node of an older
// version (its hello lacks the resumable flag): when its connection
// breaks, the session ends and the peer is quarantined at once, as before
// sessions could resume.
func TestAPeerThatCannotResumeEndsAtOnce(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	cfg := failConfig("n", 100*time.Millisecond, 5*time.Second)
	cfg.Listen = []string{"tcp://127.0.0.1:0"}
	n := startNode(t, cfg)
	unreachable := make(chan PeerUnreachable, 1)
	SubscribeChan(n, unreachable)
	lost := make(chan PeerLinkLost, 1)
	SubscribeChan(n, lost)
	c := rawHandshake(t, n)
	waitFor(t, 5*time.Second, "the raw peer to be up", func() bool { return len(n.Stats().Peers) == 1 })
	c.(*net.TCPConn).SetLinger(0)
	c.Close()
	if ev := recv(t, unreachable, "PeerUnreachable"); !ev.Quarantined {
		t.Fatalf("PeerUnreachable = %+v, want quarantined", ev)
	}
	select {
	case ev := <-lost:
		t.Fatalf("a peer that cannot resume was suspended: %+v", ev)
	default:
	}
}

// padded is a message of some kilobytes, so that a round of them spans
// several of an association's blocks.
type padded struct {
	N   int
	Pad string
}

func init() { SetWireKey[padded]("troupe.test.padded") }

// TestResetsResumeLargeMessages is TestResetsResumeExactlyOnceInOrder with
// messages of 5 KB, written and resent in parts of several blocks: a
// first round waits for a paused receiver, then each reset comes, with
// the receiver paused, while half a megabyte is waiting or
// unacknowledged.
func TestResetsResumeLargeMessages(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	f := new(FaultNet)
	home := startOn(t, f, failConfig("home", 50*time.Millisecond, 5*time.Second))
	away := startOn(t, f, failConfig("away", 50*time.Millisecond, 5*time.Second))
	_, got := spawnCollector[padded](t, away, "sink", 1<<12)
	resumed := make(chan PeerResumed, 64)
	SubscribeChan(home, resumed)
	dead := make(chan DeadLetter, 16)
	SubscribeChan(home, dead)
	sink, err := Resolve[padded](ctxT(t, 5*time.Second), home, FormatRef(away.Addrs()[0], "/user/sink"))
	if err != nil {
		t.Fatal(err)
	}
	pad := strings.Repeat("x", 5000)
	const resets, perRound = 10, 100
	next := 0
	// First a round with no reset: written in parts of several blocks.
	f.Pause(away)
	for range perRound {
		next++
		sink.Tell(padded{N: next, Pad: pad})
	}
	f.Resume(away)
	for i := 1; i <= next; i++ {
		if m := recv(t, got, "a message"); m.N != i {
			t.Fatalf("message %d arrived as %d", i, m.N)
		}
	}
	for r := range resets {
		f.Pause(away) // what is sent now waits, or is lost in the reset
		for range perRound {
			next++
			sink.Tell(padded{N: next, Pad: pad})
		}
		// Every Tell is in the association when it returns, encoded or
		// not: what the writer has not encoded yet, behind the paused
		// peer (it encodes a round of 256 KiB at a time), counts 64 bytes
		// a message in Held, an encoded one its size.
		if p := home.Stats().Peers; len(p) != 1 || p[0].Held < perRound*64 {
			t.Fatalf("round %d: the association holds %+v", r, p)
		}
		if f.Reset(home, away) == 0 {
			t.Fatalf("reset %d found no connection", r)
		}
		f.Resume(away)
		recv(t, resumed, "the resume")
	}
	for i := perRound + 1; i <= next; i++ {
		if m := recv(t, got, "a message"); m.N != i || m.Pad != pad {
			t.Fatalf("message %d arrived as %d (%d bytes of padding)", i, m.N, len(m.Pad))
		}
	}
	select {
	case m := <-got:
		t.Fatalf("message %d arrived twice", m.N)
	case d := <-dead:
		t.Fatalf("dead letter: %+v", d)
	default:
	}
}

// TestFailingABacklogDoesNotHoldUpDetection: a suspended session whose
// window runs out fails everything it held, each message queued for the
// peer a dead letter, decoded again and published. That work is not the
// heartbeat loop's: while it goes on (a dead-letter subscriber that waits
// stands here for a large backlog), the loop still finds another peer
// silent.
func TestFailingABacklogDoesNotHoldUpDetection(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	slowTest(t)
	f := new(FaultNet)
	t.Cleanup(f.Heal)
	home := startOn(t, f, failConfig("home", 100*time.Millisecond, 2*time.Second))
	b := startOn(t, f, failConfig("b", 100*time.Millisecond, 2*time.Second))
	c := startOn(t, f, failConfig("c", 100*time.Millisecond, 2*time.Second))
	spawnEcho(t, home, "echo")
	// b dials home and hands it a ref to b's sink: home's session with b
	// is the accepted one, whose window only the heartbeat loop ends.
	refs := make(chan Ref[testPong], 1)
	if _, err := Spawn(home, "keeper", Behavior[testPing]{Receive: func(_ *Context[testPing], m testPing) { refs <- m.ReplyTo }}); err != nil {
		t.Fatal(err)
	}
	sink, _ := spawnCollector[testPong](t, b, "sink", 1)
	keeper, err := Resolve[testPing](ctxT(t, 5*time.Second), b, FormatRef(home.Addrs()[0], "/user/keeper"))
	if err != nil {
		t.Fatal(err)
	}
	keeper.Tell(testPing{ReplyTo: sink})
	toSink := recv(t, refs, "b's sink")
	roundTrip(t, c, home, "/user/echo")

	unreachable := make(chan PeerUnreachable, 4)
	SubscribeChan(home, unreachable)
	linkLost := make(chan PeerLinkLost, 1)
	SubscribeChan(home, linkLost)
	const backlog = 200
	var queued atomic.Bool
	var dead atomic.Int64
	blocked, release := make(chan struct{}), make(chan struct{})
	releaseOnce := sync.OnceFunc(func() { close(release) })
	t.Cleanup(releaseOnce) // (before the nodes close)
	var once sync.Once
	Subscribe(home, func(d DeadLetter) {
		if !strings.HasSuffix(d.Target, "/user/sink") {
			return
		}
		if !queued.Load() {
			t.Errorf("a dead letter for the sink before the backlog was queued: %v", d.Reason)
			return
		}
		once.Do(func() { close(blocked); <-release })
		dead.Add(1)
	})

	// The link is cut once both ends have seen it break (a cut link
	// holds the break too), and before b, the dialer, dials again.
	cut := make(chan struct{})
	Subscribe(b, func(PeerLinkLost) {
		select {
		case <-linkLost:
		case <-time.After(10 * time.Second):
			t.Error("home did not see its link to b lost")
		}
		f.Partition(home, b)
		close(cut)
	})
	f.Reset(home, b)
	recv(t, cut, "both ends to see the link broken, and the cut")
	for i := range backlog {
		toSink.Tell(testPong{N: i})
	}
	queued.Store(true)
	recv(t, blocked, "b's window to run out and its backlog to be failed")
	f.Partition(home, c)
	for {
		ev := recv(t, unreachable, "home to find c silent while b's backlog is being failed")
		if ev.UID == c.UID() {
			break
		}
	}
	releaseOnce()
	waitFor(t, 10*time.Second, "every message of the backlog to be a dead letter", func() bool { return dead.Load() == backlog })
}
