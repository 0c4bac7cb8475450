package main

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"troupe"
)

// The stats document's per-peer durations are numbers under their
// _seconds keys, and troupe peers reads the window from there. (Review of
// a72d008: TestStatsSaysWhatAnOperatorLooksFor checks the peers' keys
// only for the peers it finds, and the node it asks has none but the
// command itself, an observer, which the document does not list: the
// peers' keys could be anything and it would pass, as would
// TestPeersActorsStats, which does not look at the window.)
func TestStatsPeerDurationsAreSecondsAndPeersReadsThem(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	quiet := slog.New(slog.DiscardHandler)
	reg, err := troupe.Start(ctx, troupe.Config{Name: "reg", RegistryAddrs: []string{"127.0.0.1:0"}, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	other, err := troupe.Start(ctx, troupe.Config{Name: "other", RegistryAddrs: []string{reg.Addrs()[0].String()}, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	node := reg.Addrs()[0].String()
	var out, errOut bytes.Buffer
	var doc struct {
		Peers []map[string]any `json:"peers"`
	}
	for deadline := time.Now().Add(10 * time.Second); ; {
		out.Reset()
		if code := run(ctx, []string{"stats", "--json", "--node", node}, &out, &errOut); code != 0 {
			t.Fatalf("stats --json: exit %d, %s", code, errOut.String())
		}
		if err := json.Unmarshal(out.Bytes(), &doc); err != nil {
			t.Fatal(err)
		}
		if len(doc.Peers) > 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if len(doc.Peers) == 0 {
		t.Fatalf("the registrar lists no peer:\n%s", out.String())
	}
	for _, p := range doc.Peers {
		for _, key := range []string{"window_left_seconds", "round_trip_seconds"} {
			if _, ok := p[key].(float64); !ok {
				t.Errorf("peer %v: %s is %T %v, want a number of seconds", p["name"], key, p[key], p[key])
			}
		}
		if left, _ := p["window_left_seconds"].(float64); left <= 0 {
			t.Errorf("peer %v: window_left_seconds %v, want a window that has not run out", p["name"], p["window_left_seconds"])
		}
	}
	out.Reset()
	if code := run(ctx, []string{"peers", "--node", node}, &out, &errOut); code != 0 {
		t.Fatalf("peers: exit %d, %s", code, errOut.String())
	}
	for _, line := range strings.Split(out.String(), "\n") {
		if strings.Contains(line, "other") && strings.Contains(line, "expired") {
			t.Errorf("troupe peers shows a live peer's window as expired:\n%s", out.String())
		}
	}
}
