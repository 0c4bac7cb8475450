package troupe

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"time"
)

// Sets of actors under a typed key: registering an actor under a
// ServiceKey, finding the set, and following it as it changes, pushed by
// the registrar's watch or etcd's.

// ServiceKey names a set of actors that take messages of type T: any
// number of actors, on any number of nodes, register under it
// ([ServiceKey.Register]), and a lookup returns them all as Ref[T]s
// ([ServiceKey.Find], [ServiceKey.Watch], [ServiceKey.Subscribe]). Two
// keys with one name and two types are two sets in effect: an actor
// registered under one is not in the other's listing (its protocol is
// checked, as [Resolve] checks it). Make one with a literal:
//
//	jobs := troupe.ServiceKey[Job]{Name: "jobs"}
type ServiceKey[T any] struct {
	// Name is the set's name: letters, digits, '-', '_' and '.', as an
	// actor's name ([ErrBadName] is returned where a key is used
	// otherwise).
	Name string
}

// servicePrefix starts the registry name of a service key: no actor's
// name has a colon, so the two never meet.
const servicePrefix = "service:"

func (k ServiceKey[T]) regName() string { return servicePrefix + k.Name }

// notLocal is the error of a call given a ref that is not one of the
// calling node's own actors (a remote actor, an Ask's reply ref or a
// message adapter): a node registers only what it runs.
func notLocal(ref any) error {
	return fmt.Errorf("%w: %v is not an actor of this node", ErrBadConfig, ref)
}

// maxServicesPerNode bounds the service registrations one node holds
// (every key, every actor); Register past it is refused.
const maxServicesPerNode = 10000

// serviceEntry is one actor under one key, on this node.
type serviceEntry struct {
	name string // the registry name (servicePrefix and the key's)
	h    *handle
}

// services is what this node registered under service keys.
type services struct {
	n       *Node
	mu      mutex[lkServices]
	entries map[serviceEntry]struct{}
}

// Register lists ref, an actor of this node, under k with every
// registry the node uses (its registrars, or etcd; a cluster member that
// uses neither, its cluster: see [StartCluster]), until the actor stops
// or [ServiceKey.Unregister] removes it. An actor may be under many keys, and
// a key holds any number of actors. Like Spawn of a public actor, it
// waits, within Config.RegistryTimeout, for the registry to confirm, and
// a registrar that does not answer gets it when it does again (the
// cluster takes it at once and pushes it to the other members). It
// returns [ErrBadName], [ErrBadConfig] (ref is not an actor of this
// node), [ErrActorStopped], [ErrNoRegistry] (the node uses no registry
// and is no cluster member: nobody could find it),
// [ErrRegistrationRefused] (the node holds 10,000 service registrations,
// every key and actor, or a registrar is past one of its bounds, such as
// the 16,384 registrations under one name; the entry is then kept
// nowhere) or [ErrNodeClosed].
func (k ServiceKey[T]) Register(n *Node, ref Ref[T]) error {
	if err := checkName(k.Name); err != nil {
		return err
	}
	if ref.h == nil || ref.h.node != n {
		return notLocal(ref)
	}
	if _, ok := ref.h.local.(*cell[T]); !ok {
		return fmt.Errorf("%w: %v is not an actor", ErrBadConfig, ref)
	}
	if n.lc.workOver() {
		return ErrNodeClosed
	}
	if !n.disc.discovering() && n.cl.entries() == nil {
		return ErrNoRegistry // (nobody could find it)
	}
	e := serviceEntry{k.regName(), ref.h}
	s := &n.services
	s.mu.Lock()
	if _, ok := s.entries[e]; !ok && len(s.entries) >= maxServicesPerNode {
		s.mu.Unlock()
		return fmt.Errorf("%w by this node: it holds %d service registrations, as many as it takes", ErrRegistrationRefused, maxServicesPerNode)
	}
	if s.entries == nil {
		s.entries = map[serviceEntry]struct{}{}
	}
	s.entries[e] = struct{}{}
	s.mu.Unlock()
	if n.actors.get(ref.h.key.path, ref.h.key.uuid) == nil {
		// It stopped before its entry was made: its stop could not take
		// the entry away.
		n.services.dropService(e)
		return fmt.Errorf("%w: %v", ErrActorStopped, ref)
	}
	if err := n.disc.registerEntry(ref.h, n.services.serviceRegistration(e)); err != nil {
		// A registrar is full (or its bounds say no): the entry is not
		// kept anywhere, so that every registry lists the same.
		if n.services.dropService(e) {
			n.disc.unregisterEntry(e.name, ref.h.key.uuid)
		}
		return err
	}
	if !n.services.holdsService(e) {
		// The actor stopped, or Unregister ran, while it was being
		// registered: their unregistration may have gone first.
		n.disc.unregisterEntry(e.name, ref.h.key.uuid)
		if n.actors.get(ref.h.key.path, ref.h.key.uuid) == nil {
			return fmt.Errorf("%w: %v", ErrActorStopped, ref)
		}
	}
	return nil
}

// holdsService reports whether e is still registered here, its actor
// alive.
func (sv *services) holdsService(e serviceEntry) bool {
	s := sv
	s.mu.Lock()
	_, ok := s.entries[e]
	s.mu.Unlock()
	return ok && sv.n.actors.get(e.h.key.path, e.h.key.uuid) != nil
}

// Unregister takes ref out of k's set, telling the registries
// without waiting for them. It reports whether it was there.
func (k ServiceKey[T]) Unregister(n *Node, ref Ref[T]) bool {
	if ref.h == nil || ref.h.node != n {
		return false
	}
	e := serviceEntry{k.regName(), ref.h}
	if !n.services.dropService(e) {
		return false
	}
	if !n.lc.isClosed() {
		n.disc.unregisterEntry(e.name, ref.h.key.uuid)
	}
	return true
}

// dropService forgets e; it reports whether it was there.
func (sv *services) dropService(e serviceEntry) bool {
	s := sv
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.entries[e]
	delete(s.entries, e)
	return ok
}

// stopServices takes a stopped actor out of every set it was in.
func (sv *services) stopServices(h *handle) {
	s := sv
	s.mu.Lock()
	if len(s.entries) == 0 {
		s.mu.Unlock()
		return
	}
	var names []string
	for e := range s.entries {
		if e.h == h {
			names = append(names, e.name)
			delete(s.entries, e)
		}
	}
	s.mu.Unlock()
	if sv.n.lc.isClosed() {
		return // (a closing node unregistered everything at once)
	}
	for _, name := range names {
		sv.n.disc.unregisterEntry(name, h.key.uuid)
	}
}

// serviceRegistrations lists this node's service registrations.
func (sv *services) serviceRegistrations() []Registration {
	s := sv
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Registration, 0, len(s.entries))
	for e := range s.entries {
		out = append(out, sv.serviceRegistration(e))
	}
	return out
}

func (sv *services) serviceRegistration(e serviceEntry) Registration {
	return Registration{Name: e.name, UUID: e.h.key.uuid, Path: e.h.key.path, Node: sv.n.uid, NodeName: sv.n.name, Addrs: sv.n.Addrs()}
}

// Find returns the actors under k that this node can reach now,
// from every registry the node uses (or those of [WithRegistries]), one
// ref per actor, in a stable order (by node, then path). An actor whose
// node is quarantined here, or that does not answer, or that takes
// another message type, is left out. It returns an empty listing when
// there is none, and an error when no registry answered, or ctx's when
// ctx ended before the listing was made (never a listing cut short).
func (k ServiceKey[T]) Find(ctx context.Context, n *Node, opts ...LookupOption) ([]Ref[T], error) {
	if err := checkName(k.Name); err != nil {
		return nil, err
	}
	srcs, err := n.disc.serviceSources(opts)
	if err != nil {
		return nil, err
	}
	answers, errs := n.disc.findAll(ctx, srcs, k.regName())
	var regs []Registration
	answered := false
	for i, a := range answers {
		if errs[i] == nil {
			answered = true
		}
		regs = append(regs, a...)
	}
	if !answered {
		return nil, errors.Join(errs...)
	}
	refs, _, _ := serviceRefs[T](ctx, n, regs, nil)
	if ctx.Err() != nil {
		return nil, ctx.Err() // (not a listing cut short)
	}
	return refs, nil
}

// serviceMember identifies one actor of a listing.
type serviceMember struct {
	node NodeUID
	uuid UUID
}

// serviceRefs turns registrations into refs: this node's own actors as
// they are, others resolved (and checked for type) through the
// preferred address of each, reusing those in known whose session still
// lives. It returns the listing, sorted, the refs by member for the next
// call, and how many members could not be resolved (to try again).
func serviceRefs[T any](ctx context.Context, n *Node, regs []Registration, known map[serviceMember]Ref[T]) ([]Ref[T], map[serviceMember]Ref[T], int) {
	slices.SortFunc(regs, func(a, b Registration) int { return cmp.Compare(b.Seq, a.Seq) }) // newest first, per member
	now := map[serviceMember]Ref[T]{}
	tried := map[serviceMember]bool{}
	for _, c := range preferAddrs(regs) {
		m := serviceMember{c.reg.Node, c.reg.UUID}
		if _, done := now[m]; done || c.reg.Path == "" || ctx.Err() != nil {
			continue
		}
		if c.reg.Node == n.uid {
			if h := n.actors.get(c.reg.Path, c.reg.UUID); h != nil && h.local.protocol() == reflect.TypeFor[T]() {
				now[m] = Ref[T]{h: h}
			}
			continue
		}
		if n.peers.isQuarantined(c.reg.Node) {
			tried[m] = true // known gone, until the quarantine is cleared
			continue
		}
		if r, ok := known[m]; ok && (r.h.assoc == nil || r.h.assoc.failure() == nil) {
			now[m] = r // (a ref of a session that ended is resolved again)
			continue
		}
		tried[m] = true
		rctx, cancel := context.WithTimeout(ctx, n.disc.registryTimeout())
		r, err := Resolve[T](rctx, n, FormatRef(c.addr, c.reg.Path))
		cancel()
		switch {
		case err == nil && r.NodeUID() == c.reg.Node && r.h.key.uuid == c.reg.UUID:
			now[m] = r
		case errors.Is(err, ErrWrongType) || errors.Is(err, ErrNoSuchActor):
			delete(tried, m) // settled: it is not one of the set
		}
	}
	unresolved := 0
	for m := range tried {
		if _, ok := now[m]; !ok {
			unresolved++
		}
	}
	out := make([]Ref[T], 0, len(now))
	for _, r := range now {
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b Ref[T]) int {
		return cmp.Or(cmp.Compare(string(a.h.key.node[:]), string(b.h.key.node[:])), cmp.Compare(a.h.key.path, b.h.key.path), cmp.Compare(string(a.h.key.uuid[:]), string(b.h.key.uuid[:])))
	})
	return out, now, unresolved
}

// Watch calls each with the listing of k (as [ServiceKey.Find] makes
// it) at once, and again whenever the set changes, until ctx ends
// ([context.Canceled] or the deadline's error is returned) or the node
// closes ([ErrNodeClosed]). The changes are pushed: by the first
// registrar's watch ([Registry.Watch]), followed to its successor when
// it is gone, by etcd's watch stream, or, on a cluster member that uses
// no registry, by the other members (it ends with [ErrClusterStopped]
// when the cluster stops; a listing there holds the actors of the
// members this member reaches). Actors leave the listing when
// they stop (their node takes them out) or their node is unreachable
// (the registrar drops it, or etcd its lease); a listing never holds an
// actor of a node quarantined here, and a member that could not be
// reached is tried again (with a growing pause) until it is, or leaves.
// While no registry answers, nothing is delivered; Watch watches
// again with a growing pause (up to 5 s). Each Watch takes one of
// the registrar's 1,024 watch subscribers. each runs on one goroutine at
// a time; a listing equal to the last is not delivered again. Besides
// ctx's error and ErrNodeClosed, it returns [ErrBadName] or
// [ErrNoRegistry] at once.
func (k ServiceKey[T]) Watch(ctx context.Context, n *Node, each func([]Ref[T]), opts ...LookupOption) error {
	if err := checkName(k.Name); err != nil {
		return err
	}
	w := &serviceWatch[T]{n: n, name: k.regName(), each: each}
	return n.disc.followRegistry(ctx, regSelector{name: w.name}, func(regs []Registration) bool { return w.deliver(ctx, regs) }, opts)
}

// regSelector picks registrations: those under name, or (name empty)
// those whose names start with prefix.
type regSelector struct{ name, prefix string }

func (s regSelector) match(name string) bool {
	if s.name != "" {
		return name == s.name
	}
	return strings.HasPrefix(name, s.prefix)
}

// regFollower holds what followRegistry last delivered, to deliver it
// again.
type regFollower struct {
	deliver func([]Registration) bool
	mu      mutex[lkFollower] // one delivery at a time
	last    []Registration
	have    bool
	kick    chan struct{} // capacity 1: deliver again after a pause
}

// set delivers regs; it reports whether they are to be delivered again.
func (f *regFollower) set(regs []Registration) bool {
	f.mu.Lock()
	f.last, f.have = regs, true
	again := f.deliver(slices.Clone(regs))
	f.mu.Unlock()
	if again {
		select {
		case f.kick <- struct{}{}:
		default:
		}
	}
	return again
}

// redeliver delivers the last registrations again, if there are any
// (under one hold of mu, so that a newer set cannot come between); it
// reports whether they are to be delivered again.
func (f *regFollower) redeliver() bool {
	f.mu.Lock()
	if !f.have {
		f.mu.Unlock()
		return false
	}
	again := f.deliver(slices.Clone(f.last))
	f.mu.Unlock()
	if again {
		select {
		case f.kick <- struct{}{}:
		default:
		}
	}
	return again
}

// refresh delivers the last registrations again when asked (after a
// pause) and when a peer becomes unreachable, until stop.
func (f *regFollower) refresh(stop <-chan struct{}, done chan<- struct{}, lost <-chan PeerUnreachable) {
	defer close(done)
	pause := serviceRetry
	for {
		select {
		case <-stop:
			return
		case <-lost:
		case <-f.kick:
			t := time.NewTimer(pause)
			pause = min(2*pause, serviceRewatchMax)
			select {
			case <-stop:
				t.Stop()
				return
			case <-t.C:
			case <-lost:
				t.Stop()
			}
		}
		if !f.redeliver() {
			pause = serviceRetry // all resolved: the next failure starts over
		}
	}
}

// The pauses of followRegistry: before it watches a registry again after
// losing it (doubling while none answers, to serviceRewatchMax), and
// before it tries again what it could not resolve (doubling likewise).
const (
	serviceRewatch    = 100 * time.Millisecond
	serviceRetry      = 250 * time.Millisecond
	serviceRewatchMax = 5 * time.Second
)

// serviceWatch is one ServiceKey.Watch's state.
type serviceWatch[T any] struct {
	n     *Node
	name  string
	each  func([]Ref[T])
	known map[serviceMember]Ref[T]
	last  []Ref[T]
	sent  bool
}

// deliver makes the listing of regs and hands it to each if it changed;
// it reports whether some member could not be resolved (to try again).
func (w *serviceWatch[T]) deliver(ctx context.Context, regs []Registration) bool {
	refs, known, unresolved := serviceRefs[T](ctx, w.n, regs, w.known)
	if ctx.Err() != nil || w.n.lc.workOver() {
		return false // a listing cut short is not the set
	}
	w.known = known
	if w.sent && slices.EqualFunc(refs, w.last, func(a, b Ref[T]) bool { return a.h == b.h }) {
		return unresolved > 0
	}
	w.last, w.sent = refs, true
	w.each(slices.Clone(refs))
	return unresolved > 0
}
