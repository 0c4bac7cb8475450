package troupe

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	neturl "net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// cutProxy forwards TCP connections to target until it is cut: then it
// closes every connection it holds and every new one at once, as a node
// cut off from etcd sees it.
type cutProxy struct {
	l      net.Listener
	target string
	mu     sync.Mutex
	down   bool
	conns  map[net.Conn]struct{}
	wg     sync.WaitGroup
}

// close stops the proxy and waits for its goroutines.
func (p *cutProxy) close() {
	p.l.Close()
	p.cut()
	p.wg.Wait()
}

func newCutProxy(t *testing.T, target string) *cutProxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{l: l, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			if p.down {
				p.mu.Unlock()
				c.Close()
				continue
			}
			up, err := net.Dial("tcp", target)
			if err != nil {
				p.mu.Unlock()
				c.Close()
				continue
			}
			p.conns[c], p.conns[up] = struct{}{}, struct{}{}
			p.mu.Unlock()
			p.wg.Go(func() { io.Copy(up, c); up.Close() })
			p.wg.Go(func() { io.Copy(c, up); c.Close() })
		}
	})
	return p
}

func (p *cutProxy) addr() string { return p.l.Addr().String() }

func (p *cutProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = true
	for c := range p.conns {
		c.Close()
	}
	clear(p.conns)
}

func (p *cutProxy) restore() {
	p.mu.Lock()
	p.down = false
	p.mu.Unlock()
}

// A node cut off from etcd for less than its lease spawns an actor and
// stops another meanwhile: Spawn returns, the registration and the
// removal stay pending (Stats, Ready), and once etcd answers again the
// registry holds exactly what the node holds.
func TestEtcdEntriesConvergeAfterAnOutage(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	slowTest(t)
	url := sharedEtcdURL(t)
	hosts, prefix, _ := strings.Cut(strings.TrimPrefix(url, "etcd://"), "/")
	first, _, _ := strings.Cut(hosts, ",")
	proxy := newCutProxy(t, first)
	cfg := failConfig("cut", 100*time.Millisecond, 6*time.Second) // a 6 s lease
	cfg.RegistryAddrs = []string{"etcd://" + proxy.addr() + "/" + prefix}
	cfg.RegistryTimeout = 3 * time.Second // (a second was too short to register beside two CPU burners)
	n := startNode(t, cfg)
	observer := etcdNode(t, "observer", url)
	t.Cleanup(proxy.close) // (before the nodes' cleanups check for leaks)
	spawnEcho(t, n, "kept")
	gone := spawnEcho(t, n, "gone")
	found := func(name string) bool {
		_, err := observer.QueryActor(ctxT(t, 5*time.Second), name)
		return err == nil
	}
	waitFor(t, 5*time.Second, "kept and gone registered", func() bool { return found("kept") && found("gone") })

	proxy.cut()
	spawnEcho(t, n, "born") // returns: its registration is pending
	if err := n.Stop(gone); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "two pending", func() bool { return n.Stats().RegistryPending == 2 })
	if err := n.Ready(); !errors.Is(err, ErrNotReady) {
		t.Fatalf("Ready while etcd lacks entries: %v", err)
	}
	proxy.restore()
	waitFor(t, 10*time.Second, "the registry to hold what the node holds", func() bool {
		return found("born") && !found("gone") && found("kept") && n.Stats().RegistryPending == 0 && n.Ready() == nil
	})
}

// leader returns the index of the cluster's leader.
func (c *etcdCluster) leader(t *testing.T) int {
	t.Helper()
	for i, m := range c.clients {
		var st struct {
			Header struct {
				MemberID string `json:"member_id"`
			}
			Leader string
		}
		resp, err := http.Post("http://"+m+"/v3/maintenance/status", "application/json", strings.NewReader("{}"))
		if err != nil {
			continue
		}
		err = json.NewDecoder(resp.Body).Decode(&st)
		resp.Body.Close()
		if err == nil && st.Leader != "" && st.Leader == st.Header.MemberID {
			return i
		}
	}
	t.Fatal("no etcd member says it leads")
	return -1
}

// With etcd's default timeouts, the leader killed while actors are
// spawned one after another and another node looks one up without pause:
// every registration reaches etcd (none is lost while Spawn returns nil),
// no lookup fails, and neither is held longer than an election takes
// (2.5 election timeouts) and a margin (#27 items 1 and 5).
func TestEtcdRegistrationsSurviveALeaderKill(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	slowTest(t)
	c := startEtcdClusterWith(t, false)
	url := c.url(t)
	n := etcdNode(t, "spawner", url)
	observer := etcdNode(t, "observer", url)
	reg, err := observer.Registry()
	if err != nil {
		t.Fatal(err)
	}
	spawnEcho(t, n, "w0")
	tm := etcdTimingFor(n.cfg.EtcdElectionTimeout)
	const margin = 1500 * time.Millisecond // a loaded machine's scheduling, and etcd's own commit after the vote
	var worstLookup time.Duration
	var lookups, failed int
	var lookupErr error
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			start := time.Now()
			regs, err := reg.Find(ctxT(t, 10*time.Second), "w0")
			worstLookup = max(worstLookup, time.Since(start))
			lookups++
			if err != nil || len(regs) != 1 {
				failed++
				lookupErr = fmt.Errorf("%d registrations, %v", len(regs), err)
			}
		}
	})
	const total = 60
	killed := make(chan time.Time, 1)
	var slowest time.Duration
	for i := 1; i < total; i++ {
		if i == 10 {
			leader := c.leader(t)
			c.cmds[leader].Process.Kill()
			killed <- time.Now()
		}
		start := time.Now()
		spawnEcho(t, n, fmt.Sprintf("w%d", i))
		slowest = max(slowest, time.Since(start))
		time.Sleep(20 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	waitFor(t, 20*time.Second, "every registration in etcd", func() bool {
		regs, err := etcdClientOf(n).reg.list(ctxT(t, 5*time.Second))
		return err == nil && len(regs) == 2*1+total && n.Stats().RegistryPending == 0
	})
	for i := range total {
		if _, err := observer.QueryActor(ctxT(t, 5*time.Second), fmt.Sprintf("w%d", i)); err != nil {
			t.Fatalf("w%d: %v", i, err)
		}
	}
	t.Logf("the slowest Spawn took %v, the slowest of %d lookups %v (election bound %v); converged %v after the kill", slowest, lookups, worstLookup, tm.election, time.Since(<-killed))
	if failed > 0 {
		t.Errorf("%d of %d lookups during the election failed, the last with %v", failed, lookups, lookupErr)
	}
	if bound := tm.election + margin; slowest > bound || worstLookup > bound {
		t.Errorf("the election held a Spawn for %v and a lookup for %v, more than %v (2.5 election timeouts and %v)", slowest, worstLookup, bound, margin)
	}
}

// Deployments whose prefixes nest ("p" and "p/canary") do not see each
// other's entries.
func TestEtcdNestedPrefixesAreIsolated(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	slowTest(t)
	url := sharedEtcdURL(t)
	outer := etcdNode(t, "outer", url)
	inner := etcdNode(t, "canary", url+"/canary")
	spawnEcho(t, outer, "svc")
	spawnEcho(t, inner, "svc")
	spawnEcho(t, inner, "only-inner")
	reg, err := outer.Registry()
	if err != nil {
		t.Fatal(err)
	}
	all, err := reg.List(ctxT(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range all {
		if r.Node != outer.UID() {
			t.Fatalf("the outer deployment lists %+v, of the inner one", r)
		}
	}
	if len(all) != 2 {
		t.Fatalf("the outer deployment lists %d entries, want its node and svc: %+v", len(all), all)
	}
	for _, name := range []string{"canary", "only-inner"} {
		if _, err := outer.QueryActor(ctxT(t, 5*time.Second), name); !errors.Is(err, ErrNotFound) {
			t.Fatalf("the outer deployment finds %q: %v", name, err)
		}
	}
	if _, err := inner.QueryActor(ctxT(t, 5*time.Second), "only-inner"); err != nil {
		t.Fatalf("the inner deployment does not find its own actor: %v", err)
	}
}

// An actor that stops before etcd has its entry does not hold Spawn for
// RegistryTimeout.
func TestSpawnOfAnActorThatStopsAtOnceReturnsAtOnce(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	slowTest(t)
	url := sharedEtcdURL(t)
	n := etcdNode(t, "spawner", url)
	start := time.Now()
	_, err := Spawn(n, "brief", Behavior[testPing]{Setup: func(c *Context[testPing]) { c.Stop() }, Receive: func(*Context[testPing], testPing) {}})
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	t.Logf("Spawn took %v", took)
	if took > n.disc.registryTimeout()/2 {
		t.Fatalf("Spawn took %v for an actor that stopped in Setup (RegistryTimeout %v)", took, n.disc.registryTimeout())
	}
	waitFor(t, 5*time.Second, "nothing pending", func() bool { return n.Stats().RegistryPending == 0 })
}

// lyingProxy passes HTTP requests to etcd; while lying, it answers 503
// after etcd did the work (an answer lost in an election).
type lyingProxy struct {
	srv   *httptest.Server
	lying atomic.Bool
}

func newLyingProxy(t *testing.T, target string) *lyingProxy {
	p := &lyingProxy{}
	rp := httputil.NewSingleHostReverseProxy(&neturl.URL{Scheme: "http", Host: target})
	p.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !p.lying.Load() {
			rp.ServeHTTP(w, r)
			return
		}
		rp.ServeHTTP(httptest.NewRecorder(), r) // done, and the answer dropped
		http.Error(w, "etcdserver: leader changed", http.StatusServiceUnavailable)
	}))
	return p
}

// A put whose answer was lost, for an actor that then stops, is deleted
// once etcd answers again: the registry does not keep a stopped actor
// until the lease ends.
func TestAnUnconfirmedPutOfAStoppedActorIsDeleted(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	slowTest(t)
	url := sharedEtcdURL(t)
	hosts, prefix, _ := strings.Cut(strings.TrimPrefix(url, "etcd://"), "/")
	first, _, _ := strings.Cut(hosts, ",")
	proxy := newLyingProxy(t, first)
	cfg := failConfig("liar", 100*time.Millisecond, 6*time.Second)
	cfg.RegistryAddrs = []string{"etcd://" + strings.TrimPrefix(proxy.srv.URL, "http://") + "/" + prefix}
	cfg.RegistryTimeout = 3 * time.Second // (a second was too short to register beside two CPU burners)
	n := startNode(t, cfg)
	observer := etcdNode(t, "observer", url)
	t.Cleanup(proxy.srv.Close)
	proxy.lying.Store(true)
	x := spawnEcho(t, n, "x") // put, and told it failed
	found := func() bool {
		_, err := observer.QueryActor(ctxT(t, 5*time.Second), "x")
		return err == nil
	}
	waitFor(t, 5*time.Second, "x in etcd", found)
	if err := n.Stop(x); err != nil {
		t.Fatal(err)
	}
	proxy.lying.Store(false)
	waitFor(t, 15*time.Second, "x gone from etcd", func() bool { return !found() && n.Stats().RegistryPending == 0 })
}

// Ten thousand named actors, and the node's lease expires (revoked behind
// its back, as etcd does when the TTL runs out): all of them come back
// under the node's new lease, in transactions of up to 128 puts, and the
// registry then holds the whole set and keeps holding it (#27 item 3: put
// one at a time, a thousand swung between 459 and 1,001 and never held
// whole on one live lease).
func TestEtcdTenThousandActorsComeBackWholeAfterALeaseExpiry(t *testing.T) {
	longRun(t)
	if testing.Short() {
		t.Skip("10,000 actors")
	}
	url := sharedEtcdURL(t)
	cfg := failConfig("many", 100*time.Millisecond, 2*time.Second) // a 2 s lease
	cfg.RegistryAddrs = []string{url}
	n := startNode(t, cfg)
	const total = 10000
	var wg sync.WaitGroup
	errs := make(chan error, 1)
	for g := range 128 {
		wg.Go(func() {
			for i := g; i < total; i += 128 {
				if _, err := Spawn(n, fmt.Sprintf("w%05d", i), Behavior[testPing]{Receive: func(*Context[testPing], testPing) {}}); err != nil {
					select {
					case errs <- err:
					default:
					}
					return
				}
			}
		})
	}
	wg.Wait()
	select {
	case err := <-errs:
		t.Fatalf("Spawn: %v", err)
	default:
	}
	var listErr error
	count := func() int {
		regs, err := etcdClientOf(n).reg.list(ctxT(t, 10*time.Second))
		if err != nil {
			listErr = err
			return -1
		}
		return len(regs)
	}
	waitFor(t, 30*time.Second, "all 10,000 entries in etcd", func() bool {
		return count() == total+1 && n.Stats().RegistryPending == 0
	})
	old := etcdClientOf(n).reg.currentLease()
	lost := time.Now()
	if err := etcdClientOf(n).reg.revoke(ctxT(t, 10*time.Second), old); err != nil {
		t.Fatal(err)
	}
	ttl := etcdClientOf(n).etcdTTL()
	waitFor(t, 3*ttl+10*time.Second, "all 10,000 entries back", func() bool {
		return count() == total+1 && etcdClientOf(n).reg.currentLease() != old && n.Stats().RegistryPending == 0
	})
	back := time.Since(lost)
	// Whole, and staying whole for two TTLs: the new lease is kept alive.
	until := time.Now().Add(2 * ttl)
	for time.Now().Before(until) {
		if c := count(); c != total+1 {
			t.Fatalf("%d entries of %d, %v after they had all come back (list: %v)", c, total+1, time.Since(lost)-back, listErr)
		}
		time.Sleep(ttl / 8) // (sampling what etcd holds: nothing to wait on)
	}
	t.Logf("10,000 entries back %v after the lease ended (ttl %v)", back.Round(time.Millisecond), ttl)
}

// A member that answers at once but takes longer than one attempt's bound
// to send the whole answer (a large range on a slow machine) is read to
// the end: the bound is on the answer coming, not on reading it. (CI saw
// a list of 10,001 entries fail this way under the race detector.)
func TestASlowAnswerOfEtcdIsReadWhole(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	slowTest(t)
	url := sharedEtcdURL(t)
	hosts, prefix, _ := strings.Cut(strings.TrimPrefix(url, "etcd://"), "/")
	first, _, _ := strings.Cut(hosts, ",")
	rp := httputil.NewSingleHostReverseProxy(&neturl.URL{Scheme: "http", Host: first})
	var slow atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !slow.Load() || r.URL.Path != "/v3/kv/range" {
			rp.ServeHTTP(w, r)
			return
		}
		rec := httptest.NewRecorder()
		rp.ServeHTTP(rec, r)
		body := rec.Body.Bytes()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(rec.Code)
		w.Write(body[:len(body)/2])
		w.(http.Flusher).Flush()
		time.Sleep(3 * defaultEtcdElectionTimeout / 2) // (the slow part of the answer)
		w.Write(body[len(body)/2:])
	}))
	t.Cleanup(srv.Close)
	cfg := failConfig("slowread", 100*time.Millisecond, 6*time.Second)
	cfg.RegistryAddrs = []string{"etcd://" + strings.TrimPrefix(srv.URL, "http://") + "/" + prefix}
	n := startNode(t, cfg)
	spawnEcho(t, n, "slowly")
	slow.Store(true)
	reg, err := n.Registry()
	if err != nil {
		t.Fatal(err)
	}
	regs, err := reg.List(ctxT(t, 10*time.Second))
	if err != nil {
		t.Fatalf("List through a member slower to answer whole than one attempt: %v", err)
	}
	if !slices.ContainsFunc(regs, func(r Registration) bool { return r.Name == "slowly" }) {
		t.Fatalf("List: %d entries, without slowly", len(regs))
	}
}

// While every etcd member refuses connections (the whole cluster down),
// Spawn of a named actor returns at once, not after RegistryTimeout: no
// election is under way, so no answer is near. The entry stays pending
// (Stats, Ready) and is written when etcd answers.
func TestSpawnDoesNotWaitForAnEtcdThatRefusesEverywhere(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	slowTest(t)
	url := sharedEtcdURL(t)
	hosts, prefix, _ := strings.Cut(strings.TrimPrefix(url, "etcd://"), "/")
	var proxies []string
	var listeners []*cutProxy
	for h := range strings.SplitSeq(hosts, ",") {
		p := newCutProxy(t, h)
		t.Cleanup(p.close)
		listeners = append(listeners, p)
		proxies = append(proxies, p.addr())
	}
	cfg := testConfig()
	cfg.Name = "etcd-down"
	cfg.RegistryTimeout = 5 * time.Second // the default
	cfg.RegistryAddrs = []string{"etcd://" + strings.Join(proxies, ",") + "/" + prefix}
	n := startNode(t, cfg)
	spawnEcho(t, n, "before")
	for _, p := range listeners {
		p.l.Close() // nothing listens there now: connections are refused
		p.cut()
	}
	const actors = 5
	start := time.Now()
	for i := range actors {
		spawnEcho(t, n, fmt.Sprintf("echo-%d", i))
	}
	if took := time.Since(start); took > cfg.RegistryTimeout {
		t.Fatalf("%d Spawns took %v while every etcd member refused (RegistryTimeout %v)", actors, took, cfg.RegistryTimeout)
	}
	waitFor(t, 5*time.Second, "the registrations pending", func() bool { return n.Stats().RegistryPending >= actors })
	if err := n.Ready(); !errors.Is(err, ErrNotReady) {
		t.Fatalf("Ready while etcd lacks entries: %v", err)
	}
}
