package troupe_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"troupe"
)

// job is what the workers of the service tests take.
type job struct {
	N     int
	Reply troupe.Ref[string]
}

func init() { troupe.SetWireKey[job]("troupe.test.service.job") }

var workersKey = troupe.ServiceKey[job]{Name: "workers"}

// serviceNodes starts a registrar and names more nodes that use it.
func serviceNodes(t *testing.T, names ...string) (*troupe.Node, []*troupe.Node) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	cfg := func(name string) troupe.Config {
		return troupe.Config{Name: name, Listen: []string{"tcp://127.0.0.1:0"}, RegistryAddrs: []string{addr},
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	}
	reg := startQuiet(t, cfg("registrar"))
	if !reg.Stats().Registrar {
		t.Fatal("the first node is not the registrar")
	}
	var out []*troupe.Node
	for _, name := range names {
		out = append(out, startQuiet(t, cfg(name)))
	}
	return reg, out
}

// spawnWorker spawns a worker that answers each job with its name, and
// registers it under workersKey.
func spawnWorker(t *testing.T, n *troupe.Node, name string) troupe.Ref[job] {
	t.Helper()
	ref, err := troupe.Spawn(n, name, troupe.Behavior[job]{Receive: func(_ *troupe.Context[job], j job) {
		j.Reply.Tell(fmt.Sprintf("%s:%d", name, j.N))
	}})
	if err != nil {
		t.Fatal(err)
	}
	if err := workersKey.Register(n, ref); err != nil {
		t.Fatal(err)
	}
	return ref
}

// paths lists the paths of refs, as a listing's order gives them.
func paths[T any](refs []troupe.Ref[T]) []string {
	var out []string
	for _, r := range refs {
		out = append(out, r.Path())
	}
	slices.Sort(out)
	return out
}

// A service key lists every actor registered under it, on every node,
// as refs of its type that work; a stopped actor and a deregistered one
// leave it, and an actor of another type under the same name is not in
// it.
func TestServiceKeyListsItsActorsOnEveryNode(t *testing.T) {
	t.Parallel()
	reg, ns := serviceNodes(t, "a", "b", "client")
	a, b, client := ns[0], ns[1], ns[2]
	spawnWorker(t, a, "w1")
	w2 := spawnWorker(t, a, "w2")
	w3 := spawnWorker(t, b, "w3")
	other, err := troupe.Spawn(b, "other", troupe.Behavior[string]{Receive: func(*troupe.Context[string], string) {}})
	if err != nil {
		t.Fatal(err)
	}
	if err := (troupe.ServiceKey[string]{Name: "workers"}).Register(b, other); err != nil {
		t.Fatal(err)
	}
	for _, from := range []*troupe.Node{client, a, reg} {
		refs, err := workersKey.Find(ctxFor(t), from)
		if err != nil {
			t.Fatal(err)
		}
		if got := paths(refs); !slices.Equal(got, []string{"/user/w1", "/user/w2", "/user/w3"}) {
			t.Fatalf("%s finds %v", from.Name(), got)
		}
		for _, r := range refs {
			got, err := troupe.Ask(ctxFor(t), r, func(reply troupe.Ref[string]) job { return job{N: 7, Reply: reply} })
			if err != nil || got != r.Path()[len("/user/"):]+":7" {
				t.Fatalf("%s: Ask %v = %q, %v", from.Name(), r, got, err)
			}
		}
	}
	if strs, err := (troupe.ServiceKey[string]{Name: "workers"}).Find(ctxFor(t), client); err != nil || !slices.Equal(paths(strs), []string{"/user/other"}) {
		t.Fatalf("the string key lists %v, %v", paths(strs), err)
	}
	if !workersKey.Unregister(a, w2) {
		t.Fatal("ServiceKey.Unregister of a registered worker reported false")
	}
	if workersKey.Unregister(a, w2) {
		t.Fatal("a second ServiceKey.Unregister reported true")
	}
	b.Stop(w3)
	waitUntil(t, 10*time.Second, "w2 and w3 to leave the listing", func() bool {
		refs, err := workersKey.Find(ctxFor(t), client)
		return err == nil && slices.Equal(paths(refs), []string{"/user/w1"})
	})
}

// ServiceKey.Register refuses what it cannot list, with a clear error.
func TestRegisterServiceRefusals(t *testing.T) {
	t.Parallel()
	_, ns := serviceNodes(t, "a", "b")
	a, b := ns[0], ns[1]
	w := spawnWorker(t, a, "w")
	if err := (troupe.ServiceKey[job]{Name: "no spaces"}).Register(a, w); !errors.Is(err, troupe.ErrBadName) {
		t.Errorf("a bad key name: %v, want ErrBadName", err)
	}
	if _, err := (troupe.ServiceKey[job]{Name: ""}).Find(ctxFor(t), a); !errors.Is(err, troupe.ErrBadName) {
		t.Errorf("ServiceKey.Find of an empty name: %v, want ErrBadName", err)
	}
	remote := remoteRef[job](t, b, a, "/user/w")
	if err := workersKey.Register(b, remote); !errors.Is(err, troupe.ErrBadConfig) {
		t.Errorf("a remote ref: %v, want ErrBadConfig", err)
	}
	a.Stop(w)
	waitUntil(t, 5*time.Second, "w to stop", func() bool {
		return errors.Is(workersKey.Register(a, w), troupe.ErrActorStopped)
	})
	refs, err := workersKey.Find(ctxFor(t), b)
	if err != nil || len(refs) != 0 {
		t.Fatalf("a stopped actor is listed: %v, %v", paths(refs), err)
	}
}

// A program may publish troupe's own event types itself with
// Events.Publish: its subscribers get the event, and troupe does not act
// on it. A PeerUnreachable published by hand on the registrar leaves the
// node it names, and its actors, listed.
func TestAHandPublishedPeerUnreachableIsNotActedOn(t *testing.T) {
	t.Parallel()
	reg, ns := serviceNodes(t, "a", "client")
	a, client := ns[0], ns[1]
	spawnWorker(t, a, "w")
	waitUntil(t, 10*time.Second, "w to be listed", func() bool {
		refs, err := workersKey.Find(ctxFor(t), reg)
		return err == nil && len(refs) == 1
	})
	got := make(chan troupe.PeerUnreachable, 1)
	sub := troupe.SubscribeChan(reg, got)
	defer sub.Unsubscribe()
	reg.PublishEvent(troupe.PeerUnreachable{UID: a.UID(), Name: "a"})
	if e := within(t, got, 10*time.Second, "the event at the program's subscriber"); e.UID != a.UID() {
		t.Fatalf("the subscriber got %+v", e)
	}
	// Publish calls every subscriber before it returns: a registrar that
	// acted on the event has dropped a's registrations by now.
	for _, n := range []*troupe.Node{reg, client} {
		refs, err := workersKey.Find(ctxFor(t), n)
		if err != nil || !slices.Equal(paths(refs), []string{"/user/w"}) {
			t.Fatalf("%s lists %v, %v after a hand-published PeerUnreachable; want /user/w", n.Name(), paths(refs), err)
		}
	}
}

// listings collects what ServiceKey.Watch delivers.
func watchListings(t *testing.T, n *troupe.Node, k troupe.ServiceKey[job]) (<-chan []troupe.Ref[job], func() error) {
	t.Helper()
	ch := make(chan []troupe.Ref[job], 64)
	ctx, cancel := context.WithCancel(context.Background())
	ended := make(chan error, 1)
	go func() { ended <- k.Watch(ctx, n, func(refs []troupe.Ref[job]) { ch <- refs }) }()
	stop := sync.OnceValue(func() error {
		cancel()
		select {
		case err := <-ended:
			return err
		case <-time.After(10 * time.Second):
			return errors.New("ServiceKey.Watch did not return after its ctx ended")
		}
	})
	t.Cleanup(func() { stop() })
	return ch, stop
}

// nextListing waits for a listing of want (paths, sorted), skipping
// others on the way, and fails after 10 s.
func nextListing(t *testing.T, ch <-chan []troupe.Ref[job], what string, want ...string) []troupe.Ref[job] {
	t.Helper()
	deadline := time.After(10 * time.Second)
	var last []string
	for {
		select {
		case refs := <-ch:
			last = paths(refs)
			if slices.Equal(last, want) || (len(want) == 0 && len(last) == 0) {
				return refs
			}
		case <-deadline:
			t.Fatalf("%s: the last listing was %v, want %v", what, last, want)
		}
	}
}

// ServiceKey.Watch delivers the listing at once and each change as it
// happens, pushed by the registrar: a registration, a stop, a node that
// closes; and returns ctx's error when ctx ends.
func TestWatchServiceIsPushed(t *testing.T) {
	t.Parallel()
	_, ns := serviceNodes(t, "a", "b", "watcher")
	a, b, watcher := ns[0], ns[1], ns[2]
	spawnWorker(t, a, "w1")
	ch, stop := watchListings(t, watcher, workersKey)
	nextListing(t, ch, "the first listing", "/user/w1")
	w2 := spawnWorker(t, b, "w2")
	got := nextListing(t, ch, "w2 registered", "/user/w1", "/user/w2")
	for _, r := range got {
		if _, err := troupe.Ask(ctxFor(t), r, func(reply troupe.Ref[string]) job { return job{N: 1, Reply: reply} }); err != nil {
			t.Fatalf("Ask %v from the listing: %v", r, err)
		}
	}
	b.Stop(w2)
	nextListing(t, ch, "w2 stopped", "/user/w1")
	a.Close()
	nextListing(t, ch, "a closed")
	if err := stop(); !errors.Is(err, context.Canceled) {
		t.Fatalf("ServiceKey.Watch after its ctx ended = %v", err)
	}
}

// A node cut off from the registrar leaves the listing when the
// registrar gives up on it, and the watcher's own node quarantining it
// keeps it out; a node that closes ends ServiceKey.Watch with ErrNodeClosed.
func TestWatchServiceDropsAnUnreachableNode(t *testing.T) {
	t.Parallel()
	slowTest(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	f := new(troupe.FaultNet)
	t.Cleanup(f.Heal)
	start := func(name string) *troupe.Node {
		n, err := f.Start(ctxFor(t), troupe.Config{Name: name, RegistryAddrs: []string{addr}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
			HeartbeatInterval: 50 * time.Millisecond, UnreachableAfter: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { n.Close() })
		return n
	}
	reg := start("registrar")
	a, b := start("a"), start("b")
	if !reg.Stats().Registrar {
		t.Fatal("no registrar")
	}
	spawnWorker(t, a, "wa")
	spawnWorker(t, b, "wb")
	ch, _ := watchListings(t, reg, workersKey)
	nextListing(t, ch, "the first listing", "/user/wa", "/user/wb")
	f.Partition(b, reg) // b cut off from everyone
	f.Partition(b, a)
	nextListing(t, ch, "b cut off", "/user/wa")
	ended := make(chan error, 1)
	go func() { ended <- workersKey.Watch(context.Background(), a, func([]troupe.Ref[job]) {}) }()
	a.Close()
	if err := within(t, ended, 10*time.Second, "ServiceKey.Watch on a closed node"); !errors.Is(err, troupe.ErrNodeClosed) {
		t.Fatalf("ServiceKey.Watch on a closed node = %v, want ErrNodeClosed", err)
	}
}

// A node this node loses (cut off from it alone: the registrar still
// reaches it) leaves this node's listing at once; once the link is back
// and the quarantine cleared, it is listed again, with a ref that works.
func TestWatchServiceFollowsWhatThisNodeReaches(t *testing.T) {
	t.Parallel()
	slowTest(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	f := new(troupe.FaultNet)
	t.Cleanup(f.Heal)
	start := func(name string) *troupe.Node {
		n, err := f.Start(ctxFor(t), troupe.Config{Name: name, RegistryAddrs: []string{addr}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
			HeartbeatInterval: 50 * time.Millisecond, UnreachableAfter: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { n.Close() })
		return n
	}
	reg := start("registrar")
	w, b := start("w"), start("b")
	if !reg.Stats().Registrar {
		t.Fatal("no registrar")
	}
	spawnWorker(t, w, "ww")
	spawnWorker(t, b, "wb")
	ch, _ := watchListings(t, w, workersKey)
	nextListing(t, ch, "the first listing", "/user/wb", "/user/ww")
	f.Partition(w, b)
	nextListing(t, ch, "b cut off from w", "/user/ww")
	waitUntil(t, 10*time.Second, "b to give up on w too", func() bool {
		for _, q := range b.Stats().Quarantined {
			if q.UID == w.UID() {
				return true
			}
		}
		return false
	})
	f.Heal()
	b.ClearQuarantine(ctxFor(t), w.Addrs()[0].String()) // (each side gave up on the other)
	if _, err := w.ClearQuarantine(ctxFor(t), b.Addrs()[0].String(), troupe.Reconnect()); err != nil {
		t.Fatal(err)
	}
	got := nextListing(t, ch, "b back", "/user/wb", "/user/ww")
	for _, r := range got {
		if _, err := troupe.Ask(ctxFor(t), r, func(reply troupe.Ref[string]) job { return job{N: 2, Reply: reply} }); err != nil {
			t.Fatalf("Ask %v after the heal: %v", r, err)
		}
	}
}

// ServiceKey.Subscribe sends the listing to an actor, at once and at each
// change; Unsubscribe ends it, and so does the subscriber's stop (which
// leaves no dead letter behind).
func TestSubscribeServiceDeliversListingsToAnActor(t *testing.T) {
	t.Parallel()
	_, nodes := serviceNodes(t, "front", "back")
	front, back := nodes[0], nodes[1]
	follower := func(name string) (troupe.Ref[troupe.ServiceListing[job]], <-chan []string) {
		ch := make(chan []string, 64)
		ref, err := troupe.Spawn(front, name, troupe.Behavior[troupe.ServiceListing[job]]{
			Receive: func(_ *troupe.Context[troupe.ServiceListing[job]], l troupe.ServiceListing[job]) {
				if l.Key != workersKey {
					t.Errorf("a listing of %v", l.Key)
				}
				ch <- paths(l.Refs)
			}})
		if err != nil {
			t.Fatal(err)
		}
		return ref, ch
	}
	await := func(ch <-chan []string, what string, want ...string) {
		t.Helper()
		deadline := time.After(10 * time.Second)
		var last []string
		for {
			select {
			case last = <-ch:
				if slices.Equal(last, want) || len(want) == 0 && len(last) == 0 {
					return
				}
			case <-deadline:
				t.Fatalf("%s: the last listing was %v, want %v", what, last, want)
			}
		}
	}
	ref, ch := follower("follower")
	sub, err := workersKey.Subscribe(front, ref)
	if err != nil {
		t.Fatal(err)
	}
	await(ch, "the first listing")
	w1 := spawnWorker(t, back, "w1")
	await(ch, "w1 registered", "/user/w1")
	spawnWorker(t, back, "w2")
	await(ch, "w2 registered", "/user/w1", "/user/w2")
	back.Stop(w1)
	await(ch, "w1 stopped", "/user/w2")

	sub.Unsubscribe()
	sub.Unsubscribe() // (twice is fine)
	other, otherCh := follower("other")
	if _, err := workersKey.Subscribe(front, other); err != nil {
		t.Fatal(err)
	}
	await(otherCh, "the second follower's listing", "/user/w2")
	spawnWorker(t, back, "w3")
	await(otherCh, "w3 registered", "/user/w2", "/user/w3")
	select {
	case l := <-ch:
		t.Fatalf("a listing (%v) after Unsubscribe", l)
	default:
	}

	var dead sync.Mutex
	deadLetters := 0
	sub2 := troupe.Subscribe(front, func(d troupe.DeadLetter) {
		if _, ok := d.Message.(troupe.ServiceListing[job]); ok {
			dead.Lock()
			deadLetters++
			dead.Unlock()
		}
	})
	defer sub2.Unsubscribe()
	// Stop is asked, not waited for: a listing sent while the follower
	// is still stopping may be left in its mailbox, a dead letter like
	// any message (ServiceKey.Subscribe says so). What is promised is
	// that none is sent once it has stopped: wait for that.
	gone := make(chan struct{})
	if _, err := troupe.Spawn(front, "watcher", troupe.Behavior[int]{
		Setup:   func(c *troupe.Context[int]) { c.Watch(other) },
		Receive: func(*troupe.Context[int], int) {},
		Signal: func(_ *troupe.Context[int], s troupe.Signal) {
			if _, ok := s.(troupe.Terminated); ok {
				close(gone)
			}
		},
	}); err != nil {
		t.Fatal(err)
	}
	front.Stop(other)
	select {
	case <-gone:
	case <-time.After(10 * time.Second):
		t.Fatal("the second follower did not stop")
	}
	spawnWorker(t, back, "w4")
	last, lastCh := follower("last")
	if _, err := workersKey.Subscribe(front, last); err != nil {
		t.Fatal(err)
	}
	await(lastCh, "w4 registered", "/user/w2", "/user/w3", "/user/w4")
	dead.Lock()
	defer dead.Unlock()
	if deadLetters != 0 {
		t.Fatalf("%d listings were dead letters after their subscriber stopped", deadLetters)
	}
}

// ServiceKey.Subscribe refuses what it cannot follow.
func TestSubscribeServiceErrors(t *testing.T) {
	t.Parallel()
	_, nodes := serviceNodes(t, "a", "b")
	a, b := nodes[0], nodes[1]
	sink := troupe.Behavior[troupe.ServiceListing[job]]{Receive: func(*troupe.Context[troupe.ServiceListing[job]], troupe.ServiceListing[job]) {}}
	onB, err := troupe.Spawn(b, "sink", sink)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := workersKey.Subscribe(a, onB); !errors.Is(err, troupe.ErrBadConfig) {
		t.Fatalf("another node's subscriber: %v, want ErrBadConfig", err)
	}
	if _, err := (troupe.ServiceKey[job]{Name: "bad name!"}).Subscribe(b, onB); !errors.Is(err, troupe.ErrBadName) {
		t.Fatalf("a bad key: %v, want ErrBadName", err)
	}
	stopped, err := troupe.Spawn(a, "stopped", sink)
	if err != nil {
		t.Fatal(err)
	}
	gone := make(chan struct{})
	if _, err := troupe.Spawn(a, "watcher", troupe.Behavior[int]{
		Setup:   func(c *troupe.Context[int]) { c.Watch(stopped) },
		Receive: func(*troupe.Context[int], int) {},
		Signal:  func(_ *troupe.Context[int], s troupe.Signal) { close(gone) },
	}); err != nil {
		t.Fatal(err)
	}
	a.Stop(stopped)
	<-gone
	if _, err := workersKey.Subscribe(a, stopped); !errors.Is(err, troupe.ErrActorStopped) {
		t.Fatalf("a stopped subscriber: %v, want ErrActorStopped", err)
	}
	lone := startQuiet(t, troupe.Config{Name: "lone", Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	there, err := troupe.Spawn(lone, "sink", sink)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := workersKey.Subscribe(lone, there); !errors.Is(err, troupe.ErrNoRegistry) {
		t.Fatalf("a node without a registry: %v, want ErrNoRegistry", err)
	}
	lone.Close()
	if _, err := workersKey.Subscribe(lone, there); !errors.Is(err, troupe.ErrNodeClosed) {
		t.Fatalf("a closed node: %v, want ErrNodeClosed", err)
	}
}
