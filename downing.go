package troupe

import (
	"cmp"
	"slices"
)

// This file holds the pure half of split-brain resolution: given one side's
// view of the membership, which members to down. The cluster (cluster.go)
// gathers the view and acts on the decision; the decisions themselves are
// table-tested on snapshots.

// MemberStatus is where a member is in its life in the cluster.
type MemberStatus uint8

// Member statuses, in order of a member's life.
const (
	MemberJoining MemberStatus = iota // asked to join; not yet up
	MemberUp                          // a full member
	MemberLeaving                     // asked to leave; still counts
	MemberExiting                     // handing over before removal
	MemberDown                        // written off; must restart to rejoin
	MemberRemoved                     // gone from the membership
)

var memberStatusNames = [...]string{"joining", "up", "leaving", "exiting", "down", "removed"}

func (s MemberStatus) String() string {
	if int(s) < len(memberStatusNames) {
		return memberStatusNames[s]
	}
	return "unknown"
}

// Member is one member of a cluster as a decision sees it.
type Member struct {
	Addr     Addr
	UID      NodeUID
	Status   MemberStatus
	UpNumber int // the order in which members became up; lower is older
}

// counts reports whether m takes part in the majority and age arithmetic
// of a decision (joining and exiting members do not, though they are downed
// with their side).
func (m Member) counts() bool { return m.Status == MemberUp || m.Status == MemberLeaving }

// lowerAddr orders members by address text, then uid, for tie-breaks.
func lowerAddr(a, b Member) int {
	if c := cmp.Compare(a.Addr.String(), b.Addr.String()); c != 0 {
		return c
	}
	return cmp.Compare(a.UID.String(), b.UID.String())
}

// SplitView is one side's view of a split: the members it can reach
// (itself included) and those it cannot.
type SplitView struct {
	Reachable   []Member
	Unreachable []Member
}

// Downing is what a strategy decides for one side.
type Downing uint8

// Decisions. A side either downs the others and survives, or downs itself.
const (
	DownUnreachable Downing = iota // this side survives; the unreachable are downed
	DownReachable                  // this side downs itself (the other side survives, or nobody)
	DownEveryone                   // everyone is downed
)

var downingNames = [...]string{"down the unreachable", "down this side", "down everyone"}

func (d Downing) String() string { return downingNames[d] }

// DowningStrategy decides, for one side of a split, who is downed.
// Implementations are pure functions of the view.
type DowningStrategy interface {
	Decide(v SplitView) Downing
}

func counting(ms []Member) []Member {
	var out []Member
	for _, m := range ms {
		if m.counts() {
			out = append(out, m)
		}
	}
	return out
}

// KeepMajority keeps the side with more members (up or leaving); on a tie,
// the side holding the member with the lowest address survives.
type KeepMajority struct{}

// Decide applies the rule.
func (KeepMajority) Decide(v SplitView) Downing {
	r, u := counting(v.Reachable), counting(v.Unreachable)
	switch {
	case len(u) == 0:
		return DownUnreachable
	case len(r) > len(u):
		return DownUnreachable
	case len(r) < len(u):
		return DownReachable
	}
	all := append(slices.Clone(r), u...)
	lowest := slices.MinFunc(all, lowerAddr)
	if slices.ContainsFunc(r, func(m Member) bool { return m.UID == lowest.UID }) {
		return DownUnreachable
	}
	return DownReachable
}

// StaticQuorum keeps a side that has at least Size members and downs a side
// with fewer. A cluster of more than 2·Size−1 members could hold two
// quorums at once: that is a configuration error, and everyone is downed.
type StaticQuorum struct{ Size int }

// Decide applies the rule.
func (q StaticQuorum) Decide(v SplitView) Downing {
	r, u := counting(v.Reachable), counting(v.Unreachable)
	if len(r)+len(u) > 2*q.Size-1 {
		return DownEveryone
	}
	if len(r) >= q.Size {
		return DownUnreachable
	}
	return DownReachable
}

// KeepOldest keeps the side with the oldest member. With DownIfAlone, an
// oldest member cut off from everyone else is downed instead, and the
// others survive.
type KeepOldest struct{ DownIfAlone bool }

// Decide applies the rule.
func (k KeepOldest) Decide(v SplitView) Downing {
	r, u := counting(v.Reachable), counting(v.Unreachable)
	if len(u) == 0 {
		return DownUnreachable
	}
	if len(r) == 0 {
		return DownReachable
	}
	all := append(slices.Clone(r), u...)
	oldest := slices.MinFunc(all, func(a, b Member) int {
		if c := cmp.Compare(a.UpNumber, b.UpNumber); c != 0 {
			return c
		}
		return lowerAddr(a, b)
	})
	here := slices.ContainsFunc(r, func(m Member) bool { return m.UID == oldest.UID })
	switch {
	case here && k.DownIfAlone && len(r) == 1:
		return DownReachable
	case !here && k.DownIfAlone && len(u) == 1:
		return DownUnreachable
	case here:
		return DownUnreachable
	}
	return DownReachable
}

// DownAll downs every member whenever there is a split: the safest answer
// when no side can be trusted to be the right one.
type DownAll struct{}

// Decide downs everyone if anyone is unreachable.
func (DownAll) Decide(v SplitView) Downing {
	if len(v.Unreachable) == 0 {
		return DownUnreachable
	}
	return DownEveryone
}

// LeaseDecision is the pure rule of LeaseMajority once the side knows
// whether it acquired the lease: the side that holds it downs the other;
// a side that could not acquire it downs itself. The minority side (by the
// KeepMajority rule) should wait before trying, so that the majority wins a
// fair race; MinorityDelay says whether this side must.
func LeaseDecision(acquired bool) Downing {
	if acquired {
		return DownUnreachable
	}
	return DownReachable
}

// MinorityDelay reports whether this side is the minority and must wait
// before trying to acquire the lease.
func MinorityDelay(v SplitView) bool { return KeepMajority{}.Decide(v) == DownReachable }
