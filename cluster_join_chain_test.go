package troupe

import (
	"testing"
	"time"
)

// A joiner whose seed is itself a joiner: B joins through A, C through B.
// C's knock reaches B before B's reaches A (here: A is cut off from B
// until C is in B's view). B must keep knocking on its seed until it knows
// a member that can admit it, or B and C stay joining for ever with no
// leader while A never hears of them.
func TestClusterJoinerThroughAJoiningSeed(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	r := newClusterRig(t, 1, clusterCfg(KeepMajority()))
	defer r.dumpOnFailure()
	nodeB := startOn(t, r.f, failConfig("b", 20*time.Millisecond, 2*time.Second))
	r.f.Partition(nodeB, r.nodes[0]) // B's knocks do not reach A yet
	b := r.joinVia(nodeB, r.nodes[0])
	c := r.joinVia(startOn(t, r.f, failConfig("c", 20*time.Millisecond, 2*time.Second)), nodeB)
	waitFor(t, 5*time.Second, "B to hear of C", func() bool { return memberStatus(b, r.nodes[2].UID()) == MemberJoining })
	r.f.Heal() // from now on, only B's knocks can tell A of B and C
	waitFor(t, 10*time.Second, "A, B and C up everywhere", func() bool {
		for _, m := range []*Cluster{r.members[0], b, c} {
			for _, n := range r.nodes {
				if memberStatus(m, n.UID()) != MemberUp {
					return false
				}
			}
		}
		return true
	})
}
