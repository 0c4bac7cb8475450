package troupe

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// A peer registers and unregisters only its own entries: one that names
// another node (to list actors it does not have, or to crowd that node's
// bounds) is refused, and so is taking out another node's entry.
func TestARegistrarTakesOnlyAPeersOwnRegistrations(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	reg := freeRegistryAddr(t, "tcp")
	registrar := startNode(t, discoveryConfig("registrar", reg))
	honest := startNode(t, discoveryConfig("honest", reg))
	hostile := startNode(t, discoveryConfig("hostile", reg))
	spawnEcho(t, honest, "svc")
	ctx := ctxT(t, 5*time.Second)
	src := hostile.disc.registrars[0]

	forged := Registration{Name: "svc", UUID: UUID{9}, Path: "/user/svc", Node: honest.uid, NodeName: "honest", Addrs: hostile.Addrs()}
	_, err := remoteRegistrar{&hostile.disc, src}.ask(ctx, regRequest{Op: regOpRegister, Regs: toWire([]Registration{forged})})
	if !errors.Is(err, ErrRegistrationRefused) {
		t.Fatalf("registering for another node: %v, want ErrRegistrationRefused", err)
	}
	if got := registrar.registrar.reg().find("svc"); len(got) != 1 || got[0].UUID == (UUID{9}) {
		t.Fatalf("the registrar lists %+v under svc, want only the honest actor", got)
	}

	honestSvc := registrar.registrar.reg().find("svc")[0]
	if _, err := (remoteRegistrar{&hostile.disc, src}).ask(ctx, regRequest{Op: regOpUnregister, Regs: []regWire{{Name: "svc", UUID: honestSvc.UUID}}}); err != nil {
		t.Fatal(err)
	}
	if got := registrar.registrar.reg().find("svc"); len(got) != 1 {
		t.Fatalf("a peer took another node's entry out: %+v", got)
	}

	// Its own entry, it may register (and it is found), and take out.
	own := Registration{Name: "mine", UUID: UUID{7}, Path: "/user/mine", Node: hostile.uid, NodeName: "hostile", Addrs: hostile.Addrs()}
	if _, err := (remoteRegistrar{&hostile.disc, src}).ask(ctx, regRequest{Op: regOpRegister, Regs: toWire([]Registration{own})}); err != nil {
		t.Fatalf("registering its own entry: %v", err)
	}
	if len(registrar.registrar.reg().find("mine")) != 1 {
		t.Fatal("a peer's own entry was not kept")
	}
	if _, err := (remoteRegistrar{&hostile.disc, src}).ask(ctx, regRequest{Op: regOpUnregister, Regs: []regWire{{Name: "mine", UUID: UUID{7}}}}); err != nil {
		t.Fatal(err)
	}
	if len(registrar.registrar.reg().find("mine")) != 0 {
		t.Fatal("a peer could not take its own entry out")
	}
}

// A registration with a field longer than a registrar keeps is refused,
// the rest of the request is taken.
func TestARegistrarRefusesOversizedRegistrations(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	reg := freeRegistryAddr(t, "tcp")
	registrar := startNode(t, discoveryConfig("registrar", reg))
	peer := startNode(t, discoveryConfig("peer", reg))
	ctx := ctxT(t, 5*time.Second)
	base := Registration{Name: "ok", UUID: UUID{1}, Path: "/user/ok", Node: peer.uid, NodeName: "peer", Addrs: peer.Addrs()}
	long := func(edit func(r *Registration)) Registration { r := base; r.UUID = UUID{2}; edit(&r); return r }
	for _, bad := range []Registration{
		long(func(r *Registration) { r.Name = strings.Repeat("n", maxRegNameLen+1) }),
		long(func(r *Registration) { r.Path = "/user/" + strings.Repeat("p", maxRegPathLen) }),
		long(func(r *Registration) { r.NodeName = strings.Repeat("x", maxRegNodeName+1) }),
		long(func(r *Registration) { r.Addrs = []Addr{tcpAddr(strings.Repeat("h", maxRegAddrLen) + ":80")} }),
		long(func(r *Registration) {
			r.Addrs = nil
			for i := range maxRegAddrs + 1 {
				r.Addrs = append(r.Addrs, tcpAddr(fmt.Sprintf("127.0.0.1:%d", 10000+i)))
			}
		}),
	} {
		_, err := remoteRegistrar{&peer.disc, peer.disc.registrars[0]}.ask(ctx, regRequest{Op: regOpRegister, Regs: toWire([]Registration{base, bad})})
		if !errors.Is(err, ErrRegistrationRefused) {
			t.Fatalf("an oversized registration (%.40q): %v, want ErrRegistrationRefused", bad.Name, err)
		}
		if got := registrar.registrar.reg().find(bad.Name); bad.Name != "ok" && len(got) != 0 || bad.Name == "ok" && len(got) != 1 {
			t.Fatalf("after refusing %.40q the registrar lists %d under it", bad.Name, len(got))
		}
	}
	if len(registrar.registrar.reg().find("ok")) != 1 {
		t.Fatal("the well-formed registration beside the refused one was not kept")
	}
}

// A registrar holds at most its bounds: per node incarnation, per name,
// in all. ServiceKey.Register past one fails with ErrRegistrationRefused and
// keeps the entry nowhere; a place freed (an actor stops) is taken again.
func TestARegistrarBoundsAPeerAndAName(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	reg := freeRegistryAddr(t, "tcp")
	registrar := startNode(t, discoveryConfig("registrar", reg))
	registrar.registrar.reg().mu.Lock()
	registrar.registrar.reg().bounds = regBounds{perPeer: 6, perName: 2, total: 1000}
	registrar.registrar.reg().mu.Unlock()
	b := startNode(t, discoveryConfig("b", reg))
	c := startNode(t, discoveryConfig("c", reg))
	// b: its node, three actors (4), two services under echoKey (6).
	w1, w2, w3 := spawnEcho(t, b, "w1"), spawnEcho(t, b, "w2"), spawnEcho(t, b, "w3")
	for _, w := range []Ref[testPing]{w1, w2} {
		if err := echoKey.Register(b, w); err != nil {
			t.Fatal(err)
		}
	}
	other := ServiceKey[testPing]{Name: "others"}
	if err := other.Register(b, w3); !errors.Is(err, ErrRegistrationRefused) || !strings.Contains(err.Error(), "from one node") {
		t.Fatalf("a seventh registration of one node: %v, want ErrRegistrationRefused (per node)", err)
	}
	// c: a third entry under echoKey.
	c1 := spawnEcho(t, c, "c1")
	if err := echoKey.Register(c, c1); !errors.Is(err, ErrRegistrationRefused) || !strings.Contains(err.Error(), "under one name") {
		t.Fatalf("a third registration under one key: %v, want ErrRegistrationRefused (per name)", err)
	}
	ctx := ctxT(t, 5*time.Second)
	got, err := echoKey.Find(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	if paths := listingPaths(got); len(paths) != 2 || paths[0] != w1.Path() || paths[1] != w2.Path() {
		t.Fatalf("the listing is %v, want b's two workers only", paths)
	}
	// A refused registration is not kept on the node either: its stop
	// sends nothing, and registering again once there is room works.
	b.Stop(w1)
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := echoKey.Register(c, c1)
		if err == nil {
			break
		}
		if !errors.Is(err, ErrRegistrationRefused) || time.Now().After(deadline) {
			t.Fatalf("registering once w1 stopped: %v", err)
		}
		time.Sleep(10 * time.Millisecond) // (the stop's unregistration is told, not awaited)
	}
}

// The table's counts follow every way an entry leaves, and its total
// bound holds.
func TestRegTableCountsAndTotalBound(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	g := newRegTable()
	g.bounds = regBounds{perPeer: 10, perName: 10, total: 3}
	addr := tcpAddr("127.0.0.1:7001")
	reg := func(name string, uuid byte, node byte, addrs ...Addr) error {
		_, err := g.register(Registration{Name: name, UUID: UUID{uuid}, Node: NodeUID{node}, Addrs: addrs})
		return err
	}
	for i, want := range []error{nil, nil, nil, ErrRegistrationRefused} {
		if err := reg("a", byte(i+1), 1, addr); !errors.Is(err, want) {
			t.Fatalf("registration %d: %v, want %v", i+1, err, want)
		}
	}
	if err := reg("a", 1, 1, addr); err != nil {
		t.Fatalf("a refresh of a held entry at the bound: %v", err)
	}
	g.unregister("a", UUID{1}, NodeUID{1})
	if err := reg("b", 4, 2, unixAddr("/x")); err != nil {
		t.Fatalf("after one left: %v", err)
	}
	// Node 3 on node 1's address takes it: node 1's entries go.
	if err := reg("c", 5, 3, addr); !errors.Is(err, ErrRegistrationRefused) {
		t.Fatalf("at the total bound: %v", err)
	}
	g.deleteAddr(NodeUID{1}, addr)
	if got := g.count(); got != 1 || len(g.byNode[NodeUID{1}]) != 0 || len(g.byName["a"]) != 0 {
		t.Fatalf("after deleteAddr: %d entries, %v by node, %v by name", got, g.byNode, g.byName)
	}
	if err := reg("c", 5, 3, addr); err != nil {
		t.Fatal(err)
	}
	if err := reg("c", 6, 4, unixAddr("/y")); err != nil {
		t.Fatal(err)
	}
	// Node 5 takes node 3's only address: node 3's entry goes first.
	g.dropNode(NodeUID{4})
	g.dropNode(NodeUID{2})
	if got := g.count(); got != 1 || len(g.byNode) != 1 || len(g.byName) != 1 {
		t.Fatalf("after dropNode: %d entries, %v by node, %v by name", got, g.byNode, g.byName)
	}
	if err := reg("d", 7, 5, addr); err != nil {
		t.Fatal(err)
	}
	if g.count() != 1 || len(g.byNode[NodeUID{3}]) != 0 || len(g.byName["c"]) != 0 || len(g.byNode[NodeUID{5}]) != 1 || len(g.byAddr) != 1 {
		t.Fatalf("after an address was taken over: %v by node, %v by name", g.byNode, g.byName)
	}
	// A refresh on other addresses moves the entry's addresses.
	other := unixAddr("/z")
	if err := reg("d", 7, 5, other); err != nil {
		t.Fatal(err)
	}
	if len(g.byAddr) != 1 || g.byAddr[other][NodeUID{5}] != 1 {
		t.Fatalf("after a refresh on another address: %v by address", g.byAddr)
	}
	g.unregister("d", UUID{7}, NodeUID{5})
	if g.count() != 0 || len(g.byNode) != 0 || len(g.byName) != 0 || len(g.byAddr) != 0 {
		t.Fatalf("an empty table keeps %v by node, %v by name, %v by address", g.byNode, g.byName, g.byAddr)
	}
}

// A node registers everything again in pieces: 10,000 service entries
// under long keys are more than one frame takes.
func TestReregistrationOfManyServicesGoesInPieces(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	slowTest(t)
	reg := freeRegistryAddr(t, "tcp")
	registrar := startNode(t, discoveryConfig("registrar", reg))
	cfg := discoveryConfig("many", reg)
	cfg.RegistryTimeout = 30 * time.Second // (the pieces are the point, not their speed beside other tests)
	n := startNode(t, cfg)
	w := spawnEcho(t, n, strings.Repeat("w", 255)) // (long paths: about 6 MB in all)
	s := &n.services
	s.mu.Lock()
	if s.entries == nil {
		s.entries = map[serviceEntry]struct{}{}
	}
	for i := range maxServicesPerNode {
		s.entries[serviceEntry{name: fmt.Sprintf("%s%0250d", servicePrefix, i), h: w.h}] = struct{}{}
	}
	s.mu.Unlock()
	if err := n.disc.reregister(n.disc.registrars[0]); err != nil {
		t.Fatalf("registering %d services again: %v", maxServicesPerNode, err)
	}
	if got := len(registrar.registrar.reg().byNode[n.uid]); got < maxServicesPerNode {
		t.Fatalf("the registrar holds %d of the node's entries, want at least %d", got, maxServicesPerNode)
	}
}

// BenchmarkRegistrarRegister registers into a table that holds 100,000
// entries of 1,000 nodes: the cost of one registration, which should not
// grow with the table.
func BenchmarkRegistrarRegister(b *testing.B) {
	g := newRegTable()
	for i := range 100000 {
		node := NodeUID{byte(i % 1000), byte(i % 1000 >> 8)}
		g.register(Registration{Name: fmt.Sprintf("svc-%d", i%97), UUID: UUID{byte(i), byte(i >> 8), byte(i >> 16)}, Path: "/user/a",
			Node: node, Addrs: []Addr{tcpAddr(fmt.Sprintf("10.0.%d.%d:7000", i%1000/250, i%1000%250))}})
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		node := NodeUID{byte(i % 1000), byte(i % 1000 >> 8)}
		g.register(Registration{Name: fmt.Sprintf("svc-%d", i%97), UUID: UUID{byte(i), byte(i >> 8), byte(i >> 16)}, Path: "/user/a",
			Node: node, Addrs: []Addr{tcpAddr(fmt.Sprintf("10.0.%d.%d:7000", i%1000/250, i%1000%250))}})
	}
}

// A peer cannot take another live node's entries by any other way
// either: claiming its addresses, asking to delete them, squatting its
// actors' uuids, or saying it has the zero uid.
func TestAPeerCannotTakeAnotherNodesEntries(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	reg := freeRegistryAddr(t, "tcp")
	registrar := startNode(t, discoveryConfig("registrar", reg))
	honest := startNode(t, discoveryConfig("honest", reg))
	spawnEcho(t, honest, "svc")
	held := func(what string) {
		t.Helper()
		got := registrar.registrar.reg().find("svc")
		for _, r := range got {
			if r.Node == honest.uid && slices.Equal(r.Addrs, honest.Addrs()) {
				return
			}
		}
		t.Fatalf("%s: the registrar lists %+v under svc, without honest's entry", what, got)
	}
	held("at first")
	svc := registrar.registrar.reg().find("svc")[0]
	ctx := ctxT(t, 5*time.Second)
	cfg := testConfig()
	cfg.Name = "hostile"
	hostile := startNode(t, cfg)
	regAddr, err := ParseAddr(reg)
	if err != nil {
		t.Fatal(err)
	}
	src := regAddr
	ask := func(req regRequest) error {
		_, err := remoteRegistrar{&hostile.disc, src}.ask(ctx, req)
		return err
	}

	if err := ask(regRequest{Op: regOpRegister, Regs: toWire([]Registration{{Name: "mine", UUID: UUID{5}, Path: "/user/mine", Node: hostile.uid, Addrs: honest.Addrs()}})}); err != nil {
		t.Fatal(err)
	}
	waitChecksIdle(t, registrar.registrar.reg()) // (a claim on a live node's address is checked: it must answer as honest)
	held("after a peer claimed honest's addresses")
	for _, a := range honest.Addrs() {
		ask(regRequest{Op: regOpDeleteAddr, Node: honest.uid, Addr: a.String()})
	}
	waitChecksIdle(t, registrar.registrar.reg()) // (the registrar checks each report itself; then it holds or drops)
	held("after a peer asked to delete honest's addresses")
	ask(regRequest{Op: regOpRegister, Regs: toWire([]Registration{{Name: "svc", UUID: svc.UUID, Path: "/user/svc", Node: hostile.uid, Addrs: hostile.Addrs()}})})
	registrar.registrar.reg().dropNode(honest.uid) // (as if honest had been lost a moment)
	if err := honest.disc.reregister(regAddr); err != nil {
		t.Fatal(err)
	}
	held("after a peer registered honest's uuid and honest registered again")

	// A peer that says it is the zero uid is still a peer.
	zcfg := testConfig()
	zcfg.Name = "zero"
	zero := startNode(t, zcfg)
	zero.uid = NodeUID{}
	zctx := ctxT(t, 5*time.Second)
	_, err = remoteRegistrar{&zero.disc, src}.ask(zctx, regRequest{Op: regOpRegister, Regs: toWire([]Registration{{Name: "svc", UUID: UUID{8}, Path: "/user/svc", Node: honest.uid, Addrs: honest.Addrs()}})})
	if !errors.Is(err, ErrRegistrationRefused) {
		t.Fatalf("a zero-uid peer registering for honest: %v, want ErrRegistrationRefused", err)
	}
	remoteRegistrar{&zero.disc, src}.ask(zctx, regRequest{Op: regOpUnregister, Regs: []regWire{{Name: "svc", UUID: svc.UUID, Node: honest.uid}}})
	held("after a zero-uid peer asked to take honest's entry out")
}

// The registrar's own checks of reported addresses are bounded: one in
// flight per address, and per reporting peer a burst of checkBurst, then
// one per checkEvery, so that reports cannot make it dial at will.
func TestAddressChecksAreBounded(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	var c addrChecks
	t0 := time.Unix(1000, 0)
	peer, other := NodeUID{1}, NodeUID{2}
	addr := func(i int) Addr { return Addr{network: "tcp", address: fmt.Sprintf("127.0.0.1:%d", 7000+i)} }
	for i := range checkBurst {
		if !c.take(t0, peer, addr(i)) {
			t.Fatalf("check %d of the burst refused", i)
		}
	}
	if c.take(t0, peer, addr(99)) {
		t.Fatal("a check past the burst was allowed at once")
	}
	if c.take(t0, other, addr(0)) {
		t.Fatal("a second check of an address in flight was allowed")
	}
	if !c.take(t0, other, addr(50)) {
		t.Fatal("another peer's check was refused for the first peer's reports")
	}
	if c.take(t0.Add(checkEvery/2), peer, addr(98)) {
		t.Fatal("a check allowed before a token came back")
	}
	if !c.take(t0.Add(checkEvery), peer, addr(98)) {
		t.Fatal("no check allowed a checkEvery later")
	}
	c.done(addr(0))
	if !c.take(t0.Add(10*checkEvery), other, addr(0)) {
		t.Fatal("an address whose check ended cannot be checked again")
	}
}
