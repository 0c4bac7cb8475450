package troupe

import (
	"sync"
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
	mu       sync.Mutex
	inFlight map[Addr]bool
	budget   map[NodeUID]*checkBudget
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
	return true
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
func (n *Node) checkAddr(node NodeUID, addr Addr, reporter NodeUID) bool {
	g := n.reg()
	if g == nil || node == n.uid || n.isOwnAddr(addr) || !g.checks.take(time.Now(), reporter, addr) {
		return false
	}
	n.wg.Go(func() {
		defer g.checks.done(addr)
		uid, err := n.probeAt(addr)
		if uid == node || n.workOver() {
			return // it answers there: the report was wrong
		}
		why := "another node answers there"
		if err != nil {
			why = err.Error()
		} else if uid == (NodeUID{}) {
			why = "no troupe node answers there"
		}
		n.log.Info("troupe: the registrar checked an address and drops the entries that list it", "addr", addr.String(), "node", node.String(), "why", why)
		g.deleteAddr(node, addr)
	})
	return true
}
