package troupe

import (
	"errors"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestWindowDetector(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	type step struct {
		heartbeat bool // a heartbeat at ms, else a check at ms
		ms        int
		available bool // expected for a check
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"silent from the start", []step{{false, 0, true}, {false, 999, true}, {false, 1000, false}}},
		{"heartbeats keep it alive", []step{{true, 500, true}, {false, 1400, true}, {true, 1400, true}, {false, 2399, true}, {false, 2400, false}}},
		{"exactly the window is too long", []step{{true, 100, true}, {false, 1100, false}}},
		{"late heartbeat revives nothing it missed", []step{{true, 100, true}, {false, 1200, false}, {true, 1300, true}, {false, 1301, true}}},
		{"out of order timestamps do not go back", []step{{true, 900, true}, {true, 200, true}, {false, 1899, true}, {false, 1900, false}}},
		{"heartbeat before start counts from start", []step{{true, -500, true}, {false, 999, true}, {false, 1000, false}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := &windowDetector{Window: time.Second, Start: t0}
			for _, s := range tt.steps {
				if s.heartbeat {
					d.Heartbeat(at(s.ms))
					continue
				}
				if got := d.Available(at(s.ms)); got != s.available {
					t.Fatalf("Available(+%dms) = %v, want %v (last heard +%v)", s.ms, got, s.available, d.LastHeard().Sub(t0))
				}
			}
		})
	}
}

// cdf turns phi back into the probability it encodes.
func cdf(phi float64) float64 { return 1 - math.Pow(10, -phi) }

func TestPhiMatchesThePublishedDistribution(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	tests := []struct {
		timeDiff, mean, std float64
		cdf, tolerance      float64
	}{
		{0, 0, 10, 0.5, 0.001},
		{6, 0, 10, 0.7257, 0.001},
		{15, 0, 10, 0.9332, 0.001},
		{20, 0, 10, 0.97725, 0.001},
		{25, 0, 10, 0.99379, 0.001},
		{35, 0, 10, 0.99977, 0.001},
		{40, 0, 10, 0.99997, 0.0001},
		{22, 20, 3, 0.7475, 0.001},
	}
	for _, tt := range tests {
		if got := cdf(phi(tt.timeDiff, tt.mean, tt.std)); math.Abs(got-tt.cdf) > tt.tolerance {
			t.Errorf("cdf(phi(%v, %v, %v)) = %.5f, want %.5f", tt.timeDiff, tt.mean, tt.std, got, tt.cdf)
		}
	}
	for x := 0.0; x < 40; x++ {
		if phi(x, 0, 10) >= phi(x+1, 0, 10) {
			t.Fatalf("phi is not increasing at %v", x)
		}
	}
	if got := phi(10, 0, 1); math.Abs(got-38) > 1 {
		t.Errorf("phi of an outlier = %v, want about 38", got)
	}
	if got := phi(-25, 0, 1); got != 0 {
		t.Errorf("phi far before the mean = %v, want 0", got)
	}
	if got := phi(1e9, 0, 1); math.IsNaN(got) || got < 8 {
		t.Errorf("phi of a huge delay = %v, want a large number, not NaN", got)
	}
	realistic := map[float64]float64{0: 0, 500: 0.1, 1000: 0.3, 1200: 1.6, 1400: 4.7, 1600: 10.8, 1700: 15.3}
	for diff, want := range realistic {
		if got := phi(diff, 1000, 100); math.Abs(got-want) > 0.1 {
			t.Errorf("phi(%v, 1000, 100) = %.2f, want %.1f", diff, got, want)
		}
	}
	if phi(1100, 1000, 500) >= phi(1100, 1000, 100) {
		t.Error("a larger standard deviation does not lower phi")
	}
}

func TestPhiAccrualDetector(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	ms := func(v int) time.Time { return t0.Add(time.Duration(v) * time.Millisecond) }
	d := &PhiAccrual{}
	if got := d.suspicion(ms(0)); got != 0 || !d.Available(ms(100000)) {
		t.Fatalf("before any heartbeat: phi %v", got)
	}
	// Regular heartbeats every second: a short delay is fine, a long
	// silence is not.
	for i := 0; i <= 10; i++ {
		d.Heartbeat(ms(i * 1000))
	}
	if p := d.suspicion(ms(10000 + 1000)); p > 1 || !d.Available(ms(11000)) {
		t.Fatalf("one interval after the last beat: phi %v", p)
	}
	if d.Available(ms(10000 + 8000)) {
		t.Fatalf("eight seconds of silence after 1 s beats is still available (phi %v)", d.suspicion(ms(18000)))
	}
	// The outage is not learned: after it, the history is unchanged.
	before := d.sum
	d.Heartbeat(ms(60000))
	if d.sum != before {
		t.Fatal("an interval measured while unavailable was recorded")
	}
	// The history is a bounded ring.
	small := &PhiAccrual{}
	small.MaxSampleSize = 3
	for i := range 10 {
		small.Heartbeat(ms(i * 100))
	}
	if len(small.intervals) != 3 {
		t.Fatalf("%d samples kept, want 3", len(small.intervals))
	}
	// Seeded on the first heartbeat with the estimate ± a quarter.
	seeded := &PhiAccrual{}
	seeded.Heartbeat(ms(0))
	if len(seeded.intervals) != 2 || seeded.intervals[0] != 750 || seeded.intervals[1] != 1250 {
		t.Fatalf("seed = %v", seeded.intervals)
	}
}

func TestConfigRejectsShortWindow(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	cfg := testConfig()
	cfg.HeartbeatInterval = time.Second
	cfg.UnreachableAfter = 2 * time.Second
	if _, err := Start(ctxT(t, time.Second), cfg); !errors.Is(err, ErrBadConfig) {
		t.Fatalf("Start with a window of 2 intervals = %v, want ErrBadConfig", err)
	}
}

func TestDetectionTimeBounds(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	const interval, window = 50 * time.Millisecond, 500 * time.Millisecond
	p := newPair(t, interval, window)
	p.home.peers.mu.Lock()
	a := p.home.peers.byUID[p.away.UID()]
	p.home.peers.mu.Unlock()
	detected := make(chan time.Time, 1)
	Subscribe(p.home, func(PeerUnreachable) { detected <- time.Now() })
	p.f.Kill(p.away)
	at := recv(t, detected, "detection")
	last := p.home.epoch.Add(time.Duration(a.in.heard.Load()))
	silent := at.Sub(last)
	// (last is when the reader recorded the last frame, which a loaded
	// machine may delay past its arrival by a few of its milliseconds:
	// one interval of slack, not a window's.)
	if silent < window-interval {
		t.Errorf("declared unreachable %v after the last frame, sooner than the window %v", silent, window)
	}
	if limit := window + interval + time.Second; silent > limit {
		t.Errorf("declared unreachable %v after the last frame, later than %v", silent, limit)
	}
	t.Logf("detected %v after the last frame (window %v, interval %v)", silent, window, interval)
}

func TestNoFalsePositiveUnderHeavyLoad(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	slowTest(t)
	if testing.Short() {
		t.Skip("streams for several windows")
	}
	const interval, window = 100 * time.Millisecond, time.Second // the default ratio
	cfg := func(name string) Config {
		c := failConfig(name, interval, window)
		c.Listen = []string{"tcp://127.0.0.1:0"}
		return c
	}
	a, b := startNode(t, cfg("a")), startNode(t, cfg("b"))
	var events atomic.Int64
	for _, n := range []*Node{a, b} {
		Subscribe(n, func(PeerUnreachable) { events.Add(1) })
		Spawn(n, "sink", Behavior[bulk]{Receive: func(*Context[bulk], bulk) {}})
		spawnEcho(t, n, "echo")
	}
	payload := make([]byte, 64<<10)
	deadline := time.Now().Add(4 * window)
	var wg sync.WaitGroup
	var sent atomic.Int64
	for _, dir := range [][2]*Node{{a, b}, {b, a}} {
		from, to := dir[0], dir[1]
		ctx := ctxT(t, 30*time.Second)
		sink, err := Resolve[bulk](ctx, from, FormatRef(to.Addrs()[0], "/user/sink"))
		if err != nil {
			t.Fatal(err)
		}
		echo, err := Resolve[testPing](ctx, from, FormatRef(to.Addrs()[0], "/user/echo"))
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			for seq := 0; time.Now().Before(deadline); seq++ {
				sink.Tell(bulk{Seq: seq, Data: payload})
				sent.Add(1)
				if seq%32 == 31 { // keep the link full without an unbounded queue
					if _, err := Ask(ctx, echo, func(r Ref[testPong]) testPing { return testPing{ReplyTo: r} }); err != nil {
						t.Errorf("Ask during the stream: %v", err)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	if n := events.Load(); n != 0 {
		t.Fatalf("%d PeerUnreachable events on a busy but healthy link", n)
	}
	t.Logf("streamed %d messages of 64 KiB (%d MiB) in %v", sent.Load(), sent.Load()/16, 4*window)
}
