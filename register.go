package troupe

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
)

// Registration: what a node registers (itself and its named actors),
// with which registrars, and how it keeps them: re-registering after a
// registrar restarts, and taking over a registrar's address when it dies.

// isPublic reports whether an actor at path registers with registrars:
// named actors under /user.
func isPublic(path string) bool {
	if !strings.HasPrefix(path, "/user/") {
		return false
	}
	return !strings.HasPrefix(path[strings.LastIndexByte(path, '/')+1:], "$")
}

func (dc *registryClient) discovering() bool {
	return dc.n.registrar.reg() != nil || len(dc.registrars) > 0 || dc.store.active()
}

func (dc *registryClient) nodeRegistration() Registration {
	return Registration{Name: dc.n.name, UUID: UUID(dc.n.uid), Node: dc.n.uid, NodeName: dc.n.name, Addrs: dc.n.Addrs()}
}

func (dc *registryClient) actorRegistration(h *handle) Registration {
	return Registration{Name: h.name(), UUID: h.key.uuid, Path: h.key.path, Node: dc.n.uid, NodeName: dc.n.name, Addrs: dc.n.Addrs()}
}

// publicRegistrations lists the node, its public actors, its actors
// under service keys and its listed topic relays.
func (dc *registryClient) publicRegistrations() []Registration {
	out := []Registration{dc.nodeRegistration()}
	for _, h := range dc.n.actors.public() {
		out = append(out, dc.actorRegistration(h))
	}
	out = append(out, dc.n.services.serviceRegistrations()...)
	return append(out, dc.n.topics.topicRegistrations()...)
}

// registerNode registers the node itself with every registrar before Start
// returns, and arranges to register everything again whenever it
// re-associates with a registrar.
func (dc *registryClient) registerNode(ctx context.Context) error {
	if !dc.discovering() {
		return nil
	}
	if dc.n.registrar.reg() != nil {
		if err := dc.n.registrar.registryRegister(dc.nodeRegistration()); err != nil {
			return err
		}
	}
	for _, a := range dc.remoteRegistrars() {
		req := regRequest{Op: regOpRegister, Regs: toWire([]Registration{dc.nodeRegistration()})}
		if _, err := (remoteRegistrar{dc, a}).ask(ctx, req); err != nil {
			return fmt.Errorf("register with %w", err)
		}
	}
	if len(dc.registrars) > 0 {
		dc.n.wg.Go(dc.keepRegistrars)
	}
	if dc.store.active() {
		return dc.store.registerNode(ctx)
	}
	return nil
}

// remoteRegistrars lists the registrars this node uses that are not this
// node itself (it may have taken one's address over).
func (dc *registryClient) remoteRegistrars() []Addr {
	out := make([]Addr, 0, len(dc.registrars))
	for _, a := range dc.registrars {
		if !dc.n.isOwnAddr(a) {
			out = append(out, a)
		}
	}
	return out
}

// isRegistrarAssoc reports whether a is the association with one of this
// node's registrars (dialed at its address, or proven to answer there).
func (dc *registryClient) isRegistrarAssoc(a *assoc) bool {
	return dc.n.peers.answersAtAny(a, dc.registrars)
}

// registrarAt returns the uid of the registrar this node holds a live
// association with at addr (the zero uid if none), and whether it is a
// dedicated registrar.
func (dc *registryClient) registrarAt(addr Addr) (NodeUID, bool) {
	v, ok := dc.refs.Load(addr)
	if !ok {
		return NodeUID{}, false
	}
	r := v.(Ref[regRequest])
	if r.h.assoc == nil || r.h.assoc.failure() != nil {
		return NodeUID{}, false
	}
	t := r.h.assoc.lockTarget()
	flags := t.peer.flags
	t.mu.Unlock()
	return r.NodeUID(), flags&helloDedicated != 0
}

// keepRegistrars watches this node's registrars, once a heartbeat
// interval: when the association with one has ended (it restarted, was
// killed, or a link broke), it associates again as soon as the registrar
// answers, registers the node and every named actor with it, and has
// every parked WaitForActor wait there again. Registrar associations are
// never quarantined, so nothing stands in the way but the registrar's
// absence.
func (dc *registryClient) keepRegistrars() {
	t := time.NewTicker(dc.n.cfg.HeartbeatInterval)
	defer t.Stop()
	// An association that ends wakes the keeper at once, so that a
	// registrar that closes or whose process dies is replaced without
	// waiting for the next tick.
	ended := make(chan struct{}, 1)
	sub := subscribeOwn(&dc.n.events, func(PeerUnreachable) {
		select {
		case ended <- struct{}{}:
		default:
		}
	})
	defer sub.Unsubscribe()
	lost := map[Addr]bool{}
	// registered is the registrar incarnation this node last registered
	// with at each address: another one there (a lookup may have found it
	// first) has none of this node's registrations yet.
	registered := map[Addr]NodeUID{}
	// dedicated marks the addresses served by a dedicated registrar: a
	// node waits for one to come back rather than take its address over.
	dedicated := map[Addr]bool{}
	for _, addr := range dc.remoteRegistrars() {
		registered[addr], dedicated[addr] = dc.registrarAt(addr)
	}
	for {
		select {
		case <-dc.n.lc.done:
			return
		case <-t.C:
		case <-ended:
		}
		for _, addr := range dc.remoteRegistrars() {
			uid, _ := dc.registrarAt(addr)
			if uid != (NodeUID{}) && uid == registered[addr] {
				if dc.isPending(addr) && dc.reregister(addr) == nil {
					// The same registrar missed a registration: it has
					// them all now.
					dc.setPending(addr, false)
					dc.n.log.Info("troupe: registered again", "registrar", addr.String())
				}
				continue
			}
			dc.setPending(addr, true)
			if !lost[addr] {
				lost[addr] = true
				dc.n.log.Warn("troupe: registrar lost; registering again when it answers", "registrar", addr.String())
			}
			if dc.reregister(addr) == nil {
				registered[addr], dedicated[addr] = dc.registrarAt(addr)
				dc.setPending(addr, false)
				delete(lost, addr)
				dc.n.log.Info("troupe: registered again", "registrar", addr.String())
				dc.bump()
				continue
			}
			if !dedicated[addr] && dc.takeOver(addr) {
				dc.setPending(addr, false) // this node serves its own registrations there
				delete(lost, addr)
				dc.n.log.Warn("troupe: took over the registry address of a registrar that is gone", "registrar", addr.String())
				dc.bump()
			}
		}
	}
}

// takeOver applies the bootstrap rule again to a registry address whose
// registrar is gone: when nothing answers there any more, this node binds
// it and becomes the registrar, with its own registrations. Binding is the
// election: of the nodes that try at once exactly one succeeds, and the
// others find it on their next round and register with it.
func (dc *registryClient) takeOver(addr Addr) bool {
	ctx, cancel := context.WithTimeout(dc.n.lc.ctx, dc.registryTimeout())
	defer cancel()
	if res, _ := dc.n.probe(ctx, addr); res != probeAbsent {
		return false // it answers again, or something else holds it
	}
	l, err := dc.n.lis.listenOne(ctx, addr)
	if err != nil {
		return false // another node bound it first: it is the registrar
	}
	if dc.n.registrar.reg() == nil {
		if err := dc.n.registrar.startRegistrar(); err != nil {
			return false
		}
	}
	if dc.n.lc.isClosed() || !dc.n.lis.serve(func() { dc.n.wg.Go(func() { dc.n.lis.acceptLoop(l) }) }) {
		return false // shutdown closes l with the others
	}
	var refused []error
	for _, r := range dc.publicRegistrations() {
		if err := dc.n.registrar.registryRegister(r); err != nil {
			refused = append(refused, err)
		}
	}
	if len(refused) > 0 {
		dc.n.registrar.refusedRegistrations(NodeUID{}, refused)
	}
	return true
}

// reregister sends every registration of this node to the registrar at
// addr again. Registrations the registrar refuses (past its bounds) are
// logged, not retried: it took the rest.
func (dc *registryClient) reregister(addr Addr) error {
	ctx, cancel := context.WithTimeout(dc.n.lc.ctx, dc.registryTimeout())
	defer cancel()
	regs := dc.publicRegistrations()
	var refused error
	// In pieces, so that no request nears MaxFrameSize (a node may hold
	// 10,000 service entries and any number of named actors).
	for piece := range slices.Chunk(regs, regPiece) {
		req := regRequest{Op: regOpRegister, Regs: toWire(piece)}
		_, err := remoteRegistrar{dc, addr}.ask(ctx, req)
		switch {
		case errors.Is(err, ErrRegistrationRefused):
			refused = err
		case err != nil:
			return err
		}
	}
	if refused != nil {
		dc.n.log.Warn("troupe: the registrar refused some of this node's registrations", "registrar", addr.String(), "err", refused)
	}
	return nil
}

// regPiece is how many registrations one request to a registrar carries
// at most when a node registers (or unregisters) everything: with the
// longest names and paths and a node's few addresses, well under
// MaxFrameSize.
const regPiece = 256

// tellRegistrar sends req without waiting for an answer.
func (dc *registryClient) tellRegistrar(addr Addr, req regRequest) {
	if v, ok := dc.refs.Load(addr); ok {
		v.(Ref[regRequest]).Tell(req)
	}
}

// registerActor registers a newly spawned public actor with every
// registrar (see registerEntry); a registrar's refusal is logged.
func (dc *registryClient) registerActor(h *handle) {
	if err := dc.registerEntry(h, dc.actorRegistration(h)); err != nil {
		dc.n.log.Warn("troupe: a registrar refused an actor's registration; lookups there do not find it", "path", h.key.path, "err", err)
	}
}

// registerEntry registers r, an entry of the actor h (its own name, or a
// service key), with every registrar, waiting (boundedly) for each remote
// one. A registrar that does not answer is logged, not fatal: the node
// registers everything again when it re-associates with it. A registrar
// that refuses r (past its bounds: [ErrRegistrationRefused]) is not
// asked again; the first refusal is returned.
func (dc *registryClient) registerEntry(h *handle, r Registration) (refused error) {
	if err := checkRegistration(false, dc.n.uid, &r); err != nil {
		return err // (no registrar keeps it: a path longer than 1 KiB)
	}
	for _, reg := range dc.registrationTargets() {
		if err := reg.register(h, r); err != nil && refused == nil {
			refused = err
		}
	}
	return refused
}

// unregisterActor removes a stopped public actor from every registrar,
// without waiting.
func (dc *registryClient) unregisterActor(h *handle) { dc.unregisterEntry(h.name(), h.key.uuid) }

// unregisterEntry removes the entry name of the actor uuid from every
// registrar, without waiting.
func (dc *registryClient) unregisterEntry(name string, uuid UUID) {
	for _, reg := range dc.registrationTargets() {
		reg.unregister(name, uuid)
	}
}

// unregisterAll removes the node and its actors from the remote registrars
// as it closes; the frames go out ahead of the goodbye.
func (dc *registryClient) unregisterAll() {
	if len(dc.registrars) == 0 {
		return
	}
	regs := dc.publicRegistrations()
	for _, a := range dc.remoteRegistrars() {
		for piece := range slices.Chunk(regs, regPiece) {
			dc.tellRegistrar(a, regRequest{Op: regOpUnregister, Regs: toWire(piece)})
		}
	}
}

// registryClient is how a node reaches its registries: the registry it
// serves itself (registrarRole), the remote registrars it registers
// with, or a store such as etcd (through its storeClient). Set in Start
// and then read-only, but for the maps (sync.Map), the store client's own
// state, the epoch and the lookups' fast path (each with its own lock),
// and what mu guards: pending.
type registryClient struct {
	n          *Node
	registrars []Addr       // the remote registrars this node registers with
	store      *storeClient // a store's client: etcd's (etcd_registry.go)
	refs       sync.Map     // Addr -> Ref[regRequest], resolved registrar actors
	found      foundRefs    // the actors lookups found on peers (lookup.go)

	mu mutex[lkRegistrars]
	// pending holds the registrars whose copy of this node's
	// registrations is known to be incomplete: a registration failed, or
	// the registrar was lost. keepRegistrars sends them all again; Ready
	// is false meanwhile.
	pending map[Addr]bool

	// epoch signals each time this node registers again with a
	// registrar; parked waits park again then (its own lock).
	epoch wakeup
}

// setPending records whether the registrar at addr lacks some of this
// node's registrations.
func (dc *registryClient) setPending(addr Addr, pending bool) {
	dc.mu.Lock()
	defer dc.mu.Unlock()
	if !pending {
		delete(dc.pending, addr)
		return
	}
	if dc.pending == nil {
		dc.pending = make(map[Addr]bool)
	}
	dc.pending[addr] = true
}

func (dc *registryClient) isPending(addr Addr) bool {
	dc.mu.Lock()
	defer dc.mu.Unlock()
	return dc.pending[addr]
}

// pendingAt returns a registrar that lacks some of this node's
// registrations, if any.
func (dc *registryClient) pendingAt() (Addr, bool) {
	dc.mu.Lock()
	defer dc.mu.Unlock()
	for a := range dc.pending {
		return a, true
	}
	return Addr{}, false
}

// epochCh returns a channel closed the next time this node
// registers again with a registrar, so that parked waits park again.
func (dc *registryClient) epochCh() <-chan struct{} { return dc.epoch.wait() }

// bump says that this node registered again with a registrar.
func (dc *registryClient) bump() { dc.epoch.signal() }
