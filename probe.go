package troupe

import (
	"context"
	"time"
)

// Who answers at an address, asked without associating: a probe dials
// it, says hello as a probe, and reads the welcome's uid. A node proves
// the addresses an inbound peer claims this way before it routes their
// traffic to the peer, and a registrar checks a reported or contested
// address this way before it drops anything (registrar_check.go).

// maxProvenClaims bounds how many of a peer's announced addresses are
// checked by dialing back.
const maxProvenClaims = 4

// claim is the check of an address an inbound peer announced; done is
// closed when it is over, proven or not.
type claim struct{ done chan struct{} }

// proveClaims checks, in the background, the first addresses an inbound
// peer announced: a probe dialed to each (no association) must reach the
// same uid before this node routes that address's traffic to the peer's
// association. Until then a send to the address waits for the check
// (assocAt), so that it does not open a second connection to the peer.
func (pt *peerTable) proveClaims(a *assoc) {
	pt.mu.Lock()
	defer pt.mu.Unlock()
	for i, ad := range a.peer.addrs {
		if i == maxProvenClaims || pt.closing {
			return
		}
		if pt.byAddr[ad] != nil || pt.claims[ad] != nil || pt.n.isOwnAddr(ad) {
			continue
		}
		if pt.claims == nil {
			pt.claims = make(map[Addr]*claim)
		}
		cl := &claim{done: make(chan struct{})}
		pt.claims[ad] = cl
		pt.n.wg.Go(func() {
			proven := pt.probeUID(ad) == a.peer.uid
			pt.mu.Lock()
			delete(pt.claims, ad)
			if proven && pt.byUID[a.peer.uid] == a && pt.byAddr[ad] == nil {
				pt.byAddr[ad] = a
				a.tab.proven = append(a.tab.proven, ad)
			}
			pt.mu.Unlock()
			close(cl.done)
		})
	}
}

// probeUID dials addr and asks, without associating, which node answers
// there; the zero uid if none does.
func (pt *peerTable) probeUID(addr Addr) NodeUID {
	uid, _ := pt.probeAt(addr)
	return uid
}

// probeAt is probeUID that also returns why nobody answered: the dial's
// error, or nil for a connection that gave no troupe welcome.
func (pt *peerTable) probeAt(addr Addr) (NodeUID, error) {
	uid, _, err := pt.probeWith(addr, nil)
	return uid, err
}

// tellDowned tells the node at addr, with a probe, that the incarnation
// downed was downed by this node's cluster (hello extension 6: see
// heardDowned), and reports whether the probe was answered (the notice
// was read: the acceptor acts on it before it answers anything) and
// whether the dial connected. It returns within the dial timeout and the
// handshake timeout (a node that cannot be heard never answers), or at
// once when this node closes.
func (pt *peerTable) tellDowned(addr Addr, downed NodeUID) (answered, dialed bool) {
	d := &downedNotice{uid: downed}
	if s := pt.n.cfg.Secret; s != nil {
		d.mac = downedMAC(s, pt.n.uid, downed)
	}
	_, answered, err := pt.probeWith(addr, d)
	return answered, err == nil
}

// probeWith is probeAt with a hello that carries downed, if not nil; it
// also reports whether the node answered at all (a welcome or a refusal:
// it read the hello).
func (pt *peerTable) probeWith(addr Addr, downed *downedNotice) (uid NodeUID, answered bool, err error) {
	c, err := pt.dial(addr)
	if err != nil {
		return NodeUID{}, false, err
	}
	defer c.Close()
	// Bounded by the handshake timeout and by the node closing, whatever
	// the connection does with deadlines.
	ctx, cancel := context.WithTimeout(pt.n.lc.dialCtx, pt.n.cfg.HandshakeTimeout)
	defer cancel()
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	c.SetDeadline(time.Now().Add(pt.n.cfg.HandshakeTimeout))
	h := pt.n.gate.hello()
	h.flags |= helloProbe
	h.downed = downed
	body, _, err := pt.n.gate.dialHandshake(c, newFrameReader(c, maxHelloSize), h)
	if err != nil {
		return NodeUID{}, false, nil
	}
	if frameKind(body[0]) != frameWelcome {
		return NodeUID{}, true, nil
	}
	w, err := parseHello(body[1:])
	if err != nil {
		return NodeUID{}, true, nil
	}
	return w.uid, true, nil
}
