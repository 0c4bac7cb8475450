package troupe

import (
	"fmt"
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

func TestDowningStrategies(t *testing.T) {
	three, five, four := members("uuu"), members("uuuuu"), members("uuuu")
	withJoiners := members("uuujj") // two joining members do not count
	withLeaver := members("uul")    // a leaving member counts
	tests := []struct {
		name     string
		strategy DowningStrategy
		view     SplitView
		want     Downing
	}{
		{"majority 2|1, the two", KeepMajority{}, split(three, 0, 1), DownUnreachable},
		{"majority 2|1, the one", KeepMajority{}, split(three, 2), DownReachable},
		{"majority 3|2, the three", KeepMajority{}, split(five, 2, 3, 4), DownUnreachable},
		{"majority 3|2, the two", KeepMajority{}, split(five, 0, 1), DownReachable},
		{"majority 2|2 tie, lowest address side", KeepMajority{}, split(four, 0, 3), DownUnreachable},
		{"majority 2|2 tie, other side", KeepMajority{}, split(four, 1, 2), DownReachable},
		{"majority, joiners do not count", KeepMajority{}, split(withJoiners, 0, 3, 4), DownReachable},
		{"majority, joiners do not count (other side)", KeepMajority{}, split(withJoiners, 1, 2), DownUnreachable},
		{"majority, a leaving member counts", KeepMajority{}, split(withLeaver, 1, 2), DownUnreachable},
		{"majority, three-way 2|2|1 downs this pair", KeepMajority{}, split(five, 0, 1), DownReachable},
		{"majority, three-way 2|2|1 downs the single", KeepMajority{}, split(five, 4), DownReachable},
		{"majority, nobody unreachable", KeepMajority{}, split(three, 0, 1, 2), DownUnreachable},
		{"quorum 2 of 3, the two", StaticQuorum{Size: 2}, split(three, 0, 1), DownUnreachable},
		{"quorum 2 of 3, the one", StaticQuorum{Size: 2}, split(three, 2), DownReachable},
		{"quorum 3 too big for 5? no: 5 = 2*3-1", StaticQuorum{Size: 3}, split(five, 0, 1, 2), DownUnreachable},
		{"quorum 2 with 5 members is a config error", StaticQuorum{Size: 2}, split(five, 0, 1), DownEveryone},
		{"quorum, three-way: nobody has 3", StaticQuorum{Size: 3}, split(five, 2, 3), DownReachable},
		{"oldest here", KeepOldest{}, split(three, 0), DownUnreachable},
		{"oldest there", KeepOldest{}, split(three, 1, 2), DownReachable},
		{"oldest alone, down if alone", KeepOldest{DownIfAlone: true}, split(three, 0), DownReachable},
		{"others of a lonely oldest survive", KeepOldest{DownIfAlone: true}, split(three, 1, 2), DownUnreachable},
		{"oldest with company, down if alone", KeepOldest{DownIfAlone: true}, split(three, 0, 1), DownUnreachable},
		{"oldest, three-way: the oldest's side", KeepOldest{}, split(five, 0, 4), DownUnreachable},
		{"oldest, three-way: another side", KeepOldest{}, split(five, 2, 3), DownReachable},
		{"down all", DownAll{}, split(three, 0, 1), DownEveryone},
		{"down all, no split", DownAll{}, split(three, 0, 1, 2), DownUnreachable},
	}
	for _, tt := range tests {
		if got := tt.strategy.Decide(tt.view); got != tt.want {
			t.Errorf("%s: %T.Decide = %v, want %v", tt.name, tt.strategy, got, tt.want)
		}
	}
}

func TestLeaseMajorityRule(t *testing.T) {
	three := members("uuu")
	if MinorityDelay(split(three, 0, 1)) || !MinorityDelay(split(three, 2)) {
		t.Error("only the minority side waits before trying the lease")
	}
	if LeaseDecision(true) != DownUnreachable || LeaseDecision(false) != DownReachable {
		t.Error("the lease holder survives; a side without it downs itself")
	}
}
