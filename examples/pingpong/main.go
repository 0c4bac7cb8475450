// Command pingpong runs two troupe nodes in one process, connected over
// loopback TCP: the "ping" node resolves an actor on the "pong" node by its
// ref string, asks it a question, then tells it three pings whose replies
// come back to a local actor through a ref carried inside each message.
//
// Run it with: go run ./examples/pingpong
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

// Ping asks the ponger to answer to ReplyTo. It crosses the wire, so it
// has a wire key; the Ref inside it arrives as a ref the far side can use.
type Ping struct {
	N       int
	ReplyTo troupe.Ref[Pong]
}

// Pong is the answer, and says which node sent it.
type Pong struct {
	N    int
	From string
}

func init() {
	troupe.SetWireKey[Ping]("pingpong.ping")
	troupe.SetWireKey[Pong]("pingpong.pong")
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
	pongNode, err := troupe.Start(ctx, troupe.Config{Name: "pong", Listen: []string{"tcp://127.0.0.1:0"}, Logger: quiet})
	if err != nil {
		return err
	}
	defer pongNode.Close()
	pingNode, err := troupe.Start(ctx, troupe.Config{Name: "ping", Listen: []string{"tcp://127.0.0.1:0"}, Logger: quiet})
	if err != nil {
		return err
	}
	defer pingNode.Close()

	// The ponger answers every Ping to the ref inside it.
	_, err = troupe.Spawn(pongNode, "ponger", troupe.Behavior[Ping]{
		Receive: func(c *troupe.Context[Ping], m Ping) {
			m.ReplyTo.Tell(Pong{N: m.N, From: c.Node().Name()})
		},
	})
	if err != nil {
		return err
	}

	// Find it from the other node by its ref string; the first use dials.
	ponger, err := troupe.Resolve[Ping](ctx, pingNode, troupe.FormatRef(pongNode.Addrs()[0], "/user/ponger"))
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "ping: resolved %s on node %s\n", ponger.Path(), pongNode.Name())

	// Request-reply: Ask makes a temporary reply ref that works across the wire.
	reply, err := troupe.Ask(ctx, ponger, func(r troupe.Ref[Pong]) Ping { return Ping{N: 1, ReplyTo: r} })
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "ping: asked %d, %s answered %d\n", 1, reply.From, reply.N)

	// Fire and forget: replies go to a local actor named in each message.
	done := make(chan struct{})
	got := 0
	collector, err := troupe.Spawn(pingNode, "collector", troupe.Behavior[Pong]{
		Receive: func(_ *troupe.Context[Pong], p Pong) {
			fmt.Fprintf(w, "ping: pong %d from %s\n", p.N, p.From)
			if got++; got == 3 {
				close(done)
			}
		},
	})
	if err != nil {
		return err
	}
	for n := 2; n <= 4; n++ {
		ponger.Tell(Ping{N: n, ReplyTo: collector})
	}
	select {
	case <-done:
	case <-ctx.Done():
		return ctx.Err()
	}
	fmt.Fprintln(w, "ping: done, closing both nodes")
	return nil
}
