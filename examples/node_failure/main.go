// Command node_failure watches an actor on another node and rebuilds the
// work locally when that whole node dies.
//
// The watch is the same call as for a local actor, on a ref that happens to
// point at another process. What differs is what the signal means: locally,
// Terminated is a fact (the actor stopped); across a link it is a
// conclusion (this node stopped hearing from that one). Here the node
// really did die, so the conclusion is right, but nothing in the signal
// says which of the two it was, and nothing can.
//
// What to watch: the second line. The coordinator does not retry against
// the node that is gone; it starts a worker it owns and finishes the job
// there — a failover, not a stall.
//
// Run it with: go run ./examples/node_failure
package main

import (
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"
	"os"
	"time"

	"troupe"
)

// Done is a finished job, and which node finished it.
type Done struct {
	Item  int
	Where string
}

// Job is a unit of work carrying the ref its result goes back to.
type Job struct {
	Item    int
	ReplyTo troupe.Ref[Done]
}

// Assign tells the coordinator to get one job done, wherever it can. It is
// not registered: it never leaves the node that sends it.
type Assign struct{ Item int }

// CoordMsg is the coordinator's protocol: Assign and Done.
type CoordMsg interface{ coord() }

func (Assign) coord() {}
func (Done) coord()   {}

func init() {
	troupe.SetWireKey[Job]("node_failure.job")
	troupe.SetWireKey[Done]("node_failure.done")
}

// worker does the work and says where it was done.
func worker(where string) troupe.Behavior[Job] {
	return troupe.Behavior[Job]{Receive: func(_ *troupe.Context[Job], j Job) {
		j.ReplyTo.Tell(Done{Item: j.Item, Where: where})
	}}
}

// coordinator hands out work and survives losing its worker.
func coordinator(remote troupe.Ref[Job], w io.Writer, finished, lost chan<- struct{}) troupe.Behavior[CoordMsg] {
	current := remote
	var answers troupe.Ref[Done]
	return troupe.Behavior[CoordMsg]{
		Setup: func(c *troupe.Context[CoordMsg]) {
			// One call, and this coordinator can never be left holding a
			// ref to a node that is gone without knowing it.
			c.Watch(remote)
			// The worker replies with Done; the adapter is a Ref[Done] that
			// delivers into this actor, addressable across the link.
			answers = troupe.MessageAdapter(c, func(d Done) CoordMsg { return d })
		},
		Receive: func(_ *troupe.Context[CoordMsg], m CoordMsg) {
			switch m := m.(type) {
			case Assign:
				// An ordinary Tell; whether it crosses a link depends on the
				// ref, and this code does not ask.
				current.Tell(Job{Item: m.Item, ReplyTo: answers})
			case Done:
				fmt.Fprintf(w, "home: job %d done by %s\n", m.Item, m.Where)
				finished <- struct{}{}
			}
		},
		Signal: func(c *troupe.Context[CoordMsg], s troupe.Signal) {
			if _, ok := s.(troupe.Terminated); ok {
				fmt.Fprintln(w, "home: the away node is gone, rebuilding here")
				// A child of this actor: supervised by the one that depends
				// on it, which could never be true of the remote worker.
				local, err := troupe.Spawn(c, "worker", worker("home"))
				if err != nil {
					panic(err)
				}
				current = local
				close(lost)
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

	if _, err := troupe.Spawn(there, "worker", worker("away")); err != nil {
		return err
	}
	remote, err := troupe.Resolve[Job](ctx, here, troupe.FormatRef(there.Addrs()[0], "/user/worker"))
	if err != nil {
		return err
	}
	finished, lost := make(chan struct{}, 1), make(chan struct{})
	boss, err := troupe.Spawn(here, "boss", coordinator(remote, w, finished, lost))
	if err != nil {
		return err
	}

	boss.Tell(Assign{Item: 1})
	if err := wait(ctx, finished); err != nil {
		return err
	}
	// The whole node dies without a word: every watcher of every actor on
	// it finds out when the silence outlasts the window.
	network.Kill(there)
	if err := wait(ctx, lost); err != nil {
		return err
	}
	boss.Tell(Assign{Item: 2})
	return wait(ctx, finished)
}

func wait(ctx context.Context, ch <-chan struct{}) error {
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
