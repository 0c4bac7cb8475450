package troupe_test

import (
	"errors"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"troupe"
)

// A watcher's reason does not depend on the role of the node that died:
// the node that became the registrar by the bootstrap rule (exempt from
// quarantine) and a plain node, both killed, give their watchers
// Terminated wrapping ErrPeerUnreachable, and the PeerUnreachable events
// wrap it too (Quarantined says which one was quarantined).
func TestAWatchersReasonDoesNotDependOnTheRoleOfTheNodeThatDied(t *testing.T) {
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
	if !reg.Stats().Registrar {
		t.Fatal("the first node did not become the registrar")
	}
	plain, w := start("plain"), start("watching")
	gone := make(chan troupe.PeerUnreachable, 8)
	troupe.SubscribeChan(w, gone)
	terms := make(chan troupe.Terminated, 4)
	watching := make(chan struct{}, 2)
	watcher, err := troupe.Spawn(w, "watcher", troupe.Behavior[troupe.Ref[string]]{
		Receive: func(c *troupe.Context[troupe.Ref[string]], r troupe.Ref[string]) { c.Watch(r); watching <- struct{}{} },
		Signal: func(_ *troupe.Context[troupe.Ref[string]], s troupe.Signal) {
			if term, ok := s.(troupe.Terminated); ok {
				terms <- term
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []*troupe.Node{reg, plain} {
		if _, err := troupe.Spawn(n, "target", troupe.Behavior[string]{Receive: func(*troupe.Context[string], string) {}}); err != nil {
			t.Fatal(err)
		}
		target, err := troupe.Resolve[string](ctxFor(t), w, troupe.FormatRef(n.Addrs()[0], "/user/target"))
		if err != nil {
			t.Fatal(err)
		}
		watcher.Tell(target)
		within(t, watching, 5*time.Second, "the watch")
	}
	f.Kill(reg)
	f.Kill(plain)
	for range 2 {
		term := within(t, terms, 15*time.Second, "Terminated for a killed node's actor")
		if !errors.Is(term.Reason, troupe.ErrPeerUnreachable) {
			t.Errorf("Terminated for %v: %v, want a reason wrapping ErrPeerUnreachable", term.Ref, term.Reason)
		}
	}
	for seen := map[troupe.NodeUID]bool{}; len(seen) < 2; {
		ev := within(t, gone, 15*time.Second, "PeerUnreachable for a killed node")
		if ev.UID != reg.UID() && ev.UID != plain.UID() {
			continue
		}
		seen[ev.UID] = true
		if !errors.Is(ev.Reason, troupe.ErrPeerUnreachable) {
			t.Errorf("PeerUnreachable for %s: %v, want a reason wrapping ErrPeerUnreachable", ev.Name, ev.Reason)
		}
		if ev.UID == plain.UID() && !ev.Quarantined {
			t.Errorf("the plain node was not quarantined: %+v", ev)
		}
	}
}
