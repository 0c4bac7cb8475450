// Command troupe runs a dedicated registrar and inspects a live system.
//
//	troupe registrar --addr 127.0.0.1:1717 [--addr unix:///run/app/reg.sock]
//	troupe ls --registry 127.0.0.1:1717 [--json]
//	troupe query --registry 127.0.0.1:1717 NAME
//
// "registrar" serves a registry and nothing else until SIGINT or SIGTERM;
// it refuses to start when a registrar already answers on an address.
// "ls" lists every registration; "query" prints the preferred address of
// NAME, or exits 1 when it is not registered. Both exit non-zero with a
// message when no registrar answers.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
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

const usage = `usage:
  troupe registrar --addr ADDR [--addr ADDR ...]
  troupe ls --registry ADDR [--json]
  troupe query --registry ADDR NAME
`

// addrList is a repeatable --addr flag.
type addrList []string

func (a *addrList) String() string     { return strings.Join(*a, ",") }
func (a *addrList) Set(s string) error { *a = append(*a, s); return nil }

// run executes one command and returns the exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	switch args[0] {
	case "registrar":
		return registrar(ctx, args[1:], stdout, stderr)
	case "ls", "query":
		return inspect(ctx, args[0], args[1:], stdout, stderr)
	case "-h", "--help", "help":
		fmt.Fprint(stdout, usage)
		return 0
	}
	fmt.Fprintf(stderr, "troupe: unknown command %q\n%s", args[0], usage)
	return 2
}

func registrar(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("registrar", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var addrs addrList
	fs.Var(&addrs, "addr", "address to serve the registry on (repeatable): host:port, unix:///path or a multiaddr")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if len(addrs) == 0 {
		fmt.Fprintln(stderr, "troupe registrar: at least one --addr is required")
		return 2
	}
	logger := slog.New(slog.NewTextHandler(stderr, nil))
	n, err := troupe.Start(ctx, troupe.Config{Name: "registrar", RegistryAddrs: addrs, EnsureRegistry: true, Logger: logger})
	switch {
	case errors.Is(err, troupe.ErrRegistryRunning):
		fmt.Fprintf(stderr, "troupe registrar: a registrar already serves %s\n", strings.Join(addrs, ", "))
		return 1
	case err != nil:
		fmt.Fprintf(stderr, "troupe registrar: %v\n", err)
		return 1
	}
	for _, a := range n.Addrs() {
		fmt.Fprintf(stdout, "registrar listening on %s\n", a)
	}
	logger.Info("registrar started", "addrs", fmt.Sprint(n.Addrs()), "uid", n.UID().String())
	<-ctx.Done()
	logger.Info("registrar stopping")
	if err := n.Close(); err != nil {
		fmt.Fprintf(stderr, "troupe registrar: close: %v\n", err)
		return 1
	}
	return 0
}

// entry is one registration as `troupe ls --json` prints it.
type entry struct {
	Name     string   `json:"name"`
	UUID     string   `json:"uuid"`
	Path     string   `json:"path,omitempty"`
	Node     string   `json:"node"`
	NodeName string   `json:"node_name"`
	Addrs    []string `json:"addrs"`
}

func inspect(ctx context.Context, cmd string, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	registry := fs.String("registry", troupe.DefaultRegistryTCP, "the registrar's address")
	asJSON := fs.Bool("json", false, "print JSON (ls)")
	timeout := fs.Duration("timeout", 5*time.Second, "how long to wait for the registrar")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	addr, err := troupe.ParseAddr(*registry)
	if err != nil {
		fmt.Fprintf(stderr, "troupe %s: %v\n", cmd, err)
		return 2
	}
	if cmd == "query" && fs.NArg() != 1 {
		fmt.Fprintln(stderr, "troupe query: give exactly one NAME")
		return 2
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	n, err := troupe.Start(ctx, troupe.Config{Name: "troupe-cli", Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		fmt.Fprintf(stderr, "troupe %s: %v\n", cmd, err)
		return 1
	}
	defer n.Close()
	noRegistrar := func(err error) int {
		fmt.Fprintf(stderr, "troupe %s: no registrar answers at %s: %v\n", cmd, addr, err)
		return 1
	}
	if cmd == "query" {
		name := fs.Arg(0)
		q, found, err := troupe.QueryActor(ctx, n, name, troupe.WithRegistries(addr))
		if err != nil {
			return noRegistrar(err)
		}
		if !found {
			fmt.Fprintf(stderr, "troupe query: %s: not registered\n", name)
			return 1
		}
		fmt.Fprintln(stdout, q.Addr)
		return 0
	}
	reg, err := n.Registry(troupe.WithRegistries(addr))
	if err != nil {
		return noRegistrar(err)
	}
	list, err := reg.List(ctx)
	if err != nil {
		return noRegistrar(err)
	}
	entries := make([]entry, 0, len(list))
	for _, r := range list {
		e := entry{Name: r.Name, UUID: r.UUID.String(), Path: r.Path, Node: r.Node.String(), NodeName: r.NodeName, Addrs: []string{}}
		for _, a := range r.Addrs {
			e.Addrs = append(e.Addrs, a.String())
		}
		entries = append(entries, e)
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(entries); err != nil {
			fmt.Fprintf(stderr, "troupe ls: %v\n", err)
			return 1
		}
		return 0
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tUUID\tPATH\tNODE\tADDRS")
	for _, e := range entries {
		path := e.Path
		if path == "" {
			path = "(node)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", e.Name, e.UUID[:12], path, e.NodeName, strings.Join(e.Addrs, ","))
	}
	tw.Flush()
	return 0
}
