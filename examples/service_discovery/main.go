// Command service_discovery registers a service and finds it by name.
//
// The first node to start against a registry address becomes the
// registrar; here that is the "app" node, on a Unix socket in a fresh
// directory. A second node, "feeds", joins it and starts a data_feed actor
// a moment later. The app waits for the name to be registered — the
// registrar pushes the registration to it, nothing polls — asks where it
// lives, and calls it.
//
// Run it with: go run ./examples/service_discovery
package main

import (
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"troupe"
)

// Quote asks the feed for the price of a symbol.
type Quote struct {
	Symbol  string
	ReplyTo troupe.Ref[Price]
}

// Price is the answer.
type Price struct {
	Symbol string
	Cents  int
}

func init() {
	troupe.SetWireKey[Quote]("service_discovery.quote")
	troupe.SetWireKey[Price]("service_discovery.price")
}

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := run(ctx, os.Stdout); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context, w io.Writer) error {
	dir, err := os.MkdirTemp("", "troupe-sd")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	registry := "unix://" + filepath.Join(dir, "registry.sock")
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))

	app, err := troupe.Start(ctx, troupe.Config{Name: "app", RegistryAddrs: []string{registry}, Logger: quiet})
	if err != nil {
		return err
	}
	defer app.Close()
	fmt.Fprintf(w, "app: registrar? %v\n", app.Stats().Registrar)

	feeds, err := troupe.Start(ctx, troupe.Config{Name: "feeds", RegistryAddrs: []string{registry}, Logger: quiet})
	if err != nil {
		return err
	}
	defer feeds.Close()
	fmt.Fprintf(w, "feeds: registrar? %v\n", feeds.Stats().Registrar)

	found := make(chan troupe.Ref[Quote], 1)
	errs := make(chan error, 1)
	go func() {
		r, err := troupe.WaitForActor[Quote](ctx, app, "data_feed")
		if err != nil {
			errs <- err
			return
		}
		found <- r
	}()

	_, err = troupe.Spawn(feeds, "data_feed", troupe.Behavior[Quote]{
		Receive: func(_ *troupe.Context[Quote], q Quote) {
			q.ReplyTo.Tell(Price{Symbol: q.Symbol, Cents: 4200})
		},
	})
	if err != nil {
		return err
	}

	var feed troupe.Ref[Quote]
	select {
	case feed = <-found:
	case err := <-errs:
		return err
	}
	fmt.Fprintln(w, "app: data_feed is registered")
	q, err := app.QueryActor(ctx, "data_feed")
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "app: it lives on node %s, over a %s socket\n", q.NodeName, q.Addrs[0].Network())
	p, err := troupe.Ask(ctx, feed, func(r troupe.Ref[Price]) Quote { return Quote{Symbol: "TRP", ReplyTo: r} })
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "app: %s costs %d cents\n", p.Symbol, p.Cents)
	return nil
}
