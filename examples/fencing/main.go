// Command fencing shows why a cluster singleton that writes to a store
// outside the cluster passes its fencing token with every write, and how
// the store uses it.
//
// Three members run the singleton "writer", which writes to one record
// of a store (here a map in this process; in a deployment a database).
// The instance on n1, the oldest, starts a write and stalls in the middle
// of it (a slow disk, a long pause: anything that outlives the cluster's
// timeouts). Meanwhile the network cuts n1 off: n2 and n3 down it, wait
// out the removal margin, and n2 runs the singleton and writes. Then n1's
// stalled write goes on. No timeout could have stopped it, since it was
// already running; but it carries n1's fence, which is less than the one
// the store has seen from n2, and the store refuses it.
//
// Run it with: go run ./examples/fencing
package main

import (
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"
	"os"
	"sync"
	"time"

	"troupe"
)

// Write asks the singleton to write Value to the store.
type Write struct {
	Value string
	Stall bool // stall in the middle of the write, until released
}

func init() { troupe.SetWireKey[Write]("fencing.write") }

// store is a record outside the cluster that keeps the greatest fence it
// has seen, and refuses a write whose fence is less.
type store struct {
	mu      sync.Mutex
	fence   troupe.Fence
	value   string
	written chan string // every write's outcome, in order
}

func (s *store) write(f troupe.Fence, value string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if f.Compare(s.fence) < 0 {
		return fmt.Errorf("refused %q: its fence is older than one the store has seen", value)
	}
	s.fence, s.value = f, value
	return nil
}

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	if err := run(ctx, os.Stdout); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context, w io.Writer) error {
	f := new(troupe.FaultNet)
	defer f.Heal() // runs first on the way out: the nodes close without waiting on a cut network
	st := &store{written: make(chan string, 8)}
	stalled, release := make(chan struct{}), make(chan struct{})
	writer := func(node string) func() troupe.Behavior[Write] {
		return func() troupe.Behavior[Write] {
			return troupe.Behavior[Write]{Receive: func(c *troupe.Context[Write], m Write) {
				fence := c.Fence() // taken when the write begins
				if m.Stall {
					close(stalled)
					<-release
				}
				if err := st.write(fence, m.Value); err != nil {
					st.written <- fmt.Sprintf("store: %s: %v", node, err)
					return
				}
				st.written <- fmt.Sprintf("store: %s wrote %q", node, m.Value)
			}}
		}
	}
	var nodes []*troupe.Node
	var refs []troupe.Ref[Write]
	var clusters []*troupe.Cluster
	for _, name := range []string{"n1", "n2", "n3"} {
		n, err := f.Start(ctx, troupe.Config{Name: name, HeartbeatInterval: 100 * time.Millisecond, UnreachableAfter: 2 * time.Second,
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			return err
		}
		defer n.Close()
		// No lease here: the minority's delay would only lengthen the
		// removal margin (5.6 s with these settings; see
		// examples/sharding).
		cfg := troupe.ClusterConfig{Downing: troupe.KeepMajority(), StableAfter: time.Second,
			DownAllWhenUnstable: 3 * time.Second, LeaseMinorityDelay: 100 * time.Millisecond}
		if len(nodes) > 0 {
			cfg.Seeds = []string{nodes[0].Addrs()[0].String()}
		}
		c, err := troupe.StartCluster(ctx, n, cfg)
		if err != nil {
			return err
		}
		if err := waitUp(ctx, c, len(nodes)+1); err != nil {
			return err
		}
		ref, err := troupe.Singleton(c, "writer", writer(name), troupe.SingletonConfig{})
		if err != nil {
			return err
		}
		nodes, refs, clusters = append(nodes, n), append(refs, ref), append(clusters, c)
	}

	refs[1].Tell(Write{Value: "first"})
	if err := next(ctx, w, st); err != nil {
		return err
	}
	refs[1].Tell(Write{Value: "from n1, stalled", Stall: true})
	select {
	case <-stalled:
	case <-ctx.Done():
		return ctx.Err()
	}
	fmt.Fprintln(w, "n1: the write stalls midway; the network cuts n1 off")
	f.Partition(nodes[0], nodes[1])
	f.Partition(nodes[0], nodes[2])

	// n2 and n3 down n1 and, a removal margin later, run the singleton
	// on n2. A write sent through n3 once it has downed n1 is held until
	// then (one sent before would go toward n1, and be lost in the cut).
	if err := waitDown(ctx, clusters[2], nodes[0].UID()); err != nil {
		return err
	}
	refs[2].Tell(Write{Value: "from n2"})
	if err := next(ctx, w, st); err != nil {
		return err
	}
	fmt.Fprintln(w, "n1: the stalled write goes on")
	close(release)
	return next(ctx, w, st)
}

// next prints the store's next outcome.
func next(ctx context.Context, w io.Writer, st *store) error {
	select {
	case line := <-st.written:
		fmt.Fprintln(w, line)
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// waitDown waits until c sees the member uid down (or removed).
func waitDown(ctx context.Context, c *troupe.Cluster, uid troupe.NodeUID) error {
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for {
		down := true
		for _, m := range c.Members() {
			if m.UID == uid && m.Status < troupe.MemberDown {
				down = false
			}
		}
		if down {
			return nil
		}
		select {
		case <-t.C:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// waitUp waits until c sees want members up.
func waitUp(ctx context.Context, c *troupe.Cluster, want int) error {
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for {
		up := 0
		for _, m := range c.Members() {
			if m.Status == troupe.MemberUp {
				up++
			}
		}
		if up == want {
			return nil
		}
		select {
		case <-t.C:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
