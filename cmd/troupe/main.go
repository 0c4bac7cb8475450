// Command troupe runs a dedicated registrar and inspects a live system.
//
//	troupe registrar [--addr ADDR ...] [--http ADDR]
//	troupe ls [--registry ADDR] [--json]
//	troupe query NAME [--registry ADDR] [--json]
//	troupe down MEMBER --node ADDR
//	troupe peers|actors|stats --node ADDR [--json]
//	troupe quarantine ls|clear PEER --node ADDR [--json]
//	troupe schema --node ADDR [--json]
//	troupe schema diff --node A --node B [--json]
//	troupe watch [--registry ADDR] [--json]
//	troupe version
//
// Every command takes --help. Flags may come before or after the command
// name and its arguments. The registry address defaults to 127.0.0.1:1616
// for every command, the registrar's included; ls, query and watch also
// read an etcd registry (--registry etcd://host:port/prefix). Every command
// but version takes --secret-file, --tls-cert, --tls-key and --tls-ca for a
// secured node; TROUPE_SECRET_FILE, TROUPE_TLS_CERT, TROUPE_TLS_KEY,
// TROUPE_TLS_CA, TROUPE_REGISTRY and TROUPE_NODE set their defaults.
//
// Exit codes: 0 success; 1 a runtime failure (nothing answers, not
// registered, authentication failed); 2 a usage error (an unknown command
// or flag, a missing argument, a file a flag names cannot be read); 3 from
// schema diff, incompatible types; 130 interrupted (SIGINT or SIGTERM,
// but for registrar and watch, which end cleanly with 0).
package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

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
	secretFile     string   // --secret-file
	tlsCert        string   // --tls-cert
	tlsKey         string   // --tls-key
	tlsCA          string   // --tls-ca
	asJSON         bool
	timeout        time.Duration
	stdout, stderr io.Writer
	ctx            context.Context // the command's, which SIGINT and SIGTERM cancel
}

// failf prints one line saying what failed, prefixed with the command,
// and returns exit code 1.
// Once the command is interrupted it prints nothing: run says
// "interrupted" instead of blaming what the interruption cut short.
func (c *call) failf(format string, a ...any) int {
	if c.ctx != nil && c.ctx.Err() != nil {
		return 1
	}
	// (an error of the library's starts with "troupe: ", which the
	// command's own prefix already says)
	msg := strings.TrimPrefix(fmt.Sprintf(format, a...), "troupe: ")
	fmt.Fprintf(c.stderr, "troupe %s: %s\n", c.cmd.name, msg)
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
		name:    "quarantine",
		summary: "list a node's quarantined peers, or lift one quarantine",
		usage:   "troupe quarantine ls|clear PEER --node ADDR [--json] [--timeout D]",
		about: `With ls, lists the peers the node at --node has quarantined (it declared
them unreachable and refuses them until cleared): address, name, uid,
since when and why. With clear, lifts that node's quarantine of PEER, an
address or a uid as ls prints it, so that the peer may connect again
(what Node.ClearQuarantine does, asked over the protocol); it exits 1
when PEER was not quarantined there.`,
		args: -1,
		run:  quarantine,
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
		usage:   "troupe watch [--registry ADDR] [--interval D] [--json]",
		about: `Prints every registration the registrar holds, then, as they happen,
each new one ("+") and each removal ("-"), until interrupted (exit 0):
name, uuid, the node it belongs or belonged to, that node's addresses,
and when watch heard it (HH:MM:SS.mmm); the entries of one change (a
node that leaves takes all of its own) in name order; with --json, one
JSON object a line ({"op": "+" or "-", "at": time, "registration":
{...}}, as ls --json prints each). A registrar pushes
each change as it makes it (Registry.Watch); when it is lost, watch says
so on standard error and follows whoever answers at the address next,
printing what changed meanwhile. An etcd registry is followed by etcd's
watch stream. A registrar before troupe 0.11, which does not push, is
asked for its table every --interval (default 500ms).`,
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
	at := commandAt(args)
	if at < 0 {
		for _, a := range args {
			if a == "-h" || a == "-help" || a == "--help" {
				overview(stdout)
				return 0
			}
		}
		overview(stderr)
		return 2
	}
	name := args[at]
	if name == "help" {
		overview(stdout)
		return 0
	}
	rest := append(slices.Clone(args[:at]), args[at+1:]...)
	for _, cmd := range commands {
		if cmd.name == name {
			code := cmd.invoke(ctx, rest, stdout, stderr)
			if ctx.Err() != nil && code != 0 {
				// Interrupted: whatever failed, failed because of it.
				fmt.Fprintf(stderr, "troupe %s: interrupted\n", name)
				return 130
			}
			return code
		}
	}
	fmt.Fprintf(stderr, "troupe: unknown command %q\n", name)
	overview(stderr)
	return 2
}

// boolFlags are the flags that take no value, so that commandAt does not
// mistake the word after one for its value.
var boolFlags = map[string]bool{"json": true, "h": true, "help": true}

// commandAt finds the command name among args: the first word that is
// not a flag or a flag's value, so that flags may come before it
// (troupe --registry ADDR ls). -1 if there is none.
func commandAt(args []string) int {
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			return -1
		}
		name, isFlag := strings.CutPrefix(a, "-")
		if !isFlag || a == "-" {
			return i
		}
		name = strings.TrimPrefix(name, "-")
		if !strings.Contains(name, "=") && !boolFlags[name] {
			i++ // its value
		}
	}
	return -1
}

// invoke parses the command's flags, which may stand before, between or
// after its positional arguments, and runs it.
func (cmd *command) invoke(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c := &call{cmd: cmd, stdout: stdout, stderr: stderr, ctx: ctx}
	fs := flag.NewFlagSet(cmd.name, flag.ContinueOnError)
	fs.SetOutput(io.Discard) // (its errors are said below, in the commands' words)
	fs.Usage = func() {}
	if cmd.name != "version" {
		fs.StringVar(&c.secretFile, "secret-file", os.Getenv("TROUPE_SECRET_FILE"), "a `FILE` holding the shared secret (Config.Secret) of the nodes to reach; env TROUPE_SECRET_FILE")
		fs.StringVar(&c.tlsCert, "tls-cert", os.Getenv("TROUPE_TLS_CERT"), "a PEM certificate `FILE` to present over TLS (Config.TLS), with --tls-key; env TROUPE_TLS_CERT")
		fs.StringVar(&c.tlsKey, "tls-key", os.Getenv("TROUPE_TLS_KEY"), "the PEM private key `FILE` of --tls-cert; env TROUPE_TLS_KEY")
		fs.StringVar(&c.tlsCA, "tls-ca", os.Getenv("TROUPE_TLS_CA"), "a `FILE` of PEM CA certificates that verify the other side's certificate (default: the system's); env TROUPE_TLS_CA")
	}
	defaultRegistry := cmp.Or(os.Getenv("TROUPE_REGISTRY"), troupe.DefaultRegistryTCP)
	defaultNode := os.Getenv("TROUPE_NODE")
	switch cmd.name {
	case "registrar":
		fs.Var(&c.addrs, "addr", "an `ADDR` to serve the registry on (repeatable): host:port, unix:///path or a multiaddr (default: TROUPE_REGISTRY unless it names etcd, else "+troupe.DefaultRegistryTCP+")")
		fs.StringVar(&c.httpAddr, "http", "", "a host:port `ADDR` to serve the debug page, /metrics and /debug/vars on (default: none)")
	case "ls", "query":
		fs.StringVar(&c.registry, "registry", defaultRegistry, "the registrar's `ADDR`, or an etcd registry: etcd://host:port[,host:port]/prefix; env TROUPE_REGISTRY")
		fs.BoolVar(&c.asJSON, "json", false, "print JSON")
		fs.DurationVar(&c.timeout, "timeout", 5*time.Second, "how long to wait for the registrar, in all")
	case "down":
		fs.StringVar(&c.node, "node", defaultNode, "the `ADDR` of a cluster member to ask (required); env TROUPE_NODE")
		fs.DurationVar(&c.timeout, "timeout", 5*time.Second, "how long to wait for the member's answer, in all")
	case "peers", "actors", "stats", "quarantine":
		fs.StringVar(&c.node, "node", defaultNode, "the `ADDR` of the node to ask (required); env TROUPE_NODE")
		fs.BoolVar(&c.asJSON, "json", false, "print the node's stats document as JSON")
		fs.DurationVar(&c.timeout, "timeout", 5*time.Second, "how long to wait for the node's answer, in all")
	case "schema":
		fs.Var(&c.addrs, "node", "the `ADDR` of a node to ask (required; twice with diff); env TROUPE_NODE for one")
		fs.BoolVar(&c.asJSON, "json", false, "print JSON")
		fs.DurationVar(&c.timeout, "timeout", 5*time.Second, "how long to wait for the nodes' answers, in all")
	case "watch":
		fs.StringVar(&c.registry, "registry", defaultRegistry, "the registrar's `ADDR`, or an etcd registry: etcd://host:port[,host:port]/prefix; env TROUPE_REGISTRY")
		fs.DurationVar(&c.timeout, "interval", 500*time.Millisecond, "how often to ask a registrar that does not push (before troupe 0.11), and how long to wait before watching a lost registry again")
		fs.BoolVar(&c.asJSON, "json", false, "print each registration and removal as a JSON object on its own line")
	}
	for {
		err := fs.Parse(args)
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprintf(stdout, "usage: %s\n\n%s\n", cmd.usage, cmd.about)
			if cmd.name != "version" {
				fmt.Fprintln(stdout, "\nFlags:")
				printFlags(stdout, fs)
			}
			return 0
		}
		if err != nil {
			fmt.Fprintf(stderr, "troupe %s: %s\nusage: %s\n", cmd.name, flagProblem(err), cmd.usage)
			return 2
		}
		if fs.NArg() == 0 {
			break
		}
		c.args = append(c.args, fs.Arg(0))
		args = fs.Args()[1:]
	}
	if cmd.name == "quarantine" {
		if len(c.args) == 0 || !(c.args[0] == "ls" && len(c.args) == 1 || c.args[0] == "clear" && len(c.args) == 2) {
			fmt.Fprintf(c.stderr, "troupe %s: give ls, or clear and a peer; got %q\nusage: %s\n", cmd.name, c.args, cmd.usage)
			return 2
		}
	} else if cmd.args < 0 { // schema: an optional "diff"
		if len(c.args) > 1 || len(c.args) == 1 && c.args[0] != "diff" {
			fmt.Fprintf(stderr, "troupe %s: unexpected argument(s) %q\nusage: %s\n", cmd.name, c.args, cmd.usage)
			return 2
		}
	} else if len(c.args) != cmd.args {
		fmt.Fprintf(stderr, "troupe %s: takes %d argument(s), got %d\nusage: %s\n", cmd.name, cmd.args, len(c.args), cmd.usage)
		return 2
	}
	if code := c.checkAddrs(); code != 0 {
		return code
	}
	return cmd.run(ctx, c)
}

// flagProblem says what the flag package found wrong, with flags spelled
// as the usage lines spell them (two dashes).
func flagProblem(err error) string {
	msg := err.Error()
	if name, ok := strings.CutPrefix(msg, "flag provided but not defined: -"); ok {
		return "unknown flag --" + name
	}
	if name, ok := strings.CutPrefix(msg, "flag needs an argument: -"); ok {
		return "--" + name + " needs a value"
	}
	return strings.Replace(msg, "for flag -", "for flag --", 1)
}

// checkAddrs checks every address flag before anything is dialed, so that
// a mistyped address is a usage error (exit 2) whichever flag holds it.
func (c *call) checkAddrs() int {
	check := func(flagName, s string) bool {
		if s == "" || flagName == "--registry" && (strings.HasPrefix(s, "etcd://") || strings.HasPrefix(s, "etcds://")) {
			return true
		}
		if _, err := troupe.ParseAddr(s); err != nil {
			why := strings.TrimPrefix(err.Error(), troupe.ErrBadAddr.Error()+": ")
			why = strings.TrimPrefix(why, strconv.Quote(s)+": ")
			fmt.Fprintf(c.stderr, "troupe %s: %s %q is not an address: %s (want host:port, unix:///path or a multiaddr such as /ip4/127.0.0.1/tcp/1616)\nusage: %s\n", c.cmd.name, flagName, s, why, c.cmd.usage)
			return false
		}
		return true
	}
	name := "--node"
	if c.cmd.name == "registrar" {
		name = "--addr"
	}
	ok := check("--registry", c.registry) && check("--node", c.node)
	if c.cmd.name == "down" && len(c.args) == 1 {
		ok = ok && check("MEMBER", c.args[0])
	}
	for _, a := range c.addrs {
		ok = ok && check(name, a)
	}
	if r := os.Getenv("TROUPE_REGISTRY"); c.cmd.name == "registrar" && len(c.addrs) == 0 && !strings.HasPrefix(r, "etcd") {
		ok = ok && check("TROUPE_REGISTRY", r) // (the registrar's default address)
	}
	if !ok {
		return 2
	}
	return 0
}

// printFlags lists a command's flags as they are written, with two
// dashes (flag.PrintDefaults writes one).
func printFlags(w io.Writer, fs *flag.FlagSet) {
	fs.VisitAll(func(f *flag.Flag) {
		kind, usage := flag.UnquoteUsage(f)
		if kind == "value" || kind == "" && !boolFlags[f.Name] {
			kind = "VALUE"
		}
		line := "  --" + f.Name
		if !boolFlags[f.Name] {
			line += " " + strings.ToUpper(kind)
		}
		fmt.Fprintf(w, "%s\n    \t%s", line, usage)
		if f.DefValue != "" && f.DefValue != "false" && f.DefValue != "[]" {
			fmt.Fprintf(w, " (default %s)", f.DefValue)
		}
		fmt.Fprintln(w)
	})
}

func (c *call) printJSON(v any) int {
	enc := json.NewEncoder(c.stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return c.failf("%v", err)
	}
	return 0
}
