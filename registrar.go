package troupe

import (
	"cmp"
	"errors"
	"slices"
	"sync/atomic"
)

// Errors about discovery.
var (
	// ErrRegistryOccupied is returned by [Start] when a registry address is
	// held by something that is not a troupe registrar (a foreign listener,
	// or a troupe node that does not serve a registry). troupe never binds
	// over it.
	ErrRegistryOccupied = errors.New("troupe: registry address occupied by something that is not a registrar")
	// ErrRegistryRunning is returned by [Start] with [Config.EnsureRegistry]
	// when a registrar already answers on a registry address.
	ErrRegistryRunning = errors.New("troupe: a registrar already answers on the registry address")
	// ErrNotFound is wrapped by the error of a lookup of one actor
	// ([FindActor], [Node.QueryActor]) when no registrar has the name, and
	// by [Cluster.Down] when no member is at the address.
	ErrNotFound = errors.New("troupe: not found")
	// ErrNoRegistry is returned by lookups on a node that has no registrar
	// configured and none given with [WithRegistries].
	ErrNoRegistry = errors.New("troupe: no registrar configured")
	// ErrRegistrationRefused is returned (wrapped, with the reason) when a
	// registrar does not take a registration: it is past one of the
	// registrar's bounds (16,384 registrations of one node incarnation,
	// 16,384 under one name, 262,144 in all), a field of it is
	// longer than a registrar keeps, or it names another node than the
	// one that sent it. A node refuses a service registration of its own
	// past 10,000 (service keys), with the same error.
	ErrRegistrationRefused = errors.New("troupe: registration refused")
)

// registrarPath is where a registrar's actor lives on its node.
const registrarPath = "/system/registrar"

// Registration is one entry of a registry: an actor (or a node itself,
// with an empty Path) under a name. Names are not unique; the registry is
// keyed by Name and UUID together.
type Registration struct {
	Name     string
	UUID     UUID
	Path     string  // the actor's path on its node; "" for the node itself
	Node     NodeUID // the node incarnation the actor lives on
	NodeName string  // that node's configured name
	Addrs    []Addr  // every address the node listens on
	Seq      uint64  // the registrar's order of registration; later is newer
	Registry Addr    // the registrar that answered (set by lookups; zero for this node's own)
}

// regKey identifies a registration: its name, its actor's uuid and its
// node incarnation (so that no node can take another's entry by
// registering its uuid).
type regKey struct {
	name string
	uuid UUID
	node NodeUID
}

func keyOf(r *Registration) regKey { return regKey{r.Name, r.UUID, r.Node} }

// regTable is the table a registrar serves. It is safe for concurrent use.
type regTable struct {
	// mu guards entries, their counts, seq and waiters.
	mu      mutex[lkRegTable]
	entries map[regKey]*Registration
	// The entries by node incarnation, by name, and how many of each
	// node's list each address: so that a registration, a lookup and a
	// node's departure cost what they touch, not the table.
	byNode map[NodeUID]map[regKey]*Registration
	byName map[string]map[regKey]*Registration
	byAddr map[Addr]map[NodeUID]int
	bounds regBounds
	// live, when set, reports whether a node incarnation is up at this
	// registrar (this node, or a live association): another node's claim
	// on its addresses does not take them, nor does a request to delete
	// one of them.
	live func(NodeUID) bool
	// checks are the registrar's own checks of reported addresses
	// (registrar_check.go); their lock is their own. contest, when set,
	// is told (without mu) of an address a registration claims that a
	// live incarnation holds, for such a check.
	checks  addrChecks
	contest func(node NodeUID, addr Addr, by NodeUID)
	seq     uint64
	waiters map[string]map[*handle]waitCond // name -> reply refs of parked waits
	// subs are the subscribers of Registry.Watch, by their ref; pending
	// are the events made and not yet sent, in the order of the changes
	// (see registry_watch.go).
	subs    map[refKey]*regSub
	pending []regPending

	requests atomic.Uint64 // requests served, for tests and introspection
	// pubMu orders the sending of events: whoever holds it sends all that
	// is pending, oldest first. hasPending says, without a lock, whether
	// there is anything to send.
	pubMu      mutex[lkRegPublish]
	hasPending atomic.Bool
}

func newRegTable() *regTable {
	return &regTable{entries: make(map[regKey]*Registration),
		byNode: make(map[NodeUID]map[regKey]*Registration), byName: make(map[string]map[regKey]*Registration), byAddr: make(map[Addr]map[NodeUID]int),
		bounds: defaultRegBounds, waiters: make(map[string]map[*handle]waitCond)}
}

// put enters e under k, which holds nothing; g.mu is held.
func (g *regTable) put(k regKey, e *Registration) {
	g.entries[k] = e
	index(g.byNode, e.Node, k, e)
	index(g.byName, e.Name, k, e)
	for _, a := range e.Addrs {
		if g.byAddr[a] == nil {
			g.byAddr[a] = map[NodeUID]int{}
		}
		g.byAddr[a][e.Node]++
	}
}

// del removes the entry e under k; g.mu is held.
func (g *regTable) del(k regKey, e *Registration) {
	delete(g.entries, k)
	unindex(g.byNode, e.Node, k)
	unindex(g.byName, e.Name, k)
	for _, a := range e.Addrs {
		if g.byAddr[a][e.Node]--; g.byAddr[a][e.Node] <= 0 {
			delete(g.byAddr[a], e.Node)
			if len(g.byAddr[a]) == 0 {
				delete(g.byAddr, a)
			}
		}
	}
}

func index[K comparable](m map[K]map[regKey]*Registration, at K, k regKey, e *Registration) {
	if m[at] == nil {
		m[at] = map[regKey]*Registration{}
	}
	m[at][k] = e
}

func unindex[K comparable](m map[K]map[regKey]*Registration, at K, k regKey) {
	delete(m[at], k)
	if len(m[at]) == 0 {
		delete(m, at)
	}
}

// waitCond says which registrations answer a parked wait.
type waitCond struct {
	actorsOnly bool   // a node's own registration does not count
	after      uint64 // only a registration with a later Seq counts
}

func (c waitCond) admits(r *Registration) bool {
	return (!c.actorsOnly || r.Path != "") && r.Seq > c.after
}

// register adds or refreshes r. An address r's node listens on that another
// node incarnation had registered is taken from that incarnation (a node
// restarted on the same address); an entry left with no address goes.
// Waiters for r.Name are answered and released. A new entry past the
// table's bounds is refused (err, and nothing changes).
func (g *regTable) register(r Registration) (woken []*handle, err error) {
	defer g.publish()
	var contested []contestedAddr
	defer func() { // (after mu is released)
		for _, c := range contested {
			g.contest(c.node, c.addr, r.Node)
		}
	}()
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.entries[keyOf(&r)] == nil {
		if err := g.admits(&r); err != nil {
			return nil, err
		}
	}
	var added, removed []Registration
	shared, live := g.sharingAddrs(&r)
	if g.contest != nil {
		contested = live
	}
	for _, k := range shared {
		e := g.entries[k]
		kept := slices.DeleteFunc(slices.Clone(e.Addrs), func(a Addr) bool { return slices.Contains(r.Addrs, a) })
		watched := g.watched()
		if watched {
			removed = append(removed, copyReg(e))
		}
		g.del(k, e)
		if len(kept) == 0 {
			continue
		}
		e.Addrs = kept
		g.put(k, e)
		if watched {
			added = append(added, copyReg(e))
		}
	}
	g.seq++
	r.Seq = g.seq
	r.Addrs = slices.Clone(r.Addrs)
	if g.watched() {
		old := g.entries[keyOf(&r)]
		if old == nil || !sameRegistration(old, &r) { // (a refresh that changes nothing is no change)
			if old != nil {
				removed = append(removed, copyReg(old))
			}
			added = append(added, copyReg(&r))
		}
		g.changed(added, removed)
	}
	if k, old := keyOf(&r), g.entries[keyOf(&r)]; old != nil && slices.Equal(old.Addrs, r.Addrs) {
		// A refresh on the same addresses: the indexes stay as they are.
		g.entries[k], g.byNode[r.Node][k], g.byName[r.Name][k] = &r, &r, &r
	} else {
		if old != nil {
			g.del(k, old)
		}
		g.put(k, &r)
	}
	for h, c := range g.waiters[r.Name] {
		if c.admits(&r) {
			woken = append(woken, h)
			delete(g.waiters[r.Name], h)
		}
	}
	if len(g.waiters[r.Name]) == 0 {
		delete(g.waiters, r.Name)
	}
	return woken, nil
}

// contestedAddr is an address a registration claims that a live
// incarnation, node, holds.
type contestedAddr struct {
	node NodeUID
	addr Addr
}

// sharingAddrs lists the entries of other node incarnations than r's
// that list one of r's addresses, but of those live here (a claim on a
// live node's addresses is not believed: it keeps them, and they are
// returned as contested, for the registrar to check); g.mu is held.
func (g *regTable) sharingAddrs(r *Registration) (out []regKey, contested []contestedAddr) {
	var seen map[NodeUID]bool // (made only when there is another node)
	for _, a := range r.Addrs {
		for node := range g.byAddr[a] {
			if node == r.Node || seen[node] {
				continue
			}
			if g.live != nil && g.live(node) {
				contested = append(contested, contestedAddr{node, a})
				continue
			}
			if seen == nil {
				seen = map[NodeUID]bool{}
			}
			seen[node] = true
			for k, e := range g.byNode[node] {
				if slices.ContainsFunc(e.Addrs, func(b Addr) bool { return slices.Contains(r.Addrs, b) }) {
					out = append(out, k)
				}
			}
		}
	}
	return out, contested
}

// unregister removes the entry name of the actor uuid of the node
// incarnation node.
func (g *regTable) unregister(name string, uuid UUID, node NodeUID) {
	defer g.publish()
	g.mu.Lock()
	defer g.mu.Unlock()
	if e := g.entries[regKey{name, uuid, node}]; e != nil {
		g.del(regKey{name, uuid, node}, e)
		if g.watched() {
			g.changed(nil, []Registration{*e})
		}
	}
}

// dropNode removes every registration of a node incarnation.
func (g *regTable) dropNode(uid NodeUID) {
	defer g.publish()
	g.mu.Lock()
	defer g.mu.Unlock()
	// A subscriber on that node is gone with it.
	for k := range g.subs {
		if k.node == uid {
			delete(g.subs, k)
		}
	}
	var removed []Registration
	for k, e := range g.byNode[uid] {
		g.del(k, e)
		if g.watched() {
			removed = append(removed, *e)
		}
	}
	g.changed(nil, removed)
}

// deleteAddr removes a stale address from a registration (and the
// registration, if it has none left) — and from every other registration of
// the same node, which listens on the same addresses.
func (g *regTable) deleteAddr(node NodeUID, addr Addr) {
	defer g.publish()
	g.mu.Lock()
	defer g.mu.Unlock()
	var added, removed []Registration
	for k, e := range g.byNode[node] {
		if !slices.Contains(e.Addrs, addr) {
			continue
		}
		watched := g.watched()
		if watched {
			removed = append(removed, copyReg(e))
		}
		g.del(k, e)
		e.Addrs = slices.DeleteFunc(e.Addrs, func(a Addr) bool { return a == addr })
		if len(e.Addrs) > 0 {
			g.put(k, e)
			if watched {
				added = append(added, copyReg(e))
			}
		}
	}
	g.changed(added, removed)
}

// find returns copies of the registrations under name, newest first.
func (g *regTable) find(name string) []Registration {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []Registration
	for _, e := range g.byName[name] {
		out = append(out, copyReg(e))
	}
	slices.SortFunc(out, func(a, b Registration) int { return cmp.Compare(b.Seq, a.Seq) })
	return out
}

// list returns copies of every registration, oldest first.
func (g *regTable) list() []Registration {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make([]Registration, 0, len(g.entries))
	for _, e := range g.entries {
		out = append(out, copyReg(e))
	}
	slices.SortFunc(out, func(a, b Registration) int { return cmp.Compare(a.Seq, b.Seq) })
	return out
}

// wait parks a waiter for name, unless registrations that c admits exist
// already: then it returns them, newest first.
func (g *regTable) wait(name string, reply *handle, c waitCond) []Registration {
	g.mu.Lock()
	defer g.mu.Unlock()
	var found []Registration
	for _, e := range g.byName[name] {
		if c.admits(e) {
			found = append(found, copyReg(e))
		}
	}
	if len(found) > 0 {
		slices.SortFunc(found, func(a, b Registration) int { return cmp.Compare(b.Seq, a.Seq) })
		return found
	}
	if g.waiters[name] == nil {
		g.waiters[name] = make(map[*handle]waitCond)
	}
	g.waiters[name][reply] = c
	return nil
}

// cancelWait releases a parked waiter, matched by its reply ref's identity.
func (g *regTable) cancelWait(name string, key refKey) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for h := range g.waiters[name] {
		if h.key == key {
			delete(g.waiters[name], h)
		}
	}
	if len(g.waiters[name]) == 0 {
		delete(g.waiters, name)
	}
}

// count counts the registrations held.
func (g *regTable) count() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.entries)
}

// waiting counts parked waiters (for tests and introspection).
func (g *regTable) waiting() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	n := 0
	for _, w := range g.waiters {
		n += len(w)
	}
	return n
}

// sameRegistration reports whether a and b say the same, but for Seq.
func sameRegistration(a, b *Registration) bool {
	return a.Name == b.Name && a.UUID == b.UUID && a.Path == b.Path && a.Node == b.Node && a.NodeName == b.NodeName && slices.Equal(a.Addrs, b.Addrs)
}

func copyReg(e *Registration) Registration {
	c := *e
	c.Addrs = slices.Clone(e.Addrs)
	return c
}

// Registry operations on the wire. Append only: values are on the wire.
const (
	regOpRegister uint8 = iota + 1
	regOpUnregister
	regOpFind
	regOpList
	regOpWait
	regOpCancelWait
	regOpDeleteAddr
	regOpSubscribe   // ReplyTo (a Ref[regEvent]'s handle, sent as a Ref[regReply]) gets the table, then each change; After is the subscription's generation
	regOpUnsubscribe // that subscriber is forgotten
)

// regRequest is what a node sends a remote registrar.
type regRequest struct {
	Op      uint8
	Regs    []regWire
	Name    string
	UUID    UUID
	Node    NodeUID
	Addr    string
	ReplyTo Ref[regReply]
	// For a wait: only actors' registrations (not nodes') answer it, and
	// only those registered after Seq After.
	ActorsOnly bool
	After      uint64

	// sentBy is the node incarnation that sent the request, and remote
	// says it came from a peer: both set by the association it arrived on
	// (never from the wire).
	sentBy
}

// regEvent is what a registrar pushes to a Registry.Watch subscriber:
// the whole table first (Snapshot, in pieces: More on all but the last),
// then each change. Gen is the subscription's generation, as the
// subscriber numbered it (regRequest.After); Seq counts its events from 1.
// A gap means one was lost (a full mailbox): the subscriber subscribes
// again with the next generation and ignores the older one's events.
type regEvent struct {
	Gen      uint64
	Seq      uint64
	Snapshot bool
	More     bool
	Added    []regWire
	Removed  []regWire
	// Refused: the registrar has as many subscribers as it takes.
	Refused bool
}

// regReply is a registrar's answer. Refused, for a registration, says
// why the registrar did not take some of its entries (it took the rest).
type regReply struct {
	Regs    []regWire
	Refused string
}

// regWire is a Registration as it crosses the wire.
type regWire struct {
	Name     string
	UUID     UUID
	Path     string
	Node     NodeUID
	NodeName string
	Addrs    []string
	Seq      uint64
}

func init() {
	SetWireKey[regRequest]("troupe.registry.request")
	SetWireKey[regReply]("troupe.registry.reply")
	SetWireKey[regEvent]("troupe.registry.event")
}

func toWire(rs []Registration) []regWire {
	out := make([]regWire, len(rs))
	for i, r := range rs {
		w := regWire{Name: r.Name, UUID: r.UUID, Path: r.Path, Node: r.Node, NodeName: r.NodeName, Seq: r.Seq}
		for _, a := range r.Addrs {
			w.Addrs = append(w.Addrs, a.String())
		}
		out[i] = w
	}
	return out
}

func fromWire(ws []regWire, from Addr) []Registration {
	out := make([]Registration, 0, len(ws))
	for _, w := range ws {
		r := Registration{Name: w.Name, UUID: w.UUID, Path: w.Path, Node: w.Node, NodeName: w.NodeName, Seq: w.Seq, Registry: from}
		for _, s := range w.Addrs {
			if a, err := ParseAddr(s); err == nil {
				r.Addrs = append(r.Addrs, a)
			}
		}
		out = append(out, r)
	}
	return out
}

// A registrar knows which peer sent a request: a peer may register and
// unregister only its own entries, within its bounds.
func (m regRequest) stamped(s sentBy) any { m.sentBy = s; return m }

// serveRegistry handles one request to this node's registrar actor.
func (rr *registrarRole) serveRegistry(req regRequest) {
	g := rr.reg()
	g.requests.Add(1)
	reply := func(rs []Registration) {
		if !req.ReplyTo.IsZero() {
			req.ReplyTo.Tell(regReply{Regs: toWire(rs)})
		}
	}
	switch req.Op {
	case regOpRegister:
		var refused []error
		for _, r := range fromWire(req.Regs, Addr{}) {
			err := checkRegistration(req.remote, req.from, &r)
			if err == nil {
				err = rr.registryRegister(r)
			}
			if err != nil {
				refused = append(refused, err)
			}
		}
		if len(refused) > 0 {
			rr.refusedRegistrations(req.from, refused)
			if !req.ReplyTo.IsZero() {
				req.ReplyTo.Tell(regReply{Refused: refusedText(refused)})
			}
			break
		}
		reply(nil)
	case regOpUnregister:
		for _, r := range req.Regs {
			node := r.Node
			if req.remote {
				node = req.from // (a peer takes out only its own)
			}
			g.unregister(r.Name, r.UUID, node)
		}
		reply(nil)
	case regOpFind:
		reply(g.find(req.Name))
	case regOpList:
		reply(g.list())
	case regOpWait:
		if req.ReplyTo.IsZero() {
			break
		}
		if found := g.wait(req.Name, req.ReplyTo.h, waitCond{actorsOnly: req.ActorsOnly, after: req.After}); found != nil {
			reply(found)
		}
	case regOpCancelWait:
		if !req.ReplyTo.IsZero() {
			g.cancelWait(req.Name, req.ReplyTo.h.key)
		}
	case regOpDeleteAddr:
		// A peer found the address refusing connections. Nobody loses
		// an address on a peer's word: the registrar checks it itself
		// (registrar_check.go). Its own lookups' reports are its own word.
		if a, err := ParseAddr(req.Addr); err == nil {
			if req.remote {
				rr.checkAddr(req.Node, a, req.from)
			} else {
				g.deleteAddr(req.Node, a)
			}
		}
		reply(nil)
	case regOpSubscribe:
		if req.ReplyTo.IsZero() {
			break
		}
		if !g.subscribe(req.ReplyTo.h, req.After) {
			Ref[regEvent]{h: req.ReplyTo.h}.Tell(regEvent{Gen: req.After, Refused: true})
			break
		}
		g.publish()
	case regOpUnsubscribe:
		if !req.ReplyTo.IsZero() {
			g.unsubscribe(req.ReplyTo.h.key)
		}
	}
}

// registryRegister registers r in this node's registry and answers the
// waiters it wakes; past the registry's bounds it returns why not.
func (rr *registrarRole) registryRegister(r Registration) error {
	woken, err := rr.reg().register(r)
	for _, w := range woken {
		Ref[regReply]{h: w}.Tell(regReply{Regs: toWire([]Registration{r})})
	}
	return err
}

// startRegistrar makes this node serve a registry: the table, the actor at
// registrarPath, and the rule that a peer which leaves or becomes
// unreachable takes its registrations with it.
func (rr *registrarRole) startRegistrar() error {
	g := newRegTable()
	g.live = rr.liveHere
	g.contest = func(node NodeUID, addr Addr, by NodeUID) { rr.checkAddr(node, addr, by) }
	rr.served.Store(g)
	_, err := Spawn(systemParent{rr.n}, "registrar", Behavior[regRequest]{
		Receive: func(_ *Context[regRequest], req regRequest) { rr.serveRegistry(req) },
	})
	if err != nil {
		return err
	}
	subscribeOwn(&rr.n.events, func(e PeerUnreachable) { rr.reg().dropNode(e.UID) })
	return nil
}

// isRegistrar reports whether this node serves a registry (see
// Stats.Registrar).
func (rr *registrarRole) isRegistrar() bool { return rr.reg() != nil }

// systemParent spawns the node's own actors under /system.
type systemParent struct{ n *Node }

func (s systemParent) spawnParent() (*Node, parentCell) { return s.n, nil }

func (s systemParent) basePath() string { return "/system" }

// registrarRole is the node as a registrar: the registry it serves, if
// it serves one (from Start, or from taking over a registry address
// whose registrar is gone), the requests it answers, and its checks of
// what others register. served and refusedLog (a compare-and-swap on
// a time) are atomic.
type registrarRole struct {
	n      *Node
	served atomic.Pointer[regTable]
	// refusedLog paces the warnings of refused registrations.
	refusedLog logGate
}

// reg returns the registry this node serves, or nil. A node may become a
// registrar while it runs, so it is read atomically.
func (rr *registrarRole) reg() *regTable { return rr.served.Load() }

// lists reports whether node has an entry at addr: a report of any other
// address makes the registrar dial nothing.
func (g *regTable) lists(node NodeUID, addr Addr) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, e := range g.byNode[node] {
		if slices.Contains(e.Addrs, addr) {
			return true
		}
	}
	return false
}
