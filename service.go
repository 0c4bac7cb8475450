package troupe

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"sync"
	"time"
)

// Sets of actors under a typed key: registering an actor under a
// ServiceKey, finding the set, and following it as it changes, pushed by
// the registrar's watch or etcd's.

// ServiceKey names a set of actors that take messages of type T: any
// number of actors, on any number of nodes, register under it, and a
// lookup returns them all as Ref[T]s. Two keys with one name and two
// types are two sets in effect: an actor registered under one is not in
// the other's listing (its protocol is checked, as [Resolve] checks it).
type ServiceKey[T any] struct{ name string }

// NewServiceKey returns the key of the set called name (letters, digits,
// '-', '_' and '.', as an actor's name; [ErrBadName] is returned where it
// is used otherwise).
func NewServiceKey[T any](name string) ServiceKey[T] { return ServiceKey[T]{name: name} }

// Name returns the key's name.
func (k ServiceKey[T]) Name() string { return k.name }

// String returns the key's name and the message type.
func (k ServiceKey[T]) String() string {
	return "service " + k.name + " of " + protocolName(reflect.TypeFor[T]())
}

// servicePrefix starts the registry name of a service key: no actor's
// name has a colon, so the two never meet.
const servicePrefix = "service:"

func (k ServiceKey[T]) regName() string { return servicePrefix + k.name }

// ErrNotLocal is returned by [RegisterService] for a ref that is not one
// of the calling node's own actors (a remote actor, an Ask's reply ref or
// a message adapter): a node registers only what it runs.
var ErrNotLocal = errors.New("troupe: not an actor of this node")

// MaxServicesPerNode bounds the service registrations one node holds
// (every key, every actor); [RegisterService] past it returns
// [ErrTooManyServices].
const MaxServicesPerNode = 10000

// ErrTooManyServices is returned by [RegisterService] when the node holds
// MaxServicesPerNode service registrations.
var ErrTooManyServices = errors.New("troupe: the node holds as many service registrations as it takes")

// serviceEntry is one actor under one key, on this node.
type serviceEntry struct {
	name string // the registry name (servicePrefix and the key's)
	h    *handle
}

// services is what this node registered under service keys.
type services struct {
	mu      sync.Mutex
	entries map[serviceEntry]struct{}
}

// RegisterService lists ref, an actor of this node, under k with every
// registry the node uses (its registrars, or etcd), until the actor stops
// or [DeregisterService] removes it. An actor may be under many keys, and
// a key holds any number of actors. Like Spawn of a public actor, it
// waits, within Config.RegistryTimeout, for the registry to confirm, and
// a registrar that does not answer gets it when it does again. It returns
// [ErrBadName], [ErrNotLocal], [ErrActorStopped], [ErrTooManyServices] or
// [ErrNodeClosed].
func RegisterService[T any](n *Node, k ServiceKey[T], ref Ref[T]) error {
	if err := checkName(k.name); err != nil {
		return err
	}
	if ref.h == nil || ref.h.node != n {
		return fmt.Errorf("%w: %v", ErrNotLocal, ref)
	}
	if _, ok := ref.h.local.(*cell[T]); !ok {
		return fmt.Errorf("%w: %v is not an actor", ErrNotLocal, ref)
	}
	if n.workOver() {
		return ErrNodeClosed
	}
	e := serviceEntry{k.regName(), ref.h}
	s := &n.services
	s.mu.Lock()
	if _, ok := s.entries[e]; !ok && len(s.entries) >= MaxServicesPerNode {
		s.mu.Unlock()
		return ErrTooManyServices
	}
	if s.entries == nil {
		s.entries = map[serviceEntry]struct{}{}
	}
	s.entries[e] = struct{}{}
	s.mu.Unlock()
	if n.lookup(ref.h.key.path, ref.h.key.uuid) == nil {
		// It stopped before its entry was made: its stop could not take
		// the entry away.
		n.dropService(e)
		return fmt.Errorf("%w: %v", ErrActorStopped, ref)
	}
	n.registerEntry(ref.h, n.serviceRegistration(e))
	return nil
}

// DeregisterService takes ref out of k's set. It reports whether it was
// there.
func DeregisterService[T any](n *Node, k ServiceKey[T], ref Ref[T]) bool {
	if ref.h == nil || ref.h.node != n {
		return false
	}
	e := serviceEntry{k.regName(), ref.h}
	if !n.dropService(e) {
		return false
	}
	if !n.isClosed() {
		n.unregisterEntry(e.name, ref.h.key.uuid)
	}
	return true
}

// dropService forgets e; it reports whether it was there.
func (n *Node) dropService(e serviceEntry) bool {
	s := &n.services
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.entries[e]
	delete(s.entries, e)
	return ok
}

// stopServices takes a stopped actor out of every set it was in.
func (n *Node) stopServices(h *handle) {
	s := &n.services
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
	if n.isClosed() {
		return // (a closing node unregistered everything at once)
	}
	for _, name := range names {
		n.unregisterEntry(name, h.key.uuid)
	}
}

// serviceRegistrations lists this node's service registrations.
func (n *Node) serviceRegistrations() []Registration {
	s := &n.services
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Registration, 0, len(s.entries))
	for e := range s.entries {
		out = append(out, n.serviceRegistration(e))
	}
	return out
}

func (n *Node) serviceRegistration(e serviceEntry) Registration {
	return Registration{Name: e.name, UUID: e.h.key.uuid, Path: e.h.key.path, Node: n.uid, NodeName: n.name, Addrs: n.Addrs()}
}

// FindService returns the actors under k that this node can reach now,
// from every registry the node uses (or those of [WithRegistries]), one
// ref per actor, in a stable order (by node, then path). An actor whose
// node is quarantined here, or that does not answer, or that takes
// another message type, is left out. It returns an empty listing when
// there is none, and an error only when no registry answered.
func FindService[T any](ctx context.Context, n *Node, k ServiceKey[T], opts ...LookupOption) ([]Ref[T], error) {
	if err := checkName(k.name); err != nil {
		return nil, err
	}
	srcs, _, err := n.lookupSources(opts)
	if err != nil {
		return nil, err
	}
	answers, errs := n.findAll(ctx, srcs, k.regName())
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
	refs, _ := serviceRefs[T](ctx, n, regs, nil)
	return refs, nil
}

// serviceMember identifies one actor of a listing.
type serviceMember struct {
	node NodeUID
	uuid UUID
}

// serviceRefs turns registrations into refs: this node's own actors as
// they are, others resolved (and checked for type) through the
// preferred address of each, reusing those in known. It returns the
// listing, sorted, and the refs by member, for the next call.
func serviceRefs[T any](ctx context.Context, n *Node, regs []Registration, known map[serviceMember]Ref[T]) ([]Ref[T], map[serviceMember]Ref[T]) {
	slices.SortFunc(regs, func(a, b Registration) int { return cmp.Compare(b.Seq, a.Seq) }) // newest first, per member
	now := map[serviceMember]Ref[T]{}
	for _, c := range preferAddrs(regs) {
		m := serviceMember{c.reg.Node, c.reg.UUID}
		if _, done := now[m]; done || c.reg.Path == "" {
			continue
		}
		if c.reg.Node == n.uid {
			if h := n.lookup(c.reg.Path, c.reg.UUID); h != nil && h.local.protocol() == reflect.TypeFor[T]() {
				now[m] = Ref[T]{h: h}
			}
			continue
		}
		if n.quarantineFor(c.reg.Node) != nil {
			continue // known gone
		}
		if r, ok := known[m]; ok {
			now[m] = r
			continue
		}
		rctx, cancel := context.WithTimeout(ctx, n.registryTimeout())
		r, err := Resolve[T](rctx, n, FormatRef(c.addr, c.reg.Path))
		cancel()
		if err == nil && r.NodeUID() == c.reg.Node && r.h.key.uuid == c.reg.UUID {
			now[m] = r
		}
	}
	out := make([]Ref[T], 0, len(now))
	for _, r := range now {
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b Ref[T]) int {
		return cmp.Or(cmp.Compare(string(a.h.key.node[:]), string(b.h.key.node[:])), cmp.Compare(a.h.key.path, b.h.key.path), cmp.Compare(string(a.h.key.uuid[:]), string(b.h.key.uuid[:])))
	})
	return out, now
}

// WatchService calls each with the listing of k (as [FindService] makes
// it) at once, and again whenever the set changes, until ctx ends
// ([context.Canceled] or the deadline's error is returned) or the node
// closes ([ErrNodeClosed]). The changes are pushed: by the first
// registrar's watch ([Registry.Watch]), followed to its successor when
// it is gone, or by etcd's watch stream. Actors leave the listing when
// they stop (their node takes them out) or their node is unreachable
// (the registrar drops it, or etcd its lease); a listing never holds an
// actor of a node quarantined here. each runs on WatchService's
// goroutine, one call at a time; a listing equal to the last is not
// delivered again.
func WatchService[T any](ctx context.Context, n *Node, k ServiceKey[T], each func([]Ref[T]), opts ...LookupOption) error {
	if err := checkName(k.name); err != nil {
		return err
	}
	w := &serviceWatch[T]{n: n, name: k.regName(), each: each}
	for {
		srcs, _, err := n.lookupSources(opts)
		if err != nil {
			return err
		}
		src := srcs[0]
		if src.etcd != nil {
			err = w.followEtcd(ctx, src.etcd)
		} else {
			r := &Registry{n: n, src: src}
			table := map[regKey]Registration{}
			err = r.Watch(ctx, func(c RegistryChange) {
				if c.Snapshot {
					clear(table)
				}
				for _, reg := range c.Removed {
					delete(table, regKey{reg.Name, reg.UUID})
				}
				for _, reg := range c.Added {
					if reg.Name == w.name {
						table[regKey{reg.Name, reg.UUID}] = reg
					}
				}
				w.deliver(ctx, slices.Collect(maps.Values(table)))
			})
		}
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case n.workOver() || errors.Is(err, ErrNodeClosed):
			return ErrNodeClosed
		case errors.Is(err, errors.ErrUnsupported), errors.Is(err, ErrNoRegistry):
			return err
		}
		// The registry is gone or unreachable: follow its successor
		// (another node takes the registry address over).
		t := time.NewTimer(serviceRewatch)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-n.workDone():
			t.Stop()
			return ErrNodeClosed
		}
	}
}

// serviceRewatch is the pause before WatchService watches a registry
// again after losing it.
const serviceRewatch = 100 * time.Millisecond

// serviceWatch is one WatchService's state.
type serviceWatch[T any] struct {
	n     *Node
	name  string
	each  func([]Ref[T])
	known map[serviceMember]Ref[T]
	last  []Ref[T]
	sent  bool
}

// deliver makes the listing of regs and hands it to each if it changed.
func (w *serviceWatch[T]) deliver(ctx context.Context, regs []Registration) {
	var refs []Ref[T]
	refs, w.known = serviceRefs[T](ctx, w.n, regs, w.known)
	if w.sent && slices.EqualFunc(refs, w.last, func(a, b Ref[T]) bool { return a.h.key == b.h.key }) {
		return
	}
	w.last, w.sent = refs, true
	w.each(slices.Clone(refs))
}

// followEtcd follows the registrations under w's name in etcd: read them,
// deliver, and wait on etcd's watch stream for the next change under the
// name (a put or a delete), until ctx ends or the stream breaks.
func (w *serviceWatch[T]) followEtcd(ctx context.Context, r *etcdRegistry) error {
	p := r.prefix + w.name + "/"
	for {
		regs, rev, err := r.named(ctx, w.name)
		if err != nil {
			return err
		}
		w.deliver(ctx, regs)
		err = r.watchFrom(ctx, p, rev+1, func(deleted bool, reg Registration, ok bool) bool { return true })
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err != nil && !errors.Is(err, context.DeadlineExceeded) {
			return err
		}
	}
}
