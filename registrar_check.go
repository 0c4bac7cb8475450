package troupe

import (
	"net"
	"time"
)

// How a registrar keeps the tractor promise — stale entries are deleted
// on use — without trusting any peer's word. A lookup that finds an
// address refusing reports it; a registration may claim an address that
// another incarnation holds. Neither is believed: the registrar dials the
// address itself, without associating, and drops an incarnation's
// entries at that address only if the address refuses, or answers as
// another node. The checks are bounded so that reports cannot make the
// registrar dial at will: one check in flight per address, and a rate
// per reporting peer.

const (
	// checkEvery and checkBurst bound the checks one peer's reports and
	// claims may start: a burst, then one per interval.
	checkEvery = time.Second
	checkBurst = 4
	// maxChecking bounds the checks in flight at once, whoever asked.
	maxChecking = 64
)

// addrChecks is a registrar's checks of reported addresses. Its lock
// guards its maps alone; the checks run on goroutines of the node's.
type addrChecks struct {
	mu       mutex[lkAddrChecks]
	inFlight map[Addr]bool
	budget   map[NodeUID]*checkBudget
	started  int // checks started, for the tests
}

// checkBudget is a reporter's allowance: tokens refilled one per
// checkEvery up to checkBurst.
type checkBudget struct {
	tokens float64
	at     time.Time
}

// take reports whether reporter may start a check of addr at now, and
// if so records it as in flight.
func (c *addrChecks) take(now time.Time, reporter NodeUID, addr Addr) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.inFlight[addr] || len(c.inFlight) >= maxChecking {
		return false
	}
	if c.budget == nil {
		c.inFlight, c.budget = map[Addr]bool{}, map[NodeUID]*checkBudget{}
	}
	b := c.budget[reporter]
	if b == nil {
		if len(c.budget) >= 4096 {
			clear(c.budget) // (forgetting allowances only lets peers check again)
		}
		b = &checkBudget{tokens: checkBurst, at: now}
		c.budget[reporter] = b
	}
	b.tokens = min(checkBurst, b.tokens+now.Sub(b.at).Seconds()/checkEvery.Seconds())
	b.at = now
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	c.inFlight[addr] = true
	c.started++
	return true
}

// idle reports how many checks were started, once none is in flight.
func (c *addrChecks) idle() (started int, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.started, len(c.inFlight) == 0
}

func (c *addrChecks) done(addr Addr) {
	c.mu.Lock()
	delete(c.inFlight, addr)
	c.mu.Unlock()
}

// checkAddr checks, in the background, whether the node incarnation node
// still answers at addr (reporter asked, by a report or a claim), and
// drops node's entries at addr if it does not. It reports whether a check
// was started.
//
// Only a definite answer drops anything: the connection refused, or a
// troupe node of another uid welcoming the probe. A handshake that failed
// or timed out (the node busy, or a peer holding its handshake slots) is
// no answer. And an address only the node's own host can reach (a Unix
// socket, loopback) is checked only for a node on the registrar's host.
func (rr *registrarRole) checkAddr(node NodeUID, addr Addr, reporter NodeUID) bool {
	g := rr.reg()
	if g == nil || node == rr.n.uid || rr.n.isOwnAddr(addr) || !g.lists(node, addr) || !rr.reachesAsItsHost(node, addr) ||
		!g.checks.take(time.Now(), reporter, addr) {
		return false
	}
	rr.n.wg.Go(func() {
		defer g.checks.done(addr)
		uid, err := rr.n.peers.probeAt(addr)
		if rr.n.lc.workOver() {
			return
		}
		var why string
		switch {
		case err != nil && isRefused(err):
			why = err.Error()
		case err == nil && uid != (NodeUID{}) && uid != node:
			why = "another node answers there"
		default:
			return // it answers there, or no definite answer: it stays
		}
		rr.n.log.Info("troupe: the registrar checked an address and drops the entries that list it", "addr", addr.String(), "node", node.String(), "why", why)
		g.deleteAddr(node, addr)
	})
	return true
}

// reachesAsItsHost reports whether this node can check addr for node: any
// address that is neither a Unix socket nor loopback, or one of those
// when node is associated here over a local connection (it is on this
// host). A node this node has no association with is judged by the
// address alone.
func (rr *registrarRole) reachesAsItsHost(node NodeUID, addr Addr) bool {
	if addr.network != "unix" && !addr.isLoopback() {
		return true
	}
	a := rr.n.peers.withUID(node)
	if a == nil {
		return true
	}
	a.mu.Lock()
	c := a.conn
	a.mu.Unlock()
	if c == nil {
		return false
	}
	switch ra := c.RemoteAddr().(type) {
	case *net.UnixAddr:
		return true
	case *net.TCPAddr:
		return ra.IP.IsLoopback()
	}
	return false
}
