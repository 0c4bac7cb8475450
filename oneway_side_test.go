package troupe_test

import (
	"testing"
	"time"

	"troupe"
)

// Issue #51, item 2: a member whose outgoing traffic is dropped (it
// hears the others; they do not hear it) is downed by the majority, and
// must stop too, though it may never hear that it was downed: alone
// against four, with KeepMajority, it downs itself once its view has been
// unstable for the strategy's decision time. The same for a member that
// can send but not receive. The sides watcher checks all along that no
// two running up members have each written the other off.
func TestAMemberCutOffOneWayStops(t *testing.T) {
	t.Parallel()
	slowTest(t)
	for _, dir := range []string{"cannot send", "cannot receive"} {
		t.Run(dir, func(t *testing.T) {
			f := new(troupe.FaultNet)
			t.Cleanup(f.Heal)
			w := newSidesWatcher()
			nodes, members := faultMembers(t, f, 5, w, func(*troupe.Node) troupe.ClusterConfig {
				return troupe.ClusterConfig{Downing: troupe.KeepMajority(), StableAfter: time.Second}
			})
			stop := make(chan struct{})
			defer close(stop)
			go w.watch(stop)
			x := nodes[2]
			for _, n := range nodes {
				if n == x {
					continue
				}
				if dir == "cannot send" {
					f.Drop(x, n)
				} else {
					f.Drop(n, x)
				}
			}
			// Detection (2 s), StableAfter (1 s), DownAllWhenUnstable (4 s
			// at least), and room for a loaded machine.
			waitUntil(t, 20*time.Second, "the cut-off member to stop", func() bool {
				return clusterStopped(members[2]) || members[2].Self().Status >= troupe.MemberDown
			})
			waitUntil(t, 10*time.Second, "the four to see it gone", func() bool {
				for i, c := range members {
					if i == 2 {
						continue
					}
					for _, m := range c.Members() {
						if m.UID == x.UID() && m.Status < troupe.MemberDown {
							return false
						}
					}
				}
				return true
			})
			for i, c := range members {
				if i != 2 && (clusterStopped(c) || c.Self().Status != troupe.MemberUp) {
					t.Fatalf("member %d is %v (stopped %v), want up", i, c.Self().Status, clusterStopped(c))
				}
			}
			if v := w.check(); v != "" {
				t.Fatal(v)
			}
		})
	}
}
