package troupe

import (
	"fmt"
	"slices"
	"testing"
)

// members builds a membership: "u" is up, "j" joining, "l" leaving, with
// addresses 10.0.0.1 … in order and up numbers in order.
func members(statuses string) []Member {
	out := make([]Member, len(statuses))
	for i, s := range statuses {
		st := map[rune]MemberStatus{'u': MemberUp, 'j': MemberJoining, 'l': MemberLeaving}[s]
		out[i] = Member{Addr: tcpAddr(fmt.Sprintf("10.0.0.%d:7000", i+1)), UID: NodeUID{byte(i + 1)}, Status: st, UpNumber: i + 1}
	}
	return out
}

// split returns the view of the side holding the members at idx.
func split(ms []Member, idx ...int) SplitView {
	var v SplitView
	in := map[int]bool{}
	for _, i := range idx {
		in[i] = true
	}
	for i, m := range ms {
		if in[i] {
			v.Reachable = append(v.Reachable, m)
		} else {
			v.Unreachable = append(v.Unreachable, m)
		}
	}
	return v
}

// The rules of Akka's Split Brain Resolver, case by case. Members are
// written "u" up, "j" joining, "l" leaving, oldest and lowest-addressed
// first; the view is the side holding the members at the listed indexes.
func TestDowningStrategies(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	tests := []struct {
		name     string
		strategy DowningStrategy
		members  string
		side     []int
		want     Downing
	}{
		// keep-majority
		{"majority 2|1, the two", KeepMajority(), "uuu", []int{0, 1}, DownUnreachable},
		{"majority 2|1, the one", KeepMajority(), "uuu", []int{2}, DownReachable},
		{"majority 3|2, the three", KeepMajority(), "uuuuu", []int{2, 3, 4}, DownUnreachable},
		{"majority 3|2, the two", KeepMajority(), "uuuuu", []int{0, 1}, DownReachable},
		{"majority 2|2 tie, the side with the lowest address", KeepMajority(), "uuuu", []int{0, 3}, DownUnreachable},
		{"majority 2|2 tie, the other side", KeepMajority(), "uuuu", []int{1, 2}, DownReachable},
		{"majority, joining members do not count here", KeepMajority(), "uuujj", []int{0, 3, 4}, DownReachable},
		{"majority, the other side's joining members may be up there: down all", KeepMajority(), "uuujj", []int{1, 2}, DownEveryone},
		{"majority, joining there that cannot tip it", KeepMajority(), "uuuuj", []int{0, 1, 2}, DownUnreachable},
		{"majority, this side's leaving member may be exiting: down all", KeepMajority(), "uul", []int{1, 2}, DownEveryone},
		{"majority, a leaving member that cannot tip it", KeepMajority(), "uuuul", []int{0, 1, 4}, DownUnreachable},
		{"majority, three-way 2|2|1: this pair downs itself", KeepMajority(), "uuuuu", []int{0, 1}, DownReachable},
		{"majority, three-way 2|2|1: the single downs itself", KeepMajority(), "uuuuu", []int{4}, DownReachable},
		{"majority, nobody unreachable", KeepMajority(), "uuu", []int{0, 1, 2}, DownUnreachable},
		{"majority, only joining members", KeepMajority(), "jj", []int{0}, DownEveryone},

		// static-quorum
		{"quorum 2 of 3, the two", StaticQuorum(2), "uuu", []int{0, 1}, DownUnreachable},
		{"quorum 2 of 3, the one", StaticQuorum(2), "uuu", []int{2}, DownReachable},
		{"quorum 3 with 5 = 2·3−1 members", StaticQuorum(3), "uuuuu", []int{0, 1, 2}, DownUnreachable},
		{"quorum 2 with 5 members is a configuration error", StaticQuorum(2), "uuuuu", []int{0, 1}, DownEveryone},
		{"quorum, three-way: nobody has 3", StaticQuorum(3), "uuuuu", []int{2, 3}, DownReachable},
		{"quorum, joining members do not count", StaticQuorum(3), "uuujj", []int{0, 1, 3}, DownReachable},
		{"quorum, leaving members count", StaticQuorum(2), "ulu", []int{0, 1}, DownUnreachable},
		{"quorum, no member that counts", StaticQuorum(2), "jj", []int{0}, DownEveryone},

		// keep-oldest
		{"oldest here", KeepOldest(false), "uuu", []int{0}, DownUnreachable},
		{"oldest there", KeepOldest(false), "uuu", []int{1, 2}, DownReachable},
		{"oldest alone against two: it downs itself", KeepOldest(true), "uuu", []int{0}, DownReachable},
		{"the two against a lonely oldest survive", KeepOldest(true), "uuu", []int{1, 2}, DownUnreachable},
		{"oldest with company, down if alone", KeepOldest(true), "uuu", []int{0, 1}, DownUnreachable},
		{"two members: the oldest survives", KeepOldest(true), "uu", []int{0}, DownUnreachable},
		{"two members: the younger downs itself", KeepOldest(true), "uu", []int{1}, DownReachable},
		{"oldest, three-way: the oldest's side", KeepOldest(false), "uuuuu", []int{0, 4}, DownUnreachable},
		{"oldest, three-way: another side", KeepOldest(false), "uuuuu", []int{2, 3}, DownReachable},
		{"oldest is leaving here and may be exiting: down all", KeepOldest(false), "luu", []int{0}, DownEveryone},
		{"oldest leaving, the next oldest here too", KeepOldest(false), "luu", []int{0, 1}, DownUnreachable},
		{"oldest alone once joining members count: down all", KeepOldest(true), "uuj", []int{0}, DownEveryone},
		{"joining members do not matter without down-if-alone", KeepOldest(false), "uuj", []int{0}, DownUnreachable},

		// down-all
		{"down all", DownAll(), "uuu", []int{0, 1}, DownEveryone},
		{"down all, no split", DownAll(), "uuu", []int{0, 1, 2}, DownUnreachable},
	}
	for _, tt := range tests {
		if got := tt.strategy.Decide(split(members(tt.members), tt.side...)); got != tt.want {
			t.Errorf("%s: %T.Decide = %v, want %v", tt.name, tt.strategy, got, tt.want)
		}
	}
}

func TestLeaseMajorityRule(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	tests := []struct {
		members  string
		side     []int
		minority bool
	}{
		{"uuu", []int{0, 1}, false},
		{"uuu", []int{2}, true},
		{"uuuu", []int{0, 3}, false}, // a half, with the lowest address
		{"uuuu", []int{1, 2}, true},  // a half, without it
		{"uuujj", []int{0, 3, 4}, true},
		{"uuu", []int{0, 1, 2}, false},
	}
	for _, tt := range tests {
		if got := minorityDelay(split(members(tt.members), tt.side...)); got != tt.minority {
			t.Errorf("%s side %v: MinorityDelay = %v, want %v", tt.members, tt.side, got, tt.minority)
		}
	}
	if leaseDecision(true) != DownUnreachable || leaseDecision(false) != DownReachable {
		t.Error("the lease holder survives; a side without it downs itself")
	}
}

// leaseWon is LeaseMajority when this side acquires the lease.
type leaseWon struct{}

func (leaseWon) Decide(SplitView) Downing { return leaseDecision(true) }

// Indirectly connected members are downed first; the clean partition that
// remains goes to the strategy. Observations are "observer>subject" with
// 1-based member numbers.
func TestResolveSplit(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	tests := []struct {
		name    string
		members string
		side    []int    // 0-based indexes of this side
		obs     []string // "1>2": member 1 cannot reach member 2
		want    Downing
		down    string          // 1-based numbers of the members downed
		s       DowningStrategy // KeepMajority if nil
	}{
		{"clean 3|2, the three", "uuuuu", []int{0, 1, 2}, []string{"1>4", "1>5", "2>4", "2>5", "3>4", "3>5"}, DownUnreachable, "45", nil},
		{"clean 3|2, the two", "uuuuu", []int{3, 4}, []string{"4>1", "4>2", "4>3", "5>1", "5>2", "5>3"}, DownReachable, "45", nil},
		{"a crash", "uuu", []int{0, 1}, []string{"1>3", "2>3"}, DownUnreachable, "3", nil},
		{"partial partition in 3: the younger of the pair goes", "uuu", []int{2}, []string{"1>2", "2>1"}, DownIndirectlyConnected, "2", nil},
		{"a joiner that became up reaching only its seed is downed alone", "uuuuuu", []int{0}, []string{"2>6", "3>6", "4>6", "5>6", "6>2", "6>3", "6>4", "6>5"}, DownIndirectlyConnected, "6", nil},
		{"a joining member that reaches only its seed is downed alone", "uuuuuj", []int{0, 1, 2, 3, 4}, []string{"2>6", "3>6", "4>6", "5>6", "6>2", "6>3", "6>4", "6>5"}, DownUnreachable, "6", nil},
		{"one-way: 1 of 5 cannot send", "uuuuu", []int{0, 1, 2, 3}, []string{"1>5", "2>5", "3>5", "4>5"}, DownUnreachable, "5", nil},
		{"one-way: 1 of 5 cannot receive, its own view", "uuuuu", []int{4}, []string{"5>1", "5>2", "5>3", "5>4"}, DownReachable, "5", nil},
		{"one member of three cannot reach another: the unreachable one is downed", "uuu", []int{0, 2}, []string{"1>2"}, DownUnreachable, "2", nil},
		{"indirect plus a clean split: indirect first, then the strategy", "uuuuu", []int{0}, []string{"1>4", "1>5", "2>4", "2>5", "3>4", "3>5", "2>3", "3>2"}, DownReachable, "12345", nil},
		{"indirect plus a clean split, the bigger side", "uuuuuuu", []int{0, 1, 2, 3}, []string{"1>6", "1>7", "2>6", "2>7", "3>6", "3>7", "4>6", "4>7", "3>4", "4>3"}, DownUnreachable, "467", nil},
		// The nemesis's split: 5 is cut off from the others; 4 cannot
		// send to 3, so 3 finds 4 unreachable. 5 is in the most lost
		// pairs, but 4 is the one some reach and others do not: taken out
		// first, it goes with this side whatever the strategy says. (It
		// was left on "the other side" with 5, and stayed up when this
		// side lost the lease and 5 downed it.)
		{"a member cut off beside a one-way drop: the lease denied", "uuuuu", []int{0, 1, 2}, []string{"1>5", "2>5", "3>5", "4>5", "3>4"}, DownReachable, "1234", LeaseMajority()},
		{"a member cut off beside a one-way drop: the majority", "uuuuu", []int{0, 1, 2}, []string{"1>5", "2>5", "3>5", "4>5", "3>4"}, DownUnreachable, "45", nil},

		// From review: each scenario from the view of each side that
		// decides, with KeepMajority (nil), the lease won (leaseWon{}) and
		// the lease denied (LeaseMajority(), whose Decide is the denial).
		// A side that loses must leave up only members that are on the
		// winning side: one left up on its far side but in fact reached
		// from this side stays up beside the winner that downed it.

		// The nemesis's split from 5's own side: clean, 1 against 4.
		{"a member cut off beside a one-way drop, its own view: the majority", "uuuuu", []int{4}, []string{"5>1", "5>2", "5>3", "5>4"}, DownReachable, "5", nil},
		{"a member cut off beside a one-way drop, its own view: the lease won", "uuuuu", []int{4}, []string{"5>1", "5>2", "5>3", "5>4"}, DownUnreachable, "1234", leaseWon{}},
		{"a member cut off beside a one-way drop: the lease won", "uuuuu", []int{0, 1, 2}, []string{"1>5", "2>5", "3>5", "4>5", "3>4"}, DownUnreachable, "45", leaseWon{}},
		// The drop the other way: 3 cannot send to 4, so 3 straddles it.
		{"a member cut off beside the reverse drop: the lease denied", "uuuuu", []int{0, 1, 3}, []string{"1>5", "2>5", "3>5", "4>5", "4>3"}, DownReachable, "1234", LeaseMajority()},
		{"a member cut off beside the reverse drop: the lease won", "uuuuu", []int{0, 1, 3}, []string{"1>5", "2>5", "3>5", "4>5", "4>3"}, DownUnreachable, "35", leaseWon{}},
		{"a member cut off beside the reverse drop: the majority", "uuuuu", []int{0, 1, 3}, []string{"1>5", "2>5", "3>5", "4>5", "4>3"}, DownUnreachable, "35", nil},

		// A symmetric partial partition: 1 and 2 cannot hear each other,
		// 3, 4 and 5 hear both (and relay both's gossip): one view, led
		// by 3. The younger of the pair goes; the rest is the whole
		// cluster, which a denied lease downs.
		{"symmetric partial partition in 5: the majority", "uuuuu", []int{2, 3, 4}, []string{"1>2", "2>1"}, DownIndirectlyConnected, "2", nil},
		{"symmetric partial partition in 5: the lease won", "uuuuu", []int{2, 3, 4}, []string{"1>2", "2>1"}, DownIndirectlyConnected, "2", leaseWon{}},
		{"symmetric partial partition in 5: the lease denied", "uuuuu", []int{2, 3, 4}, []string{"1>2", "2>1"}, DownReachable, "12345", LeaseMajority()},

		// 5 can send but not receive: it finds everyone unreachable and,
		// nobody finding it so, leads every view. Alone it survives only
		// with the lease.
		{"one-way: 1 of 5 cannot receive, the lease won", "uuuuu", []int{4}, []string{"5>1", "5>2", "5>3", "5>4"}, DownUnreachable, "1234", leaseWon{}},
		{"one-way: 1 of 5 cannot receive, the lease denied", "uuuuu", []int{4}, []string{"5>1", "5>2", "5>3", "5>4"}, DownReachable, "5", LeaseMajority()},
		// 5 can receive but not send: the others find it unreachable and
		// it finds nobody so. Denied, they down themselves and 5 hears
		// it: it stays up alone, with nobody up who downed it.
		{"one-way: 1 of 5 cannot send, the lease won", "uuuuu", []int{0, 1, 2, 3}, []string{"1>5", "2>5", "3>5", "4>5"}, DownUnreachable, "5", leaseWon{}},
		{"one-way: 1 of 5 cannot send, the lease denied", "uuuuu", []int{0, 1, 2, 3}, []string{"1>5", "2>5", "3>5", "4>5"}, DownReachable, "1234", LeaseMajority()},

		// A joiner, up, reaching only its seed 1: everyone else is in a
		// lost pair with it, so 1 alone is reachable and leads.
		{"a joiner reaching only its seed: the lease won", "uuuuuu", []int{0}, []string{"2>6", "3>6", "4>6", "5>6", "6>2", "6>3", "6>4", "6>5"}, DownIndirectlyConnected, "6", leaseWon{}},
		{"a joiner reaching only its seed: the lease denied", "uuuuuu", []int{0}, []string{"2>6", "3>6", "4>6", "5>6", "6>2", "6>3", "6>4", "6>5"}, DownReachable, "123456", LeaseMajority()},

		// A clean 3|2 split with 2 unable to send to 3 (3 finds 2
		// unreachable). The three's view: 2 goes first and is counted
		// with the two, so the majority is lost (the two lose too, in
		// their own view, clean 2|3: everyone is downed; before, 2 was
		// left up alone). With the lease denied 2 must go with this side:
		// before, 5 and 4 went first and 2 was left on the far side, up
		// beside the two that won the lease and downed it.
		{"clean 3|2, a drop inside the three, their view: the majority", "uuuuu", []int{0, 2}, []string{"1>4", "1>5", "2>4", "2>5", "3>4", "3>5", "3>2"}, DownReachable, "123", nil},
		{"clean 3|2, a drop inside the three, their view: the lease won", "uuuuu", []int{0, 2}, []string{"1>4", "1>5", "2>4", "2>5", "3>4", "3>5", "3>2"}, DownUnreachable, "245", leaseWon{}},
		{"clean 3|2, a drop inside the three, their view: the lease denied", "uuuuu", []int{0, 2}, []string{"1>4", "1>5", "2>4", "2>5", "3>4", "3>5", "3>2"}, DownReachable, "123", LeaseMajority()},
		{"clean 3|2, a drop inside the three, the two's view: the lease won", "uuuuu", []int{3, 4}, []string{"4>1", "4>2", "4>3", "5>1", "5>2", "5>3"}, DownUnreachable, "123", leaseWon{}},
		// The same with 5 unable to send to 4: the three see a clean split.
		{"clean 3|2, a drop inside the two, their view: the majority", "uuuuu", []int{3}, []string{"4>1", "4>2", "4>3", "5>1", "5>2", "5>3", "4>5"}, DownReachable, "45", nil},
		{"clean 3|2, a drop inside the two, their view: the lease won", "uuuuu", []int{3}, []string{"4>1", "4>2", "4>3", "5>1", "5>2", "5>3", "4>5"}, DownUnreachable, "1235", leaseWon{}},
		{"clean 3|2, a drop inside the two, their view: the lease denied", "uuuuu", []int{3}, []string{"4>1", "4>2", "4>3", "5>1", "5>2", "5>3", "4>5"}, DownReachable, "45", LeaseMajority()},
		{"clean 3|2, a drop inside the two, the three's view: the lease won", "uuuuu", []int{0, 1, 2}, []string{"1>4", "1>5", "2>4", "2>5", "3>4", "3>5"}, DownUnreachable, "45", leaseWon{}},

		// The nemesis's split where 5 had found 1 unreachable (the cut
		// came one way first) and that observation arrived before the
		// rest of the cut: 5 is then also an observer, and in the most
		// lost pairs among those both observer and subject; taken out
		// first, it leaves 4 (the straddler) on the far side. With the
		// lease denied 4 must still go with this side.
		{"a member cut off beside a one-way drop, its early observation arrived: the lease denied", "uuuuu", []int{1, 2}, []string{"1>5", "2>5", "3>5", "4>5", "3>4", "5>1"}, DownReachable, "12345", LeaseMajority()},
		{"a member cut off beside a one-way drop, its early observation arrived: the majority", "uuuuu", []int{1, 2}, []string{"1>5", "2>5", "3>5", "4>5", "3>4", "5>1"}, DownUnreachable, "45", nil},
	}
	for _, tt := range tests {
		ms := members(tt.members)
		v := split(ms, tt.side...)
		for _, o := range tt.obs {
			v.Observations = append(v.Observations, observation{Observer: ms[o[0]-'1'].UID, Subject: ms[o[2]-'1'].UID})
		}
		s := tt.s
		if s == nil {
			s = KeepMajority()
		}
		got, down := ResolveSplit(s, v)
		var names []byte
		for _, m := range down {
			names = append(names, '1'+m.UID[0]-1)
		}
		slices.Sort(names)
		if got != tt.want || string(names) != tt.down {
			t.Errorf("%s: ResolveSplit = %v downing %q, want %v downing %q", tt.name, got, names, tt.want, tt.down)
		}
	}
}
