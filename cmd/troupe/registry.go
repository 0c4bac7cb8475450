package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"troupe"
)

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
	if errors.Is(err, troupe.ErrAuth) || tlsFailure(err) || c.maybeTLS(err) {
		return c.fail(err)
	}
	hint := "is a registrar running there? (troupe registrar --addr " + addr + ")"
	if errors.Is(err, troupe.ErrMalformed) {
		return c.failf("something answers at %s but does not speak troupe's protocol: is it an HTTP port (a registrar's --http, a debug page)? give the address the registrar serves the registry on", addr)
	}
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

// withNode runs f with the command's own short-lived node and the
// registrar's address, all within the command's timeout.
func (c *call) withNode(ctx context.Context, f func(ctx context.Context, n *troupe.Node, addr string) int) int {
	addr, err := c.registryAddr()
	if err != nil {
		fmt.Fprintf(c.stderr, "troupe %s: --registry: %v\n", c.cmd.name, err)
		return 2
	}
	return c.withCLINode(ctx, func(ctx context.Context, n *troupe.Node) int { return f(ctx, n, addr) })
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
	q, err := n.QueryActor(ctx, name, troupe.WithRegistries(addr))
	if errors.Is(err, troupe.ErrNotFound) {
		return c.failf("%s: not registered at %s", name, addr)
	}
	if err != nil {
		return c.noRegistrar(addr, err)
	}
	if c.asJSON {
		return c.printJSON(queryResult{Addr: q.Addrs[0].String(), Registration: toJSON(q)})
	}
	fmt.Fprintln(c.stdout, q.Addrs[0])
	return 0
}

// watch prints the registrar's table, then its changes, until ctx ends.
// watchEvent is one line of `troupe watch --json`.
type watchEvent struct {
	Op           string       `json:"op"` // "+" registered, "-" removed
	At           time.Time    `json:"at"` // when watch heard it, to the millisecond
	Registration registration `json:"registration"`
}

// watchLine prints one registration (op "+") or removal ("-"): name,
// uuid, the node it belongs (or belonged) to and that node's addresses.
func (c *call) watchLine(op string, r troupe.Registration) {
	e := toJSON(r)
	at := time.Now().Truncate(time.Millisecond)
	if c.asJSON {
		b, _ := json.Marshal(watchEvent{Op: op, At: at, Registration: e})
		fmt.Fprintf(c.stdout, "%s\n", b)
		return
	}
	fmt.Fprintf(c.stdout, "%s %s %s %s %s %s\n", op, printable(e.Name), e.UUID, orDash(printable(e.NodeName)), orDash(strings.Join(e.Addrs, ",")), at.Format("15:04:05.000"))
}

func watch(ctx context.Context, c *call) int {
	addr, err := c.registryAddr()
	if err != nil {
		fmt.Fprintf(c.stderr, "troupe watch: --registry: %v\n", err)
		return 2
	}
	n, code := c.cliNode(ctx)
	if n == nil {
		return code
	}
	defer n.Close()
	seen := map[string]troupe.Registration{}
	key := func(r troupe.Registration) string { return r.Name + " " + r.UUID.String() }
	apply := func(ch troupe.RegistryChange) {
		if ch.Snapshot {
			now := map[string]troupe.Registration{}
			for _, r := range ch.Added {
				now[key(r)] = r
			}
			var gone []troupe.Registration
			for k, r := range seen {
				if _, ok := now[k]; !ok {
					gone = append(gone, r)
				}
			}
			slices.SortFunc(gone, func(a, b troupe.Registration) int { return cmp.Compare(a.Name, b.Name) })
			for _, r := range gone {
				c.watchLine("-", r)
			}
			for _, r := range ch.Added {
				if _, ok := seen[key(r)]; !ok {
					c.watchLine("+", r)
				}
			}
			seen = now
			return
		}
		byName := func(a, b troupe.Registration) int { return cmp.Compare(key(a), key(b)) } // (a node's departure removes its entries in no order)
		for _, r := range slices.SortedFunc(slices.Values(ch.Removed), byName) {
			delete(seen, key(r))
			c.watchLine("-", r)
		}
		for _, r := range slices.SortedFunc(slices.Values(ch.Added), byName) {
			seen[key(r)] = r
			c.watchLine("+", r)
		}
	}
	for first := true; ; first = false {
		reg, err := n.Registry(troupe.WithRegistries(addr))
		if err != nil {
			return c.noRegistrar(addr, err)
		}
		heard := false
		err = reg.Watch(ctx, func(ch troupe.RegistryChange) { heard = true; apply(ch) })
		switch {
		case ctx.Err() != nil:
			return 0
		case errors.Is(err, errors.ErrUnsupported):
			return c.pollWatch(ctx, reg, addr, apply)
		case first && !heard:
			return c.noRegistrar(addr, err)
		}
		if heard { // (said once a streak: the tries that follow fail the same way)
			fmt.Fprintf(c.stderr, "troupe watch: %s; watching again\n", strings.TrimPrefix(err.Error(), "troupe: "))
		}
		select {
		case <-ctx.Done():
			return 0
		case <-time.After(max(c.timeout, 10*time.Millisecond)):
		}
	}
}

// pollWatch follows a registrar that cannot push (before troupe 0.11) by asking
// for its table every --interval and printing the difference.
func (c *call) pollWatch(ctx context.Context, reg *troupe.Registry, addr string, apply func(troupe.RegistryChange)) int {
	tick := time.NewTicker(max(c.timeout, 10*time.Millisecond))
	defer tick.Stop()
	for first := true; ; first = false {
		lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		list, err := reg.List(lctx)
		cancel()
		switch {
		case ctx.Err() != nil:
			return 0
		case err != nil && first:
			return c.noRegistrar(addr, err)
		case err != nil:
			fmt.Fprintf(c.stderr, "troupe watch: %v\n", err)
		default:
			apply(troupe.RegistryChange{Snapshot: true, Added: list})
		}
		select {
		case <-ctx.Done():
			return 0
		case <-tick.C:
		}
	}
}
