package troupe

import (
	"math"
	"reflect"
	"runtime/metrics"
	"sync"
	"testing"
	"time"
)

// histogramQuantile is the upper bound of the bucket holding the
// quantile; the lower bound when that bucket is open-ended.
func TestHistogramQuantile(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	buckets := []float64{0, 0.001, 0.01, 0.1}
	for _, tc := range []struct {
		counts []uint64
		q      float64
		want   time.Duration
	}{
		{[]uint64{0, 0, 0}, 0.99, 0},
		{[]uint64{10, 0, 0}, 0.99, time.Millisecond},
		{[]uint64{99, 1, 0}, 0.99, time.Millisecond},
		{[]uint64{98, 2, 0}, 0.99, 10 * time.Millisecond},
		{[]uint64{0, 0, 5}, 0.5, 100 * time.Millisecond},
	} {
		h := &metrics.Float64Histogram{Counts: tc.counts, Buckets: buckets}
		if got := histogramQuantile(h, tc.q); got != tc.want {
			t.Errorf("counts %v, q %v: %v, want %v", tc.counts, tc.q, got, tc.want)
		}
	}
	open := &metrics.Float64Histogram{Counts: []uint64{0, 3}, Buckets: []float64{0, 0.5, math.Inf(1)}}
	if got := histogramQuantile(open, 0.99); got != 500*time.Millisecond {
		t.Errorf("an open-ended last bucket: %v, want its lower bound 500ms", got)
	}
}

// Goroutines that meet a new kind at once make one histogram of it, and
// kinds past the bound count as "other".
func TestLatencyKindsAreBounded(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	var s latencySet
	var wg sync.WaitGroup
	hs := make([]*latencyHist, 8)
	for i := range hs {
		wg.Go(func() { hs[i] = s.of(reflect.TypeFor[int]()) })
	}
	wg.Wait()
	for _, h := range hs {
		if h != hs[0] {
			t.Fatal("two histograms for one kind")
		}
	}
	if c := s.count.Load(); c != 1 {
		t.Fatalf("count %d after one kind", c)
	}
	types := []reflect.Type{reflect.TypeFor[int]()}
	for i := range maxLatencyKinds + 10 {
		types = append(types, reflect.ArrayOf(i+1, reflect.TypeFor[byte]()))
	}
	for _, ty := range types {
		s.of(ty).observe(time.Microsecond)
	}
	if c := s.count.Load(); c != maxLatencyKinds || !s.otherUsed.Load() {
		t.Fatalf("count %d, other used %v; want %d and true", c, s.otherUsed.Load(), maxLatencyKinds)
	}
}
