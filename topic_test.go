package troupe_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"troupe"
)

// news is what the topic tests publish.
type news struct {
	From string
	N    int
	Pad  string
}

func init() { troupe.SetWireKey[news]("troupe.test.topic.news") }

var newsTopic = troupe.Topic[news]{Name: "news"}

// subscriber is a subscribed actor and what it received, per publisher.
type subscriber struct {
	ref troupe.Ref[news]
	got chan news
}

func subscribe(t *testing.T, n *troupe.Node, name string) subscriber {
	t.Helper()
	s := subscriber{got: make(chan news, 4096)}
	ref, err := troupe.Spawn(n, name, troupe.Behavior[news]{Receive: func(_ *troupe.Context[news], m news) { s.got <- m }})
	if err != nil {
		t.Fatal(err)
	}
	if err := newsTopic.Subscribe(n, ref); err != nil {
		t.Fatal(err)
	}
	s.ref = ref
	return s
}

// countDeadOn counts the dead letters of nodes.
func countDeadOn(t *testing.T, nodes ...*troupe.Node) *atomic.Int64 {
	var c atomic.Int64
	for _, n := range nodes {
		s := troupe.Subscribe(n, func(troupe.DeadLetter) { c.Add(1) })
		t.Cleanup(s.Unsubscribe)
	}
	return &c
}

// expectNews waits until s has received 1..total from each publisher,
// in order, and nothing twice.
func (s subscriber) expectNews(t *testing.T, total int, publishers ...string) {
	t.Helper()
	next := map[string]int{}
	for _, p := range publishers {
		next[p] = 1
	}
	deadline := time.After(20 * time.Second)
	for done := 0; done < len(publishers); {
		select {
		case m := <-s.got:
			if m.N != next[m.From] {
				t.Fatalf("%v: from %s got %d, want %d", s.ref, m.From, m.N, next[m.From])
			}
			next[m.From]++
			if next[m.From] == total+1 {
				done++
			}
		case <-deadline:
			t.Fatalf("%v: after 20 s, next expected %v", s.ref, next)
		}
	}
}

// Publish reaches every subscriber on every node exactly once, in each
// publisher's order, from publishers on a node with subscribers and on
// one without; nothing is a dead letter.
func TestPublishReachesEverySubscriberOnEveryNode(t *testing.T) {
	t.Parallel()
	_, ns := serviceNodes(t, "a", "b", "c")
	a, b, c := ns[0], ns[1], ns[2]
	subs := []subscriber{subscribe(t, a, "s1"), subscribe(t, a, "s2"), subscribe(t, b, "s3")}
	dead := countDeadOn(t, a, b, c)
	const total = 200
	for _, pub := range []*troupe.Node{c, a} {
		go func() {
			for i := 1; i <= total; i++ {
				if err := newsTopic.Publish(ctxFor(t), pub, news{From: pub.Name(), N: i}); err != nil {
					t.Errorf("Publish %d from %s: %v", i, pub.Name(), err)
					return
				}
			}
		}()
	}
	for _, s := range subs {
		s.expectNews(t, total, "c", "a")
	}
	if d := dead.Load(); d > 0 {
		t.Fatalf("%d dead letters", d)
	}
	for _, s := range subs {
		select {
		case m := <-s.got:
			t.Fatalf("%v got %+v twice or more", s.ref, m)
		default:
		}
	}
}

// A node with many subscribers receives one copy of each message on the
// wire, not one per subscriber: the node fans out.
func TestPublishSendsOneCopyPerNode(t *testing.T) {
	t.Parallel()
	_, ns := serviceNodes(t, "many", "pub")
	many, pub := ns[0], ns[1]
	var subs []subscriber
	for _, name := range []string{"s1", "s2", "s3", "s4", "s5", "s6", "s7", "s8", "s9", "s10"} {
		subs = append(subs, subscribe(t, many, name))
	}
	pad := strings.Repeat("x", 4096)
	if err := newsTopic.Publish(ctxFor(t), pub, news{From: "pub", N: 1, Pad: pad}); err != nil { // the session, the tables
		t.Fatal(err)
	}
	for _, s := range subs {
		within(t, s.got, 10*time.Second, "the first message")
	}
	before := bytesTo(pub, many)
	const total = 100
	for i := 2; i <= total+1; i++ {
		if err := newsTopic.Publish(ctxFor(t), pub, news{From: "pub", N: i, Pad: pad}); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range subs {
		for range total {
			within(t, s.got, 10*time.Second, "a message")
		}
	}
	per := float64(bytesTo(pub, many)-before) / total
	t.Logf("%.0f bytes on the wire per publish of a %d-byte message to 10 subscribers on one node", per, len(pad))
	if per > 1.5*float64(len(pad)) {
		t.Fatalf("%.0f bytes per publish to one node with 10 subscribers: more than one copy", per)
	}
}

// bytesTo is what from has written to the session with to.
func bytesTo(from, to *troupe.Node) uint64 {
	var b uint64
	for _, p := range from.Stats().Peers {
		if p.UID == to.UID() {
			b += p.BytesOut
		}
	}
	return b
}

// A subscriber that stops, or unsubscribes, leaves the topic without a
// dead letter; a node whose last subscriber left gets nothing more.
func TestATopicsSubscribersLeaveQuietly(t *testing.T) {
	t.Parallel()
	_, ns := serviceNodes(t, "a", "b", "pub")
	a, b, pub := ns[0], ns[1], ns[2]
	s1, s2, s3 := subscribe(t, a, "s1"), subscribe(t, a, "s2"), subscribe(t, b, "s3")
	dead := countDeadOn(t, a, b, pub)
	publish := func(n int) {
		t.Helper()
		if err := newsTopic.Publish(ctxFor(t), pub, news{From: "pub", N: n}); err != nil {
			t.Fatal(err)
		}
	}
	publish(1)
	for _, s := range []subscriber{s1, s2, s3} {
		within(t, s.got, 10*time.Second, "the first message")
	}
	a.Stop(s1.ref)
	waitUntil(t, 5*time.Second, "s1 to stop", func() bool { return a.Stop(s1.ref) != nil }) // (a message in its mailbox as it stops is a dead letter, rightly)
	if !newsTopic.Unsubscribe(b, s3.ref) {
		t.Fatal("Topic.Unsubscribe of a subscriber reported false")
	}
	if newsTopic.Unsubscribe(b, s3.ref) {
		t.Fatal("a second Topic.Unsubscribe reported true")
	}
	for i := 2; i <= 100; i++ {
		publish(i)
	}
	s2.expectNewsFrom(t, 2, 100)
	if d := dead.Load(); d > 0 {
		t.Fatalf("%d dead letters", d)
	}
	select {
	case m := <-s3.got:
		t.Fatalf("an unsubscribed actor got %+v", m)
	default:
	}
}

// expectNewsFrom waits for from..to from "pub", in order.
func (s subscriber) expectNewsFrom(t *testing.T, from, to int) {
	t.Helper()
	for want := from; want <= to; want++ {
		m := within(t, s.got, 10*time.Second, "a message")
		if m.N != want {
			t.Fatalf("%v got %d, want %d", s.ref, m.N, want)
		}
	}
}

// Topics refuse what they cannot carry, and work on a node with no
// registry for its own subscribers.
func TestTopicRefusalsAndALoneNode(t *testing.T) {
	t.Parallel()
	n := startQuiet(t, quietConfig("alone"))
	s := subscribe(t, n, "s")
	other, err := troupe.Spawn(n, "other", troupe.Behavior[string]{Receive: func(*troupe.Context[string], string) {}})
	if err != nil {
		t.Fatal(err)
	}
	if err := (troupe.Topic[string]{Name: "news"}).Subscribe(n, other); !errors.Is(err, troupe.ErrWrongType) {
		t.Errorf("a subscriber of another type: %v, want ErrWrongType", err)
	}
	if err := (troupe.Topic[news]{Name: "bad name"}).Subscribe(n, s.ref); !errors.Is(err, troupe.ErrBadName) {
		t.Errorf("a bad name: %v, want ErrBadName", err)
	}
	if err := newsTopic.Publish(ctxFor(t), n, news{From: "pub", N: 1}); err != nil {
		t.Fatal(err)
	}
	s.expectNewsFrom(t, 1, 1)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := (troupe.Topic[news]{Name: "other"}).Publish(ctx, n, news{}); err != nil && !errors.Is(err, context.Canceled) {
		t.Errorf("Publish with an ended ctx: %v", err)
	}
}
