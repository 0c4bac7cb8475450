package troupe_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"troupe"
)

// Registry.Watch delivers the registrar's table, then each registration
// and removal as it happens, pushed; and ends with ErrWatchLost when the
// registrar goes.
func TestRegistryWatchIsPushed(t *testing.T) {
	t.Parallel()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	reg, err := troupe.Start(ctxFor(t), troupe.Config{Name: "registrar", RegistryAddrs: []string{"127.0.0.1:0"}, EnsureRegistry: true, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	addr := reg.Addrs()[0].String()
	svc, err := troupe.Start(ctxFor(t), troupe.Config{Name: "svc", RegistryAddrs: []string{addr}, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()
	for _, local := range []bool{false, true} {
		watcher := reg
		if !local {
			watcher, err = troupe.Start(ctxFor(t), troupe.Config{Name: "watcher", Observer: true, Logger: quiet})
			if err != nil {
				t.Fatal(err)
			}
			defer watcher.Close()
		}
		r, err := watcher.Registry(troupe.WithRegistries(addr))
		if local {
			r, err = reg.Registry()
		}
		if err != nil {
			t.Fatal(err)
		}
		changes := make(chan troupe.RegistryChange, 64)
		ctx, cancel := context.WithCancel(context.Background())
		ended := make(chan error, 1)
		go func() { ended <- r.Watch(ctx, func(c troupe.RegistryChange) { changes <- c }) }()
		next := func(what string) troupe.RegistryChange {
			t.Helper()
			select {
			case c := <-changes:
				return c
			case err := <-ended:
				t.Fatalf("Watch ended before %s: %v", what, err)
			case <-time.After(10 * time.Second):
				t.Fatalf("no change for %s", what)
			}
			return troupe.RegistryChange{}
		}
		first := next("the snapshot")
		if !first.Snapshot || !hasName(first.Added, "svc") {
			t.Fatalf("local %v: the first change is not the table with svc: %+v", local, first)
		}
		billing, err := troupe.Spawn(svc, "billing", troupe.Behavior[string]{Receive: func(*troupe.Context[string], string) {}})
		if err != nil {
			t.Fatal(err)
		}
		if c := next("billing's registration"); c.Snapshot || !hasName(c.Added, "billing") {
			t.Fatalf("local %v: want billing added, got %+v", local, c)
		}
		svc.Stop(billing)
		if c := next("billing's removal"); !hasName(c.Removed, "billing") {
			t.Fatalf("local %v: want billing removed, got %+v", local, c)
		}
		cancel()
		if err := <-ended; !errors.Is(err, context.Canceled) {
			t.Fatalf("Watch after its ctx ended = %v", err)
		}
	}
	// The registrar goes: a remote watcher learns it.
	watcher, err := troupe.Start(ctxFor(t), troupe.Config{Name: "watcher2", Observer: true, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer watcher.Close()
	r, err := watcher.Registry(troupe.WithRegistries(addr))
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan struct{}, 64)
	ended := make(chan error, 1)
	go func() {
		ended <- r.Watch(context.Background(), func(troupe.RegistryChange) { got <- struct{}{} })
	}()
	<-got // the snapshot: subscribed
	reg.Close()
	select {
	case err := <-ended:
		if !errors.Is(err, troupe.ErrWatchLost) {
			t.Fatalf("Watch after the registrar closed = %v, want ErrWatchLost", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("Watch did not end when the registrar closed")
	}
}

func hasName(rs []troupe.Registration, name string) bool {
	for _, r := range rs {
		if r.Name == name {
			return true
		}
	}
	return false
}

// A watcher whose watch on the registrar is refused (the registrar's
// MaxWatchesPerPeer) could not tell when the registrar goes: its Watch
// ends at once and says why, not that the registrar is gone.
func TestRegistryWatchRefusedSaysSo(t *testing.T) {
	t.Parallel()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	reg, err := troupe.Start(ctxFor(t), troupe.Config{Name: "registrar", RegistryAddrs: []string{"127.0.0.1:0"}, EnsureRegistry: true, MaxWatchesPerPeer: 1, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	watcher, err := troupe.Start(ctxFor(t), troupe.Config{Name: "watcher", Observer: true, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer watcher.Close()
	r, err := watcher.Registry(troupe.WithRegistries(reg.Addrs()[0].String()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	first := make(chan troupe.RegistryChange, 4)
	go r.Watch(ctx, func(c troupe.RegistryChange) { first <- c })
	within(t, first, 10*time.Second, "the first watch's table") // it holds the one watch
	err = r.Watch(ctxFor(t), func(troupe.RegistryChange) {})
	if !errors.Is(err, troupe.ErrWatchRefused) || errors.Is(err, troupe.ErrWatchLost) {
		t.Fatalf("a second Watch: %v, want ErrWatchRefused (and not ErrWatchLost)", err)
	}
}
