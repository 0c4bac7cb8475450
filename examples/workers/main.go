// Command workers spreads jobs over a pool of workers on three nodes,
// behind a consistent-hash router, and kills one node midway.
//
// Nine workers, three on each of the nodes w1, w2 and w3, register under
// one service key. The node "front" (the registrar) runs a router over
// that key that sends every job of a customer to the same worker. Then w2
// vanishes without a goodbye (the fault network cuts it off and closes
// it): the registrar gives up on it within its window, the router's
// listing loses w2's workers — pushed, nothing polls — and only the
// customers that w2's workers served move; every other customer keeps
// its worker.
//
// Run it with: go run ./examples/workers
package main

import (
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"os"
	"strings"
	"time"

	"troupe"
)

// Job is a piece of work for a customer; the worker answers with its name.
type Job struct {
	Customer string
	ReplyTo  troupe.Ref[string]
}

func init() { troupe.SetWireKey[Job]("workers.job") }

var workersKey = troupe.ServiceKey[Job]{Name: "workers"}

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := run(ctx, os.Stdout); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context, w io.Writer) error {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	registry := l.Addr().String()
	l.Close()
	f := new(troupe.FaultNet)
	defer f.Heal()
	start := func(name string) (*troupe.Node, error) {
		return f.Start(ctx, troupe.Config{Name: name, RegistryAddrs: []string{registry},
			HeartbeatInterval: 100 * time.Millisecond, UnreachableAfter: 2 * time.Second,
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	}
	front, err := start("front")
	if err != nil {
		return err
	}
	defer front.Close()
	nodes := map[string]*troupe.Node{}
	for _, name := range []string{"w1", "w2", "w3"} {
		n, err := start(name)
		if err != nil {
			return err
		}
		defer n.Close()
		nodes[name] = n
		for i := 1; i <= 3; i++ {
			me := fmt.Sprintf("%s-%d", name, i)
			ref, err := troupe.Spawn(n, me, troupe.Behavior[Job]{Receive: func(_ *troupe.Context[Job], j Job) { j.ReplyTo.Tell(me) }})
			if err != nil {
				return err
			}
			if err := workersKey.Register(n, ref); err != nil {
				return err
			}
		}
	}
	router, err := troupe.SpawnGroupRouter(front, "jobs", workersKey, troupe.ConsistentHash(func(j Job) string { return j.Customer }))
	if err != nil {
		return err
	}
	var customers []string
	for i := range 30 {
		customers = append(customers, fmt.Sprintf("customer-%02d", i))
	}

	before, err := serveAll(ctx, router, customers, 9)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "front: 9 workers on 3 nodes serve %d customers, each always by the same worker\n", len(customers))

	f.Kill(nodes["w2"])
	fmt.Fprintln(w, "front: w2 vanished")
	after, err := serveAll(ctx, router, customers, 6)
	if err != nil {
		return err
	}
	fmt.Fprintln(w, "front: 6 workers on 2 nodes serve them now")
	movedFromW2, keptElse := true, true
	moved := 0
	for _, c := range customers {
		wasW2 := strings.HasPrefix(before[c], "w2-")
		if before[c] != after[c] {
			moved++
			movedFromW2 = movedFromW2 && wasW2
		} else if wasW2 {
			movedFromW2 = false // (a w2 worker cannot still serve)
		}
		keptElse = keptElse && (wasW2 || before[c] == after[c])
	}
	fmt.Fprintf(w, "front: only the customers of w2's workers moved: %v\n", movedFromW2 && moved > 0)
	fmt.Fprintf(w, "front: every other customer kept its worker: %v\n", keptElse)
	return nil
}

// serveAll sends a job for every customer through the router until every
// one is answered by workers on a listing of the given size, twice alike
// (the listing is stable), and returns who served whom.
func serveAll(ctx context.Context, router troupe.Ref[Job], customers []string, workers int) (map[string]string, error) {
	var last map[string]string
	for ctx.Err() == nil {
		served, ok := map[string]string{}, true
		distinct := map[string]bool{}
		for _, c := range customers {
			actx, cancel := context.WithTimeout(ctx, time.Second)
			who, err := troupe.Ask(actx, router, func(r troupe.Ref[string]) Job { return Job{Customer: c, ReplyTo: r} })
			cancel()
			if err != nil {
				ok = false // a worker that is gone, still listed for a moment
				break
			}
			served[c] = who
			distinct[who[:2]] = true
		}
		if ok && last != nil && same(last, served) && len(distinct) == workers/3 {
			return served, nil
		}
		if ok {
			last = served
		}
	}
	return nil, ctx.Err()
}

func same(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}
