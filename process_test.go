//go:build unix

package troupe

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestHelperNodeProcess is not a test: the process tests run it in a child
// process. It starts a node listening on $TROUPE_HELPER_NODE with an echo
// actor, prints its address and uid, and obeys commands on stdin ("clear"
// lifts every quarantine; "dial HOST:PORT" resolves the echo actor there;
// "service KEY" registers it under a service key) until stdin closes.
func TestHelperNodeProcess(t *testing.T) {
	t.Parallel()
	listen := os.Getenv("TROUPE_HELPER_NODE")
	if listen == "" {
		t.Skip("helper for the process tests")
	}
	cfg := failConfig("child", 50*time.Millisecond, 2*time.Second) // (the parents measure detection; the child only must not give up on them under load)
	cfg.Listen = []string{listen}
	if reg := os.Getenv("TROUPE_HELPER_REGISTRY"); reg != "" {
		cfg.RegistryAddrs = []string{reg}
	}
	n, err := Start(ctxT(t, 5*time.Second), cfg)
	if err != nil {
		fmt.Println("ERR", err)
		return
	}
	defer n.Close()
	echo := spawnEcho(t, n, "echo")
	fmt.Printf("READY %s %s\n", n.Addrs()[0], n.UID())
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		if addr, ok := strings.CutPrefix(in.Text(), "dial "); ok {
			if _, err := Resolve[testPing](ctxT(t, 5*time.Second), n, FormatRef(tcpAddr(addr), "/user/echo")); err != nil {
				fmt.Println("ERR", err)
				continue
			}
			fmt.Println("DIALED")
		}
		if key, ok := strings.CutPrefix(in.Text(), "service "); ok {
			if err := (ServiceKey[testPing]{Name: key}).Register(n, echo); err != nil {
				fmt.Println("ERR", err)
				continue
			}
			fmt.Println("REGISTERED")
		}
		if in.Text() == "clear" {
			for _, q := range n.peers.quarantined() {
				n.ClearQuarantine(context.Background(), q.UID.String())
			}
			fmt.Println("CLEARED")
		}
	}
}

// child is a node running in another OS process.
type child struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *bufio.Reader
	addr  Addr
	uid   string
}

// startChild runs a helper node listening on listen (and registering
// with the registry in env, if given).
func startChild(t *testing.T, listen string, env ...string) *child {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	c := &child{cmd: exec.Command(exe, "-test.run=^TestHelperNodeProcess$")}
	c.cmd.Env = append(append(os.Environ(), "TROUPE_HELPER_NODE="+listen), env...)
	c.cmd.Stderr = os.Stderr
	c.stdin, _ = c.cmd.StdinPipe()
	stdout, _ := c.cmd.StdoutPipe()
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.stdin.Close()
		c.cmd.Process.Signal(syscall.SIGCONT)
		done := make(chan struct{})
		go func() { c.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			c.cmd.Process.Kill()
			<-done
		}
	})
	c.out = bufio.NewReader(stdout)
	fields := strings.Fields(c.line(t))
	if len(fields) != 3 || fields[0] != "READY" {
		t.Fatalf("child said %q", fields)
	}
	if c.addr, err = ParseAddr(fields[1]); err != nil {
		t.Fatal(err)
	}
	c.uid = fields[2]
	return c
}

func (c *child) line(t *testing.T) string {
	t.Helper()
	type res struct {
		s   string
		err error
	}
	ch := make(chan res, 1)
	go func() { s, err := c.out.ReadString('\n'); ch <- res{s, err} }()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatalf("child output: %v", r.err)
		}
		return strings.TrimSpace(r.s)
	case <-time.After(10 * time.Second):
		t.Fatal("child said nothing")
		return ""
	}
}

func (c *child) signal(t *testing.T, s syscall.Signal) {
	t.Helper()
	if err := c.cmd.Process.Signal(s); err != nil {
		t.Fatal(err)
	}
}

// processParent starts this test's node and resolves and watches the
// child's echo actor.
func processParent(t *testing.T, c *child) (*Node, Ref[testPing], chan Terminated, chan PeerUnreachable) {
	n := startNode(t, failConfig("parent", 50*time.Millisecond, 500*time.Millisecond))
	events := make(chan PeerUnreachable, 4)
	SubscribeChan(n, events)
	echo, err := Resolve[testPing](ctxT(t, 5*time.Second), n, FormatRef(c.addr, "/user/echo"))
	if err != nil {
		t.Fatal(err)
	}
	if echo.NodeUID().String() != c.uid {
		t.Fatalf("resolved uid %v, child says %s", echo.NodeUID(), c.uid)
	}
	if _, err := Ask(ctxT(t, 5*time.Second), echo, func(r Ref[testPong]) testPing { return testPing{ReplyTo: r} }); err != nil {
		t.Fatal(err)
	}
	return n, echo, watcher(t, n, "w", echo), events
}

func TestProcessKilledWithSIGKILLIsDetected(t *testing.T) {
	t.Parallel()
	c := startChild(t, "tcp://127.0.0.1:0")
	_, _, term, events := processParent(t, c)
	c.signal(t, syscall.SIGKILL)
	ev := recv(t, events, "PeerUnreachable")
	if !ev.Quarantined || ev.UID.String() != c.uid {
		t.Fatalf("PeerUnreachable = %+v", ev)
	}
	// The broken connection is not taken for a flap: the redial is
	// refused, and that is the verdict, not the 500 ms window (checked by
	// the reason, not by the time, which a loaded machine stretches).
	if ev.Reason == nil || !strings.Contains(ev.Reason.Error(), "now refuses connections") {
		t.Fatalf("a killed process was declared unreachable because %v; want the refused redial", ev.Reason)
	}
	if tm := recv(t, term, "Terminated"); !errors.Is(tm.Reason, ErrPeerUnreachable) {
		t.Fatalf("Terminated reason = %v", tm.Reason)
	}
}

func TestProcessStoppedWithSIGSTOPStaysQuarantined(t *testing.T) {
	t.Parallel()
	slowTest(t)
	c := startChild(t, "tcp://127.0.0.1:0")
	n, echo, term, events := processParent(t, c)
	stopped := time.Now()
	c.signal(t, syscall.SIGSTOP)
	ev := recv(t, events, "PeerUnreachable")
	if !ev.Quarantined || time.Since(stopped) < 400*time.Millisecond {
		t.Fatalf("PeerUnreachable = %+v after %v", ev, time.Since(stopped))
	}
	recv(t, term, "Terminated")
	connected := make(chan PeerConnected, 1)
	SubscribeChan(n, connected)
	c.signal(t, syscall.SIGCONT)
	time.Sleep(3 * 500 * time.Millisecond) // three windows in which nothing may reconnect
	select {
	case ev := <-connected:
		t.Fatalf("reconnected by itself after SIGCONT: %+v", ev)
	default:
	}
	if _, err := Resolve[testPing](ctxT(t, time.Second), n, FormatRef(c.addr, "/user/echo")); !errors.Is(err, ErrQuarantined) {
		t.Fatalf("Resolve after SIGCONT = %v, want ErrQuarantined", err)
	}
	// The child, woken, found the link gone and quarantined us too.
	if _, err := n.ClearQuarantine(ctxT(t, 5*time.Second), c.addr.String(), Reconnect()); !errors.Is(err, ErrQuarantinedByPeer) {
		t.Fatalf("Reconnect before the child cleared = %v, want ErrQuarantinedByPeer", err)
	}
	fmt.Fprintln(c.stdin, "clear")
	if l := c.line(t); l != "CLEARED" {
		t.Fatalf("child said %q", l)
	}
	if _, err := n.ClearQuarantine(ctxT(t, 5*time.Second), c.addr.String(), Reconnect()); err != nil {
		t.Fatalf("Reconnect: %v", err)
	}
	again, err := Resolve[testPing](ctxT(t, 5*time.Second), n, FormatRef(c.addr, "/user/echo"))
	if err != nil || again.NodeUID() != echo.NodeUID() {
		t.Fatalf("Resolve after reconnect = %v, %v; want the same incarnation", again, err)
	}
	dead := make(chan DeadLetter, 1)
	SubscribeChan(n, dead)
	echo.Tell(testPing{})
	if dl := recv(t, dead, "dead letter"); !errors.Is(dl.Reason, ErrSessionEnded) {
		t.Fatalf("old ref to the same incarnation: %v, want ErrSessionEnded", dl.Reason)
	}
}

func TestProcessRestartedAtSameAddressIsANewPeer(t *testing.T) {
	t.Parallel()
	first := startChild(t, "tcp://127.0.0.1:0")
	n, echo, _, events := processParent(t, first)
	first.signal(t, syscall.SIGKILL)
	recv(t, events, "PeerUnreachable")
	second := startChild(t, first.addr.String())
	if second.uid == first.uid {
		t.Fatalf("restarted child kept uid %s", first.uid)
	}
	if _, err := n.ClearQuarantine(ctxT(t, 5*time.Second), first.addr.String(), Reconnect()); err != nil {
		t.Fatalf("Reconnect: %v", err)
	}
	fresh, err := Resolve[testPing](ctxT(t, 5*time.Second), n, FormatRef(first.addr, "/user/echo"))
	if err != nil || fresh.NodeUID().String() != second.uid {
		t.Fatalf("Resolve = %v (%v), want uid %s", fresh, err, second.uid)
	}
	dead := make(chan DeadLetter, 1)
	SubscribeChan(n, dead)
	echo.Tell(testPing{})
	if dl := recv(t, dead, "dead letter"); !errors.Is(dl.Reason, ErrSessionEnded) {
		t.Fatalf("old ref after restart: %v, want ErrSessionEnded", dl.Reason)
	}
	if _, err := Ask(ctxT(t, 5*time.Second), fresh, func(r Ref[testPong]) testPing { return testPing{ReplyTo: r} }); err != nil {
		t.Fatalf("Ask the new incarnation: %v", err)
	}
}

// TestEtcdRegistryKilledProcessExpires kills -9 a node process that
// registered with etcd: nobody unregisters it, and its entries are gone
// when its lease runs out.
func TestEtcdRegistryKilledProcessExpires(t *testing.T) {
	t.Parallel()
	slowTest(t)
	cl := startEtcdCluster(t)
	url := cl.url(t)
	c := startChild(t, "tcp://127.0.0.1:0", "TROUPE_HELPER_REGISTRY="+url)
	n := etcdNode(t, "parent", url)
	reg, err := n.Registry()
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, 30*time.Second)
	if regs, err := reg.Find(ctx, "echo"); err != nil || len(regs) != 1 || regs[0].Node.String() != c.uid {
		t.Fatalf("the child's echo: %+v, %v", regs, err)
	}
	killed := time.Now()
	c.signal(t, syscall.SIGKILL)
	ttl := etcdMinTTL // the child's UnreachableAfter is shorter
	waitFor(t, ttl+5*time.Second, "the killed child's entries to expire", func() bool {
		regs, err := reg.Find(ctx, "echo")
		return err == nil && len(regs) == 0
	})
	if took := time.Since(killed); took > ttl+time.Second {
		t.Fatalf("entries outlived the lease: gone %v after the kill (ttl %v)", took, ttl)
	}
}

// TestProcessThatDialedUsKilledIsDetected kills -9 a process that dialed
// this node: the connection breaks, the session is suspended, and this
// side, which cannot dial it back, asks its proven address who answers:
// nobody, so the peer is declared unreachable by that probe (its reason
// says the address refuses connections), not by the window running out.
// (It checks the reason, not the time: under -race beside the suite and
// two burners the probe's answer once took 444 ms of a 500 ms window.)
func TestProcessThatDialedUsKilledIsDetected(t *testing.T) {
	t.Parallel()
	cfg := failConfig("parent", 50*time.Millisecond, 500*time.Millisecond)
	cfg.Listen = []string{"tcp://127.0.0.1:0"}
	n := startNode(t, cfg)
	spawnEcho(t, n, "echo")
	events := make(chan PeerUnreachable, 4)
	SubscribeChan(n, events)
	c := startChild(t, "tcp://127.0.0.1:0")
	fmt.Fprintln(c.stdin, "dial "+n.Addrs()[0].Address())
	if l := c.line(t); l != "DIALED" {
		t.Fatalf("child said %q", l)
	}
	// The child's announced address is proven by a dial-back probe.
	waitFor(t, 5*time.Second, "the child's address to be proven", func() bool {
		n.peers.mu.Lock()
		defer n.peers.mu.Unlock()
		for _, a := range n.peers.byUID {
			if len(a.tab.proven) > 0 {
				return true
			}
		}
		return false
	})
	c.signal(t, syscall.SIGKILL)
	ev := recv(t, events, "PeerUnreachable")
	if !ev.Quarantined || ev.UID.String() != c.uid {
		t.Fatalf("PeerUnreachable = %+v", ev)
	}
	if ev.Reason == nil || !strings.Contains(ev.Reason.Error(), "now refuses connections") {
		t.Fatalf("a killed process that had dialed us was declared unreachable because %v; want the dial-back probe's refusal", ev.Reason)
	}
}

// A service key's listing follows actors in other processes: a child's
// actor registered under the key is pushed to a ServiceKey.Watch here, and
// leaves the listing when the child is killed -9 (the registrar gives up
// on it).
func TestServiceKeyAcrossProcesses(t *testing.T) {
	t.Parallel()
	reg := freeRegistryAddr(t, "tcp")
	cfg := failConfig("parent", 50*time.Millisecond, 500*time.Millisecond)
	cfg.RegistryAddrs = []string{reg}
	n := startNode(t, cfg)
	if !n.registrar.isRegistrar() {
		t.Fatal("the parent is not the registrar")
	}
	c := startChild(t, "tcp://127.0.0.1:0", "TROUPE_HELPER_REGISTRY="+reg)
	key := ServiceKey[testPing]{Name: "echoes"}
	listings := make(chan []Ref[testPing], 16)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- key.Watch(ctx, n, func(rs []Ref[testPing]) { listings <- rs }) }()
	t.Cleanup(func() { cancel(); <-done })
	if l := <-listings; len(l) != 0 {
		t.Fatalf("the first listing holds %d actors before any registered", len(l))
	}
	fmt.Fprintln(c.stdin, "service echoes")
	if got := c.line(t); got != "REGISTERED" {
		t.Fatalf("child said %q", got)
	}
	await := func(what string, want int) []Ref[testPing] {
		t.Helper()
		for {
			select {
			case l := <-listings:
				if len(l) == want {
					return l
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("no listing of %d actors %s", want, what)
			}
		}
	}
	l := await("after the child registered", 1)
	if l[0].NodeUID().String() != c.uid {
		t.Fatalf("the listed actor is on %v, the child is %s", l[0].NodeUID(), c.uid)
	}
	if _, err := Ask(ctxT(t, 5*time.Second), l[0], func(r Ref[testPong]) testPing { return testPing{ReplyTo: r} }); err != nil {
		t.Fatalf("Ask through the listed ref: %v", err)
	}
	c.signal(t, syscall.SIGKILL)
	await("after the child was killed", 0)
}
