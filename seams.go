package troupe

import (
	"sync"
	"sync/atomic"
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
	// beat is the set of members that watch this one: the only members
	// its associations heartbeat.
	beat atomic.Pointer[map[NodeUID]bool]
	// cluster is the cluster this node is a member of, if any.
	cluster atomic.Pointer[Cluster]
	// starts wakes what waits for a cluster to serve as the node's
	// registry (topics, with none).
	starts wakeup
}

// isMember reports whether uid is a member of a cluster this node is in.
func (s *clusterSeam) isMember(uid NodeUID) bool {
	_, ok := s.members.Load(uid)
	return ok
}
