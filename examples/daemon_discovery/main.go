// Command daemon_discovery is the classic deployment shape: a long-lived
// daemon serves requests, code that runs later discovers it by name, calls
// it, and stops it gracefully when the job is done.
//
// Stopping the daemon is part of the pattern: a service is still somebody's
// responsibility, and here the caller that started the job ends it by
// telling the daemon to stop. The daemon's node notices its actor stopped
// and closes, which unregisters everything it had registered.
//
// Run it with: go run ./examples/daemon_discovery
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"troupe"
)

// Request is the daemon's protocol: Add asks for a sum, Shutdown stops it.
type Request interface{ request() }

// Add asks for A+B.
type Add struct {
	A, B    int
	ReplyTo troupe.Ref[int]
}

// Shutdown asks the daemon to stop.
type Shutdown struct{}

func (Add) request()      {}
func (Shutdown) request() {}

func init() {
	troupe.SetWireKey[Add]("daemon_discovery.add")
	troupe.SetWireKey[Shutdown]("daemon_discovery.shutdown")
}

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := run(ctx, os.Stdout); err != nil {
		log.Fatal(err)
	}
}

// daemon runs the long-lived service until it is told to stop, then closes
// its node. It returns when the node is closed.
func daemon(ctx context.Context, registry string, w io.Writer, ready chan<- struct{}) error {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	n, err := troupe.Start(ctx, troupe.Config{Name: "daemon", RegistryAddrs: []string{registry}, Logger: quiet})
	if err != nil {
		return err
	}
	stopped := make(chan struct{})
	_, err = troupe.Spawn(n, "adder", troupe.Behavior[Request]{
		Receive: func(c *troupe.Context[Request], r Request) {
			switch r := r.(type) {
			case Add:
				r.ReplyTo.Tell(r.A + r.B)
			case Shutdown:
				fmt.Fprintln(w, "daemon: asked to stop, stopping")
				c.Stop()
				close(stopped)
			}
		},
	})
	if err != nil {
		n.Close()
		return err
	}
	close(ready)
	select {
	case <-stopped:
	case <-ctx.Done():
	}
	return n.Close()
}

func run(ctx context.Context, w io.Writer) error {
	dir, err := os.MkdirTemp("", "troupe-dd")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	registry := "unix://" + filepath.Join(dir, "registry.sock")
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))

	// The registrar comes first (any node could be it; this one does
	// nothing else).
	reg, err := troupe.Start(ctx, troupe.Config{Name: "registrar", RegistryAddrs: []string{registry}, EnsureRegistry: true, Logger: quiet})
	if err != nil {
		return err
	}
	defer reg.Close()

	ready := make(chan struct{})
	daemonDone := make(chan error, 1)
	go func() { daemonDone <- daemon(ctx, registry, w, ready) }()
	select {
	case <-ready:
	case err := <-daemonDone:
		return err
	}
	fmt.Fprintln(w, "daemon: serving as \"adder\"")

	// Later, somebody else discovers it by name.
	caller, err := troupe.Start(ctx, troupe.Config{Name: "caller", RegistryAddrs: []string{registry}, Logger: quiet})
	if err != nil {
		return err
	}
	defer caller.Close()
	adder, err := troupe.FindActor[Request](ctx, caller, "adder")
	if err != nil {
		return err
	}
	sum, err := troupe.Ask(ctx, adder, func(r troupe.Ref[int]) Request { return Add{A: 40, B: 2, ReplyTo: r} })
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "caller: 40 + 2 = %d\n", sum)

	// Graceful stop, then wait for the daemon to be gone.
	adder.Tell(Shutdown{})
	if err := <-daemonDone; err != nil {
		return err
	}
	if _, err := troupe.FindActor[Request](ctx, caller, "adder", troupe.WithRegistries(reg.Addrs()[0].String())); !errors.Is(err, troupe.ErrNotFound) {
		return fmt.Errorf("adder still registered after the daemon stopped (%v)", err)
	}
	fmt.Fprintln(w, "caller: adder is no longer registered")
	return nil
}
