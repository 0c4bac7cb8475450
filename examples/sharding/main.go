// Command sharding runs bank accounts as sharded entities on three
// nodes, and kills one of them midway.
//
// Each node of a cluster of three runs the kind "accounts": an account
// is an actor started on its first message, on the node that runs its
// shard, and addressed by its id from any node. Deposits are sent from
// every node; each account answers with its balance. Then n2 is killed
// without a goodbye: the others down it, wait out the removal margin
// (time for a cut-off side to stop its own entities), and run n2's
// shards themselves. Deposits sent meanwhile are held, not lost; n2's
// accounts begin again from zero, since their balances lived in n2's
// memory (keep state that must outlive a node in a store). No account
// ever runs on two nodes at once.
//
// Run it with: go run ./examples/sharding
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

// Deposit adds Amount to an account, which answers with its balance.
type Deposit struct {
	Amount  int
	ReplyTo troupe.Ref[Balance]
}

// Balance is an account's answer: its balance and the node it runs on.
type Balance struct {
	Total int
	Node  string
}

func init() {
	troupe.SetWireKey[Deposit]("sharding.deposit")
	troupe.SetWireKey[Balance]("sharding.balance")
}

// watch counts the accounts running, per id, in this process (the three
// nodes share it), to show that none ever runs twice.
type watch struct {
	mu      sync.Mutex
	running map[string]int
	twice   bool
}

func (w *watch) account(node string) func(id string) troupe.Behavior[Deposit] {
	return func(id string) troupe.Behavior[Deposit] {
		total := 0
		return troupe.Behavior[Deposit]{
			Setup: func(*troupe.Context[Deposit]) { w.add(id, 1) },
			Receive: func(_ *troupe.Context[Deposit], d Deposit) {
				total += d.Amount
				d.ReplyTo.Tell(Balance{Total: total, Node: node})
			},
			Signal: func(_ *troupe.Context[Deposit], s troupe.Signal) {
				if _, ok := s.(troupe.PostStop); ok {
					w.add(id, -1)
				}
			},
		}
	}
}

func (w *watch) add(id string, d int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.running[id] += d
	w.twice = w.twice || w.running[id] > 1
}

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	if err := run(ctx, os.Stdout); err != nil {
		log.Fatal(err)
	}
}

const accounts = 30

func run(ctx context.Context, w io.Writer) error {
	f := new(troupe.FaultNet)
	defer f.Heal()
	seen := &watch{running: map[string]int{}}
	var nodes []*troupe.Node
	var banks []*troupe.Sharded[Deposit]
	for _, name := range []string{"n1", "n2", "n3"} {
		n, err := f.Start(ctx, troupe.Config{Name: name, HeartbeatInterval: 100 * time.Millisecond, UnreachableAfter: 2 * time.Second,
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			return err
		}
		defer n.Close()
		// The removal margin is never less than LeaseReleaseAfter:
		// StableAfter + DownAllWhenUnstable + LeaseMinorityDelay +
		// max(StableAfter, 1 s) + StableAfter/2 (README, "How long the
		// lease is held"). With no lease, the minority's delay only
		// lengthens it: 1 + 3 + 0.1 + 1 + 0.5 = 5.6 s, not 8.5 s.
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
		bank, err := troupe.Sharding(c, "accounts", seen.account(name), troupe.ShardingConfig{})
		if err != nil {
			return err
		}
		nodes, banks = append(nodes, n), append(banks, bank)
	}

	// 300 deposits of 1, each account's from all three nodes in turn.
	want := map[string]int{}
	where := map[string]string{}
	right, err := deposit(ctx, banks, want, where)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "bank: %d accounts on 3 nodes took 300 deposits sent from every node; balances right: %v\n", accounts, right)

	// Deposits sent once a node sees n2 unreachable are held there until
	// n2's shards run elsewhere (those sent before, into the connection
	// to n2, are lost with it: an Ask would time out).
	var saw []<-chan struct{}
	for _, n := range []*troupe.Node{nodes[0], nodes[2]} {
		saw = append(saw, sees(n, nodes[1].Addrs()[0], "unreachable"))
	}
	f.Kill(nodes[1])
	for _, ch := range saw {
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	fmt.Fprintln(w, "bank: n2 is killed; n1 and n3 see it unreachable")
	banks = []*troupe.Sharded[Deposit]{banks[0], banks[2]}
	for id, node := range where {
		if node == "n2" {
			want[id] = 0 // its balance went with n2
		}
	}
	before := where
	where = map[string]string{}
	right, err = deposit(ctx, banks, want, where)
	if err != nil {
		return err
	}
	moved := true
	for id, node := range before {
		moved = moved && (node == "n2") == (where[id] != node) && where[id] != "n2"
	}
	fmt.Fprintf(w, "bank: n2's accounts run on n1 and n3 now, the others where they were: %v\n", moved)
	fmt.Fprintf(w, "bank: 300 more deposits; balances right (n2's accounts began again from zero): %v\n", right)
	seen.mu.Lock()
	defer seen.mu.Unlock()
	fmt.Fprintf(w, "bank: an account never ran on two nodes at once: %v\n", !seen.twice)
	return nil
}

// deposit sends 10 deposits of 1 to every account, through the banks in
// turn, checks each answer against want (which it updates), and notes
// where each account runs.
func deposit(ctx context.Context, banks []*troupe.Sharded[Deposit], want map[string]int, where map[string]string) (bool, error) {
	right := true
	for i := range 10 * accounts {
		id := fmt.Sprintf("account-%d", i%accounts)
		bank := banks[i%len(banks)]
		actx, cancel := context.WithTimeout(ctx, 60*time.Second)
		b, err := troupe.Ask(actx, bank.Entity(id), func(r troupe.Ref[Balance]) Deposit { return Deposit{Amount: 1, ReplyTo: r} })
		cancel()
		if err != nil {
			return false, fmt.Errorf("deposit to %s: %w", id, err)
		}
		want[id]++
		right = right && b.Total == want[id]
		where[id] = b.Node
	}
	return right, nil
}

// sees returns a channel closed when n publishes a member event of kind
// about the member at addr.
func sees(n *troupe.Node, addr troupe.Addr, kind string) <-chan struct{} {
	events := make(chan troupe.MemberEvent, 64)
	sub := troupe.SubscribeChan(n, events)
	done := make(chan struct{})
	go func() {
		defer sub.Unsubscribe()
		for {
			select {
			case e := <-events:
				if e.Kind == kind && e.Member.Addr == addr {
					close(done)
					return
				}
			case <-n.Done():
				return
			}
		}
	}()
	return done
}

// waitUp waits until c sees want members up.
func waitUp(ctx context.Context, c *troupe.Cluster, want int) error {
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
		case <-ctx.Done():
			return fmt.Errorf("waiting for %d members up: %w", want, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}
