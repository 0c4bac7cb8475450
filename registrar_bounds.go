package troupe

import (
	"fmt"
	"sync/atomic"
	"time"
)

// What a registrar takes, and from whom: its bounds per node, per name
// and in all, the longest fields it keeps, and the rule that a peer
// registers, unregisters and deletes only what is its own (a registry
// request carries its sender, stamped by the association).

// The bounds of what a registrar holds. A registration past one is
// refused (see [ErrRegistrationRefused]); so a peer, hostile or buggy,
// cannot grow a registrar's table without bound, and one node incarnation
// cannot fill a name alone. (A peer that connects as many incarnations
// can still fill one: authenticate peers, with Config.Secret or TLS.)
const (
	// maxRegistrationsPerPeer bounds the registrations of one node
	// incarnation: the node itself, its named actors, its service
	// registrations and its topic relays.
	maxRegistrationsPerPeer = 16384
	// maxRegistrationsPerName bounds the registrations under one name
	// (one service key's listing, or one actor name), over all nodes.
	maxRegistrationsPerName = 16384
	// maxRegistrations bounds a registrar's whole table.
	maxRegistrations = 262144
)

// The longest fields a registrar keeps; a registration with a longer one
// is refused.
const (
	maxRegNameLen  = 512  // a name (an actor's name, "service:" and a key, ...)
	maxRegPathLen  = 1024 // an actor's path
	maxRegNodeName = 255
	maxRegAddrs    = 64 // as many as a hello announces
	maxRegAddrLen  = 512
)

// regBounds are a table's bounds (the constants above; smaller in tests).
type regBounds struct{ perPeer, perName, total int }

var defaultRegBounds = regBounds{maxRegistrationsPerPeer, maxRegistrationsPerName, maxRegistrations}

// admits says why the table does not take r, a new entry (nil if it
// does); g.mu is held.
func (g *regTable) admits(r *Registration) error {
	switch {
	case len(g.byNode[r.Node]) >= g.bounds.perPeer:
		return fmt.Errorf("%w: node %s holds %d registrations, as many as a registrar takes from one node", ErrRegistrationRefused, r.Node, len(g.byNode[r.Node]))
	case len(g.byName[r.Name]) >= g.bounds.perName:
		return fmt.Errorf("%w: %q has %d registrations, as many as a registrar takes under one name", ErrRegistrationRefused, r.Name, len(g.byName[r.Name]))
	case len(g.entries) >= g.bounds.total:
		return fmt.Errorf("%w: the registrar holds %d registrations, as many as it takes", ErrRegistrationRefused, len(g.entries))
	}
	return nil
}

// checkRegistration says why a registrar keeps no registration like r,
// sent by the node incarnation from (for a peer's request: remote), if it
// does not: another node's, or a field longer than a registrar keeps.
func checkRegistration(remote bool, from NodeUID, r *Registration) error {
	switch {
	case remote && r.Node != from:
		return fmt.Errorf("%w: node %s registered %q for another node (%s)", ErrRegistrationRefused, from, r.Name, r.Node)
	case len(r.Name) > maxRegNameLen, len(r.Path) > maxRegPathLen, len(r.NodeName) > maxRegNodeName, len(r.Addrs) > maxRegAddrs:
		return fmt.Errorf("%w: %.64q: a name of at most %d bytes, a path of at most %d, a node name of at most %d and at most %d addresses are kept", ErrRegistrationRefused, r.Name, maxRegNameLen, maxRegPathLen, maxRegNodeName, maxRegAddrs)
	}
	for _, a := range r.Addrs {
		if len(a.String()) > maxRegAddrLen {
			return fmt.Errorf("%w: %q: an address of more than %d bytes", ErrRegistrationRefused, r.Name, maxRegAddrLen)
		}
	}
	return nil
}

// refusedText says in one line why registrations were refused: the first
// reason, and how many more.
func refusedText(errs []error) string {
	if len(errs) == 1 {
		return errs[0].Error()
	}
	return fmt.Sprintf("%v (and %d more)", errs[0], len(errs)-1)
}

// refusedRegistrations logs, at most once a second, that the registrar
// refused registrations of a peer (from; zero for this node).
func (rr *registrarRole) refusedRegistrations(from NodeUID, errs []error) {
	if rr.refusedLog.allow() {
		rr.n.log.Warn("troupe: the registrar refused registrations", "from", from.String(), "refused", len(errs), "err", errs[0])
	}
}

// liveHere reports whether the node incarnation uid is this node or one
// it holds a live association with. (Called under a regTable's mu: it
// takes peers.mu after it, never the other way.)
func (rr *registrarRole) liveHere(uid NodeUID) bool {
	if uid == rr.n.uid {
		return true
	}
	a := rr.n.peers.withUID(uid)
	return a != nil && a.failure() == nil
}

// logGate lets one log line through a second.
type logGate struct{ last atomic.Int64 }

func (g *logGate) allow() bool {
	now := time.Now().UnixNano()
	last := g.last.Load()
	return now-last >= int64(time.Second) && g.last.CompareAndSwap(last, now)
}
