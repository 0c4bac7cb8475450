package troupe

import (
	"maps"
	"slices"
	"testing"
	"time"
)

// A member's copy of another's set moves only by its owner's numbered
// changes in order, or by a whole set; a missing number asks for the
// whole set, and what breaks the bounds is not applied.
func TestRecepCopySteps(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	e := func(name string) recepEntry {
		return recepEntry{Name: name, UUID: UUID{byte(len(name))}, Path: "/user/" + name}
	}
	type step struct {
		delta         *recepDelta
		full          *recepFull
		changed, miss bool
		version       uint64
		entries       []string
	}
	d := func(base, v uint64, add []recepEntry, rm []recepEntry) *recepDelta {
		return &recepDelta{Base: base, Version: v, Added: add, Removed: rm}
	}
	f := func(v uint64, part, parts uint32, es ...recepEntry) *recepFull {
		return &recepFull{Version: v, Part: part, Parts: parts, Entries: es}
	}
	many := make([]recepEntry, recepPiece+1)
	for i := range many {
		many[i] = recepEntry{Name: "s", UUID: UUID{byte(i), byte(i >> 8)}, Path: "/user/x"}
	}
	long := recepEntry{Name: string(make([]byte, maxRegNameLen+1)), Path: "/user/x"}
	cases := []struct {
		name  string
		steps []step
	}{
		{"changes in order", []step{
			{delta: d(0, 1, []recepEntry{e("a")}, nil), changed: true, version: 1, entries: []string{"a"}},
			{delta: d(1, 2, []recepEntry{e("bb")}, nil), changed: true, version: 2, entries: []string{"a", "bb"}},
			{delta: d(2, 3, nil, []recepEntry{{Name: "a", UUID: UUID{1}}}), changed: true, version: 3, entries: []string{"bb"}},
		}},
		{"a missing number asks for the whole set", []step{
			{delta: d(0, 1, []recepEntry{e("a")}, nil), changed: true, version: 1, entries: []string{"a"}},
			{delta: d(2, 3, []recepEntry{e("bb")}, nil), miss: true, version: 1, entries: []string{"a"}},
		}},
		{"an old change is ignored", []step{
			{delta: d(0, 1, []recepEntry{e("a")}, nil), changed: true, version: 1, entries: []string{"a"}},
			{delta: d(0, 1, []recepEntry{e("a")}, nil), version: 1, entries: []string{"a"}},
		}},
		{"a whole set in pieces replaces the copy, then changes follow it", []step{
			{delta: d(0, 1, []recepEntry{e("a")}, nil), changed: true, version: 1, entries: []string{"a"}},
			{full: f(5, 0, 2, e("bb")), version: 1, entries: []string{"a"}},
			{full: f(5, 1, 2, e("ccc")), changed: true, version: 5, entries: []string{"bb", "ccc"}},
			{delta: d(5, 6, []recepEntry{e("dddd")}, nil), changed: true, version: 6, entries: []string{"bb", "ccc", "dddd"}},
		}},
		{"pieces out of order are dropped", []step{
			{full: f(5, 1, 2, e("ccc"))},
			{full: f(5, 0, 2, e("bb"))},
			{full: f(6, 1, 2, e("ccc"))},
			{full: f(5, 1, 2, e("ccc"))},
		}},
		{"an older whole set does not undo newer changes", []step{
			{full: f(3, 0, 1, e("a")), changed: true, version: 3, entries: []string{"a"}},
			{delta: d(3, 4, nil, []recepEntry{{Name: "a", UUID: UUID{1}}}), changed: true, version: 4},
			{full: f(3, 0, 1, e("a")), version: 4},
		}},
		{"an empty whole set at version 0 is taken", []step{
			{full: f(0, 0, 1), changed: true},
		}},
		{"malformed messages change nothing", []step{
			{delta: d(0, 0, []recepEntry{e("a")}, nil)},
			{delta: d(0, 1, many, nil)},
			{delta: d(0, 1, []recepEntry{long}, nil)},
			{delta: d(0, 1, []recepEntry{{Name: "a"}}, nil)}, // no path
			{full: f(1, 0, 0)},
			{full: f(1, 2, 2)},
			{full: f(1, 0, recepMaxParts+1)},
			{full: f(1, 0, 1, long)},
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cp := &recepCopy{entries: map[recepKey]string{}}
			for i, s := range c.steps {
				var changed, miss bool
				if s.delta != nil {
					changed, miss = cp.delta(*s.delta)
				} else {
					changed = cp.full(*s.full)
				}
				var names []string
				for k := range maps.Keys(cp.entries) {
					names = append(names, k.name)
				}
				slices.Sort(names)
				if changed != s.changed || miss != s.miss || cp.version != s.version || !slices.Equal(names, s.entries) {
					t.Fatalf("step %d: changed %v missing %v version %d entries %v; want %v %v %d %v", i, changed, miss, cp.version, names, s.changed, s.miss, s.version, s.entries)
				}
			}
		})
	}
}

// A copy a member can no longer trust (changes lost on the way) is made
// whole again: by the digest, when the last change was lost, and at
// once, when a later change shows a number missing. Messages from a node
// that is not a member are not kept.
func TestClusterRegistryRepairsLostChanges(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	cfg := clusterCfg(nil)
	r := newClusterRig(t, 2, cfg)
	a := r.nodes[0]
	rcA, rcB := r.members[0].recep, r.members[1].recep
	if rcA == nil || rcB == nil {
		t.Fatal("a cluster of nodes without a registry has no receptionist")
	}
	key := ServiceKey[string]{Name: "repair"}
	register := func(name string) {
		ref, err := Spawn(a, name, Behavior[string]{Receive: func(*Context[string], string) {}})
		if err != nil {
			t.Fatal(err)
		}
		if err := key.Register(a, ref); err != nil {
			t.Fatal(err)
		}
	}
	listed := func(want int) func() bool {
		return func() bool {
			regs, _, err := rcB.listing(regSelector{name: key.regName()})
			return err == nil && len(regs) == want
		}
	}
	register("one")
	waitFor(t, 5*time.Second, "b to list a's actor", listed(1))

	// The last change lost: b forgets a's set; a's digest brings it back.
	rcB.mu.Lock()
	rcB.copies[a.uid] = &recepCopy{entries: map[recepKey]string{}}
	rcB.bump()
	rcB.mu.Unlock()
	if !listed(0)() {
		t.Fatal("the copy was not reset")
	}
	waitFor(t, 5*time.Second, "the digest to bring a's set back", listed(1))

	// Changes lost before the next one: b sees a number missing.
	rcA.sendMu.Lock()
	rcA.mu.Lock()
	rcA.version += 5 // as if five changes never arrived
	rcA.mu.Unlock()
	rcA.sendMu.Unlock()
	register("two")
	waitFor(t, 5*time.Second, "b to take a's whole set", listed(2))
	rcB.mu.Lock()
	v := rcB.copies[a.uid].version
	rcB.mu.Unlock()
	rcA.mu.Lock()
	want := rcA.version
	rcA.mu.Unlock()
	if v != want {
		t.Fatalf("b holds a's set at version %d, a is at %d", v, want)
	}

	// A node that is not a member is not heard.
	stranger := NodeUID{0xee}
	rcB.receive(recepDelta{Base: 0, Version: 1, Added: []recepEntry{{Name: key.regName(), UUID: UUID{9}, Path: "/user/x"}}, sentBy: sentBy{from: stranger}})
	rcB.mu.Lock()
	_, kept := rcB.copies[stranger]
	rcB.mu.Unlock()
	if kept {
		t.Fatal("a non-member's entries were kept")
	}
}

// A node that uses a registry keeps its sets there: its cluster runs no
// receptionist. A node restarts its cluster at once after Close (the
// cluster's and the receptionist's paths are free when Close returns).
func TestAReceptionistRunsOnlyWithoutARegistry(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	f := new(FaultNet)
	cfg := failConfig("with-registry", 20*time.Millisecond, 2*time.Second)
	cfg.RegistryAddrs = []string{freeRegistryAddr(t, "tcp")}
	withReg := startOn(t, f, cfg)
	c, err := StartCluster(ctxT(t, 5*time.Second), withReg, clusterCfg(nil))
	if err != nil {
		t.Fatal(err)
	}
	if c.recep != nil {
		t.Fatal("a node with a registry runs a receptionist")
	}
	c.Close()

	alone := startOn(t, f, failConfig("alone", 20*time.Millisecond, 2*time.Second))
	for i := range 10 {
		c, err := StartCluster(ctxT(t, 5*time.Second), alone, clusterCfg(nil))
		if err != nil {
			t.Fatalf("start %d: %v", i, err)
		}
		if c.recep == nil {
			t.Fatal("a node without a registry runs no receptionist")
		}
		c.Close()
	}
}
