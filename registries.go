package troupe

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
)

// The registries that lookups, waits, watches and registration use,
// behind one interface. There are four: this node's own registrar
// (localRegistry) and a remote one (remoteRegistrar), both here; etcd
// (etcdSource, etcd_watch.go); the cluster's members (clusterSource,
// cluster_services.go). With none, a lookup fails with ErrNoRegistry and
// a registration goes nowhere. Only lookupSources, serviceSources and
// registrationTargets (lookup.go) choose among them; everything else
// calls the interface.

// registry is one registry a lookup, a wait or a watch asks, and this
// node's registration writes to.
type registry interface {
	// String names the registry in errors and logs.
	String() string
	// addr is the registrar's address as the lookup named it: zero for
	// this node's own (unless WithRegistries named it), etcd and the
	// cluster. It is what Registry.Addr and Registration.Registry say.
	addr() Addr
	// isLocal reports whether it is this node's own registrar.
	isLocal() bool
	// ask sends req and returns the registrations it answers with.
	ask(ctx context.Context, req regRequest) ([]Registration, error)
	// deleteAddr removes from the registry an address of the node
	// incarnation node that refused connections.
	deleteAddr(ctx context.Context, node NodeUID, addr Addr)
	// park parks w. It returns what w admits when the registry has some
	// at once; otherwise the answer completes w.p. A wait that runs on
	// a goroutine of its own ends with wctx.
	park(ctx, wctx context.Context, w *regWaiter) ([]Registration, error)
	// repark parks w again after this node registered again with its
	// registrars (a restarted registrar forgot its waits).
	repark(ctx context.Context, w *regWaiter)
	// unpark releases w.
	unpark(w *regWaiter)
	// answer reads the registrations of the reply that completed w.p.
	answer(w *regWaiter, v regReply) []Registration
	// watch is Registry.Watch.
	watch(ctx context.Context, each func(RegistryChange)) error
	// register records r, an entry of this node's actor h (its own name,
	// or a service key), waiting boundedly for a registry elsewhere; it
	// returns ErrRegistrationRefused (wrapped) when the registry refuses
	// r past its bounds. A registry that cannot answer now takes r when
	// the node registers everything again.
	register(h *handle, r Registration) error
	// unregister drops this node's entry name of the actor uuid, without
	// waiting.
	unregister(name string, uuid UUID)
	// follow calls set with the registrations sel picks, at once and
	// after each change among them, and answered whenever the registry
	// answered, until ctx ends, the node closes or the registry is
	// lost.
	follow(ctx context.Context, sel regSelector, set func([]Registration), answered func()) error
}

// storeClient is how the core reaches a registry kept in a store that the
// node talks to through a client of its own: etcd (etcd_registry.go,
// whose init sets installStore). When Config.RegistryAddrs names a store,
// the node registers its entries there; a lookup's WithRegistries may
// name one too. The core calls these and names none of the functions,
// types or values the store's files define: the store plugs in from above.
// Set at the node's start and read-only after.
type storeClient struct {
	impl any // the client itself, for its own files' tests
	// names reports whether s, an address in RegistryAddrs or
	// WithRegistries, names a store.
	names func(s string) bool
	// configured reports whether RegistryAddrs names a store: Start then
	// calls start instead of bootstrapping with registrars.
	configured func() bool
	// start sets the node up to use the store of its config, and binds
	// the node's addresses.
	start func(ctx context.Context) error
	// active reports whether the node registers with a store.
	active func() bool
	// own is that store as lookups ask it, nil if none; at is the store
	// named s.
	own func() registry
	at  func(s string) (registry, error)
	// registerNode registers the node itself before Start returns, and
	// keeps the registration alive.
	registerNode func(ctx context.Context) error
	// pending counts the registrations and removals the store has not
	// yet confirmed (Stats.RegistryPending, Ready).
	pending func() int
	// revoke removes every entry of the node as it closes, within wait;
	// closeIdle releases the clients' idle connections once it is closed.
	revoke    func(wait time.Duration)
	closeIdle func()
}

// installStore makes a node's store client: etcd_registry.go's init sets
// it.
var installStore func(n *Node) *storeClient

// regWaiter is one wait parked on a registry: the promise its answer
// completes, what it admits, and what it found when the registry
// answers on a goroutine of the waiter's (etcd).
type regWaiter struct {
	name  string
	p     *promise[regReply]
	cond  waitCond
	found []Registration
}

// localRegistry is this node's own registrar, asked with no message.
type localRegistry struct {
	dc *registryClient
	at Addr // as WithRegistries named it; zero for the node's own
}

func (s localRegistry) String() string { return "this node's registry" }

func (s localRegistry) register(_ *handle, r Registration) error {
	return s.dc.n.registrar.registryRegister(r)
}

func (s localRegistry) unregister(name string, uuid UUID) {
	if reg := s.dc.n.registrar.reg(); reg != nil {
		reg.unregister(name, uuid, s.dc.n.uid)
	}
}
func (s localRegistry) addr() Addr    { return s.at }
func (s localRegistry) isLocal() bool { return true }

func (s localRegistry) ask(ctx context.Context, req regRequest) ([]Registration, error) {
	g := s.dc.n.registrar.reg()
	if g == nil {
		return nil, ErrNoRegistry
	}
	switch req.Op {
	case regOpFind:
		g.requests.Add(1)
		return g.find(req.Name), nil
	case regOpList:
		g.requests.Add(1)
		return g.list(), nil
	}
	return remoteRegistrar(s).ask(ctx, req)
}

func (s localRegistry) deleteAddr(_ context.Context, node NodeUID, addr Addr) {
	if g := s.dc.n.registrar.reg(); g != nil {
		g.deleteAddr(node, addr)
	}
}

func (s localRegistry) park(_, _ context.Context, w *regWaiter) ([]Registration, error) {
	g := s.dc.n.registrar.reg()
	if g == nil {
		return nil, ErrNoRegistry
	}
	return g.wait(w.name, w.p.h, w.cond), nil
}

func (s localRegistry) repark(context.Context, *regWaiter) {}

func (s localRegistry) unpark(w *regWaiter) {
	if g := s.dc.n.registrar.reg(); g != nil {
		g.cancelWait(w.name, w.p.h.key)
	}
}

func (s localRegistry) answer(_ *regWaiter, v regReply) []Registration {
	return fromWire(v.Regs, s.at)
}

func (s localRegistry) watch(ctx context.Context, each func(RegistryChange)) error {
	return watchRegistrar(ctx, s.dc.n, s, s.at, each)
}

func (s localRegistry) follow(ctx context.Context, sel regSelector, set func([]Registration), answered func()) error {
	return followTable(ctx, s, sel, set, answered)
}

// target is the registrar actor a watch follows: none, for this node's
// own.
func (s localRegistry) target(context.Context) (Ref[regRequest], error) {
	if s.dc.n.registrar.reg() == nil {
		return Ref[regRequest]{}, ErrNoRegistry
	}
	return Ref[regRequest]{}, nil
}

func (s localRegistry) subscribe(_ Ref[regRequest], self *handle, gen uint64) error {
	g := s.dc.n.registrar.reg()
	if g == nil {
		return ErrNodeClosed
	}
	if !g.subscribe(self, gen) {
		return fmt.Errorf("registrar %s: %w: it has as many subscribers as it takes (1,024)", s.at, ErrWatchRefused)
	}
	g.publish()
	return nil
}

func (s localRegistry) unsubscribe(_ Ref[regRequest], self *handle) {
	if g := s.dc.n.registrar.reg(); g != nil {
		g.unsubscribe(self.key)
	}
}

// remoteRegistrar is a registrar on another node, asked with messages to
// its registrar actor.
type remoteRegistrar struct {
	dc *registryClient
	at Addr
}

func (s remoteRegistrar) String() string { return s.at.String() }

// register asks the registrar, waiting at most the node's registry
// timeout; one that does not answer is logged and marked pending (the
// node registers everything again when it re-associates with it).
func (s remoteRegistrar) register(h *handle, r Registration) error {
	req := regRequest{Op: regOpRegister, Regs: toWire([]Registration{r})}
	_, err := s.ask(s.dc.n.lc.ctx, req)
	if err == nil || errors.Is(err, ErrRegistrationRefused) {
		return err
	}
	s.dc.n.log.Warn("troupe: could not register actor; registering again when the registrar answers", "path", h.key.path, "name", r.Name, "registrar", s.at.String(), "err", err)
	s.dc.setPending(s.at, true)
	return nil
}

func (s remoteRegistrar) unregister(name string, uuid UUID) {
	s.dc.tellRegistrar(s.at, regRequest{Op: regOpUnregister, Regs: []regWire{{Name: name, UUID: uuid}}})
}
func (s remoteRegistrar) addr() Addr    { return s.at }
func (s remoteRegistrar) isLocal() bool { return false }

func (s remoteRegistrar) ask(ctx context.Context, req regRequest) ([]Registration, error) {
	ctx, cancel := context.WithTimeout(ctx, s.dc.registryTimeout())
	defer cancel()
	r, err := s.dc.registrarRef(ctx, s.at)
	if err != nil {
		return nil, fmt.Errorf("registrar %s: %w", s.at, err)
	}
	rep, err := Ask(ctx, r, func(reply Ref[regReply]) regRequest { req.ReplyTo = reply; return req })
	if err != nil {
		return nil, fmt.Errorf("registrar %s: %w", s.at, err)
	}
	if rep.Refused != "" {
		return nil, fmt.Errorf("registrar %s: %w: %s", s.at, ErrRegistrationRefused, strings.TrimPrefix(rep.Refused, ErrRegistrationRefused.Error()+": "))
	}
	return fromWire(rep.Regs, s.at), nil
}

func (s remoteRegistrar) deleteAddr(ctx context.Context, node NodeUID, addr Addr) {
	s.ask(ctx, regRequest{Op: regOpDeleteAddr, Node: node, Addr: addr.String()})
}

func (s remoteRegistrar) park(ctx, _ context.Context, w *regWaiter) ([]Registration, error) {
	r, err := s.dc.registrarRef(ctx, s.at)
	if err != nil {
		return nil, fmt.Errorf("registrar %s: %w", s.at, err)
	}
	r.Tell(regRequest{Op: regOpWait, Name: w.name, ReplyTo: Ref[regReply]{h: w.p.h}, ActorsOnly: w.cond.actorsOnly, After: w.cond.after})
	return nil, nil
}

func (s remoteRegistrar) repark(ctx context.Context, w *regWaiter) {
	if r, err := s.dc.registrarRef(ctx, s.at); err == nil {
		w.cond.after = 0 // a new registrar numbers from the start
		r.Tell(regRequest{Op: regOpWait, Name: w.name, ReplyTo: Ref[regReply]{h: w.p.h}, ActorsOnly: w.cond.actorsOnly, After: w.cond.after})
	}
}

func (s remoteRegistrar) unpark(w *regWaiter) {
	s.dc.tellRegistrar(s.at, regRequest{Op: regOpCancelWait, Name: w.name, ReplyTo: Ref[regReply]{h: w.p.h}})
}

func (s remoteRegistrar) answer(_ *regWaiter, v regReply) []Registration {
	return fromWire(v.Regs, s.at)
}

func (s remoteRegistrar) watch(ctx context.Context, each func(RegistryChange)) error {
	return watchRegistrar(ctx, s.dc.n, s, s.at, each)
}

func (s remoteRegistrar) follow(ctx context.Context, sel regSelector, set func([]Registration), answered func()) error {
	return followTable(ctx, s, sel, set, answered)
}

// target resolves the registrar actor a watch follows.
func (s remoteRegistrar) target(ctx context.Context) (Ref[regRequest], error) {
	rctx, cancel := context.WithTimeout(ctx, s.dc.registryTimeout())
	defer cancel()
	target, err := s.dc.registrarRef(rctx, s.at)
	if err != nil {
		return Ref[regRequest]{}, fmt.Errorf("registrar %s: %w", s.at, err)
	}
	return target, nil
}

func (s remoteRegistrar) subscribe(target Ref[regRequest], self *handle, gen uint64) error {
	target.Tell(regRequest{Op: regOpSubscribe, ReplyTo: Ref[regReply]{h: self}, After: gen})
	return nil
}

func (s remoteRegistrar) unsubscribe(target Ref[regRequest], self *handle) {
	target.Tell(regRequest{Op: regOpUnsubscribe, ReplyTo: Ref[regReply]{h: self}})
}

// subscriber is a registrar whose table a watch follows by
// subscription: this node's own or a remote one.
type subscriber interface {
	target(ctx context.Context) (Ref[regRequest], error)
	subscribe(target Ref[regRequest], self *handle, gen uint64) error
	unsubscribe(target Ref[regRequest], self *handle)
}

// followTable is follow for a registrar: Watch keeps a copy of the
// table, and set gets what sel picks from it after each change that
// touched it.
func followTable(ctx context.Context, src registry, sel regSelector, set func([]Registration), answered func()) error {
	table := map[regKey]Registration{}
	return src.watch(ctx, func(c RegistryChange) {
		touched := c.Snapshot
		if c.Snapshot {
			clear(table)
		}
		for _, reg := range c.Removed {
			touched = touched || sel.match(reg.Name)
			delete(table, keyOf(&reg))
		}
		for _, reg := range c.Added {
			if sel.match(reg.Name) {
				touched = true
				table[keyOf(&reg)] = reg
			}
		}
		if touched {
			set(slices.Collect(maps.Values(table)))
			answered()
		}
	})
}
