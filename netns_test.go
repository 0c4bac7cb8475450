//go:build linux

package troupe

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"troupe/hostnet"
)

// numbered is a message of the multi-host load: stream Stream, number Seq.
type numbered struct {
	Stream string
	Seq    int
}

func init() { SetWireKey[numbered]("troupe.test.numbered") }

// netnsStableAfter is the clusters' StableAfter in the multi-host tests.
const netnsStableAfter = time.Second

// TestHelperNetnsNode is not a test: the multi-host tests run it inside a
// network namespace. It starts a node and obeys line commands on stdin,
// printing events and answers on stdout.
func TestHelperNetnsNode(t *testing.T) {
	t.Parallel()
	listen := os.Getenv("TROUPE_NETNS_LISTEN")
	if listen == "" {
		t.Skip("helper for the multi-host tests")
	}
	hb, _ := time.ParseDuration(os.Getenv("TROUPE_NETNS_HB"))
	window, _ := time.ParseDuration(os.Getenv("TROUPE_NETNS_WINDOW"))
	cfg := failConfig(os.Getenv("TROUPE_NETNS_NAME"), hb, window)
	if os.Getenv("TROUPE_NETNS_LOG") != "" {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	cfg.Listen = []string{listen}
	if reg := os.Getenv("TROUPE_NETNS_REGISTRY"); reg != "" {
		cfg.RegistryAddrs = []string{reg}
	}
	cfg.SendQueueLimit = -1
	n, err := Start(ctxT(t, 5*time.Second), cfg)
	if err != nil {
		fmt.Println("ERR", err)
		return
	}
	defer n.Close()
	var out sync.Mutex
	say := func(format string, args ...any) {
		out.Lock()
		fmt.Printf(format+"\n", args...)
		out.Unlock()
	}
	start := time.Now()
	Subscribe(n, func(e PeerUnreachable) {
		say("UNREACHABLE %s %v %d", e.Name, e.Quarantined, time.Since(start).Milliseconds())
	})
	var mu sync.Mutex
	received := map[string][]int{}
	dead := map[string][]int{}
	unconfirmed := map[string][]int{}
	Subscribe(n, func(d DeadLetter) {
		if m, ok := d.Message.(numbered); ok {
			mu.Lock()
			dead[m.Stream] = append(dead[m.Stream], m.Seq)
			if d.Unconfirmed {
				unconfirmed[m.Stream] = append(unconfirmed[m.Stream], m.Seq)
			}
			mu.Unlock()
		}
	})
	spawnEcho(t, n, "echo")
	Spawn(n, "sink", Behavior[numbered]{Receive: func(_ *Context[numbered], m numbered) {
		mu.Lock()
		received[m.Stream] = append(received[m.Stream], m.Seq)
		mu.Unlock()
	}})
	refs := map[string]Ref[testPing]{}
	sinks := map[string]Ref[numbered]{}
	var cluster *Cluster
	say("READY %s", n.UID())
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		f := strings.Fields(in.Text())
		if len(f) == 0 {
			continue
		}
		switch f[0] {
		case "resolve": // resolve NAME ADDR
			addr, _ := ParseAddr(f[2])
			r, err := Resolve[testPing](ctxT(t, 5*time.Second), n, FormatRef(addr, "/user/echo"))
			if err == nil {
				sinks[f[1]], err = Resolve[numbered](ctxT(t, 5*time.Second), n, FormatRef(addr, "/user/sink"))
			}
			if err != nil {
				say("ERR %v", err)
				continue
			}
			refs[f[1]] = r
			say("OK")
		case "watch": // watch NAME
			r := refs[f[1]]
			Spawn(n, "", Behavior[count]{
				Setup:   func(c *Context[count]) { c.Watch(r) },
				Receive: func(*Context[count], count) {},
				Signal:  func(_ *Context[count], s Signal) { say("TERMINATED %s", f[1]) },
			})
			say("OK")
		case "stream": // stream STREAM NAME COUNT: COUNT numbered tells, from one actor
			total, _ := strconv.Atoi(f[3])
			sink := sinks[f[2]]
			sender, _ := Spawn(n, "", Behavior[int]{Receive: func(_ *Context[int], total int) {
				for i := range total {
					sink.Tell(numbered{Stream: f[1], Seq: i})
				}
				say("SENT %s", f[1])
			}})
			sender.Tell(total)
		case "report": // report: RCV/DL/UNC lines, then END
			mu.Lock()
			for _, kind := range []struct {
				tag string
				m   map[string][]int
			}{{"RCV", received}, {"DL", dead}, {"UNC", unconfirmed}} {
				for s, seqs := range kind.m {
					say("%s %s %s", kind.tag, s, joinInts(seqs))
				}
			}
			mu.Unlock()
			say("END")
		case "quarantined":
			say("Q %d", len(n.peers.quarantined()))
		case "clear":
			for _, q := range n.peers.quarantined() {
				n.ClearQuarantine(context.Background(), q.UID.String())
			}
			say("OK")
		case "cluster": // cluster majority|lease SEED|- [ETCD_ENDPOINT LEASE_KEY]
			ccfg := ClusterConfig{Downing: KeepMajority(), StableAfter: netnsStableAfter, GossipInterval: hb}
			if f[1] == "lease" {
				lease := newEtcdLease(f[3], f[4], 2*time.Second)
				defer lease.Close() // its keep-alive is the lease's, not the node's
				ccfg.Downing, ccfg.Lease, ccfg.LeaseMinorityDelay = LeaseMajority(), lease, 500*time.Millisecond
			}
			if f[2] != "-" {
				ccfg.Seeds = []string{f[2]}
			}
			c, err := StartCluster(ctxT(t, 5*time.Second), n, ccfg)
			if err != nil {
				say("ERR %v", err)
				continue
			}
			cluster = c
			go func() { <-c.Done(); say("CLUSTERSTOPPED %v", c.Err()) }()
			say("OK")
		case "members": // members: how many up, and how many down or removed
			up, gone := 0, 0
			for _, m := range cluster.Members() {
				switch {
				case m.Status == MemberUp:
					up++
				case m.Status >= MemberDown:
					gone++
				}
			}
			say("MEMBERS %d %d", up, gone)
		case "etcdwait": // etcdwait ENDPOINT: until etcd answers there
			deadline := time.Now().Add(20 * time.Second)
			for {
				resp, err := http.Get(f[1] + "/version")
				if err == nil {
					resp.Body.Close()
					say("OK")
					break
				}
				if time.Now().After(deadline) {
					say("ERR %v", err)
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
		case "views": // views: a VIEW line every 25 ms from now on (the nemesis)
			c := cluster
			go func() {
				for {
					stopped := 0
					select {
					case <-c.Done():
						stopped = 1
					case <-n.Done():
						return
					case <-time.After(25 * time.Millisecond):
					}
					self := c.Self()
					leader := "-"
					if l, ok := c.Leader(); ok {
						leader = l.UID.String()
					}
					var ms []string
					for _, m := range c.Members() {
						ms = append(ms, fmt.Sprintf("%s=%d", m.UID, m.Status))
					}
					say("VIEW %d %s %d %s %d %s", stopped, self.UID, self.Status, leader, len(c.Unreachable()), strings.Join(ms, ","))
					if stopped == 1 {
						return
					}
				}
			}()
			say("OK")
		case "shutdown": // shutdown: Node.Shutdown, the SIGTERM path
			n.Shutdown(ctxT(t, 10*time.Second))
			say("SHUTDOWN")
		case "reconnect": // reconnect ADDR
			if _, err := n.ClearQuarantine(ctxT(t, 5*time.Second), f[1], Reconnect()); err != nil {
				say("ERR %v", err)
			} else {
				say("OK")
			}
		}
	}
}

func joinInts(v []int) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = strconv.Itoa(x)
	}
	return strings.Join(s, ",")
}

func splitInts(s string) []int {
	var out []int
	for _, p := range strings.Split(s, ",") {
		if x, err := strconv.Atoi(p); err == nil {
			out = append(out, x)
		}
	}
	return out
}

// nsNode is a troupe node running in a host of a hostnet.
type nsNode struct {
	t      *testing.T
	name   string
	host   *hostnet.Host
	addr   string
	uid    string
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan string
	events chan string   // UNREACHABLE and TERMINATED lines
	views  func(string)  // takes VIEW lines, when set before start
	ended  chan struct{} // closed when its output has ended
	// logs keeps the last lines the node logged, with TROUPE_NETNS_LOG
	// set in its env (the process nemesis sets it): for a failure's story.
	logs *lineTail
}

// lineTail is an io.Writer that keeps the last lines written to it.
type lineTail struct {
	mu    sync.Mutex
	lines []string
	part  []byte
}

const lineTailKeep = 60

func (lt *lineTail) Write(b []byte) (int, error) {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	lt.part = append(lt.part, b...)
	for {
		i := bytes.IndexByte(lt.part, '\n')
		if i < 0 {
			break
		}
		lt.lines = append(lt.lines, string(lt.part[:i]))
		lt.part = lt.part[i+1:]
		if len(lt.lines) > 2*lineTailKeep {
			lt.lines = append([]string(nil), lt.lines[len(lt.lines)-lineTailKeep:]...)
		}
	}
	return len(b), nil
}

// last returns the last lines written, at most lineTailKeep.
func (lt *lineTail) last() []string {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	return append([]string(nil), lt.lines[max(0, len(lt.lines)-lineTailKeep):]...)
}

// startNS runs a helper node on host h listening on port.
func startNS(t *testing.T, h *hostnet.Host, name string, port int, hb, window time.Duration, env ...string) *nsNode {
	t.Helper()
	return startNSViews(t, h, name, port, hb, window, nil, env...)
}

// startNSViews is startNS with views taking the node's VIEW lines.
func startNSViews(t *testing.T, h *hostnet.Host, name string, port int, hb, window time.Duration, views func(string), env ...string) *nsNode {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	nn := &nsNode{t: t, name: name, host: h, addr: fmt.Sprintf("tcp://%s:%d", h.IP, port), lines: make(chan string, 64), events: make(chan string, 64), views: views}
	nn.cmd = h.Command(exe, "-test.run=^TestHelperNetnsNode$")
	nn.cmd.Env = append(os.Environ(), "TROUPE_NETNS_LISTEN="+nn.addr, "TROUPE_NETNS_NAME="+name,
		"TROUPE_NETNS_HB="+hb.String(), "TROUPE_NETNS_WINDOW="+window.String())
	nn.cmd.Env = append(nn.cmd.Env, env...)
	nn.cmd.Stderr = os.Stderr
	if slices.Contains(env, "TROUPE_NETNS_LOG=1") {
		nn.logs = new(lineTail)
		nn.cmd.Stderr = nn.logs
	}
	nn.stdin, _ = nn.cmd.StdinPipe()
	stdout, _ := nn.cmd.StdoutPipe()
	if err := nn.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	readerDone := make(chan struct{})
	nn.ended = readerDone
	go func() {
		defer close(readerDone)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 1<<20), 64<<20)
		for sc.Scan() {
			l := sc.Text()
			if nn.views != nil && strings.HasPrefix(l, "VIEW ") {
				nn.views(l)
				continue
			}
			if strings.HasPrefix(l, "UNREACHABLE") || strings.HasPrefix(l, "TERMINATED") || strings.HasPrefix(l, "CLUSTERSTOPPED") {
				nn.events <- l
				continue
			}
			nn.lines <- l
		}
	}()
	t.Cleanup(func() {
		nn.stdin.Close()
		nn.cmd.Process.Signal(syscall.SIGCONT)
		done := make(chan struct{})
		go func() { nn.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			nn.cmd.Process.Kill()
			<-done
		}
		<-readerDone
	})
	if l := nn.line(); !strings.HasPrefix(l, "READY ") {
		t.Fatalf("%s said %q", name, l)
	} else {
		nn.uid = strings.TrimPrefix(l, "READY ")
	}
	return nn
}

func (nn *nsNode) line() string {
	nn.t.Helper()
	select {
	case l := <-nn.lines:
		return l
	case <-time.After(20 * time.Second):
		nn.t.Fatalf("%s said nothing", nn.name)
		return ""
	}
}

// do sends a command and returns the first answer line.
func (nn *nsNode) do(cmd string) string {
	nn.t.Helper()
	fmt.Fprintln(nn.stdin, cmd)
	return nn.line()
}

func (nn *nsNode) must(cmd string) {
	nn.t.Helper()
	if l := nn.do(cmd); l != "OK" {
		nn.t.Fatalf("%s: %s: %s", nn.name, cmd, l)
	}
}

// event waits for the next UNREACHABLE or TERMINATED line.
func (nn *nsNode) event(within time.Duration) (string, bool) {
	select {
	case e := <-nn.events:
		return e, true
	case <-time.After(within):
		return "", false
	}
}

// unreachableAfter waits for an UNREACHABLE event and returns when (in ms
// of the node's life) it happened.
func (nn *nsNode) unreachable(within time.Duration) (quarantined bool, atMS int64) {
	nn.t.Helper()
	deadline := time.Now().Add(within)
	for {
		e, ok := nn.event(time.Until(deadline))
		if !ok {
			nn.t.Fatalf("%s never declared its peer unreachable", nn.name)
		}
		if f := strings.Fields(e); f[0] == "UNREACHABLE" {
			ms, _ := strconv.ParseInt(f[3], 10, 64)
			return f[2] == "true", ms
		}
	}
}

func (nn *nsNode) quarantined() int {
	nn.t.Helper()
	l := nn.do("quarantined")
	n, _ := strconv.Atoi(strings.TrimPrefix(l, "Q "))
	return n
}

func TestMultiHostCleanPartition(t *testing.T) {
	t.Parallel()
	slowTest(t)
	const hb, window = 100 * time.Millisecond, time.Second
	net := hostnet.New(t, 2)
	a := startNS(t, net.Hosts[0], "a", 7000, hb, window)
	b := startNS(t, net.Hosts[1], "b", 7000, hb, window)
	a.must("resolve b " + b.addr)
	b.must("resolve a " + a.addr)
	a.must("watch b")
	b.must("watch a")
	cut := time.Now()
	net.Hosts[1].LinkDown()
	for _, nn := range []*nsNode{a, b} {
		q, _ := nn.unreachable(10 * time.Second)
		if !q {
			t.Errorf("%s: not quarantined", nn.name)
		}
	}
	if took := time.Since(cut); took < window-hb || took > window+hb+3*time.Second { // the last frame may predate the cut by an interval
		t.Errorf("both sides detected the cut after %v (window %v)", took, window)
	}
	net.Hosts[1].LinkUp()
	if e, ok := a.event(3 * window); ok && strings.HasPrefix(e, "UNREACHABLE") {
		t.Fatalf("a second event after the heal: %s", e)
	}
	if a.quarantined() != 1 || b.quarantined() != 1 {
		t.Fatal("a quarantine did not hold after the network came back")
	}
	if l := a.do("resolve b " + b.addr); !strings.Contains(l, "quarantined") {
		t.Fatalf("resolve after the heal: %s", l)
	}
	b.must("clear")
	a.must("reconnect " + b.addr)
	a.must("resolve b " + b.addr)
}

func TestMultiHostOneWayPartition(t *testing.T) {
	t.Parallel()
	slowTest(t)
	const hb, window = 100 * time.Millisecond, time.Second
	net := hostnet.New(t, 2)
	a := startNS(t, net.Hosts[0], "a", 7000, hb, window)
	b := startNS(t, net.Hosts[1], "b", 7000, hb, window)
	a.must("resolve b " + b.addr)
	cut := time.Now()
	net.Hosts[1].DropFrom(net.Hosts[0]) // a → b is cut; b → a still flows
	if q, _ := b.unreachable(10 * time.Second); !q {
		t.Error("b: not quarantined")
	}
	if took := time.Since(cut); took < window-hb { // the last frame may predate the cut by an interval
		t.Errorf("b declared a unreachable after %v, sooner than the window", took)
	}
	// b gives up and closes; a hears the end and quarantines b too.
	if q, _ := a.unreachable(10 * time.Second); !q {
		t.Error("a: not quarantined")
	}
}

func TestMultiHostJitterAndLossRaiseNoFalseAlarm(t *testing.T) {
	longRun(t)
	if testing.Short() {
		t.Skip("runs for several windows")
	}
	// The defaults (1 s and 10 s). A scaled-down pair with the same ratio is
	// not the same test: TCP's retransmission timers under 5% loss do not
	// scale down with it.
	const hb, window = time.Second, 10 * time.Second
	net := hostnet.New(t, 2)
	a := startNS(t, net.Hosts[0], "a", 7000, hb, window)
	b := startNS(t, net.Hosts[1], "b", 7000, hb, window)
	relay := hostnet.NewRelay(t, net.Hosts[0], strings.TrimPrefix(b.addr, "tcp://"), 100*time.Millisecond, 50*time.Millisecond)
	a.must("resolve b tcp://" + relay.Addr) // connect first: a lost SYN is not what is tested
	a.must("watch b")
	net.Hosts[0].Loss(5)
	net.Hosts[1].Loss(5)
	a.do("stream s1 b 2000")
	if e, ok := a.event(3 * window); ok {
		t.Fatalf("a false alarm under 100±50 ms jitter and 5%% loss: %s", e)
	}
	if e, ok := b.event(0); ok {
		t.Fatalf("a false alarm on b: %s", e)
	}
}

func TestMultiHostStopAndKill(t *testing.T) {
	t.Parallel()
	slowTest(t)
	const hb, window = 100 * time.Millisecond, time.Second
	net := hostnet.New(t, 2)
	a := startNS(t, net.Hosts[0], "a", 7000, hb, window)
	b := startNS(t, net.Hosts[1], "b", 7000, hb, window)
	a.must("resolve b " + b.addr)
	// Paused for less than the window: no event.
	b.cmd.Process.Signal(syscall.SIGSTOP)
	time.Sleep(window / 3)
	b.cmd.Process.Signal(syscall.SIGCONT)
	if e, ok := a.event(2 * window); ok {
		t.Fatalf("a short pause raised %s", e)
	}
	// Paused for longer: exactly one event.
	b.cmd.Process.Signal(syscall.SIGSTOP)
	if q, _ := a.unreachable(10 * time.Second); !q {
		t.Fatal("not quarantined")
	}
	b.cmd.Process.Signal(syscall.SIGCONT)
	if e, ok := a.event(2 * window); ok {
		t.Fatalf("a second event for one pause: %s", e)
	}
	// Killed and restarted on the same address: a new uid.
	b.cmd.Process.Kill()
	b2 := startNS(t, net.Hosts[1], "b", 7000, hb, window)
	if b2.uid == b.uid {
		t.Fatalf("the restarted node kept uid %s", b.uid)
	}
	a.must("reconnect " + b2.addr)
	a.must("resolve b " + b2.addr)
}

// accountStreams collects every node's report and checks that each
// message of each stream was delivered once, in order, or reported as a
// dead letter (delivered as well only if the dead letter says it was
// unconfirmed). The dead letters of a session that ended come as its
// node gets to them, later on a loaded machine: a report that misses
// some is asked for again, for up to 30 s.
func accountStreams(t *testing.T, nodes []*nsNode, sent map[string]int, faultFree bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := accountOnce(t, nodes, sent, faultFree)
		if err == nil {
			return
		}
		if !errors.Is(err, errNotYetReported) || time.Now().After(deadline) {
			t.Fatal(err)
		}
		time.Sleep(time.Second)
	}
}

var errNotYetReported = errors.New("neither delivered nor reported")

func accountOnce(t *testing.T, nodes []*nsNode, sent map[string]int, faultFree bool) error {
	t.Helper()
	rcv, dl, unc := map[string][]int{}, map[string][]int{}, map[string][]int{}
	for _, nn := range nodes {
		fmt.Fprintln(nn.stdin, "report")
		for {
			l := nn.line()
			if l == "END" {
				break
			}
			f := strings.SplitN(l, " ", 3)
			if len(f) < 3 {
				f = append(f, "")
			}
			switch f[0] {
			case "RCV":
				rcv[f[1]] = append(rcv[f[1]], splitInts(f[2])...)
			case "DL":
				dl[f[1]] = append(dl[f[1]], splitInts(f[2])...)
			case "UNC":
				unc[f[1]] = append(unc[f[1]], splitInts(f[2])...)
			}
		}
	}
	var logs []string
	for stream, total := range sent {
		got := rcv[stream]
		for i := 1; i < len(got); i++ {
			if got[i] <= got[i-1] {
				return fmt.Errorf("stream %s: %d delivered after %d (out of order or twice)", stream, got[i], got[i-1])
			}
		}
		seen := make([]int, total)
		for _, s := range got {
			seen[s]++
		}
		for _, s := range dl[stream] {
			if seen[s] > 0 && !slices.Contains(unc[stream], s) {
				return fmt.Errorf("stream %s: message %d delivered and reported certainly undelivered", stream, s)
			}
			seen[s]++
		}
		for s, c := range seen {
			if c == 0 {
				return fmt.Errorf("stream %s: message %d %w (lost silently)", stream, s, errNotYetReported)
			}
		}
		if faultFree && (len(got) != total || len(dl[stream]) != 0) {
			return fmt.Errorf("stream %s: with no fault, %d of %d delivered and %d dead letters", stream, len(got), total, len(dl[stream]))
		}
		logs = append(logs, fmt.Sprintf("stream %s: %d sent, %d delivered, %d dead letters (%d unconfirmed)", stream, total, len(got), len(dl[stream]), len(unc[stream])))
	}
	for _, l := range logs {
		t.Log(l)
	}
	return nil
}

func TestMultiHostNothingLost(t *testing.T) {
	longRun(t)
	if testing.Short() {
		t.Skip("streams across three hosts")
	}
	// A 3 s window: a node starved of CPU by a loaded machine must not be
	// written off in the fault-free run (the detectors' own tests hold
	// the tighter windows).
	const hb, window = 100 * time.Millisecond, 3 * time.Second
	for _, partition := range []bool{false, true} {
		t.Run(fmt.Sprintf("partition=%v", partition), func(t *testing.T) {
			net := hostnet.New(t, 3)
			var nodes []*nsNode
			for i, h := range net.Hosts {
				nodes = append(nodes, startNS(t, h, fmt.Sprintf("n%d", i), 7000, hb, window))
			}
			sent := map[string]int{}
			for i, from := range nodes {
				for j, to := range nodes {
					if i != j {
						from.must(fmt.Sprintf("resolve %s %s", to.name, to.addr))
					}
				}
			}
			const perStream = 20000
			for i, from := range nodes {
				for j, to := range nodes {
					if i == j {
						continue
					}
					for k := range 2 { // two sender actors per pair
						id := fmt.Sprintf("%s-%s-%d", from.name, to.name, k)
						fmt.Fprintf(from.stdin, "stream %s %s %d\n", id, to.name, perStream)
						sent[id] = perStream
					}
				}
			}
			if partition {
				// Cut n2 off while the streams run; where exactly does not
				// matter, the accounting must hold wherever it lands.
				time.Sleep(100 * time.Millisecond)
				net.Hosts[2].LinkDown()
				nodes[0].unreachable(10 * time.Second)
				nodes[1].unreachable(10 * time.Second)
			}
			for _, from := range nodes {
				for range 4 {
					if l := from.line(); !strings.HasPrefix(l, "SENT") {
						t.Fatalf("%s: %s", from.name, l)
					}
				}
			}
			// Let what is in flight land, or be given up on.
			time.Sleep(2 * window)
			accountStreams(t, nodes, sent, !partition)
		})
	}
}

// A five-member cluster on five hosts, split 3|2 by the network: exactly
// one side survives, within StableAfter plus a bound — with keep-majority,
// and with lease-majority holding its lease in an etcd on a sixth host
// that only the three can reach.
func TestMultiHostClusterSplit(t *testing.T) {
	longRun(t)
	// The bound: detection (phi over 100 ms heartbeats, about half a second
	// at most), StableAfter, the lease's minority delay and round trips,
	// and gossip to the downed side, generously for a loaded machine.
	const hb, bound = 100 * time.Millisecond, 10 * time.Second
	for _, strategy := range []string{"majority", "lease"} {
		t.Run(strategy, func(t *testing.T) {
			hosts := 5
			if strategy == "lease" {
				if _, err := exec.LookPath("etcd"); err != nil {
					t.Skip("no etcd binary (apt-get install etcd-server)")
				}
				hosts = 6
			}
			net := hostnet.New(t, hosts)
			var leaseArgs string
			if strategy == "lease" {
				leaseArgs = " " + startEtcdOn(t, net.Hosts[5]) + fmt.Sprintf(" troupe-netns-%d", time.Now().UnixNano())
			}
			var nodes []*nsNode
			for i := range 5 {
				nodes = append(nodes, startNS(t, net.Hosts[i], fmt.Sprintf("m%d", i), 7000, hb, 10*time.Second))
			}
			if strategy == "lease" {
				nodes[0].must("etcdwait " + strings.Fields(leaseArgs)[0])
			}
			nodes[0].must("cluster " + strategy + " -" + leaseArgs)
			for _, nn := range nodes[1:] {
				nn.must("cluster " + strategy + " " + nodes[0].addr + leaseArgs)
			}
			waitMembers(t, nodes, 5, 0, 20*time.Second)

			major, minor := nodes[:3], nodes[3:]
			for _, a := range []int{0, 1, 2} {
				for _, b := range []int{3, 4} {
					net.Hosts[a].DropFrom(net.Hosts[b])
					net.Hosts[b].DropFrom(net.Hosts[a])
				}
			}
			if strategy == "lease" {
				for _, b := range []int{3, 4} {
					net.Hosts[5].DropFrom(net.Hosts[b])
					net.Hosts[b].DropFrom(net.Hosts[5])
				}
			}
			cut := time.Now()
			for _, nn := range minor {
				waitClusterStopped(t, nn, netnsStableAfter+bound)
			}
			waitMembers(t, major, 3, 2, netnsStableAfter+bound)
			t.Logf("resolved in %v (StableAfter %v)", time.Since(cut).Round(time.Millisecond), netnsStableAfter)
			for _, nn := range major {
				if e, ok := nn.event(0); ok && strings.HasPrefix(e, "CLUSTERSTOPPED") {
					t.Fatalf("%s, on the majority side, stopped: %s", nn.name, e)
				}
			}
		})
	}
}

// waitMembers polls until every node sees up members up and gone members
// down or removed.
func waitMembers(t *testing.T, nodes []*nsNode, up, gone int, within time.Duration) {
	t.Helper()
	want := fmt.Sprintf("MEMBERS %d %d", up, gone)
	deadline := time.Now().Add(within)
	for _, nn := range nodes {
		for {
			l := nn.do("members")
			if l == want {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %s, want %s", nn.name, l, want)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// waitClusterStopped waits for nn's cluster to stop because it was
// downed.
func waitClusterStopped(t *testing.T, nn *nsNode, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		e, ok := nn.event(time.Until(deadline))
		if !ok {
			t.Fatalf("%s: its cluster never stopped", nn.name)
		}
		if strings.HasPrefix(e, "CLUSTERSTOPPED") {
			if !strings.Contains(e, "downed") {
				t.Fatalf("%s: %s, want downed", nn.name, e)
			}
			return
		}
	}
}

// startEtcdOn runs a one-member etcd on host h and returns its client
// endpoint.
func startEtcdOn(t *testing.T, h *hostnet.Host) string {
	t.Helper()
	ip := h.IP.String()
	endpoint := "http://" + ip + ":2379"
	cmd := h.Command("etcd", "--name", "netns", "--data-dir", t.TempDir(),
		"--listen-client-urls", endpoint, "--advertise-client-urls", endpoint,
		"--listen-peer-urls", "http://"+ip+":2380", "--initial-advertise-peer-urls", "http://"+ip+":2380",
		"--initial-cluster", "netns=http://"+ip+":2380")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	return endpoint
}

// TestMultiHostEtcdCutOff registers a node on one host with an etcd on
// another, then drops everything etcd sends it: the node's lease runs out
// and its entries go, with no registrar to notice; when the network is
// back, the node finds its lease gone and registers everything again.
func TestMultiHostEtcdCutOff(t *testing.T) {
	t.Parallel()
	slowTest(t)
	if _, err := exec.LookPath("etcd"); err != nil {
		t.Skip("no etcd binary (apt-get install etcd-server)")
	}
	if _, err := exec.LookPath("curl"); err != nil {
		t.Skip("no curl to read etcd from its host")
	}
	net := hostnet.New(t, 2)
	endpoint := startEtcdOn(t, net.Hosts[0])
	waitFor(t, 30*time.Second, "etcd to answer", func() bool {
		return net.Hosts[0].Command("curl", "-sf", "-m", "1", endpoint+"/health").Run() == nil
	})
	prefix := fmt.Sprintf("troupe-cut-%d", time.Now().UnixNano())
	const window = time.Second // the lease's TTL is etcdMinTTL, 2 s
	startNS(t, net.Hosts[1], "n1", 7000, 100*time.Millisecond, window,
		"TROUPE_NETNS_REGISTRY=etcd://"+strings.TrimPrefix(endpoint, "http://")+"/"+prefix)
	// sinks counts the registrations of n1's "sink" actor, asking etcd on
	// its own host.
	key := "/" + prefix + "/sink/"
	sinks := func() int {
		body := fmt.Sprintf(`{"key":%q,"range_end":%q,"count_only":true}`, b64(key), b64(rangeEnd(key)))
		out, err := net.Hosts[0].Command("curl", "-sf", "-m", "2", "-X", "POST", endpoint+"/v3/kv/range", "-d", body).Output()
		if err != nil {
			return -1
		}
		var res struct{ Count string }
		if json.Unmarshal(out, &res) != nil {
			return -1
		}
		n, _ := strconv.Atoi(cmp.Or(res.Count, "0"))
		return n
	}
	waitFor(t, 30*time.Second, "n1's sink to be registered in etcd", func() bool { return sinks() == 1 })
	cut := time.Now()
	net.Hosts[1].DropFrom(net.Hosts[0])
	waitFor(t, etcdMinTTL+10*time.Second, "n1's entries to expire", func() bool { return sinks() == 0 })
	gone := time.Since(cut)
	net.Hosts[1].Clear()
	waitFor(t, etcdMinTTL+10*time.Second, "n1 to register again", func() bool { return sinks() == 1 })
	t.Logf("entries gone %v after the cut (ttl %v); back %v after the repair", gone.Round(time.Millisecond), etcdMinTTL, time.Since(cut.Add(gone)).Round(time.Millisecond))
}
