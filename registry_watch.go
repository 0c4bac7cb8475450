package troupe

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"
)

// Following a registrar's table as it changes: Registry.Watch subscribes,
// and the registrar pushes the table, then each change (regEvent).

// RegistryChange is one step of [Registry.Watch]: registrations that came
// and those that went (a registration whose addresses changed goes as it
// was and comes as it is, in one change). With Snapshot, Added is the
// registrar's whole table: whatever was known before is to be forgotten.
type RegistryChange struct {
	Snapshot bool
	Added    []Registration
	Removed  []Registration
}

// ErrWatchLost is wrapped by the error [Registry.Watch] returns when the
// registrar it followed is gone (its node stopped, or it cannot be
// reached): watch again, through [Node.Registry], to follow its
// successor.
var ErrWatchLost = errors.New("troupe: the registrar being watched is gone")

// The registrar's side.

// maxRegistrySubscribers bounds a registrar's Registry.Watch subscribers.
const maxRegistrySubscribers = 1024

// snapshotPiece bounds the registrations one snapshot event carries, so
// that a large table goes in frames well under MaxFrameSize.
const snapshotPiece = 256

// regSub is one subscriber.
type regSub struct {
	h   *handle // the latest handle of its ref (one is made per message that carries it)
	gen uint64  // its subscription's generation
	seq uint64  // the number of the last event made for it
}

// regPending is one event for one subscriber.
type regPending struct {
	to *handle
	ev regEvent
}

// watched reports whether anyone subscribes (mu held): without
// subscribers, a change costs nothing more.
func (g *regTable) watched() bool { return len(g.subs) > 0 }

// changed queues an event for every subscriber (mu held).
func (g *regTable) changed(added, removed []Registration) {
	if len(g.subs) == 0 || len(added)+len(removed) == 0 {
		return
	}
	a, r := toWire(added), toWire(removed)
	for _, sub := range g.subs {
		sub.seq++
		g.pending = append(g.pending, regPending{to: sub.h, ev: regEvent{Gen: sub.gen, Seq: sub.seq, Added: a, Removed: r}})
	}
	g.hasPending.Store(true)
}

// publish sends what is pending, in order. It reports no dead letter (no
// user code runs under pubMu): a full mailbox loses that one event, which
// the subscriber sees as a gap; any other failure loses the subscriber.
func (g *regTable) publish() {
	if !g.hasPending.Load() {
		return
	}
	g.pubMu.Lock()
	defer g.pubMu.Unlock()
	g.mu.Lock()
	pending := g.pending
	g.pending = nil
	g.hasPending.Store(false)
	g.mu.Unlock()
	for _, p := range pending {
		var err error
		switch {
		case p.to.local != nil:
			err = p.to.local.tellAny(p.ev)
		case p.to.assoc != nil:
			err = p.to.assoc.tell(p.to, p.ev)
		default:
			err = ErrActorStopped
		}
		if err != nil && !errors.Is(err, ErrMailboxFull) && !errors.Is(err, ErrSendQueueFull) {
			g.mu.Lock()
			if sub := g.subs[p.to.key]; sub != nil && sub.h == p.to {
				delete(g.subs, p.to.key)
			}
			g.mu.Unlock()
		}
	}
}

// subscribe adds a subscriber, or starts its subscription again with
// generation gen, and queues the whole table for it, in pieces. Past
// maxRegistrySubscribers it first forgets subscribers whose session has
// ended (an observer's, which no event reports), and then refuses.
func (g *regTable) subscribe(h *handle, gen uint64) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	sub := g.subs[h.key]
	if sub == nil && len(g.subs) >= maxRegistrySubscribers {
		for k, s := range g.subs {
			if s.h.assoc != nil && s.h.assoc.failure() != nil {
				delete(g.subs, k)
			}
		}
		if len(g.subs) >= maxRegistrySubscribers {
			return false
		}
	}
	if g.subs == nil {
		g.subs = map[refKey]*regSub{}
	}
	if sub == nil {
		sub = &regSub{}
		g.subs[h.key] = sub
	}
	sub.h, sub.gen, sub.seq = h, gen, 0
	all := make([]Registration, 0, len(g.entries))
	for _, e := range g.entries {
		all = append(all, *e)
	}
	slices.SortFunc(all, func(a, b Registration) int { return cmp.Compare(a.Seq, b.Seq) })
	for start := 0; ; start += snapshotPiece {
		end := min(start+snapshotPiece, len(all))
		sub.seq++
		g.pending = append(g.pending, regPending{to: h, ev: regEvent{Gen: gen, Seq: sub.seq, Snapshot: true, More: end < len(all), Added: toWire(all[start:end])}})
		if end == len(all) {
			break
		}
	}
	g.hasPending.Store(true)
	return true
}

// unsubscribe forgets a subscriber, by its ref.
func (g *regTable) unsubscribe(key refKey) {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.subs, key)
}

// The subscriber's side.

// watchEnded is the error of a Registry.Watch whose watch on the
// registrar at addr ended for reason: the registrar is lost, or it is up
// but its end could not be seen (its node refused the watch).
func watchEnded(addr Addr, reason error) error {
	if errors.Is(reason, ErrWatchRefused) {
		return fmt.Errorf("registrar %s: %w", addr, reason)
	}
	return fmt.Errorf("%w: %s: %v", ErrWatchLost, addr, reason)
}

// watchSeq names Registry.Watch's receiving actors.
var watchSeq atomic.Uint64

// Watch calls each with the registrar's whole table (a Snapshot), then
// with every change as the registrar makes it — pushed, not polled — until
// ctx ends (it returns ctx.Err()), the node closes ([ErrNodeClosed]) or
// the registrar is lost (an error wrapping [ErrWatchLost]). each runs on
// the caller's goroutine, one change at a time, in the registrar's order;
// while it runs, changes wait (in a mailbox of this node's). When changes
// come faster than each takes them and some are lost, the next call is a
// Snapshot again, so what each has seen always adds up to the table. A
// registrar takes at most 1,024 subscribers; one more fails at once, as
// does one whose node refuses this node one more watch (its
// [Config.MaxWatchesPerPeer]), so that its end could not be seen: with an
// error wrapping [ErrWatchRefused] that says which. A registrar that
// does not push (troupe before 0.11) fails with errors.ErrUnsupported
// after RegistryTimeout.
//
// An etcd registry is followed through etcd's watch stream: each change
// there has the table read again, and what differs is passed to each;
// etcd not answering ends the watch with [ErrWatchLost].
func (r *Registry) Watch(ctx context.Context, each func(RegistryChange)) error {
	return r.src.watch(ctx, each)
}

// watchRegistrar is Registry.Watch of a registrar, src, at the address
// at: it subscribes an actor of this node's to the registrar's pushes.
func watchRegistrar(ctx context.Context, n *Node, src subscriber, at Addr, each func(RegistryChange)) error {
	events := make(chan regEvent, 16)
	gone := make(chan error, 1)
	target, err := src.target(ctx)
	if err != nil {
		return err
	}
	name := fmt.Sprintf("registry-watch-%d", watchSeq.Add(1))
	self, err := Spawn(systemParent{n}, name, Behavior[regEvent]{
		Setup: func(c *Context[regEvent]) {
			if !target.IsZero() {
				c.Watch(target)
			}
		},
		Receive: func(c *Context[regEvent], ev regEvent) {
			select {
			case events <- ev:
			case <-c.Context().Done():
			}
		},
		Signal: func(_ *Context[regEvent], s Signal) {
			if t, ok := s.(Terminated); ok {
				select {
				case gone <- watchEnded(at, t.Reason):
				default:
				}
			}
		},
	})
	if err != nil {
		return err
	}
	defer n.Stop(self)
	var gen uint64
	subscribe := func() error {
		gen++
		return src.subscribe(target, self.h, gen)
	}
	defer src.unsubscribe(target, self.h)
	if err := subscribe(); err != nil {
		return err
	}
	// A registrar that does not know the subscription never answers it.
	first := time.NewTimer(n.disc.registryTimeout())
	defer first.Stop()
	var want uint64 = 1 // the next event's number in this generation
	var snap []Registration
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-n.lc.workDone():
			return ErrNodeClosed
		case err := <-gone:
			return err
		case <-first.C:
			return fmt.Errorf("registrar %s: %w: it sent no table within %v (a registrar before troupe 0.11 does not push)", at, errors.ErrUnsupported, n.disc.registryTimeout())
		case ev := <-events:
			switch {
			case ev.Gen != gen:
				continue // an older subscription's
			case ev.Refused:
				return fmt.Errorf("registrar %s: %w: it has as many subscribers as it takes (1,024)", at, ErrWatchRefused)
			case ev.Seq != want:
				// One was lost: subscribe again, and ignore what the
				// older subscription still sends.
				if err := subscribe(); err != nil {
					return err
				}
				want, snap = 1, nil
				continue
			}
			want++
			if ev.Snapshot {
				snap = append(snap, fromWire(ev.Added, at)...)
				if ev.More {
					continue
				}
				first.Stop()
				each(RegistryChange{Snapshot: true, Added: snap})
				snap = nil
				continue
			}
			each(RegistryChange{Added: fromWire(ev.Added, at), Removed: fromWire(ev.Removed, at)})
		}
	}
}

// followRegistry calls deliver with the registrations sel picks from the
// first registry, at once and after each change among them, until ctx
// ends or the node closes: a registrar's push stream, followed to its
// successor when it is gone (with a growing pause while none answers),
// or etcd's watch stream. deliver reports whether some registration
// could not be acted on (a member not resolved): it is called again with
// the same registrations after a pause, and whenever a peer becomes
// unreachable (a listing must drop what the node no longer reaches).
func (dc *registryClient) followRegistry(ctx context.Context, sel regSelector, deliver func([]Registration) (again bool), opts []LookupOption) error {
	f := &regFollower{deliver: deliver, kick: make(chan struct{}, 1)}
	lost := make(chan PeerUnreachable, 1)
	sub := subscribeOwnChan(&dc.n.events, lost)
	stop, done := make(chan struct{}), make(chan struct{})
	go f.refresh(stop, done, lost)
	defer func() { close(stop); <-done; sub.Unsubscribe() }()
	pause := serviceRewatch
	var last error
	for {
		srcs, err := dc.serviceSources(opts)
		if err != nil {
			if errors.Is(err, ErrNoRegistry) && errors.Is(last, ErrClusterStopped) {
				return last // (the cluster was the registry)
			}
			return err
		}
		err = srcs[0].follow(ctx, sel, func(regs []Registration) { f.set(regs) }, func() { pause = serviceRewatch })
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case dc.n.lc.workOver() || errors.Is(err, ErrNodeClosed):
			return ErrNodeClosed
		case errors.Is(err, ErrNoRegistry):
			return err
		case errors.Is(err, ErrClusterStopped):
			last = err
			continue // (another cluster may have started)
		}
		// The registry is gone, unreachable or not answering yet: follow
		// its successor (another node takes the registry address over).
		t := time.NewTimer(pause)
		pause = min(2*pause, serviceRewatchMax)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-dc.n.lc.workDone():
			t.Stop()
			return ErrNodeClosed
		}
	}
}
