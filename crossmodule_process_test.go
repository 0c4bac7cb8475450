//go:build unix

package troupe_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

// The promise of "Use it in your module": nothing in the package depends
// on its import path, so programs whose copies of troupe live at
// different module paths — and the command line, built from this module
// — form one cluster and speak troupe's own protocols to each other.

// crossModuleMain is the program each copy runs: a cluster member with a
// singleton, a sharded entity kind, a topic and a service key. It says
// STARTED once it made them, and uses them once standard input says go;
// it prints what it saw, one line each, then DONE, and DOWNED if it is
// downed; it closes its node when standard input ends. Its arguments are
// its name and the address of a seed ("-" for none).
const crossModuleMain = `package main

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"time"

	"IMPORT"
)

type Job struct {
	ID      string
	ReplyTo troupe.Ref[string]
}

type News struct {
	From string
	Ack  troupe.Ref[string]
}

func init() {
	troupe.SetWireKey[Job]("crossmodule.job")
	troupe.SetWireKey[News]("crossmodule.news")
}

func fail(what string, err error) {
	fmt.Println("ERR", what, err)
	os.Exit(1)
}

// answer is a behavior that replies with this node's name and tag.
func answer(name, tag string) troupe.Behavior[Job] {
	return troupe.Behavior[Job]{Receive: func(_ *troupe.Context[Job], j Job) { j.ReplyTo.Tell(tag + "@" + name) }}
}

func ask(ctx context.Context, to troupe.Ref[Job], id string) string {
	got, err := troupe.Ask(ctx, to, func(r troupe.Ref[string]) Job { return Job{ID: id, ReplyTo: r} })
	if err != nil {
		fail("ask "+id, err)
	}
	return got
}

func main() {
	name, seed := os.Args[1], os.Args[2]
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	n, err := troupe.Start(ctx, troupe.Config{Name: name, Listen: []string{"127.0.0.1:0"}, HeartbeatInterval: 100 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))})
	if err != nil {
		fail("start", err)
	}
	proceed := make(chan struct{})
	go func() {
		in := bufio.NewScanner(os.Stdin)
		for in.Scan() {
			if in.Text() == "go" {
				close(proceed)
			}
		}
		n.Close()
		os.Exit(0)
	}()
	events := make(chan troupe.MemberEvent, 256)
	troupe.SubscribeChan(n, events)
	var seeds []string
	if seed != "-" {
		seeds = []string{seed}
	}
	c, err := troupe.StartCluster(ctx, n, troupe.ClusterConfig{Seeds: seeds, StableAfter: 500 * time.Millisecond})
	if err != nil {
		fail("cluster", err)
	}
	fmt.Println("READY", n.Addrs()[0])
	for {
		up := 0
		for _, m := range c.Members() {
			if m.Status == troupe.MemberUp {
				up++
			}
		}
		if up == 2 {
			break
		}
		select {
		case <-events:
		case <-ctx.Done():
			fail("two members up", ctx.Err())
		}
	}

	// Topic: a subscriber that acknowledges what the other member
	// publishes, and a publisher that publishes until the other member's
	// subscriber acknowledges.
	news := troupe.Topic[News]{Name: "news"}
	reader, err := troupe.Spawn(n, "reader", troupe.Behavior[News]{Receive: func(_ *troupe.Context[News], m News) {
		if m.From != name {
			m.Ack.Tell(name)
		}
	}})
	if err != nil {
		fail("spawn reader", err)
	}
	if err := news.Subscribe(n, reader); err != nil {
		fail("subscribe", err)
	}
	acks := make(chan string, 64)
	ack, err := troupe.Spawn(n, "acks", troupe.Behavior[string]{Receive: func(_ *troupe.Context[string], from string) { acks <- from }})
	if err != nil {
		fail("spawn acks", err)
	}

	// Service key: a worker on each member; wait for both.
	workers := troupe.ServiceKey[Job]{Name: "workers"}
	worker, err := troupe.Spawn(n, "worker", answer(name, "service"))
	if err != nil {
		fail("spawn worker", err)
	}
	if err := workers.Register(n, worker); err != nil {
		fail("register service", err)
	}

	// Singleton and sharding.
	boss, err := troupe.Singleton(c, "boss", func() troupe.Behavior[Job] { return answer(name, "singleton") }, troupe.SingletonConfig{})
	if err != nil {
		fail("singleton", err)
	}
	jobs, err := troupe.Sharding(c, "jobs", func(id string) troupe.Behavior[Job] { return answer(name, "entity-"+id) }, troupe.ShardingConfig{Shards: 16})
	if err != nil {
		fail("sharding", err)
	}

	// Every member runs its singleton's and its sharding's station
	// before any sends: a message to a station not yet made on the
	// oldest member is a dead letter.
	fmt.Println("STARTED")
	select {
	case <-proceed:
	case <-ctx.Done():
		fail("waiting for go", ctx.Err())
	}

	fmt.Println("SINGLETON", ask(ctx, boss, "boss"))
	for i := range 8 {
		id := fmt.Sprint("e", i)
		fmt.Println("ENTITY", ask(ctx, jobs.Entity(id), id))
	}

	wctx, stop := context.WithCancel(ctx)
	var listing []troupe.Ref[Job]
	workers.Watch(wctx, n, func(refs []troupe.Ref[Job]) {
		if len(refs) == 2 {
			listing = refs
			stop()
		}
	})
	if len(listing) != 2 {
		fail("two workers", ctx.Err())
	}
	var got []string
	for _, r := range listing {
		got = append(got, ask(ctx, r, "work"))
	}
	slices.Sort(got)
	fmt.Println("SERVICE", got[0], got[1])

	for heard := ""; heard == ""; {
		if err := news.Publish(ctx, n, News{From: name, Ack: ack}); err != nil {
			fail("publish", err)
		}
		select {
		case heard = <-acks:
			fmt.Println("TOPIC", heard)
		case <-time.After(200 * time.Millisecond): // the other member's relay is not listed here yet
		case <-ctx.Done():
			fail("topic", ctx.Err())
		}
	}

	// The cluster's own control protocol, between the two copies: the
	// other member answers that 127.0.0.1:1 is no member.
	for _, m := range c.Members() {
		if m.UID != n.UID() {
			fmt.Println("DOWNMEMBER", n.DownMember(ctx, m.Addr.String(), "127.0.0.1:1"))
		}
	}
	fmt.Println("DONE")
	<-c.Done()
	fmt.Println("DOWNED", c.Err())
	n.Close()
	select {}
}
`

// crossModuleEnv is the go command's environment for the builds: offline,
// outside any workspace. The copies build with -trimpath, so that the
// build cache serves every run after the first (which builds the standard
// library once that way: slow) though each run's directory is new.
func crossModuleEnv() []string {
	return append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod", "GOPROXY=off")
}

// buildCopy builds program (IMPORT in it is the package's path) in a new
// module at module whose copy of the package (its non-test .go files)
// lives at module/pkg, and returns the binary. edit, if not nil, edits
// each file of the copy.
func buildCopy(dir, module, pkg, program string, edit func(name string, src []byte) ([]byte, error)) (string, []byte, error) {
	bin := filepath.Join(dir, "app")
	files, err := filepath.Glob("*.go")
	if err != nil {
		return bin, nil, err
	}
	if err := os.MkdirAll(filepath.Join(dir, pkg), 0o755); err != nil {
		return bin, nil, err
	}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			return bin, nil, err
		}
		if edit != nil {
			if b, err = edit(f, b); err != nil {
				return bin, nil, err
			}
		}
		if err := os.WriteFile(filepath.Join(dir, pkg, f), b, 0o644); err != nil {
			return bin, nil, err
		}
	}
	mod, err := os.ReadFile("go.mod")
	if err != nil {
		return bin, nil, err
	}
	sum, err := os.ReadFile("go.sum")
	if err != nil {
		return bin, nil, err
	}
	// The copy's go.mod is this one's, under the program's module path.
	mod = regexp.MustCompile(`(?m)^module .*$`).ReplaceAll(mod, []byte("module "+module))
	main := strings.Replace(program, "IMPORT", module+"/"+pkg, 1)
	for name, b := range map[string][]byte{"go.mod": mod, "go.sum": sum, "main.go": []byte(main)} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			return bin, nil, err
		}
	}
	cmd := exec.Command("go", "build", "-trimpath", "-o", bin, ".")
	cmd.Dir, cmd.Env = dir, crossModuleEnv()
	out, err := cmd.CombinedOutput()
	return bin, out, err
}

// buildAll runs the builds at once (two cores or more make it quicker)
// and returns their binaries; a build that fails fails t, or skips it
// when the module cache lacks golang.org/x/sys.
func buildAll(t *testing.T, builds ...func() (string, []byte, error)) []string {
	t.Helper()
	var wg sync.WaitGroup
	bins := make([]string, len(builds))
	errs := make([]string, len(builds))
	for i, b := range builds {
		wg.Go(func() {
			bin, out, err := b()
			if err != nil {
				errs[i] = fmt.Sprintf("%s: %v\n%s", bin, err, out)
			}
			bins[i] = bin
		})
	}
	wg.Wait()
	for _, e := range errs {
		if e != "" {
			if regexp.MustCompile(`module lookup disabled|cannot find module|missing go.sum`).MatchString(e) {
				t.Skipf("the builds need golang.org/x/sys in the module cache:\n%s", e)
			}
			t.Fatalf("build %s", e)
		}
	}
	return bins
}

// crossModuleProcess is one program running its copy of the package.
type crossModuleProcess struct {
	name  string
	addr  string
	stdin io.WriteCloser
	lines chan string
	said  []string // the lines read so far
}

func startCrossModule(t *testing.T, bin, name, seed string) *crossModuleProcess {
	t.Helper()
	p := &crossModuleProcess{name: name, lines: make(chan string, 64)}
	var err error
	cmd := exec.Command(bin, name, seed)
	cmd.Stderr = os.Stderr
	p.stdin, err = cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waited := make(chan struct{})
	go func() {
		in := bufio.NewScanner(stdout)
		for in.Scan() {
			p.lines <- in.Text()
		}
		close(p.lines)
		cmd.Wait()
		close(waited)
	}()
	t.Cleanup(func() {
		p.stdin.Close() // the program closes its node and exits
		select {
		case <-waited:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-waited
		}
	})
	p.addr = strings.TrimPrefix(p.await(t, "READY "), "READY ")
	return p
}

// await reads the program's lines until one starts with prefix, and
// returns it; a line starting with ERR, or the program's end, fails t.
func (p *crossModuleProcess) await(t *testing.T, prefix string) string {
	t.Helper()
	deadline := time.After(40 * time.Second)
	for {
		select {
		case l, ok := <-p.lines:
			if !ok {
				t.Fatalf("%s ended; it said %q", p.name, p.said)
			}
			p.said = append(p.said, l)
			if strings.HasPrefix(l, "ERR") {
				t.Fatalf("%s: %s (it said %q)", p.name, l, p.said)
			}
			if strings.HasPrefix(l, prefix) {
				return l
			}
		case <-deadline:
			t.Fatalf("%s did not say %q within 40 s; it said %q", p.name, prefix, p.said)
		}
	}
}

// saidLines returns the lines the program said that start with prefix.
func (p *crossModuleProcess) saidLines(prefix string) []string {
	var out []string
	for _, l := range p.said {
		if strings.HasPrefix(l, prefix) {
			out = append(out, strings.TrimPrefix(l, prefix))
		}
	}
	return out
}

// Two programs, each with its copy of the package at its own module path,
// form a cluster and use a singleton, sharding, a topic and a service key
// across it; DownMember works from each to the other, and the command
// line's stats, peers, actors, quarantine, schema and down work against
// both. Before troupe named its own types without their package path,
// the cluster's control protocol was "example.com/alpha/internal/troupe.clusterMsg"
// on one and "troupe.clusterMsg" to the command line: DownMember and
// troupe down failed with ErrWrongType.
func TestCopiesAtTwoModulePathsFormOneCluster(t *testing.T) {
	longRun(t)
	needGo(t)
	here, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	// Three builds at once: two copies, and the command line from this
	// module (whose package path is "troupe").
	cli := filepath.Join(dir, "troupe")
	bins := buildAll(t,
		func() (string, []byte, error) {
			return buildCopy(filepath.Join(dir, "alpha"), "example.com/alpha", "internal/troupe", crossModuleMain, nil)
		},
		func() (string, []byte, error) {
			return buildCopy(filepath.Join(dir, "beta"), "example.org/beta", "troupe", crossModuleMain, nil)
		},
		func() (string, []byte, error) {
			cmd := exec.Command("go", "build", "-o", cli, "./cmd/troupe")
			cmd.Dir, cmd.Env = here, crossModuleEnv()
			out, err := cmd.CombinedOutput()
			return cli, out, err
		})
	alphaBin, betaBin := bins[0], bins[1]

	alpha := startCrossModule(t, alphaBin, "alpha", "-")
	beta := startCrossModule(t, betaBin, "beta", alpha.addr)
	for _, p := range []*crossModuleProcess{alpha, beta} {
		p.await(t, "STARTED")
	}
	for _, p := range []*crossModuleProcess{alpha, beta} {
		fmt.Fprintln(p.stdin, "go")
	}
	for _, p := range []*crossModuleProcess{alpha, beta} {
		p.await(t, "DONE")
	}
	for _, p := range []*crossModuleProcess{alpha, beta} {
		other := "beta"
		if p == beta {
			other = "alpha"
		}
		if got := p.saidLines("DOWNMEMBER "); len(got) != 1 || !strings.Contains(got[0], "no such cluster member") {
			t.Errorf("%s: DownMember at %s of a non-member answered %q, want the member's no-such-cluster-member answer", p.name, other, got)
		}
		if got := p.saidLines("SERVICE "); len(got) != 1 || got[0] != "service@alpha service@beta" {
			t.Errorf("%s: the service key's actors answered %q, want one on each member", p.name, got)
		}
		if got := p.saidLines("TOPIC "); len(got) != 1 || got[0] != other {
			t.Errorf("%s: the topic's other subscriber acknowledged %q, want %s", p.name, got, other)
		}
	}
	// One singleton, on the oldest member, answers both. Every entity
	// answers both, each from one of the members (a shard may move
	// between the two asks), one at least from the other member.
	if a, b := alpha.saidLines("SINGLETON "), beta.saidLines("SINGLETON "); len(a) != 1 || len(b) != 1 || a[0] != "singleton@alpha" || b[0] != a[0] {
		t.Errorf("the singleton answered alpha %q and beta %q, want singleton@alpha to both", a, b)
	}
	crossed := 0
	for _, p := range []*crossModuleProcess{alpha, beta} {
		got := p.saidLines("ENTITY ")
		for i, g := range got {
			id, where, _ := strings.Cut(g, "@")
			if id != fmt.Sprint("entity-e", i) || where != "alpha" && where != "beta" {
				t.Errorf("%s: entity e%d answered %q", p.name, i, g)
			}
			if where != p.name {
				crossed++
			}
		}
		if len(got) != 8 {
			t.Errorf("%s: %d entities answered, want 8: %q", p.name, len(got), got)
		}
	}
	if crossed == 0 {
		t.Errorf("every entity answered from the member that asked: alpha %q, beta %q", alpha.saidLines("ENTITY "), beta.saidLines("ENTITY "))
	}

	// The command line, against both.
	troupeCLI := func(args ...string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, cli, append(args, "--timeout", "15s")...)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	for _, p := range []*crossModuleProcess{alpha, beta} {
		other := beta
		if p == beta {
			other = alpha
		}
		for _, c := range []struct {
			args []string
			want string
		}{
			{[]string{"stats"}, "member"},
			{[]string{"peers"}, other.addr},
			{[]string{"actors"}, "/system/cluster"},
			{[]string{"quarantine", "ls"}, "CAUSE"},
			{[]string{"schema"}, "crossmodule.job"},
		} {
			out, err := troupeCLI(append(c.args, "--node", p.addr)...)
			if err != nil || !strings.Contains(out, c.want) {
				t.Errorf("troupe %s --node %s (%s): %v, want %q in:\n%s", strings.Join(c.args, " "), p.addr, p.name, err, c.want, out)
			}
		}
	}
	if out, err := troupeCLI("schema", "diff", "--node", alpha.addr, "--node", beta.addr); err != nil || !strings.Contains(out, "types the same") {
		t.Errorf("troupe schema diff of the two copies: %v\n%s", err, out)
	}
	if out, err := troupeCLI("down", beta.addr, "--node", alpha.addr); err != nil || !strings.Contains(out, "is down") {
		t.Fatalf("troupe down %s --node %s: %v\n%s", beta.addr, alpha.addr, err, out)
	}
	beta.await(t, "DOWNED")
}

// earlierCopyMain is a cluster member alone, which asks the member at each
// address standard input gives it to down 127.0.0.1:1, and prints the
// answer.
const earlierCopyMain = `package main

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"IMPORT"
)

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	n, err := troupe.Start(ctx, troupe.Config{Name: os.Args[1], Listen: []string{"127.0.0.1:0"},
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))})
	if err != nil {
		fmt.Println("ERR", err)
		return
	}
	defer n.Close()
	if _, err := troupe.StartCluster(ctx, n, troupe.ClusterConfig{StableAfter: 500 * time.Millisecond}); err != nil {
		fmt.Println("ERR", err)
		return
	}
	fmt.Println("READY", n.Addrs()[0])
	for in := bufio.NewScanner(os.Stdin); in.Scan(); {
		fmt.Println("DOWNMEMBER", n.DownMember(ctx, in.Text(), "127.0.0.1:1"))
	}
}
`

// A copy of the package made before troupe's own types were named
// without its path names them by it ("example.com/alpha/internal/troupe.clusterMsg"):
// a program that updates its copy, at the same path, still resolves the
// earlier build's cluster actor, and the earlier build its, so a rolling
// upgrade of the program keeps DownMember. The earlier copy is this one
// with protocolName as it was.
func TestACopyAndAnEarlierCopyAtOnePathResolveEachOther(t *testing.T) {
	longRun(t)
	needGo(t)
	dir := t.TempDir()
	earlier := func(name string, src []byte) ([]byte, error) {
		if name != "codec.go" {
			return src, nil
		}
		const now, then = "\treturn typeName(t)\n}", "\treturn legacyTypeName(t)\n}"
		if !strings.Contains(string(src), now) {
			return nil, fmt.Errorf("codec.go's protocolName has no %q to make it the earlier one", now)
		}
		return []byte(strings.Replace(string(src), now, then, 1)), nil
	}
	bins := buildAll(t,
		func() (string, []byte, error) {
			return buildCopy(filepath.Join(dir, "now"), "example.com/alpha", "internal/troupe", earlierCopyMain, nil)
		},
		func() (string, []byte, error) {
			return buildCopy(filepath.Join(dir, "then"), "example.com/alpha", "internal/troupe", earlierCopyMain, earlier)
		})
	now := startCrossModule(t, bins[0], "now", "-")
	then := startCrossModule(t, bins[1], "then", "-")
	for _, c := range []struct{ from, to *crossModuleProcess }{{now, then}, {then, now}} {
		fmt.Fprintln(c.from.stdin, c.to.addr)
		if got := c.from.await(t, "DOWNMEMBER "); !strings.Contains(got, "no such cluster member") {
			t.Errorf("DownMember from %s at %s of a non-member: %q, want the member's no-such-cluster-member answer", c.from.name, c.to.name, got)
		}
	}
}
