package troupe

import (
	"fmt"
)

// The node's table of associations: finding or starting the one for an
// address, binding refs from messages to it (and charging the dials they
// cause to the peer that sent them), and forgetting it when it ends.

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
	n.pmu.Lock()
	defer n.pmu.Unlock()
	if cl := n.claims[addr]; wait && cl != nil && !n.pclosing && n.byAddr[addr] == nil {
		// A peer that connected here claims addr, and the check is under
		// way: its answer decides whether a new connection is needed.
		n.pmu.Unlock()
		select {
		case <-cl.done:
		case <-n.lc.flushing:
		}
		n.pmu.Lock()
	}
	if n.pclosing {
		return nil, false, ErrNodeClosed
	}
	if a := n.byAddr[addr]; a != nil {
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
		if n.bindings >= n.cfg.MaxOutboundConns {
			return nil, false, fmt.Errorf("%s: %w: %d refs to nodes never dialed (Config.MaxOutboundConns)", addr, ErrTooManyConns, n.bindings)
		}
		a := newAssoc(n, true, addr)
		a.binding, a.refsOf, a.bound = true, from, 1
		n.bindings++
		n.byAddr[addr] = a
		n.all[a] = struct{}{}
		return a, true, nil
	}
	if n.outbound >= n.cfg.MaxOutboundConns {
		return nil, false, fmt.Errorf("%s: %w: %d outbound associations (Config.MaxOutboundConns)", addr, ErrTooManyConns, n.outbound)
	}
	a := newAssoc(n, true, addr)
	a.pinned = true
	n.outbound++
	n.byAddr[addr] = a
	n.all[a] = struct{}{}
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
	n.pmu.Lock()
	defer n.pmu.Unlock()
	if n.byUID[a.peerUID] == a {
		delete(n.byUID, a.peerUID)
	}
	if a.outbound && n.byAddr[a.dialAddr] == a {
		delete(n.byAddr, a.dialAddr)
	}
	for _, ad := range a.peerAddrs {
		if n.byAddr[ad] == a {
			delete(n.byAddr, ad)
		}
	}
}

// forgetAssoc removes a from the set of live associations (pmu held).
func (n *Node) forgetAssoc(a *assoc) {
	if _, ok := n.all[a]; ok {
		delete(n.all, a)
		switch {
		case a.binding:
			n.bindings--
		case a.outbound:
			n.outbound--
		}
		if p := a.dialFor; p != (NodeUID{}) {
			// A session that merged into another with the same peer (a
			// resume, a simultaneous dial): the charge moves to it.
			w := a.mergedTo.Load()
			if _, live := n.all[w]; w != nil && live && w.dialFor == (NodeUID{}) {
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
	n.pmu.Lock()
	defer n.pmu.Unlock()
	if a.bound--; a.bound > 0 || !a.binding || a.pinned {
		return
	}
	if _, live := n.all[a]; !live {
		return
	}
	if n.byAddr[a.dialAddr] == a {
		delete(n.byAddr, a.dialAddr)
	}
	n.forgetAssoc(a)
}

// ownDial makes a this node's own association, no longer charged to the
// peer whose refs made it (pmu held).
func (n *Node) ownDial(a *assoc) {
	a.refsOf = NodeUID{}
	if p := a.dialFor; p != (NodeUID{}) {
		a.dialFor = NodeUID{}
		if n.refDials[p]--; n.refDials[p] <= 0 {
			delete(n.refDials, p)
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
	if k := n.refDials[p]; k >= n.cfg.MaxRefDialsPerPeer {
		return fmt.Errorf("%s: %w: refs sent by peer %s already hold %d connections (Config.MaxRefDialsPerPeer)", a.dialAddr, ErrTooManyConns, p.String()[:8], k)
	}
	if n.refDials == nil {
		n.refDials = make(map[NodeUID]int)
	}
	n.refDials[p]++
	a.dialFor = p
	return nil
}
