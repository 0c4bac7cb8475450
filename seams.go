package troupe

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// clusterSeam is where a cluster plugs into the core: StartCluster sets
// its values and the cluster's loop keeps them, the core's associations
// and lookups read them. Every field is safe for concurrent use; none
// is set while no cluster runs.
type clusterSeam struct {
	// members holds the uids of cluster members (NodeUID -> struct{}):
	// peers exempt from quarantine while they are members.
	members sync.Map
	// quarantinedBy hears that a peer refused this node because it has
	// quarantined it.
	quarantinedBy atomic.Pointer[func(NodeUID)]
	// downedBy hears that a peer's cluster downed this node's
	// incarnation (a hello's notice: heardDowned).
	downedBy atomic.Pointer[func(NodeUID)]
	// beat is the set of members that watch this one: the only members
	// its associations heartbeat.
	beat atomic.Pointer[map[NodeUID]bool]
	// cluster is the cluster this node is a member of, if any.
	cluster atomic.Pointer[Cluster]
	// starts wakes what waits for a cluster to serve as the node's
	// registry (topics, with none).
	starts wakeup
	// plug is what the running cluster does for the core, nil while
	// none runs: StartCluster sets it, the cluster's end clears it.
	plug atomic.Pointer[clusterPlug]
	// former holds the uids of the members of a cluster that was closed
	// on this node before its leave finished: they may still count this
	// node a member and knock, so they stay exempt from quarantine.
	// tomb stops what such a cluster leaves answering them; the next
	// StartCluster on this node calls it and clears former.
	former sync.Map
	tomb   atomic.Pointer[func()]
}

// clusterPlug is what a running cluster does for the core. The core calls
// these, and names none of the unexported names of the cluster's files:
// the cluster plugs in from above.
type clusterPlug struct {
	// entries is the cluster's registry of service keys and topics, when
	// the cluster is the node's registry (there is no other); nil
	// otherwise.
	entries registry
	// leave hands this member's work over and leaves the cluster, before
	// the node stops (lifecycle.leaveCluster): patient for Shutdown,
	// bounded by the leave's wait for Close.
	leave func(ctx context.Context, hurry <-chan struct{}, patient bool)
	// addStats adds the cluster's view (its members, the phi of each
	// peer, what blocks it) to a snapshot of the node's Stats.
	addStats func(s *Stats, now time.Time)
}

// entries returns the running cluster's registry, when the cluster is
// the node's registry, or nil.
func (s *clusterSeam) entries() registry {
	if p := s.plug.Load(); p != nil {
		return p.entries
	}
	return nil
}

// isMember reports whether uid is a member of a cluster this node is in.
func (s *clusterSeam) isMember(uid NodeUID) bool {
	_, ok := s.members.Load(uid)
	return ok
}

// wasMember reports whether uid was a member of a cluster closed on this
// node before its leave finished (see former).
func (s *clusterSeam) wasMember(uid NodeUID) bool {
	_, ok := s.former.Load(uid)
	return ok
}

// wakeup is a channel closed at each signal, for any number of waiters.
type wakeup struct {
	mu mutex[lkWakeup]
	ch chan struct{}
}

// wait returns a channel closed at the next signal.
func (w *wakeup) wait() <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ch == nil {
		w.ch = make(chan struct{})
	}
	return w.ch
}

func (w *wakeup) signal() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ch != nil {
		close(w.ch)
		w.ch = nil
	}
}
