// Command partition shows two live nodes, a broken network between them,
// and both of them wrong about the other.
//
// Nothing dies here. Both nodes run the whole time and keep serving their
// own callers; only the network between them breaks. Each concludes that
// the other is gone, tells its watchers so, quarantines the other and stops
// sending. Both conclusions are wrong, and both are the best a single node
// can do: silence looks the same whether the peer is dead, paused,
// overloaded or cut off. Healing the network repairs nothing on its own —
// the watchers were already told that live actors stopped — so the last
// line happens only because the program explicitly clears the quarantine
// and reconnects. (A cluster with a lease decides such splits instead; see
// the README.)
//
// Run it with: go run ./examples/partition
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"os"
	"sync"
	"time"

	"troupe"
)

// Poked proves that the actor on the other node is still working.
type Poked struct{ By string }

// Poke carries a reply address, to show the link working before it breaks.
type Poke struct {
	By      string
	ReplyTo troupe.Ref[Poked]
}

func init() {
	troupe.SetWireKey[Poke]("partition.poke")
	troupe.SetWireKey[Poked]("partition.poked")
}

// journal collects one node's lines; actors and event callbacks add to it.
type journal struct {
	mu    sync.Mutex
	lines []string
}

func (j *journal) add(format string, args ...any) {
	j.mu.Lock()
	j.lines = append(j.lines, fmt.Sprintf(format, args...))
	j.mu.Unlock()
}

// steady answers every poke, and keeps answering through everything.
func steady(j *journal, node string, answered chan<- struct{}) troupe.Behavior[Poke] {
	return troupe.Behavior[Poke]{Receive: func(_ *troupe.Context[Poke], m Poke) {
		j.add("%s: poked by %s, still working", node, m.By)
		m.ReplyTo.Tell(Poked{By: node})
		answered <- struct{}{}
	}}
}

// mourner watches the other node's actor and reports its "death".
func mourner(remote troupe.Ref[Poke], j *journal, node string, watching, bereaved chan<- struct{}) troupe.Behavior[Poked] {
	return troupe.Behavior[Poked]{
		Setup: func(c *troupe.Context[Poked]) {
			c.Watch(remote)
			close(watching)
		},
		Receive: func(*troupe.Context[Poked], Poked) {},
		Signal: func(_ *troupe.Context[Poked], s troupe.Signal) {
			if t, ok := s.(troupe.Terminated); ok {
				// It is not dead: it is on the other side of a partition,
				// answering somebody else. Nothing in this signal says so,
				// and nothing could.
				j.add("%s: told that %s has stopped", node, t.Ref.Path())
				close(bereaved)
			}
		},
	}
}

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := run(ctx, os.Stdout); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context, w io.Writer) error {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	// Short enough for an example. In production the window is seconds,
	// and comfortably longer than the heartbeat interval, or an ordinary
	// slow moment reads as a dead node.
	cfg := func(name string) troupe.Config {
		return troupe.Config{Name: name, Logger: quiet, HeartbeatInterval: 20 * time.Millisecond, UnreachableAfter: 500 * time.Millisecond}
	}
	network := new(troupe.FaultNet)
	here, err := network.Start(ctx, cfg("home"))
	if err != nil {
		return err
	}
	defer here.Close()
	there, err := network.Start(ctx, cfg("away"))
	if err != nil {
		return err
	}
	defer there.Close()

	var homeLines, awayLines journal
	for _, side := range []struct {
		n *troupe.Node
		j *journal
	}{{here, &homeLines}, {there, &awayLines}} {
		sub := troupe.Subscribe(side.n, func(e troupe.PeerUnreachable) {
			verdict := "link ended"
			if e.Quarantined {
				verdict = "quarantined"
			}
			side.j.add("%s: gave up on %s, %s", side.n.Name(), e.Name, verdict)
		})
		// Stop listening before the nodes close: a node closing is not news.
		defer sub.Unsubscribe()
	}

	homeAnswered, awayAnswered := make(chan struct{}, 1), make(chan struct{}, 1)
	hereActor, err := troupe.Spawn(here, "steady", steady(&homeLines, "home", homeAnswered))
	if err != nil {
		return err
	}
	thereActor, err := troupe.Spawn(there, "steady", steady(&awayLines, "away", awayAnswered))
	if err != nil {
		return err
	}
	toThere, err := troupe.Resolve[Poke](ctx, here, troupe.FormatRef(there.Addrs()[0], "/user/steady"))
	if err != nil {
		return err
	}
	toHere, err := troupe.Resolve[Poke](ctx, there, troupe.FormatRef(here.Addrs()[0], "/user/steady"))
	if err != nil {
		return err
	}
	homeWatching, awayWatching := make(chan struct{}), make(chan struct{})
	homeBereaved, awayBereaved := make(chan struct{}), make(chan struct{})
	hereWatcher, err := troupe.Spawn(here, "mourner", mourner(toThere, &homeLines, "home", homeWatching, homeBereaved))
	if err != nil {
		return err
	}
	thereWatcher, err := troupe.Spawn(there, "mourner", mourner(toHere, &awayLines, "away", awayWatching, awayBereaved))
	if err != nil {
		return err
	}
	<-homeWatching
	<-awayWatching

	toThere.Tell(Poke{By: "home", ReplyTo: hereWatcher})
	if err := wait(ctx, awayAnswered); err != nil {
		return err
	}
	toHere.Tell(Poke{By: "away", ReplyTo: thereWatcher})
	if err := wait(ctx, homeAnswered); err != nil {
		return err
	}

	// Nothing dies. The two nodes simply stop hearing each other.
	network.Partition(here, there)
	if err := wait(ctx, homeBereaved, awayBereaved); err != nil {
		return err
	}

	// Both still do their own work, each believing the other is gone.
	hereActor.Tell(Poke{By: "home itself", ReplyTo: hereWatcher})
	thereActor.Tell(Poke{By: "away itself", ReplyTo: thereWatcher})
	if err := wait(ctx, homeAnswered, awayAnswered); err != nil {
		return err
	}

	// The network is fine again, and nothing reconnects: quietly resuming
	// would leave both nodes with contradictory beliefs and no moment at
	// which either could notice.
	network.Heal()
	if _, err := troupe.Resolve[Poke](ctx, here, troupe.FormatRef(there.Addrs()[0], "/user/steady")); !errors.Is(err, troupe.ErrQuarantined) {
		return fmt.Errorf("expected the quarantine to hold after the heal, got %v", err)
	}
	homeLines.add("home: network repaired, and still no association")

	if _, err := there.ClearQuarantine(ctx, here.Addrs()[0].String()); err != nil {
		return err
	}
	if _, err := here.ClearQuarantine(ctx, there.Addrs()[0].String(), troupe.Reconnect()); err != nil {
		return err
	}
	homeLines.add("home: reconnected, because somebody decided to")

	for _, line := range append(homeLines.lines, awayLines.lines...) {
		fmt.Fprintln(w, line)
	}
	return nil
}

// wait receives once from each channel, or gives up with ctx.
func wait(ctx context.Context, chans ...<-chan struct{}) error {
	for _, ch := range chans {
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}
