package troupe

import "time"

// placement is the pure half of a cluster singleton on one member: what
// it has seen of the others (each member's up number, when each was
// first seen downed or removed, which ones handed the singleton over) and,
// from that and a view of the membership, where the instance belongs and
// whether it may start here. It decides nothing by the clock: each call is
// given the time. The singleton's goroutine (cluster_singleton.go) and
// the cluster simulator (clustersim_test.go) run it.
type placement struct {
	margin time.Duration         // SingletonConfig.RemovalMargin
	handed map[NodeUID]bool      // members that said they do not run it and will not
	goneAt map[NodeUID]time.Time // when a member was first seen downed or removed
	ups    map[NodeUID]int       // every member's up number, as seen
}

func newPlacement(margin time.Duration) placement {
	return placement{margin: margin, handed: map[NodeUID]bool{}, goneAt: map[NodeUID]time.Time{}, ups: map[NodeUID]int{}}
}

// see notes what a view of the membership says, at now, and returns the
// member the instance belongs on: the oldest up member (the lowest up
// number), nil if none is up.
func (p *placement) see(members []Member, now time.Time) *Member {
	var target *Member
	withUp := 0 // (the members' uids are distinct)
	for i, m := range members {
		if m.UpNumber > 0 {
			if p.ups[m.UID] != m.UpNumber { // (mostly the same: a lookup is cheaper)
				p.ups[m.UID] = m.UpNumber
			}
			withUp++
		}
		if m.Status >= MemberDown && p.goneAt[m.UID].IsZero() {
			p.goneAt[m.UID] = now
		}
		if m.Status == MemberUp && (target == nil || m.UpNumber < target.UpNumber) {
			target = &members[i]
		}
	}
	if len(p.ups) == withUp {
		return target // every member with an up number is in the view
	}
	present := make(map[NodeUID]bool, len(members))
	for _, m := range members {
		present[m.UID] = true
	}
	for uid := range p.ups {
		if !present[uid] && p.goneAt[uid].IsZero() {
			p.goneAt[uid] = now // removed before this member saw it downed
		}
	}
	return target
}

// handedOver notes that from does not run the singleton and will not,
// nor, it says, do the members cleared (at most 64 of them are taken: a
// bound on a cluster's leavers since this member joined).
func (p *placement) handedOver(from NodeUID, cleared []NodeUID) {
	p.handed[from] = true
	for i, uid := range cleared {
		if i == 64 {
			break
		}
		p.handed[uid] = true
	}
}

// cleared is the members this one knows handed the singleton over, to
// pass on when it hands over itself.
func (p *placement) cleared() []NodeUID {
	out := make([]NodeUID, 0, len(p.handed))
	for uid := range p.handed {
		out = append(out, uid)
	}
	return out
}

// mayStart reports whether every member older than self has handed the
// singleton over, or was seen downed or removed a margin ago: time for a
// side that was downed, and may not know it, to decide and stop its own.
func (p *placement) mayStart(self Member, now time.Time) bool {
	for uid, up := range p.ups {
		if uid == self.UID || up >= self.UpNumber || p.handed[uid] {
			continue
		}
		if gone := p.goneAt[uid]; gone.IsZero() || now.Sub(gone) < p.margin {
			return false
		}
	}
	return true
}
