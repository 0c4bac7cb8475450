package troupe

import (
	"errors"
	"fmt"
	"testing"
	"time"
)

func TestQuarantineTable(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	hour := time.Hour
	uid := func(i int) NodeUID { var u NodeUID; u[0], u[1], u[2] = byte(i), byte(i>>8), byte(i>>16); return u }
	a1, a2 := tcpAddr("10.0.0.1:7000"), tcpAddr("10.0.0.2:7000")

	var q quarantineTable
	q.add(quarantineInfo{UID: uid(1), Addrs: []Addr{a1}, Announced: []Addr{a2}, Since: t0})
	steps := []struct {
		at     time.Duration
		uid    NodeUID
		addr   Addr
		want   bool
		listed int
	}{
		{0, uid(1), Addr{}, true, 1},                          // by uid
		{time.Minute, uid(9), a1, true, 1},                    // a new incarnation at the proven address
		{time.Minute, uid(9), a2, false, 1},                   // an announced address refuses nobody
		{hour - time.Second, uid(9), a1, true, 1},             // still within the expiry
		{hour, uid(9), a1, false, 0},                          // the address is freed
		{hour + time.Minute, uid(1), Addr{}, true, 0},         // the uid stays refused (a tombstone)
		{1000 * hour, uid(1), tcpAddr("10.0.0.3:1"), true, 0}, // for good
	}
	for i, s := range steps {
		got := q.find(t0.Add(s.at), hour, s.uid, s.addr) != nil
		if listed := len(q.listLive(t0.Add(s.at), hour)); got != s.want || listed != s.listed {
			t.Fatalf("step %d at +%v: refused %v, listed %d; want %v, %d", i, s.at, got, listed, s.want, s.listed)
		}
	}
	if !q.clear(func(i *quarantineInfo) bool { return i.UID == uid(1) }) || q.find(t0.Add(1000*hour), hour, uid(1)) != nil {
		t.Fatal("clearing the tombstone did not lift it")
	}

	// A flood of misbehaving peers: the table keeps the newest
	// maxQuarantined, and finding one costs no scan.
	var big quarantineTable
	for i := range maxQuarantined + 1000 {
		big.add(quarantineInfo{UID: uid(i + 10), Since: t0.Add(time.Duration(i) * time.Millisecond)})
	}
	if len(big.byUID) != maxQuarantined {
		t.Fatalf("%d entries kept, want %d", len(big.byUID), maxQuarantined)
	}
	if big.find(t0, hour, uid(10)) != nil || big.find(t0, hour, uid(maxQuarantined+1000+9)) == nil {
		t.Fatal("the oldest entries should go first")
	}
	if len(big.order)-big.head != maxQuarantined {
		t.Fatalf("order holds %d live slots, want %d", len(big.order)-big.head, maxQuarantined)
	}
}

// A quarantine added and cleared again and again (a peer that keeps
// misbehaving and an operator who keeps clearing it, or many such peers)
// does not grow the table's order list, whatever entry stays at its head:
// a tombstone, a live entry, or none.
func TestQuarantineOrderStaysBoundedOverAddClearCycles(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	hour := time.Hour
	uid := func(i int) NodeUID { var u NodeUID; u[0], u[1], u[2] = byte(i), byte(i>>8), byte(i>>16); return u }
	const cycles, bound = 20000, 2048
	for _, tc := range []struct {
		what string
		head func(q *quarantineTable) // what stays at the head of the list
		next func(i int) quarantineInfo
	}{
		{"a live entry at the head, one peer again", func(q *quarantineTable) {
			q.add(quarantineInfo{UID: uid(1), Addrs: []Addr{tcpAddr("10.0.0.1:1")}, Since: t0})
		}, func(int) quarantineInfo {
			return quarantineInfo{UID: uid(2), Addrs: []Addr{tcpAddr("10.0.0.2:1")}, Since: t0}
		}},
		{"a tombstone at the head, new peers", func(q *quarantineTable) {
			q.add(quarantineInfo{UID: uid(1), Addrs: []Addr{tcpAddr("10.0.0.1:1")}, Since: t0})
			q.find(t0.Add(2*hour), hour, uid(1)) // expires it: a tombstone
		}, func(i int) quarantineInfo {
			return quarantineInfo{UID: uid(i + 10), Addrs: []Addr{tcpAddr(fmt.Sprintf("10.1.%d.%d:1", i>>8&255, i&255))}, Since: t0.Add(2 * hour)}
		}},
		{"nothing at the head", func(*quarantineTable) {}, func(i int) quarantineInfo {
			return quarantineInfo{UID: uid(i + 10), Since: t0}
		}},
	} {
		var q quarantineTable
		tc.head(&q)
		live := len(q.byUID)
		for i := range cycles {
			e := tc.next(i)
			q.add(e)
			if !q.clear(func(x *quarantineInfo) bool { return x.UID == e.UID }) {
				t.Fatalf("%s: cycle %d cleared nothing", tc.what, i)
			}
			if len(q.order) > bound {
				t.Fatalf("%s: after %d add/clear cycles the order list holds %d slots (%d live entries)", tc.what, i+1, len(q.order), len(q.byUID))
			}
		}
		if len(q.byUID) != live {
			t.Fatalf("%s: %d entries left, want %d", tc.what, len(q.byUID), live)
		}
		if live > 0 && q.find(t0.Add(2*hour), hour, uid(1)) == nil {
			t.Fatalf("%s: the entry at the head was lost", tc.what)
		}
	}
}

// TestClearQuarantineRefusesWhatItCannotUse: ClearQuarantine names a peer
// by an address or a uid, and says so for anything else; its options
// conflict visibly, and OnNode with no address is an error rather than
// this node's own quarantine lifted.
func TestClearQuarantineRefusesWhatItCannotUse(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	n := startNode(t, Config{})
	ctx := ctxT(t, 5*time.Second)
	uid := NodeUID{1}
	n.peers.quarantine.add(quarantineInfo{UID: uid, Since: time.Now()})
	for _, peer := range []string{"", "garbage", "0123"} {
		if ok, err := n.ClearQuarantine(ctx, peer); ok || !errors.Is(err, ErrBadAddr) {
			t.Errorf("ClearQuarantine(%q) = %v, %v; want ErrBadAddr", peer, ok, err)
		}
	}
	if ok, err := n.ClearQuarantine(ctx, "127.0.0.1:1", Reconnect(), OnNode("127.0.0.1:2")); ok || !errors.Is(err, ErrBadConfig) {
		t.Errorf("ClearQuarantine with Reconnect and OnNode = %v, %v; want ErrBadConfig", ok, err)
	}
	if ok, err := n.ClearQuarantine(ctx, uid.String(), OnNode("")); ok || !errors.Is(err, ErrBadAddr) {
		t.Errorf(`ClearQuarantine(uid, OnNode("")) = %v, %v; want ErrBadAddr`, ok, err)
	}
	if !n.peers.isQuarantined(uid) {
		t.Fatal(`ClearQuarantine with OnNode("") lifted this node's own quarantine`)
	}
	if ok, err := n.ClearQuarantine(ctx, uid.String()); !ok || err != nil {
		t.Errorf("ClearQuarantine(uid) = %v, %v; want true, nil", ok, err)
	}
}
