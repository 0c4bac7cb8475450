package troupe

import (
	"fmt"
	"io"
	"maps"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// How long things take: handler time, mailbox wait and Ask round trips, as histograms
// for MetricsHandler. They are kept only for a node that has a
// MetricsHandler (kept from the moment one is made), so that a node
// without one pays one pointer load per batch and two per Ask.

// latencyBuckets are the histograms' upper bounds, in seconds.
var latencyBuckets = [...]float64{1e-6, 5e-6, 25e-6, 100e-6, 250e-6, 1e-3, 2.5e-3, 10e-3, 25e-3, 100e-3, 250e-3, 1, 2.5, 10}

// maxLatencyKinds bounds the kinds (message types) a node keeps
// histograms for; further kinds count under "other".
const maxLatencyKinds = 256

// latencyHist is one histogram: counts per bucket (the last for +Inf)
// and the sum, updated with atomics by any goroutine.
type latencyHist struct {
	counts [len(latencyBuckets) + 1]atomic.Uint64
	sumNs  atomic.Uint64
}

func (h *latencyHist) observe(d time.Duration) {
	s := d.Seconds()
	i := 0
	for i < len(latencyBuckets) && s > latencyBuckets[i] {
		i++
	}
	h.counts[i].Add(1)
	h.sumNs.Add(uint64(max(d, 0)))
}

// latencySet is a family of histograms by kind: the Go type of the
// messages (an actor's message type, an Ask's request type), a bounded
// label, never an actor's path or uid.
type latencySet struct {
	byType    sync.Map // reflect.Type -> *latencyHist
	count     atomic.Int32
	other     latencyHist
	otherUsed atomic.Bool
}

func (s *latencySet) of(t reflect.Type) *latencyHist {
	if h, ok := s.byType.Load(t); ok {
		return h.(*latencyHist)
	}
	if s.count.Add(1) > maxLatencyKinds {
		s.count.Add(-1)
		s.otherUsed.Store(true)
		return &s.other
	}
	h, loaded := s.byType.LoadOrStore(t, &latencyHist{})
	if loaded {
		s.count.Add(-1) // another goroutine stored it first
	}
	return h.(*latencyHist)
}

// nodeLatencies are a node's histograms.
type nodeLatencies struct {
	handler latencySet // time in Receive, per message
	mailbox latencySet // the wait of the oldest message of each batch
	ask     latencySet // Ask, from the request's send to its reply
}

// writeLatencies writes the histograms in the Prometheus text format.
func writeLatencies(w io.Writer, l *nodeLatencies) {
	if l == nil {
		return
	}
	family := func(name, help string, s *latencySet) {
		fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name)
		// Two types may have one name (declared in two functions, or in
		// two packages of one name): their counts add up under it, as a
		// scraper refuses a series twice.
		type kind struct {
			counts [len(latencyBuckets) + 1]uint64
			sumNs  uint64
		}
		kinds := map[string]*kind{}
		add := func(label string, h *latencyHist) {
			k := kinds[label]
			if k == nil {
				k = &kind{}
				kinds[label] = k
			}
			for i := range h.counts {
				k.counts[i] += h.counts[i].Load()
			}
			k.sumNs += h.sumNs.Load()
		}
		s.byType.Range(func(t, h any) bool {
			add(metricsLabel(t.(reflect.Type).String()), h.(*latencyHist))
			return true
		})
		if s.otherUsed.Load() {
			add("other", &s.other)
		}
		for _, label := range slices.Sorted(maps.Keys(kinds)) {
			k := kinds[label]
			var cum uint64
			for i, le := range latencyBuckets {
				cum += k.counts[i]
				fmt.Fprintf(w, "%s_bucket{kind=\"%s\",le=\"%s\"} %d\n", name, label, metricsValue(le), cum)
			}
			cum += k.counts[len(latencyBuckets)]
			fmt.Fprintf(w, "%s_bucket{kind=\"%s\",le=\"+Inf\"} %d\n", name, label, cum)
			fmt.Fprintf(w, "%s_sum{kind=\"%s\"} %s\n", name, label, metricsValue(float64(k.sumNs)/1e9))
			fmt.Fprintf(w, "%s_count{kind=\"%s\"} %d\n", name, label, cum)
		}
	}
	family("troupe_handler_seconds", "Time an actor's Receive took per message, by the actor's message type.", &l.handler)
	family("troupe_mailbox_wait_seconds", "How long the oldest message of each batch an actor took had waited in its mailbox, by the actor's message type.", &l.mailbox)
	family("troupe_ask_seconds", "Ask round trips that were answered, from the request's send to the reply, by the request's type.", &l.ask)
}
