package troupe_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"testing"
	"time"
	"troupe"
)

// The debug page and its JSON, and the Prometheus text, against a live
// node, before and after its peer is cut off.
func TestDebugAndMetricsHandlers(t *testing.T) {
	t.Parallel()
	slowTest(t)
	f, a, b := faultPair(t)
	srv := httptest.NewServer(a.DebugHandler())
	defer srv.Close()
	metrics := httptest.NewServer(a.MetricsHandler())
	defer metrics.Close()
	get := func(url string, accept string) string {
		req, _ := http.NewRequest("GET", url, nil)
		if accept != "" {
			req.Header.Set("Accept", accept)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return string(body)
	}
	page := get(srv.URL, "")
	if !strings.Contains(page, b.UID().String()) || !strings.Contains(page, `class="state">up`) || !strings.Contains(page, `http-equiv="refresh"`) {
		t.Fatalf("the page does not show the peer up:\n%s", page)
	}
	var js struct {
		Name  string `json:"name"`
		Peers []struct {
			UID   string `json:"uid"`
			State string `json:"state"`
		} `json:"peers"`
		Quarantined []struct {
			UID string `json:"uid"`
		} `json:"quarantined"`
	}
	if err := json.Unmarshal([]byte(get(srv.URL+"?format=json", "")), &js); err != nil || js.Name != "a" || len(js.Peers) != 1 || js.Peers[0].UID != b.UID().String() {
		t.Fatalf("JSON %+v (%v)", js, err)
	}
	m := get(metrics.URL, "")
	for _, want := range []string{`troupe_peers{state="up"} 1`, `troupe_peers{state="suspended"} 0`, `troupe_peers{state="ending"} 0`, `troupe_peers{state="retiring"} 0`, "# TYPE troupe_actors gauge", "troupe_quarantined_peers 0", "troupe_peer_sent_bytes_total{peer="} {
		if !strings.Contains(m, want) {
			t.Fatalf("metrics lack %q:\n%s", want, m)
		}
	}

	unreachable := make(chan troupe.PeerUnreachable, 1)
	sub := troupe.SubscribeChan(a, unreachable)
	defer sub.Unsubscribe()
	f.Partition(a, b)
	within(t, unreachable, 10*time.Second, "PeerUnreachable")
	page = get(srv.URL, "")
	if !strings.Contains(page, `class="quarantined bad" data-uid="`+b.UID().String()) {
		t.Fatalf("the page does not show the peer quarantined:\n%s", page)
	}
	if err := json.Unmarshal([]byte(get(srv.URL, "application/json")), &js); err != nil || len(js.Quarantined) != 1 {
		t.Fatalf("JSON after the cut %+v (%v)", js, err)
	}
	if m := get(metrics.URL, ""); !strings.Contains(m, "troupe_quarantined_peers 1") {
		t.Fatalf("metrics after the cut:\n%s", m)
	} else if s := parseMetrics(t, m); s["troupe_peers_given_up_total{}"] != 1 || s["troupe_peers_left_total{}"] != 0 {
		t.Fatalf("metrics after the cut: given up %v, left %v; want 1 and 0", s["troupe_peers_given_up_total{}"], s["troupe_peers_left_total{}"])
	}
}

// The debug page as an operator sees it, in a real browser: headless
// Chromium loads it and dumps the DOM it rendered, once with the peer up
// and once after a partition, when it must show the peer quarantined.
// `.ci/run` installs Debian's chromium; elsewhere the test skips.
func TestDebugPageInABrowser(t *testing.T) {
	t.Parallel()
	slowTest(t)
	browser, err := exec.LookPath("chromium")
	if err != nil {
		t.Skip("no chromium on PATH (apt-get install chromium)")
	}
	f, a, b := faultPair(t)
	srv := httptest.NewServer(a.DebugHandler())
	defer srv.Close()
	dom := func() string {
		// A browser that dies of a signal (chromium segfaults now and
		// then beside two CPU burners) is tried again, at most twice: the
		// page is what is tested, not the browser.
		var err error
		for range 3 {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			cmd := exec.CommandContext(ctx, browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
				"--disable-background-networking", "--disable-component-update", "--disable-sync",
				"--user-data-dir="+t.TempDir(), "--dump-dom", srv.URL)
			var out []byte
			out, err = cmd.Output()
			cancel()
			if err == nil {
				return string(out)
			}
			if ee, ok := err.(*exec.ExitError); !ok || ee.ProcessState.Exited() {
				break // (an exit status, not a signal: the browser's own verdict)
			}
			t.Logf("chromium: %v; trying again", err)
		}
		t.Fatalf("chromium: %v", err)
		return ""
	}
	page := dom()
	if !strings.Contains(page, `data-uid="`+b.UID().String()+`"`) || !strings.Contains(page, `<td class="state">up</td>`) {
		t.Fatalf("the browser's page does not show the peer up:\n%s", page)
	}
	unreachable := make(chan troupe.PeerUnreachable, 1)
	sub := troupe.SubscribeChan(a, unreachable)
	defer sub.Unsubscribe()
	f.Partition(a, b)
	within(t, unreachable, 10*time.Second, "PeerUnreachable")
	page = dom()
	if !strings.Contains(page, `<tr class="quarantined bad" data-uid="`+b.UID().String()+`"`) {
		t.Fatalf("the browser's page does not show the peer quarantined:\n%s", page)
	}
}
