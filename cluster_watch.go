package troupe

import (
	"slices"
	"time"
)

// watching is a member's failure detectors: one for each member it
// watches (ClusterConfig.MonitoredMembers of the others, on the ring), fed
// with when anything last arrived from it. It is pure — the stamps and the
// clock are given — so that the cluster's loop and the simulator
// (clustersim_test.go) run the same code; its owner is the Cluster's lock
// (or the simulator's one goroutine).
type watching struct {
	detectors map[NodeUID]FailureDetector
	lastHeard map[NodeUID]time.Time
	newDet    func() FailureDetector
}

func newWatching(newDet func() FailureDetector) watching {
	return watching{detectors: map[NodeUID]FailureDetector{}, lastHeard: map[NodeUID]time.Time{}, newDet: newDet}
}

// turn feeds the detectors of the members ms's member watches (monitored)
// with heard, when each last sent anything (zero: nothing, or no
// association), and returns those it finds unreachable at now, and those
// never heard from (the caller dials them, so that their heartbeats can
// reach it: gossip alone may never have connected the two).
func (w *watching) turn(monitored []NodeUID, heard func(NodeUID) time.Time, now time.Time) (mine, silent []NodeUID) {
	for uid := range w.detectors {
		if !slices.Contains(monitored, uid) {
			delete(w.detectors, uid) // watched afresh if it comes back on the ring
			delete(w.lastHeard, uid)
		}
	}
	for _, uid := range monitored {
		at := heard(uid)
		if at.IsZero() {
			silent = append(silent, uid)
		}
		d := w.detectors[uid]
		if d == nil {
			d = w.newDet()
			d.Heartbeat(now) // count from when this member learned of it
			w.detectors[uid] = d
		}
		if !at.IsZero() && !at.Equal(w.lastHeard[uid]) {
			w.lastHeard[uid] = at
			d.Heartbeat(at)
		}
		if !d.Available(now) {
			mine = append(mine, uid)
		}
	}
	return mine, silent
}
