package troupe_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"troupe"
)

// lockedBuffer is a log destination safe for concurrent writes.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// A member that crashes in a cluster without a downing strategy blocks it;
// after StableAfter the survivor says so once in its log, with the
// command that unblocks it, and in Stats for as long as it lasts. Downing
// the crashed member by hand clears it.
func TestABlockedClusterSaysHowToUnblockIt(t *testing.T) {
	t.Parallel()
	slowTest(t)
	f := new(troupe.FaultNet)
	var logs lockedBuffer
	start := func(name string, log *slog.Logger) *troupe.Node {
		n, err := f.Start(ctxFor(t), troupe.Config{Name: name, Logger: log, HeartbeatInterval: 20 * time.Millisecond, UnreachableAfter: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { n.Close() })
		return n
	}
	home := start("home", slog.New(slog.NewTextHandler(&logs, nil)))
	away := start("away", slog.New(slog.NewTextHandler(&bytes.Buffer{}, nil)))
	cfg := troupe.ClusterConfig{StableAfter: 300 * time.Millisecond}
	c, err := troupe.StartCluster(ctxFor(t), home, cfg)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Seeds = []string{home.Addrs()[0].String()}
	if _, err := troupe.StartCluster(ctxFor(t), away, cfg); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 10*time.Second, "two members up", func() bool {
		up := 0
		for _, m := range c.Members() {
			if m.Status == troupe.MemberUp {
				up++
			}
		}
		return up == 2
	})
	if b := home.Stats().ClusterBlocked; b != "" {
		t.Fatalf("a healthy cluster says it is blocked: %s", b)
	}
	f.Kill(away) // a crash: no leave
	awayAddr := away.Addrs()[0].String()
	waitUntil(t, 10*time.Second, "Stats to say the cluster is blocked", func() bool {
		return home.Stats().ClusterBlocked != ""
	})
	want := "troupe down " + awayAddr + " --node " + home.Addrs()[0].String()
	if b := home.Stats().ClusterBlocked; !strings.Contains(b, want) {
		t.Errorf("Stats.ClusterBlocked = %q, want it to name %q", b, want)
	}
	// The debug page says it in a banner at the top.
	rec := httptest.NewRecorder()
	home.DebugHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/debug/troupe", nil))
	if page := rec.Body.String(); !strings.Contains(page, `<p id="banner" class="banner bad">`) || !strings.Contains(page, want) || strings.Index(page, `id="banner"`) > strings.Index(page, `id="peers"`) {
		t.Errorf("the debug page has no banner above the peers naming %q:\n%s", want, page)
	}
	// Logged once, however long it lasts.
	time.Sleep(500 * time.Millisecond) // more turns of the loop, each of which could log again
	if got := strings.Count(logs.String(), "cluster blocked"); got != 1 {
		t.Errorf("logged %d times, want once:\n%s", got, logs.String())
	}
	if err := c.Down(awayAddr); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 10*time.Second, "the block to clear once the member is downed", func() bool {
		return home.Stats().ClusterBlocked == ""
	})
}

// A watcher of an actor on a cluster member that crashes gets Terminated
// once the member is downed: members are exempt from the association's
// quarantine, so the downing is what ends the watch. (The nemesis found
// this: before, the watch waited for ever.)
func TestAWatchOfADownedMemberEnds(t *testing.T) {
	t.Parallel()
	f := new(troupe.FaultNet)
	var nodes []*troupe.Node
	var members []*troupe.Cluster
	for i := range 3 {
		n, err := f.Start(ctxFor(t), troupe.Config{Name: fmt.Sprintf("m%d", i), Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
			HeartbeatInterval: 20 * time.Millisecond, UnreachableAfter: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { n.Close() })
		cfg := troupe.ClusterConfig{Downing: troupe.KeepMajority(), StableAfter: 300 * time.Millisecond}
		if i > 0 {
			cfg.Seeds = []string{nodes[0].Addrs()[0].String()}
		}
		c, err := troupe.StartCluster(ctxFor(t), n, cfg)
		if err != nil {
			t.Fatal(err)
		}
		nodes, members = append(nodes, n), append(members, c)
	}
	waitUntil(t, 10*time.Second, "three members up", func() bool {
		up := 0
		for _, m := range members[0].Members() {
			if m.Status == troupe.MemberUp {
				up++
			}
		}
		return up == 3
	})
	if _, err := troupe.Spawn(nodes[2], "worker", troupe.Behavior[string]{Receive: func(*troupe.Context[string], string) {}}); err != nil {
		t.Fatal(err)
	}
	worker, err := troupe.Resolve[string](ctxFor(t), nodes[0], troupe.FormatRef(nodes[2].Addrs()[0], "/user/worker"))
	if err != nil {
		t.Fatal(err)
	}
	terms := make(chan troupe.Terminated, 4)
	watching := make(chan struct{})
	w, err := troupe.Spawn(nodes[0], "watcher", troupe.Behavior[troupe.Ref[string]]{
		Receive: func(c *troupe.Context[troupe.Ref[string]], r troupe.Ref[string]) { c.Watch(r); close(watching) },
		Signal: func(_ *troupe.Context[troupe.Ref[string]], s troupe.Signal) {
			if term, ok := s.(troupe.Terminated); ok {
				terms <- term
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	w.Tell(worker)
	within(t, watching, 5*time.Second, "the watch")
	f.Kill(nodes[2])
	term := within(t, terms, 15*time.Second, "Terminated for the crashed member's actor")
	if !errors.Is(term.Reason, troupe.ErrPeerUnreachable) {
		t.Errorf("Terminated.Reason = %v, want ErrPeerUnreachable", term.Reason)
	}
	waitUntil(t, 10*time.Second, "the crashed member removed", func() bool {
		for _, m := range members[0].Members() {
			if m.UID == nodes[2].UID() {
				return m.Status == troupe.MemberRemoved
			}
		}
		return true
	})
	select {
	case again := <-terms:
		t.Errorf("a second Terminated: %+v", again)
	default:
	}
}

// A member whose cluster is closed while its leave cannot finish (here a
// crashed member, not yet downed, holds the cluster's convergence back),
// and whose node goes on running, stops counting as a member that is up
// and must see every state: the others remove it, and the cluster moves
// on — the crashed member is removed, a joiner comes up. Before, its node
// went on answering heartbeats, so it never became unreachable; it never
// confirmed a state either, and the cluster could not converge again for
// as long as its node ran. The others saw it leaving, so its node goes on
// as a plain peer.
func TestAClusterClosedMidLeaveDoesNotHoldTheOthers(t *testing.T) {
	t.Parallel()
	slowTest(t)
	f := new(troupe.FaultNet)
	// The crashed member is downed StableAfter after it is found
	// unreachable: well after the closing member's leave has given up
	// (its wait is 1 s at this gossip interval).
	cfg := troupe.ClusterConfig{Downing: troupe.KeepMajority(), StableAfter: 4 * time.Second}
	nodes, members := registrylessCluster(t, f, cfg, "a", "b", "c", "d")
	f.Kill(nodes[3])
	waitUntil(t, 10*time.Second, "the crashed member unreachable", func() bool {
		return slices.ContainsFunc(members[0].Unreachable(), func(m troupe.Member) bool { return m.UID == nodes[3].UID() })
	})
	spawnEcho(t, nodes[2])
	members[2].Close() // (its leave waits for a convergence the crash holds back, and gives up)
	if s := members[2].Self().Status; s != troupe.MemberExiting {
		t.Fatalf("the member closed mid-leave sees itself %v; want exiting", s)
	}
	if err := members[2].Err(); !errors.Is(err, troupe.ErrClusterStopped) {
		t.Fatalf("Err() after Close = %v; want ErrClusterStopped", err)
	}
	waitUntil(t, 5*time.Second, "the others to see it exiting", func() bool {
		return memberStatus(members[1], nodes[2].UID()) >= troupe.MemberExiting
	})
	waitUntil(t, 20*time.Second, "the crashed member and the closed one removed", func() bool {
		return memberStatus(members[0], nodes[3].UID()) == troupe.MemberRemoved && memberStatus(members[0], nodes[2].UID()) == troupe.MemberRemoved
	})
	_, e := joinRegistryless(t, f, "e", nodes[:2], cfg)
	waitUntil(t, 10*time.Second, "a joiner up", func() bool { return memberStatus(members[0], e.Self().UID) == troupe.MemberUp })
	// The others saw it leaving: its node goes on as a plain peer.
	askEcho(t, echoAt(t, nodes[0], nodes[2]), 7)
}

// A member that left gracefully, its node running on, is a plain peer of
// the others from then on: each side's heartbeats reach the other, so
// neither gives the other up while they exchange nothing else, and its
// actors answer. Before, the others stopped sending it heartbeats once it
// no longer watched them, and its node, no longer a member, gave them
// all up after UnreachableAfter.
func TestALeftMembersNodeGoesOnAsAPlainPeer(t *testing.T) {
	t.Parallel()
	slowTest(t)
	f := new(troupe.FaultNet)
	nodes, members := registrylessCluster(t, f, troupe.ClusterConfig{}, "a", "b", "c")
	spawnEcho(t, nodes[2])
	echo := echoAt(t, nodes[0], nodes[2])
	lost := make(chan troupe.PeerUnreachable, 8)
	for _, n := range nodes {
		troupe.SubscribeChan(n, lost)
	}
	if err := members[2].Leave(ctxFor(t)); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 10*time.Second, "the leaver removed", func() bool { return memberStatus(members[0], nodes[2].UID()) == troupe.MemberRemoved })
	// A member that joins after the removal, and first hears of the
	// leaver as removed, meets its node as a plain peer too.
	late, _ := joinRegistryless(t, f, "d", nodes[:1], troupe.ClusterConfig{})
	troupe.SubscribeChan(late, lost)
	lateEcho := echoAt(t, late, nodes[2])
	// Nothing but heartbeats between them for twice the window
	// (UnreachableAfter is 2 s here).
	quietFor(t, lost, 4*time.Second, "after the leave")
	askEcho(t, echo, 1)
	askEcho(t, lateEcho, 2)
}

// Without a downing strategy, a member closed mid-leave is counted out
// at once (exiting), but the crashed member still blocks the cluster
// until it is downed by hand; then both are removed.
func TestAClusterClosedMidLeaveWithoutAStrategyWaitsForAManualDown(t *testing.T) {
	t.Parallel()
	slowTest(t)
	f := new(troupe.FaultNet)
	nodes, members := registrylessCluster(t, f, troupe.ClusterConfig{}, "a", "b", "c", "d")
	f.Kill(nodes[3])
	waitUntil(t, 10*time.Second, "the crashed member unreachable", func() bool {
		return slices.ContainsFunc(members[0].Unreachable(), func(m troupe.Member) bool { return m.UID == nodes[3].UID() })
	})
	members[2].Close()
	status := func(uid troupe.NodeUID) troupe.MemberStatus { return memberStatus(members[0], uid) }
	waitUntil(t, 5*time.Second, "the closed member seen exiting", func() bool { return status(nodes[2].UID()) == troupe.MemberExiting })
	if s := status(nodes[3].UID()); s != troupe.MemberUp {
		t.Fatalf("the crashed member is %v with no strategy and no manual down; want up (and unreachable)", s)
	}
	if err := members[1].Down(nodes[3].Addrs()[0].String()); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 10*time.Second, "both removed", func() bool {
		return status(nodes[2].UID()) == troupe.MemberRemoved && status(nodes[3].UID()) == troupe.MemberRemoved
	})
	// What the closed cluster left answering at its path gives way to a
	// cluster started next on the node.
	again, err := troupe.StartCluster(ctxFor(t), nodes[2], troupe.ClusterConfig{})
	if err != nil {
		t.Fatalf("a cluster started on the node after one closed mid-leave: %v", err)
	}
	defer again.Close()
	if s := again.Self().Status; s != troupe.MemberUp {
		t.Fatalf("the new cluster's first member is %v; want up", s)
	}
}

// A member closed mid-leave while a cut keeps its farewell from the
// others: its node runs on and gives them up as silent peers, without
// quarantining them; when the cut heals, they reach it again, learn that
// it is exiting, and remove it, and its node is a plain peer of theirs
// from then on. None of them downs itself for being refused by a node
// that is no longer a member (before, its node had quarantined them, and
// each member it refused downed itself).
func TestAClusterClosedAcrossACutIsRemovedWhenItHeals(t *testing.T) {
	t.Parallel()
	slowTest(t)
	f := new(troupe.FaultNet)
	nodes, members := registrylessCluster(t, f, troupe.ClusterConfig{}, "a", "b", "c")
	spawnEcho(t, nodes[2])
	lost := make(chan troupe.PeerUnreachable, 8)
	troupe.SubscribeChan(nodes[2], lost)
	// On failure: every session as it stands, and what befell the
	// others' sessions with the closed member's node on the way.
	var linkMu sync.Mutex
	var links []string
	for _, n := range nodes[:2] {
		troupe.Subscribe(n, func(e troupe.PeerLinkLost) {
			linkMu.Lock()
			links = append(links, fmt.Sprintf("%v %s: link to %s lost: %v", time.Now().Format("15:04:05.000"), n.Name(), e.Name, e.Cause))
			linkMu.Unlock()
		})
		troupe.Subscribe(n, func(e troupe.PeerUnreachable) {
			linkMu.Lock()
			links = append(links, fmt.Sprintf("%v %s: %s given up (quarantined %v): %v", time.Now().Format("15:04:05.000"), n.Name(), e.Name, e.Quarantined, e.Reason))
			linkMu.Unlock()
		})
	}
	defer func() {
		if t.Failed() {
			for _, n := range nodes {
				for _, p := range n.Stats().Peers {
					t.Logf("%s's session with %s: %s, dialed here %v, last heard %v", n.Name(), p.Name, p.State, p.Outbound, p.LastHeard)
				}
			}
			linkMu.Lock()
			for _, l := range links {
				t.Log(l)
			}
			linkMu.Unlock()
		}
	}()
	// Its node holds a session with each of the others when the cut
	// begins (the cluster may form before the last one is up), so that
	// it has each to give up.
	waitUntil(t, 10*time.Second, "the closed member's sessions with both up", func() bool {
		up := 0
		for _, p := range nodes[2].Stats().Peers {
			if p.State == "up" && (p.UID == nodes[0].UID() || p.UID == nodes[1].UID()) {
				up++
			}
		}
		return up == 2
	})
	f.Partition(nodes[2], nodes[0])
	f.Partition(nodes[2], nodes[1])
	waitUntil(t, 10*time.Second, "the cut seen", func() bool {
		return slices.ContainsFunc(members[0].Unreachable(), func(m troupe.Member) bool { return m.UID == nodes[2].UID() })
	})
	members[2].Close() // (the leave cannot finish across the cut; the farewell reaches nobody)
	for range 2 {
		if e := within(t, lost, 10*time.Second, "the closed member's node giving the others up"); e.Quarantined {
			t.Fatalf("the closed member's node quarantined a member that may not know it left: %+v", e)
		}
	}
	f.Heal()
	defer func() {
		if t.Failed() {
			for i, c := range members {
				t.Logf("member %d: err %v, members %+v, unreachable %+v", i, c.Err(), c.Members(), c.Unreachable())
			}
		}
	}()
	waitUntil(t, 10*time.Second, "the closed member removed", func() bool { return memberStatus(members[0], nodes[2].UID()) == troupe.MemberRemoved })
	for i, c := range members[:2] {
		if err := c.Err(); err != nil || c.Self().Status != troupe.MemberUp {
			t.Fatalf("member %d: %v, %v; want up", i, c.Self().Status, err)
		}
	}
	echo := echoAt(t, nodes[0], nodes[2])
	// From here its node is a plain peer of theirs: nothing but
	// heartbeats for twice the window (UnreachableAfter is 2 s here),
	// and nobody is given up.
	after := make(chan troupe.PeerUnreachable, 8)
	for _, n := range nodes {
		troupe.SubscribeChan(n, after)
	}
	quietFor(t, after, 4*time.Second, "after the heal")
	askEcho(t, echo, 7)
}

// spawnEcho spawns on n an actor, /user/echo, that answers each job with
// its number.
func spawnEcho(t *testing.T, n *troupe.Node) {
	t.Helper()
	if _, err := troupe.Spawn(n, "echo", troupe.Behavior[job]{Receive: func(_ *troupe.Context[job], j job) {
		j.Reply.Tell(fmt.Sprint(j.N))
	}}); err != nil {
		t.Fatal(err)
	}
}

// echoAt resolves, from n, the echo spawnEcho started on at.
func echoAt(t *testing.T, n, at *troupe.Node) troupe.Ref[job] {
	t.Helper()
	r, err := troupe.Resolve[job](ctxFor(t), n, troupe.FormatRef(at.Addrs()[0], "/user/echo"))
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// askEcho asks the echo at r for i, and fails the test unless it answers.
func askEcho(t *testing.T, r troupe.Ref[job], i int) {
	t.Helper()
	if got, err := troupe.Ask(ctxFor(t), r, func(to troupe.Ref[string]) job { return job{N: i, Reply: to} }); err != nil || got != fmt.Sprint(i) {
		t.Fatalf("the echo on the member that left answered %q, %v; want %d", got, err, i)
	}
}

// memberStatus is uid's status in c's view: MemberRemoved for one c does
// not know (never heard of, or forgotten).
func memberStatus(c *troupe.Cluster, uid troupe.NodeUID) troupe.MemberStatus {
	for _, m := range c.Members() {
		if m.UID == uid {
			return m.Status
		}
	}
	return troupe.MemberRemoved
}

// quietFor fails the test if a peer is given up (on ch) within d.
func quietFor(t *testing.T, ch <-chan troupe.PeerUnreachable, d time.Duration, when string) {
	t.Helper()
	select {
	case e := <-ch:
		t.Fatalf("a peer was given up %s: %+v", when, e)
	case <-time.After(d):
	}
}
