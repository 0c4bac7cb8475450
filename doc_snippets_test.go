package troupe_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
)

// Every Go block of the README and of the guides in docs/ runs, in a
// module of its own that uses this package as a user's module would:
//
//   - the README's tour (the one block that starts with package main) is
//     built and run to its end by TestReplaceDirective and TestVendoredCopy,
//     which check what it prints;
//   - every other block is a fragment. TestDocSnippetsRun puts each in a
//     function of its own, in a test package, and runs it as a subtest on
//     nodes of its own: the variables the guides say their snippets use
//     (n, node, pingNode, pongNode: nodes of one registry; a and b: two
//     registry addresses, each with its registrar; ctx; t), the message
//     types (Ping, Pong, Quote, Job), and what a fragment looks up
//     (snippetSetups). The functions a fragment declares are called
//     (snippetRunners), and the addresses it spells out for a reader
//     (10.0.0.1, the etcd cluster) are replaced with live ones
//     (snippetAddresses). A fragment passes when it returns without an
//     error, a panic or a hang.

// snippetPrelude is the test package's own file: the types and the
// environment every fragment finds.
const snippetPrelude = `package snippets

import (
	"context"
	"errors"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"testing"
	"time"

	"troupe"
)

type Ping struct {
	N       int
	ReplyTo troupe.Ref[Pong]
}

type Pong struct {
	N    int
	From string
}

type Quote struct{ Price float64 }

type Job struct{ ID int }

// snippetErrOK says whether err is what the guide says the statement
// stmt returns: FindActor of a name nobody registered yet, a watch that
// runs until its context ends.
func snippetErrOK(stmt string, err error) bool {
	switch {
	case strings.Contains(stmt, "troupe.FindActor[Quote](ctx, n, \"data_feed\")"):
		return errors.Is(err, troupe.ErrNotFound)
	case strings.Contains(stmt, ".Watch(ctx"):
		return errors.Is(err, context.DeadlineExceeded)
	}
	return false
}

// snippetEnv starts the nodes a fragment uses: n (the registrar at a),
// pingNode and pongNode in the same registry, and a second registrar at
// b. node is n.
func snippetEnv(t *testing.T, ctx context.Context) (n, pingNode, pongNode *troupe.Node, a, b string) {
	start := func(name, registry string) (*troupe.Node, error) {
		nd, err := troupe.Start(ctx, troupe.Config{Name: name, Listen: []string{"tcp://127.0.0.1:0"}, RegistryAddrs: []string{registry}})
		if err == nil {
			t.Cleanup(func() { nd.Close() })
		}
		return nd, err
	}
	// A registrar binds an address that was free a moment ago: another
	// test's listener may have taken it since, so a few tries.
	registrar := func(name string) (*troupe.Node, string) {
		var err error
		for range 5 {
			addr := freeAddr(t)
			var nd *troupe.Node
			if nd, err = start(name, addr); err == nil {
				return nd, addr
			}
		}
		t.Fatal(err)
		return nil, ""
	}
	n, a = registrar("n")
	_, b = registrar("registrar-b")
	var err error
	if pingNode, err = start("ping", a); err != nil {
		t.Fatal(err)
	}
	if pongNode, err = start("pong", a); err != nil {
		t.Fatal(err)
	}
	return n, pingNode, pongNode, a, b
}

func freeAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// clusterOf starts a one-member cluster on nd.
func clusterOf(t *testing.T, ctx context.Context, nd *troupe.Node) *troupe.Cluster {
	c, err := troupe.StartCluster(ctx, nd, troupe.ClusterConfig{StableAfter: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// seedOf starts a one-member cluster on nd and returns its address, for
// a fragment that joins it.
func seedOf(t *testing.T, ctx context.Context, nd *troupe.Node) string {
	clusterOf(t, ctx, nd)
	return nd.Addrs()[0].String()
}

// etcdURL is the etcd registry the outer test found, or skips.
func etcdURL(t *testing.T) string {
	u := os.Getenv("SNIPPET_ETCD")
	if u == "" {
		t.Skip("no etcd here (.ci/run starts one)")
	}
	return u
}

// spawnPonger spawns the tour's ponger on nd.
func spawnPonger(t *testing.T, nd *troupe.Node) {
	if _, err := troupe.Spawn(nd, "ponger", troupe.Behavior[Ping]{
		Receive: func(c *troupe.Context[Ping], m Ping) { m.ReplyTo.Tell(Pong{N: m.N, From: c.Node().Name()}) },
	}); err != nil {
		t.Fatal(err)
	}
}

// spawnSoon spawns a named Quote actor on nd a moment from now, for a
// fragment that finds nothing first and then waits for it.
func spawnSoon(t *testing.T, nd *troupe.Node, name string) {
	timer := time.AfterFunc(100*time.Millisecond, func() {
		if _, err := troupe.Spawn(nd, name, troupe.Behavior[Quote]{Receive: func(*troupe.Context[Quote], Quote) {}}); err != nil {
			t.Error(err)
		}
	})
	t.Cleanup(func() { timer.Stop() })
}

// signalUntil sends this process SIGTERM every 50 ms until done closes,
// for a fragment that waits for one. The process itself keeps running:
// signal.Notify takes SIGTERM's default action away.
func signalUntil(done <-chan struct{}) {
	signal.Notify(make(chan os.Signal, 1), syscall.SIGTERM)
	go func() {
		for {
			select {
			case <-done:
				return
			case <-time.After(50 * time.Millisecond):
				syscall.Kill(os.Getpid(), syscall.SIGTERM)
			}
		}
	}()
}

// collector spawns an actor that hands each message it takes to the
// channel it returns.
func collector[T any](t *testing.T, nd *troupe.Node, name string) (troupe.Ref[T], chan T) {
	ch := make(chan T, 16)
	r, err := troupe.Spawn(nd, name, troupe.Behavior[T]{Receive: func(_ *troupe.Context[T], m T) { ch <- m }})
	if err != nil {
		t.Fatal(err)
	}
	return r, ch
}

// await waits for a message on ch, or says what never came.
func await[T any](ctx context.Context, ch chan T, what string) error {
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return errors.New("waited in vain for " + what)
	}
}

// sink spawns an actor that takes messages of type T and does nothing.
func sink[T any](t *testing.T, nd *troupe.Node, name string) troupe.Ref[T] {
	r, err := troupe.Spawn(nd, name, troupe.Behavior[T]{Receive: func(*troupe.Context[T], T) {}})
	if err != nil {
		t.Fatal(err)
	}
	return r
}
`

// snippetImports are the packages a fragment may use; each fragment's
// file imports those it names.
var snippetImports = []struct{ path, use string }{
	{"errors", "errors."},
	{"expvar", "expvar."},
	{"log", "log."},
	{"net/http", "http."},
	{"troupe/hostnet", "hostnet."},
}

// snippetAddresses replace, in a fragment, an address written for a
// reader with a live one (an expression of the prelude's).
var snippetAddresses = []struct{ old, new string }{
	{`"tcp://10.0.0.1:7001"`, `seedOf(t, ctx, pingNode)`},
	{`"127.0.0.1:1717"`, `a`},
	{`"etcd://10.0.0.1:2379,10.0.0.2:2379,10.0.0.3:2379/troupe"`, `etcdURL(t)`},
	{`":8080"`, `"127.0.0.1:0"`},
}

// snippetSetups run before a fragment that contains the key: what it
// looks up, or waits for.
var snippetSetups = map[string]string{
	`"/user/ponger"`:    `spawnPonger(t, pongNode)`,
	`"data_feed"`:       `spawnSoon(t, pongNode, "data_feed")`,
	`ShutdownOnSignal(`: `signalUntil(ctx.Done())`,
	// A watch runs until its context ends.
	`reg.Watch(ctx`: `ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()`,
}

// snippetRunners call the functions the fragments declare, after the
// fragment's body, each in a block of its own. A function the fragment's
// own body calls needs none.
var snippetRunners = map[string]string{
	"init": ``,
	"startWorker": `if err := startWorker(pongNode); err != nil {
		return err
	}`,
	"produce": `if err := produce(ctx, n); err != nil { // startWorker's worker does the jobs
		return err
	}`,
	"durableProducer": `if err := durableProducer(ctx, n, t.TempDir()); err != nil {
		return err
	}`,
	"startScheduler": `scheduler, err := startScheduler(clusterOf(t, ctx, pongNode))
	if err != nil {
		return err
	}
	scheduler.Tell(Job{ID: 1})`,
	"startCarts": `carts, err := startCarts(clusterOf(t, ctx, pongNode))
	if err != nil {
		return err
	}
	addToCart(carts, "alice")
	addToCart(carts, "bob")
	for carts.Stats().Entities < 2 { // each cart started on its first message
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("the carts never started: %w", err)
		}
		time.Sleep(10 * time.Millisecond)
	}`,
	"addToCart": ``, // with startCarts
	"sendAll": `if err := sendAll(ctx, sink[string](t, n, "billing"), []string{"o-1", "o-2", "o-3"}); err != nil {
		return err
	}`,
	"placeOrder": `stock := sink[string](t, n, "stock")
	orders, err := troupe.Spawn(n, "orders", troupe.Behavior[string]{
		Receive: func(c *troupe.Context[string], item string) { handleOrder(c, item, stock) },
	})
	if err != nil {
		return err
	}
	if err := placeOrder(ctx, orders, "r-1"); err != nil {
		return err
	}`,
	"handleOrder": ``, // with placeOrder
	"serveJobs": `if err := serveJobs(ctx, n, sink[Job](t, n, "worker")); err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if err := followWorkers(wctx, n); err != nil && wctx.Err() == nil {
		return err
	}
	if err := followFromAnActor(n, sink[troupe.ServiceListing[Job]](t, n, "pool")); err != nil {
		return err
	}`,
	"followWorkers":     ``, // with serveJobs
	"followFromAnActor": ``, // with serveJobs
	"listen": `ticker, quotes := collector[Quote](t, n, "ticker")
	if err := listen(n, ticker); err != nil {
		return err
	}
	if err := announce(ctx, n, Quote{Price: 101.5}); err != nil {
		return err
	}
	if err := await(ctx, quotes, "the subscriber to get the quote"); err != nil {
		return err
	}`,
	"announce": ``, // with listen
	"startRouter": `worker, done := collector[Job](t, n, "worker")
	if err := workersKey.Register(n, worker); err != nil {
		return err
	}
	jobs, err := startRouter(n)
	if err != nil {
		return err
	}
	jobs.Tell(Job{ID: 7})
	if err := await(ctx, done, "the worker to get the job"); err != nil {
		return err
	}`,
}

// snippetDeclared matches a top-level function a fragment declares.
var snippetDeclared = regexp.MustCompile(`(?m)^func (\w+)\(`)

// snippetStarts matches a statement at a fragment body's top level that
// starts a node.
var snippetStarts = regexp.MustCompile(`^(\w+), (?:err|_) :?= (?:troupe|network)\.Start\(`)

// snippetAssignsErr matches a statement at a fragment body's top level
// that assigns err.
var snippetAssignsErr = regexp.MustCompile(`^(?:\w+, )*err(?:, \w+)* :?= `)

// snippetDeclares matches a statement at a fragment body's top level that
// declares variables (n, err := …).
var snippetDeclares = regexp.MustCompile(`^(\w+(?:, \w+)*) :=`)

// snippetUnused matches the compiler's complaint about a variable a
// fragment declares to show a call's result and then leaves alone.
var snippetUnused = regexp.MustCompile(`snippet(\d+)_test\.go:(\d+):\d+: declared and not used: (\w+)`)

func TestDocSnippetsRun(t *testing.T) {
	t.Parallel()
	needGo(t)
	buildsBesideTheSuite(t)
	if runtime.GOOS != "linux" {
		t.Skip("one snippet uses hostnet, one sends itself SIGTERM: Linux only")
	}
	here, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	writeFile(t, dir, "go.mod", fmt.Sprintf("module example.com/snippets\n\ngo 1.26.0\n\nrequire troupe v0.0.0\n\nreplace troupe => %s\n", filepath.ToSlash(here)))
	sum, err := os.ReadFile("go.sum")
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, dir, "go.sum", string(sum)) // GOFLAGS=-mod=mod completes go.mod from it
	writeFile(t, dir, "prelude_test.go", snippetPrelude)
	writeFile(t, dir, "doc.go", "// Package snippets runs the guides' fragments.\npackage snippets\n")

	type fragment struct {
		from        string
		decls, body []string
		unused      []string // variables the compiler says the fragment leaves alone
	}
	var frags []*fragment
	for _, f := range docFiles(t) {
		for _, block := range markdownBlocks(t, f, "go") {
			if strings.HasPrefix(block, "package main") {
				if f != "README.md" {
					t.Errorf("%s: only the README's tour is a complete program; a guide's block is a fragment", f)
				}
				continue // the tour: built and run by TestReplaceDirective and TestVendoredCopy
			}
			for _, r := range snippetAddresses {
				block = strings.ReplaceAll(block, r.old, r.new)
			}
			fr := &fragment{from: f}
			// Top-level functions and one-line variables stay at top
			// level; the rest is the body.
			inDecl := false
			depth := 0        // of brackets in the body, at the end of the line
			pending := ""     // a statement assigning err, until it ends
			due := ""         // a statement assigning err that has ended
			started := ""     // a node the statement starts
			check := func() { // the error of statement due: nil, or one the guide says it returns (snippetErrOK)
				fr.body = append(fr.body, fmt.Sprintf("if err != nil && !snippetErrOK(%q, err) {\n\treturn fmt.Errorf(\"%%s: %%w\", %q, err)\n}", due, due))
			}
			for line := range strings.SplitSeq(block, "\n") {
				switch {
				case strings.HasPrefix(line, "func "):
					inDecl = true
					fr.decls = append(fr.decls, line)
				case strings.HasPrefix(line, "var ") && !strings.HasSuffix(line, "("):
					fr.decls = append(fr.decls, line)
				case inDecl:
					fr.decls = append(fr.decls, line)
					if line == "}" {
						inDecl = false
					}
				default:
					if due != "" && !strings.HasPrefix(line, "if err != nil") {
						check()
					}
					due = ""
					if depth == 0 && snippetAssignsErr.MatchString(line) {
						pending = strings.TrimSpace(line)
					}
					// A node the fragment starts is closed when its test
					// ends, once the statement has.
					if m := snippetStarts.FindStringSubmatch(line); depth == 0 && m != nil {
						started = m[1]
					}
					depth += strings.Count(line, "(") + strings.Count(line, "{") + strings.Count(line, "[") -
						strings.Count(line, ")") - strings.Count(line, "}") - strings.Count(line, "]")
					if depth == 0 && pending != "" {
						due, pending = pending, ""
					}
					fr.body = append(fr.body, line)
					if depth == 0 && started != "" {
						fr.body = append(fr.body, fmt.Sprintf("if nd := %s; nd != nil {\n\tt.Cleanup(func() { nd.Close() })\n}", started))
						started = ""
					}
					// A variable the body declares at its top level is
					// used once at its end: a fragment shows a call's
					// result without using it.
					if m := snippetDeclares.FindStringSubmatch(line); m != nil {
						for v := range strings.SplitSeq(m[1], ", ") {
							if v != "_" && !slices.Contains(fr.unused, v) {
								fr.unused = append(fr.unused, v)
							}
						}
					}
				}
			}
			if due != "" {
				check()
			}
			frags = append(frags, fr)
		}
	}
	if len(frags) < 15 {
		t.Fatalf("found only %d Go fragments in README.md and docs/", len(frags))
	}

	write := func() {
		for j, fr := range frags {
			body := strings.Join(fr.body, "\n")
			var setup, run []string
			for key, code := range snippetSetups {
				if strings.Contains(body, key) {
					setup = append(setup, "\t"+code)
				}
			}
			slices.Sort(setup)
			for _, m := range snippetDeclared.FindAllStringSubmatch(strings.Join(fr.decls, "\n"), -1) {
				code, ok := snippetRunners[m[1]]
				if !ok && !strings.Contains(body, m[1]+"(") && !strings.Contains(body, m[1]+",") {
					t.Fatalf("%s declares func %s, which nothing calls: add a runner for it to snippetRunners", fr.from, m[1])
				}
				if code != "" {
					run = append(run, "\t{\n\t"+code+"\n\t}")
				}
			}
			for _, v := range fr.unused {
				run = append(run, "\t_ = "+v)
			}
			src := strings.Join(fr.decls, "\n") + "\n" + body
			imports := []string{`"context"`, `"fmt"`, `"sync"`, `"testing"`, `"time"`, `"troupe"`}
			for _, im := range snippetImports {
				if strings.Contains(src, im.use) || strings.Contains(strings.Join(run, "\n"), im.use) {
					imports = append(imports, `"`+im.path+`"`)
				}
			}
			writeFile(t, dir, fmt.Sprintf("snippet%d_test.go", j), fmt.Sprintf(`package snippets

// From %[1]s.

import (
	%[2]s
)

%[3]s

func snippet%[4]d(ctx context.Context, t *testing.T, n, node, pingNode, pongNode *troupe.Node, a, b string) error {
%[5]s
%[6]s
%[7]s
	return nil
}

func TestSnippet%[4]d(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	n, pingNode, pongNode, a, b := snippetEnv(t, ctx)
	var mu sync.Mutex
	var dead []string
	for _, nd := range []*troupe.Node{n, pingNode, pongNode} {
		sub := troupe.Subscribe(nd, func(d troupe.DeadLetter) {
			mu.Lock()
			defer mu.Unlock()
			dead = append(dead, fmt.Sprintf("to %%s: %%v", d.Target, d.Reason))
		})
		defer sub.Unsubscribe()
	}
	if err := snippet%[4]d(ctx, t, n, n, pingNode, pongNode, a, b); err != nil {
		t.Fatalf("the fragment from %[1]s: %%v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(dead) > 0 {
		t.Fatalf("the fragment from %[1]s made dead letters: %%v", dead)
	}
}
`, fr.from, strings.Join(imports, "\n\t"), strings.Join(fr.decls, "\n"), j, strings.Join(setup, "\n"), body, strings.Join(run, "\n")))
		}
	}
	// A variable declared deeper that the fragment leaves alone: the
	// compiler's "declared and not used" names it, and the fragment's
	// function then uses it (twice at most: a use can reveal another).
	bin := filepath.Join(dir, "snippets.test")
	var out string
	for range 3 {
		write()
		// (No vet, no symbol table: a build for one run.)
		if out, err = goCmd(t, dir, "test", "-c", "-vet=off", "-ldflags=-s -w", "-o", bin, "."); err == nil {
			break
		}
		ms := snippetUnused.FindAllStringSubmatch(out, -1)
		if len(ms) == 0 {
			break
		}
		for _, m := range ms {
			var j, line int
			fmt.Sscan(m[1], &j)
			fmt.Sscan(m[2], &line)
			// Only a variable of the fragment's body: one in a function it
			// declares is the guide's mistake.
			src, _ := os.ReadFile(filepath.Join(dir, "snippet"+m[1]+"_test.go"))
			bodyAt := strings.Count(string(src[:strings.Index(string(src), "\nfunc snippet"+m[1]+"(")]), "\n") + 2
			if line > bodyAt && !slices.Contains(frags[j].unused, m[3]) {
				frags[j].unused = append(frags[j].unused, m[3])
			}
		}
	}
	if err != nil {
		t.Fatalf("the fragments of README.md and docs/ do not compile (each snippetN_test.go names its file):\n%s", out)
	}
	cmd := exec.CommandContext(t.Context(), bin, "-test.timeout=2m", "-test.v=true")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "SNIPPET_ETCD="+snippetEtcd(t))
	b, err := cmd.CombinedOutput()
	if testing.Verbose() {
		t.Logf("%s", b)
	}
	if err != nil {
		t.Fatalf("the fragments of README.md and docs/ do not all run (each TestSnippetN names its file): %v\n%s", err, b)
	}
}

// snippetEtcd is an etcd registry URL for the guide's etcd fragment,
// under a prefix of its own, in the cluster .ci/run starts
// (TROUPE_ETCD_CLUSTER); "" without one (the fragment skips).
func snippetEtcd(t *testing.T) string {
	cl := os.Getenv("TROUPE_ETCD_CLUSTER")
	if cl == "" {
		return ""
	}
	return fmt.Sprintf("etcd://%s/snippets-%d", cl, time.Now().UnixNano())
}
