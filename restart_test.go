package troupe_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"troupe"
)

// A process that crashes and is started again at its fixed address is a
// new incarnation, and a quarantine binds the incarnation (its uid), not
// the address: the registrar that quarantined the old one admits the new
// one at once (Start succeeds and registers), so does a plain peer that
// quarantined it, in both directions, and the old incarnation's refs stay
// dead letters.
func TestARestartedProcessAtItsAddressIsAdmittedAtOnce(t *testing.T) {
	t.Parallel()
	slowTest(t)
	free := func() string {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		return l.Addr().String()
	}
	registry, fixed := free(), "tcp://"+free()
	f := new(troupe.FaultNet)
	t.Cleanup(f.Heal)
	start := func(name string, listen ...string) (*troupe.Node, error) {
		n, err := f.Start(ctxFor(t), troupe.Config{Name: name, Listen: listen, RegistryAddrs: []string{registry},
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), HeartbeatInterval: 50 * time.Millisecond, UnreachableAfter: time.Second})
		if err == nil {
			t.Cleanup(func() { n.Close() })
		}
		return n, err
	}
	reg, err := start("registrar")
	if err != nil {
		t.Fatal(err)
	}
	if !reg.Stats().Registrar {
		t.Fatal("no registrar")
	}
	peer, err := start("peer")
	if err != nil {
		t.Fatal(err)
	}
	gone := make(chan troupe.PeerUnreachable, 8)
	troupe.SubscribeChan(peer, gone)
	regGone := make(chan troupe.PeerUnreachable, 8)
	troupe.SubscribeChan(reg, regGone)

	svc, err := start("service", fixed)
	if err != nil {
		t.Fatal(err)
	}
	spawnEchoActor(t, svc, "svc")
	old, err := troupe.WaitForActor[restartPing](ctxFor(t), peer, "svc")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := askN(old, 1); err != nil {
		t.Fatal(err)
	}
	f.Kill(svc) // as kill -9
	for _, ch := range []chan troupe.PeerUnreachable{gone, regGone} {
		for {
			ev := within(t, ch, 15*time.Second, "the crash declared")
			if ev.UID == svc.UID() {
				if !ev.Quarantined {
					t.Fatalf("the crashed incarnation was not quarantined: %+v", ev)
				}
				break
			}
		}
	}

	// The same command starts it again: admitted by the registrar that
	// quarantined the old incarnation.
	again, err := start("service", fixed)
	if err != nil {
		t.Fatalf("Start again at %s: %v", fixed, err)
	}
	spawnEchoActor(t, again, "svc")
	fresh, err := troupe.WaitForActor[restartPing](ctxFor(t), peer, "svc", troupe.WithRegistries(registry))
	if err != nil {
		t.Fatalf("the restarted service's actor: %v", err)
	}
	if fresh.NodeUID() != again.UID() {
		t.Fatalf("found on %v, want the new incarnation %v", fresh.NodeUID(), again.UID())
	}
	// The peer that quarantined the old incarnation reaches the new one.
	if got, err := askN(fresh, 2); err != nil || got != 2 {
		t.Fatalf("Ask of the new incarnation: %d, %v", got, err)
	}
	// And the new incarnation reaches the peer, by its address.
	spawnEchoActor(t, peer, "back")
	back, err := troupe.Resolve[restartPing](ctxFor(t), again, troupe.FormatRef(peer.Addrs()[0], "/user/back"))
	if err != nil {
		t.Fatalf("the new incarnation resolving an actor on the peer: %v", err)
	}
	if _, err := askN(back, 3); err != nil {
		t.Fatal(err)
	}
	// The old incarnation's ref stays dead.
	if _, err := askN(old, 4); err == nil {
		t.Fatal("an Ask through the old incarnation's ref succeeded")
	}
	for _, q := range peer.Stats().Quarantined {
		if q.UID == again.UID() {
			t.Fatalf("the new incarnation is quarantined: %+v", q)
		}
	}
}

// restartPing asks for its N back.
type restartPing struct {
	N       int
	ReplyTo troupe.Ref[int]
}

func init() { troupe.SetWireKey[restartPing]("troupe_test.restartPing") }

func spawnEchoActor(t *testing.T, n *troupe.Node, name string) {
	t.Helper()
	if _, err := troupe.Spawn(n, name, troupe.Behavior[restartPing]{Receive: func(_ *troupe.Context[restartPing], m restartPing) { m.ReplyTo.Tell(m.N) }}); err != nil {
		t.Fatal(err)
	}
}

// askN asks an echo actor for n back.
func askN(to troupe.Ref[restartPing], n int) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return troupe.Ask(ctx, to, func(r troupe.Ref[int]) restartPing { return restartPing{N: n, ReplyTo: r} })
}
