//go:build unix

package troupe_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"troupe"
)

// The tractor promise, kept without trusting any peer's word: a node
// whose Unix socket file was removed stays associated with the registrar
// (its connection is another), yet a lookup that finds the address
// refusing reports it, and the registrar, having dialed the address
// itself and found it refusing, drops that node's entries there: the
// stale entry is not handed out again.
func TestAStaleAddressReportedByALookupIsCheckedAndDeleted(t *testing.T) {
	t.Parallel()
	registry, reg, quiet := startDedicatedRegistrar(t)
	sock := filepath.Join(t.TempDir(), "svc.sock")
	svc, err := troupe.Start(ctxFor(t), troupe.Config{Name: "svc", Listen: []string{"unix://" + sock}, RegistryAddrs: []string{registry}, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { svc.Close() })
	if _, err := troupe.Spawn(svc, "svc", troupe.Behavior[string]{Receive: func(*troupe.Context[string], string) {}}); err != nil {
		t.Fatal(err)
	}
	client, err := troupe.Start(ctxFor(t), troupe.Config{Name: "client", RegistryAddrs: []string{registry}, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	r, err := reg.Registry()
	if err != nil {
		t.Fatal(err)
	}
	actors := func() []troupe.Registration {
		regs, err := r.Find(ctxFor(t), "svc")
		if err != nil {
			t.Fatal(err)
		}
		var out []troupe.Registration
		for _, g := range regs {
			if g.Path != "" { // (the node registers itself under its name too)
				out = append(out, g)
			}
		}
		return out
	}
	if regs := actors(); len(regs) != 1 {
		t.Fatalf("registered: %v", regs)
	}
	if err := os.Remove(sock); err != nil { // the file goes; the process stays
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := troupe.FindActor[string](ctx, client, "svc"); err == nil {
		t.Fatal("found an actor behind a removed socket")
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		regs := actors()
		if len(regs) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the registrar still lists %v 10 s after a lookup found its address refusing", regs)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A new identity registered at an address that a live incarnation holds
// (its socket file was replaced by a new process's) is not believed on
// its word either: the registrar dials the address, finds the new node
// there, and drops the old incarnation's entries at that address.
func TestANewIdentityAtAnAddressEvictsTheOldOnceChecked(t *testing.T) {
	t.Parallel()
	registry, reg, quiet := startDedicatedRegistrar(t)
	sock := filepath.Join(t.TempDir(), "svc.sock")
	start := func(name string) *troupe.Node {
		n, err := troupe.Start(ctxFor(t), troupe.Config{Name: name, Listen: []string{"unix://" + sock}, RegistryAddrs: []string{registry}, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { n.Close() })
		if _, err := troupe.Spawn(n, "svc", troupe.Behavior[string]{Receive: func(*troupe.Context[string], string) {}}); err != nil {
			t.Fatal(err)
		}
		return n
	}
	old := start("old")
	if err := os.Remove(sock); err != nil { // the old process stays, its socket goes
		t.Fatal(err)
	}
	fresh := start("new")
	r, err := reg.Registry()
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		regs, err := r.Find(ctxFor(t), "svc")
		if err != nil {
			t.Fatal(err)
		}
		var olds, news int
		for _, g := range regs {
			switch g.Node {
			case old.UID():
				olds++
			case fresh.UID():
				news++
			}
		}
		if olds == 0 && news > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("10 s after a new node registered at the old one's address: %d entries of the old, %d of the new", olds, news)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// startDedicatedRegistrar starts a registrar at a free loopback address
// and returns that address, the node and a quiet logger for the others.
func startDedicatedRegistrar(t *testing.T) (string, *troupe.Node, *slog.Logger) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	registry := l.Addr().String()
	l.Close()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	reg, err := troupe.Start(ctxFor(t), troupe.Config{Name: "registrar", RegistryAddrs: []string{registry}, EnsureRegistry: true, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reg.Close() })
	return registry, reg, quiet
}
