package troupe_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http/httptest"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"troupe"
)

var (
	metricName = regexp.MustCompile(`^[a-zA-Z_:][a-zA-Z0-9_:]*$`)
	labelName  = regexp.MustCompile(`^[a-zA-Z_][a-zA-Z0-9_]*$`)
	unitWord   = regexp.MustCompile(`_(bytes|seconds)(_|$)`)
)

// parseMetrics reads the Prometheus text exposition format as a scraper
// does, strictly: every sample belongs to a family whose HELP and TYPE
// came first, once each; a family's samples are together; names and
// label names are valid, label values quoted with only \\, \" and \n
// escaped; values are numbers; no series twice; a counter's name ends in
// _total and nothing else's does; a unit (bytes, seconds) ends the name
// (before _total). It returns the samples by series ("name{a="x",b="y"}"
// with labels sorted).
func parseMetrics(t *testing.T, text string) map[string]float64 {
	t.Helper()
	s, err := parseMetricsText(text)
	if err != nil {
		t.Fatalf("%v\n%s", err, text)
	}
	return s
}

type metricsError struct{ err error }

func parseMetricsText(text string) (_ map[string]float64, err error) {
	defer func() {
		if p := recover(); p != nil {
			me, ok := p.(metricsError)
			if !ok {
				panic(p)
			}
			err = me.err
		}
	}()
	types, helps := map[string]string{}, map[string]bool{}
	samples := map[string]float64{}
	var current string
	done := map[string]bool{}
	sc := bufio.NewScanner(strings.NewReader(text))
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		fail := func(why string) { panic(metricsError{fmt.Errorf("line %d %q: %s", n, line, why)}) }
		if strings.HasPrefix(line, "#") {
			f := strings.SplitN(line, " ", 4)
			if len(f) < 4 || f[1] != "HELP" && f[1] != "TYPE" {
				fail("a comment that is neither HELP nor TYPE")
			}
			name := f[2]
			if !metricName.MatchString(name) {
				fail("an invalid metric name")
			}
			if done[name] {
				fail("a family that already ended")
			}
			if current != "" && current != name {
				done[current] = true
			}
			current = name
			switch f[1] {
			case "HELP":
				if helps[name] {
					fail("HELP twice")
				}
				helps[name] = true
			case "TYPE":
				if types[name] != "" {
					fail("TYPE twice")
				}
				if !slices.Contains([]string{"counter", "gauge", "histogram", "summary", "untyped"}, f[3]) {
					fail("an unknown type")
				}
				types[name] = f[3]
				switch {
				case f[3] == "counter" && !strings.HasSuffix(name, "_total"):
					fail("a counter whose name does not end in _total")
				case f[3] != "counter" && strings.HasSuffix(name, "_total"):
					fail("a " + f[3] + " whose name ends in _total")
				}
				if m := unitWord.FindStringIndex(name); m != nil && m[1] != len(name) && name[m[1]-1:] != "_total" && !strings.HasSuffix(name, name[m[0]:m[1]-1]+"_total") {
					fail("a unit that does not end the name")
				}
			}
			continue
		}
		name, rest, hasLabels := strings.Cut(line, "{")
		var labels []string
		value := ""
		if hasLabels {
			rest = "{" + rest
			i := 1
			for {
				eq := strings.IndexByte(rest[i:], '=')
				if eq < 0 {
					fail("a label without =")
				}
				ln := rest[i : i+eq]
				if !labelName.MatchString(ln) {
					fail("an invalid label name " + ln)
				}
				i += eq + 1
				if i >= len(rest) || rest[i] != '"' {
					fail("an unquoted label value")
				}
				i++
				var v strings.Builder
				for ; i < len(rest) && rest[i] != '"'; i++ {
					if rest[i] == '\\' {
						i++
						if i >= len(rest) || !strings.ContainsRune(`\"n`, rune(rest[i])) {
							fail("a bad escape in a label value")
						}
						if rest[i] == 'n' {
							v.WriteByte('\n')
							continue
						}
					}
					v.WriteByte(rest[i])
				}
				if i >= len(rest) {
					fail("an unterminated label value")
				}
				if !utf8.ValidString(v.String()) {
					fail("a label value that is not UTF-8")
				}
				for _, l := range labels {
					if strings.HasPrefix(l, ln+"=") {
						fail("a label twice in one series")
					}
				}
				labels = append(labels, ln+"="+strconv.Quote(v.String()))
				i++
				if i < len(rest) && rest[i] == ',' {
					i++
					continue
				}
				if i >= len(rest) || rest[i] != '}' {
					fail("labels not closed")
				}
				value = strings.TrimSpace(rest[i+1:])
				break
			}
		} else {
			name, value, _ = strings.Cut(line, " ")
		}
		family := name
		if types[current] == "histogram" {
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				if name == current+suffix {
					family = current
				}
			}
			if name == current+"_bucket" && !strings.Contains(rest, `le="`) {
				fail("a histogram bucket without le")
			}
		}
		if family != current || types[family] == "" || !helps[family] {
			fail("a sample outside its family's HELP and TYPE")
		}
		v, err := strconv.ParseFloat(value, 64)
		if err != nil || strings.ContainsAny(value, "pPxX_") {
			fail("a value that is not a number")
		}
		slices.Sort(labels)
		key := name + "{" + strings.Join(labels, ",") + "}"
		if _, dup := samples[key]; dup {
			fail("a series twice")
		}
		samples[key] = v
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return samples, nil
}

// sampleOf is the one series of name whose labels include all of want.
func sampleOf(t *testing.T, s map[string]float64, name string, want ...string) float64 {
	t.Helper()
	var found []string
	for k := range s {
		if !strings.HasPrefix(k, name+"{") {
			continue
		}
		ok := true
		for _, w := range want {
			ok = ok && strings.Contains(k, w)
		}
		if ok {
			found = append(found, k)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d series of %s with %q: %q", len(found), name, want, found)
	}
	return s[found[0]]
}

// The whole /metrics output of a node with a cluster peer, a plain peer,
// an actor that failed and was restarted, a mailbox with messages
// waiting and a dead letter parses as the text format, and says so.
func TestMetricsAreValidPrometheusText(t *testing.T) {
	t.Parallel()
	slowTest(t)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	start := func(name, version string) *troupe.Node {
		n, err := troupe.Start(ctxFor(t), troupe.Config{Name: name, AppVersion: version, Listen: []string{"tcp://127.0.0.1:0"}, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { n.Close() })
		return n
	}
	a, b, plain := start("a", `v1 "quoted" \ path`), start("b", ""), start("plain", "")
	cfg := troupe.ClusterConfig{StableAfter: 300 * time.Millisecond}
	ca, err := troupe.StartCluster(ctxFor(t), a, cfg)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Seeds = []string{a.Addrs()[0].String()}
	if _, err := troupe.StartCluster(ctxFor(t), b, cfg); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 10*time.Second, "two members up", func() bool {
		up := 0
		for _, m := range ca.Members() {
			if m.Status == troupe.MemberUp {
				up++
			}
		}
		return up == 2
	})
	spawnCollectorOf(t, plain)
	if _, err := troupe.Resolve[string](ctxFor(t), a, troupe.FormatRef(plain.Addrs()[0], "/user/c")); err != nil {
		t.Fatal(err)
	}
	// A failure and a restart.
	restarted := make(chan struct{}, 4)
	flaky, err := troupe.Spawn(a, "flaky", troupe.Supervise(func() troupe.Behavior[string] {
		return troupe.Behavior[string]{
			Setup:   func(*troupe.Context[string]) { restarted <- struct{}{} },
			Receive: func(*troupe.Context[string], string) { panic("boom") },
		}
	}, troupe.RestartOnFailure()))
	if err != nil {
		t.Fatal(err)
	}
	within(t, restarted, 5*time.Second, "the first Setup")
	flaky.Tell("fail")
	within(t, restarted, 5*time.Second, "the restart")
	// A mailbox with messages waiting behind a handler that blocks.
	release, entered := make(chan struct{}), make(chan struct{}, 1)
	defer close(release)
	stuck, err := troupe.Spawn(a, "stuck", troupe.Behavior[int]{Receive: func(_ *troupe.Context[int], _ int) {
		select {
		case entered <- struct{}{}:
		default:
		}
		<-release
	}})
	if err != nil {
		t.Fatal(err)
	}
	stuck.Tell(0)
	within(t, entered, 5*time.Second, "the handler")
	for i := range 5 {
		stuck.Tell(i + 1)
	}
	// A dead letter.
	gone, _ := troupe.Spawn(a, "gone", troupe.Behavior[string]{Receive: func(*troupe.Context[string], string) {}})
	a.Stop(gone)
	waitUntil(t, 5*time.Second, "a dead letter", func() bool { gone.Tell("late"); return len(a.Stats().DeadLetters) > 0 })

	rec := httptest.NewRecorder()
	a.MetricsHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	text := rec.Body.String()
	s := parseMetrics(t, text)
	if strings.Contains(text, "uid=") {
		t.Errorf("a series labelled by uid:\n%s", text)
	}
	if v := sampleOf(t, s, "troupe_build_info", `version="`+troupe.Version+`"`, `app_version="v1 \"quoted\" \\ path"`, `go_version="go`); v != 1 {
		t.Errorf("build info %v", v)
	}
	bAddr, plainAddr := `peer="`+b.Addrs()[0].String()+`"`, `peer="`+plain.Addrs()[0].String()+`"`
	sampleOf(t, s, "troupe_peer_phi", bAddr, `name="b"`)
	if left := sampleOf(t, s, "troupe_peer_window_left_seconds", plainAddr, `name="plain"`); left <= 0 {
		t.Errorf("the plain peer's window left: %v", left)
	}
	if rtt := sampleOf(t, s, "troupe_peer_round_trip_seconds", plainAddr); rtt <= 0 || rtt > 5 {
		t.Errorf("the round trip to the plain peer: %v s", rtt)
	}
	for _, name := range []string{"troupe_peer_received_bytes_total", "troupe_peer_sent_messages_total", "troupe_peer_received_messages_total",
		"troupe_peer_queued_frames", "troupe_peer_unacked_bytes", "troupe_peer_held_bytes"} {
		sampleOf(t, s, name, plainAddr)
		sampleOf(t, s, name, bAddr)
	}
	if w := s["troupe_mailbox_waiting_messages_max{}"]; w != 5 {
		t.Errorf("messages waiting in the deepest mailbox (/user/stuck): %v, want 5", w)
	}
	// Every dead-letter reason is a series from 0, and the process's
	// runtime has its series (#55: they were missing).
	for _, reason := range []string{"peer-left", "quarantined", "mailbox-full", "other"} {
		if _, ok := s[`troupe_dead_letters_total{reason="`+reason+`"}`]; !ok {
			t.Errorf("no troupe_dead_letters_total series for %q before any such dead letter", reason)
		}
	}
	for _, name := range []string{"go_goroutines", "go_memstats_heap_alloc_bytes", "go_gc_cycles_total", "troupe_uptime_seconds"} {
		if v, ok := s[name+"{}"]; !ok || v <= 0 && name != "go_gc_cycles_total" {
			t.Errorf("%s = %v (present %v), want a positive value", name, v, ok)
		}
	}
	for name, least := range map[string]float64{"troupe_actor_failures_total": 1, "troupe_actor_restarts_total": 1, "troupe_peer_sessions_total": 2,
		"troupe_peers_given_up_total": 0, "troupe_peers_left_total": 0, "troupe_peer_links_lost_total": 0, "troupe_peer_links_resumed_total": 0, "troupe_protocol_errors_total": 0, "troupe_auth_refused_total": 0} {
		if v, ok := s[name+"{}"]; !ok || v < least {
			t.Errorf("%s = %v (present %v), want at least %v", name, v, ok, least)
		}
	}
	if v := sampleOf(t, s, "troupe_cluster_members", `status="up"`); v != 2 {
		t.Errorf("members up: %v", v)
	}
	if v := sampleOf(t, s, "troupe_peers", `state="up"`); v != 2 {
		t.Errorf("peers up: %v", v)
	}

	// A peer that says goodbye, and a stranger that speaks nonsense.
	plain.Close()
	c, err := net.Dial("tcp", a.Addrs()[0].Address())
	if err != nil {
		t.Fatal(err)
	}
	c.Write([]byte("GET / HTTP/1.0\r\n\r\n"))
	io.Copy(io.Discard, c)
	c.Close()
	waitUntil(t, 10*time.Second, "the goodbye and the protocol error counted", func() bool {
		tot := a.Stats().Totals
		return tot.PeersLeft == 1 && tot.ProtocolErrors >= 1
	})
	rec = httptest.NewRecorder()
	a.MetricsHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	s = parseMetrics(t, rec.Body.String())
	if s["troupe_peers_left_total{}"] != 1 || s["troupe_peers_given_up_total{}"] != 0 || s["troupe_protocol_errors_total{}"] < 1 {
		t.Errorf("after a goodbye and a protocol error: left %v, given up %v, protocol errors %v",
			s["troupe_peers_left_total{}"], s["troupe_peers_given_up_total{}"], s["troupe_protocol_errors_total{}"])
	}
	rec = httptest.NewRecorder()
	a.DebugHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/?format=json", nil))
	var doc struct {
		Totals map[string]uint64 `json:"totals"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &doc); err != nil || doc.Totals["peers_left"] != 1 || doc.Totals["actor_restarts"] < 1 {
		t.Errorf("the JSON document's totals: %v (%v)", doc.Totals, err)
	}
}

// A peer's name comes from its hello: one that is not valid UTF-8 must not
// make the page unreadable to a scraper.
func TestMetricsOfAPeerWithABadName(t *testing.T) {
	t.Parallel()
	a := defaultNode(t, "a")
	b, err := troupe.Start(ctxFor(t), troupe.Config{Name: "bad\xff\xfe\"name\"\n", Listen: []string{"tcp://127.0.0.1:0"},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	spawnCollectorOf(t, b)
	if _, err := troupe.Resolve[string](ctxFor(t), a, troupe.FormatRef(b.Addrs()[0], "/user/c")); err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	a.MetricsHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	s := parseMetrics(t, rec.Body.String())
	sampleOf(t, s, "troupe_peer_sent_bytes_total", "name="+strconv.Quote("bad\uFFFD\"name\"\n"))
}

// The parser refuses what a scraper would: it is the test's teeth.
func TestMetricsParserRefusesBadText(t *testing.T) {
	t.Parallel()
	for _, bad := range []string{
		"troupe_x 1\n", // no HELP or TYPE
		"# HELP troupe_x x\n# TYPE troupe_x counter\ntroupe_x 1\n",                                         // a counter without _total
		"# HELP troupe_x_total x\n# TYPE troupe_x_total gauge\ntroupe_x_total 1\n",                         // a gauge with _total
		"# HELP troupe_x x\n# TYPE troupe_x gauge\ntroupe_x{a=\"1\"} 1\ntroupe_x{a=\"1\"} 2\n",             // a series twice
		"# HELP troupe_x x\n# TYPE troupe_x gauge\ntroupe_x{a=\"\\q\"} 1\n",                                // a bad escape
		"# HELP troupe_x x\n# TYPE troupe_x gauge\ntroupe_x one\n",                                         // not a number
		"# HELP troupe_bytes_x x\n# TYPE troupe_bytes_x gauge\ntroupe_bytes_x 1\n",                         // a unit not at the end
		"# HELP troupe_x x\n# TYPE troupe_x gauge\ntroupe_x{a=\"1\",a=\"2\"} 1\n",                          // a label twice
		"# HELP troupe_x x\n# TYPE troupe_x gauge\ntroupe_x{a=\"\xff\"} 1\n",                               // not UTF-8
		"# HELP troupe_x x\n# TYPE troupe_x gauge\ntroupe_x 0x1p3\n",                                       // a hex float
		"# HELP troupe_x x\n# TYPE troupe_x gauge\n# HELP troupe_y y\n# TYPE troupe_y gauge\ntroupe_x 1\n", // interleaved
		"# HELP troupe_x x\n# HELP troupe_x x\n# TYPE troupe_x gauge\ntroupe_x 1\n",                        // HELP twice
		"# HELP troupe_x x\n# TYPE troupe_x gauge\ntroupe_x{a=\"1} 1\n",                                    // unterminated
	} {
		if _, err := parseMetricsText(bad); err == nil {
			t.Errorf("the parser accepted %q", bad)
		}
	}
}
