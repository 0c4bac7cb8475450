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
		out[i] = Member{Addr: TCPAddr(fmt.Sprintf("10.0.0.%d:7000", i+1)), UID: NodeUID{byte(i + 1)}, Status: st, UpNumber: i + 1}
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
	tests := []struct {
		name     string
		strategy DowningStrategy
		members  string
		side     []int
		want     Downing
	}{
		// keep-majority
		{"majority 2|1, the two", KeepMajority{}, "uuu", []int{0, 1}, DownUnreachable},
		{"majority 2|1, the one", KeepMajority{}, "uuu", []int{2}, DownReachable},
		{"majority 3|2, the three", KeepMajority{}, "uuuuu", []int{2, 3, 4}, DownUnreachable},
		{"majority 3|2, the two", KeepMajority{}, "uuuuu", []int{0, 1}, DownReachable},
		{"majority 2|2 tie, the side with the lowest address", KeepMajority{}, "uuuu", []int{0, 3}, DownUnreachable},
		{"majority 2|2 tie, the other side", KeepMajority{}, "uuuu", []int{1, 2}, DownReachable},
		{"majority, joining members do not count here", KeepMajority{}, "uuujj", []int{0, 3, 4}, DownReachable},
		{"majority, the other side's joining members may be up there: down all", KeepMajority{}, "uuujj", []int{1, 2}, DownEveryone},
		{"majority, joining there that cannot tip it", KeepMajority{}, "uuuuj", []int{0, 1, 2}, DownUnreachable},
		{"majority, this side's leaving member may be exiting: down all", KeepMajority{}, "uul", []int{1, 2}, DownEveryone},
		{"majority, a leaving member that cannot tip it", KeepMajority{}, "uuuul", []int{0, 1, 4}, DownUnreachable},
		{"majority, three-way 2|2|1: this pair downs itself", KeepMajority{}, "uuuuu", []int{0, 1}, DownReachable},
		{"majority, three-way 2|2|1: the single downs itself", KeepMajority{}, "uuuuu", []int{4}, DownReachable},
		{"majority, nobody unreachable", KeepMajority{}, "uuu", []int{0, 1, 2}, DownUnreachable},
		{"majority, only joining members", KeepMajority{}, "jj", []int{0}, DownEveryone},

		// static-quorum
		{"quorum 2 of 3, the two", StaticQuorum{Size: 2}, "uuu", []int{0, 1}, DownUnreachable},
		{"quorum 2 of 3, the one", StaticQuorum{Size: 2}, "uuu", []int{2}, DownReachable},
		{"quorum 3 with 5 = 2·3−1 members", StaticQuorum{Size: 3}, "uuuuu", []int{0, 1, 2}, DownUnreachable},
		{"quorum 2 with 5 members is a configuration error", StaticQuorum{Size: 2}, "uuuuu", []int{0, 1}, DownEveryone},
		{"quorum, three-way: nobody has 3", StaticQuorum{Size: 3}, "uuuuu", []int{2, 3}, DownReachable},
		{"quorum, joining members do not count", StaticQuorum{Size: 3}, "uuujj", []int{0, 1, 3}, DownReachable},
		{"quorum, leaving members count", StaticQuorum{Size: 2}, "ulu", []int{0, 1}, DownUnreachable},
		{"quorum, no member that counts", StaticQuorum{Size: 2}, "jj", []int{0}, DownEveryone},

		// keep-oldest
		{"oldest here", KeepOldest{}, "uuu", []int{0}, DownUnreachable},
		{"oldest there", KeepOldest{}, "uuu", []int{1, 2}, DownReachable},
		{"oldest alone against two: it downs itself", KeepOldest{DownIfAlone: true}, "uuu", []int{0}, DownReachable},
		{"the two against a lonely oldest survive", KeepOldest{DownIfAlone: true}, "uuu", []int{1, 2}, DownUnreachable},
		{"oldest with company, down if alone", KeepOldest{DownIfAlone: true}, "uuu", []int{0, 1}, DownUnreachable},
		{"two members: the oldest survives", KeepOldest{DownIfAlone: true}, "uu", []int{0}, DownUnreachable},
		{"two members: the younger downs itself", KeepOldest{DownIfAlone: true}, "uu", []int{1}, DownReachable},
		{"oldest, three-way: the oldest's side", KeepOldest{}, "uuuuu", []int{0, 4}, DownUnreachable},
		{"oldest, three-way: another side", KeepOldest{}, "uuuuu", []int{2, 3}, DownReachable},
		{"oldest is leaving here and may be exiting: down all", KeepOldest{}, "luu", []int{0}, DownEveryone},
		{"oldest leaving, the next oldest here too", KeepOldest{}, "luu", []int{0, 1}, DownUnreachable},
		{"oldest alone once joining members count: down all", KeepOldest{DownIfAlone: true}, "uuj", []int{0}, DownEveryone},
		{"joining members do not matter without down-if-alone", KeepOldest{}, "uuj", []int{0}, DownUnreachable},

		// down-all
		{"down all", DownAll{}, "uuu", []int{0, 1}, DownEveryone},
		{"down all, no split", DownAll{}, "uuu", []int{0, 1, 2}, DownUnreachable},
	}
	for _, tt := range tests {
		if got := tt.strategy.Decide(split(members(tt.members), tt.side...)); got != tt.want {
			t.Errorf("%s: %T.Decide = %v, want %v", tt.name, tt.strategy, got, tt.want)
		}
	}
}

func TestLeaseMajorityRule(t *testing.T) {
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
		if got := MinorityDelay(split(members(tt.members), tt.side...)); got != tt.minority {
			t.Errorf("%s side %v: MinorityDelay = %v, want %v", tt.members, tt.side, got, tt.minority)
		}
	}
	if LeaseDecision(true) != DownUnreachable || LeaseDecision(false) != DownReachable {
		t.Error("the lease holder survives; a side without it downs itself")
	}
}

// Indirectly connected members are downed first; the clean partition that
// remains goes to the strategy. Observations are "observer>subject" with
// 1-based member numbers.
func TestResolveSplit(t *testing.T) {
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
		{"a member cut off beside a one-way drop: the lease denied", "uuuuu", []int{0, 1, 2}, []string{"1>5", "2>5", "3>5", "4>5", "3>4"}, DownReachable, "1234", LeaseMajority{}},
		{"a member cut off beside a one-way drop: the majority", "uuuuu", []int{0, 1, 2}, []string{"1>5", "2>5", "3>5", "4>5", "3>4"}, DownUnreachable, "45", nil},
	}
	for _, tt := range tests {
		ms := members(tt.members)
		v := split(ms, tt.side...)
		for _, o := range tt.obs {
			v.Observations = append(v.Observations, Observation{Observer: ms[o[0]-'1'].UID, Subject: ms[o[2]-'1'].UID})
		}
		s := tt.s
		if s == nil {
			s = KeepMajority{}
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
