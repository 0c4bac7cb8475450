package troupe

import (
	"testing"
	"time"
)

// A region asks the coordinator where a shard runs once a tick at first,
// then, unanswered, ever less often, up to once a second (or the tick).
func TestARegionAsksLessOftenWhileUnanswered(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 12, 5, 8, 0, 0, 0, time.UTC)
	ms := time.Millisecond
	cases := []struct {
		name     string
		askedAt  time.Time
		wait     time.Duration
		tick     time.Duration
		now      time.Time
		again    bool
		nextWait time.Duration
	}{
		{"never asked", time.Time{}, 0, 100 * ms, t0, true, 200 * ms},
		{"within the tick", t0, 0, 100 * ms, t0.Add(99 * ms), false, 0},
		{"a tick later", t0, 0, 100 * ms, t0.Add(100 * ms), true, 200 * ms},
		{"waiting twice the tick, one tick later", t0, 200 * ms, 100 * ms, t0.Add(150 * ms), false, 0},
		{"waiting twice the tick, two ticks later", t0, 200 * ms, 100 * ms, t0.Add(200 * ms), true, 400 * ms},
		{"the wait stops at a second", t0, 800 * ms, 100 * ms, t0.Add(800 * ms), true, time.Second},
		{"a second at most", t0, time.Second, 100 * ms, t0.Add(time.Second), true, time.Second},
		{"a tick past a second is the wait", t0, 0, 2 * time.Second, t0.Add(2 * time.Second), true, 2 * time.Second},
		{"the default tick: once a second", t0, 0, time.Second, t0.Add(time.Second), true, time.Second},
	}
	for _, tc := range cases {
		again, next := askAgain(tc.askedAt, tc.wait, tc.tick, tc.now)
		if again != tc.again || next != tc.nextWait {
			t.Errorf("%s: askAgain = %v, %v; want %v, %v", tc.name, again, next, tc.again, tc.nextWait)
		}
	}
}
