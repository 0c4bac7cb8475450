package troupe_test

import (
	"testing"
	"time"

	"troupe"
)

// Issue #51, item 5: the node's Close of a sharded member that cannot
// reach the others stops at once — the leave and the hand-over of its
// shards wait at most the leave's wait each (3 gossip intervals, 1 s to
// 5 s), not twice HandOffTimeout (10 s by default) as Shutdown may.
func TestCloseOfAShardedMemberDoesNotWaitOutTheHandOff(t *testing.T) {
	t.Parallel()
	slowTest(t)
	f := new(troupe.FaultNet)
	l := newLedger()
	// HandOffTimeout at its default; GossipInterval defaults to the
	// node's 20 ms heartbeat, so the leave's wait is 1 s.
	nodes, _, kinds := shardedCluster(t, f, l, troupe.ClusterConfig{StableAfter: singletonStable}, troupe.ShardingConfig{Shards: 12}, "a", "b", "c")
	s := &sender{name: "a"}
	for id := range 24 {
		s.send(kinds[0], "acct-"+string(rune('a'+id)))
	}
	waitUntil(t, 20*time.Second, "the first messages handled", func() bool { return l.count() == 24 })
	if l.handledOn("a") == 0 {
		t.Fatal("no entity ran on a")
	}
	f.Partition(nodes[0], nodes[1])
	f.Partition(nodes[0], nodes[2])
	start := time.Now()
	if err := nodes[0].Close(); err != nil {
		t.Fatal(err)
	}
	// Twice the leave's wait, and room for a loaded machine; the hand-off
	// alone would take 20 s.
	if took := time.Since(start); took > 6*time.Second {
		t.Fatalf("Close took %v; want at most twice the leave's wait (1 s) and some room", took)
	} else {
		t.Logf("Close took %v", took)
	}
}
