package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	"troupe"
)

// Flags may come before the command name, as the README says.
func TestFlagsBeforeTheCommandName(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	reg, err := troupe.Start(ctx, troupe.Config{Name: "reg", RegistryAddrs: []string{"127.0.0.1:0"}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	if _, err := troupe.Spawn(reg, "billing", troupe.Behavior[string]{Receive: func(*troupe.Context[string], string) {}}); err != nil {
		t.Fatal(err)
	}
	addr := reg.Addrs()[0].String()
	for _, args := range [][]string{
		{"--registry", addr, "--json", "query", "billing"},
		{"--json", "query", "--registry=" + addr, "billing"},
		{"query", "billing", "--registry", addr, "--json"},
	} {
		var out, errOut bytes.Buffer
		var q queryResult
		if code := run(ctx, args, &out, &errOut); code != 0 || json.Unmarshal(out.Bytes(), &q) != nil || q.Registration.Name != "billing" {
			t.Fatalf("%v: exit %d, %q %q", args, code, out.String(), errOut.String())
		}
	}
}

// Help lists flags as they are written, with two dashes.
func TestHelpWritesFlagsWithTwoDashes(t *testing.T) {
	t.Parallel()
	for _, cmd := range commands {
		if cmd.name == "version" {
			continue
		}
		var out bytes.Buffer
		run(context.Background(), []string{cmd.name, "--help"}, &out, io.Discard)
		if !strings.Contains(out.String(), "\n  --secret-file FILE\n") || strings.Contains(out.String(), "\n  -") && !strings.Contains(out.String(), "\n  --") {
			t.Fatalf("%s --help:\n%s", cmd.name, out.String())
		}
		for _, line := range strings.Split(out.String(), "\n") {
			if strings.HasPrefix(line, "  -") && !strings.HasPrefix(line, "  --") {
				t.Fatalf("%s --help writes a flag with one dash: %q", cmd.name, line)
			}
		}
	}
}

// The same mistake gets the same exit code on every command: 2 for an
// unknown flag, and for a missing --node where one is required.
func TestExitCodesAreTheSameEverywhere(t *testing.T) {
	// Not beside other tests: it sets environment variables (t.Setenv),
	// which belong to the whole process.
	t.Setenv("TROUPE_NODE", "")
	for _, cmd := range commands {
		var errOut bytes.Buffer
		if code := run(context.Background(), []string{cmd.name, "--no-such-flag"}, io.Discard, &errOut); code != 2 || !strings.Contains(errOut.String(), "usage:") ||
			!strings.Contains(errOut.String(), "troupe "+cmd.name+": unknown flag --no-such-flag\n") {
			t.Errorf("%s --no-such-flag: exit %d, %q; want 2, the flag as it is written and the usage", cmd.name, code, errOut.String())
		}
	}
	// A mistyped address is a usage error whichever flag holds it, said
	// once, in the command's words (#55: ls said 2, peers 1, registrar
	// named a Config field, and the messages stuttered).
	for _, args := range [][]string{
		{"ls", "--registry", "garbage"}, {"query", "x", "--registry", "garbage"}, {"watch", "--registry", "garbage"},
		{"peers", "--node", "garbage"}, {"actors", "--node", "garbage"}, {"stats", "--node", "garbage"},
		{"down", "tcp://127.0.0.1:1", "--node", "garbage"}, {"quarantine", "ls", "--node", "garbage"},
		{"schema", "--node", "garbage"}, {"registrar", "--addr", "garbage"}, {"down", "garbage", "--node", "127.0.0.1:1"},
	} {
		var errOut bytes.Buffer
		code := run(context.Background(), args, io.Discard, &errOut)
		msg := errOut.String()
		if code != 2 || !strings.Contains(msg, `"garbage" is not an address: missing port in address`) || strings.Count(msg, "garbage") != 1 ||
			strings.Contains(msg, "troupe: ") || strings.Contains(msg, "RegistryAddrs") {
			t.Errorf("%v: exit %d, %q; want 2 and one clear line", args, code, msg)
		}
	}
	for _, args := range [][]string{{"peers"}, {"actors"}, {"stats"}, {"down", "tcp://127.0.0.1:1"}, {"quarantine", "ls"}, {"schema"}} {
		var errOut bytes.Buffer
		if code := run(context.Background(), args, io.Discard, &errOut); code != 2 || !strings.Contains(errOut.String(), "--node") {
			t.Errorf("%v without --node: exit %d, %q; want 2 naming --node", args, code, errOut.String())
		}
	}
}

// Pointed at an HTTP port, a command says that what answers there does
// not speak troupe, instead of suggesting a registrar be started on that
// busy port (#55).
func TestAnHTTPPortIsNamedAsOne(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.NotFoundHandler())
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")
	for _, args := range [][]string{{"ls", "--registry", addr}, {"stats", "--node", addr}} {
		var errOut bytes.Buffer
		code := run(context.Background(), append(args, "--timeout", "10s"), io.Discard, &errOut)
		if msg := errOut.String(); code != 1 || !strings.Contains(msg, "does not speak troupe's protocol") || strings.Contains(msg, "troupe registrar --addr") {
			t.Errorf("%v: exit %d, %q; want 1 and that the port does not speak troupe", args, code, msg)
		}
	}
}

// Interrupted (Ctrl-C) while it waits for a node that never answers, a
// command exits 130 and says it was interrupted, without blaming the
// address.
func TestInterruptedExits130(t *testing.T) {
	t.Parallel()
	l := silentListener(t)
	for _, args := range [][]string{{"peers", "--node", l.Addr().String()}, {"ls", "--registry", l.Addr().String()}} {
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(200*time.Millisecond, cancel)
		var errOut bytes.Buffer
		code := run(ctx, append(args, "--timeout", "30s"), io.Discard, &errOut)
		if code != 130 || strings.TrimSpace(errOut.String()) != "troupe "+args[0]+": interrupted" {
			t.Fatalf("%v interrupted: exit %d, %q; want 130 and one line saying interrupted", args, code, errOut.String())
		}
	}
}

// stats prints the deepest mailboxes, as its help says; peers and stats
// print uids whole; errors do not say "troupe" twice.
func TestStatsShowsDeepestMailboxesAndWholeUIDs(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	a, err := troupe.Start(ctx, troupe.Config{Name: "alpha", Listen: []string{"tcp://127.0.0.1:0"}, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	release, started := make(chan struct{}), make(chan struct{}, 1)
	defer close(release)
	slow, err := troupe.Spawn(a, "slow", troupe.Behavior[int]{Receive: func(*troupe.Context[int], int) {
		select {
		case started <- struct{}{}:
		default:
		}
		<-release
	}})
	if err != nil {
		t.Fatal(err)
	}
	slow.Tell(0)
	<-started
	for i := 1; i <= 3; i++ {
		slow.Tell(i)
	}
	var out, errOut bytes.Buffer
	if code := run(ctx, []string{"stats", "--node", a.Addrs()[0].String()}, &out, &errOut); code != 0 {
		t.Fatalf("stats: exit %d, %s", code, errOut.String())
	}
	if !strings.Contains(out.String(), "deepest mailboxes") || !strings.Contains(out.String(), "/user/slow 3 waiting") || !strings.Contains(out.String(), a.UID().String()) {
		t.Fatalf("stats does not show the deepest mailbox and the whole uid:\n%s", out.String())
	}
	if !strings.Contains(out.String(), "observer") {
		t.Fatalf("stats does not count the command as an observer:\n%s", out.String())
	}
	errOut.Reset()
	run(ctx, []string{"query", "nobody", "--registry", "127.0.0.1:1"}, io.Discard, &errOut)
	if strings.Contains(errOut.String(), "troupe: ") {
		t.Fatalf("an error says troupe twice: %q", errOut.String())
	}
}

// watch --json prints one JSON object a line, and a removal names the
// node the entry belonged to.
func TestWatchJSON(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	reg, err := troupe.Start(ctx, troupe.Config{Name: "reg", RegistryAddrs: []string{"127.0.0.1:0"}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	pr, pw := io.Pipe()
	done := make(chan int, 1)
	go func() {
		done <- run(wctx, []string{"watch", "--json", "--registry", reg.Addrs()[0].String(), "--interval", "20ms"}, pw, io.Discard)
		pw.Close()
	}()
	lines := bufio.NewScanner(pr)
	next := func(op, name string) watchEvent {
		t.Helper()
		for lines.Scan() {
			var e watchEvent
			if err := json.Unmarshal(lines.Bytes(), &e); err != nil {
				t.Fatalf("watch --json printed %q: %v", lines.Text(), err)
			}
			if e.Op == op && e.Registration.Name == name {
				return e
			}
		}
		t.Fatalf("watch --json ended before %s %s", op, name)
		return watchEvent{}
	}
	billing, err := troupe.Spawn(reg, "billing", troupe.Behavior[string]{Receive: func(*troupe.Context[string], string) {}})
	if err != nil {
		t.Fatal(err)
	}
	if e := next("+", "billing"); e.Registration.NodeName != "reg" || e.Registration.UUID == "" {
		t.Fatalf("+ billing = %+v", e)
	}
	reg.Stop(billing)
	if e := next("-", "billing"); e.Registration.NodeName != "reg" || e.At.IsZero() || e.At.Nanosecond()%int(time.Millisecond) != 0 {
		t.Fatalf("- billing does not name its node, or its time to the millisecond: %+v", e)
	}
	// A node that leaves takes its entries with it, printed in name order
	// (#55: they came in map order).
	leaver, err := troupe.Start(ctx, troupe.Config{Name: "leaver", RegistryAddrs: []string{reg.Addrs()[0].String()}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	names := []string{"w5", "w3", "w1", "w4", "w2"}
	for _, name := range names {
		if _, err := troupe.Spawn(leaver, name, troupe.Behavior[string]{Receive: func(*troupe.Context[string], string) {}}); err != nil {
			t.Fatal(err)
		}
		next("+", name)
	}
	leaver.Close()
	var gone []string
	for len(gone) < len(names) {
		if !lines.Scan() {
			t.Fatal("watch --json ended before the leaver's entries went")
		}
		var e watchEvent
		json.Unmarshal(lines.Bytes(), &e)
		if e.Op == "-" && strings.HasPrefix(e.Registration.Name, "w") {
			gone = append(gone, e.Registration.Name)
		}
	}
	if !slices.IsSorted(gone) {
		t.Errorf("the leaver's entries went in the order %v, want name order", gone)
	}
	stop()
	go io.Copy(io.Discard, pr)
	if code := <-done; code != 0 {
		t.Fatalf("watch exited %d after an interrupt; want 0", code)
	}
}

// watch follows a registrar that is replaced at its address: it says the
// first is lost, and goes on with what the second holds.
func TestWatchFollowsARestartedRegistrar(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	first, err := troupe.Start(ctx, troupe.Config{Name: "first", RegistryAddrs: []string{"127.0.0.1:0"}, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	addr := first.Addrs()[0].String()
	if _, err := troupe.Spawn(first, "billing", troupe.Behavior[string]{Receive: func(*troupe.Context[string], string) {}}); err != nil {
		t.Fatal(err)
	}
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	var out, errOut lockedBuffer
	done := make(chan int, 1)
	go func() { done <- run(wctx, []string{"watch", "--registry", addr, "--interval", "50ms"}, &out, &errOut) }()
	waitFor := func(b *lockedBuffer, want string) {
		t.Helper()
		for !strings.Contains(b.String(), want) {
			if ctx.Err() != nil {
				t.Fatalf("watch never printed %q:\n%s\n%s", want, out.String(), errOut.String())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitFor(&out, "+ billing ")
	first.Close()
	waitFor(&errOut, "watching again")
	second, err := troupe.Start(ctx, troupe.Config{Name: "second", RegistryAddrs: []string{addr}, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer second.Close()
	if _, err := troupe.Spawn(second, "shipping", troupe.Behavior[string]{Receive: func(*troupe.Context[string], string) {}}); err != nil {
		t.Fatal(err)
	}
	waitFor(&out, "- billing ")
	waitFor(&out, "+ shipping ")
	stop()
	if code := <-done; code != 0 {
		t.Fatalf("watch exited %d", code)
	}
}

// stats of a registrar says how many registrations it holds, "none" for
// no dead letters, and a blocked cluster in capitals; durations in the
// stats document have no false precision (#55).
func TestStatsSaysWhatAnOperatorLooksFor(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	reg, err := troupe.Start(ctx, troupe.Config{Name: "reg", RegistryAddrs: []string{"127.0.0.1:0"}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	if _, err := troupe.Spawn(reg, "billing", troupe.Behavior[string]{Receive: func(*troupe.Context[string], string) {}}); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	if code := run(ctx, []string{"stats", "--node", reg.Addrs()[0].String()}, &out, &errOut); code != 0 {
		t.Fatalf("stats: exit %d, %s", code, errOut.String())
	}
	for _, want := range []string{`dead letters +none\n`, `registrar +yes, holding 2 registration\(s\)`} { // (the node and billing)
		if !regexp.MustCompile(want).MatchString(out.String()) {
			t.Errorf("stats does not say %q:\n%s", want, out.String())
		}
	}
	out.Reset()
	if code := run(ctx, []string{"stats", "--json", "--node", reg.Addrs()[0].String()}, &out, &errOut); code != 0 {
		t.Fatalf("stats --json: exit %d, %s", code, errOut.String())
	}
	// Durations are numbers of seconds (keys ending in _seconds), rounded
	// to the microsecond at most: a string such as "274.768µs" was hard
	// to plot, and nanoseconds of a moving window are noise.
	var doc struct {
		Peers []struct {
			WindowLeft any       `json:"window_left_seconds"`
			RoundTrip  any       `json:"round_trip_seconds"`
			Since      time.Time `json:"since"`
		} `json:"peers"`
		Runtime struct {
			Uptime any `json:"uptime_seconds"`
			GC     any `json:"gc_pause_p99_seconds"`
		} `json:"runtime"`
	}
	if err := json.Unmarshal(out.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	durs := map[string]any{"uptime_seconds": doc.Runtime.Uptime, "gc_pause_p99_seconds": doc.Runtime.GC}
	for _, p := range doc.Peers {
		durs["window_left_seconds"], durs["round_trip_seconds"] = p.WindowLeft, p.RoundTrip
		if p.Since.Nanosecond()%int(time.Millisecond) != 0 {
			t.Errorf("a peer's since %v is given past the millisecond", p.Since)
		}
	}
	for key, d := range durs {
		secs, ok := d.(float64)
		if !ok {
			t.Errorf("%s is %T %v, want a number of seconds", key, d, d)
			continue
		}
		if us := secs * 1e6; math.Abs(us-math.Round(us)) > 1e-3 {
			t.Errorf("%s %v is given past the microsecond", key, secs)
		}
	}

	var sum bytes.Buffer
	tw := tabwriter.NewWriter(&sum, 0, 4, 2, ' ', 0)
	printSummary(tw, nodeStats{Name: "m", ClusterBlocked: "2 members unreachable and no downing strategy: down them by hand (troupe down)"})
	tw.Flush()
	if !regexp.MustCompile(`cluster +BLOCKED: 2 members unreachable`).MatchString(sum.String()) {
		t.Errorf("a blocked cluster is not shown:\n%s", sum.String())
	}
}
