package troupe

import (
	"cmp"
	"fmt"
	"slices"
)

// This file holds the pure half of split-brain resolution: given one side's
// view of the membership, which members to down. The cluster (cluster_loop.go)
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

// String returns the status as the debug page and troupe print it.
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
	// AppVersion is the member's Config.AppVersion, as gossip carries it
	// (empty until heard, and from a member that sets none).
	AppVersion string
}

// counts reports whether m takes part in the majority and age arithmetic
// of a decision (joining and exiting members do not, though they are downed
// with their side).
func (m Member) counts() bool { return m.Status == MemberUp || m.Status == MemberLeaving }

// lowerAddr orders members by address text, then uid, for tie-breaks.
// (compareAddr and compareUID give the order of the two strings without
// building them: Cluster.Members sorts a thousand members with it.)
func lowerAddr(a, b Member) int {
	if c := compareAddr(a.Addr, b.Addr); c != 0 {
		return c
	}
	return compareUID(a.UID, b.UID)
}

// SplitView is one side's view of a split: the members it can reach
// (itself included) and those it cannot, each with its status (joining,
// up, leaving or exiting), and the observations behind the split.
type SplitView struct {
	Reachable   []Member
	Unreachable []Member
	// Observations are who cannot reach whom, as gossiped: each one
	// member's (the Observer's) finding that it cannot reach another (the
	// Subject). Only those made by up or leaving members count. With none,
	// the split is taken as clean.
	Observations []struct{ Observer, Subject NodeUID }
}

// observation is an element of SplitView.Observations.
type observation = struct{ Observer, Subject NodeUID }

// Downing is what a strategy decides for one side.
type Downing uint8

// Decisions. A side either downs the others and survives, or downs itself.
const (
	DownUnreachable         Downing = iota // this side survives; the unreachable are downed
	DownReachable                          // this side downs itself (the other side survives, or nobody)
	DownEveryone                           // everyone is downed
	DownIndirectlyConnected                // only the indirectly connected members are downed
)

var downingNames = [...]string{"down the unreachable", "down this side", "down everyone", "down the indirectly connected"}

// String returns the decision as logs and troupe print it.
func (d Downing) String() string {
	if int(d) < len(downingNames) {
		return downingNames[d]
	}
	return "unknown"
}

// DowningStrategy decides, for one side of a clean split, who is downed.
// Implementations are pure functions of the view. [ResolveSplit] takes the
// indirectly connected members out before it asks. A member that the
// others report unreachable, and that so leads no side, also asks it
// with its own view (the members it lost itself against the rest), and
// downs itself, never the others, if its side would be downed there: a
// strategy should not keep a side that shrank or down one that grew.
type DowningStrategy interface {
	Decide(v SplitView) Downing
}

// counted selects the members a decision counts: up and leaving always,
// joining members too when possiblyUp (they may be up on the other side),
// leaving ones not when possiblyExiting (they may be exiting there).
func counted(ms []Member, possiblyUp, possiblyExiting bool) []Member {
	var out []Member
	for _, m := range ms {
		switch m.Status {
		case MemberUp:
		case MemberJoining:
			if !possiblyUp {
				continue
			}
		case MemberLeaving:
			if possiblyExiting {
				continue
			}
		default:
			continue
		}
		out = append(out, m)
	}
	return out
}

// lowestIsHere reports whether the lowest-addressed of the counted
// members of both sides is on this side.
func lowestIsHere(here, there []Member) bool {
	all := append(slices.Clone(here), there...)
	lowest := slices.MinFunc(all, lowerAddr)
	return slices.ContainsFunc(here, func(m Member) bool { return m.UID == lowest.UID })
}

// majority is the keep-majority rule on the sizes of the sides.
func majority(here, there int, lowestHere bool) Downing {
	switch {
	case here > there:
		return DownUnreachable
	case here < there:
		return DownReachable
	case lowestHere:
		return DownUnreachable
	}
	return DownReachable
}

// KeepMajority returns the strategy that keeps the side with more members
// (up or leaving); on a tie, the side holding the member with the lowest
// address survives. A decision to survive is checked again with the
// membership changes the other side may have made meanwhile: counting its
// joining members (they may be up there) and not this side's leaving ones
// (they may be exiting there). If that changes the answer, everyone is
// downed.
func KeepMajority() DowningStrategy { return keepMajority{} }

type keepMajority struct{}

func (keepMajority) String() string { return "KeepMajority()" }

func (keepMajority) Decide(v SplitView) Downing {
	here, there := counted(v.Reachable, false, false), counted(v.Unreachable, false, false)
	if len(here)+len(there) == 0 {
		return DownEveryone
	}
	if d := majority(len(here), len(there), lowestIsHere(here, there)); d != DownUnreachable {
		return d
	}
	stayHere, stayThere := counted(v.Reachable, false, true), counted(v.Unreachable, false, true)
	if len(stayHere)+len(stayThere) == 0 {
		return DownEveryone
	}
	there = counted(v.Unreachable, true, false)
	if majority(len(stayHere), len(there), lowestIsHere(stayHere, stayThere)) != DownUnreachable {
		return DownEveryone
	}
	return DownUnreachable
}

// StaticQuorum returns the strategy that keeps a side that has at least
// size members (up or leaving) and downs a side with fewer. A cluster of
// more than 2·size−1 members could hold two quorums at once: that is a
// configuration error, and everyone is downed.
func StaticQuorum(size int) DowningStrategy { return staticQuorum{size: size} }

type staticQuorum struct{ size int }

func (q staticQuorum) String() string { return fmt.Sprintf("StaticQuorum(%d)", q.size) }

func (q staticQuorum) Decide(v SplitView) Downing {
	here, there := counted(v.Reachable, false, false), counted(v.Unreachable, false, false)
	switch {
	case len(here)+len(there) > 2*q.size-1, len(here)+len(there) == 0:
		return DownEveryone
	case len(here) >= q.size:
		return DownUnreachable
	}
	return DownReachable
}

// KeepOldest returns the strategy that keeps the side with the oldest
// member (by up number). With downIfAlone, an oldest member cut off from
// two or more others is downed instead and the others survive; in a
// cluster of two, the oldest always survives. A decision to survive is
// checked again as for [KeepMajority] (without this side's leaving
// members and, with downIfAlone, counting joining members on both sides);
// if that changes the answer, everyone is downed.
func KeepOldest(downIfAlone bool) DowningStrategy { return keepOldest{DownIfAlone: downIfAlone} }

type keepOldest struct{ DownIfAlone bool }

func (k keepOldest) String() string { return fmt.Sprintf("KeepOldest(%v)", k.DownIfAlone) }

func (k keepOldest) Decide(v SplitView) Downing {
	d := k.oldest(counted(v.Reachable, false, false), counted(v.Unreachable, false, false))
	if d != DownUnreachable {
		return d
	}
	// The re-check: the oldest among the members that cannot have moved
	// on, the counts with those that may have.
	ms := append(counted(v.Reachable, false, true), counted(v.Unreachable, false, true)...)
	if len(ms) == 0 {
		return DownEveryone
	}
	oldest := slices.MinFunc(ms, olderFirst)
	here := counted(v.Reachable, k.DownIfAlone, true)
	there := counted(v.Unreachable, k.DownIfAlone, true)
	if k.decide(isIn(v.Reachable, oldest), len(here), len(there)) != DownUnreachable {
		return DownEveryone
	}
	return DownUnreachable
}

func (k keepOldest) oldest(here, there []Member) Downing {
	if len(here)+len(there) == 0 {
		return DownEveryone
	}
	oldest := slices.MinFunc(append(slices.Clone(here), there...), olderFirst)
	return k.decide(isIn(here, oldest), len(here), len(there))
}

// decide is the keep-oldest rule on the sides' sizes.
func (k keepOldest) decide(oldestHere bool, here, there int) Downing {
	switch {
	case oldestHere && k.DownIfAlone && here == 1 && there >= 2:
		return DownReachable // the oldest is alone: the others carry on
	case oldestHere:
		return DownUnreachable
	case k.DownIfAlone && there == 1 && here >= 2:
		return DownUnreachable // the oldest is alone over there
	}
	return DownReachable
}

// olderFirst orders members by up number, then address.
func olderFirst(a, b Member) int {
	if c := cmp.Compare(a.UpNumber, b.UpNumber); c != 0 {
		return c
	}
	return lowerAddr(a, b)
}

func isIn(ms []Member, m Member) bool {
	return slices.ContainsFunc(ms, func(x Member) bool { return x.UID == m.UID })
}

// DownAll returns the strategy that downs every member whenever there is
// a split: the safest answer when no side can be trusted to be the right
// one.
func DownAll() DowningStrategy { return downAll{} }

type downAll struct{}

func (downAll) String() string { return "DownAll()" }

func (downAll) Decide(v SplitView) Downing {
	if len(v.Unreachable) == 0 {
		return DownUnreachable
	}
	return DownEveryone
}

// leaseDecision is the pure rule of LeaseMajority once the side knows
// whether it acquired the lease: the side that holds it downs the other;
// a side that could not acquire it downs itself.
func leaseDecision(acquired bool) Downing {
	if acquired {
		return DownUnreachable
	}
	return DownReachable
}

// minorityDelay reports whether this side is the minority and must wait
// before trying to acquire the lease, so that the majority wins a fair
// race: more than half of the members (up or leaving) are unreachable, or
// exactly half and the lowest address is among them.
func minorityDelay(v SplitView) bool {
	here, there := counted(v.Reachable, false, false), counted(v.Unreachable, false, false)
	switch total := len(here) + len(there); {
	case total == 0:
		return false
	case 2*len(there) == total:
		return !lowestIsHere(here, there)
	default:
		return 2*len(there) > total
	}
}

// indirectlyConnected returns the members to take out of v so that what
// remains is a clean split (every pair of members that lost each other has
// one on this side and one on the other: no pair on the same side has) or
// no split at all. Completeness is not required: a member watches only
// some others (ClusterConfig.MonitoredMembers). A clean partition or a crash has none. A partial or
// one-way partition has some: the members at the heart of the broken
// links, chosen greedily — first a member that both observed another as
// unreachable and was observed so (reached by some, not by others), then
// the one in the most lost pairs; on a tie
// one on the other side, then a joining one, then the youngest, then the
// highest address. Only observations made by up or leaving members count.
func indirectlyConnected(v SplitView) []Member {
	var out []Member
	g := newReachGraph(v)
	for !g.clean() {
		m := g.worst()
		out = append(out, m)
		g.remove(m.UID)
	}
	return out
}

// reachGraph is the undirected graph of lost pairs among a view's live
// members.
type reachGraph struct {
	members map[NodeUID]Member
	here    map[NodeUID]bool // on this side in the original view
	lost    map[NodeUID]map[NodeUID]bool
	seen    [][2]NodeUID // the observations, observer first
	// observer and subject count, for each member, the observations it
	// made and the ones made of it that remain.
	observer, subject map[NodeUID]int
}

func newReachGraph(v SplitView) *reachGraph {
	g := &reachGraph{members: map[NodeUID]Member{}, here: map[NodeUID]bool{}, lost: map[NodeUID]map[NodeUID]bool{},
		observer: map[NodeUID]int{}, subject: map[NodeUID]int{}}
	for _, m := range v.Reachable {
		g.members[m.UID], g.here[m.UID] = m, true
	}
	for _, m := range v.Unreachable {
		g.members[m.UID] = m
	}
	for _, o := range v.Observations {
		obs, ok := g.members[o.Observer]
		_, known := g.members[o.Subject]
		if !ok || !known || !obs.counts() || o.Observer == o.Subject {
			continue
		}
		if !g.directed(o.Observer, o.Subject) {
			g.observer[o.Observer]++
			g.subject[o.Subject]++
			g.seen = append(g.seen, [2]NodeUID{o.Observer, o.Subject})
		}
		g.link(o.Observer, o.Subject)
		g.link(o.Subject, o.Observer)
	}
	return g
}

// directed reports whether the observation a > b is recorded.
func (g *reachGraph) directed(a, b NodeUID) bool {
	return slices.Contains(g.seen, [2]NodeUID{a, b})
}

// both reports whether uid is, among the remaining members, an observer
// of one and the subject of another's observation: a member reachable
// from some and not from others, which Akka takes out first.
func (g *reachGraph) both(uid NodeUID) bool { return g.observer[uid] > 0 && g.subject[uid] > 0 }

func (g *reachGraph) link(a, b NodeUID) {
	if g.lost[a] == nil {
		g.lost[a] = map[NodeUID]bool{}
	}
	g.lost[a][b] = true
}

func (g *reachGraph) remove(uid NodeUID) {
	for other := range g.lost[uid] {
		delete(g.lost[other], uid)
	}
	for _, o := range g.seen {
		switch uid {
		case o[0]:
			g.subject[o[1]]--
		case o[1]:
			g.observer[o[0]]--
		}
	}
	g.seen = slices.DeleteFunc(g.seen, func(o [2]NodeUID) bool { return o[0] == uid || o[1] == uid })
	delete(g.observer, uid)
	delete(g.subject, uid)
	delete(g.lost, uid)
	delete(g.members, uid)
}

// sides splits the remaining members into this side (in no lost pair,
// or on this side of the original view) and the other.
func (g *reachGraph) sides() (here, there []Member) {
	for uid, m := range g.members {
		if len(g.lost[uid]) == 0 || g.here[uid] {
			here = append(here, m)
		} else {
			there = append(there, m)
		}
	}
	return here, there
}

// clean reports whether the remaining members form a clean split: every
// lost pair joins this side to the other.
func (g *reachGraph) clean() bool {
	here, there := g.sides()
	for _, a := range here {
		for b := range g.lost[a.UID] {
			if g.here[b] || len(g.lost[b]) == 0 {
				return false // a lost pair within this side
			}
		}
	}
	for _, a := range there {
		for b := range g.lost[a.UID] {
			if !g.here[b] {
				return false // a lost pair within the other side
			}
		}
	}
	return true
}

// worst is the member to take out next.
func (g *reachGraph) worst() Member {
	var best Member
	first := true
	for _, m := range g.members {
		if first || g.worse(m, best) {
			best, first = m, false
		}
	}
	return best
}

// worse reports whether a should go before b.
func (g *reachGraph) worse(a, b Member) bool {
	if ba, bb := g.both(a.UID), g.both(b.UID); ba != bb {
		// One that some reach and others do not goes before one that is
		// only unreachable: a member cut off from a whole side is in
		// many lost pairs, and taking it out would leave the member that
		// straddles the sides on the other side of a clean split.
		return ba
	}
	if da, db := len(g.lost[a.UID]), len(g.lost[b.UID]); da != db {
		return da > db
	}
	if g.here[a.UID] != g.here[b.UID] {
		return !g.here[a.UID] // the other side first
	}
	if ja, jb := a.Status == MemberJoining, b.Status == MemberJoining; ja != jb {
		return ja
	}
	if a.UpNumber != b.UpNumber {
		return a.UpNumber > b.UpNumber // the youngest first
	}
	return lowerAddr(a, b) > 0
}

// ResolveSplit is the whole decision for one side of a split: the
// indirectly connected members are taken out first (see
// indirectlyConnected); the strategy then decides on what remains, with
// them counted on the other side. They are downed whatever it decides,
// and with this side when this side downs itself, as are the members of
// the other side whose own observations reached this side. It returns the
// decision (DownIndirectlyConnected when only they are downed) and the
// members this side downs.
func ResolveSplit(s DowningStrategy, v SplitView) (Downing, []Member) {
	return resolve(v, s.Decide)
}

func resolve(v SplitView, decide func(SplitView) Downing) (Downing, []Member) {
	indirect := indirectlyConnected(v)
	if len(indirect) == 0 {
		d := decide(v)
		if d == DownReachable {
			return d, downable(append(slices.Clone(v.Reachable), observers(v, v.Unreachable)...))
		}
		return d, v.members(d)
	}
	g := newReachGraph(v)
	for _, m := range indirect {
		g.remove(m.UID)
	}
	here, there := g.sides()
	clean := SplitView{Reachable: here, Unreachable: append(there, indirect...)}
	d := decide(clean)
	switch d {
	case DownUnreachable:
		if len(there) == 0 {
			return DownIndirectlyConnected, downable(indirect)
		}
	case DownReachable:
		return d, downable(append(append(here, indirect...), observers(v, there)...))
	}
	return d, clean.members(d)
}

// ownViewLoses says whether strategy downs this member's side of its own
// view (see stepOwnView). A lease is not asked for a view only this
// member holds, and it decides more than size (an even split, or a
// minority that reached it first): under a lease, the side loses only
// if it is a strict minority of the members that count.
func ownViewLoses(strategy DowningStrategy, v SplitView) bool {
	if _, ok := strategy.(leaseMajority); ok {
		return len(counted(v.Reachable, false, false)) < len(counted(v.Unreachable, false, false))
	}
	d := strategy.Decide(v)
	return d == DownReachable || d == DownEveryone
}

// observers are the members of ms whose own observations reached this
// side. A side that downs itself downs them too: their gossip came here,
// so they may be on this side (reached by some, not by others) though
// the greedy left them on the other side — and the side that wins downs
// them, as it cannot reach them. One that is not on this side never
// hears it. (An observation made before a cut completed, arriving just
// before it, makes a member cut off from this side an observer too.)
func observers(v SplitView, ms []Member) []Member {
	known := func(uid NodeUID) bool {
		return isIn(v.Reachable, Member{UID: uid}) || isIn(v.Unreachable, Member{UID: uid})
	}
	var out []Member
	for _, m := range ms {
		if !m.counts() { // only observations of up or leaving members count
			continue
		}
		if slices.ContainsFunc(v.Observations, func(o observation) bool {
			return o.Observer == m.UID && o.Subject != m.UID && known(o.Subject)
		}) {
			out = append(out, m)
		}
	}
	return out
}

// members lists who decision d downs.
func (v SplitView) members(d Downing) []Member {
	switch d {
	case DownUnreachable:
		return downable(v.Unreachable)
	case DownReachable:
		return downable(v.Reachable)
	case DownEveryone:
		return downable(append(slices.Clone(v.Reachable), v.Unreachable...))
	}
	return nil
}

// downable is ms without the members already on their way out.
func downable(ms []Member) []Member {
	var out []Member
	for _, m := range ms {
		if m.Status < MemberExiting {
			out = append(out, m)
		}
	}
	return out
}
