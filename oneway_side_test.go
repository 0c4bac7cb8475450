package troupe_test

import (
	"strings"
	"testing"
	"time"

	"troupe"
)

// Issue #51, item 2: a member whose outgoing traffic is dropped (it
// hears the others; they do not hear it) is downed by the majority, and
// must stop too, though it may never hear that it was downed: it hears
// that the others lost it, and once it has lost them too and its view is
// stable for StableAfter, it decides on its own view — alone against
// four, with KeepMajority, its side loses — and downs itself. Not after
// DownAllWhenUnstable, which is set here beyond the test's wait. The
// same for a member that can send but not receive (it hears nothing: its
// own view is the merged one, and it leads its side of one). The sides
// watcher checks all along that no two running up members have each
// written the other off.
//
// With StableAfter (3 s) longer than the node layer's UnreachableAfter
// (2 s), as at the default Config (20 s and 10 s), the others give the
// member that cannot send up before they down it and cannot tell it:
// only its own view stops it. With StableAfter 1 s they tell it while
// they still reach it. A member that cannot receive reports that it lost
// all four, and they lost it: its reports do not count (see
// discounted), so the four are a side, with a leader that downs it.
func TestAMemberCutOffOneWayStops(t *testing.T) {
	t.Parallel()
	slowTest(t)
	for _, tc := range []struct {
		dir    string
		stable time.Duration
	}{
		{"cannot send", time.Second},
		{"cannot receive", time.Second},
		{"cannot send, given up before it is downed", 3 * time.Second},
		{"cannot receive, given up before it is downed", 3 * time.Second},
	} {
		dir := strings.Split(tc.dir, ",")[0]
		t.Run(tc.dir, func(t *testing.T) {
			t.Parallel()
			f := new(troupe.FaultNet)
			t.Cleanup(f.Heal)
			w := newSidesWatcher()
			nodes, members := faultMembers(t, f, 5, w, func(*troupe.Node) troupe.ClusterConfig {
				return troupe.ClusterConfig{Downing: troupe.KeepMajority(), StableAfter: tc.stable, DownAllWhenUnstable: time.Minute}
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
			// The others' detection and quarantine (2 s), its own (2 s),
			// StableAfter (1 s), and room for a loaded machine: well
			// before DownAllWhenUnstable (a minute).
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

// A member that cannot send, downed by the others after their node layer
// gave it up, is told so in the hello of a probe (hello extension 6) and
// stops, though no gossip can reach it and its own view would not stop it
// for minutes (its StableAfter and DownAllWhenUnstable are set beyond the
// test's wait). Before the notice it ran on as up, written off by the
// other four, until its own view decided.
func TestAMemberThatCannotSendIsToldItIsDown(t *testing.T) {
	t.Parallel()
	slowTest(t)
	f := new(troupe.FaultNet)
	t.Cleanup(f.Heal)
	w := newSidesWatcher()
	nodes, members := faultMembers(t, f, 5, w, func(n *troupe.Node) troupe.ClusterConfig {
		if n.Name() == "m2" {
			return troupe.ClusterConfig{Downing: troupe.KeepMajority(), StableAfter: 5 * time.Minute, DownAllWhenUnstable: 5 * time.Minute}
		}
		return troupe.ClusterConfig{Downing: troupe.KeepMajority(), StableAfter: 3 * time.Second, DownAllWhenUnstable: time.Minute}
	})
	stop := make(chan struct{})
	defer close(stop)
	go w.watch(stop)
	x := nodes[2]
	for _, n := range nodes {
		if n != x {
			f.Drop(x, n)
		}
	}
	// The others' detection and quarantine (2 s), StableAfter (3 s), a
	// notice a second, and room for a loaded machine.
	waitUntil(t, 20*time.Second, "the member that cannot send to stop", func() bool {
		return clusterStopped(members[2]) || members[2].Self().Status >= troupe.MemberDown
	})
	for i, c := range members {
		if i != 2 && (clusterStopped(c) || c.Self().Status != troupe.MemberUp) {
			t.Fatalf("member %d is %v (stopped %v), want up", i, c.Self().Status, clusterStopped(c))
		}
	}
	if v := w.check(); v != "" {
		t.Fatal(v)
	}
}

// A group of three that cannot send to the other two, under a lease:
// exactly one side survives, and the other stops. The two hear nothing
// from the three and, a minority, ask for the lease after
// LeaseMinorityDelay; the three, a majority, ask at once once they see the
// two unreachable, which they do only when the two's connections to them
// end (the two's node layer gives them up), so either may be first (under
// -race the three have won). When the two win, no gossip reaches the
// three (no handshake with the two completes): they stop when denied the
// lease, if they ask, or when the two's leader tells them they are down
// in the hello of a probe (hello extension 6). When the three win, the two
// stop when denied. DownAllWhenUnstable is set beyond the test's wait, so
// that no side stops for having waited. The test used to want the two to
// win, and timed out in 2 of about 10 CI runs under load (it was skipped
// since); a run under -race here showed why: the three had won. Two sides
// are checked for all along.
func TestAOneWayCutUnderALeaseLeavesOneSide(t *testing.T) {
	t.Parallel()
	slowTest(t)
	f := new(troupe.FaultNet)
	t.Cleanup(f.Heal)
	leaseNode := faultNode(t, f, "lease")
	if err := leaseNode.ServeLeases(); err != nil {
		t.Fatal(err)
	}
	serving := time.Now()
	const ttl = 2 * time.Second
	w := newSidesWatcher()
	nodes, members := faultMembers(t, f, 5, w, func(node *troupe.Node) troupe.ClusterConfig {
		return troupe.ClusterConfig{Downing: troupe.LeaseMajority(), StableAfter: 3 * time.Second, DownAllWhenUnstable: 5 * time.Minute,
			Lease: troupe.NewNodeLease(node, leaseNode.Addrs()[0].String(), "cluster", ttl)}
	})
	time.Sleep(time.Until(serving.Add(ttl))) // a fresh lease server grants nothing for one ttl
	stop := make(chan struct{})
	defer close(stop)
	go w.watch(stop)
	for _, from := range nodes[2:] {
		for _, to := range nodes[:2] {
			f.Drop(from, to)
		}
	}
	side := func(ms []*troupe.Cluster, up bool) bool {
		for _, c := range ms {
			if stopped := clusterStopped(c) || c.Self().Status >= troupe.MemberDown; stopped == up || up && c.Self().Status != troupe.MemberUp {
				return false
			}
		}
		return true
	}
	one := func() string {
		switch {
		case side(members[:2], true) && side(members[2:], false):
			return "the two"
		case side(members[2:], true) && side(members[:2], false):
			return "the three"
		}
		return ""
	}
	deadline := time.Now().Add(slack(30 * time.Second))
	for one() == "" {
		if time.Now().After(deadline) {
			// What each member sees, for the failure's story.
			for i, c := range members {
				l, _ := c.Leader()
				t.Logf("member %d (%s): %v, stopped %v, err %v, leader %s; unreachable %v; members %v; stats %+v",
					i, nodes[i].Name(), c.Self().Status, clusterStopped(c), c.Err(), l.Addr, c.Unreachable(), c.Members(), nodes[i].Stats().ClusterBlocked)
			}
			t.Fatalf("timed out after %v waiting for one side up and the other stopped", slack(30*time.Second))
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Logf("%s survived", one())
	if v := w.check(); v != "" {
		t.Fatal(v)
	}
}
