package troupe_test

import (
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"troupe"
)

// versionedNode starts a node with the default Config but for its listen
// address, a quiet logger and its app version.
func versionedNode(t *testing.T, name, version string) *troupe.Node {
	t.Helper()
	n, err := troupe.Start(ctxFor(t), troupe.Config{Name: name, AppVersion: version, Listen: []string{"tcp://127.0.0.1:0"},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}

// Config.AppVersion travels in the handshake and in cluster membership:
// a peer's is in its PeerStats, a member's in Member and MemberStats, a
// node's own in Stats, and the debug page shows them all. A node that
// sets none shows an empty one.
func TestAppVersionIsSeenByPeersAndMembers(t *testing.T) {
	t.Parallel()
	slowTest(t)
	a := versionedNode(t, "a", "orders-1.4.2")
	b := versionedNode(t, "b", "orders-1.5.0")
	plain := versionedNode(t, "plain", "")
	cfg := troupe.ClusterConfig{StableAfter: 300 * time.Millisecond}
	ca, err := troupe.StartCluster(ctxFor(t), a, cfg)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Seeds = []string{a.Addrs()[0].String()}
	cb, err := troupe.StartCluster(ctxFor(t), b, cfg)
	if err != nil {
		t.Fatal(err)
	}
	versions := func(c *troupe.Cluster) map[string]string {
		out := map[string]string{}
		for _, m := range c.Members() {
			if m.Status == troupe.MemberUp {
				out[m.Addr.String()] = m.AppVersion
			}
		}
		return out
	}
	want := map[string]string{a.Addrs()[0].String(): "orders-1.4.2", b.Addrs()[0].String(): "orders-1.5.0"}
	waitUntil(t, 10*time.Second, "both members up, each with its version, on both", func() bool {
		va, vb := versions(ca), versions(cb)
		return len(va) == 2 && len(vb) == 2 && va[a.Addrs()[0].String()] == want[a.Addrs()[0].String()] &&
			va[b.Addrs()[0].String()] == want[b.Addrs()[0].String()] && vb[a.Addrs()[0].String()] == want[a.Addrs()[0].String()] &&
			vb[b.Addrs()[0].String()] == want[b.Addrs()[0].String()]
	})
	for _, m := range b.Stats().Members {
		if w := want[m.Addr.String()]; m.AppVersion != w {
			t.Errorf("b's MemberStats for %s: version %q, want %q", m.Addr, m.AppVersion, w)
		}
	}

	// A plain peer: its version (none) and a's, through the handshake.
	spawnCollectorOf(t, plain)
	if _, err := troupe.Resolve[string](ctxFor(t), a, "troupe://"+strings.TrimPrefix(plain.Addrs()[0].String(), "tcp://")+"/user/c"); err != nil {
		t.Fatal(err)
	}
	s := a.Stats()
	if s.AppVersion != "orders-1.4.2" {
		t.Errorf("a's own version in Stats: %q", s.AppVersion)
	}
	peerVersions := map[string]string{}
	for _, p := range s.Peers {
		peerVersions[p.Name] = p.AppVersion
	}
	if v, ok := peerVersions["b"]; !ok || v != "orders-1.5.0" {
		t.Errorf("a's Stats of b: version %q (listed %v)", v, ok)
	}
	if v, ok := peerVersions["plain"]; !ok || v != "" {
		t.Errorf("a's Stats of plain: version %q (listed %v)", v, ok)
	}
	var seen string
	for _, p := range plain.Stats().Peers {
		if p.Name == "a" {
			seen = p.AppVersion
		}
	}
	if seen != "orders-1.4.2" {
		t.Errorf("plain sees a's version as %q", seen)
	}

	// The debug page: the node's own, its peers' and its members'.
	rec := httptest.NewRecorder()
	a.DebugHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
	page := rec.Body.String()
	if !strings.Contains(page, `<span id="app-version">orders-1.4.2</span>`) || !strings.Contains(page, `<td class="version">orders-1.5.0</td>`) ||
		strings.Count(page, `<td class="version">orders-1.4.2</td>`) != 1 {
		t.Errorf("the debug page does not show the versions:\n%s", page)
	}
	rec = httptest.NewRecorder()
	a.DebugHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/?format=json", nil))
	var doc struct {
		AppVersion string `json:"app_version"`
		Peers      []struct {
			Name       string `json:"name"`
			AppVersion string `json:"app_version"`
		} `json:"peers"`
		Members []struct {
			Addr       string `json:"addr"`
			AppVersion string `json:"app_version"`
		} `json:"members"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	if doc.AppVersion != "orders-1.4.2" || len(doc.Members) != 2 {
		t.Fatalf("the JSON document: %+v", doc)
	}
	for _, m := range doc.Members {
		if m.AppVersion != want[m.Addr] {
			t.Errorf("the JSON document's member %s: version %q, want %q", m.Addr, m.AppVersion, want[m.Addr])
		}
	}
	for _, p := range doc.Peers {
		if w := map[string]string{"b": "orders-1.5.0", "plain": ""}[p.Name]; p.AppVersion != w {
			t.Errorf("the JSON document's peer %s: version %q, want %q", p.Name, p.AppVersion, w)
		}
	}
}

func spawnCollectorOf(t *testing.T, n *troupe.Node) {
	t.Helper()
	if _, err := troupe.Spawn(n, "c", troupe.Behavior[string]{Receive: func(*troupe.Context[string], string) {}}); err != nil {
		t.Fatal(err)
	}
}

// An AppVersion past its bound, or with a control character, is a
// configuration error.
func TestAnAppVersionTooLongIsRefused(t *testing.T) {
	t.Parallel()
	_, err := troupe.Start(ctxFor(t), troupe.Config{AppVersion: strings.Repeat("v", 128+1)})
	if !errors.Is(err, troupe.ErrBadConfig) || !strings.Contains(err.Error(), "AppVersion") {
		t.Fatalf("Start: %v, want ErrBadConfig naming AppVersion", err)
	}
	_, err = troupe.Start(ctxFor(t), troupe.Config{AppVersion: "v1\x1b[2J"})
	if !errors.Is(err, troupe.ErrBadConfig) || !strings.Contains(err.Error(), "printable") {
		t.Fatalf("Start with a control character in AppVersion: %v, want ErrBadConfig", err)
	}
	n, err := troupe.Start(ctxFor(t), troupe.Config{AppVersion: strings.Repeat("v", 128)})
	if err != nil {
		t.Fatal(err)
	}
	n.Close()
}

// Schema lists a registered message type with its shape; FetchSchema asks
// a running node for the same; DiffSchemas applies the rules a session
// applies.
func TestSchemaOfARunningNode(t *testing.T) {
	t.Parallel()
	n := defaultNode(t, "schema")
	asker := defaultNode(t, "asker")
	got, err := asker.FetchSchema(ctxFor(t), n.Addrs()[0].String())
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(got, func(s troupe.MessageSchema) bool { return s.Key == shapeKey })
	if i < 0 {
		t.Fatalf("%s is not in the fetched schema", shapeKey)
	}
	if s := got[i]; s.Type != "troupe_test.shapeV1" || s.Shape != "struct { ID int; Name string; Old bool }" || len(s.Raw) == 0 {
		t.Fatalf("the fetched schema of %s: %+v", shapeKey, s)
	}
	local := troupe.Schema()
	if !slices.EqualFunc(local, got, func(a, b troupe.MessageSchema) bool { return a.Key == b.Key && a.Shape == b.Shape }) {
		t.Fatalf("Schema and FetchSchema differ in one process")
	}
	if d := troupe.DiffSchemas(got[i], local[slices.IndexFunc(local, func(s troupe.MessageSchema) bool { return s.Key == shapeKey })]); !d.Same || !(d.AToB == nil && d.BToA == nil) {
		t.Fatalf("a schema differs from itself: %+v", d)
	}
	if _, err := asker.FetchSchema(ctxFor(t), "127.0.0.1:1"); err == nil {
		t.Fatal("FetchSchema from an address where nothing listens succeeded")
	}
}
