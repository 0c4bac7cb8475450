package troupe

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"time"
)

// Topics across nodes: a message published once reaches every
// subscriber on every node. Each node with subscribers runs a relay, an
// actor registered in the registry under the topic; a publisher sends
// one copy to each node's relay, which hands it to the node's
// subscribers. A node that publishes follows the relays of every topic
// through one registry watch.

// Topic names a stream of messages of type T that actors on any node
// subscribe to ([Topic.Subscribe]) and anyone publishes to
// ([Topic.Publish]). Make one with a literal:
//
//	news := troupe.Topic[News]{Name: "news"}
type Topic[T any] struct {
	// Name is the topic's name: letters, digits, '-', '_' and '.'
	// ([ErrBadName] is returned where a topic is used otherwise).
	Name string
}

// topicPrefix starts the registry name of a topic's relays.
const topicPrefix = "topic:"

// topics is a node's side of its topics: its relays (by topic name) and
// its publishers' listings of every node's relays.
type topics struct {
	n      *Node
	mu     mutex[lkTopics]
	relays map[string]topicRelayer
	pubs   map[string]topicLister
	seq    uint64
	// follow: the registry watch of every topic's relays runs; table is
	// what it last saw (by registry name), synced closed once it has.
	follow bool
	table  map[string][]Registration
	gen    uint64 // counts the tables
	synced chan struct{}
}

// topicRelayer is a relay of any message type.
type topicRelayer interface {
	relayType() reflect.Type
	listing(n *Node, name string) (Registration, bool)
	syncListing(n *Node, name string)
	alive(n *Node) bool
	// drop takes h out of the subscribers (ts.mu held) and reports
	// whether the relay is to be unlisted, and its uuid.
	drop(h *handle) (unlist bool, uuid UUID)
}

func (r *topicRelay[T]) drop(h *handle) (bool, UUID) {
	r.mu.Lock()
	defer r.mu.Unlock()
	// h, and the adapters of h's actor (same node and uuid).
	r.subs = slices.DeleteFunc(r.subs, func(s *handle) bool { return s == h || s.key.node == h.key.node && s.key.uuid == h.key.uuid })
	unlist := len(r.subs) == 0 && r.listed
	if unlist {
		r.listed = false
	}
	return unlist, r.ref.h.key.uuid
}

// alive reports whether the relay's actor still runs (a relay that
// stopped is made anew).
func (r *topicRelay[T]) alive(n *Node) bool {
	return n.actors.get(r.ref.h.key.path, r.ref.h.key.uuid) != nil
}

// stopTopics takes a stopped actor out of every topic it subscribed to.
func (tp *topics) stopTopics(h *handle) {
	ts := tp
	ts.mu.Lock()
	if len(ts.relays) == 0 {
		ts.mu.Unlock()
		return
	}
	unlist := map[string]topicRelayer{}
	for name, r := range ts.relays {
		if u, _ := r.drop(h); u {
			unlist[name] = r
		}
	}
	ts.mu.Unlock()
	for name, r := range unlist {
		r.syncListing(tp.n, name)
	}
}

// topicLister is a publisher's listing of any message type.
type topicLister interface {
	// update makes the listing of regs; it reports whether a relay
	// could not be resolved (to try again).
	update(ctx context.Context, regs []Registration, gen uint64) bool
}

// topicRelay is a node's relay of one topic: its actor, and the node's
// subscribers it hands each message to.
type topicRelay[T any] struct {
	ref Ref[T]
	// listed (topics.mu): registered under the topic. A relay whose last
	// subscriber left is unregistered but kept (a message already on its
	// way to it is dropped, not a dead letter), and listed again by the
	// next subscriber.
	listed bool
	mu     mutex[lkRelay]
	subs   []*handle
	// regMu orders the relay's registrations: held across each, it
	// makes the registries end as listed says (sent is what they were
	// last told).
	regMu mutex[lkRelayReg]
	sent  bool
}

// syncListing tells the registries what listed says now, if that is not
// what they were last told.
func (r *topicRelay[T]) syncListing(n *Node, name string) {
	r.regMu.Lock()
	defer r.regMu.Unlock()
	ts := &n.topics
	ts.mu.Lock()
	want := r.listed
	ts.mu.Unlock()
	if want == r.sent || n.lc.isClosed() {
		return
	}
	r.sent = want
	if want {
		if err := n.disc.registerEntry(r.ref.h, r.registration(n, name)); err != nil {
			n.log.Warn("troupe: a registrar refused a topic's relay; publishers it serves miss this node's subscribers", "topic", name, "err", err)
		}
	} else {
		n.disc.unregisterEntry(topicPrefix+name, r.ref.h.key.uuid)
	}
}

func (r *topicRelay[T]) registration(n *Node, name string) Registration {
	return n.services.serviceRegistration(serviceEntry{topicPrefix + name, r.ref.h})
}

// topicRegistrations lists this node's listed relays, for the registries
// (registered again with everything else, and kept by etcd's writer).
func (tp *topics) topicRegistrations() []Registration {
	ts := tp
	ts.mu.Lock()
	defer ts.mu.Unlock()
	var out []Registration
	for name, r := range ts.relays {
		if reg, ok := r.listing(tp.n, name); ok {
			out = append(out, reg)
		}
	}
	return out
}

// listing is the relay's registration, if it is listed (ts.mu held).
func (r *topicRelay[T]) listing(n *Node, name string) (Registration, bool) {
	return r.registration(n, name), r.listed
}

func (r *topicRelay[T]) relayType() reflect.Type { return reflect.TypeFor[T]() }

// Subscribe subscribes ref, an actor of this node (or one of its
// message adapters), to t: every message published to t from now on, on
// any node, is delivered to it once, in each publisher's order, until it
// stops or [Topic.Unsubscribe]. A subscriber whose mailbox is full when a
// message arrives gets a dead letter in its place; one that stopped just
// leaves the topic. It returns [ErrBadName], [ErrBadConfig] (ref is not
// an actor of this node, nor one of its message adapters),
// [ErrWrongType] (the topic has subscribers of another type on this
// node) or [ErrNodeClosed].
func (t Topic[T]) Subscribe(n *Node, ref Ref[T]) error {
	if err := checkName(t.Name); err != nil {
		return err
	}
	if ref.h == nil || ref.h.node != n || ref.h.local == nil {
		return notLocal(ref)
	}
	if n.lc.workOver() {
		return ErrNodeClosed
	}
	ts := &n.topics
	ts.mu.Lock()
	// (relayOf may spawn the relay under ts.mu: under the system parent,
	// so that it registers with no registry, which lockrank.go ranks
	// before the topics.)
	r, err := relayOf[T](n, t.Name)
	if err != nil {
		ts.mu.Unlock()
		return err
	}
	r.mu.Lock()
	if !slices.Contains(r.subs, ref.h) {
		r.subs = append(r.subs, ref.h)
	}
	r.mu.Unlock()
	r.listed = true
	ts.mu.Unlock()
	r.syncListing(n, t.Name)
	return nil
}

// relayOf returns this node's relay of the topic name, made if it has
// none (ts.mu held).
func relayOf[T any](n *Node, name string) (r *topicRelay[T], err error) {
	ts := &n.topics
	if old, ok := ts.relays[name]; ok && old.alive(n) {
		r, ok := old.(*topicRelay[T])
		if !ok {
			return nil, fmt.Errorf("%w: topic %s has subscribers of %s on this node", ErrWrongType, name, old.relayType())
		}
		return r, nil
	}
	r = &topicRelay[T]{}
	ts.seq++
	ref, err := Spawn(systemParent{n}, "topic-"+name+"-"+strconv.FormatUint(ts.seq, 36), Behavior[T]{
		Receive: func(c *Context[T], msg T) { r.relay(n, name, c.headers(), msg) },
	})
	if err != nil {
		return nil, err
	}
	r.ref = ref
	if ts.relays == nil {
		ts.relays = map[string]topicRelayer{}
	}
	ts.relays[name] = r
	return r, nil
}

// relay hands msg to the node's subscribers (on the relay's goroutine).
// One that stopped leaves; when none is left, the relay is unlisted.
func (r *topicRelay[T]) relay(n *Node, name string, hd Headers, msg T) {
	r.mu.Lock()
	subs := slices.Clone(r.subs)
	r.mu.Unlock()
	var gone []*handle
	var boxed any = msg // (once, not once per subscriber)
	for _, h := range subs {
		err := tellRecovered(h, boxed, hd)
		switch {
		case err == nil:
		case errors.Is(err, ErrActorStopped), errors.Is(err, ErrNoSuchActor):
			gone = append(gone, h)
		default:
			n.dead.deadLetter(h.String(), msg, err)
		}
	}
	for _, h := range gone {
		unsubscribe[T](n, name, h)
	}
}

// tellRecovered hands msg to the local target h; a panic (an adapter's
// conversion is user code) is its error, not the relay's end.
func tellRecovered(h *handle, msg any, hd Headers) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("troupe: a topic subscriber's adapter panicked: %v", p)
		}
	}()
	return h.local.tellWire(msg, 0, hd)
}

// Unsubscribe takes ref out of t's subscribers; it reports whether
// it was one.
func (t Topic[T]) Unsubscribe(n *Node, ref Ref[T]) bool {
	if ref.h == nil {
		return false
	}
	return unsubscribe[T](n, t.Name, ref.h)
}

// unsubscribe takes h out of the topic name's subscribers here; the
// relay is unlisted with the last.
func unsubscribe[T any](n *Node, name string, h *handle) bool {
	ts := &n.topics
	ts.mu.Lock()
	r, ok := ts.relays[name].(*topicRelay[T])
	if !ok {
		ts.mu.Unlock()
		return false
	}
	r.mu.Lock()
	was := slices.Contains(r.subs, h)
	r.mu.Unlock()
	unlist, _ := r.drop(h)
	ts.mu.Unlock()
	if unlist {
		r.syncListing(n, name)
	}
	return was
}

// topicPub is a publisher's listing of a topic's relays.
type topicPub[T any] struct {
	n     *Node
	umu   mutex[lkPubUpdate] // one update at a time
	gen   uint64             // (umu) the table generation refs were made from
	mu    mutex[lkPub]
	refs  []Ref[T]
	known map[serviceMember]Ref[T]
}

// update makes the listing from regs, of table generation gen; an older
// generation than the listing's is ignored.
func (p *topicPub[T]) update(ctx context.Context, regs []Registration, gen uint64) bool {
	p.umu.Lock()
	defer p.umu.Unlock()
	if gen < p.gen {
		return false
	}
	refs, known, unresolved := serviceRefs[T](ctx, p.n, regs, p.known)
	if ctx.Err() != nil {
		return false
	}
	p.gen = gen
	p.mu.Lock()
	p.refs, p.known = refs, known
	p.mu.Unlock()
	return unresolved > 0
}

func (p *topicPub[T]) current() []Ref[T] {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.refs
}

// Publish sends msg to every subscriber of t, on every node the
// registry lists a relay of t for: one copy to each such node, which
// hands it to its subscribers. Like Send, it waits for room (each
// node's relay is an actor with a mailbox, across the wire with credit)
// and returns ctx's error if ctx ends first; it returns nil when t has
// no subscriber. A node this node has quarantined is skipped. The first
// Publish on a node waits (within ctx) for the registry's listing of
// every topic's relays, which the node then follows, pushed.
func (t Topic[T]) Publish(ctx context.Context, n *Node, msg T) error {
	if err := checkName(t.Name); err != nil {
		return err
	}
	if n.lc.workOver() {
		return ErrNodeClosed
	}
	p, err := publisherOf[T](ctx, n, t.Name)
	if err != nil {
		return err
	}
	local := localRelay[T](n, t.Name)
	for _, r := range p.current() {
		if r.h.local == nil && (n.peers.isQuarantined(r.h.key.node) || r.h.assoc.failure() != nil) {
			continue // a node lost: the listing is being made again
		}
		if local != nil && r.h == local.h {
			local = nil // listed
		}
		if err := r.Send(ctx, msg); err != nil && ctx.Err() != nil {
			return err
		}
	}
	if local != nil {
		// This node's subscribers, before the registry lists their relay
		// (or with no registry at all).
		if err := local.Send(ctx, msg); err != nil && ctx.Err() != nil {
			return err
		}
	}
	return nil
}

// localRelay returns this node's relay of the topic name, if it has one
// of type T.
func localRelay[T any](n *Node, name string) *Ref[T] {
	ts := &n.topics
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if r, ok := ts.relays[name].(*topicRelay[T]); ok {
		return &r.ref
	}
	return nil
}

// publisherOf returns this node's listing of the topic name's relays,
// made (and, with the first, the registry followed) if it has none.
func publisherOf[T any](ctx context.Context, n *Node, name string) (*topicPub[T], error) {
	ts := &n.topics
	ts.mu.Lock()
	if !ts.follow {
		ts.follow, ts.synced = true, make(chan struct{})
		n.wg.Go(n.topics.followTopics)
	}
	synced := ts.synced
	old, ok := ts.pubs[name]
	ts.mu.Unlock()
	if ok {
		p, ok := old.(*topicPub[T])
		if !ok {
			return nil, fmt.Errorf("%w: topic %s is published as another type on this node", ErrWrongType, name)
		}
		return p, nil
	}
	// The registry's first listing, within RegistryTimeout: past that,
	// the publisher goes on with what it has (its own node's relay) and
	// the listing comes when the registry answers.
	t := time.NewTimer(n.disc.registryTimeout())
	select {
	case <-synced:
	case <-t.C:
	case <-ctx.Done():
		t.Stop()
		return nil, ctx.Err()
	case <-n.lc.workDone():
		t.Stop()
		return nil, ErrNodeClosed
	}
	t.Stop()
	p := &topicPub[T]{n: n}
	ts.mu.Lock()
	if old, ok := ts.pubs[name]; ok { // made meanwhile
		ts.mu.Unlock()
		if p, ok := old.(*topicPub[T]); ok {
			return p, nil
		}
		return nil, fmt.Errorf("%w: topic %s is published as another type on this node", ErrWrongType, name)
	}
	if ts.pubs == nil {
		ts.pubs = map[string]topicLister{}
	}
	ts.pubs[name] = p
	regs, gen := slices.Clone(ts.table[topicPrefix+name]), ts.gen
	ts.mu.Unlock()
	// Made with the node's context, not the caller's: a Publish whose
	// ctx ends must not leave the listing empty for the next.
	uctx, cancel := context.WithTimeout(n.lc.ctx, n.disc.registryTimeout())
	p.update(uctx, regs, gen)
	cancel()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return p, nil
}

// followTopics follows every topic's relays in the registry for the
// node's publishers, until the node closes.
func (tp *topics) followTopics() {
	ts := tp
	first := true
	defer func() {
		// No registry (or the node closed): the publishers have what
		// they have, and this node's own relays.
		ts.mu.Lock()
		if first {
			first = false
			close(ts.synced)
		}
		ts.mu.Unlock()
	}()
	deliver := func(regs []Registration) bool {
		byName := map[string][]Registration{}
		for _, reg := range regs {
			byName[reg.Name] = append(byName[reg.Name], reg)
		}
		ts.mu.Lock()
		ts.table = byName
		ts.gen++
		gen := ts.gen
		pubs := map[string]topicLister{}
		for name, p := range ts.pubs {
			pubs[name] = p
		}
		if first {
			first = false
			close(ts.synced)
		}
		ts.mu.Unlock()
		again := false
		for name, p := range pubs {
			again = p.update(tp.n.lc.ctx, byName[topicPrefix+name], gen) || again
		}
		return again
	}
	for {
		started := tp.n.cl.starts.wait()
		err := tp.n.disc.followRegistry(tp.n.lc.ctx, regSelector{prefix: topicPrefix}, deliver, nil)
		if !errors.Is(err, ErrNoRegistry) && !errors.Is(err, ErrClusterStopped) {
			return
		}
		// No registry: the publishers have their own node's relays, until
		// a cluster starts to serve as the registry.
		if errors.Is(err, ErrClusterStopped) {
			deliver(nil)
		}
		ts.mu.Lock()
		if first {
			first = false
			close(ts.synced)
		}
		ts.mu.Unlock()
		select {
		case <-started:
		case <-tp.n.lc.workDone():
			return
		}
	}
}
