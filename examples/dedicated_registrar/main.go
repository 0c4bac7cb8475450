// Command dedicated_registrar runs the registry as a node of its own — a
// subsystem, not a role of some application's first node — and has a
// service and a sibling client find each other through it.
//
// The registrar takes a kernel-selected port: a throwaway socket learns a
// free port and closes, and the registrar binds it. That hand-off is not
// atomic — another process may take the port in between — so startup
// retries with a fresh port, a bounded number of times, only when the
// failure says the port was taken. Other failures stay visible.
//
// The client is not the service's parent and has no connection to it: the
// only way it can learn where the service lives is to ask the registrar,
// which it does with Node.QueryActor before calling the service with FindActor.
//
// Run it with: go run ./examples/dedicated_registrar
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"os"
	"syscall"
	"time"

	"troupe"
)

// Hello asks the service to greet someone.
type Hello struct {
	Name    string
	ReplyTo troupe.Ref[string]
}

func init() { troupe.SetWireKey[Hello]("dedicated_registrar.hello") }

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := run(ctx, os.Stdout); err != nil {
		log.Fatal(err)
	}
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// startRegistrar starts a dedicated registrar on a kernel-selected port.
func startRegistrar(ctx context.Context) (*troupe.Node, error) {
	const attempts = 5
	for i := 0; ; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		addr := l.Addr().String()
		l.Close() // the port is free again; the registrar binds it next
		n, err := troupe.Start(ctx, troupe.Config{
			Name: "registrar", RegistryAddrs: []string{addr}, EnsureRegistry: true, Logger: quiet,
		})
		claimed := errors.Is(err, syscall.EADDRINUSE) || errors.Is(err, troupe.ErrRegistryRunning) || errors.Is(err, troupe.ErrRegistryOccupied)
		if err == nil || !claimed || i == attempts-1 {
			return n, err
		}
	}
}

func run(ctx context.Context, w io.Writer) error {
	registrar, err := startRegistrar(ctx)
	if err != nil {
		return err
	}
	defer registrar.Close()
	registry := registrar.Addrs()[0].String()
	fmt.Fprintln(w, "registrar: serving on a kernel-selected port")

	// The service: a node of its own that joins the registrar.
	service, err := troupe.Start(ctx, troupe.Config{Name: "service", RegistryAddrs: []string{registry}, Logger: quiet})
	if err != nil {
		return err
	}
	defer service.Close()
	_, err = troupe.Spawn(service, "greeter", troupe.Behavior[Hello]{
		Receive: func(c *troupe.Context[Hello], m Hello) {
			m.ReplyTo.Tell(fmt.Sprintf("hello %s, from %s", m.Name, c.Node().Name()))
		},
	})
	if err != nil {
		return err
	}
	fmt.Fprintln(w, "service: greeter registered")

	// The client: a sibling, with no connection to the service.
	client, err := troupe.Start(ctx, troupe.Config{Name: "client", RegistryAddrs: []string{registry}, Logger: quiet})
	if err != nil {
		return err
	}
	defer client.Close()
	q, err := client.QueryActor(ctx, "greeter")
	if err != nil {
		return err
	}
	if q.Registry.String() != registrar.Addrs()[0].String() {
		return fmt.Errorf("the registrar did not answer the query (answered by %v)", q.Registry)
	}
	fmt.Fprintf(w, "client: the registrar says greeter lives on node %s\n", q.NodeName)
	greeter, err := troupe.FindActor[Hello](ctx, client, "greeter")
	if err != nil {
		return fmt.Errorf("find greeter: %v", err)
	}
	reply, err := troupe.Ask(ctx, greeter, func(r troupe.Ref[string]) Hello { return Hello{Name: "client", ReplyTo: r} })
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "client: %s\n", reply)
	return nil
}
