package troupe_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"troupe"
)

// faultPair starts two nodes on a fault network with a short window, and
// makes them associate by resolving an actor of b from a.
func faultPair(t *testing.T) (*troupe.FaultNet, *troupe.Node, *troupe.Node) {
	t.Helper()
	f := new(troupe.FaultNet)
	start := func(name string) *troupe.Node {
		n, err := f.Start(ctxFor(t), troupe.Config{Name: name, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
			HeartbeatInterval: 50 * time.Millisecond, UnreachableAfter: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { n.Close() })
		return n
	}
	a, b := start("a"), start("b")
	t.Cleanup(f.Heal) // first: the nodes close without waiting on a cut network
	if _, err := troupe.Spawn(b, "echo", troupe.Behavior[string]{Receive: func(*troupe.Context[string], string) {}}); err != nil {
		t.Fatal(err)
	}
	if _, err := troupe.Resolve[string](ctxFor(t), a, troupe.FormatRef(b.Addrs()[0], "/user/echo")); err != nil {
		t.Fatal(err)
	}
	return f, a, b
}

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// Stats shows a peer while it is up, with the window it has left, and
// the quarantine once it is cut off.
func TestStatsPeersAndQuarantine(t *testing.T) {
	t.Parallel()
	slowTest(t)
	f, a, b := faultPair(t)
	s := a.Stats()
	if len(s.Peers) != 1 {
		t.Fatalf("peers %+v, want b", s.Peers)
	}
	p := s.Peers[0]
	if p.UID != b.UID() || p.State != "up" || p.WindowLeft <= 0 || p.WindowLeft > time.Second || p.BytesIn == 0 || p.BytesOut == 0 || p.Since.IsZero() || p.RoundTrip <= 0 || p.RoundTrip > 5*time.Second {
		t.Fatalf("peer %+v", p)
	}
	unreachable := make(chan troupe.PeerUnreachable, 1)
	sub := troupe.SubscribeChan(a, unreachable)
	defer sub.Unsubscribe()
	f.Partition(a, b)
	within(t, unreachable, 10*time.Second, "PeerUnreachable")
	s = a.Stats()
	if len(s.Quarantined) != 1 || s.Quarantined[0].UID != b.UID() || s.Quarantined[0].Cause == nil {
		t.Fatalf("quarantined %+v, want b with its cause", s.Quarantined)
	}
	for _, p := range s.Peers {
		if p.UID == b.UID() && p.State == "up" {
			t.Fatalf("b is still up: %+v", p)
		}
	}
}

// The deepest mailboxes and the dead letters by reason.
func TestStatsMailboxesAndDeadLetters(t *testing.T) {
	t.Parallel()
	n := quietNode(t, nil)
	release, inside := make(chan struct{}), make(chan struct{}, 1)
	busy, _ := troupe.Spawn(n, "busy", troupe.Behavior[int]{Receive: func(*troupe.Context[int], int) {
		select {
		case inside <- struct{}{}:
		default:
		}
		<-release
	}})
	busy.Tell(0)
	within(t, inside, 10*time.Second, "the first message being handled")
	for i := range 4 {
		busy.Tell(i + 1)
	}
	var depth int
	for deadline := time.Now().Add(10 * time.Second); depth != 4 && time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		s := n.Stats()
		if len(s.Mailboxes) > 0 && s.Mailboxes[0].Path == "/user/busy" {
			depth = s.Mailboxes[0].Waiting
		}
	}
	close(release)
	if depth != 4 {
		t.Fatalf("busy's mailbox depth %d, want the 4 that arrived behind the one being handled", depth)
	}
	gone, _ := troupe.Spawn(n, "gone", troupe.Behavior[int]{Receive: func(c *troupe.Context[int], _ int) { c.Stop() }})
	term := watchOn(t, n, gone)
	gone.Tell(1)
	within(t, term, 10*time.Second, "gone's stop")
	gone.Tell(2)
	gone.Tell(3)
	if got := n.Stats().DeadLetters["actor-stopped"]; got != 2 {
		t.Fatalf("actor-stopped dead letters %d, want 2 (all: %v)", got, n.Stats().DeadLetters)
	}
	if n.Stats().Actors < 2 {
		t.Fatalf("actors %d", n.Stats().Actors)
	}
}

// A cluster member's Stats lists the members and whether each is
// reachable.
func TestStatsClusterMembers(t *testing.T) {
	t.Parallel()
	f := new(troupe.FaultNet)
	var nodes []*troupe.Node
	var members []*troupe.Cluster
	for i := range 2 {
		n, err := f.Start(ctxFor(t), troupe.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), HeartbeatInterval: 20 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { n.Close() })
		cfg := troupe.ClusterConfig{}
		if i > 0 {
			cfg.Seeds = []string{nodes[0].Addrs()[0].String()}
		}
		c, err := troupe.StartCluster(ctxFor(t), n, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		nodes, members = append(nodes, n), append(members, c)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		s := nodes[0].Stats()
		if len(s.Members) == 2 && s.Members[0].Status == troupe.MemberUp && s.Members[1].Status == troupe.MemberUp && s.Members[0].Reachable && s.Members[1].Reachable {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("members %+v", s.Members)
		}
		time.Sleep(10 * time.Millisecond)
	}
	var st troupe.Stats
	peer := -1
	for deadline := time.Now().Add(10 * time.Second); peer < 0 && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		st = nodes[0].Stats()
		for i, p := range st.Peers {
			if p.UID == nodes[1].UID() && p.Member && p.MessagesOut > 0 && p.MessagesIn > 0 {
				peer = i
			}
		}
	}
	if peer < 0 || st.Peers[peer].Phi < 0 || st.Peers[peer].Phi >= 8 || st.Peers[peer].WindowLeft != 0 {
		t.Fatalf("the member peer (%d) of %+v, want messages both ways and a low phi", peer, st.Peers)
	}
	if err := members[1].Close(); err != nil && !errors.Is(err, troupe.ErrClusterStopped) {
		t.Fatal(err)
	}
}

// A registrar's Stats count its registrations.
func TestStatsRegistrations(t *testing.T) {
	t.Parallel()
	reg, err := troupe.Start(ctxFor(t), troupe.Config{Name: "reg", RegistryAddrs: []string{"127.0.0.1:0"}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	before := reg.Stats()
	if !before.Registrar {
		t.Fatal("the registrar's Stats do not say it is one")
	}
	if _, err := troupe.Spawn(reg, "billing", troupe.Behavior[string]{Receive: func(*troupe.Context[string], string) {}}); err != nil {
		t.Fatal(err)
	}
	if after := reg.Stats(); after.Registrations != before.Registrations+1 {
		t.Fatalf("registrations %d, then %d after one more actor", before.Registrations, after.Registrations)
	}
}
