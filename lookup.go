package troupe

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"
)

// LookupOption adjusts a discovery lookup.
type LookupOption func(*lookupConfig)

type lookupConfig struct {
	registries []string
}

// WithRegistries asks these registrars (possibly remote, queried
// concurrently, answers taken in this order) instead of the node's own.
// Each address is in any form [ParseAddr] accepts; a lookup given one that
// does not parse fails with an error wrapping [ErrBadAddr].
func WithRegistries(addrs ...string) LookupOption {
	return func(c *lookupConfig) { c.registries = addrs }
}

// serviceSources is lookupSources for service keys and topics: a node
// that uses no registry but is a cluster member asks the cluster's.
func (dc *registryClient) serviceSources(opts []LookupOption) ([]registry, error) {
	srcs, err := dc.lookupSources(opts)
	if errors.Is(err, ErrNoRegistry) {
		if er := dc.n.cl.entries(); er != nil {
			return []registry{er}, nil
		}
	}
	return srcs, err
}

// registrationTargets lists the registries this node's entries are
// registered with: its own registrar, the remote ones, its own etcd and
// the cluster, when the cluster is the node's registry (none: nothing).
func (dc *registryClient) registrationTargets() []registry {
	out := dc.ownRegistries()
	if er := dc.n.cl.entries(); er != nil {
		out = append(out, er)
	}
	return out
}

// ownRegistries lists the registries of the node's configuration: its
// own registrar, the remote ones and its own etcd.
func (dc *registryClient) ownRegistries() []registry {
	var out []registry
	if dc.n.registrar.reg() != nil {
		out = append(out, localRegistry{dc: dc})
	}
	for _, a := range dc.remoteRegistrars() {
		out = append(out, remoteRegistrar{dc, a})
	}
	if r := dc.store.own(); r != nil {
		out = append(out, r)
	}
	return out
}

func (dc *registryClient) lookupSources(opts []LookupOption) ([]registry, error) {
	var cfg lookupConfig
	if dc.n.lc.workOver() {
		return nil, ErrNodeClosed
	}
	for _, o := range opts {
		o(&cfg)
	}
	var out []registry
	if cfg.registries != nil {
		for _, s := range cfg.registries {
			if dc.store.names(s) {
				r, err := dc.store.at(s)
				if err != nil {
					return nil, fmt.Errorf("WithRegistries: %w", err)
				}
				out = append(out, r)
				continue
			}
			a, err := ParseAddr(s)
			if err != nil {
				return nil, fmt.Errorf("WithRegistries: %w", err)
			}
			if dc.n.registrar.reg() != nil && dc.n.isOwnAddr(a) {
				out = append(out, localRegistry{dc, a})
			} else {
				out = append(out, remoteRegistrar{dc, a})
			}
		}
		return out, nil
	}
	if out = dc.ownRegistries(); len(out) == 0 {
		return nil, ErrNoRegistry
	}
	return out, nil
}

// registrarRef returns a ref to the registrar actor at addr, resolving it
// again when the association it was bound to has ended.
func (dc *registryClient) registrarRef(ctx context.Context, addr Addr) (Ref[regRequest], error) {
	if v, ok := dc.refs.Load(addr); ok {
		r := v.(Ref[regRequest])
		if r.h.assoc == nil || r.h.assoc.failure() == nil {
			return r, nil
		}
	}
	r, err := resolveAt[regRequest](ctx, dc.n, addr, registrarPath)
	if err != nil {
		return Ref[regRequest]{}, err
	}
	dc.refs.Store(addr, r)
	return r, nil
}

// registryTimeout bounds one request to a registrar.
func (dc *registryClient) registryTimeout() time.Duration { return dc.n.cfg.RegistryTimeout }

// localTier ranks an address for a caller on this host: 0 Unix socket, 1
// TCP on loopback or one of this host's addresses, 2 remote TCP.
func localTier(a Addr) int {
	if a.isUnix() {
		return 0
	}
	if a.isLoopback() {
		return 1
	}
	host, _, _ := net.SplitHostPort(a.address)
	if ip, err := netip.ParseAddr(host); err == nil && hostIPs()[ip] {
		return 1
	}
	return 2
}

var hostIPs = sync.OnceValue(func() map[netip.Addr]bool {
	m := map[netip.Addr]bool{}
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil {
			m[p.Addr()] = true
		}
	}
	return m
})

// candidate is one way to reach a registered actor.
type candidate struct {
	reg  Registration
	addr Addr
}

// preferAddrs orders every address of regs by locality (Unix socket, then
// local TCP, then remote TCP) and, within a tier, newest registration first.
func preferAddrs(regs []Registration) []candidate {
	var out []candidate
	for _, r := range regs {
		for _, a := range r.Addrs {
			out = append(out, candidate{r, a})
		}
	}
	slices.SortStableFunc(out, func(x, y candidate) int {
		if c := cmp.Compare(localTier(x.addr), localTier(y.addr)); c != 0 {
			return c
		}
		return cmp.Compare(y.reg.Seq, x.reg.Seq)
	})
	return out
}

// QueryActor asks the node's registrars (or those of [WithRegistries])
// where an actor named name lives, without connecting to it, and returns
// the registration a lookup would use, with the address it would dial
// first in Addrs[0] (a Unix socket, then local TCP, then remote TCP) and
// the registrar that answered in Registry (zero: this node's own
// registry, or etcd). When none of them has it, the error wraps
// [ErrNotFound] (or, when a registrar could not be asked, is why).
func (n *Node) QueryActor(ctx context.Context, name string, opts ...LookupOption) (Registration, error) {
	srcs, err := n.disc.lookupSources(opts)
	if err != nil {
		return Registration{}, err
	}
	answers, errs := n.disc.findAll(ctx, srcs, name)
	for i, regs := range answers {
		if c := preferAddrs(regs); len(c) > 0 {
			r := c[0].reg
			r.Registry = srcs[i].addr()
			r.Addrs = append([]Addr{c[0].addr}, slices.DeleteFunc(slices.Clone(r.Addrs), func(a Addr) bool { return a == c[0].addr })...)
			return r, nil
		}
	}
	return Registration{}, n.disc.notFound(srcs, name, errs)
}

// findAll asks every source concurrently.
func (dc *registryClient) findAll(ctx context.Context, srcs []registry, name string) ([][]Registration, []error) {
	answers, errs := make([][]Registration, len(srcs)), make([]error, len(srcs))
	var wg sync.WaitGroup
	for i, s := range srcs {
		wg.Go(func() { answers[i], errs[i] = s.ask(ctx, regRequest{Op: regOpFind, Name: name}) })
	}
	wg.Wait()
	return answers, errs
}

// notFound is what a lookup of one actor that found nothing returns: the
// registrars' errors if any failed, else ErrNotFound naming the name and
// the registrars asked.
func (dc *registryClient) notFound(srcs []registry, name string, errs []error) error {
	if err := errors.Join(errs...); err != nil {
		return err
	}
	asked := make([]string, len(srcs))
	for i, s := range srcs {
		asked[i] = s.String()
	}
	return fmt.Errorf("%w: %q (asked %s)", ErrNotFound, name, strings.Join(asked, ", "))
}

// FindActor returns a ref to a live actor registered under name, asking the
// node's registrars (or those of [WithRegistries]) concurrently and taking
// the first match in their configured order. When no registrar has the
// name, the error wraps [ErrNotFound] and names the name and the
// registrars asked; when a registrar could not be asked, it says why.
// When the name is registered but no instance can be handed out, the error
// says why and is not ErrNotFound: [ErrWrongType] for an actor of another
// message type, the dial's error for one that cannot be reached, the
// context's error when ctx ended.
//
// Names are not unique: when several actors share a name, the one chosen is
// the most recently registered in the preferred locality tier (see
// [Node.QueryActor]); which one is not otherwise promised. Before asking any
// registrar, FindActor checks this node's own actors and the actors it has
// already found on peers it is still connected to, and returns one of those
// without a registrar round trip. An address that no longer accepts
// connections is deleted from that registrar's table on the way.
func FindActor[T any](ctx context.Context, n *Node, name string, opts ...LookupOption) (Ref[T], error) {
	if r, ok := fastPath[T](n, name, opts); ok {
		return r, nil
	}
	srcs, err := n.disc.lookupSources(opts)
	if err != nil {
		return Ref[T]{}, err
	}
	answers, errs := n.disc.findAll(ctx, srcs, name)
	var whys []error
	for i, regs := range answers {
		r, ok, _, why := connect[T](ctx, n, srcs[i], regs)
		if ok {
			return r, nil
		}
		if why != nil {
			whys = append(whys, why)
		}
	}
	if err := unreachedErr[T](ctx, name, whys); err != nil {
		return Ref[T]{}, err
	}
	return Ref[T]{}, n.disc.notFound(srcs, name, errs)
}

// unreachedErr says why a lookup that found name registered returns no
// ref: the context ended, or each instance answered with an error (of
// another message type, or not reachable). Nil when there is no such
// reason: then the name is not registered, as far as the lookup saw.
func unreachedErr[T any](ctx context.Context, name string, whys []error) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("troupe: looking up %q: %w", name, err)
	}
	if len(whys) == 0 {
		return nil
	}
	return fmt.Errorf("troupe: %q is registered but cannot be reached as a %s: %w", name, reflect.TypeFor[T](), errors.Join(whys...))
}

// FindActorPerRegistrar asks every registrar (the node's, or those of
// [WithRegistries]) and returns one entry per registrar, in their
// configured order: a ref to that registrar's match, or a zero Ref (a
// hole) where it had none. Like every lookup that returns a listing, it
// returns an empty one (nil) when every registrar missed; an error says
// why a registrar could not be asked.
func FindActorPerRegistrar[T any](ctx context.Context, n *Node, name string, opts ...LookupOption) ([]Ref[T], error) {
	srcs, err := n.disc.lookupSources(opts)
	if err != nil {
		return nil, err
	}
	answers, errs := n.disc.findAll(ctx, srcs, name)
	out := make([]Ref[T], len(srcs))
	any := false
	for i, regs := range answers {
		if r, ok, _, _ := connect[T](ctx, n, srcs[i], regs); ok {
			out[i], any = r, true
		}
	}
	if any {
		return out, nil
	}
	return nil, errors.Join(errs...)
}

// gone reports whether err, from resolving a registered actor, says the
// actor or its node incarnation is gone for good (it stopped, its node
// left, or this node quarantined it, as connect skips one it had already
// quarantined): the registration is stale, and the name is as good as not
// registered.
func gone(err error) bool {
	return errors.Is(err, ErrNoSuchActor) || errors.Is(err, ErrActorStopped) || errors.Is(err, ErrPeerLeft) || errors.Is(err, ErrPeerUnreachable)
}

// connect returns a ref to the first of regs that can be reached, trying
// addresses in order of preference and deleting from src's table each
// address that refuses connections. stale reports that every failure was
// such an address; why is the last failure that says something about the
// name (another message type, an address that could not be reached), nil
// when every instance was simply gone.
func connect[T any](ctx context.Context, n *Node, src registry, regs []Registration) (r Ref[T], ok, stale bool, why error) {
	stale = true
	for _, c := range preferAddrs(regs) {
		if c.reg.Path == "" {
			continue // a node, not an actor
		}
		if c.reg.Node == n.uid {
			h := n.actors.get(c.reg.Path, c.reg.UUID)
			if h != nil && h.local.protocol() == reflect.TypeFor[T]() {
				return Ref[T]{h: h}, true, false, nil
			}
			if h != nil {
				why = fmt.Errorf("%w: %s accepts %s", ErrWrongType, c.reg.Path, h.local.protocol())
			}
			stale = false
			continue
		}
		if n.peers.isQuarantined(c.reg.Node) {
			// Known gone (the quarantine binds that incarnation): not
			// dialed, until the quarantine is lifted.
			stale = false
			continue
		}
		r, err := Resolve[T](ctx, n, FormatRef(c.addr, c.reg.Path))
		if err == nil && r.NodeUID() == c.reg.Node {
			n.disc.remember(c.reg.Name, r.h, protocolName(reflect.TypeFor[T]()))
			return r, true, false, nil
		}
		if err != nil && isRefused(err) {
			n.disc.deleteStale(ctx, src, c.reg.Node, c.addr)
		} else {
			stale = false
			if err != nil && !gone(err) {
				why = err
			}
		}
	}
	return Ref[T]{}, false, stale, why
}

// deleteStale removes an address that refused connections from a
// registrar's table.
func (dc *registryClient) deleteStale(ctx context.Context, src registry, node NodeUID, addr Addr) {
	dc.n.log.Info("troupe: deleting a stale registry address", "addr", addr.String(), "registrar", src.String())
	src.deleteAddr(ctx, node, addr)
}

// foundRef is an actor a lookup found on a peer, kept for the local fast
// path while its association lives.
type foundRef struct {
	h     *handle
	proto string
}

// remember records that name was found at h, on a live association, and
// watches that actor: the fast path forgets it the moment it stops (or its
// association ends), so it never hands out a ref to a stopped actor.
func (dc *registryClient) remember(name string, h *handle, proto string) {
	if !dc.addFound(name, h, proto) {
		return // known, and watched already
	}
	w := &foundWatch{name: name, target: h.key}
	w.h = &handle{node: dc.n, key: refKey{node: dc.n.uid, path: "/system/$found" + formatBase36(tempSeq.Add(1))}, local: w}
	dc.n.actors.put(w.h.key.path, w.h)
	if err := h.assoc.watch(h, w.h); err != nil {
		w.sysPush(sysMsg{kind: sysTerminated})
	}
}

// addFound records h in the fast-path table under name, replacing an
// entry for the same actor over another session; it reports false when
// the table has it over this session already.
func (dc *registryClient) addFound(name string, h *handle, proto string) bool {
	return dc.found.add(name, h, proto)
}

// forget drops the fast-path entry for the actor key found under name.
func (dc *registryClient) forget(name string, key refKey) { dc.found.drop(name, key) }

// foundRefs is the lookups' fast path: the actors that lookups found on
// peers, by name. mu guards by. A list in the map is never written to
// (add and drop replace it with a changed copy), so that get's caller
// reads the list it took after letting go of the lock.
type foundRefs struct {
	mu mutex[lkFoundRefs]
	by map[string][]foundRef
}

func (f *foundRefs) add(name string, h *handle, proto string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, e := range f.by[name] {
		if e.h.key == h.key && e.h.assoc == h.assoc {
			return false
		}
	}
	list := slices.DeleteFunc(slices.Clone(f.by[name]), func(e foundRef) bool { return e.h.key == h.key })
	if f.by == nil {
		f.by = make(map[string][]foundRef)
	}
	f.by[name] = append(list, foundRef{h, proto})
	return true
}

func (f *foundRefs) drop(name string, key refKey) {
	f.mu.Lock()
	defer f.mu.Unlock()
	list := f.by[name]
	if !slices.ContainsFunc(list, func(e foundRef) bool { return e.h.key == key }) {
		return
	}
	list = slices.DeleteFunc(slices.Clone(list), func(e foundRef) bool { return e.h.key == key })
	if len(list) == 0 {
		delete(f.by, name)
	} else {
		f.by[name] = list
	}
}

// get returns the list under name; the caller must not change it.
func (f *foundRefs) get(name string) []foundRef {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.by[name]
}

// foundWatch is the system-lane watcher of an actor the fast path
// remembers: its Terminated makes the node forget the actor.
type foundWatch struct {
	h      *handle
	name   string
	target refKey
	once   sync.Once
}

func (w *foundWatch) tellAny(any) error                { return ErrNoSuchActor }
func (w *foundWatch) tellWire(any, int, Headers) error { return ErrNoSuchActor }
func (w *foundWatch) sysPush(m sysMsg) bool {
	if m.kind == sysTerminated {
		w.once.Do(func() {
			w.h.node.disc.forget(w.name, w.target)
			w.h.node.actors.remove(w.h.key.path)
		})
	}
	return true
}
func (w *foundWatch) watchHandle() *handle   { return w.h }
func (w *foundWatch) protocol() reflect.Type { return nil }

// fastPath finds name among this node's own actors and the actors it found
// before on peers it is still associated with (and that are not shutting
// down). It is skipped when the
// caller names the registrars to ask.
func fastPath[T any](n *Node, name string, opts []LookupOption) (Ref[T], bool) {
	var cfg lookupConfig
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.registries != nil || n.lc.workOver() {
		return Ref[T]{}, false // a closed node answers with ErrNodeClosed
	}
	want := reflect.TypeFor[T]()
	if h, ok := n.actors.named(name, want); ok {
		return Ref[T]{h: h}, true
	}
	list := n.disc.found.get(name)
	for i := len(list) - 1; i >= 0; i-- {
		f := list[i]
		if f.proto == protocolName(want) && f.h.assoc.failure() == nil && !f.h.assoc.shuttingDown() {
			return Ref[T]{h: f.h}, true
		}
	}
	return Ref[T]{}, false
}

// WaitForActor blocks until some actor is registered under name with any
// of the registrars, then returns a ref to it. The registrars push the
// registration to the waiter; nothing polls. When ctx ends, WaitForActor
// returns ctx.Err() and releases its waiters on the registrars too.
func WaitForActor[T any](ctx context.Context, n *Node, name string, opts ...LookupOption) (Ref[T], error) {
	if r, ok := fastPath[T](n, name, opts); ok {
		return r, nil
	}
	srcs, err := n.disc.lookupSources(opts)
	if err != nil {
		return Ref[T]{}, err
	}
	conds := make([]waitCond, len(srcs))
	for i := range conds {
		conds[i].actorsOnly = true
	}
	for {
		regs, from, err := n.disc.awaitRegistration(ctx, srcs, name, conds)
		if err != nil {
			return Ref[T]{}, err
		}
		r, ok, stale, why := connect[T](ctx, n, srcs[from], regs)
		if ok {
			return r, nil
		}
		if !stale {
			if err := unreachedErr[T](ctx, name, []error{why}); why != nil || ctx.Err() != nil {
				return Ref[T]{}, err
			}
			return Ref[T]{}, fmt.Errorf("troupe: %q is registered but cannot be reached as a %s", name, reflect.TypeFor[T]())
		}
		// Only stale addresses (deleted where the registrar could be
		// asked): wait for a registration newer than every one tried.
		for _, r := range regs {
			conds[from].after = max(conds[from].after, r.Seq)
		}
	}
}

// awaitRegistration parks a waiter for name on every source, the i-th
// answered only by what conds[i] admits, and returns the first
// registrations pushed to one of them, with that source's index. Nothing
// polls: until a registrar pushes, no request crosses the wire. Every
// waiter is released before it returns.
func (dc *registryClient) awaitRegistration(ctx context.Context, srcs []registry, name string, conds []waitCond) ([]Registration, int, error) {
	ws := make([]*regWaiter, len(srcs))
	for i := range ws {
		ws[i] = &regWaiter{name: name, p: newPromise[regReply](dc.n), cond: conds[i]}
	}
	// A wait on a goroutine of its own (etcd's) ends with wctx.
	wctx, stopWaits := context.WithCancel(ctx)
	defer func() {
		stopWaits()
		for i, s := range srcs {
			ws[i].p.finish()
			s.unpark(ws[i])
			conds[i] = ws[i].cond
		}
	}()
	for i, s := range srcs {
		found, err := s.park(ctx, wctx, ws[i])
		if err != nil {
			return nil, i, err
		}
		if found != nil {
			return found, i, nil
		}
	}
	cases := make([]reflect.SelectCase, 0, len(ws)+3)
	for _, w := range ws {
		cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(w.p.ch)})
	}
	cases = append(cases,
		reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(ctx.Done())},
		reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(dc.n.lc.workDone())},
		reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(dc.epochCh())})
	var i int
	for {
		i, _, _ = reflect.Select(cases)
		if i != len(ws)+2 {
			break
		}
		// This node registered again with a registrar (it restarted, or
		// another took its place): the waits it held are gone, park them
		// again wherever they are remote.
		cases[i].Chan = reflect.ValueOf(dc.epochCh())
		for j, s := range srcs {
			s.repark(ctx, ws[j])
		}
	}
	switch {
	case i == len(ws):
		return nil, 0, ctx.Err()
	case i == len(ws)+1:
		return nil, 0, ErrNodeClosed
	}
	if err := ws[i].p.err; err != nil {
		return nil, i, err
	}
	return srcs[i].answer(ws[i], ws[i].p.v), i, nil
}

// Registry is a handle to one registrar. When the registrar is the calling
// node itself, it is an in-process shim that makes no connection.
type Registry struct {
	n   *Node
	src registry
}

// Registry returns a handle to the node's first registrar (or the first of
// [WithRegistries]).
func (n *Node) Registry(opts ...LookupOption) (*Registry, error) {
	srcs, err := n.disc.lookupSources(opts)
	if err != nil {
		return nil, err
	}
	return &Registry{n: n, src: srcs[0]}, nil
}

// IsLocal reports whether the registrar is this node itself.
func (r *Registry) IsLocal() bool { return r.src.isLocal() }

// Addr returns the registrar's address (zero for the local shim).
func (r *Registry) Addr() Addr { return r.src.addr() }

// List returns every registration, oldest first.
func (r *Registry) List(ctx context.Context) ([]Registration, error) {
	return r.src.ask(ctx, regRequest{Op: regOpList})
}

// Find returns the registrations under name, newest first.
func (r *Registry) Find(ctx context.Context, name string) ([]Registration, error) {
	return r.src.ask(ctx, regRequest{Op: regOpFind, Name: name})
}

// Wait blocks until something is registered under name with this
// registrar and returns its registrations.
func (r *Registry) Wait(ctx context.Context, name string) ([]Registration, error) {
	regs, _, err := r.n.disc.awaitRegistration(ctx, []registry{r.src}, name, []waitCond{{}})
	return regs, err
}
