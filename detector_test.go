package troupe

import (
	"testing"
	"time"
)

func TestWindowDetector(t *testing.T) {
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
			d := &WindowDetector{Window: time.Second, Start: t0}
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
