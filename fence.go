package troupe

import "fmt"

// Fence is a fencing token: the number a cluster singleton's instance,
// or a sharded entity, carries for the placement it runs under (see
// [Context.Fence]). A placement made later has a greater Fence: the
// singleton's next instance, on this member or another, and an entity's
// shard placed anew (after a move, or by a coordinator that took over; a
// shard that keeps running across the coordinator's hand-over keeps its
// token).
//
// No timeout can tell an instance that the others have given it up
// while it stood still (a pause past every margin, a handler that was
// already running): its writes to a store outside the cluster can only
// be refused there. Pass the Fence with each write; the store keeps the
// greatest it has seen (per singleton, or per entity) and refuses a
// write whose Fence is less (see examples/fencing).
//
// Fences compare within one cluster's life: they start from the up
// number of the member that made the placement, and a cluster formed
// anew (every member restarted) numbers its members from 1 again. A
// store that outlives the cluster forgets the greatest Fence it kept
// when the cluster is formed anew.
type Fence struct {
	// Epoch numbers the placing: a singleton instance's start, or the
	// coordinator that placed an entity's shard. It is the up number of
	// the member that placed it, times 2^32, plus a count kept by that
	// member's process.
	Epoch uint64
	// Seq numbers a shard's placements under one coordinator (0 for a
	// singleton, and for a shard placed by a coordinator of an earlier
	// version, which numbered none).
	Seq uint64
}

// Compare returns -1 if f is less than g (an earlier placement), +1 if
// it is greater, and 0 if they are equal.
func (f Fence) Compare(g Fence) int {
	switch {
	case f.Epoch != g.Epoch:
		if f.Epoch < g.Epoch {
			return -1
		}
		return 1
	case f.Seq != g.Seq:
		if f.Seq < g.Seq {
			return -1
		}
		return 1
	}
	return 0
}

// String returns the Fence as "epoch.seq", both in decimal.
func (f Fence) String() string { return fmt.Sprintf("%d.%d", f.Epoch, f.Seq) }

// Fence returns the fencing token of the placement the actor runs under:
// a cluster singleton's instance (see [Singleton]) or a sharded entity
// (see [Sharding]). Any other actor's is the zero Fence. It is the same
// for every message of one instance (an entity whose shard moves is
// stopped; the one started where it lands has the new token), and known
// from Setup on.
func (c *Context[T]) Fence() Fence {
	if c.c.tools == nil {
		return Fence{}
	}
	return c.c.tools.fence
}

// withFence returns b, whose every built behavior (a supervised one's,
// at start and after each restart) records f in its actor before Setup.
func withFence[T any](b Behavior[T], f Fence) Behavior[T] {
	if b.sup != nil {
		sup := *b.sup
		if build := sup.build; build != nil {
			sup.build = func() Behavior[T] { return withFence(build(), f) }
		}
		b.sup = &sup
		return b
	}
	setup := b.Setup
	b.Setup = func(c *Context[T]) {
		c.c.tooling().fence = f
		if setup != nil {
			setup(c)
		}
	}
	return b
}
