package troupe

import (
	"errors"
	"fmt"
	"hash/maphash"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"
)

// Group routers: an actor whose messages go on to one of the actors
// under a service key, chosen by a strategy, over the key's listing as it
// changes (ServiceKey.Watch).

// ErrNoRoutee is the dead-letter reason of a message a group router
// could not route: no actor is under its key.
var ErrNoRoutee = errors.New("troupe: the router has no routee")

// RouteStrategy chooses a routee for each message a group router takes.
// Make one with [RoundRobin], [RandomRoute] or [ConsistentHash]; the zero
// RouteStrategy chooses nothing, and [SpawnGroupRouter] refuses it.
type RouteStrategy[T any] struct {
	pick func(msg T, routees []Ref[T], next *atomic.Uint64) Ref[T]
}

// RoundRobin sends each message to the next routee in the listing's
// order.
func RoundRobin[T any]() RouteStrategy[T] {
	return RouteStrategy[T]{pick: func(_ T, rs []Ref[T], next *atomic.Uint64) Ref[T] {
		return rs[(next.Add(1)-1)%uint64(len(rs))]
	}}
}

// RandomRoute sends each message to a routee chosen at random.
func RandomRoute[T any]() RouteStrategy[T] {
	return RouteStrategy[T]{pick: func(_ T, rs []Ref[T], _ *atomic.Uint64) Ref[T] {
		return rs[rand.IntN(len(rs))]
	}}
}

// ConsistentHash sends every message with the same key (as key computes
// it) to the same routee while the set of routees is stable. When a
// routee leaves, only the keys it had move (to the others, evenly); when
// one joins, it takes about its share from each (rendezvous hashing).
// Without a key function (key nil) it is the zero RouteStrategy.
func ConsistentHash[T any](key func(T) string) RouteStrategy[T] {
	if key == nil {
		return RouteStrategy[T]{}
	}
	seed := maphash.MakeSeed()
	return RouteStrategy[T]{pick: func(msg T, rs []Ref[T], _ *atomic.Uint64) Ref[T] {
		k := key(msg)
		var best Ref[T]
		var top uint64
		for i, r := range rs {
			var h maphash.Hash
			h.SetSeed(seed)
			h.WriteString(k)
			h.WriteByte(0)
			h.WriteString(r.h.key.path)
			h.Write(r.h.key.uuid[:])
			h.Write(r.h.key.node[:])
			if s := h.Sum64(); i == 0 || s > top {
				best, top = r, s
			}
		}
		return best
	}}
}

// SpawnGroupRouter spawns, on n, an actor called name that routes every
// message it takes to one of the actors under key, chosen by strategy.
// It follows key's listing as [ServiceKey.Watch] does, pushed: a routee that
// stops, or whose node is lost, drops out as soon as the listing says so,
// and one that registers joins. The router takes its first message once
// it has the first listing (waiting at most Config.RegistryTimeout for
// it), so a message sent as soon as SpawnGroupRouter returns reaches a
// routee registered before. A message that finds no routee is a dead
// letter with [ErrNoRoutee]. The router forwards with Tell: a routee
// whose mailbox (or whose node's credit) is full makes a dead letter, as
// a Tell to it would, and a message's headers are not passed on. It
// returns [ErrBadName] for a bad key name, an error wrapping
// [ErrBadConfig] for a strategy that cannot choose (the zero
// RouteStrategy), else what [Spawn] returns.
func SpawnGroupRouter[T any](n *Node, name string, key ServiceKey[T], strategy RouteStrategy[T], opts ...LookupOption) (Ref[T], error) {
	if err := checkName(key.Name); err != nil {
		return Ref[T]{}, err
	}
	if strategy.pick == nil {
		return Ref[T]{}, fmt.Errorf("%w: SpawnGroupRouter needs a strategy: RoundRobin, RandomRoute or ConsistentHash with a key function", ErrBadConfig)
	}
	var routees atomic.Pointer[[]Ref[T]]
	var next atomic.Uint64
	first := make(chan struct{})
	var once sync.Once
	return Spawn(n, name, Behavior[T]{
		Setup: func(c *Context[T]) {
			ctx := c.Context()
			n.wg.Go(func() {
				key.Watch(ctx, n, func(rs []Ref[T]) {
					routees.Store(&rs)
					once.Do(func() { close(first) })
				}, opts...)
				once.Do(func() { close(first) }) // (a watch that ended without a listing: no registry)
			})
			// The watch's first listing comes at once: the router takes
			// its first message with it, so that a message sent right
			// after the spawn reaches a routee registered before. (A
			// registry that does not answer within RegistryTimeout
			// leaves the router with none, as before.)
			t := time.NewTimer(n.cfg.RegistryTimeout)
			defer t.Stop()
			select {
			case <-first:
			case <-ctx.Done():
			case <-t.C:
			}
		},
		Receive: func(c *Context[T], msg T) {
			rs := routees.Load()
			if rs == nil || len(*rs) == 0 {
				n.dead.deadLetter(c.Self().String(), msg, ErrNoRoutee)
				return
			}
			strategy.pick(msg, *rs, &next).Tell(msg)
		},
	})
}
