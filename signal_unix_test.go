//go:build unix

package troupe_test

import (
	"context"
	"errors"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"testing"
	"time"

	"troupe"
)

// SIGINT starts ShutdownOnSignal's Shutdown; when a handler outlasts the
// grace period, the phases after PhaseActors still run at the deadline,
// and ShutdownOnSignal returns the deadline's error naming the actor,
// once the handler has returned.
func TestShutdownOnSignalEndsAtItsGracePeriod(t *testing.T) {
	t.Parallel()
	// A channel of the test's own for SIGINT: the signal then never ends
	// the process, whether or not ShutdownOnSignal listens yet.
	mine := make(chan os.Signal, 16)
	signal.Notify(mine, os.Interrupt)
	defer signal.Stop(mine)

	n := defaultNode(t, "signalled")
	started, release := make(chan struct{}), make(chan struct{})
	t.Cleanup(func() { closeOnce(release) })
	stuck, err := troupe.Spawn(n, "stuck", troupe.Behavior[int]{
		Receive: func(c *troupe.Context[int], _ int) {
			close(started)
			<-release // ignores its context: Go cannot stop it
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	stuck.Tell(1)
	within(t, started, 5*time.Second, "the handler starting")
	flushed := make(chan struct{})
	n.OnShutdown(troupe.PhaseFlush, func(context.Context) error { close(flushed); return nil })

	returned := make(chan error, 1)
	go func() { returned <- n.ShutdownOnSignal(300 * time.Millisecond) }()
	// ShutdownOnSignal listens from some moment on: signal until the
	// node begins to close.
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(10 * time.Second)
	for begun := false; !begun; {
		if err := syscall.Kill(os.Getpid(), syscall.SIGINT); err != nil {
			t.Fatal(err)
		}
		select {
		case <-n.Done():
			begun = true
		case <-tick.C:
		case <-deadline:
			t.Fatal("SIGINT did not start a shutdown within 10 s")
		}
	}
	if err := n.Ready(); !errors.Is(err, troupe.ErrNotReady) {
		t.Fatalf("Ready during the shutdown: %v", err)
	}
	// The grace period runs out while the handler still runs: the flush
	// goes on without it.
	within(t, flushed, 10*time.Second, "PhaseFlush after the grace period")
	select {
	case err := <-returned:
		t.Fatalf("ShutdownOnSignal returned %v while a handler still ran", err)
	default:
	}
	closeOnce(release)
	err = within(t, returned, 10*time.Second, "ShutdownOnSignal to return")
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "/user/stuck") {
		t.Fatalf("ShutdownOnSignal: %v, want the deadline's error naming /user/stuck", err)
	}
	if err := n.Alive(); err == nil {
		t.Fatal("Alive after the shutdown finished")
	}
}
