package troupe

import (
	"testing"
	"time"
)

func TestQuarantineTable(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	hour := time.Hour
	uid := func(i int) NodeUID { var u NodeUID; u[0], u[1], u[2] = byte(i), byte(i>>8), byte(i>>16); return u }
	a1, a2 := TCPAddr("10.0.0.1:7000"), TCPAddr("10.0.0.2:7000")

	var q quarantineTable
	q.add(QuarantineInfo{UID: uid(1), Addrs: []Addr{a1}, Announced: []Addr{a2}, Since: t0})
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
		{1000 * hour, uid(1), TCPAddr("10.0.0.3:1"), true, 0}, // for good
	}
	for i, s := range steps {
		got := q.find(t0.Add(s.at), hour, s.uid, s.addr) != nil
		if got != s.want || len(q.list()) != s.listed {
			t.Fatalf("step %d at +%v: refused %v, listed %d; want %v, %d", i, s.at, got, len(q.list()), s.want, s.listed)
		}
	}
	if !q.clear(func(i *QuarantineInfo) bool { return i.UID == uid(1) }) || q.find(t0.Add(1000*hour), hour, uid(1)) != nil {
		t.Fatal("clearing the tombstone did not lift it")
	}

	// A flood of misbehaving peers: the table keeps the newest
	// maxQuarantined, and finding one costs no scan.
	var big quarantineTable
	for i := range maxQuarantined + 1000 {
		big.add(QuarantineInfo{UID: uid(i + 10), Since: t0.Add(time.Duration(i) * time.Millisecond)})
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
