// Command troupe runs a dedicated registrar and inspects a live system.
//
//	troupe registrar [--addr ADDR ...] [--http ADDR]
//	troupe ls [--registry ADDR] [--json]
//	troupe query NAME [--registry ADDR] [--json]
//	troupe down MEMBER --node ADDR
//	troupe peers|actors|stats --node ADDR [--json]
//	troupe schema --node ADDR [--json]
//	troupe schema diff --node A --node B [--json]
//	troupe watch [--registry ADDR]
//	troupe version
//
// Every command takes --help. Flags may come before or after the
// positional arguments. The registry address defaults to
// 127.0.0.1:1616 for every command, the registrar's included; ls, query
// and watch also read an etcd registry (--registry etcd://host:port/prefix).
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"expvar"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"troupe"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

// command is one subcommand: its help text, its flags and what it does.
type command struct {
	name    string
	summary string // one line for the overview
	usage   string // the synopsis line
	about   string // what it does, for --help
	args    int    // how many positional arguments it takes
	run     func(ctx context.Context, c *call) int
}

// call is one invocation of a command: its parsed flags and arguments.
type call struct {
	cmd            *command
	args           []string
	registry       string
	node           string
	addrs          addrList // --addr (registrar), --node (schema)
	httpAddr       string   // --http (registrar)
	asJSON         bool
	timeout        time.Duration
	stdout, stderr io.Writer
}

// failf prints one line saying what failed, prefixed with the command,
// and returns exit code 1.
func (c *call) failf(format string, a ...any) int {
	fmt.Fprintf(c.stderr, "troupe %s: %s\n", c.cmd.name, fmt.Sprintf(format, a...))
	return 1
}

var commands = []*command{
	{
		name:    "registrar",
		summary: "serve a registry and nothing else",
		usage:   "troupe registrar [--addr ADDR ...] [--http ADDR]",
		about: `Runs a dedicated registrar: nodes started with this address in
Config.RegistryAddrs register their named actors with it, and ls and
query read it. It serves until SIGINT or SIGTERM, logs with log/slog on
standard error, and prints each address it bound on standard output.
It refuses to start (exit 1) when a registrar already answers on an
address. For a Unix socket address, the socket's directory is created
(mode 0700) if it is missing. With --http, it also serves its debug page
at /debug/troupe, Prometheus metrics at /metrics and expvar at
/debug/vars on that address (put it behind your own access control), and
prints "registrar serving HTTP on http://ADDR".`,
		run: registrar,
	},
	{
		name:    "ls",
		summary: "list every registration of a registrar",
		usage:   "troupe ls [--registry ADDR] [--json] [--timeout D]",
		about: `Lists every node and named actor registered with the registrar, as an
aligned table or, with --json, a JSON array. Exits 1 with a message
when no registrar answers.`,
		run: ls,
	},
	{
		name:    "query",
		summary: "print where one named actor lives",
		usage:   "troupe query NAME [--registry ADDR] [--json] [--timeout D]",
		about: `Prints the preferred address of the actor registered as NAME (Unix
socket, then local TCP, then remote TCP), or with --json its whole
registration. Exits 1 with "not registered" when no actor has that
name, and with a message when no registrar answers.`,
		args: 1,
		run:  query,
	},
	{
		name:    "down",
		summary: "down a cluster member by hand",
		usage:   "troupe down MEMBER --node ADDR [--timeout D]",
		about: `Asks the cluster member listening at --node to mark the member
listening at MEMBER down: manual downing, the way to unblock a cluster
without a downing strategy after a member crashed. The leader then
removes it; its node must restart to join again. Exits 1 with a message
when no member answers at --node or MEMBER is not a live member.`,
		args: 1,
		run:  down,
	},
	{
		name:    "peers",
		summary: "list a node's associations and how close each peer is to unreachable",
		usage:   "troupe peers --node ADDR [--json] [--timeout D]",
		about: `Asks the node at --node (over the protocol, through its introspection
actor) for its associations: each peer's address, name, state, the time
left before it would be declared unreachable, and bytes in and out; then
the peers it has quarantined, and why. --json prints the node's whole
stats document.`,
		run: remoteStats,
	},
	{
		name:    "actors",
		summary: "list a node's actors and their mailbox depths",
		usage:   "troupe actors --node ADDR [--json] [--timeout D]",
		about: `Asks the node at --node for its actors (system actors included) and how
many messages wait in each mailbox, deepest first.`,
		run: remoteStats,
	},
	{
		name:    "stats",
		summary: "summarize a node: peers, quarantines, actors, dead letters, cluster",
		usage:   "troupe stats --node ADDR [--json] [--timeout D]",
		about: `Asks the node at --node for its stats and prints a summary: how many
peers in each state, the quarantines, the actor count and the deepest
mailboxes, dead letters by reason, and the cluster's members if it is
one. --json prints the whole document, as the node's DebugHandler
serves it.`,
		run: remoteStats,
	},
	{
		name:    "schema",
		summary: "print a node's message types, or whether two nodes' agree",
		usage:   "troupe schema [diff] --node ADDR [--node ADDR] [--json] [--timeout D]",
		about: `Asks the node at --node for the shape of every message type its process
registered: wire key, Go type, and fields by name and kind. With diff and
two --node flags, compares the two nodes type by type, in both
directions, by the rules a session applies to each message (see
"Changing a message type during a rolling upgrade" in the README):
"same", "compatible" (with the fields only one side has), "incompatible"
(with the field whose kind changed), "unchecked" (a type too large or
too deep to have a shape), or "only on" one node. Exits 3 when a type is
incompatible or unchecked, so a deploy script can stop before it rolls;
1 when a node does not answer; 2 on a usage error.`,
		args: -1,
		run:  schema,
	},
	{
		name:    "watch",
		summary: "stream a registrar's registrations and removals",
		usage:   "troupe watch [--registry ADDR] [--interval D]",
		about: `Prints every registration the registrar holds, then, as they happen,
each new one ("+") and each removal ("-"), until interrupted. It asks the
registrar for its table every --interval (default 500ms).`,
		run: watch,
	},
	{
		name:    "version",
		summary: "print the version of troupe and of its wire protocol",
		usage:   "troupe version",
		about:   `Prints troupe's version, the wire protocol version it speaks, and the Go version it was built with.`,
		run: func(_ context.Context, c *call) int {
			fmt.Fprintf(c.stdout, "troupe %s (wire protocol %d, %s)\n", troupe.Version, troupe.ProtocolVersion, runtime.Version())
			return 0
		},
	},
}

// overview prints the list of commands.
func overview(w io.Writer) {
	fmt.Fprintln(w, "usage: troupe COMMAND [flags]")
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, c := range commands {
		fmt.Fprintf(tw, "  %s\t%s\n", c.name, c.summary)
	}
	tw.Flush()
	fmt.Fprintln(w, "\nRun 'troupe COMMAND --help' for a command's flags.")
}

// addrList is a repeatable --addr flag.
type addrList []string

func (a *addrList) String() string     { return strings.Join(*a, ",") }
func (a *addrList) Set(s string) error { *a = append(*a, s); return nil }

// run executes one command and returns the exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		overview(stderr)
		return 2
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		overview(stdout)
		return 0
	}
	for _, cmd := range commands {
		if cmd.name == args[0] {
			return cmd.invoke(ctx, args[1:], stdout, stderr)
		}
	}
	fmt.Fprintf(stderr, "troupe: unknown command %q\n", args[0])
	overview(stderr)
	return 2
}

// invoke parses the command's flags, which may stand before, between or
// after its positional arguments, and runs it.
func (cmd *command) invoke(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c := &call{cmd: cmd, stdout: stdout, stderr: stderr}
	fs := flag.NewFlagSet(cmd.name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {}
	switch cmd.name {
	case "registrar":
		fs.Var(&c.addrs, "addr", "an address to serve the registry on (repeatable): host:port, unix:///path or a multiaddr (default "+troupe.DefaultRegistryTCP+")")
		fs.StringVar(&c.httpAddr, "http", "", "a host:port to serve the debug page, /metrics and /debug/vars on (default: none)")
	case "ls", "query":
		fs.StringVar(&c.registry, "registry", troupe.DefaultRegistryTCP, "the registrar's address, or an etcd registry: etcd://host:port[,host:port]/prefix")
		fs.BoolVar(&c.asJSON, "json", false, "print JSON")
		fs.DurationVar(&c.timeout, "timeout", 5*time.Second, "how long to wait for the registrar, in all")
	case "down":
		fs.StringVar(&c.node, "node", "", "the address of a cluster member to ask (required)")
		fs.DurationVar(&c.timeout, "timeout", 5*time.Second, "how long to wait for the member's answer, in all")
	case "peers", "actors", "stats":
		fs.StringVar(&c.node, "node", "", "the address of the node to ask (required)")
		fs.BoolVar(&c.asJSON, "json", false, "print the node's stats document as JSON")
		fs.DurationVar(&c.timeout, "timeout", 5*time.Second, "how long to wait for the node's answer, in all")
	case "schema":
		fs.Var(&c.addrs, "node", "the address of a node to ask (required; twice with diff)")
		fs.BoolVar(&c.asJSON, "json", false, "print JSON")
		fs.DurationVar(&c.timeout, "timeout", 5*time.Second, "how long to wait for the nodes' answers, in all")
	case "watch":
		fs.StringVar(&c.registry, "registry", troupe.DefaultRegistryTCP, "the registrar's address, or an etcd registry: etcd://host:port[,host:port]/prefix")
		fs.DurationVar(&c.timeout, "interval", 500*time.Millisecond, "how often to ask the registrar")
	}
	for {
		err := fs.Parse(args)
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprintf(stdout, "usage: %s\n\n%s\n", cmd.usage, cmd.about)
			if cmd.name != "version" {
				fmt.Fprintln(stdout, "\nFlags:")
				fs.SetOutput(stdout)
				fs.PrintDefaults()
			}
			return 0
		}
		if err != nil {
			fmt.Fprintf(stderr, "usage: %s\n", cmd.usage)
			return 2
		}
		if fs.NArg() == 0 {
			break
		}
		c.args = append(c.args, fs.Arg(0))
		args = fs.Args()[1:]
	}
	if cmd.args < 0 { // schema: an optional "diff"
		if len(c.args) > 1 || len(c.args) == 1 && c.args[0] != "diff" {
			fmt.Fprintf(stderr, "troupe %s: unexpected argument(s) %q\nusage: %s\n", cmd.name, c.args, cmd.usage)
			return 2
		}
	} else if len(c.args) != cmd.args {
		fmt.Fprintf(stderr, "troupe %s: takes %d argument(s), got %d\nusage: %s\n", cmd.name, cmd.args, len(c.args), cmd.usage)
		return 2
	}
	return cmd.run(ctx, c)
}

func registrar(ctx context.Context, c *call) int {
	addrs := c.addrs
	if len(addrs) == 0 {
		addrs = addrList{troupe.DefaultRegistryTCP}
	}
	logger := slog.New(slog.NewTextHandler(c.stderr, nil))
	n, err := troupe.Start(ctx, troupe.Config{Name: "registrar", RegistryAddrs: addrs, EnsureRegistry: true, Logger: logger})
	switch {
	case errors.Is(err, troupe.ErrRegistryRunning):
		return c.failf("a registrar already serves %s; stop it first, or pick another --addr", strings.Join(addrs, ", "))
	case err != nil:
		return c.failf("%v", err)
	}
	for _, a := range n.Addrs() {
		fmt.Fprintf(c.stdout, "registrar listening on %s\n", a)
	}
	if c.httpAddr != "" {
		l, err := net.Listen("tcp", c.httpAddr)
		if err != nil {
			n.Close()
			return c.failf("--http: %v", err)
		}
		mux := http.NewServeMux()
		mux.Handle("/debug/troupe", troupe.DebugHandler(n))
		mux.Handle("/metrics", troupe.MetricsHandler(n))
		mux.Handle("/debug/vars", varsHandler(n))
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		served := make(chan struct{})
		go func() {
			defer close(served)
			if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
				logger.Error("registrar: the HTTP server stopped", "err", err)
			}
		}()
		defer func() { srv.Close(); <-served }()
		fmt.Fprintf(c.stdout, "registrar serving HTTP on http://%s\n", l.Addr())
	}
	logger.Info("registrar started", "addrs", fmt.Sprint(n.Addrs()), "uid", n.UID().String())
	<-ctx.Done()
	logger.Info("registrar stopping")
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := n.Shutdown(sctx); err != nil {
		return c.failf("shutdown: %v", err)
	}
	return 0
}

// connect starts the command's own short-lived node, bounded by the
// command's timeout, and returns it with the registrar's address.
func (c *call) connect(ctx context.Context) (*troupe.Node, string, int) {
	addr, err := c.registryAddr()
	if err != nil {
		fmt.Fprintf(c.stderr, "troupe %s: --registry: %v\n", c.cmd.name, err)
		return nil, "", 2
	}
	n, err := troupe.Start(ctx, troupe.Config{Name: "troupe-cli", Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		return nil, "", c.failf("%v", err)
	}
	return n, addr, 0
}

// registryAddr is --registry in the form WithRegistries takes: a
// registrar's address, or an etcd registry as given
// (etcd://host:port,host:port/prefix).
func (c *call) registryAddr() (string, error) {
	if strings.HasPrefix(c.registry, "etcd://") || strings.HasPrefix(c.registry, "etcds://") {
		return c.registry, nil
	}
	addr, err := troupe.ParseAddr(c.registry)
	if err != nil {
		return "", err
	}
	return addr.String(), nil
}

// noRegistrar explains a failed registry request in one line: what
// failed, and what to check.
func (c *call) noRegistrar(addr string, err error) int {
	hint := "is a registrar running there? (troupe registrar --addr " + addr + ")"
	if strings.HasPrefix(addr, "etcd") {
		hint = "does etcd answer at those endpoints (curl http://HOST:PORT/version)?"
	}
	if errors.Is(err, context.DeadlineExceeded) {
		hint = fmt.Sprintf("nothing answered within --timeout %v; is the address a troupe registrar, and do this machine's firewall and the registrar's secret or TLS settings allow it?", c.timeout)
	}
	why := strings.TrimPrefix(err.Error(), "registrar "+addr+": ")
	return c.failf("no registrar answers at %s: %s; %s", addr, why, hint)
}

// registration is one registration as the --json outputs print it.
type registration struct {
	Name     string   `json:"name"`
	UUID     string   `json:"uuid"`
	Path     string   `json:"path,omitempty"`
	Node     string   `json:"node"`
	NodeName string   `json:"node_name"`
	Addrs    []string `json:"addrs"`
}

func toJSON(r troupe.Registration) registration {
	e := registration{Name: r.Name, UUID: r.UUID.String(), Path: r.Path, Node: r.Node.String(), NodeName: r.NodeName, Addrs: []string{}}
	for _, a := range r.Addrs {
		e.Addrs = append(e.Addrs, a.String())
	}
	return e
}

func (c *call) printJSON(v any) int {
	enc := json.NewEncoder(c.stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return c.failf("%v", err)
	}
	return 0
}

// withNode runs f with the command's own short-lived node and the
// registrar's address, all within the command's timeout.
func (c *call) withNode(ctx context.Context, f func(ctx context.Context, n *troupe.Node, addr string) int) int {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	n, addr, code := c.connect(ctx)
	if n == nil {
		return code
	}
	defer n.Close()
	return f(ctx, n, addr)
}

func ls(ctx context.Context, c *call) int {
	return c.withNode(ctx, c.ls)
}

func (c *call) ls(ctx context.Context, n *troupe.Node, addr string) int {
	reg, err := n.Registry(troupe.WithRegistries(addr))
	if err != nil {
		return c.noRegistrar(addr, err)
	}
	list, err := reg.List(ctx)
	if err != nil {
		return c.noRegistrar(addr, err)
	}
	entries := make([]registration, 0, len(list))
	for _, r := range list {
		entries = append(entries, toJSON(r))
	}
	if c.asJSON {
		return c.printJSON(entries)
	}
	tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tUUID\tPATH\tNODE\tADDRS")
	for _, e := range entries {
		path := e.Path
		if path == "" {
			path = "(node)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", e.Name, e.UUID, path, e.NodeName, strings.Join(e.Addrs, ","))
	}
	tw.Flush()
	return 0
}

// queryResult is what `troupe query --json` prints.
type queryResult struct {
	Addr         string       `json:"addr"`
	Registration registration `json:"registration"`
}

func query(ctx context.Context, c *call) int {
	return c.withNode(ctx, c.query)
}

func (c *call) query(ctx context.Context, n *troupe.Node, addr string) int {
	name := c.args[0]
	q, found, err := troupe.QueryActor(ctx, n, name, troupe.WithRegistries(addr))
	if err != nil {
		return c.noRegistrar(addr, err)
	}
	if !found {
		return c.failf("%s: not registered at %s", name, addr)
	}
	if c.asJSON {
		return c.printJSON(queryResult{Addr: q.Addr.String(), Registration: toJSON(q.Registration)})
	}
	fmt.Fprintln(c.stdout, q.Addr)
	return 0
}

func down(ctx context.Context, c *call) int {
	if c.node == "" {
		fmt.Fprintf(c.stderr, "troupe down: --node is required\nusage: %s\n", c.cmd.usage)
		return 2
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	n, err := troupe.Start(ctx, troupe.Config{Name: "troupe-cli", Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		return c.failf("%v", err)
	}
	defer n.Close()
	if err := troupe.DownMember(ctx, n, c.node, c.args[0]); err != nil {
		return c.failf("%v", err)
	}
	fmt.Fprintf(c.stdout, "%s is down\n", c.args[0])
	return 0
}

// nodeStats is the part of a node's stats document the tables print.
type nodeStats struct {
	Name       string   `json:"name"`
	UID        string   `json:"uid"`
	AppVersion string   `json:"app_version"`
	Addrs      []string `json:"addrs"`
	Peers      []struct {
		Addr       string `json:"addr"`
		UID        string `json:"uid"`
		Name       string `json:"name"`
		AppVersion string `json:"app_version"`
		State      string `json:"state"`
		WindowLeft string `json:"window_left"`
		Member     bool   `json:"member"`
		BytesIn    uint64 `json:"bytes_in"`
		BytesOut   uint64 `json:"bytes_out"`
	} `json:"peers"`
	Quarantined []struct {
		UID   string   `json:"uid"`
		Name  string   `json:"name"`
		Addrs []string `json:"addrs"`
		Cause string   `json:"cause"`
	} `json:"quarantined"`
	Actors    int `json:"actors"`
	ActorList []struct {
		Path    string
		Waiting int
	} `json:"actor_list"`
	DeadLetters map[string]uint64 `json:"dead_letters"`
	Members     []struct {
		Addr       string `json:"addr"`
		AppVersion string `json:"app_version"`
		Status     string `json:"status"`
		Reachable  bool   `json:"reachable"`
	} `json:"members"`
}

// remoteStats asks a node for its stats and prints what the command
// shows.
func remoteStats(ctx context.Context, c *call) int {
	if c.node == "" {
		fmt.Fprintf(c.stderr, "troupe %s: --node is required\nusage: %s\n", c.cmd.name, c.cmd.usage)
		return 2
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	n, err := troupe.Start(ctx, troupe.Config{Name: "troupe-cli", Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		return c.failf("%v", err)
	}
	defer n.Close()
	doc, err := troupe.FetchStats(ctx, n, c.node)
	if err != nil {
		return c.failf("%v", err)
	}
	if c.asJSON {
		var v any
		json.Unmarshal(doc, &v)
		return c.printJSON(v)
	}
	var s nodeStats
	if err := json.Unmarshal(doc, &s); err != nil {
		return c.failf("the node's answer is not a stats document: %v", err)
	}
	tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
	defer tw.Flush()
	switch c.cmd.name {
	case "peers":
		fmt.Fprintln(tw, "ADDR\tNAME\tVERSION\tUID\tSTATE\tWINDOW LEFT\tIN\tOUT")
		for _, p := range s.Peers {
			state, left := p.State, p.WindowLeft
			if p.Member {
				state, left = state+" (member)", "-"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\n", p.Addr, p.Name, orDash(p.AppVersion), short(p.UID), state, left, p.BytesIn, p.BytesOut)
		}
		for _, q := range s.Quarantined {
			fmt.Fprintf(tw, "%s\t%s\t-\t%s\tquarantined\t-\t-\t-\t(%s)\n", strings.Join(q.Addrs, ","), q.Name, short(q.UID), q.Cause)
		}
	case "actors":
		slices.SortStableFunc(s.ActorList, func(a, b struct {
			Path    string
			Waiting int
		}) int {
			return b.Waiting - a.Waiting
		})
		fmt.Fprintln(tw, "PATH\tWAITING")
		for _, a := range s.ActorList {
			fmt.Fprintf(tw, "%s\t%d\n", a.Path, a.Waiting)
		}
	default:
		byState := map[string]int{}
		for _, p := range s.Peers {
			byState[p.State]++
		}
		fmt.Fprintf(tw, "node\t%s (%s) on %s\n", s.Name, short(s.UID), strings.Join(s.Addrs, ","))
		if s.AppVersion != "" {
			fmt.Fprintf(tw, "version\t%s\n", s.AppVersion)
		}
		counts := []string{fmt.Sprintf("%d up", byState["up"])}
		for _, st := range []string{"connecting", "suspended", "ending", "leaving", "retiring", "closed"} {
			if byState[st] > 0 {
				counts = append(counts, fmt.Sprintf("%d %s", byState[st], st))
			}
		}
		fmt.Fprintf(tw, "peers\t%s\n", strings.Join(counts, ", "))
		fmt.Fprintf(tw, "quarantined\t%d\n", len(s.Quarantined))
		fmt.Fprintf(tw, "actors\t%d\n", s.Actors)
		var reasons []string
		for r, n := range s.DeadLetters {
			reasons = append(reasons, fmt.Sprintf("%s %d", r, n))
		}
		slices.Sort(reasons)
		fmt.Fprintf(tw, "dead letters\t%s\n", strings.Join(reasons, ", "))
		for _, m := range s.Members {
			fmt.Fprintf(tw, "member\t%s %s reachable=%v version=%s\n", m.Addr, m.Status, m.Reachable, orDash(m.AppVersion))
		}
	}
	return 0
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func short(uid string) string { return uid[:min(len(uid), 12)] }

// watch prints the registrar's table, then its changes, until ctx ends.
func watch(ctx context.Context, c *call) int {
	addr, err := c.registryAddr()
	if err != nil {
		fmt.Fprintf(c.stderr, "troupe watch: --registry: %v\n", err)
		return 2
	}
	n, err := troupe.Start(ctx, troupe.Config{Name: "troupe-cli", Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		return c.failf("%v", err)
	}
	defer n.Close()
	reg, err := n.Registry(troupe.WithRegistries(addr))
	if err != nil {
		return c.noRegistrar(addr, err)
	}
	seen := map[string]troupe.Registration{}
	tick := time.NewTicker(max(c.timeout, 10*time.Millisecond))
	defer tick.Stop()
	for first := true; ; first = false {
		lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		list, err := reg.List(lctx)
		cancel()
		if ctx.Err() != nil {
			return 0
		}
		if err != nil {
			if first {
				return c.noRegistrar(addr, err)
			}
			fmt.Fprintf(c.stderr, "troupe watch: %v\n", err)
		} else {
			now := map[string]troupe.Registration{}
			for _, r := range list {
				key := r.Name + " " + r.UUID.String()
				now[key] = r
				if _, ok := seen[key]; !ok {
					e := toJSON(r)
					fmt.Fprintf(c.stdout, "+ %s %s %s %s\n", e.Name, e.UUID, e.NodeName, strings.Join(e.Addrs, ","))
				}
			}
			for key, r := range seen {
				if _, ok := now[key]; !ok {
					fmt.Fprintf(c.stdout, "- %s %s\n", r.Name, r.UUID.String())
				}
			}
			seen = now
		}
		select {
		case <-ctx.Done():
			return 0
		case <-tick.C:
		}
	}
}

// schemaDiffJSON is one wire key as `troupe schema diff --json` prints it.
type schemaDiffJSON struct {
	Key     string   `json:"key"`
	Verdict string   `json:"verdict"` // same, compatible, incompatible, unchecked, only_a, only_b
	OnlyA   []string `json:"only_a,omitempty"`
	OnlyB   []string `json:"only_b,omitempty"`
	AToB    string   `json:"a_to_b,omitempty"`
	BToA    string   `json:"b_to_a,omitempty"`
}

// schema prints one node's message types, or compares two nodes'.
func schema(ctx context.Context, c *call) int {
	diff := len(c.args) == 1
	if want := map[bool]int{false: 1, true: 2}[diff]; len(c.addrs) != want {
		fmt.Fprintf(c.stderr, "troupe schema: give --node %d time(s), got %d\nusage: %s\n", want, len(c.addrs), c.cmd.usage)
		return 2
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	n, err := troupe.Start(ctx, troupe.Config{Name: "troupe-cli", Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		return c.failf("%v", err)
	}
	defer n.Close()
	var schemas [][]troupe.MessageSchema
	for _, addr := range c.addrs {
		s, err := troupe.FetchSchema(ctx, n, addr)
		if err != nil {
			return c.failf("%v", err)
		}
		schemas = append(schemas, s)
	}
	if !diff {
		if c.asJSON {
			return c.printJSON(schemas[0])
		}
		tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "KEY\tTYPE\tSHAPE")
		for _, s := range schemas[0] {
			fmt.Fprintf(tw, "%s\t%s\t%s\n", printable(s.Key), printable(s.Type), printable(s.Shape))
		}
		tw.Flush()
		return 0
	}
	a, b := map[string]troupe.MessageSchema{}, map[string]troupe.MessageSchema{}
	var keys []string
	for _, s := range schemas[0] {
		a[s.Key] = s
		keys = append(keys, s.Key)
	}
	for _, s := range schemas[1] {
		b[s.Key] = s
		if _, ok := a[s.Key]; !ok {
			keys = append(keys, s.Key)
		}
	}
	slices.Sort(keys)
	var out []schemaDiffJSON
	incompatible, same := 0, 0
	for _, k := range keys {
		sa, inA := a[k]
		sb, inB := b[k]
		e := schemaDiffJSON{Key: k}
		switch {
		case !inB:
			e.Verdict = "only_a"
		case !inA:
			e.Verdict = "only_b"
		default:
			d := troupe.DiffSchemas(sa, sb)
			e.OnlyA, e.OnlyB = d.OnlyA, d.OnlyB
			switch {
			case d.Same:
				e.Verdict = "same"
				same++
			case d.Compatible():
				e.Verdict = "compatible"
			case sa.Raw == nil || sb.Raw == nil:
				e.Verdict = "unchecked"
				incompatible++
			default:
				e.Verdict = "incompatible"
				incompatible++
			}
			if d.AToB != nil {
				e.AToB = d.AToB.Error()
			}
			if d.BToA != nil {
				e.BToA = d.BToA.Error()
			}
		}
		out = append(out, e)
	}
	if c.asJSON {
		if code := c.printJSON(out); code != 0 {
			return code
		}
	} else {
		tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintf(tw, "KEY\tVERDICT\tDETAIL\n")
		for _, e := range out {
			var detail []string
			switch e.Verdict {
			case "same":
				continue
			case "only_a":
				e.Verdict, detail = "only on A", []string{"B drops what A sends of it (dead letters: not registered)"}
			case "only_b":
				e.Verdict, detail = "only on B", []string{"A drops what B sends of it (dead letters: not registered)"}
			}
			if len(e.OnlyA) > 0 {
				detail = append(detail, "fields only A has: "+strings.Join(e.OnlyA, ", "))
			}
			if len(e.OnlyB) > 0 {
				detail = append(detail, "fields only B has: "+strings.Join(e.OnlyB, ", "))
			}
			if e.AToB != "" {
				detail = append(detail, "A to B: "+strings.TrimPrefix(e.AToB, "troupe: "))
			}
			if e.BToA != "" {
				detail = append(detail, "B to A: "+strings.TrimPrefix(e.BToA, "troupe: "))
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\n", printable(e.Key), e.Verdict, printable(strings.Join(detail, "; ")))
		}
		fmt.Fprintf(tw, "(%d of %d types the same; A is %s, B is %s)\n", same, len(keys), c.addrs[0], c.addrs[1])
		tw.Flush()
	}
	if incompatible > 0 {
		fmt.Fprintf(c.stderr, "troupe schema: %d incompatible or unchecked type(s)\n", incompatible)
		return 3
	}
	return 0
}

// printable replaces what a terminal would interpret (control characters,
// invalid UTF-8) in text that came from a node.
func printable(s string) string {
	return strings.Map(func(r rune) rune {
		if r == utf8.RuneError || !unicode.IsPrint(r) {
			return '?'
		}
		return r
	}, s)
}

// varsHandler serves expvar's variables, as expvar.Handler does, with the
// node's stats document added as "troupe" (without publishing it in the
// process-wide expvar table, which would outlive the node).
func varsHandler(n *troupe.Node) http.Handler {
	debug := troupe.DebugHandler(n)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		doc := httptest.NewRecorder()
		debug.ServeHTTP(doc, httptest.NewRequest(http.MethodGet, "/?format=json", nil))
		w.Header().Set("Content-Type", "application/json; charset=utf-8")
		fmt.Fprintf(w, "{\n%q: %s", "troupe", bytes.TrimSpace(doc.Body.Bytes()))
		expvar.Do(func(kv expvar.KeyValue) {
			if kv.Key != "troupe" {
				fmt.Fprintf(w, ",\n%q: %s", kv.Key, kv.Value)
			}
		})
		fmt.Fprintf(w, "\n}\n")
	})
}
