package troupe_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"troupe"
)

// TestHelperObserver is the process TestAKilledObserverLeavesNoTrace
// kills: an Observer that asks a node for its stats in a loop and prints
// "asked" after each answer.
func TestHelperObserver(t *testing.T) {
	t.Parallel()
	target := os.Getenv("TROUPE_OBSERVE")
	if target == "" {
		t.Skip("helper for TestAKilledObserverLeavesNoTrace")
	}
	n, err := troupe.Start(context.Background(), troupe.Config{Name: "troupe-cli", Observer: true})
	if err != nil {
		fmt.Println("ERR", err)
		return
	}
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := n.FetchStats(ctx, target)
		cancel()
		if err != nil {
			fmt.Println("ERR", err)
			return
		}
		fmt.Println("asked")
	}
}

// An Observer (the troupe command) is not a peer: the node it inspects
// does not list it, publishes no peer event about it, and when its
// process is killed mid-conversation (as `troupe ls | head -1` is) it
// ends the session quietly: no warning, no quarantine, no resume.
func TestAKilledObserverLeavesNoTrace(t *testing.T) {
	t.Parallel()
	var logs lockedBuffer
	n, err := troupe.Start(ctxFor(t), troupe.Config{Name: "inspected", Listen: []string{"tcp://127.0.0.1:0"},
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	var mu sync.Mutex
	var events []string
	note := func(ev any) { mu.Lock(); events = append(events, fmt.Sprintf("%T %+v", ev, ev)); mu.Unlock() }
	troupe.Subscribe(n, func(e troupe.PeerConnected) { note(e) })
	troupe.Subscribe(n, func(e troupe.PeerLinkLost) { note(e) })
	troupe.Subscribe(n, func(e troupe.PeerUnreachable) { note(e) })
	troupe.Subscribe(n, func(e troupe.PeerResumed) { note(e) })

	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^TestHelperObserver$")
	cmd.Env = append(os.Environ(), "TROUPE_OBSERVE="+n.Addrs()[0].String())
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer cmd.Process.Kill()
	lines := bufio.NewScanner(out)
	for range 3 {
		if !lines.Scan() || lines.Text() != "asked" {
			t.Fatalf("the observer said %q, %v", lines.Text(), lines.Err())
		}
	}
	s := n.Stats()
	if len(s.Peers) != 0 || s.Observers != 1 {
		t.Fatalf("while an observer asks: Peers %+v, Observers %d; want no peer and one observer", s.Peers, s.Observers)
	}
	rec := httptest.NewRecorder()
	n.MetricsHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if !strings.Contains(rec.Body.String(), "\ntroupe_observers 1\n") || strings.Contains(rec.Body.String(), "troupe-cli") {
		t.Fatalf("/metrics while an observer asks:\n%s", rec.Body.String())
	}
	rec = httptest.NewRecorder()
	n.DebugHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/debug/troupe?format=json", nil))
	var doc struct {
		Observers int   `json:"observers"`
		Peers     []any `json:"peers"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &doc); err != nil || doc.Observers != 1 || len(doc.Peers) != 0 {
		t.Fatalf("the debug JSON while an observer asks: %v\n%s", err, rec.Body.String())
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 10*time.Second, "the killed observer's session ends", func() bool { return n.Stats().Observers == 0 })
	if q := n.Stats().Quarantined; len(q) != 0 {
		t.Fatalf("a killed observer was quarantined: %+v", q)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(events) != 0 {
		t.Fatalf("peer events about an observer: %v", events)
	}
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, "level=WARN") || strings.Contains(line, "level=ERROR") || strings.Contains(line, "resuming") {
			t.Fatalf("the inspected node logged, about a killed observer:\n%s", line)
		}
	}
}

// A reset between an observer and the node it inspects ends the session
// quietly on both ends: neither quarantines the other, and the
// observer's next call dials again and is answered.
func TestAnObserverOutlivesAReset(t *testing.T) {
	t.Parallel()
	f := new(troupe.FaultNet)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	n, err := f.Start(ctxFor(t), troupe.Config{Name: "inspected", Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	o, err := f.Start(ctxFor(t), troupe.Config{Name: "troupe-cli", Observer: true, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	var mu sync.Mutex
	var events []string
	for _, node := range []*troupe.Node{n, o} {
		troupe.Subscribe(node, func(e troupe.PeerUnreachable) { mu.Lock(); events = append(events, fmt.Sprintf("%+v", e)); mu.Unlock() })
	}
	target := n.Addrs()[0].String()
	for round := range 3 {
		if _, err := o.FetchStats(ctxFor(t), target); err != nil {
			t.Fatalf("round %d: the observer's call after a reset: %v", round, err)
		}
		if f.Reset(o, n) == 0 {
			t.Fatalf("round %d: no connection to reset", round)
		}
		// (A call made before the observer's own end has seen the reset
		// fails; the next one dials again.)
		waitUntil(t, 10*time.Second, "the session ends on both ends", func() bool { return n.Stats().Observers == 0 && len(o.Stats().Peers) == 0 })
	}
	if q, p := o.Stats().Quarantined, n.Stats().Quarantined; len(q)+len(p) != 0 {
		t.Fatalf("quarantines after resets: observer %+v, inspected %+v", q, p)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(events) != 0 {
		t.Fatalf("PeerUnreachable after resets of an observer's session: %v", events)
	}
}

// An Observer cannot listen, serve or register: Start says so.
func TestAnObserverCannotListenOrRegister(t *testing.T) {
	t.Parallel()
	for name, cfg := range map[string]troupe.Config{
		"Listen":         {Listen: []string{"tcp://127.0.0.1:0"}},
		"ServeRegistry":  {ServeRegistry: true},
		"EnsureRegistry": {EnsureRegistry: true},
		"RegistryAddrs":  {RegistryAddrs: []string{"127.0.0.1:1"}},
		"Discovery":      {Discovery: true},
	} {
		cfg.Observer = true
		n, err := troupe.Start(ctxFor(t), cfg)
		if n != nil {
			n.Close()
		}
		if !errors.Is(err, troupe.ErrBadConfig) || !strings.Contains(err.Error(), "Observer") {
			t.Errorf("Observer with %s: Start = %v, want ErrBadConfig naming Observer", name, err)
		}
	}
}
