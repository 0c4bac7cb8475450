package troupe

import (
	"cmp"
	"slices"
)

// The coordinator's placement decisions, pure: which member takes a new
// shard (least shards), and which shards move to even the members out.

// shardLoad is one member's region as the decisions see it.
type shardLoad struct {
	uid     NodeUID
	addr    Addr    // ties go to the lowest address
	shards  []int32 // the shards it runs, ascending
	leaving bool    // gives every shard away, takes none
}

// plannedMove is one shard to move.
type plannedMove struct {
	shard    int32
	from, to NodeUID
}

func byLoad(a, b *shardLoad) int {
	if c := cmp.Compare(len(a.shards), len(b.shards)); c != 0 {
		return c
	}
	return cmp.Compare(a.addr.String(), b.addr.String())
}

// leastShards returns the member to place a new shard on: the one that
// runs the fewest among those not leaving. false if there is none.
func leastShards(loads []shardLoad) (NodeUID, bool) {
	var best *shardLoad
	for i := range loads {
		l := &loads[i]
		if !l.leaving && (best == nil || byLoad(l, best) < 0) {
			best = l
		}
	}
	if best == nil {
		return NodeUID{}, false
	}
	return best.uid, true
}

// planRebalance returns the moves of one round: every shard of a leaving
// member (to the members with the fewest), then, while the fullest member
// runs two or more shards more than the emptiest, one shard from the
// fullest to the emptiest, at most limit of those.
func planRebalance(loads []shardLoad, limit int) []plannedMove {
	var stay []*shardLoad
	var leave []shardLoad
	for _, l := range loads {
		if l.leaving {
			leave = append(leave, l)
			continue
		}
		c := l
		c.shards = slices.Clone(l.shards)
		stay = append(stay, &c)
	}
	var out []plannedMove
	if len(stay) == 0 {
		// No member to take them: the leavers stop them all the same (to
		// the zero uid), to be placed when a member can take them.
		for _, l := range leave {
			for _, s := range l.shards {
				out = append(out, plannedMove{shard: s, from: l.uid})
			}
		}
		return out
	}
	for _, l := range leave {
		for _, s := range l.shards {
			to := slices.MinFunc(stay, byLoad)
			to.shards = append(to.shards, s)
			out = append(out, plannedMove{shard: s, from: l.uid, to: to.uid})
		}
	}
	for moved := 0; moved < limit; moved++ {
		lo, hi := slices.MinFunc(stay, byLoad), slices.MaxFunc(stay, byLoad)
		if len(hi.shards)-len(lo.shards) < 2 {
			break
		}
		s := hi.shards[len(hi.shards)-1]
		hi.shards = hi.shards[:len(hi.shards)-1]
		lo.shards = append(lo.shards, s)
		out = append(out, plannedMove{shard: s, from: hi.uid, to: lo.uid})
	}
	return out
}
