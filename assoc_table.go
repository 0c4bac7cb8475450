package troupe

import (
	"context"
	"fmt"
	"net"
	"slices"
)

// The node's table of associations: finding or starting the one for an
// address, binding refs from messages to it (and charging the dials they
// cause to the peer that sent them), and forgetting it when it ends.

// peerTable is the node's table of associations: by peer incarnation,
// by address, every one not yet finished, and those waiting for a
// duplicate's end; beside them, what a dial or an admission is decided
// against in the same step: the dials refs caused and the bounds they
// count toward, and the addresses claimed and being checked (an entry of
// byAddr yet to be proven). mu guards all of these: one lock, because
// attaching, ending, binding and proving an association each read and
// change several of them at once. Only the table's methods and the
// association's own files (which attach, end, bind and prove under it)
// take mu; the rest of the node asks the table (withUID, heardFrom,
// answersAtAny, allWhere, live). The quarantine has its own lock
// (quarantine.go), and the connections in their handshake are the
// inbound limits' (listen.go).
type peerTable struct {
	n        *Node
	mu       mutex[lkPeers]
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
	// quarantine holds the peer incarnations this node has given up on.
	quarantine quarantineTable
}

// tableEntry is what the peer table keeps of one association, under the
// table's lock (peers.mu).
type tableEntry struct {
	// proven are the addresses this node dialed and found this peer at:
	// this session's, and those of duplicates merged into it.
	proven []Addr
	// resumes is the suspended session this connection takes over, set
	// by attach before the merge.
	resumes *assoc
	// binding: an outbound association made for a ref read from a
	// message, not yet dialed: counted in peers.bindings, not
	// peers.outbound.
	binding bool
	// bound counts the refs bound to this binding that are still
	// reachable: at zero, undialed and not pinned, it is forgotten
	// (releaseBinding). pinned: this node's own use found it.
	bound  int
	pinned bool
	// refsOf is the peer whose refs made this binding; dialFor is that
	// peer once the binding dials, counted in peers.refDials until the
	// association ends. Zero for this node's own dials.
	refsOf, dialFor NodeUID
}

// assocFor returns the association to use for addr, starting a dial if
// there is none. Messages may be queued on it at once.
func (pt *peerTable) assocFor(addr Addr) (*assoc, error) {
	a, err := pt.assocAt(addr, true, NodeUID{})
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
func (pt *peerTable) assocAt(addr Addr, wait bool, from NodeUID) (*assoc, error) {
	a, _, err := pt.assocHeld(addr, wait, from)
	return a, err
}

// assocHeld is assocAt; held says that, without wait, a binding was
// returned and counted as held by one more ref (see holdBinding): the
// caller arranges its release.
func (pt *peerTable) assocHeld(addr Addr, wait bool, from NodeUID) (_ *assoc, held bool, _ error) {
	pt.mu.Lock()
	defer pt.mu.Unlock()
	if cl := pt.claims[addr]; wait && cl != nil && !pt.closing && pt.byAddr[addr] == nil {
		// A peer that connected here claims addr, and the check is under
		// way: its answer decides whether a new connection is needed.
		pt.mu.Unlock()
		select {
		case <-cl.done:
		case <-pt.n.lc.flushing:
		}
		pt.mu.Lock()
	}
	if pt.closing {
		return nil, false, ErrNodeClosed
	}
	if a := pt.byAddr[addr]; a != nil {
		if wait {
			pt.ownDial(a)
			a.tab.pinned = true
		} else if a.tab.binding {
			a.tab.bound++
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
		if pt.bindings >= pt.n.cfg.MaxOutboundConns {
			return nil, false, fmt.Errorf("%s: %w: %d refs to nodes never dialed (Config.MaxOutboundConns)", addr, ErrTooManyConns, pt.bindings)
		}
		a := newAssoc(pt.n, true, addr)
		a.tab.binding, a.tab.refsOf, a.tab.bound = true, from, 1
		pt.bindings++
		pt.byAddr[addr] = a
		pt.all[a] = struct{}{}
		return a, true, nil
	}
	if pt.outbound >= pt.n.cfg.MaxOutboundConns {
		return nil, false, fmt.Errorf("%s: %w: %d outbound associations (Config.MaxOutboundConns)", addr, ErrTooManyConns, pt.outbound)
	}
	a := newAssoc(pt.n, true, addr)
	a.tab.pinned = true
	pt.outbound++
	pt.byAddr[addr] = a
	pt.all[a] = struct{}{}
	return a, false, nil
}

// untable removes a from the node's lookup tables, so no new ref binds to it.
func (pt *peerTable) untable(a *assoc) {
	pt.mu.Lock()
	defer pt.mu.Unlock()
	if pt.byUID[a.peer.uid] == a {
		delete(pt.byUID, a.peer.uid)
	}
	if a.outbound && pt.byAddr[a.dialAddr] == a {
		delete(pt.byAddr, a.dialAddr)
	}
	for _, ad := range a.peer.addrs {
		if pt.byAddr[ad] == a {
			delete(pt.byAddr, ad)
		}
	}
}

// forgetAssoc removes a from the set of live associations (peers.mu held).
func (pt *peerTable) forgetAssoc(a *assoc) {
	if _, ok := pt.all[a]; ok {
		delete(pt.all, a)
		switch {
		case a.tab.binding:
			pt.bindings--
		case a.outbound:
			pt.outbound--
		}
		if p := a.tab.dialFor; p != (NodeUID{}) {
			// A session that merged into another with the same peer (a
			// resume, a simultaneous dial): the charge moves to it.
			w := a.mergedTo.Load()
			if _, live := pt.all[w]; w != nil && live && w.tab.dialFor == (NodeUID{}) {
				w.tab.dialFor, a.tab.dialFor = p, NodeUID{}
			}
		}
		pt.ownDial(a)
	}
}

// releaseBinding runs when a ref bound to a became unreachable (a
// cleanup): a binding that no reachable ref holds and that never dialed
// is forgotten, so that refs nobody keeps do not fill the bound of
// bindings ([Config.MaxOutboundConns]).
func (pt *peerTable) releaseBinding(a *assoc) {
	pt.mu.Lock()
	defer pt.mu.Unlock()
	if a.tab.bound--; a.tab.bound > 0 || !a.tab.binding || a.tab.pinned {
		return
	}
	if _, live := pt.all[a]; !live {
		return
	}
	if pt.byAddr[a.dialAddr] == a {
		delete(pt.byAddr, a.dialAddr)
	}
	pt.forgetAssoc(a)
}

// ownDial makes a this node's own association, no longer charged to the
// peer whose refs made it (peers.mu held).
func (pt *peerTable) ownDial(a *assoc) {
	a.tab.refsOf = NodeUID{}
	if p := a.tab.dialFor; p != (NodeUID{}) {
		a.tab.dialFor = NodeUID{}
		if pt.refDials[p]--; pt.refDials[p] <= 0 {
			delete(pt.refDials, p)
		}
	}
}

// chargeRefDial charges the first dial of a, a binding, to the peer whose
// refs made it; an error when that peer's refs hold their bound (peers.mu
// held).
func (pt *peerTable) chargeRefDial(a *assoc) error {
	p := a.tab.refsOf
	if p == (NodeUID{}) {
		return nil
	}
	if k := pt.refDials[p]; k >= pt.n.cfg.MaxRefDialsPerPeer {
		return fmt.Errorf("%s: %w: refs sent by peer %s already hold %d connections (Config.MaxRefDialsPerPeer)", a.dialAddr, ErrTooManyConns, p.String()[:8], k)
	}
	if pt.refDials == nil {
		pt.refDials = make(map[NodeUID]int)
	}
	pt.refDials[p]++
	a.tab.dialFor = p
	return nil
}

// liveAssocs counts associations that are up and not retired (for tests
// and introspection).
func (pt *peerTable) liveAssocs() int {
	pt.mu.Lock()
	defer pt.mu.Unlock()
	return len(pt.byUID)
}

// bytesWritten sums the bytes written on every live association.
func (pt *peerTable) bytesWritten() uint64 {
	pt.mu.Lock()
	defer pt.mu.Unlock()
	var sum uint64
	for a := range pt.all {
		sum += a.traffic.written.Load()
	}
	return sum
}

// dial connects to addr, through the fault network if the node is on one.
func (pt *peerTable) dial(addr Addr) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(pt.n.lc.dialCtx, pt.n.cfg.DialTimeout)
	defer cancel()
	if f := pt.n.cfg.fault; f != nil {
		return f.dial(ctx, pt.n, addr)
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, addr.network, addr.address)
	if err == nil {
		sizeBuffers(c)
	}
	if err != nil || pt.n.cfg.TLS == nil || addr.isUnix() {
		return c, err
	}
	tc := pt.n.gate.clientTLS(c, addr)
	if err := tc.HandshakeContext(ctx); err != nil {
		c.Close()
		return nil, fmt.Errorf("tls: %w", err)
	}
	return tc, nil
}

// endMemberAssoc ends the association to a cluster member's uid, if any,
// without quarantine (members are never quarantined).
func (pt *peerTable) endMemberAssoc(uid NodeUID, cause error) {
	if a := pt.withUID(uid); a != nil {
		a.fail(cause)
	}
}

// live returns the live association with each peer incarnation (byUID),
// copied under the table's lock for the caller to walk without it.
func (pt *peerTable) live() []*assoc {
	pt.mu.Lock()
	defer pt.mu.Unlock()
	assocs := make([]*assoc, 0, len(pt.byUID))
	for _, a := range pt.byUID {
		assocs = append(assocs, a)
	}
	return assocs
}

// withUID returns the live association with the peer incarnation uid, or
// nil.
func (pt *peerTable) withUID(uid NodeUID) *assoc {
	pt.mu.Lock()
	defer pt.mu.Unlock()
	return pt.byUID[uid]
}

// heardFrom returns, for each peer incarnation with a live association
// that has read anything, when it last heard from it (UnixNano).
func (pt *peerTable) heardFrom() map[NodeUID]int64 {
	pt.mu.Lock()
	defer pt.mu.Unlock()
	heard := make(map[NodeUID]int64, len(pt.byUID))
	for uid, a := range pt.byUID {
		if a.in != nil {
			heard[uid] = a.in.heard.Load()
		}
	}
	return heard
}

// answersAtAny reports whether a is the association with the node at
// one of addrs: dialed there, or proven to answer there.
func (pt *peerTable) answersAtAny(a *assoc, addrs []Addr) bool {
	pt.mu.Lock()
	defer pt.mu.Unlock()
	for _, r := range addrs {
		if a.outbound && a.dialAddr == r || slices.Contains(a.tab.proven, r) {
			return true
		}
	}
	return false
}

// allWhere returns every association not yet finished that keep (called
// under the table's lock: troupe's code only) picks; closing also marks
// the table closing, so that no association is added after.
func (pt *peerTable) allWhere(closing bool, keep func(*assoc) bool) []*assoc {
	pt.mu.Lock()
	defer pt.mu.Unlock()
	if closing {
		pt.closing = true
	}
	assocs := make([]*assoc, 0, len(pt.all))
	for a := range pt.all {
		if keep == nil || keep(a) {
			assocs = append(assocs, a)
		}
	}
	return assocs
}
