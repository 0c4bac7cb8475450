package troupe

import (
	"context"
	"crypto/ecdsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// etcdClientOf is n's etcd client, for tests that look inside it.
func etcdClientOf(n *Node) *etcdClient { return n.disc.store.impl.(*etcdClient) }

// etcdCluster is a three-member etcd on loopback that a test owns, so that
// it may kill a member.
type etcdCluster struct {
	clients []string // host:port of each member's client URL
	cmds    []*exec.Cmd
}

// freePort returns a loopback port nothing listens on right now, for a
// listener the test starts later (an etcd process, a registry address).
// Tests run side by side: a port from the kernel's ephemeral range, closed
// and bound again later, may meanwhile become another test's source port
// or another test's "free" port. So the ports come from below that range
// (where no outbound connection takes its source port), and the process
// never hands the same one out twice.
func freePort(t testing.TB) int {
	t.Helper()
	for range 1000 {
		p := int(lowPorts.next.Add(1))%lowPortSpan + lowPortBase
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			continue // (another process has it)
		}
		l.Close()
		return p
	}
	t.Fatal("no free port below the ephemeral range")
	return 0
}

// The ports freePort hands out: 10000-19999, below Linux's ephemeral
// range (32768 up) and clear of the etcd that .ci/run starts (2379x).
const lowPortBase, lowPortSpan = 10000, 10000

var lowPorts struct{ next atomic.Int64 }

func init() { lowPorts.next.Store(int64(os.Getpid()*7919) % lowPortSpan) }

// startEtcdCluster starts a three-member etcd cluster, or skips the test
// when there is no etcd binary (apt-get install etcd-server).
func startEtcdCluster(t testing.TB) *etcdCluster { return startEtcdClusterWith(t, true) }

// startEtcdClusterWith starts a three-member etcd cluster, with fast
// elections (50 ms heartbeats, 500 ms election timeout) or etcd's
// defaults (100 ms, 1 s).
func startEtcdClusterWith(t testing.TB, fast bool) *etcdCluster {
	t.Helper()
	if _, err := exec.LookPath("etcd"); err != nil {
		t.Skip("no etcd binary (apt-get install etcd-server; .ci/run installs it)")
	}
	c := &etcdCluster{}
	var peers []string
	var peerURLs []string
	for i := range 3 {
		c.clients = append(c.clients, fmt.Sprintf("127.0.0.1:%d", freePort(t)))
		p := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
		peerURLs = append(peerURLs, p)
		peers = append(peers, fmt.Sprintf("m%d=%s", i, p))
	}
	for i := range 3 {
		args := []string{"--name", fmt.Sprintf("m%d", i), "--data-dir", t.TempDir(),
			"--listen-client-urls", "http://" + c.clients[i], "--advertise-client-urls", "http://" + c.clients[i],
			"--listen-peer-urls", peerURLs[i], "--initial-advertise-peer-urls", peerURLs[i],
			"--initial-cluster", strings.Join(peers, ","), "--initial-cluster-state", "new"}
		if fast {
			args = append(args, "--heartbeat-interval", "50", "--election-timeout", "500")
		}
		cmd := exec.Command("etcd", args...)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		c.cmds = append(c.cmds, cmd)
	}
	t.Cleanup(func() {
		for _, cmd := range c.cmds {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	// Ready when every member answers and the cluster has a leader.
	deadline := time.Now().Add(30 * time.Second)
	for i := range 3 {
		for {
			resp, err := http.Get("http://" + c.clients[i] + "/health")
			if err == nil {
				ok := resp.StatusCode == http.StatusOK
				resp.Body.Close()
				if ok {
					break
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("etcd member %d not healthy after 30 s: %v", i, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return c
}

// url is the registry address of the cluster under a fresh prefix.
func (c *etcdCluster) url(t testing.TB) string {
	return "etcd://" + strings.Join(c.clients, ",") + "/" + strings.ReplaceAll(freshKey(), "/", "-")
}

// etcdNode starts a node that uses the etcd registry at url.
func etcdNode(t *testing.T, name, url string) *Node {
	t.Helper()
	cfg := failConfig(name, 100*time.Millisecond, time.Second)
	cfg.RegistryAddrs = []string{url}
	return startNode(t, cfg)
}

// sharedEtcdURL is an etcd registry under a fresh prefix: in the
// three-member cluster .ci/run starts (TROUPE_ETCD_CLUSTER), else in one
// the test starts.
func sharedEtcdURL(t testing.TB) string {
	if cl := os.Getenv("TROUPE_ETCD_CLUSTER"); cl != "" {
		first, _, _ := strings.Cut(cl, ",")
		if resp, err := (&http.Client{Timeout: time.Second}).Get("http://" + first + "/health"); err == nil {
			resp.Body.Close()
			return "etcd://" + cl + "/" + strings.ReplaceAll(freshKey(), "/", "-")
		}
	}
	return startEtcdCluster(t).url(t)
}

func TestEtcdRegistry(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	slowTest(t)
	url := sharedEtcdURL(t)
	a, b := etcdNode(t, "alpha", url), etcdNode(t, "beta", url)
	ctx := ctxT(t, 20*time.Second)

	// WaitForActor is parked before anything is registered under the name.
	waited := make(chan Ref[testPing], 1)
	waitErr := make(chan error, 1)
	go func() {
		r, err := WaitForActor[testPing](ctx, b, "echo")
		waitErr <- err
		waited <- r
	}()
	spawnEcho(t, a, "echo") // registered before Spawn returns
	if err := <-waitErr; err != nil {
		t.Fatalf("WaitForActor: %v", err)
	}
	if r := <-waited; r.NodeUID() != a.UID() {
		t.Fatalf("WaitForActor found %v on %v, want alpha", r, r.NodeUID())
	}

	r, err := FindActor[testPing](ctx, b, "echo")
	if err != nil || r.NodeUID() != a.UID() {
		t.Fatalf("FindActor = %v, %v", r, err)
	}
	roundTripRef(t, b, r)
	q, err := b.QueryActor(ctx, "echo")
	if err != nil || q.Node != a.UID() || q.Addrs[0] != a.Addrs()[0] {
		t.Fatalf("QueryActor = %+v, %v", q, err)
	}

	// A duplicate name on another node: both are listed, newest first,
	// and FindActorPerRegistrar gives one ref per registry, as with registrars.
	spawnEcho(t, b, "echo")
	all, err := FindActorPerRegistrar[testPing](ctx, a, "echo")
	if err != nil || len(all) != 1 {
		t.Fatalf("FindActorPerRegistrar = %d refs, %v; want 1 (one registry)", len(all), err)
	}
	reg, err := a.Registry(WithRegistries(url))
	if err != nil {
		t.Fatal(err)
	}
	if regs, err := reg.Find(ctx, "echo"); err != nil || len(regs) != 2 || regs[0].Node != b.UID() || regs[0].Seq <= regs[1].Seq {
		t.Fatalf("Find = %+v, %v; want beta's echo, then alpha's", regs, err)
	}
	list, err := reg.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]int{}
	for _, r := range list {
		names[r.Name]++
	}
	if names["echo"] != 2 || names["alpha"] != 1 || names["beta"] != 1 {
		t.Fatalf("List = %v", names)
	}

	// A key under the prefix that is not a registration is ignored.
	junk := map[string]any{"key": b64(etcdClientOf(a).reg.prefix + "echo/not-a-uuid"), "value": b64("{not json")}
	if err := etcdClientOf(a).reg.call(ctx, "/v3/kv/put", junk, &struct{}{}); err != nil {
		t.Fatal(err)
	}
	if regs, err := reg.Find(ctx, "echo"); err != nil || len(regs) != 2 {
		t.Fatalf("Find with a junk key = %+v, %v", regs, err)
	}

	// A stopped actor is unregistered; a node that shuts down takes its
	// entries with it.
	if err := b.Stop(mustFind(t, b, "echo")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "beta's echo to leave the registry", func() bool {
		regs, err := reg.Find(ctx, "echo")
		return err == nil && len(regs) == 1 && regs[0].Node == a.UID()
	})
	if err := a.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := reg.Find(ctx, "echo"); !errors.Is(err, ErrNodeClosed) {
		t.Fatalf("a lookup on a closed node: %v, want ErrNodeClosed", err)
	}
	reg, err = b.Registry()
	if err != nil {
		t.Fatal(err)
	}
	regs, err := reg.Find(ctx, "alpha")
	if err != nil || len(regs) != 0 {
		t.Fatalf("alpha after its Shutdown: %v, %v", regs, err)
	}
	// So does one that closes (Close revokes its lease too).
	other := etcdNode(t, "gamma", url)
	if err := other.Close(); err != nil {
		t.Fatal(err)
	}
	if regs, err := reg.Find(ctx, "gamma"); err != nil || len(regs) != 0 {
		t.Fatalf("gamma after its Close: %v, %v", regs, err)
	}
}

// mustFind returns the local ref of n's actor called name.
func mustFind(t *testing.T, n *Node, name string) AnyRef {
	t.Helper()
	h := n.actors.get("/user/"+name, UUID{})
	if h == nil {
		t.Fatalf("no local actor %q", name)
	}
	return Ref[testPing]{h: h}
}

// roundTripRef asks the echo actor r once.
func roundTripRef(t *testing.T, n *Node, r Ref[testPing]) {
	t.Helper()
	if _, err := Ask(ctxT(t, 5*time.Second), r, func(reply Ref[testPong]) testPing { return testPing{N: 1, ReplyTo: reply} }); err != nil {
		t.Fatalf("ask %v: %v", r, err)
	}
}

// TestEtcdRegistryFailover kills the etcd member a node asks first while
// lookups stream: every lookup still succeeds, none taking longer than the
// client's failover bound (one attempt per member).
func TestEtcdRegistryFailover(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	slowTest(t)
	c := startEtcdCluster(t)
	url := c.url(t)
	a := etcdNode(t, "alpha", url)
	// Beta names the same members one entry each, as RegistryAddrs also
	// allows.
	prefix := url[strings.LastIndex(url, "/"):]
	cfg := failConfig("beta", 100*time.Millisecond, time.Second)
	for _, m := range c.clients {
		cfg.RegistryAddrs = append(cfg.RegistryAddrs, "etcd://"+m+prefix)
	}
	b := startNode(t, cfg)
	spawnEcho(t, a, "echo")
	tm := etcdTimingFor(0)
	bound := time.Duration(len(c.clients))*tm.attempt + tm.window + time.Second

	var wg sync.WaitGroup
	stop := make(chan struct{})
	errs := make(chan error, 1)
	var worst time.Duration
	var lookups int
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			start := time.Now()
			_, err := b.QueryActor(ctxT(t, 10*time.Second), "echo")
			took := time.Since(start)
			worst = max(worst, took)
			lookups++
			if err != nil {
				select {
				case errs <- fmt.Errorf("lookup %d after %v: %v", lookups, took, err):
				default:
				}
				return
			}
		}
	})
	time.Sleep(300 * time.Millisecond)
	c.cmds[0].Process.Kill() // the member every client tries first
	time.Sleep(3 * time.Second)
	// A wait parked after the kill is still answered, through a live member.
	done := make(chan error, 1)
	go func() {
		_, err := WaitForActor[testPing](ctxT(t, 10*time.Second), b, "late")
		done <- err
	}()
	spawnEcho(t, a, "late")
	if err := <-done; err != nil {
		t.Fatalf("WaitForActor after the kill: %v", err)
	}
	close(stop)
	wg.Wait()
	select {
	case err := <-errs:
		t.Fatal(err)
	default:
	}
	if worst > bound {
		t.Fatalf("a lookup took %v, beyond the failover bound %v", worst, bound)
	}
	t.Logf("%d lookups, the slowest %v (bound %v)", lookups, worst, bound)
}

// TestEtcdRegistryLeaseExpires cuts a node's keep-alive off (as a killed
// process or a lost network would): its entries are gone within the
// lease's time to live, and they come back when it reaches etcd again.
func TestEtcdRegistryLeaseExpires(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	slowTest(t)
	c := startEtcdCluster(t)
	url := c.url(t)
	a, b := etcdNode(t, "alpha", url), etcdNode(t, "beta", url)
	spawnEcho(t, a, "echo")
	reg, err := b.Registry()
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, 30*time.Second)
	// Revoking the lease behind alpha's back is what etcd does when the
	// TTL runs out with no keep-alive: the entries go at once.
	lost := time.Now()
	if err := etcdClientOf(a).reg.revoke(ctx, etcdClientOf(a).reg.currentLease()); err != nil {
		t.Fatal(err)
	}
	regs, err := reg.Find(ctx, "echo")
	if err != nil || len(regs) != 0 {
		t.Fatalf("after the lease ended: %v, %v", regs, err)
	}
	// Alpha's keeper finds its lease gone and registers everything again.
	waitFor(t, 3*etcdClientOf(a).etcdTTL(), "alpha's entries to come back", func() bool {
		regs, err := reg.Find(ctx, "echo")
		return err == nil && len(regs) == 1 && regs[0].Node == a.UID()
	})
	t.Logf("registered again %v after the lease ended (ttl %v)", time.Since(lost).Round(time.Millisecond), etcdClientOf(a).etcdTTL())
}

func TestEtcdRegistryBadConfig(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	for _, addrs := range [][]string{
		{"etcd://"},
		{"etcd://127.0.0.1:2379/a", "tcp://127.0.0.1:1616"},
		{"etcd://127.0.0.1:2379/a", "etcd://127.0.0.1:2380/b"},
		{"etcd://127.0.0.1:2379/a", "etcds://127.0.0.1:2380/a"},
		{"etcd://no-port/a"},
	} {
		_, err := Start(context.Background(), Config{RegistryAddrs: addrs, Logger: quietLogger()})
		if !errors.Is(err, ErrBadConfig) {
			t.Errorf("%q: %v, want ErrBadConfig", addrs, err)
		}
	}
}

// TestEtcdRegistryClusterSeeds starts three members at once that find
// their seeds through etcd: etcd's order of registration decides who
// founds the cluster, and all three end up in it.
func TestEtcdRegistryClusterSeeds(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	url := sharedEtcdURL(t)
	f := new(FaultNet)
	var nodes []*Node
	for i := range 3 {
		cfg := failConfig(fmt.Sprintf("e%d", i), 20*time.Millisecond, 2*time.Second)
		cfg.RegistryAddrs = []string{url}
		nodes = append(nodes, startOn(t, f, cfg))
	}
	startFromRegistry(t, f, nodes).waitUp(3)
}

// BenchmarkRegistryBackends compares the built-in registrar (another
// node, loopback TCP) with etcd (three members on loopback) for a lookup
// (QueryActor from a third node) and a registration (Spawn of a named
// actor, which returns once the registry has it). Names vary with i.
func BenchmarkRegistryBackends(b *testing.B) {
	var etcdBase string // one cluster for every run: starting one takes seconds
	if _, err := exec.LookPath("etcd"); err == nil || os.Getenv("TROUPE_ETCD_CLUSTER") != "" {
		etcdBase = sharedEtcdURL(b)
	}
	backends := []struct {
		name string
		addr func(b *testing.B) string
	}{
		{"registrar", func(b *testing.B) string {
			reg := freeRegistryAddr(b, "tcp")
			startNode(b, discoveryConfig("registrar", reg))
			return reg
		}},
		{"etcd", func(b *testing.B) string {
			if etcdBase == "" {
				b.Skip("no etcd")
			}
			return etcdBase + fmt.Sprintf("-%d", time.Now().UnixNano())
		}},
	}
	for _, be := range backends {
		b.Run(be.name+"/lookup", func(b *testing.B) {
			reg := be.addr(b)
			service := startNode(b, discoveryConfig("service", reg))
			for i := range 64 {
				spawnEcho(b, service, fmt.Sprintf("svc-%d", i))
			}
			client := startNode(b, discoveryConfig("client", reg))
			ctx := context.Background()
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				if _, err := client.QueryActor(ctx, fmt.Sprintf("svc-%d", i%64)); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(be.name+"/register", func(b *testing.B) {
			reg := be.addr(b)
			service := startNode(b, discoveryConfig("service", reg))
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				if _, err := Spawn(service, fmt.Sprintf("worker-%d", i), Behavior[int]{Receive: func(*Context[int], int) {}}); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
		})
	}
}

// TestEtcdRegistryOverTLS runs etcd with client-certificate authentication:
// a node with Config.RegistryTLS registers and looks up through etcds://,
// one without a client certificate is refused at Start.
func TestEtcdRegistryOverTLS(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	if _, err := exec.LookPath("etcd"); err != nil {
		t.Skip("no etcd binary (apt-get install etcd-server)")
	}
	pki := newTestPKI(t)
	dir := t.TempDir()
	writePEM := func(name, typ string, der []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	server := pki.cert(t, "etcd")
	keyDER, err := x509.MarshalECPrivateKey(server.PrivateKey.(*ecdsa.PrivateKey))
	if err != nil {
		t.Fatal(err)
	}
	ca := writePEM("ca.pem", "CERTIFICATE", pki.ca.Raw)
	cert := writePEM("etcd.pem", "CERTIFICATE", server.Certificate[0])
	key := writePEM("etcd-key.pem", "EC PRIVATE KEY", keyDER)
	client := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	peer := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
	cmd := exec.Command("etcd", "--name", "tls", "--data-dir", t.TempDir(),
		"--listen-client-urls", "https://"+client, "--advertise-client-urls", "https://"+client,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer, "--initial-cluster", "tls="+peer,
		"--cert-file", cert, "--key-file", key, "--trusted-ca-file", ca, "--client-cert-auth")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	withCert := &tls.Config{RootCAs: pki.pool, Certificates: []tls.Certificate{pki.cert(t, "node")}, MinVersion: tls.VersionTLS12}
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: withCert}, Timeout: time.Second}
	defer hc.CloseIdleConnections()
	waitFor(t, 30*time.Second, "etcd over TLS to answer", func() bool {
		resp, err := hc.Get("https://" + client + "/health")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	url := "etcds://" + client + "/" + strings.ReplaceAll(freshKey(), "/", "-")

	cfg := failConfig("tls-node", 100*time.Millisecond, time.Second)
	cfg.RegistryAddrs, cfg.RegistryTLS = []string{url}, withCert
	n := startNode(t, cfg)
	spawnEcho(t, n, "echo")
	q, err := n.QueryActor(ctxT(t, 5*time.Second), "echo")
	if err != nil || q.Node != n.UID() {
		t.Fatalf("QueryActor over TLS = %+v, %v", q, err)
	}

	cfg = failConfig("no-cert", 100*time.Millisecond, time.Second)
	cfg.RegistryAddrs, cfg.RegistryTLS = []string{url}, &tls.Config{RootCAs: pki.pool, MinVersion: tls.VersionTLS12}
	if bad, err := Start(ctxT(t, 5*time.Second), cfg); err == nil {
		bad.Close()
		t.Fatal("a node without a client certificate registered with etcd")
	}
}
