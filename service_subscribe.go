package troupe

import (
	"context"
	"errors"
	"fmt"
)

// Following a service key's listing from an actor: ServiceKey.Subscribe
// sends the listing to an actor of this node as a message, at once and
// at each change, until the actor stops or the subscription is ended.

// ServiceListing is a service key's listing as [ServiceKey.Subscribe]
// delivers it: every actor under Key that the registry lists and this
// node reaches, in a stable order (by node, then path).
type ServiceListing[T any] struct {
	Key  ServiceKey[T]
	Refs []Ref[T]
}

// serviceSubs are this node's subscriptions by subscriber, so that an
// actor's stop ends its own.
type serviceSubs struct {
	n  *Node
	mu mutex[lkServiceSubs]
	by map[*handle]map[*Subscription]struct{}
}

// Subscribe sends k's listing to subscriber, an actor of this
// node, as a [ServiceListing]: at once, then each time the set changes
// (pushed, as [ServiceKey.Watch] follows it), until the subscriber stops,
// [Subscription.Unsubscribe] is called, or the node closes (or,
// on a cluster member that uses no registry, the cluster stops: the
// subscriber then gets an empty listing, the last). A
// listing waits for room in the subscriber's mailbox (a full mailbox
// makes no dead letter); meanwhile later changes are folded into the next
// listing, which is always the whole set. Each listing is the set as it
// was sent: one that waited in the mailbox may be older than the last
// change (the next listing follows), and listings left in the mailbox
// when the subscriber stops are dead letters like any message. Like
// Watch, it takes one of the registrar's 1,024 watch subscribers.
// It returns [ErrBadName], [ErrBadConfig] (a remote ref, or not an
// actor), [ErrActorStopped], [ErrNoRegistry] or [ErrNodeClosed].
func (k ServiceKey[T]) Subscribe(n *Node, subscriber Ref[ServiceListing[T]], opts ...LookupOption) (*Subscription, error) {
	if err := checkName(k.Name); err != nil {
		return nil, err
	}
	h := subscriber.h
	if h == nil || h.node != n {
		return nil, notLocal(subscriber)
	}
	if _, ok := h.local.(*cell[ServiceListing[T]]); !ok {
		return nil, fmt.Errorf("%w: %v is not an actor", ErrBadConfig, subscriber)
	}
	if n.lc.workOver() {
		return nil, ErrNodeClosed
	}
	if _, err := n.disc.serviceSources(opts); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(n.lc.actorsCtx)
	s := &Subscription{cancel: cancel, done: make(chan struct{})}
	ss := &n.serviceSubs
	ss.mu.Lock()
	if ss.by == nil {
		ss.by = map[*handle]map[*Subscription]struct{}{}
	}
	if ss.by[h] == nil {
		ss.by[h] = map[*Subscription]struct{}{}
	}
	ss.by[h][s] = struct{}{}
	ss.mu.Unlock()
	if n.actors.get(h.key.path, h.key.uuid) == nil {
		// It stopped before the subscription was recorded: its stop
		// could not end it.
		n.serviceSubs.endServiceSub(h, s)
		cancel()
		return nil, fmt.Errorf("%w: %v", ErrActorStopped, subscriber)
	}
	n.wg.Go(func() {
		defer close(s.done)
		defer n.serviceSubs.endServiceSub(h, s)
		err := k.Watch(ctx, n, func(refs []Ref[T]) {
			subscriber.Send(ctx, ServiceListing[T]{Key: k, Refs: refs})
		}, opts...)
		if errors.Is(err, ErrClusterStopped) {
			// The cluster was the registry: no actor of the set is known
			// any longer, and the subscription ends.
			subscriber.Send(ctx, ServiceListing[T]{Key: k})
		}
	})
	return s, nil
}

// endServiceSub forgets the subscription s of h.
func (ssb *serviceSubs) endServiceSub(h *handle, s *Subscription) {
	ss := ssb
	ss.mu.Lock()
	defer ss.mu.Unlock()
	delete(ss.by[h], s)
	if len(ss.by[h]) == 0 {
		delete(ss.by, h)
	}
}

// stopServiceSubs ends the subscriptions of a stopped actor (without
// waiting: its stop may run on a goroutine a listing's Send waits on).
func (ssb *serviceSubs) stopServiceSubs(h *handle) {
	ss := ssb
	ss.mu.Lock()
	subs := ss.by[h]
	delete(ss.by, h)
	ss.mu.Unlock()
	for s := range subs {
		s.cancel()
	}
}
