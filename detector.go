package troupe

import (
	"fmt"
	"math"
	"net"
	"sync/atomic"
	"time"
)

// Liveness, end to end: the read timestamps every connection keeps, the
// node's heartbeat loop that feeds them to each association's detector,
// asks for heartbeats and declares silent peers unreachable, and the
// detectors themselves (a fixed window for a plain association,
// phi-accrual for cluster members). What happens to a peer declared
// unreachable — quarantine — is in quarantine.go.

// stampReader is a connection's reading side; it records when bytes last
// arrived, for the failure detector. Any bytes count as a sign of life.
type stampReader struct {
	c     net.Conn
	epoch time.Time
	heard atomic.Int64  // nanoseconds after epoch of the last read, 0 if none
	bytes atomic.Uint64 // bytes read
}

func (r *stampReader) Read(p []byte) (int, error) {
	n, err := r.c.Read(p)
	if n > 0 {
		r.heard.Store(int64(time.Since(r.epoch)))
		r.bytes.Add(uint64(n))
	}
	return n, err
}

// liveness is what the node's heartbeat goroutine keeps for each
// association, and the checks it runs on it. attach starts its detector
// (liveness.start) under the peer table's lock, before the heartbeat loop
// can find the association there; from then on only the heartbeat loop
// reads or writes it.
type liveness struct {
	a        *assoc // whose liveness this is
	det      windowDetector
	lastBeat time.Time
	// judged: the window decides about this peer (it is no member whose
	// liveness the cluster judges, or this node flushes); when it becomes
	// so, the window starts then, not at the last bytes heard.
	judged bool
}

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

// windowDetector is the fixed-window detector of a plain association: the
// peer is available until nothing has arrived from it for Window. A
// detector that has seen no heartbeat yet counts from Start.
type windowDetector struct {
	// Window is how long the peer may stay silent.
	Window time.Duration
	// Start is when watching began (the handshake); the window runs from
	// it until the first heartbeat.
	Start time.Time

	last time.Time // the latest heartbeat, or zero
}

var _ FailureDetector = (*windowDetector)(nil)

// Heartbeat records a sign of life at now. Out-of-order timestamps never
// move the last heartbeat backwards.
func (d *windowDetector) Heartbeat(now time.Time) {
	if now.After(d.last) {
		d.last = now
	}
}

// Available reports whether less than Window has passed since the last
// heartbeat (or since Start, before the first one).
func (d *windowDetector) Available(now time.Time) bool {
	return now.Sub(d.LastHeard()) < d.Window
}

// LastHeard returns the latest heartbeat, or Start if there has been none.
func (d *windowDetector) LastHeard() time.Time {
	if d.last.IsZero() || d.last.Before(d.Start) {
		return d.Start
	}
	return d.last
}

// PhiAccrual is a phi-accrual failure detector, as the established
// implementations compute it: it keeps a bounded history of heartbeat
// inter-arrival times and reports phi = -log10(1 - F(t)), where F is the
// normal distribution of that history (approximated with the logistic
// formula those implementations use, not an exact erf) and t the time since
// the last heartbeat. A late peer is then a probability rather than a
// deadline.
//
// Make one with a literal, &troupe.PhiAccrual{}: a zero field means its
// default, the established one, so the zero value is ready to use.
type PhiAccrual struct {
	// Threshold is the phi above which the peer counts as unavailable.
	// Default: 8.
	Threshold float64
	// MaxSampleSize bounds the history of intervals. Default: 1000.
	MaxSampleSize int
	// MinStdDeviation is the floor of the standard deviation, so a very
	// regular history does not make phi explode at the first late beat.
	// Default: 100 ms.
	MinStdDeviation time.Duration
	// AcceptableHeartbeatPause is added to the mean: pauses up to it are
	// not held against the peer. Default: 3 s.
	AcceptableHeartbeatPause time.Duration
	// FirstHeartbeatEstimate seeds the history at the first heartbeat
	// (with ± a quarter of it), before any interval has been measured.
	// Default: 1 s.
	FirstHeartbeatEstimate time.Duration

	last      time.Time
	intervals []float64 // ring of the last MaxSampleSize intervals, in ms
	next      int       // where the next interval goes once the ring is full
	sum, sq   float64   // sum and sum of squares of intervals
}

var _ FailureDetector = (*PhiAccrual)(nil)

// The defaults of a PhiAccrual's zero fields.
const (
	phiThreshold     = 8
	phiMaxSampleSize = 1000
	phiMinStd        = 100 * time.Millisecond
	phiPause         = 3 * time.Second
	phiFirstEstimate = time.Second
)

func orDefault[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

// Heartbeat records a heartbeat at now. An interval is not recorded when the
// heartbeat arrives while the peer is judged unavailable, so one long
// outage does not teach the detector that outages are normal.
func (d *PhiAccrual) Heartbeat(now time.Time) {
	if d.last.IsZero() {
		first := float64(orDefault(d.FirstHeartbeatEstimate, phiFirstEstimate)) / float64(time.Millisecond)
		d.add(first - first/4)
		d.add(first + first/4)
	} else if d.Available(now) {
		d.add(float64(now.Sub(d.last)) / float64(time.Millisecond))
	}
	d.last = now
}

func (d *PhiAccrual) add(ms float64) {
	if len(d.intervals) < max(1, orDefault(d.MaxSampleSize, phiMaxSampleSize)) {
		d.intervals = append(d.intervals, ms)
	} else {
		old := d.intervals[d.next]
		d.sum -= old
		d.sq -= old * old
		d.intervals[d.next] = ms
		d.next = (d.next + 1) % len(d.intervals)
	}
	d.sum += ms
	d.sq += ms * ms
}

// Available reports whether phi at now is below Threshold.
func (d *PhiAccrual) Available(now time.Time) bool {
	return d.suspicion(now) < orDefault(d.Threshold, phiThreshold)
}

// suspicion returns phi at now: 0 before the first heartbeat, growing as
// the silence outlasts the usual interval (Stats shows it for each
// member, as Peers[i].Phi). It is never NaN.
func (d *PhiAccrual) suspicion(now time.Time) float64 {
	if d.last.IsZero() || len(d.intervals) == 0 {
		return 0
	}
	n := float64(len(d.intervals))
	mean := d.sum / n
	variance := d.sq/n - mean*mean
	std := math.Sqrt(math.Max(variance, 0))
	std = math.Max(std, float64(orDefault(d.MinStdDeviation, phiMinStd))/float64(time.Millisecond))
	mean += float64(orDefault(d.AcceptableHeartbeatPause, phiPause)) / float64(time.Millisecond)
	return phi(float64(now.Sub(d.last))/float64(time.Millisecond), mean, std)
}

// phi is -log10 of the probability that a heartbeat is later than timeDiff,
// for a normal distribution of mean and std approximated by a logistic
// function.
func phi(timeDiff, mean, std float64) float64 {
	y := (timeDiff - mean) / std
	e := math.Exp(-y * (1.5976 + 0.070566*y*y))
	var p float64
	if timeDiff > mean {
		p = -math.Log10(e / (1 + e))
	} else {
		p = -math.Log10(1 - 1/(1+e))
	}
	if math.IsNaN(p) {
		return math.Inf(1)
	}
	return p
}

// checkLiveness steps a's detector; it runs on the heartbeat goroutine,
// which owns det and lastBeat.
func (l *liveness) checkLiveness(now time.Time) {
	a := l.a
	if a.in == nil {
		return
	}
	if l.closeLate(now) {
		return
	}
	if at := a.in.heard.Load(); at != 0 {
		l.det.Heartbeat(a.n.epoch.Add(time.Duration(at)))
	}
	// A member's liveness is the cluster's to judge, until this node
	// flushes: then nothing but the window stands between a silent peer
	// and the end of the shutdown.
	flushing := a.n.lc.flushBegun()
	judged := flushing || !a.n.cl.isMember(a.peer.uid)
	if judged && !l.judged {
		// A member that exchanged no heartbeats with this node (it
		// watches other members) was judged by the cluster until now:
		// its window starts here, not at whatever was last heard.
		l.det.Start = now
	}
	l.judged = judged
	if !l.det.Available(now) && judged {
		l.declareUnreachable(fmt.Errorf("nothing heard for %v (the limit is %v)", now.Sub(l.det.LastHeard()).Round(time.Millisecond), a.n.cfg.UnreachableAfter))
		return
	}
	if now.Sub(l.lastBeat) >= a.n.cfg.HeartbeatInterval {
		if stuck := l.ackStuck(now); stuck != nil && judged {
			l.declareUnreachable(stuck)
			return
		}
		l.lastBeat = now
		if l.needsBeat() && !flushing { // (a leaving writer sends its queue, then its bye)
			a.beat.Store(true)
		}
		a.notify() // the writer acknowledges what arrived, beat or not
	}
}

// closeLate closes the connection of a session this node gave up on more
// than byeGrace ago, if nothing has closed it: the writer, which says
// goodbye and closes it, may be busy (or gone, in a state that drains).
// It reports whether the session is ending.
func (l *liveness) closeLate(now time.Time) bool {
	a := l.a
	at := a.endingAt.Load()
	if at == 0 {
		return false
	}
	if now.Sub(time.Unix(0, at)) > byeGrace {
		a.mu.Lock()
		conn := a.conn
		a.mu.Unlock()
		closeHard(conn) // a goodbye that took longer will never arrive
	}
	return true
}

// ackStuck says why a's peer counts as gone though it still sends: it
// has acknowledged nothing for UnreachableAfter while frames wait for its
// acknowledgement (a peer that reads and never confirms would otherwise
// hold the window, and every sender waiting on it, for ever). Nil if it
// has.
func (l *liveness) ackStuck(now time.Time) error {
	a := l.a
	a.mu.Lock()
	defer a.mu.Unlock()
	if (a.life.state != assocUp && a.life.state != assocLeaving) || a.win.unackedSeq(a.peer.resumable) == 0 {
		return nil
	}
	if d := now.Sub(a.win.ackMoved); d >= a.n.cfg.UnreachableAfter {
		return fmt.Errorf("%s has acknowledged nothing for %v while %d bytes wait for it (the limit is %v)", a.label(), d.Round(time.Millisecond), a.win.unacked.bytes, a.n.cfg.UnreachableAfter)
	}
	return nil
}

// needsBeat reports whether a's peer needs this node's heartbeats: every
// peer does, except a cluster member that does not watch this one (see
// ClusterConfig.MonitoredMembers) — in a large cluster, heartbeats to
// every member would cost each member bytes in proportion to the cluster.
func (l *liveness) needsBeat() bool {
	a := l.a
	if !a.n.cl.isMember(a.peer.uid) {
		return true
	}
	w := a.n.cl.beat.Load()
	return w == nil || (*w)[a.peer.uid]
}

// declareUnreachable ends an association whose peer went silent. It closes
// the connection and leaves the rest to the reader, which ends the session
// once it has delivered its last frame: nothing from the peer is delivered
// after its watchers are told. A suspended session (no reader) ends at
// once, its end carried out on a goroutine of the node's: the heartbeat
// loop, which calls this, never fails a backlog itself.
func (l *liveness) declareUnreachable(cause error) {
	a := l.a
	a.mu.Lock()
	if a.life.state == assocSuspended {
		// No connection, no reader: the wait for a new connection is
		// over. The session ends here and now; what the end does (a dead
		// letter, decoded again, for each message it held, however many)
		// runs on a goroutine of its own, so that no other peer's
		// detection waits for it.
		ev := a.endEvent(fmt.Errorf("%v, and no new connection: %w", a.life.lostCause, cause))
		var tk taken
		eff, _ := a.stepLocked(ev, &tk)
		a.mu.Unlock()
		if eff != 0 {
			a.n.wg.Go(func() { a.carryOut(eff, &tk) })
		}
		return
	}
	live := a.life.state == assocUp || a.life.state == assocLeaving // (leaving: the connection is reset, and the writer's wait ends)
	a.mu.Unlock()
	if live {
		a.abort(cause)
	}
}

// start starts the window detector as the handshake completes.
func (l *liveness) start(now time.Time) {
	l.det = windowDetector{Window: l.a.n.cfg.UnreachableAfter, Start: now}
}
