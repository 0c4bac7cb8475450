package troupe_test

import (
	"encoding/json"
	"expvar"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"troupe"
)

// json.Marshal(n.Stats()) is the debug page's document, so the expvar
// line in docs/operations.md serves what the page and the command line
// read: addresses and uids as text, durations in seconds, not Go's
// structs of bytes.
func TestStatsMarshalAsTheDebugPagesDocument(t *testing.T) {
	t.Parallel()
	a := startQuiet(t, quiet("a", "tcp://127.0.0.1:0"))
	b := startQuiet(t, quiet("b", "tcp://127.0.0.1:0"))
	if _, err := troupe.Resolve[string](ctxFor(t), a, troupe.FormatRef(b.Addrs()[0], "/system/nobody")); err == nil {
		t.Fatal("resolving a path nobody has succeeded")
	}
	raw, err := json.Marshal(a.Stats())
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Name  string   `json:"name"`
		UID   string   `json:"uid"`
		Addrs []string `json:"addrs"`
		Peers []struct {
			Addr string  `json:"addr"`
			UID  string  `json:"uid"`
			Left float64 `json:"window_left_seconds"`
		} `json:"peers"`
		Runtime struct {
			Uptime float64 `json:"uptime_seconds"`
		} `json:"runtime"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatalf("%v in %s", err, raw)
	}
	if doc.Name != "a" || doc.UID != a.UID().String() || len(doc.Addrs) != 1 || doc.Addrs[0] != a.Addrs()[0].String() {
		t.Fatalf("name %q uid %q addrs %q, want a, %s, [%s]", doc.Name, doc.UID, doc.Addrs, a.UID(), a.Addrs()[0])
	}
	if len(doc.Peers) != 1 || doc.Peers[0].Addr != b.Addrs()[0].String() || doc.Peers[0].UID != b.UID().String() || doc.Peers[0].Left <= 0 {
		t.Fatalf("peers %+v, want b at %s (uid %s) with some window left", doc.Peers, b.Addrs()[0], b.UID())
	}
	if doc.Runtime.Uptime <= 0 || doc.Runtime.Uptime > float64(time.Hour/time.Second) {
		t.Fatalf("uptime_seconds = %v", doc.Runtime.Uptime)
	}
	// The same keys the page serves.
	rec := httptest.NewRecorder()
	a.DebugHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/?format=json", nil))
	var page, mine map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &page); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &mine); err != nil {
		t.Fatal(err)
	}
	for k := range page {
		if _, ok := mine[k]; !ok {
			t.Errorf("the page's document has %q, json.Marshal(Stats) does not", k)
		}
	}
	// And through expvar, as the guide publishes it.
	name := fmt.Sprintf("troupe-%s", a.UID())
	expvar.Publish(name, expvar.Func(func() any { return a.Stats() }))
	var viaExpvar map[string]any
	if err := json.Unmarshal([]byte(expvar.Get(name).String()), &viaExpvar); err != nil || viaExpvar["uid"] != a.UID().String() {
		t.Fatalf("expvar: %v, uid %v", err, viaExpvar["uid"])
	}
}
