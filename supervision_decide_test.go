package troupe

import (
	"slices"
	"testing"
	"time"
)

// The strategy's decisions are pure: each case gives the failures survived
// before, with explicit times, and the failure's time.
func TestStrategyDecide(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	t0 := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	at := func(secs ...int) []time.Time {
		var ts []time.Time
		for _, s := range secs {
			ts = append(ts, t0.Add(time.Duration(s)*time.Second))
		}
		return ts
	}
	cases := []struct {
		name    string
		s       Strategy
		history []time.Time
		inSetup bool
		now     int // seconds after t0
		want    failureAction
		kept    []time.Time
	}{
		{"stop always stops", Strategy{}, nil, false, 0, actStop, nil},
		{"stop ignores its limit", Strategy{}.WithLimit(5, 0), nil, false, 0, actStop, nil},
		{"resume", ResumeOnFailure(), nil, false, 0, actResume, nil},
		{"resume cannot resume a failed Setup", ResumeOnFailure(), nil, true, 0, actStop, nil},
		{"restart without limit keeps no history", RestartOnFailure(), nil, false, 0, actRestart, nil},
		{"restart restarts a failed Setup", RestartOnFailure(), nil, true, 0, actRestart, nil},
		{"limit 0 survives nothing", RestartOnFailure().WithLimit(0, time.Minute), nil, false, 0, actStop, nil},
		{"first of three", RestartOnFailure().WithLimit(3, time.Minute), nil, false, 10, actRestart, at(10)},
		{"third of three", RestartOnFailure().WithLimit(3, time.Minute), at(1, 2), false, 10, actRestart, at(1, 2, 10)},
		{"fourth within the window stops", RestartOnFailure().WithLimit(3, time.Minute), at(1, 2, 3), false, 10, actStop, at(1, 2, 3)},
		{"old failures leave the window", RestartOnFailure().WithLimit(3, time.Minute), at(1, 2, 3), false, 62, actRestart, at(3, 62)},
		{"exactly the window ago is outside it", RestartOnFailure().WithLimit(1, time.Minute), at(0), false, 60, actRestart, at(60)},
		{"no window counts for ever", RestartOnFailure().WithLimit(2, 0), at(0, 3600), false, 7200, actStop, at(0, 3600)},
		{"resume has a limit too", ResumeOnFailure().WithLimit(1, time.Minute), at(5), false, 10, actStop, at(5)},
		{"backoff is a restart", RestartWithBackoff(time.Second, time.Minute, 0.2).WithLimit(2, time.Minute), at(5), false, 10, actRestart, at(5, 10)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, kept, _ := tc.s.decide(slices.Clone(tc.history), tc.inSetup, t0.Add(time.Duration(tc.now)*time.Second))
			if got != tc.want || !slices.Equal(kept, tc.kept) {
				t.Fatalf("decide = %v, kept %v; want %v, kept %v", got, kept, tc.want, tc.kept)
			}
		})
	}
}

func TestBackoffPauses(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	s := RestartWithBackoff(100*time.Millisecond, time.Second, 0.5)
	cases := []struct {
		k    int
		r    float64
		want time.Duration
	}{
		{0, 0, 100 * time.Millisecond},
		{1, 0, 200 * time.Millisecond},
		{3, 0, 800 * time.Millisecond},
		{4, 0, time.Second}, // capped at max
		{70, 0, time.Second},
		{0, 0.5, 125 * time.Millisecond}, // stretched by factor × r
		{9, 0.999, time.Second + 499500*time.Microsecond},
	}
	for _, tc := range cases {
		if got := backoff(s, tc.k, tc.r); got != tc.want {
			t.Errorf("backoff(k=%d, r=%v) = %v, want %v", tc.k, tc.r, got, tc.want)
		}
	}
	if got := RestartWithBackoff(0, 0, -1); got.minBackoff != time.Millisecond || got.maxBackoff != time.Millisecond || got.randomFactor != 0 {
		t.Errorf("RestartWithBackoff(0, 0, -1) = %+v, want 1ms..1ms without randomness", got)
	}
}

func TestStrategyString(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	for s, want := range map[*Strategy]string{
		ptr(Strategy{}):        "stop",
		ptr(ResumeOnFailure()): "resume",
		ptr(RestartOnFailure().WithLimit(3, time.Minute)):      "restart, at most 3 failures within 1m0s",
		ptr(RestartWithBackoff(time.Second, 8*time.Second, 0)): "restart with backoff 1s..8s",
		ptr(RestartOnFailure().WithLimit(0, 0)):                "restart, no failure survived",
	} {
		if got := s.String(); got != want {
			t.Errorf("String() = %q, want %q", got, want)
		}
	}
}

func ptr[T any](v T) *T { return &v }
