package troupe

import (
	"bytes"
	"fmt"
	"hash/fnv"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"
	"time"
)

// The membership core is pure: these tests step it with explicit times
// and gossip built by hand, no network.

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

// at is t0 plus ms milliseconds.
func at(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }

// uidOf is the uid of test member i (1-based); its address is 10.0.0.i.
func uidOf(i int) NodeUID { return NodeUID{byte(i)} }

func memberOf(i int, s MemberStatus, up int) Member {
	return Member{Addr: tcpAddr(fmt.Sprintf("10.0.0.%d:7000", i)), UID: uidOf(i), Status: s, UpNumber: up}
}

// state builds member self's membership holding the given members.
func state(self int, ms ...Member) membership {
	st := newMembership(ms[self-1], t0)
	for _, m := range ms {
		st.members[m.UID] = &m
	}
	st.order = uidOrder{} // (an entry replaced, which the cluster never does)
	st.resetSeen()
	return st
}

// gossipFrom is a gossip message from member i carrying ms.
func gossipFrom(i int, ms ...Member) gossipMsg {
	g := gossipMsg{From: uidOf(i)}
	for _, m := range ms {
		g.Members = append(g.Members, gossipMember{Addr: m.Addr.String(), UID: m.UID, Status: uint8(m.Status), UpNumber: m.UpNumber, AppVersion: m.AppVersion})
	}
	return g
}

// statuses lists each member's status and up number, in uid order.
func statuses(st *membership) string {
	var out []string
	for _, uid := range slices.SortedFunc(maps.Keys(st.members), compareUID) {
		m := st.members[uid]
		out = append(out, fmt.Sprintf("%d:%v:%d", uid[0], m.Status, m.UpNumber))
	}
	return fmt.Sprint(out)
}

// Conflicting gossip converges whatever the order: a status only moves
// forward and the lowest up number wins.
func TestMergeIsOrderIndependent(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	base := []Member{memberOf(1, MemberUp, 1), memberOf(2, MemberUp, 2), memberOf(3, MemberJoining, 0)}
	a := gossipFrom(2, memberOf(1, MemberUp, 1), memberOf(2, MemberLeaving, 2), memberOf(3, MemberUp, 3))
	b := gossipFrom(3, memberOf(1, MemberUp, 1), memberOf(2, MemberUp, 2), memberOf(3, MemberUp, 4), memberOf(4, MemberJoining, 0))
	c := gossipFrom(2, memberOf(2, MemberDown, 2)) // downed while leaving
	orders := [][]gossipMsg{{a, b, c}, {c, b, a}, {b, c, a}}
	var want string
	for i, order := range orders {
		st := state(1, base...)
		for j, g := range order {
			st.merge(g, at(j))
		}
		got := statuses(&st)
		if i == 0 {
			want = got
			if want != "[1:up:1 2:down:2 3:up:3 4:joining:0]" {
				t.Fatalf("merged state %s", want)
			}
		} else if got != want {
			t.Fatalf("order %d gives %s, order 0 gives %s", i, got, want)
		}
	}
}

// Each observer's newest record wins, and only a member speaks for
// itself.
func TestMergeReachability(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	st := state(1, memberOf(1, MemberUp, 1), memberOf(2, MemberUp, 2), memberOf(3, MemberUp, 3))
	st.observe([]NodeUID{uidOf(3)}, at(0))
	g := gossipFrom(2)
	g.Reach = []gossipReach{
		{Observer: uidOf(2), Version: 2, Unreachable: []NodeUID{uidOf(3)}},
		{Observer: uidOf(1), Version: 9, Unreachable: nil}, // about member 1: ignored
	}
	st.merge(g, at(10))
	g.Reach = []gossipReach{{Observer: uidOf(2), Version: 1, Unreachable: nil}} // older: ignored
	st.merge(g, at(20))
	if r := st.reach[uidOf(2)]; r.version != 2 || len(r.unreachable) != 1 {
		t.Fatalf("member 2's record %+v, want version 2", r)
	}
	if r := st.reach[uidOf(1)]; r.version != 1 || len(r.unreachable) != 1 {
		t.Fatalf("this member's own record %+v was overwritten", r)
	}
	if !st.unreachable()[uidOf(3)] || !st.unstable.Equal(at(0)) {
		t.Fatalf("unreachable %v since %v", st.unreachable(), st.unstable)
	}
	st.observe(nil, at(30))
	g.Reach = []gossipReach{{Observer: uidOf(2), Version: 3}}
	st.merge(g, at(40))
	if len(st.unreachable()) != 0 || !st.unstable.IsZero() {
		t.Fatalf("healed, but unreachable %v since %v", st.unreachable(), st.unstable)
	}
}

// A joining member's observations do not make anyone unreachable.
func TestJoiningObserverDoesNotCount(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	st := state(1, memberOf(1, MemberUp, 1), memberOf(2, MemberUp, 2), memberOf(3, MemberJoining, 0))
	g := gossipFrom(3)
	g.Reach = []gossipReach{{Observer: uidOf(3), Version: 1, Unreachable: []NodeUID{uidOf(1), uidOf(2)}}}
	st.merge(g, at(0))
	if len(st.unreachable()) != 0 {
		t.Fatalf("a joiner's observations count: %v", st.unreachable())
	}
}

// An exiting member stops as soon as it learns it may: its silence is its
// exit, not a failure. Observed silent, it gets no "unreachable" event
// (nor a "reachable" one later), it blocks nothing, and the leader removes
// it; a leaving member's silence is a failure, as is any other's.
func TestAnExitingMemberFallingSilentIsNotUnreachable(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	st := state(1, memberOf(1, MemberUp, 1), memberOf(2, MemberUp, 2), memberOf(3, MemberExiting, 3))
	if events := st.observe([]NodeUID{uidOf(3)}, at(0)); len(events) != 0 {
		t.Fatalf("a silent exiting member gave events %v", events)
	}
	st.seen = map[NodeUID]bool{uidOf(1): true, uidOf(2): true}
	if !st.converged() {
		t.Fatal("a silent exiting member blocks convergence")
	}
	st.lead(at(10))
	if got := st.members[uidOf(3)].Status; got != MemberRemoved {
		t.Fatalf("the silent exiting member is %v; want removed", got)
	}
	// a leaving member has not been told to go: its silence is a failure;
	// told to go meanwhile, it is not heard from again (no "reachable")
	st = state(1, memberOf(1, MemberUp, 1), memberOf(2, MemberUp, 2), memberOf(3, MemberLeaving, 3))
	if events := st.observe([]NodeUID{uidOf(3)}, at(0)); len(events) != 1 || events[0].Kind != eventMemberUnreachable {
		t.Fatalf("a silent leaving member gave events %v; want it unreachable", events)
	}
	exiting := memberOf(3, MemberExiting, 3)
	if out := st.merge(gossipFrom(2, memberOf(1, MemberUp, 1), memberOf(2, MemberUp, 2), exiting), at(10)); len(out.events) != 1 || out.events[0].Kind != eventMemberStatus {
		t.Fatalf("the silent leaver told to exit gave events %v; want its status alone", out.events)
	}
}

// A silent exiting member during a split: the crashed member is downed,
// not the member that observes both (the exiting one counts on neither
// side, and its observer is not indirectly connected).
func TestAnExitingMemberFallingSilentInASplit(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	st := state(1, memberOf(1, MemberUp, 2), memberOf(2, MemberUp, 3), memberOf(3, MemberUp, 4), memberOf(4, MemberExiting, 1))
	st.observe([]NodeUID{uidOf(3), uidOf(4)}, at(0))
	d, down := ResolveSplit(KeepMajority(), st.splitView())
	for _, m := range down {
		if m.UID == uidOf(1) || m.UID == uidOf(2) {
			t.Errorf("a reachable up member is downed (%v): %v", d, m.Addr)
		}
	}
	if !slices.ContainsFunc(down, func(m Member) bool { return m.UID == uidOf(3) }) {
		t.Errorf("the crashed member is not downed (%v): %v", d, down)
	}
}

// The leader moves members on only once every live member has seen the
// same state, and nobody is unreachable.
func TestLeaderTransitions(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	st := state(1,
		memberOf(1, MemberUp, 1), memberOf(2, MemberLeaving, 2), memberOf(3, MemberExiting, 3),
		memberOf(4, MemberDown, 4), memberOf(6, MemberJoining, 0), memberOf(5, MemberJoining, 0))
	if ev := st.lead(at(0)); ev != nil {
		t.Fatalf("led before convergence: %v", ev)
	}
	for _, i := range []int{2, 5, 6} { // exiting and down members are not waited for
		st.seen[uidOf(i)] = true
	}
	if st.lead(at(10)) == nil {
		t.Fatal("no transitions after convergence")
	}
	if got := statuses(&st); got != "[1:up:1 2:exiting:2 3:removed:3 4:removed:4 5:up:5 6:up:6]" {
		t.Fatalf("after the leader's step: %s (joiners up in address order)", got)
	}
	if !st.changed.Equal(at(10)) {
		t.Fatalf("changed at %v", st.changed)
	}
	// Not the leader: member 2's view of the same state does nothing.
	st2 := state(2, memberOf(1, MemberUp, 1), memberOf(2, MemberUp, 2), memberOf(3, MemberJoining, 0))
	st2.seen[uidOf(1)], st2.seen[uidOf(3)] = true, true
	if ev := st2.lead(at(0)); ev != nil {
		t.Fatalf("a member that is not the leader led: %v", ev)
	}
}

// When the leader becomes unreachable mid-transition, the next member
// leads, but only once the old leader is down (so nobody is unreachable
// and the state converges).
func TestLeaderChangesMidTransition(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	st := state(2, memberOf(1, MemberUp, 1), memberOf(2, MemberUp, 2), memberOf(3, MemberUp, 3), memberOf(4, MemberJoining, 0))
	if l := st.leader(); l.UID != uidOf(1) {
		t.Fatalf("leader %v, want member 1", l.UID)
	}
	st.observe([]NodeUID{uidOf(1)}, at(0))
	if l := st.leader(); l.UID != uidOf(2) {
		t.Fatalf("with member 1 unreachable the leader is %v, want member 2", l.UID)
	}
	if ev := st.lead(at(10)); ev != nil {
		t.Fatalf("led with a member unreachable: %v", ev)
	}
	st.down([]Member{*st.members[uidOf(1)]}, at(20))
	st.seen[uidOf(3)], st.seen[uidOf(4)] = true, true
	st.lead(at(30))
	if got := statuses(&st); got != "[1:removed:1 2:up:2 3:up:3 4:up:4]" {
		t.Fatalf("after the new leader's step: %s", got)
	}
}

// A member's address is read once, when it is new: a gossiped entry for a
// known member with an address that does not parse still moves its
// status (its address never changes, and a peer could send any valid
// one as well), while a new member whose address does not parse is not
// added.
func TestMergeReadsAnAddressOnlyForANewMember(t *testing.T) {
	t.Parallel()
	st := state(1, memberOf(1, MemberUp, 1), memberOf(2, MemberUp, 2))
	g := gossipFrom(2, memberOf(1, MemberUp, 1), memberOf(2, MemberLeaving, 2), memberOf(3, MemberJoining, 0))
	for i := range g.Members {
		if g.Members[i].UID != uidOf(1) {
			g.Members[i].Addr = "%%% not an address"
		}
	}
	out := st.merge(g, at(10))
	if got := st.members[uidOf(2)]; got.Status != MemberLeaving || got.Addr != memberOf(2, MemberUp, 2).Addr {
		t.Fatalf("member 2 after the merge: %+v, want leaving at its first address", *got)
	}
	if st.members[uidOf(3)] != nil || len(out.added) != 0 {
		t.Fatalf("a new member with an address that does not parse was added: %v", out.added)
	}
	if !out.changed {
		t.Fatal("the merge moved a status but says nothing changed")
	}
}

// A new uid at a live member's address is a new incarnation: the old one
// is downed and its association is to be ended; a sender this member has
// downed is to be told.
func TestMergeNewIncarnationAndDownedSender(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	st := state(1, memberOf(1, MemberUp, 1), memberOf(2, MemberUp, 2))
	reborn := memberOf(2, MemberJoining, 0)
	reborn.UID = NodeUID{42}
	out := st.merge(gossipFrom(42, reborn), at(0))
	if st.members[uidOf(2)].Status != MemberDown || !slices.Equal(out.ended, []NodeUID{uidOf(2)}) || !slices.Equal(out.added, []NodeUID{{42}}) {
		t.Fatalf("old incarnation %v, ended %v, added %v", st.members[uidOf(2)].Status, out.ended, out.added)
	}
	out = st.merge(gossipFrom(2, memberOf(2, MemberJoining, 0)), at(10))
	if out.tellTo == nil || out.tellTo.UID != uidOf(2) {
		t.Fatalf("the downed sender is not told: %+v", out.tellTo)
	}
	if st.members[uidOf(2)].Status != MemberDown {
		t.Fatal("a downed member's own gossip brought it back")
	}
	// A sender whose own gossip says it is down knows: telling it again
	// would answer its every gossip with the whole state, and two downed
	// members, each telling the other, would trade states as fast as the
	// network carries them until each stops at its next turn (the
	// simulator saw a thousand a second between two members).
	if out = st.merge(gossipFrom(2, memberOf(2, MemberDown, 2)), at(20)); out.tellTo != nil {
		t.Fatalf("a sender that knows it is down is told again: %+v", out.tellTo)
	}
}

// When downing acts, and on which member.
func TestNextDowning(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	tm := timing{stableAfter: 100 * time.Millisecond, unstableAfter: 400 * time.Millisecond}
	split := func(self int) membership {
		// Members 1 and 2 cannot reach 3: member 1 leads that side.
		st := state(self, memberOf(1, MemberUp, 1), memberOf(2, MemberUp, 2), memberOf(3, MemberUp, 3))
		st.reach[uidOf(1)] = reachRecord{version: 1, unreachable: []NodeUID{uidOf(3)}}
		st.reach[uidOf(2)] = reachRecord{version: 1, unreachable: []NodeUID{uidOf(3)}}
		st.changed, st.unstable = at(0), at(0)
		return st
	}
	cases := []struct {
		name     string
		st       membership
		now      int
		strategy bool
		want     downingStep
	}{
		{"no strategy", split(1), 1000, false, stepWait},
		{"not stable yet", split(1), 50, true, stepWait},
		{"stable, the side leader", split(1), 100, true, stepDecide},
		{"stable, not the side leader", split(2), 100, true, stepWait},
		{"stable, on the unreachable side", split(3), 100, true, stepWait},
		{"unstable too long, the side leader", split(1), 501, true, stepDownAll},
		{"unstable too long, no side leader here", split(3), 501, true, stepSelf},
		{"already decided", func() membership { st := split(1); st.decided, st.decidedOn = true, st.unreachableKey(); return st }(), 1000, true, stepWait},
		{"decided, then another member failed: a new split", func() membership { st := split(1); st.decided, st.decidedOn = true, "an earlier set"; return st }(), 100, true, stepDecide},
		{"this member is down", func() membership { st := split(1); st.members[uidOf(1)].Status = MemberDown; return st }(), 0, true, stepStop},
		{"no split", state(1, memberOf(1, MemberUp, 1), memberOf(2, MemberUp, 2)), 1000, true, stepWait},
		{"reported unreachable, it lost the others too, stable: its own view", cutOff(split(3)), 100, true, stepOwnView},
		{"reported unreachable, it lost the others too, not stable yet", cutOff(split(3)), 50, true, stepWait},
		{"reported unreachable, it lost the others too, no strategy", cutOff(split(3)), 100, false, stepWait},
		{"reported unreachable, it lost the others too, unstable too long", cutOff(split(3)), 501, true, stepSelf},
		{"reported unreachable, it lost the others too, already decided", func() membership {
			st := cutOff(split(3))
			st.decided, st.decidedOn = true, st.unreachableKey()
			return st
		}(), 1000, true, stepWait},
		{"its own view kept it: not asked again for the same", func() membership { st := cutOff(split(3)); st.ownKept = st.ownKey(); return st }(), 100, true, stepWait},
		{"its own view kept it, then unstable too long: it downs itself", func() membership { st := cutOff(split(3)); st.ownKept = st.ownKey(); return st }(), 501, true, stepSelf},
		{"its own view kept it, then it lost more: asked again", func() membership {
			st := cutOff(split(3))
			st.ownKept = st.ownKey()
			r := st.reach[uidOf(3)]
			r.version++
			st.reach[uidOf(3)] = r
			return st
		}(), 100, true, stepOwnView},
		{"unstable too long, not leading, its leader waits for the lease", waiting(split(2), 1, 300, 100), 501, true, stepWait},
		{"unstable too long, not leading, its leader's wait and margin ended", waiting(split(2), 1, 300, 100), 601, true, stepSelf},
		{"unstable too long, not leading, a wait heard about another split", func() membership {
			st := waiting(split(2), 1, 300, 100)
			st.reach[uidOf(2)] = reachRecord{version: 2, unreachable: []NodeUID{uidOf(3), uidOf(4)}}
			m4 := memberOf(4, MemberUp, 4)
			st.members[uidOf(4)] = &m4
			st.touched(at(0)) // (changed by hand: say so, as every change does)
			return st
		}(), 501, true, stepSelf},
		{"unstable too long, not leading, the wait came from a member it cannot reach", waiting(split(2), 3, 300, 100), 501, true, stepSelf},
		{"unstable too long, not leading, a wait longer than any lease wait", waiting(split(2), 1, int(maxLeaseWait/time.Millisecond)+61_000, 100), 501, true, stepSelf},
		{"unstable too long, leading: a wait heard changes nothing", waiting(split(1), 2, 300, 100), 501, true, stepDownAll},
		{"reported unreachable, lost the others, but joining: its observations do not count", func() membership {
			st := cutOff(split(3))
			st.members[uidOf(3)].Status = MemberJoining
			return st
		}(), 100, true, stepWait},
	}
	for _, tc := range cases {
		if got := tc.st.nextDowning(at(tc.now), tc.strategy, tm); got != tc.want {
			t.Errorf("%s: nextDowning = %d, want %d", tc.name, got, tc.want)
		}
	}
}

// waiting is st having heard at 200 ms from member from that it waits
// for the lease for d ms more (and decides by then), with a margin of
// margin ms.
func waiting(st membership, from, d, margin int) membership {
	st.heardLeaseWait(uidOf(from), time.Duration(d)*time.Millisecond, time.Duration(margin)*time.Millisecond, maxLeaseWait+time.Minute, at(200))
	return st
}

// cutOff is st with member 3 having lost members 1 and 2 itself: it is
// cut off, both ways or one way (they report it; it reports them).
func cutOff(st membership) membership {
	st.reach[uidOf(3)] = reachRecord{version: 1, unreachable: []NodeUID{uidOf(1), uidOf(2)}}
	return st
}

// A member that the others report unreachable decides on its own view:
// cut off from four (one way or both), its side of one loses with the
// majority rules, a lease's included (no lease is asked for a view only
// it holds); having lost one of four, its side of four would survive, so
// it does nothing (the merged view's side leaders decide).
func TestAMemberOnNoSideDecidesOnItsOwnView(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	five := func(lost ...int) membership {
		st := state(3, memberOf(1, MemberUp, 1), memberOf(2, MemberUp, 2), memberOf(3, MemberUp, 3), memberOf(4, MemberUp, 4), memberOf(5, MemberUp, 5))
		for _, o := range []int{1, 2, 4, 5} {
			st.reach[uidOf(o)] = reachRecord{version: 1, unreachable: []NodeUID{uidOf(3)}}
		}
		var mine []NodeUID
		for _, l := range lost {
			mine = append(mine, uidOf(l))
		}
		st.reach[uidOf(3)] = reachRecord{version: 1, unreachable: mine}
		return st
	}
	six := state(6, memberOf(1, MemberUp, 1), memberOf(2, MemberUp, 2), memberOf(3, MemberUp, 3), memberOf(4, MemberUp, 4), memberOf(5, MemberUp, 5), memberOf(6, MemberUp, 6))
	six.reach[uidOf(6)] = reachRecord{version: 1, unreachable: []NodeUID{uidOf(1), uidOf(2), uidOf(3)}}
	cases := []struct {
		name      string
		st        membership
		strategy  DowningStrategy
		reachable int
		loses     bool
	}{
		{"lost all four, KeepMajority", five(1, 2, 4, 5), KeepMajority(), 1, true},
		{"lost all four, LeaseMajority", five(1, 2, 4, 5), LeaseMajority(), 1, true},
		{"lost all four, StaticQuorum(3)", five(1, 2, 4, 5), StaticQuorum(3), 1, true},
		{"lost one of four, KeepMajority", five(1), KeepMajority(), 4, false},
		{"lost one of four, LeaseMajority", five(1), LeaseMajority(), 4, false},
		{"lost two of four, LeaseMajority: 3 against 2 keeps", five(1, 2), LeaseMajority(), 3, false},
		{"lost three of four, LeaseMajority: a strict minority loses", five(1, 2, 4), LeaseMajority(), 2, true},
		// Six, split evenly in its own view: by size the lowest address
		// keeps its side, and member 1 is on the other; a lease decides
		// an even split otherwise (whoever holds it), so it does not lose.
		{"six, 3 against 3, KeepMajority: the lowest address is there", six, KeepMajority(), 3, true},
		{"six, 3 against 3, LeaseMajority: the lease decides, not the address", six, LeaseMajority(), 3, false},
	}
	for _, tc := range cases {
		v := tc.st.ownView()
		if len(v.Reachable) != tc.reachable || len(v.Reachable)+len(v.Unreachable) != len(tc.st.members) {
			t.Errorf("%s: own view %d reachable, %d unreachable; want %d reachable of %d", tc.name, len(v.Reachable), len(v.Unreachable), tc.reachable, len(tc.st.members))
		}
		if got := ownViewLoses(tc.strategy, v); got != tc.loses {
			t.Errorf("%s: its side loses = %v, want %v", tc.name, got, tc.loses)
		}
	}
}

// Whose reports count: not those of a member that more than half of the
// counting members report unreachable, unless that would leave out half
// of them or more.
func TestTheReportsOfAMemberMostLostDoNotCount(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	members := func(k int) membership {
		var ms []Member
		for i := 1; i <= k; i++ {
			ms = append(ms, memberOf(i, MemberUp, i))
		}
		return state(1, ms...)
	}
	report := func(st membership, obs int, lost ...int) {
		var us []NodeUID
		for _, l := range lost {
			us = append(us, uidOf(l))
		}
		st.reach[uidOf(obs)] = reachRecord{version: 1, unreachable: us}
	}
	cases := []struct {
		name        string
		st          func() membership
		discounted  []int
		unreachable []int
	}{
		{"five, one cannot receive: it lost four, four lost it", func() membership {
			st := members(5)
			report(st, 3, 1, 2, 4, 5)
			for _, o := range []int{1, 2, 4, 5} {
				report(st, o, 3)
			}
			return st
		}, []int{3}, []int{3}},
		{"five, one cannot receive, only it has reported so far", func() membership {
			st := members(5)
			report(st, 3, 1, 2, 4, 5)
			return st
		}, nil, []int{1, 2, 4, 5}},
		{"three, a pair cut, the third hears both: one report each", func() membership {
			st := members(3)
			report(st, 1, 2)
			report(st, 2, 1)
			return st
		}, nil, []int{1, 2}},
		{"two, a clean split", func() membership {
			st := members(2)
			report(st, 1, 2)
			report(st, 2, 1)
			return st
		}, nil, []int{1, 2}},
		{"five, three cannot receive and the two lost them: all would be left out, all count", func() membership {
			st := members(5)
			report(st, 3, 1, 2, 4, 5)
			report(st, 4, 1, 2, 3, 5)
			report(st, 5, 1, 2, 3, 4)
			report(st, 1, 3, 4, 5)
			report(st, 2, 3, 4, 5)
			return st
		}, nil, []int{1, 2, 3, 4, 5}},
		{"five, a joining member's reports never counted", func() membership {
			st := members(5)
			st.members[uidOf(5)].Status = MemberJoining
			report(st, 5, 1, 2, 3, 4)
			report(st, 1, 5)
			return st
		}, nil, []int{5}},
	}
	ids := func(m map[NodeUID]bool) []int {
		var out []int
		for i := 1; i <= 5; i++ {
			if m[uidOf(i)] {
				out = append(out, i)
			}
		}
		return out
	}
	for _, tc := range cases {
		st := tc.st()
		if got := ids(st.discounted()); !slices.Equal(got, tc.discounted) {
			t.Errorf("%s: discounted %v, want %v", tc.name, got, tc.discounted)
		}
		if got := ids(st.unreachable()); !slices.Equal(got, tc.unreachable) {
			t.Errorf("%s: unreachable %v, want %v", tc.name, got, tc.unreachable)
		}
	}
}

// On a ring, a member is watched by MonitoredMembers others, not by all:
// a member cut off from receiving in a cluster of 18 is reported by the 9
// that watch it, which is more than half of its watchers though not of
// the cluster, and its reports do not count.
func TestTheReportsOfAMemberCutOffOnARingDoNotCount(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	var ms []Member
	for i := 1; i <= 18; i++ {
		ms = append(ms, memberOf(i, MemberUp, i))
	}
	st := state(1, ms...)
	st.watchedBy = 9
	r, x := st.ring(), uidOf(9)
	var others []NodeUID
	for _, u := range r {
		if u != x {
			others = append(others, u)
		}
	}
	st.reach[x] = reachRecord{version: 1, unreachable: others} // it lost everyone
	for _, w := range r {
		if w != x && slices.Contains(st.monitorsOf(w, 9, r), x) {
			st.reach[w] = reachRecord{version: 1, unreachable: []NodeUID{x}}
		}
	}
	if u := st.unreachable(); len(u) != 1 || !u[x] {
		t.Fatalf("%d of 18 unreachable, want only the member cut off", len(u))
	}
}

// A member's own findings count in its own view, discounted or not: the
// member that cannot send, which the four report, lists the four it lost
// (Cluster.Unreachable, events), and is on no side of its merged view.
func TestAMembersOwnReportsCountInItsOwnView(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	st := state(3, memberOf(1, MemberUp, 1), memberOf(2, MemberUp, 2), memberOf(3, MemberUp, 3), memberOf(4, MemberUp, 4), memberOf(5, MemberUp, 5))
	for _, o := range []int{1, 2, 4, 5} {
		st.reach[uidOf(o)] = reachRecord{version: 1, unreachable: []NodeUID{uidOf(3)}}
	}
	if !st.discounted()[uidOf(3)] {
		t.Fatal("the member the four report is not discounted")
	}
	st.reach[uidOf(3)] = reachRecord{version: 1, unreachable: []NodeUID{uidOf(1), uidOf(2), uidOf(4), uidOf(5)}}
	if u := st.unreachable(); len(u) != 5 {
		t.Fatalf("its own view lists %d unreachable, want all 5 (the four it lost, and itself as the four report)", len(u))
	}
	if v := st.splitView(); len(v.Reachable) != 0 {
		t.Fatalf("it is on a side of its merged view: %d reachable", len(v.Reachable))
	}
}

// A record that names a member twice counts once.
func TestARecordNamingAMemberTwiceCountsOnce(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	st := state(1, memberOf(1, MemberUp, 1), memberOf(2, MemberUp, 2), memberOf(3, MemberUp, 3), memberOf(4, MemberUp, 4), memberOf(5, MemberUp, 5))
	st.reach[uidOf(2)] = reachRecord{version: 1, unreachable: []NodeUID{uidOf(4), uidOf(4), uidOf(4)}}
	if off := st.discounted(); len(off) != 0 {
		t.Fatalf("discounted %v after one record naming member 4 three times", off)
	}
}

// Each member watches the next k on a ring every member computes alike,
// plus the unreachable ones it passes; watchers is the inverse.
func TestMonitoringRing(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	var ms []Member
	for i := 1; i <= 12; i++ {
		ms = append(ms, memberOf(i, MemberUp, i))
	}
	st := state(1, ms...)
	r := st.ring()
	if len(r) != 12 {
		t.Fatalf("ring of %d", len(r))
	}
	for _, uid := range r {
		mon := st.monitorsOf(uid, 3, r)
		if len(mon) != 3 || slices.Contains(mon, uid) {
			t.Fatalf("%v monitors %v, want 3 others", uid, mon)
		}
	}
	// Every member is watched by exactly k others.
	for i := 1; i <= 12; i++ {
		other := state(i, ms...)
		if w := other.watchers(3); len(w) != 3 {
			t.Fatalf("member %d has %d watchers, want 3", i, len(w))
		}
	}
	// An unreachable one is kept, and one more is watched in its place.
	self := r[0]
	first := st.monitorsOf(self, 3, r)
	st.reach[self] = reachRecord{version: 1, unreachable: []NodeUID{first[0]}}
	if got := st.monitorsOf(self, 3, r); len(got) != 4 || got[0] != first[0] {
		t.Fatalf("with %v unreachable, monitors %v", first[0], got)
	}
	// A small cluster watches everyone.
	small := state(1, ms[:4]...)
	if got := small.monitorsOf(uidOf(1), 9, small.ring()); len(got) != 3 {
		t.Fatalf("4 members, k=9: monitors %v", got)
	}
}

// Gossip goes to members that have not seen the state, reachable ones
// first, and to one unreachable one a turn when only those have not; when
// all have, a digest goes to one.
func TestGossipTargets(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	st := state(1, memberOf(1, MemberUp, 1), memberOf(2, MemberUp, 2), memberOf(3, MemberUp, 3), memberOf(4, MemberUp, 4), memberOf(5, MemberRemoved, 5))
	first := func(int) int { return 0 }
	to, full := st.gossipTargets(2, first)
	if !full || !slices.Equal(to, []NodeUID{uidOf(2), uidOf(3)}) {
		t.Fatalf("targets %v full %v", to, full)
	}
	st.reach[uidOf(1)] = reachRecord{version: 1, unreachable: []NodeUID{uidOf(2)}}
	st.resetSeen()
	if to, _ := st.gossipTargets(5, first); !slices.Equal(to, []NodeUID{uidOf(3), uidOf(4)}) {
		t.Fatalf("with 2 unreachable, targets %v, want the reachable unseen", to)
	}
	st.seen[uidOf(3)], st.seen[uidOf(4)] = true, true
	if to, _ := st.gossipTargets(5, first); !slices.Equal(to, []NodeUID{uidOf(2)}) {
		t.Fatalf("only the unreachable is unseen: targets %v, want it", to)
	}
	// Across a cut the state goes to one a turn, not to five: what is
	// sent there is mostly lost, and a split used to cost every member a
	// whole state to five members of the other side every turn.
	st.reach[uidOf(1)] = reachRecord{version: 2, unreachable: []NodeUID{uidOf(2), uidOf(3), uidOf(4)}}
	st.resetSeen()
	if to, full := st.gossipTargets(5, first); !full || !slices.Equal(to, []NodeUID{uidOf(2)}) {
		t.Fatalf("three unreachable unseen: targets %v full %v, want one, the state", to, full)
	}
	st.reach[uidOf(1)] = reachRecord{version: 3, unreachable: []NodeUID{uidOf(2)}}
	st.resetSeen()
	st.seen[uidOf(2)], st.seen[uidOf(3)], st.seen[uidOf(4)] = true, true, true
	if to, full := st.gossipTargets(5, first); full || len(to) != 1 {
		t.Fatalf("all seen: targets %v full %v, want one digest", to, full)
	}
}

// A member downed but not yet removed — crashed, so it never confirms
// that it has seen anything — does not keep the state from the members
// across a cut: the pair that lost each other must each hear the other's
// report. It did (TestClusterSimDecidesACutPairOnItsWholeView): the
// downed member took the place of the reachable members that had not
// seen the state, the cut pair heard nothing until it was removed, which
// the cut held up, and each of the pair, knowing only its own report,
// led its side and downed the other.
//
// An exiting member whose node goes on (Cluster.Leave returns when its
// cluster stops) is the same: its cluster confirms nothing more, its
// node answers heartbeats, so it is never found unreachable either.
func TestGossipReachesACutPairBesideADownedMember(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	for _, tc := range []struct {
		status MemberStatus
		pick   func(int) int
	}{
		{MemberDown, func(int) int { return 0 }},
		{MemberDown, func(n int) int { return n - 1 }},
		{MemberExiting, func(int) int { return 0 }},
		{MemberExiting, func(n int) int { return n - 1 }},
	} {
		pick := tc.pick
		st := state(3, memberOf(1, MemberUp, 1), memberOf(2, MemberUp, 2), memberOf(3, MemberUp, 3), memberOf(4, MemberUp, 4), memberOf(5, tc.status, 5))
		st.reach[uidOf(1)] = reachRecord{version: 1, unreachable: []NodeUID{uidOf(2)}}
		st.reach[uidOf(2)] = reachRecord{version: 1, unreachable: []NodeUID{uidOf(1)}}
		st.touched(t0)
		st.resetSeen()
		st.seen[uidOf(4)] = true
		to, full := st.gossipTargets(gossipFanout, pick)
		if !full || !slices.Contains(to, uidOf(1)) && !slices.Contains(to, uidOf(2)) {
			t.Fatalf("member 5 %v: targets %v full %v: want the state sent to one of the cut pair", tc.status, to, full)
		}
		if !slices.Contains(to, uidOf(5)) {
			t.Fatalf("member 5 %v: targets %v: it must still hear it", tc.status, to)
		}
		// A reachable member that has not seen it goes first, as before.
		st.seen[uidOf(4)] = false
		if to, _ := st.gossipTargets(gossipFanout, pick); slices.Contains(to, uidOf(1)) || slices.Contains(to, uidOf(2)) || !slices.Contains(to, uidOf(4)) {
			t.Fatalf("member 5 %v: with a reachable member unseen, targets %v: want it, not the cut pair", tc.status, to)
		}
	}
}

// A merged change is passed on at once only if none was in the last
// gossip interval; the others wait for the turn, which carries them all.
func TestPassOnOncePerInterval(t *testing.T) {
	t.Parallel()
	st := state(1, memberOf(1, MemberUp, 1))
	for _, tc := range []struct {
		at   time.Duration // since t0
		want bool
	}{
		{0, true},                       // the first change
		{500 * time.Millisecond, false}, // within the interval
		{999 * time.Millisecond, false},
		{time.Second, true}, // an interval after the last pass
		{1200 * time.Millisecond, false},
		{5 * time.Second, true},
		{5 * time.Second, false}, // the same instant
	} {
		if got := st.passOn(t0.Add(tc.at), time.Second); got != tc.want {
			t.Fatalf("a change at t0+%v: passed on %v, want %v", tc.at, got, tc.want)
		}
	}
}

// A downed member whose address a later incarnation now holds is gone
// (two processes cannot listen on one address): gossip for it would reach
// the new incarnation — or, sent by that incarnation, itself — so it is
// no target. Found beside two CPU burners: a member restarted at its
// address gossiped only to its own address, the leader's fanout went
// there too, and the leader never heard that the new member had seen its
// state, so the new member stayed joining.
func TestGossipSkipsAnIncarnationReplacedAtItsAddress(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	old := memberOf(3, MemberDown, 3)
	reborn := Member{Addr: old.Addr, UID: uidOf(4), Status: MemberJoining}
	first := func(int) int { return 0 }
	last := func(n int) int { return n - 1 }
	for _, tc := range []struct {
		name string
		self int
		seen []int
		want []NodeUID
		full bool
	}{
		// The new incarnation has seen everything but its predecessor.
		{"the new incarnation", 4, []int{1, 2}, nil, false},
		// The leader has not heard the new one has seen its state.
		{"the leader", 1, []int{2}, []NodeUID{uidOf(4)}, true},
		{"a member that has heard from all", 2, []int{1, 4}, nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, pick := range []func(int) int{first, last} {
				ms := []Member{memberOf(1, MemberUp, 1), memberOf(2, MemberUp, 2), old, reborn}
				st := newMembership(ms[tc.self-1], t0)
				for _, m := range ms {
					st.members[m.UID] = &m
				}
				st.resetSeen()
				for _, i := range tc.seen {
					st.seen[uidOf(i)] = true
				}
				to, full := st.gossipTargets(1, pick)
				if slices.Contains(to, old.UID) {
					t.Fatalf("targets %v include the replaced incarnation %v", to, old.UID)
				}
				if tc.want != nil && (!full || !slices.Equal(to, tc.want)) {
					t.Fatalf("targets %v full %v, want %v full", to, full, tc.want)
				}
				if tc.want == nil && (full || len(to) != 1) {
					t.Fatalf("targets %v full %v, want a digest to one live member", to, full)
				}
			}
		})
	}
}

// A member's app version: learned from any gossip when unknown, from the
// member itself whenever it speaks (a relay's copy never overrides it),
// and never longer than maxAppVersion.
func TestMergeAppVersion(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	with := func(m Member, v string) Member { m.AppVersion = v; return m }
	long := string(make([]byte, maxAppVersion+1))
	cases := []struct {
		name   string
		gossip []gossipMsg
		want   string // member 2's version at member 1
	}{
		{"unknown", []gossipMsg{gossipFrom(3, with(memberOf(2, MemberUp, 2), ""))}, ""},
		{"from a relay", []gossipMsg{gossipFrom(3, with(memberOf(2, MemberUp, 2), "v1"))}, "v1"},
		{"a relay's stale copy after the member's own", []gossipMsg{gossipFrom(2, with(memberOf(2, MemberUp, 2), "v2")), gossipFrom(3, with(memberOf(2, MemberUp, 2), "v1"))}, "v2"},
		{"the member's own after a relay's", []gossipMsg{gossipFrom(3, with(memberOf(2, MemberUp, 2), "v1")), gossipFrom(2, with(memberOf(2, MemberUp, 2), "v2"))}, "v2"},
		{"too long", []gossipMsg{gossipFrom(2, with(memberOf(2, MemberUp, 2), long))}, ""},
		{"a new member, too long", []gossipMsg{gossipFrom(3, with(memberOf(4, MemberUp, 4), long))}, ""},
	}
	for _, c := range cases {
		st := state(1, with(memberOf(1, MemberUp, 1), "mine"), memberOf(2, MemberUp, 2), memberOf(3, MemberUp, 3))
		for i, g := range c.gossip {
			st.merge(g, at(i))
		}
		uid := uidOf(2)
		if c.name == "a new member, too long" {
			uid = uidOf(4)
		}
		if got := st.members[uid].AppVersion; got != c.want {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
		if st.members[uidOf(1)].AppVersion != "mine" {
			t.Errorf("%s: this member's own version changed to %q", c.name, st.members[uidOf(1)].AppVersion)
		}
	}
}

// The digest is part of the protocol: members of different versions compare
// it. digest builds it without fmt; its value is the one the format
// "%x:%d:%d;" per member and "%x:%d;" per observer gives (the first
// version's), on random states.
func TestMembershipDigestKeepsItsValue(t *testing.T) {
	t.Parallel()
	byFmt := func(ms *membership) uint64 {
		h := fnv.New64a()
		byBytes := func(a, b NodeUID) int { return bytes.Compare(a[:], b[:]) }
		for _, uid := range slices.SortedFunc(maps.Keys(ms.members), byBytes) {
			m := ms.members[uid]
			fmt.Fprintf(h, "%x:%d:%d;", uid, m.Status, m.UpNumber)
		}
		for _, o := range slices.SortedFunc(maps.Keys(ms.reach), byBytes) {
			fmt.Fprintf(h, "%x:%d;", o, ms.reach[o].version)
		}
		return h.Sum64()
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for n := range 40 {
		ms := membership{members: map[NodeUID]*Member{}, reach: map[NodeUID]reachRecord{}}
		for range n {
			var uid NodeUID
			for i := range uid {
				uid[i] = byte(rng.Uint32())
			}
			ms.members[uid] = &Member{UID: uid, Status: MemberStatus(rng.IntN(6)), UpNumber: rng.IntN(100000)}
			if rng.IntN(2) == 0 {
				ms.reach[uid] = reachRecord{version: rng.Uint64()}
			}
		}
		want := byFmt(&ms)
		if got := ms.digest(); got != want {
			t.Fatalf("%d members: digest %x, the format gives %x", n, got, want)
		}
		// A gossiped state: in order as snapshot sends it (digestOf's
		// fast path), shuffled, and naming a member twice (the maps').
		g := ms.snapshot()
		if got := digestOf(g); got != want {
			t.Fatalf("%d members, a snapshot: digest %x, the format gives %x", n, got, want)
		}
		g.Members, g.Reach = slices.Clone(g.Members), slices.Clone(g.Reach) // (snapshot's are shared)
		rng.Shuffle(len(g.Members), func(i, j int) { g.Members[i], g.Members[j] = g.Members[j], g.Members[i] })
		rng.Shuffle(len(g.Reach), func(i, j int) { g.Reach[i], g.Reach[j] = g.Reach[j], g.Reach[i] })
		if got := digestOf(g); got != want {
			t.Fatalf("%d members, shuffled: digest %x, the format gives %x", n, got, want)
		}
		if n > 0 {
			slices.SortFunc(g.Members, func(a, b gossipMember) int { return compareUID(a.UID, b.UID) })
			g.Members = slices.Insert(g.Members, 0, g.Members[0])
			if got := digestOf(g); got != want {
				t.Fatalf("%d members, one named twice: digest %x, the format gives %x", n, got, want)
			}
		}
	}
}

func BenchmarkMembershipDigest(b *testing.B) {
	for _, n := range []int{100, 1000} {
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			rng := rand.New(rand.NewPCG(1, 2))
			ms := membership{members: map[NodeUID]*Member{}, reach: map[NodeUID]reachRecord{}}
			for i := range n {
				var uid NodeUID
				for j := range uid {
					uid[j] = byte(rng.Uint32())
				}
				ms.members[uid] = &Member{UID: uid, Status: MemberUp, UpNumber: i + 1}
				ms.reach[uid] = reachRecord{version: uint64(i)}
			}
			b.ReportAllocs()
			for b.Loop() {
				ms.digest()
			}
		})
	}
}

// watchers walks back from the member only as far as a watcher can be; it
// is the inverse of monitorsOf, computed the long way, on random rings
// with random unreachable sets, for several k.
func TestWatchersIsTheInverseOfMonitorsOf(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(3, 4))
	for round := range 200 {
		n := 2 + rng.IntN(40)
		var ms []Member
		for i := 1; i <= n; i++ {
			status := MemberUp
			if rng.IntN(6) == 0 {
				status = MemberDown // off the ring, and named in records
			}
			ms = append(ms, memberOf(i, status, i))
		}
		k := 1 + rng.IntN(10)
		self := 1 + rng.IntN(n)
		st := state(self, ms...)
		for i := 1; i <= n; i++ {
			if rng.IntN(3) == 0 {
				var lost []NodeUID
				for range rng.IntN(6) {
					lost = append(lost, uidOf(1+rng.IntN(n)))
				}
				st.reach[uidOf(i)] = reachRecord{version: 1, unreachable: lost}
			}
		}
		st.touched(at(round)) // a new state: the ring is computed anew
		r := st.ring()
		want := map[NodeUID]bool{}
		for _, uid := range r {
			if uid != st.self && slices.Contains(st.monitorsOf(uid, k, r), st.self) {
				want[uid] = true
			}
		}
		if got := st.watchers(k); !maps.Equal(got, want) {
			t.Fatalf("round %d, %d members, k=%d: watchers %v, want %v", round, n, k, got, want)
		}
	}
}

// A restarted member that hears of its earlier incarnation (at its own
// address, another uid) downs it: two processes cannot listen on one
// address. It used to keep it up — it never replaced itself — and gossip
// it so; a member that then learned of both in one gossip downed the one
// it read first, which could be the new one (found by the simulator's
// review: the order was the map's).
func TestARestartedMemberDownsItsEarlierIncarnation(t *testing.T) {
	t.Parallel()
	reborn := memberOf(2, MemberJoining, 0)
	reborn.UID = NodeUID{42}
	st := newMembership(reborn, t0)
	out := st.merge(gossipFrom(1, memberOf(1, MemberUp, 1), memberOf(2, MemberUp, 2)), at(0))
	if got := st.members[uidOf(2)].Status; got != MemberDown {
		t.Fatalf("the earlier incarnation is %v in the new one's view, want down", got)
	}
	if !slices.Contains(out.ended, uidOf(2)) {
		t.Fatalf("ended %v, want the earlier incarnation's association ended", out.ended)
	}
	if got := st.members[NodeUID{42}].Status; got != MemberJoining {
		t.Fatalf("the new incarnation is %v in its own view", got)
	}
}

// BenchmarkMembershipMerge is a member of n receiving a gossiped state
// (a snapshot from another member) that it already holds, the most
// common gossip while news spreads, and one in which one member's
// status moved.
func BenchmarkMembershipMerge(b *testing.B) {
	for _, n := range []int{100, 1000} {
		rng := rand.New(rand.NewPCG(1, 2))
		var all []*Member
		for i := range n {
			var uid NodeUID
			for j := range uid {
				uid[j] = byte(rng.Uint32())
			}
			all = append(all, &Member{Addr: tcpAddr(fmt.Sprintf("10.0.%d.%d:7000", i/256, i%256)), UID: uid, Status: MemberUp, UpNumber: i + 1})
		}
		build := func(self int) membership {
			ms := newMembership(*all[self], time.Unix(0, 0))
			for _, m := range all {
				mm := *m
				ms.members[m.UID] = &mm
				ms.reach[m.UID] = reachRecord{version: 1}
			}
			ms.resetSeen()
			return ms
		}
		from := build(1)
		for _, m := range all {
			from.seen[m.UID] = true
		}
		same := from.snapshot()
		b.Run(fmt.Sprintf("members=%d/held", n), func(b *testing.B) {
			ms := build(0)
			b.ReportAllocs()
			for b.Loop() {
				ms.merge(same, time.Unix(1, 0))
			}
		})
		b.Run(fmt.Sprintf("members=%d/news", n), func(b *testing.B) {
			news := same
			news.Members = slices.Clone(same.Members)
			news.Members[n/2].Status = uint8(MemberLeaving)
			b.ReportAllocs()
			for b.Loop() {
				b.StopTimer()
				ms := build(0)
				b.StartTimer()
				ms.merge(news, time.Unix(1, 0))
			}
		})
	}
}

// What membership keeps per state (who is unreachable, who leads, the
// gossiped members and records, the uids' order and text) follows every
// change: after each of a long random run of merges (in uid order,
// shuffled, naming a member twice, bringing new members, new records, a
// new app version), observations, the leader's moves and downings, each
// kept answer is the one computed afresh.
func TestMembershipCachesFollowEveryChange(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(3, 4))
	const most = 24
	var all []Member
	for i := 1; i <= most; i++ {
		all = append(all, memberOf(i, MemberUp, i))
	}
	st := state(1, all[:8]...)
	fresh := func() gossipMsg {
		var g gossipMsg
		for _, uid := range slices.SortedFunc(maps.Keys(st.members), compareUID) {
			m := st.members[uid]
			g.Members = append(g.Members, gossipMember{Addr: m.Addr.String(), UID: m.UID, Status: uint8(m.Status), UpNumber: m.UpNumber, AppVersion: m.AppVersion})
		}
		for _, o := range slices.SortedFunc(maps.Keys(st.reach), compareUID) {
			r := st.reach[o]
			g.Reach = append(g.Reach, gossipReach{Observer: o, Version: r.version, Unreachable: r.unreachable})
		}
		return g
	}
	byFmt := func() uint64 {
		h := fnv.New64a()
		for _, gm := range fresh().Members {
			fmt.Fprintf(h, "%x:%d:%d;", gm.UID, gm.Status, gm.UpNumber)
		}
		for _, r := range fresh().Reach {
			fmt.Fprintf(h, "%x:%d;", r.Observer, r.Version)
		}
		return h.Sum64()
	}
	versions := map[NodeUID]uint64{}
	for step := range 3000 {
		now := at(step)
		switch op := rng.IntN(10); {
		case op < 6: // gossip from another member, with changes
			g := st.snapshot()
			g.From = uidOf(2 + rng.IntN(most-1))
			g.Members, g.Reach = slices.Clone(g.Members), slices.Clone(g.Reach)
			for i := range g.Members {
				switch rng.IntN(12) {
				case 0:
					g.Members[i].Status = uint8(min(int(MemberRemoved), int(g.Members[i].Status)+1))
				case 1:
					g.Members[i].UpNumber = rng.IntN(30)
				case 2:
					g.Members[i].AppVersion = fmt.Sprintf("v%d", rng.IntN(3))
				}
			}
			if rng.IntN(3) == 0 { // a member new here
				m := all[rng.IntN(most)]
				g.Members = append(g.Members, gossipMember{Addr: m.Addr.String(), UID: m.UID, Status: uint8(rng.IntN(3)), UpNumber: rng.IntN(30)})
			}
			if rng.IntN(2) == 0 { // a newer record from some observer
				o := uidOf(2 + rng.IntN(most-1))
				versions[o]++
				var lost []NodeUID
				for range rng.IntN(3) {
					lost = append(lost, uidOf(1+rng.IntN(most)))
				}
				g.Reach = append(g.Reach, gossipReach{Observer: o, Version: versions[o], Unreachable: lost})
			}
			switch rng.IntN(3) {
			case 0: // in uid order, as snapshot sends it
				slices.SortFunc(g.Members, func(a, b gossipMember) int { return compareUID(a.UID, b.UID) })
				g.Members = slices.CompactFunc(g.Members, func(a, b gossipMember) bool { return a.UID == b.UID })
				slices.SortFunc(g.Reach, func(a, b gossipReach) int { return compareUID(a.Observer, b.Observer) })
				g.Reach = slices.CompactFunc(g.Reach, func(a, b gossipReach) bool { return a.Observer == b.Observer })
			case 1:
				rng.Shuffle(len(g.Members), func(i, j int) { g.Members[i], g.Members[j] = g.Members[j], g.Members[i] })
			case 2:
				if len(g.Members) > 0 {
					g.Members = append(g.Members, g.Members[rng.IntN(len(g.Members))])
				}
			}
			st.merge(g, now)
		case op < 8: // this member's own findings
			var lost []NodeUID
			for range rng.IntN(3) {
				lost = append(lost, uidOf(2+rng.IntN(most-1)))
			}
			st.observe(slices.Compact(slices.SortedFunc(slices.Values(lost), compareUID)), now)
		case op < 9:
			st.lead(now)
		default:
			if u := uidOf(2 + rng.IntN(most-1)); st.members[u] != nil {
				st.down([]Member{*st.members[u]}, now)
			}
		}
		if got, want := st.unreachable(), st.weighUnreachable(); !maps.Equal(got, want) {
			t.Fatalf("step %d: unreachable %v, afresh %v", step, got, want)
		}
		got, want := st.leader(), st.chooseLeader()
		if (got == nil) != (want == nil) || got != nil && got.UID != want.UID {
			t.Fatalf("step %d: leader %v, afresh %v", step, got, want)
		}
		snap, w := st.snapshot(), fresh()
		if !slices.Equal(snap.Members, w.Members) || !slices.EqualFunc(snap.Reach, w.Reach, func(a, b gossipReach) bool {
			return a.Observer == b.Observer && a.Version == b.Version && slices.Equal(a.Unreachable, b.Unreachable)
		}) {
			t.Fatalf("step %d: snapshot\n%+v\nafresh\n%+v", step, snap, w)
		}
		if got, want := st.digest(), byFmt(); got != want || st.digested != want {
			t.Fatalf("step %d: digest %x (kept %x), the format gives %x", step, got, st.digested, want)
		}
	}
	if len(st.members) < most/2 || len(st.reach) < 4 {
		t.Fatalf("the run reached %d members and %d observers: too few changes to test", len(st.members), len(st.reach))
	}
}

// A member's reachability changes when an observer's reports start or
// stop counting, not only when reports change: a downed observer's
// reports stop counting (the members it alone found unreachable are
// reachable again), and a joiner's count once it is up. Each change has
// its event, as a merge's or an observation's has: a region that saw a
// member unreachable holds its shards' messages until it sees it
// reachable again (found by the simulator: such a member's shards were
// held for good).
func TestReachabilityFollowsTheObserversThatCount(t *testing.T) {
	t.Parallel()
	has := func(events []MemberEvent, i int, kind string) bool {
		for _, e := range events {
			if e.Member.UID == uidOf(i) && e.Kind == kind {
				return true
			}
		}
		return false
	}
	// Member 3 alone reports 2 unreachable; 1 downs 3.
	st := state(1, memberOf(1, MemberUp, 1), memberOf(2, MemberUp, 2), memberOf(3, MemberUp, 3), memberOf(4, MemberUp, 4))
	st.reach[uidOf(3)] = reachRecord{version: 1, unreachable: []NodeUID{uidOf(2)}}
	st.touched(at(0))
	if !st.unreachable()[uidOf(2)] {
		t.Fatal("2 is not unreachable to begin with")
	}
	ev := st.down([]Member{memberOf(3, MemberUp, 3)}, at(10))
	if st.unreachable()[uidOf(2)] {
		t.Fatal("2 is still unreachable once the only member that reported it is down")
	}
	if !has(ev, 2, eventMemberReachable) {
		t.Fatalf("down: events %v; want 2 reachable", ev)
	}
	// A member downed while unreachable is not announced reachable; nor,
	// to a member that downs its own side, are the members across the
	// split (its side's reports stop counting as it goes down).
	st = state(1, memberOf(1, MemberUp, 1), memberOf(2, MemberUp, 2), memberOf(3, MemberUp, 3))
	st.reach[uidOf(1)] = reachRecord{version: 1, unreachable: []NodeUID{uidOf(2)}}
	st.touched(at(0))
	ev = st.down([]Member{memberOf(2, MemberUp, 2)}, at(10))
	if has(ev, 2, eventMemberReachable) {
		t.Fatalf("down: events %v; a downed member announced reachable", ev)
	}
	st = state(1, memberOf(1, MemberUp, 1), memberOf(2, MemberUp, 2), memberOf(3, MemberUp, 3))
	st.reach[uidOf(1)] = reachRecord{version: 1, unreachable: []NodeUID{uidOf(3)}}
	st.touched(at(0))
	ev = st.down([]Member{memberOf(1, MemberUp, 1), memberOf(2, MemberUp, 2)}, at(10))
	if has(ev, 3, eventMemberReachable) {
		t.Fatalf("down of its own side: events %v; the member across the split announced reachable", ev)
	}
	// A joiner reports 2 unreachable; once the leader makes it up, its
	// report counts.
	st = state(1, memberOf(1, MemberUp, 1), memberOf(2, MemberUp, 2), memberOf(5, MemberJoining, 0))
	st.reach[uidOf(5)] = reachRecord{version: 1, unreachable: []NodeUID{uidOf(2)}}
	st.touched(at(0))
	st.seen[uidOf(2)], st.seen[uidOf(5)] = true, true
	if st.unreachable()[uidOf(2)] {
		t.Fatal("a joiner's report counted")
	}
	ev = st.lead(at(10))
	if !st.unreachable()[uidOf(2)] {
		t.Fatal("the joiner, up, has its report not counted")
	}
	if !has(ev, 2, eventMemberUnreachable) {
		t.Fatalf("lead: events %v; want 2 unreachable", ev)
	}
}
