package troupe

import (
	"fmt"
	"net"
	"sync"
)

// The node's table of associations: finding or starting the one for an
// address, binding refs from messages to it (and charging the dials they
// cause to the peer that sent them), and forgetting it when it ends.

// peerTable is the node's table of associations: by peer incarnation,
// by address, every one not yet finished, and those waiting for a
// duplicate's end; beside them, what the node holds about peers: the
// dials their refs caused, the claims being checked, the inbound
// connections in their handshake, the quarantine, and the actors that
// lookups found on peers. mu guards every field.
type peerTable struct {
	mu       sync.Mutex
	byUID    map[NodeUID]*assoc  // the live association with each peer incarnation
	byAddr   map[Addr]*assoc     // the association to use for an address
	all      map[*assoc]struct{} // every association not yet finished
	awaiting map[NodeUID][]*assoc
	closing  bool
	outbound int // outbound associations dialing or up, not yet finished
	bindings int // outbound associations bound to refs read from messages, never dialed
	// refDials counts, by peer, the outbound associations its refs made
	// dial, live (see Config.MaxRefDialsPerPeer).
	refDials map[NodeUID]int
	// claims are the announced addresses of inbound peers being checked
	// by a dial-back probe (proveClaims).
	claims map[Addr]*claim
	// handshaking holds inbound connections still in their handshake, so
	// that Close need not wait for their deadline.
	inHandshake map[net.Conn]struct{}
	// quarantine holds the peer incarnations this node has given up on.
	quarantine quarantineTable
	// found holds the actors lookups found on peers, by name.
	found map[string][]foundRef
}

// assocFor returns the association to use for addr, starting a dial if
// there is none. Messages may be queued on it at once.
func (n *Node) assocFor(addr Addr) (*assoc, error) {
	a, err := n.assocAt(addr, true, NodeUID{})
	if err != nil {
		return nil, err
	}
	a.use()
	return a, nil
}

// assocAt returns the association for addr, making one that dials on
// first use if there is none: a ref that arrives inside a message binds to
// it without dialing anything (a peer cannot make this node dial by
// naming addresses). New outbound associations are bounded by
// [Config.MaxOutboundConns]. With wait, a check in progress of a peer's
// claim to addr is waited for first (never from a reader: wait false).
// Without wait, the association is for a ref in a message from the peer
// from: a new one is charged to it when it dials
// ([Config.MaxRefDialsPerPeer]).
func (n *Node) assocAt(addr Addr, wait bool, from NodeUID) (*assoc, error) {
	a, _, err := n.assocHeld(addr, wait, from)
	return a, err
}

// assocHeld is assocAt; held says that, without wait, a binding was
// returned and counted as held by one more ref (see holdBinding): the
// caller arranges its release.
func (n *Node) assocHeld(addr Addr, wait bool, from NodeUID) (_ *assoc, held bool, _ error) {
	n.peers.mu.Lock()
	defer n.peers.mu.Unlock()
	if cl := n.peers.claims[addr]; wait && cl != nil && !n.peers.closing && n.peers.byAddr[addr] == nil {
		// A peer that connected here claims addr, and the check is under
		// way: its answer decides whether a new connection is needed.
		n.peers.mu.Unlock()
		select {
		case <-cl.done:
		case <-n.lc.flushing:
		}
		n.peers.mu.Lock()
	}
	if n.peers.closing {
		return nil, false, ErrNodeClosed
	}
	if a := n.peers.byAddr[addr]; a != nil {
		if wait {
			n.ownDial(a)
			a.pinned = true
		} else if a.binding {
			a.bound++
			held = true
		}
		return a, held, nil
	}
	// (A quarantined incarnation's address is dialed all the same: the
	// handshake refuses that incarnation by its uid, and admits a new
	// one started there.)
	if !wait {
		// A ref read from a message: bound, not dialed. Bindings have a
		// bound of their own, so that a message full of refs cannot take
		// the room of the dials this node makes.
		if n.peers.bindings >= n.cfg.MaxOutboundConns {
			return nil, false, fmt.Errorf("%s: %w: %d refs to nodes never dialed (Config.MaxOutboundConns)", addr, ErrTooManyConns, n.peers.bindings)
		}
		a := newAssoc(n, true, addr)
		a.binding, a.refsOf, a.bound = true, from, 1
		n.peers.bindings++
		n.peers.byAddr[addr] = a
		n.peers.all[a] = struct{}{}
		return a, true, nil
	}
	if n.peers.outbound >= n.cfg.MaxOutboundConns {
		return nil, false, fmt.Errorf("%s: %w: %d outbound associations (Config.MaxOutboundConns)", addr, ErrTooManyConns, n.peers.outbound)
	}
	a := newAssoc(n, true, addr)
	a.pinned = true
	n.peers.outbound++
	n.peers.byAddr[addr] = a
	n.peers.all[a] = struct{}{}
	return a, false, nil
}

// use starts an outbound association's dial, once; the caller has seen it
// not yet leaving.
func (a *assoc) use() {
	if a.outbound {
		a.dialOnce.Do(func() { a.n.wg.Go(a.runOutbound) })
	}
}

// untable removes a from the node's lookup tables, so no new ref binds to it.
func (n *Node) untable(a *assoc) {
	n.peers.mu.Lock()
	defer n.peers.mu.Unlock()
	if n.peers.byUID[a.peerUID] == a {
		delete(n.peers.byUID, a.peerUID)
	}
	if a.outbound && n.peers.byAddr[a.dialAddr] == a {
		delete(n.peers.byAddr, a.dialAddr)
	}
	for _, ad := range a.peerAddrs {
		if n.peers.byAddr[ad] == a {
			delete(n.peers.byAddr, ad)
		}
	}
}

// forgetAssoc removes a from the set of live associations (pmu held).
func (n *Node) forgetAssoc(a *assoc) {
	if _, ok := n.peers.all[a]; ok {
		delete(n.peers.all, a)
		switch {
		case a.binding:
			n.peers.bindings--
		case a.outbound:
			n.peers.outbound--
		}
		if p := a.dialFor; p != (NodeUID{}) {
			// A session that merged into another with the same peer (a
			// resume, a simultaneous dial): the charge moves to it.
			w := a.mergedTo.Load()
			if _, live := n.peers.all[w]; w != nil && live && w.dialFor == (NodeUID{}) {
				w.dialFor, a.dialFor = p, NodeUID{}
			}
		}
		n.ownDial(a)
	}
}

// releaseBinding runs when a ref bound to a became unreachable (a
// cleanup): a binding that no reachable ref holds and that never dialed
// is forgotten, so that refs nobody keeps do not fill the bound of
// bindings ([Config.MaxOutboundConns]).
func (n *Node) releaseBinding(a *assoc) {
	n.peers.mu.Lock()
	defer n.peers.mu.Unlock()
	if a.bound--; a.bound > 0 || !a.binding || a.pinned {
		return
	}
	if _, live := n.peers.all[a]; !live {
		return
	}
	if n.peers.byAddr[a.dialAddr] == a {
		delete(n.peers.byAddr, a.dialAddr)
	}
	n.forgetAssoc(a)
}

// ownDial makes a this node's own association, no longer charged to the
// peer whose refs made it (pmu held).
func (n *Node) ownDial(a *assoc) {
	a.refsOf = NodeUID{}
	if p := a.dialFor; p != (NodeUID{}) {
		a.dialFor = NodeUID{}
		if n.peers.refDials[p]--; n.peers.refDials[p] <= 0 {
			delete(n.peers.refDials, p)
		}
	}
}

// chargeRefDial charges the first dial of a, a binding, to the peer whose
// refs made it; an error when that peer's refs hold their bound (pmu
// held).
func (n *Node) chargeRefDial(a *assoc) error {
	p := a.refsOf
	if p == (NodeUID{}) {
		return nil
	}
	if k := n.peers.refDials[p]; k >= n.cfg.MaxRefDialsPerPeer {
		return fmt.Errorf("%s: %w: refs sent by peer %s already hold %d connections (Config.MaxRefDialsPerPeer)", a.dialAddr, ErrTooManyConns, p.String()[:8], k)
	}
	if n.peers.refDials == nil {
		n.peers.refDials = make(map[NodeUID]int)
	}
	n.peers.refDials[p]++
	a.dialFor = p
	return nil
}
