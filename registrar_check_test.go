package troupe

import (
	"net"
	"testing"
	"time"
)

// waitChecksIdle waits until the registrar g has no check in flight and
// returns how many it started.
func waitChecksIdle(t *testing.T, g *regTable) int {
	t.Helper()
	var started int
	waitFor(t, 10*time.Second, "the registrar's checks to end", func() bool {
		s, ok := g.checks.idle()
		started = s
		return ok
	})
	return started
}

// A hostile peer that holds a live node's handshake slots and then
// reports the node's address gets nothing dropped: a probe that is turned
// away or times out is no answer, and only a definite one (refused, or
// another node there) drops an entry.
func TestAHostilePeerCannotGetALiveNodesEntriesDropped(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	reg := freeRegistryAddr(t, "tcp")
	registrar := startNode(t, discoveryConfig("registrar", reg))
	hcfg := discoveryConfig("honest", reg, "tcp://127.0.0.1:0")
	hcfg.MaxPendingHandshakes = 4
	hcfg.HandshakeTimeout = time.Second
	honest := startNode(t, hcfg)
	spawnEcho(t, honest, "svc")
	listed := func() bool {
		for _, r := range registrar.registrar.reg().find("svc") {
			if r.Node == honest.uid {
				return true
			}
		}
		return false
	}
	waitFor(t, 5*time.Second, "honest's entry", listed)
	cfg := testConfig()
	cfg.Name = "hostile"
	hostile := startNode(t, cfg)
	regAddr, _ := ParseAddr(reg)
	addr := honest.Addrs()[0]
	for range 4 { // hold honest's pending handshakes
		c, err := net.Dial("tcp", addr.address)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
	}
	remoteRegistrar{&hostile.disc, regAddr}.ask(ctxT(t, 5*time.Second), regRequest{Op: regOpDeleteAddr, Node: honest.uid, Addr: addr.String()})
	if started := waitChecksIdle(t, registrar.registrar.reg()); started != 1 {
		t.Fatalf("%d checks started, want 1", started)
	}
	if !listed() {
		t.Fatal("the registrar dropped a live node's entries on a hostile peer's report")
	}
}

// A report of an address the named node has no entry at makes the
// registrar dial nothing: reports cannot aim its dials.
func TestAReportOfAnUnlistedAddressDialsNothing(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	reg := freeRegistryAddr(t, "tcp")
	registrar := startNode(t, discoveryConfig("registrar", reg))
	cfg := testConfig()
	cfg.Name = "hostile"
	hostile := startNode(t, cfg)
	victim, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer victim.Close()
	regAddr, _ := ParseAddr(reg)
	for _, node := range []NodeUID{{42}, registrar.uid} {
		remoteRegistrar{&hostile.disc, regAddr}.ask(ctxT(t, 5*time.Second),
			regRequest{Op: regOpDeleteAddr, Node: node, Addr: "tcp://" + victim.Addr().String()})
	}
	if started := waitChecksIdle(t, registrar.registrar.reg()); started != 0 {
		t.Fatalf("the registrar started %d checks of an address no entry lists", started)
	}
}
