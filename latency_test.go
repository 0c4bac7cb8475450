package troupe_test

import (
	"io"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"troupe"
)

type histoWork struct{ N int }

type histoPing struct{ ReplyTo troupe.Ref[int] }

type histoQueued struct{ N int }

// With a MetricsHandler, /metrics has histograms of handler time and of
// Ask round trips, by message type (never by path or uid): buckets that
// only grow, a +Inf bucket equal to the count, and a count equal to what
// was handled.
func TestMetricsHaveLatencyHistograms(t *testing.T) {
	t.Parallel()
	n, err := troupe.Start(ctxFor(t), troupe.Config{Name: "h"})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	metrics := n.MetricsHandler() // (histograms are kept from here on)
	done := make(chan struct{})
	const work = 200
	handled := 0
	w, err := troupe.Spawn(n, "worker", troupe.Behavior[histoWork]{Receive: func(_ *troupe.Context[histoWork], m histoWork) {
		if m.N%50 == 0 {
			time.Sleep(2 * time.Millisecond) // a few slow ones, for the upper buckets
		}
		if handled++; handled == work {
			close(done)
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	for i := range work {
		w.Tell(histoWork{N: i})
	}
	<-done
	echo, err := troupe.Spawn(n, "echo", troupe.Behavior[histoPing]{Receive: func(_ *troupe.Context[histoPing], m histoPing) { m.ReplyTo.Tell(1) }})
	if err != nil {
		t.Fatal(err)
	}
	for range 10 {
		if _, err := troupe.Ask(ctxFor(t), echo, func(r troupe.Ref[int]) histoPing { return histoPing{ReplyTo: r} }); err != nil {
			t.Fatal(err)
		}
	}
	// Messages that wait behind a slow one: the next batch's oldest
	// waited at least as long as the slow one took.
	started, release, queued := make(chan struct{}), make(chan struct{}), make(chan struct{})
	q, err := troupe.Spawn(n, "queue", troupe.Behavior[histoQueued]{Receive: func(_ *troupe.Context[histoQueued], m histoQueued) {
		switch m.N {
		case 0:
			close(started)
			<-release
		case 10:
			close(queued)
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	q.Tell(histoQueued{N: 0})
	<-started
	for i := 1; i <= 10; i++ {
		q.Tell(histoQueued{N: i})
	}
	time.Sleep(3 * time.Millisecond) // how long the ten wait: what the histogram must see
	close(release)
	<-queued
	rec := httptest.NewRecorder()
	metrics.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body, _ := io.ReadAll(rec.Body)
	s := parseMetrics(t, string(body))
	check := func(family, kind string, want float64) {
		t.Helper()
		k := `kind="` + kind + `"`
		count := sampleOf(t, s, family+"_count", k)
		if count != want {
			t.Fatalf("%s_count{%s} = %v, want %v", family, k, count, want)
		}
		if inf := sampleOf(t, s, family+"_bucket", k, `le="+Inf"`); inf != count {
			t.Fatalf("%s: the +Inf bucket %v is not the count %v", family, inf, count)
		}
		prev := 0.0
		for _, le := range []string{"1e-06", "0.001", "0.0025", "0.01", "1", "10"} {
			v := sampleOf(t, s, family+"_bucket", k, `le="`+le+`"`)
			if v < prev {
				t.Fatalf("%s: bucket le=%s (%v) below the one before (%v)", family, le, v, prev)
			}
			prev = v
		}
		if sum := sampleOf(t, s, family+"_sum", k); sum <= 0 {
			t.Fatalf("%s_sum{%s} = %v", family, k, sum)
		}
	}
	check("troupe_handler_seconds", "troupe_test.histoWork", work)
	check("troupe_ask_seconds", "troupe_test.histoPing", 10)
	k := `kind="troupe_test.histoQueued"`
	if waits, fast := sampleOf(t, s, "troupe_mailbox_wait_seconds_count", k), sampleOf(t, s, "troupe_mailbox_wait_seconds_bucket", k, `le="0.0025"`); waits != 2 || waits-fast != 1 {
		t.Fatalf("mailbox waits: %v batches, %v under 2.5 ms; want 2 batches, one that waited 3 ms or more", waits, fast)
	}
	if slow := sampleOf(t, s, "troupe_handler_seconds_count", `kind="troupe_test.histoWork"`) - sampleOf(t, s, "troupe_handler_seconds_bucket", `kind="troupe_test.histoWork"`, `le="0.001"`); slow < 4 {
		t.Fatalf("%s handlers took over 1 ms; want the 4 that slept 2 ms", strconv.FormatFloat(slow, 'f', -1, 64))
	}
}

// Two message types with one name (declared in two functions, or in two
// packages of one name) are one kind: their counts add up, and no series
// appears twice, which a scraper would refuse.
func TestLatencyKindsOfOneNameAddUp(t *testing.T) {
	t.Parallel()
	n, err := troupe.Start(ctxFor(t), troupe.Config{Name: "h"})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	metrics := n.MetricsHandler()
	done := make(chan struct{}, 2)
	one := func() {
		type msg struct{}
		r, _ := troupe.Spawn(n, "one", troupe.Behavior[msg]{Receive: func(*troupe.Context[msg], msg) { done <- struct{}{} }})
		r.Tell(msg{})
	}
	two := func() {
		type msg struct{}
		r, _ := troupe.Spawn(n, "two", troupe.Behavior[msg]{Receive: func(*troupe.Context[msg], msg) { done <- struct{}{} }})
		r.Tell(msg{})
	}
	one()
	two()
	<-done
	<-done
	waitUntil(t, 5*time.Second, "both handlers timed", func() bool {
		rec := httptest.NewRecorder()
		metrics.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
		s := parseMetrics(t, rec.Body.String()) // (fails on a series twice)
		return sampleOf(t, s, "troupe_handler_seconds_count", `kind="troupe_test.msg"`) == 2
	})
}
