package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"troupe"
)

// lineWriter hands each line written to it to a channel.
type lineWriter struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	lines chan string
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	for {
		line, err := w.buf.ReadString('\n')
		if err != nil {
			w.buf.WriteString(line)
			return len(p), nil
		}
		w.lines <- strings.TrimSpace(line)
	}
}

func TestRegistrarLsQuery(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	out := &lineWriter{lines: make(chan string, 8)}
	exited := make(chan int, 1)
	go func() { exited <- run(ctx, []string{"registrar", "--addr", "127.0.0.1:0"}, out, io.Discard) }()
	var line string
	select {
	case line = <-out.lines:
	case <-time.After(10 * time.Second):
		t.Fatal("the registrar printed no address")
	}
	addr := strings.TrimPrefix(line, "registrar listening on ")
	if addr == line {
		t.Fatalf("registrar said %q", line)
	}
	defer func() {
		cancel()
		if code := <-exited; code != 0 {
			t.Errorf("registrar exited %d after SIGINT", code)
		}
	}()

	// A second daemon on the same address refuses.
	var errOut bytes.Buffer
	if code := run(context.Background(), []string{"registrar", "--addr", addr}, io.Discard, &errOut); code == 0 || !strings.Contains(errOut.String(), "already serves") {
		t.Fatalf("second registrar: exit %d, %q", code, errOut.String())
	}

	// A service registers with it.
	svcCtx, svcCancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer svcCancel()
	svc, err := troupe.Start(svcCtx, troupe.Config{Name: "svc-node", RegistryAddrs: []string{addr}})
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()
	if _, err := troupe.Spawn(svc, "billing", troupe.Behavior[string]{Receive: func(*troupe.Context[string], string) {}}); err != nil {
		t.Fatal(err)
	}

	var stdout bytes.Buffer
	if code := run(context.Background(), []string{"ls", "--registry", addr}, &stdout, io.Discard); code != 0 {
		t.Fatalf("ls exited %d", code)
	}
	table := stdout.String()
	for _, want := range []string{"NAME", "billing", "/user/billing", "svc-node", "registrar", svc.Addrs()[0].String()} {
		if !strings.Contains(table, want) {
			t.Errorf("ls output lacks %q:\n%s", want, table)
		}
	}
	stdout.Reset()
	if code := run(context.Background(), []string{"ls", "--registry", addr, "--json"}, &stdout, io.Discard); code != 0 {
		t.Fatalf("ls --json exited %d", code)
	}
	var entries []registration
	if err := json.Unmarshal(stdout.Bytes(), &entries); err != nil || len(entries) != 3 {
		t.Fatalf("ls --json = %q (%v)", stdout.String(), err)
	}
	// UUIDs whole: the actors of one node share their first digits.
	for _, e := range entries {
		if !strings.Contains(table, " "+e.UUID+" ") && !strings.Contains(table, "\t"+e.UUID+"\t") {
			t.Errorf("ls does not print %s's uuid %s whole:\n%s", e.Name, e.UUID, table)
		}
	}

	stdout.Reset()
	if code := run(context.Background(), []string{"query", "--registry", addr, "billing"}, &stdout, io.Discard); code != 0 || strings.TrimSpace(stdout.String()) != svc.Addrs()[0].String() {
		t.Fatalf("query: exit %d, %q", code, stdout.String())
	}
	errOut.Reset()
	if code := run(context.Background(), []string{"query", "--registry", addr, "nobody"}, io.Discard, &errOut); code != 1 || !strings.Contains(errOut.String(), "not registered") {
		t.Fatalf("query of a missing name: exit %d, %q", code, errOut.String())
	}
}

func TestNoRegistrarAnswers(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"ls", "--registry", "127.0.0.1:1", "--timeout", "2s"}, {"query", "--registry", "127.0.0.1:1", "x"}} {
		var errOut bytes.Buffer
		if code := run(context.Background(), args, io.Discard, &errOut); code == 0 || !strings.Contains(errOut.String(), "no registrar answers") {
			t.Errorf("%v: exit %d, %q", args, code, errOut.String())
		}
	}
}

func TestHelpForEveryCommand(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"--help"}, {"help"}, {"registrar", "--help"}, {"ls", "--help"}, {"query", "-h"}, {"down", "--help"}, {"peers", "--help"}, {"actors", "--help"}, {"stats", "--help"}, {"watch", "--help"}, {"version", "--help"}} {
		var out, errOut bytes.Buffer
		if code := run(context.Background(), args, &out, &errOut); code != 0 || out.Len() == 0 || errOut.Len() != 0 {
			t.Errorf("%v: exit %d, stdout %q, stderr %q", args, code, out.String(), errOut.String())
		}
	}
	var out bytes.Buffer
	run(context.Background(), []string{"registrar", "--help"}, &out, io.Discard)
	if !strings.Contains(out.String(), troupe.DefaultRegistryTCP) {
		t.Errorf("registrar --help does not name its default address %s:\n%s", troupe.DefaultRegistryTCP, out.String())
	}
}

func TestVersion(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	if code := run(context.Background(), []string{"version"}, &out, io.Discard); code != 0 || !strings.Contains(out.String(), troupe.Version) {
		t.Fatalf("version: exit %d, %q", code, out.String())
	}
}

func TestUsageErrors(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{}, {"bogus"}, {"ls", "--bogus"}, {"query"}, {"query", "a", "b"}, {"ls", "--registry", "/ip4/1.2.3.4/udp/1"}, {"down", "tcp://127.0.0.1:1"}} {
		var errOut bytes.Buffer
		if code := run(context.Background(), args, io.Discard, &errOut); code != 2 || errOut.Len() == 0 {
			t.Errorf("%v: exit %d, %q", args, code, errOut.String())
		}
	}
}

func TestQueryFlagsAfterNameAndJSON(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	reg, err := troupe.Start(ctx, troupe.Config{Name: "reg", RegistryAddrs: []string{"127.0.0.1:0"}})
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	if _, err := troupe.Spawn(reg, "billing", troupe.Behavior[string]{Receive: func(*troupe.Context[string], string) {}}); err != nil {
		t.Fatal(err)
	}
	addr := reg.Addrs()[0].String()
	var out bytes.Buffer
	if code := run(ctx, []string{"query", "billing", "--registry", addr, "--json"}, &out, io.Discard); code != 0 {
		t.Fatalf("query NAME --registry X --json: exit %d", code)
	}
	var q queryResult
	if err := json.Unmarshal(out.Bytes(), &q); err != nil || q.Addr != addr || q.Registration.Name != "billing" || q.Registration.Path != "/user/billing" {
		t.Fatalf("query --json = %q (%v)", out.String(), err)
	}
}

func TestNoRegistrarIsOneLine(t *testing.T) {
	t.Parallel()
	var errOut bytes.Buffer
	run(context.Background(), []string{"ls", "--registry", "127.0.0.1:1"}, io.Discard, &errOut)
	msg := errOut.String()
	if strings.Count(msg, "\n") != 1 || strings.Count(msg, "troupe") > 2 || strings.Count(msg, "127.0.0.1:1") > 2 || !strings.Contains(msg, "connection refused") {
		t.Fatalf("a failed ls should say once what failed and what to check:\n%s", msg)
	}
}

// silentListener accepts connections and never answers the handshake,
// until the test ends.
func silentListener(t *testing.T) net.Listener {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { l.Close(); <-done })
	go func() {
		defer close(done)
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				c.Close()
			}
		}()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c)
		}
	}()
	return l
}

func TestTimeoutIsHonouredAgainstASilentPeer(t *testing.T) {
	t.Parallel()
	l := silentListener(t)
	start := time.Now()
	var errOut bytes.Buffer
	code := run(context.Background(), []string{"ls", "--registry", l.Addr().String(), "--timeout", "1s"}, io.Discard, &errOut)
	if took := time.Since(start); code != 1 || took > 4*time.Second {
		t.Fatalf("ls --timeout 1s against a silent peer: exit %d after %v: %s", code, took, errOut.String())
	}
}

func TestDownAMember(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	start := func(name string, seeds ...string) (*troupe.Node, *troupe.Cluster) {
		n, err := troupe.Start(ctx, troupe.Config{Name: name, Listen: []string{"tcp://127.0.0.1:0"}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), HeartbeatInterval: 20 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		c, err := troupe.StartCluster(ctx, n, troupe.ClusterConfig{Seeds: seeds})
		if err != nil {
			t.Fatal(err)
		}
		return n, c
	}
	first, c1 := start("first")
	defer first.Close()
	defer c1.Close()
	second, c2 := start("second", first.Addrs()[0].String())
	defer second.Close()
	defer c2.Close()
	gone := second.Addrs()[0].String()
	for len(c1.Members()) != 2 || c1.Members()[0].Status != troupe.MemberUp || c1.Members()[1].Status != troupe.MemberUp {
		if ctx.Err() != nil {
			t.Fatal("the two members never came up")
		}
		time.Sleep(10 * time.Millisecond)
	}
	var out, errOut bytes.Buffer
	if code := run(ctx, []string{"down", "tcp://127.0.0.1:1", "--node", first.Addrs()[0].String()}, &out, &errOut); code != 1 || !strings.Contains(errOut.String(), "no such cluster member") || strings.Count(errOut.String(), "\n") != 1 {
		t.Fatalf("down of a non-member: exit %d, %q", code, errOut.String())
	}
	if code := run(ctx, []string{"down", gone, "--node", first.Addrs()[0].String()}, &out, &errOut); code != 0 || !strings.Contains(out.String(), "is down") {
		t.Fatalf("down: exit %d, %q %q", code, out.String(), errOut.String())
	}
	select {
	case <-c2.Done():
	case <-ctx.Done():
		t.Fatal("the downed member never stopped")
	}
	if err := c2.Err(); !errors.Is(err, troupe.ErrMemberDowned) {
		t.Fatalf("the downed member's Err() = %v", err)
	}
}

func TestPeersActorsStats(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	a, err := troupe.Start(ctx, troupe.Config{Name: "alpha", AppVersion: "alpha-1.0", Listen: []string{"tcp://127.0.0.1:0"}, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := troupe.Start(ctx, troupe.Config{Name: "beta", AppVersion: "beta-2.0", Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if _, err := troupe.Spawn(a, "echo", troupe.Behavior[string]{Receive: func(*troupe.Context[string], string) {}}); err != nil {
		t.Fatal(err)
	}
	if _, err := troupe.Resolve[string](ctx, b, troupe.FormatRef(a.Addrs()[0], "/user/echo")); err != nil {
		t.Fatal(err)
	}
	node := a.Addrs()[0].String()
	run1 := func(args ...string) (string, string, int) {
		var out, errOut bytes.Buffer
		code := run(ctx, args, &out, &errOut)
		return out.String(), errOut.String(), code
	}
	if out, errOut, code := run1("peers", "--node", node); code != 0 || !strings.Contains(out, "beta") || !strings.Contains(out, "beta-2.0") || !strings.Contains(out, "WINDOW LEFT") {
		t.Fatalf("peers: exit %d\n%s%s", code, out, errOut)
	}
	if out, errOut, code := run1("actors", "--node", node); code != 0 || !strings.Contains(out, "/user/echo") || !strings.Contains(out, "/system/stats") {
		t.Fatalf("actors: exit %d\n%s%s", code, out, errOut)
	}
	if out, errOut, code := run1("stats", "--node", node); code != 0 || !strings.Contains(out, "alpha") || !strings.Contains(out, "peers") || !strings.Contains(out, "alpha-1.0") {
		t.Fatalf("stats: exit %d\n%s%s", code, out, errOut)
	}
	out, _, code := run1("stats", "--node", node, "--json")
	var doc map[string]any
	if code != 0 || json.Unmarshal([]byte(out), &doc) != nil || doc["name"] != "alpha" {
		t.Fatalf("stats --json: exit %d\n%s", code, out)
	}
	if _, errOut, code := run1("peers", "--node", "127.0.0.1:1", "--timeout", "3s"); code != 1 || strings.Count(errOut, "\n") != 1 {
		t.Fatalf("peers of nobody: exit %d, %q", code, errOut)
	}
	if _, errOut, code := run1("actors"); code != 2 || !strings.Contains(errOut, "--node is required") {
		t.Fatalf("actors without --node: exit %d, %q", code, errOut)
	}
}

// lockedBuffer is a bytes.Buffer that a command and a test share.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func TestWatchStreamsRegistrations(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	reg, err := troupe.Start(ctx, troupe.Config{Name: "reg", RegistryAddrs: []string{"127.0.0.1:0"}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	wctx, stop := context.WithCancel(ctx)
	var out lockedBuffer
	done := make(chan int)
	go func() {
		done <- run(wctx, []string{"watch", "--registry", reg.Addrs()[0].String(), "--interval", "20ms"}, &out, io.Discard)
	}()
	waitOut := func(want string) {
		for !strings.Contains(out.String(), want) {
			if ctx.Err() != nil {
				t.Fatalf("watch never printed %q:\n%s", want, out.String())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	billing, err := troupe.Spawn(reg, "billing", troupe.Behavior[string]{Receive: func(*troupe.Context[string], string) {}})
	if err != nil {
		t.Fatal(err)
	}
	waitOut("+ billing ")
	reg.Stop(billing)
	waitOut("- billing ")
	stop()
	if code := <-done; code != 0 {
		t.Fatalf("watch exited %d", code)
	}
}

// TestLsQueryWatchAgainstEtcd points ls, query and watch at an etcd
// registry: the one .ci/run starts (TROUPE_ETCD_ENDPOINT), else skipped.
func TestLsQueryWatchAgainstEtcd(t *testing.T) {
	t.Parallel()
	ep := os.Getenv("TROUPE_ETCD_ENDPOINT")
	if ep == "" {
		ep = "http://127.0.0.1:2379"
	}
	if resp, err := (&http.Client{Timeout: time.Second}).Get(ep + "/version"); err != nil {
		t.Skipf("no etcd at %s (.ci/run starts one): %v", ep, err)
	} else {
		resp.Body.Close()
	}
	url := "etcd://" + strings.TrimPrefix(ep, "http://") + fmt.Sprintf("/troupe-cli-%d", time.Now().UnixNano())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	svc, err := troupe.Start(ctx, troupe.Config{Name: "svc-node", RegistryAddrs: []string{url}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()
	if _, err := troupe.Spawn(svc, "billing", troupe.Behavior[string]{Receive: func(*troupe.Context[string], string) {}}); err != nil {
		t.Fatal(err)
	}
	var stdout bytes.Buffer
	if code := run(ctx, []string{"ls", "--registry", url}, &stdout, io.Discard); code != 0 || !strings.Contains(stdout.String(), "/user/billing") {
		t.Fatalf("ls: exit %d:\n%s", code, stdout.String())
	}
	stdout.Reset()
	if code := run(ctx, []string{"query", "billing", "--registry", url}, &stdout, io.Discard); code != 0 || strings.TrimSpace(stdout.String()) != svc.Addrs()[0].String() {
		t.Fatalf("query: exit %d, %q", code, stdout.String())
	}
	out := &lineWriter{lines: make(chan string, 8)}
	wctx, wcancel := context.WithCancel(ctx)
	exited := make(chan int, 1)
	go func() {
		// (An hour: were etcd polled, the changes below would not show.)
		exited <- run(wctx, []string{"watch", "--registry", url, "--interval", "1h"}, out, io.Discard)
	}()
	for seen := 0; seen < 2; {
		select {
		case l := <-out.lines:
			if strings.HasPrefix(l, "+ ") {
				seen++
			}
		case <-ctx.Done():
			t.Fatal("watch printed no registrations")
		}
	}
	later, err := troupe.Spawn(svc, "later", troupe.Behavior[string]{Receive: func(*troupe.Context[string], string) {}})
	if err != nil {
		t.Fatal(err)
	}
	await := func(prefix string) {
		t.Helper()
		for {
			select {
			case l := <-out.lines:
				if strings.HasPrefix(l, prefix) {
					return
				}
			case <-ctx.Done():
				t.Fatalf("watch printed no %q line: etcd's changes are not pushed", prefix)
			}
		}
	}
	await("+ later ")
	svc.Stop(later)
	await("- later ")
	wcancel()
	if code := <-exited; code != 0 {
		t.Fatalf("watch exited %d", code)
	}
}

// troupe registrar --http serves the registrar's debug page, metrics and
// expvar, and stops serving with it.
func TestRegistrarServesHTTP(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out := &lineWriter{lines: make(chan string, 8)}
	exited := make(chan int, 1)
	go func() {
		exited <- run(ctx, []string{"registrar", "--addr", "127.0.0.1:0", "--http", "127.0.0.1:0"}, out, io.Discard)
	}()
	var base string
	for base == "" {
		select {
		case line := <-out.lines:
			if u, ok := strings.CutPrefix(line, "registrar serving HTTP on "); ok {
				base = u
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the registrar printed no HTTP address")
		}
	}
	get := func(path string) string {
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %s", path, resp.Status)
		}
		return string(b)
	}
	if m := get("/metrics"); !strings.Contains(m, "troupe_registrations ") || !strings.Contains(m, "troupe_build_info{") {
		t.Fatalf("/metrics:\n%s", m)
	}
	if p := get("/debug/troupe"); !strings.Contains(p, "troupe node registrar") || !strings.Contains(p, "registrar of ") {
		t.Fatalf("/debug/troupe:\n%s", p)
	}
	var vars struct {
		Troupe struct {
			Name string `json:"name"`
		} `json:"troupe"`
		Memstats map[string]any `json:"memstats"`
	}
	if v := get("/debug/vars"); json.Unmarshal([]byte(v), &vars) != nil || vars.Troupe.Name != "registrar" || len(vars.Memstats) == 0 {
		t.Fatalf("/debug/vars:\n%s", v)
	}
	cancel()
	if code := <-exited; code != 0 {
		t.Fatalf("registrar exited %d", code)
	}
	if _, err := http.Get(base + "/metrics"); err == nil {
		t.Fatal("the HTTP server still answers after the registrar stopped")
	}
}
