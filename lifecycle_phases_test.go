package troupe_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"troupe"
)

// probe GETs path from the node's ProbeHandler: status and body.
func probe(n *troupe.Node, path string) (int, string) {
	rec := httptest.NewRecorder()
	n.ProbeHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	return rec.Code, strings.TrimSpace(rec.Body.String())
}

// Shutdown runs its phases in order, with the work added to each at its
// start: not ready from the first; still accepting connections until
// refuse; actors alive until actors; all stopped by flush. A hook's error
// is part of Shutdown's; the probes say ready, then not ready but alive,
// then neither.
func TestShutdownRunsItsPhasesInOrder(t *testing.T) {
	t.Parallel()
	n, err := troupe.Start(ctxFor(t), troupe.Config{Name: "phases", Listen: []string{"127.0.0.1:0"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	stopped := make(chan struct{})
	if _, err := troupe.Spawn(n, "worker", troupe.Behavior[string]{
		Receive: func(*troupe.Context[string], string) {},
		Signal: func(_ *troupe.Context[string], s troupe.Signal) {
			if _, ok := s.(troupe.PostStop); ok {
				close(stopped)
			}
		},
	}); err != nil {
		t.Fatal(err)
	}
	if code, body := probe(n, "/readyz"); code != http.StatusOK || body != "ok" {
		t.Fatalf("/readyz before Shutdown: %d %q", code, body)
	}
	addr := strings.TrimPrefix(n.Addrs()[0].String(), "tcp://")
	accepts := func() bool {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
		}
		return err == nil
	}
	actorStopped := func() bool {
		select {
		case <-stopped:
			return true
		default:
			return false
		}
	}
	var order []string
	hook := func(p troupe.ShutdownPhase, check func() string) {
		if err := n.OnShutdown(p, func(ctx context.Context) error {
			order = append(order, p.String())
			if msg := check(); msg != "" {
				t.Errorf("at %v: %s", p, msg)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	hook(troupe.PhaseLeave, func() string {
		if n.Ready() == nil || !errors.Is(n.Ready(), troupe.ErrNotReady) {
			return "still ready"
		}
		if code, _ := probe(n, "/readyz"); code != http.StatusServiceUnavailable {
			return "/readyz not 503"
		}
		if code, _ := probe(n, "/livez"); code != http.StatusOK {
			return "/livez not 200 while shutting down"
		}
		return ""
	})
	hook(troupe.PhaseUnregister, func() string { return "" })
	hook(troupe.PhaseRefuse, func() string {
		if !accepts() {
			return "connections refused before the refuse phase"
		}
		return ""
	})
	hook(troupe.PhaseActors, func() string {
		if accepts() {
			return "connections still accepted after the refuse phase"
		}
		if actorStopped() {
			return "the actor stopped before the actors phase"
		}
		return ""
	})
	hook(troupe.PhaseFlush, func() string {
		if !actorStopped() {
			return "the actor still runs at the flush phase"
		}
		return ""
	})
	boom := errors.New("boom")
	n.OnShutdown(troupe.PhaseFlush, func(context.Context) error { order = append(order, "flush 2"); return boom })

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = n.Shutdown(ctx)
	if !errors.Is(err, boom) || !strings.Contains(err.Error(), "flush") {
		t.Errorf("Shutdown = %v, want the hook's error, naming its phase", err)
	}
	want := []string{"leave", "unregister", "refuse", "actors", "flush", "flush 2"}
	if !slices.Equal(order, want) {
		t.Errorf("phases ran %v, want %v", order, want)
	}
	if code, _ := probe(n, "/livez"); code != http.StatusServiceUnavailable || !errors.Is(n.Alive(), troupe.ErrNodeClosed) {
		t.Errorf("/livez after Shutdown: %d, Alive %v", code, n.Alive())
	}
	if code, _ := probe(n, "/nothing"); code != http.StatusNotFound {
		t.Errorf("/nothing: %d, want 404", code)
	}
	if err := n.OnShutdown(troupe.PhaseLeave, func(context.Context) error { return nil }); !errors.Is(err, troupe.ErrNodeClosed) {
		t.Errorf("OnShutdown after Shutdown = %v, want ErrNodeClosed", err)
	}
}

// Close runs no hooks; a phase that does not exist is refused.
func TestCloseRunsNoShutdownHooks(t *testing.T) {
	t.Parallel()
	n, err := troupe.Start(ctxFor(t), troupe.Config{Name: "close"})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.OnShutdown(troupe.ShutdownPhase(99), func(context.Context) error { return nil }); !errors.Is(err, troupe.ErrBadConfig) {
		t.Errorf("OnShutdown(99) = %v, want ErrBadConfig", err)
	}
	ran := false
	n.OnShutdown(troupe.PhaseActors, func(context.Context) error { ran = true; return nil })
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	if ran {
		t.Error("Close ran a shutdown hook")
	}
}

// A cluster member is ready only while it is up.
func TestAMemberIsReadyOnlyWhileUp(t *testing.T) {
	t.Parallel()
	slowTest(t)
	f := new(troupe.FaultNet)
	n, err := f.Start(ctxFor(t), troupe.Config{Name: "m"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	c, err := troupe.StartCluster(ctxFor(t), n, troupe.ClusterConfig{})
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 5*time.Second, "the member up and ready", func() bool { return n.Ready() == nil })
	if err := c.Leave(ctxFor(t)); err != nil {
		t.Fatal(err)
	}
	if err := n.Ready(); err == nil {
		t.Error("ready after leaving the cluster")
	}
}
