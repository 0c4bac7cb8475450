package troupe

import "time"

// FailureDetector decides, from the times heartbeats arrived, whether a peer
// is still available. Implementations are pure: they are stepped with
// timestamps and read no clock, so tests can drive them exactly. They are
// not safe for concurrent use.
type FailureDetector interface {
	// Heartbeat records a sign of life from the peer at now.
	Heartbeat(now time.Time)
	// Available reports whether the peer still counts as alive at now.
	Available(now time.Time) bool
}

// WindowDetector is the fixed-window detector of a plain association: the
// peer is available until nothing has arrived from it for Window. A
// detector that has seen no heartbeat yet counts from Start.
type WindowDetector struct {
	// Window is how long the peer may stay silent.
	Window time.Duration
	// Start is when watching began (the handshake); the window runs from
	// it until the first heartbeat.
	Start time.Time

	last time.Time // the latest heartbeat, or zero
}

var _ FailureDetector = (*WindowDetector)(nil)

// Heartbeat records a sign of life at now. Out-of-order timestamps never
// move the last heartbeat backwards.
func (d *WindowDetector) Heartbeat(now time.Time) {
	if now.After(d.last) {
		d.last = now
	}
}

// Available reports whether less than Window has passed since the last
// heartbeat (or since Start, before the first one).
func (d *WindowDetector) Available(now time.Time) bool {
	return now.Sub(d.LastHeard()) < d.Window
}

// LastHeard returns the latest heartbeat, or Start if there has been none.
func (d *WindowDetector) LastHeard() time.Time {
	if d.last.IsZero() || d.last.Before(d.Start) {
		return d.Start
	}
	return d.last
}
