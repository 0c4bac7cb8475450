// Command split_brain shows the partition of examples/partition again, but
// between two members of a cluster that resolves splits with a lease.
//
// Without a cluster, both nodes conclude the other is gone and both carry
// on: two contradictory guesses. Here the two members use LeaseMajority
// with a lease served by a third node, the arbiter, which lives outside the
// partition. When the network between home and away breaks — and away also
// loses the arbiter — each side's leader tries to take the lease. Home
// gets it and downs away; away cannot get it and downs itself. One side
// survives, and which one is a fact, not a guess.
//
// Run it with: go run ./examples/split_brain
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

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := run(ctx, os.Stdout); err != nil {
		log.Fatal(err)
	}
}

// journal collects a node's lines, each printed once.
type journal struct {
	mu    sync.Mutex
	lines []string
	seen  map[string]bool
}

func (j *journal) add(line string) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.seen == nil {
		j.seen = map[string]bool{}
	}
	if !j.seen[line] {
		j.seen[line] = true
		j.lines = append(j.lines, line)
	}
}

func run(ctx context.Context, w io.Writer) error {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	nodeCfg := func(name string) troupe.Config {
		return troupe.Config{Name: name, Logger: quiet, HeartbeatInterval: 20 * time.Millisecond, UnreachableAfter: 2 * time.Second}
	}
	network := new(troupe.FaultNet)
	arbiter, err := network.Start(ctx, nodeCfg("arbiter"))
	if err != nil {
		return err
	}
	defer arbiter.Close()
	if err := arbiter.ServeLeases(); err != nil {
		return err
	}
	serving := time.Now()

	type side struct {
		name    string
		node    *troupe.Node
		cluster *troupe.Cluster
		lease   troupe.Lease
		lines   journal
	}
	var sides []*side
	names := map[troupe.NodeUID]string{} // complete before any event can fire
	for _, name := range []string{"home", "away"} {
		n, err := network.Start(ctx, nodeCfg(name))
		if err != nil {
			return err
		}
		defer n.Close()
		names[n.UID()] = name
		sides = append(sides, &side{name: name, node: n, lease: troupe.NewNodeLease(n, arbiter.Addrs()[0].String(), "split-brain", time.Second)})
	}
	for i, s := range sides {
		troupe.Subscribe(s.node, func(e troupe.MemberEvent) {
			who := names[e.Member.UID]
			switch {
			case e.Kind == "unreachable":
				s.lines.add(fmt.Sprintf("%s: %s is unreachable", s.name, who))
			case e.Kind != "status" || e.Member.Status != troupe.MemberDown:
			case e.Member.UID == s.node.UID():
				s.lines.add(fmt.Sprintf("%s: could not take the lease, so it downed itself", s.name))
			case s.lease.CheckHeld(s.node.UID().String()):
				s.lines.add(fmt.Sprintf("%s: holds the lease, so it downed %s and keeps serving", s.name, who))
			}
		})
		cfg := troupe.ClusterConfig{
			Downing: troupe.LeaseMajority(), Lease: s.lease,
			StableAfter: 300 * time.Millisecond, LeaseMinorityDelay: 100 * time.Millisecond,
			GossipInterval: 20 * time.Millisecond,
			Detector: func() troupe.FailureDetector {
				d := &troupe.PhiAccrual{}
				d.FirstHeartbeatEstimate, d.AcceptableHeartbeatPause, d.MinStdDeviation = 20*time.Millisecond, 200*time.Millisecond, 5*time.Millisecond
				return d
			},
		}
		if i > 0 {
			cfg.Seeds = []string{sides[0].node.Addrs()[0].String()}
		}
		c, err := troupe.StartCluster(ctx, s.node, cfg)
		if err != nil {
			return err
		}
		defer c.Close()
		s.cluster = c
	}
	home, away := sides[0], sides[1]
	defer network.Heal() // runs first on the way out, so the nodes close without waiting on a cut network
	if err := waitUntil(ctx, func() bool {
		for _, s := range sides {
			up := 0
			for _, m := range s.cluster.Members() {
				if m.Status == troupe.MemberUp {
					up++
				}
			}
			if up != 2 {
				return false
			}
		}
		return true
	}); err != nil {
		return err
	}
	// A lease server grants nothing for one TTL after it starts (it may
	// have forgotten a grant of an earlier run); in a deployment it has
	// long been running when a split comes.
	time.Sleep(time.Until(serving.Add(time.Second)))
	for _, s := range sides {
		s.lines.add(fmt.Sprintf("%s: cluster up with 2 members", s.name))
	}

	// The network breaks between the members, and away loses the arbiter
	// too. Both sides are alive; only one may carry on.
	network.Partition(home.node, away.node)
	network.Partition(away.node, arbiter)

	select {
	case <-away.cluster.Done():
	case <-ctx.Done():
		return ctx.Err()
	}
	if err := waitUntil(ctx, func() bool {
		for _, m := range home.cluster.Members() {
			if m.UID == away.node.UID() {
				return m.Status >= troupe.MemberDown
			}
		}
		return false
	}); err != nil {
		return err
	}
	home.lines.add("home: the split is resolved; home survived")
	for _, s := range sides {
		for _, l := range s.lines.lines {
			fmt.Fprintln(w, l)
		}
	}
	return nil
}

// waitUntil polls cond until it holds or ctx ends.
func waitUntil(ctx context.Context, cond func() bool) error {
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for !cond() {
		select {
		case <-t.C:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}
