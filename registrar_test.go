package troupe

import (
	"context"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestRegistrationOnAnAddressEvictsTheOldIdentity(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	g := newRegTable()
	addr := tcpAddr("127.0.0.1:7001")
	old := NodeUID{1}
	g.register(Registration{Name: "svc", UUID: UUID{1}, Path: "/user/svc", Node: old, Addrs: []Addr{addr, unixAddr("/run/old.sock")}})
	g.register(Registration{Name: "other", UUID: UUID{2}, Path: "/user/other", Node: old, Addrs: []Addr{addr}})
	g.register(Registration{Name: "svc", UUID: UUID{3}, Path: "/user/svc", Node: NodeUID{2}, Addrs: []Addr{addr}})
	got := g.find("svc")
	if len(got) != 2 || got[0].Node != (NodeUID{2}) {
		t.Fatalf("find(svc) = %+v", got)
	}
	if len(got[1].Addrs) != 1 || got[1].Addrs[0] != unixAddr("/run/old.sock") {
		t.Fatalf("the old incarnation kept %v, want only its other address", got[1].Addrs)
	}
	if len(g.find("other")) != 0 {
		t.Fatal("an entry whose only address was taken over is still there")
	}
}

func TestRegistrarServesTCPAndUnixAtOnce(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	tcp, uds := freeRegistryAddr(t, "tcp"), freeRegistryAddr(t, "unix")
	cfg := testConfig()
	cfg.Name, cfg.RegistryAddrs = "registrar", []string{tcp, uds}
	registrar := startNode(t, cfg)
	if len(registrar.Addrs()) != 2 {
		t.Fatalf("registrar bound %v, want both", registrar.Addrs())
	}
	overUnix := startNode(t, discoveryConfig("over-unix", uds))
	overTCP := startNode(t, discoveryConfig("over-tcp", tcp))
	spawnEcho(t, overUnix, "u")
	spawnEcho(t, overTCP, "t")
	ctx := ctxT(t, 5*time.Second)
	if _, err := FindActor[testPing](ctx, overTCP, "u"); err != nil {
		t.Fatalf("tcp client finding a unix-registered actor: %v", err)
	}
	if _, err := FindActor[testPing](ctx, overUnix, "t"); err != nil {
		t.Fatalf("unix client finding a tcp-registered actor: %v", err)
	}
}

func TestFindActorAllHasOneEntryPerRegistrar(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	regA, regB := freeRegistryAddr(t, "tcp"), freeRegistryAddr(t, "tcp")
	a := startNode(t, discoveryConfig("a", regA))
	b := startNode(t, discoveryConfig("b", regB))
	spawnEcho(t, b, "svc") // registered only with b's registrar
	client := startNode(t, testConfig())
	ctx := ctxT(t, 5*time.Second)
	opts := WithRegistries(a.Addrs()[0].String(), b.Addrs()[0].String())
	all, err := FindActorPerRegistrar[testPing](ctx, client, "svc", opts)
	if err != nil || len(all) != 2 || !all[0].IsZero() || all[1].IsZero() {
		t.Fatalf("FindActorPerRegistrar = %v, %v; want a hole then a ref", all, err)
	}
	if all, err := FindActorPerRegistrar[testPing](ctx, client, "ghost", opts); all != nil || err != nil {
		t.Fatalf("FindActorPerRegistrar of a missing name = %v, %v; want nil, nil", all, err)
	}
	// First match in configured order, even though a answers first.
	r, err := FindActor[testPing](ctx, client, "svc", opts)
	if err != nil || r.NodeUID() != b.UID() {
		t.Fatalf("FindActor = %v, %v", r, err)
	}
}

func TestReRegistersAfterReassociation(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	f := new(FaultNet)
	reg := freeRegistryAddr(t, "tcp")
	cfgR := failConfig("registrar", 20*time.Millisecond, time.Second)
	cfgR.RegistryAddrs = []string{reg}
	registrar := startOn(t, f, cfgR)
	cfgS := failConfig("service", 20*time.Millisecond, time.Second)
	cfgS.RegistryAddrs = []string{reg}
	service := startOn(t, f, cfgS)
	spawnEcho(t, service, "svc")
	lost := make(chan PeerUnreachable, 1)
	SubscribeChan(service, lost)
	f.Partition(registrar, service)
	waitFor(t, 5*time.Second, "the registrar to drop the unreachable service", func() bool { return len(registrar.registrar.reg().find("svc")) == 0 })
	recv(t, lost, "the service gives up on the registrar")
	// The registrar may drop the entry on the link's loss, before its
	// own verdict: clear its quarantine once there is one.
	waitFor(t, 5*time.Second, "the registrar to quarantine the service", func() bool { return registrar.peers.isQuarantined(service.UID()) })
	f.Heal()
	if ok, err := registrar.ClearQuarantine(ctxT(t, 5*time.Second), service.UID().String()); !ok || err != nil {
		t.Fatalf("the registrar's ClearQuarantine of the service: %v, %v", ok, err)
	}
	if _, err := service.ClearQuarantine(ctxT(t, 5*time.Second), registrar.Addrs()[0].String(), Reconnect()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "the service to register again", func() bool { return len(registrar.registrar.reg().find("svc")) == 1 })
}

func TestRuntimeDirIsPrivate(t *testing.T) {
	// Not beside other tests: it sets environment variables (t.Setenv),
	// which belong to the whole process.
	base := t.TempDir()
	t.Setenv("XDG_RUNTIME_DIR", base)
	dir, err := RuntimeDir()
	if err != nil || dir != filepath.Join(base, "troupe") {
		t.Fatalf("RuntimeDir = %q, %v", dir, err)
	}
	if fi, _ := os.Stat(dir); fi.Mode().Perm() != 0o700 {
		t.Fatalf("mode %v, want 0700", fi.Mode().Perm())
	}
	os.RemoveAll(dir)
	os.Symlink(t.TempDir(), dir)
	if _, err := RuntimeDir(); err == nil || !strings.Contains(err.Error(), "not a plain directory") {
		t.Fatalf("RuntimeDir with a symlink = %v", err)
	}
	if os.Getuid() == 0 {
		os.Remove(dir)
		os.Mkdir(dir, 0o700)
		os.Chown(dir, 65534, 65534)
		if _, err := RuntimeDir(); err == nil || !strings.Contains(err.Error(), "belongs to uid 65534") {
			t.Fatalf("RuntimeDir owned by another user = %v", err)
		}
	}
	// A node listening only on unix sockets uses the runtime dir's registry.
	os.RemoveAll(dir)
	cfg := Config{Listen: []string{"unix://" + shortSocket(t)}, Discovery: true}
	addrs, err := cfg.registryAddrs()
	if err != nil || len(addrs) != 1 || addrs[0] != unixAddr(filepath.Join(base, "troupe", "registry@1616.sock")) {
		t.Fatalf("default unix registry = %v, %v", addrs, err)
	}
	if addrs, _ := (Config{Discovery: true}).registryAddrs(); addrs[0] != tcpAddr("127.0.0.1:1616") {
		t.Fatalf("default registry = %v", addrs)
	}
}

// TestHelperJoinProcess is not a test: TestJoiningFromAnotherProcess runs
// it in a child process, which joins the registrar at
// $TROUPE_HELPER_JOIN, finds "svc" and asks it.
func TestHelperJoinProcess(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	reg := os.Getenv("TROUPE_HELPER_JOIN")
	if reg == "" {
		t.Skip("helper for TestJoiningFromAnotherProcess")
	}
	n, err := Start(ctxT(t, 5*time.Second), discoveryConfig("outsider", reg))
	if err != nil {
		fmt.Println("ERR", err)
		return
	}
	defer n.Close()
	r, err := FindActor[testPing](ctxT(t, 5*time.Second), n, "svc")
	if err != nil {
		fmt.Println("ERR find", err)
		return
	}
	p, err := Ask(ctxT(t, 5*time.Second), r, func(rr Ref[testPong]) testPing { return testPing{N: 5, ReplyTo: rr} })
	fmt.Println("ANSWER", p.N, p.From, err)
}

func TestJoiningFromAnotherProcess(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	reg := freeRegistryAddr(t, "tcp")
	startNode(t, discoveryConfig("registrar", reg))
	service := startNode(t, discoveryConfig("service", reg))
	spawnEcho(t, service, "svc")
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, exe, "-test.run=^TestHelperJoinProcess$")
	cmd.Env = append(os.Environ(), "TROUPE_HELPER_JOIN="+reg)
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "ANSWER 5 service <nil>") {
		t.Fatalf("the outside process said (%v):\n%s", err, out)
	}
}

func TestAnyNodeCanServeARegistry(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	cfg := testConfig("tcp://127.0.0.1:0")
	cfg.Name, cfg.ServeRegistry = "side-registrar", true
	side := startNode(t, cfg)
	if !side.registrar.isRegistrar() {
		t.Fatal("ServeRegistry did not make the node a registrar")
	}
	worker := startNode(t, discoveryConfig("worker", side.Addrs()[0].String()))
	spawnEcho(t, worker, "job")
	client := startNode(t, testConfig())
	if _, err := FindActor[testPing](ctxT(t, 5*time.Second), client, "job", WithRegistries(side.Addrs()[0].String())); err != nil {
		t.Fatalf("FindActor via a node serving a registry: %v", err)
	}
}

func TestRegistrarDropsNodesThatLeave(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	reg := freeRegistryAddr(t, "tcp")
	registrar := startNode(t, discoveryConfig("registrar", reg))
	service := startNode(t, discoveryConfig("service", reg))
	spawnEcho(t, service, "svc")
	if len(registrar.registrar.reg().find("svc")) != 1 {
		t.Fatal("svc not registered")
	}
	service.Close()
	waitFor(t, 5*time.Second, "the service's registrations to go", func() bool {
		return len(registrar.registrar.reg().find("svc")) == 0 && len(registrar.registrar.reg().find("service")) == 0
	})
}

func TestActorStopUnregisters(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	reg := freeRegistryAddr(t, "tcp")
	registrar := startNode(t, discoveryConfig("registrar", reg))
	service := startNode(t, discoveryConfig("service", reg))
	r := spawnEcho(t, service, "svc")
	service.Stop(r)
	waitFor(t, 5*time.Second, "svc to be unregistered", func() bool { return len(registrar.registrar.reg().find("svc")) == 0 })
}

// A registrar takes at most maxRegistrySubscribers Registry.Watch
// subscribers; one more is refused, and one that goes makes room.
func TestRegistrySubscribersAreBounded(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	g := newRegTable()
	hs := make([]*handle, maxRegistrySubscribers+1)
	for i := range hs {
		hs[i] = &handle{key: refKey{path: fmt.Sprintf("/system/w%d", i)}}
	}
	for _, h := range hs[:maxRegistrySubscribers] {
		if !g.subscribe(h, 1) {
			t.Fatal("a subscriber under the bound was refused")
		}
	}
	// The same ref again (a new handle, as each message that carries a
	// ref makes one) subscribes again: it takes no second place.
	again := &handle{key: hs[0].key}
	if !g.subscribe(again, 2) || len(g.subs) != maxRegistrySubscribers {
		t.Fatalf("a subscriber that subscribed again: %d subscribers", len(g.subs))
	}
	if g.subscribe(hs[maxRegistrySubscribers], 1) {
		t.Fatal("one subscriber past the bound was taken")
	}
	g.unsubscribe(hs[0].key)
	if !g.subscribe(hs[maxRegistrySubscribers], 1) {
		t.Fatal("a subscriber was refused after another went")
	}
}

// A table larger than one piece goes as several snapshot events, all
// but the last marked More, numbered in order.
func TestARegistrySnapshotGoesInPieces(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	g := newRegTable()
	for i := range 2*snapshotPiece + 5 {
		g.register(Registration{Name: fmt.Sprintf("a%d", i), UUID: UUID{byte(i), byte(i >> 8)}, Node: NodeUID{1}, Addrs: []Addr{tcpAddr("127.0.0.1:1")}})
	}
	h := &handle{key: refKey{path: "/system/w"}}
	g.subscribe(h, 7)
	if len(g.pending) != 3 {
		t.Fatalf("%d snapshot events, want 3", len(g.pending))
	}
	total := 0
	for i, p := range g.pending {
		ev := p.ev
		if ev.Gen != 7 || ev.Seq != uint64(i+1) || !ev.Snapshot || ev.More != (i < 2) {
			t.Fatalf("event %d: %+v", i, ev)
		}
		total += len(ev.Added)
	}
	if total != 2*snapshotPiece+5 {
		t.Fatalf("the pieces hold %d registrations", total)
	}
}

// Without subscribers, a registration allocates nothing for them.
func TestRegisteringWithoutSubscribersCostsNothingMore(t *testing.T) {
	// Not beside other tests: it measures the process's heap, goroutines or
	// allocations, which tests running beside it would change.
	g := newRegTable()
	r := Registration{Name: "a", UUID: UUID{1}, Node: NodeUID{1}, Addrs: []Addr{tcpAddr("127.0.0.1:1")}}
	g.register(r) // (the entry exists: a refresh)
	allocs := testing.AllocsPerRun(100, func() { g.register(r) })
	if allocs > 2 { // the entry and its addresses' copy
		t.Fatalf("a refresh without subscribers allocates %v times", allocs)
	}
}

// A lost event (a gap in the numbers) makes the watcher subscribe again:
// exactly one more snapshot, whatever else was in flight, and the table
// it rebuilt is the registrar's.
func TestAWatchRecoversFromALostEvent(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	reg := freeRegistryAddr(t, "tcp")
	n := startNode(t, discoveryConfig("registrar", reg))
	r, err := n.Registry()
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	table := map[regKey]bool{}
	snapshots := 0
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ended := make(chan error, 1)
	go func() {
		ended <- r.Watch(ctx, func(c RegistryChange) {
			mu.Lock()
			defer mu.Unlock()
			if c.Snapshot {
				snapshots++
				clear(table)
			}
			for _, x := range c.Removed {
				delete(table, keyOf(&x))
			}
			for _, x := range c.Added {
				table[keyOf(&x)] = true
			}
		})
	}()
	waitFor(t, 5*time.Second, "the snapshot", func() bool { mu.Lock(); defer mu.Unlock(); return snapshots == 1 })
	// Lose one event: the registrar numbers it, and nobody gets it.
	g := n.registrar.reg()
	g.mu.Lock()
	for _, s := range g.subs {
		s.seq++
	}
	g.mu.Unlock()
	for i := range 5 {
		spawnEcho(t, n, fmt.Sprintf("svc%d", i))
	}
	want := func() map[regKey]bool {
		m := map[regKey]bool{}
		for _, x := range g.list() {
			m[keyOf(&x)] = true
		}
		return m
	}
	waitFor(t, 5*time.Second, "the rebuilt table", func() bool { mu.Lock(); defer mu.Unlock(); return maps.Equal(table, want()) })
	mu.Lock()
	defer mu.Unlock()
	if snapshots != 2 {
		t.Fatalf("%d snapshots after one lost event, want 2", snapshots)
	}
	if len(g.subs) != 1 {
		t.Fatalf("%d subscriptions after subscribing again, want 1", len(g.subs))
	}
}
