package troupe_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"troupe"
)

// Query and Answer cross the wire in the examples below, so they are
// registered under wire keys (in a program, in an init function).
type Query struct {
	Text    string
	ReplyTo troupe.Ref[Answer]
}

type Answer struct{ Text string }

func init() {
	troupe.SetWireKey[Query]("example.query")
	troupe.SetWireKey[Answer]("example.answer")
}

// quiet is a Config with the node's logs discarded, so that the examples'
// output is only what they print.
func quiet(name string, listen ...string) troupe.Config {
	return troupe.Config{Name: name, Listen: listen, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
}

// echo answers every query on its node.
var echo = troupe.Behavior[Query]{
	Receive: func(c *troupe.Context[Query], q Query) {
		q.ReplyTo.Tell(Answer{Text: q.Text + ", says " + c.Node().Name()})
	},
}

// Resolve finds an actor on another node by its ref string, and Ask
// sends it a request whose reply ref travels across the wire.
func ExampleResolve() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	server, err := troupe.Start(ctx, quiet("server", "tcp://127.0.0.1:0"))
	if err != nil {
		panic(err)
	}
	defer server.Close()
	if _, err := troupe.Spawn(server, "echo", echo); err != nil {
		panic(err)
	}

	client, err := troupe.Start(ctx, quiet("client"))
	if err != nil {
		panic(err)
	}
	defer client.Close()
	ref, err := troupe.Resolve[Query](ctx, client, troupe.FormatRef(server.Addrs()[0], "/user/echo"))
	if err != nil {
		panic(err)
	}
	a, err := troupe.Ask(ctx, ref, func(r troupe.Ref[Answer]) Query { return Query{Text: "hello", ReplyTo: r} })
	fmt.Println(a.Text, err)

	_, err = troupe.Resolve[Query](ctx, client, troupe.FormatRef(server.Addrs()[0], "/user/nobody"))
	fmt.Println(errors.Is(err, troupe.ErrNoSuchActor))
	// Output:
	// hello, says server <nil>
	// true
}

// FindActor and WaitForActor find actors by name through a registrar:
// here the first node becomes the registrar on a free port, and the
// second joins it there.
func ExampleWaitForActor() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cfg := quiet("registrar")
	cfg.RegistryAddrs = []string{"tcp://127.0.0.1:0"}
	registrar, err := troupe.Start(ctx, cfg)
	if err != nil {
		panic(err)
	}
	defer registrar.Close()

	cfg = quiet("service", "tcp://127.0.0.1:0")
	cfg.RegistryAddrs = []string{registrar.Addrs()[0].String()}
	service, err := troupe.Start(ctx, cfg)
	if err != nil {
		panic(err)
	}
	defer service.Close()

	_, err = troupe.FindActor[Query](ctx, registrar, "echo")
	fmt.Println("before spawn, not found:", errors.Is(err, troupe.ErrNotFound))

	waited := make(chan troupe.Ref[Query])
	go func() {
		ref, err := troupe.WaitForActor[Query](ctx, registrar, "echo")
		if err != nil {
			panic(err)
		}
		waited <- ref
	}()
	if _, err := troupe.Spawn(service, "echo", echo); err != nil {
		panic(err)
	}
	ref := <-waited
	a, err := troupe.Ask(ctx, ref, func(r troupe.Ref[Answer]) Query { return Query{Text: "found you", ReplyTo: r} })
	fmt.Println(a.Text, err)
	// Output:
	// before spawn, not found: true
	// found you, says service <nil>
}

// A FaultNet runs nodes in one process over real loopback connections
// that it can cut: after a partition, a watcher learns that the actor
// on the other side is unreachable.
func ExampleFaultNet() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	network := new(troupe.FaultNet)
	fast := func(name string) troupe.Config {
		cfg := quiet(name)
		cfg.HeartbeatInterval = 20 * time.Millisecond
		cfg.UnreachableAfter = 300 * time.Millisecond
		return cfg
	}
	home, err := network.Start(ctx, fast("home"))
	if err != nil {
		panic(err)
	}
	defer home.Close()
	away, err := network.Start(ctx, fast("away"))
	if err != nil {
		panic(err)
	}
	defer away.Close()
	if _, err := troupe.Spawn(away, "echo", echo); err != nil {
		panic(err)
	}
	ref, err := troupe.Resolve[Query](ctx, home, troupe.FormatRef(away.Addrs()[0], "/user/echo"))
	if err != nil {
		panic(err)
	}

	done := make(chan struct{})
	watching := make(chan struct{})
	troupe.Spawn(home, "watcher", troupe.Behavior[string]{
		Setup:   func(c *troupe.Context[string]) { c.Watch(ref); close(watching) },
		Receive: func(*troupe.Context[string], string) {},
		Signal: func(_ *troupe.Context[string], s troupe.Signal) {
			if t, ok := s.(troupe.Terminated); ok {
				fmt.Println("echo terminated; unreachable:", errors.Is(t.Reason, troupe.ErrPeerUnreachable))
				close(done)
			}
		},
	})
	<-watching
	network.Partition(home, away)
	<-done
	network.Heal() // quarantines stay: the nodes close without reconnecting
	// Output: echo terminated; unreachable: true
}
