package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"troupe"
)

func down(ctx context.Context, c *call) int {
	return c.atNode(ctx, c.down)
}

func (c *call) down(ctx context.Context, n *troupe.Node) int {
	if err := n.DownMember(ctx, c.node, c.args[0]); err != nil {
		return c.fail(err)
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
		Addr       string  `json:"addr"`
		UID        string  `json:"uid"`
		Name       string  `json:"name"`
		AppVersion string  `json:"app_version"`
		State      string  `json:"state"`
		WindowLeft float64 `json:"window_left_seconds"`
		Member     bool    `json:"member"`
		BytesIn    uint64  `json:"bytes_in"`
		BytesOut   uint64  `json:"bytes_out"`
	} `json:"peers"`
	Quarantined []struct {
		UID   string   `json:"uid"`
		Name  string   `json:"name"`
		Addrs []string `json:"addrs"`
		Cause string   `json:"cause"`
	} `json:"quarantined"`
	Observers   int               `json:"observers"`
	Actors      int               `json:"actors"`
	ActorList   []mailbox         `json:"actor_list"`
	Mailboxes   []mailbox         `json:"mailboxes"`
	DeadLetters map[string]uint64 `json:"dead_letters"`
	Members     []struct {
		Addr       string `json:"addr"`
		Name       string `json:"name"`
		AppVersion string `json:"app_version"`
		Status     string `json:"status"`
		Reachable  bool   `json:"reachable"`
	} `json:"members"`
	ClusterBlocked string `json:"cluster_blocked"`
	Registrar      bool   `json:"registrar"`
	Registrations  int    `json:"registrations"`
}

// windowLeft writes the window a peer has left, from the stats
// document's seconds: "9.977s", "0s (expired)".
func windowLeft(secs float64) string {
	if secs <= 0 {
		return "0s (expired)"
	}
	return time.Duration(secs * float64(time.Second)).Round(time.Millisecond).String()
}

// mailbox is one actor's path and mailbox depth in a stats document.
type mailbox struct {
	Path    string `json:"path"`
	Waiting int    `json:"waiting"`
}

// remoteStats asks a node for its stats and prints what the command
// shows.
func remoteStats(ctx context.Context, c *call) int {
	return c.atNode(ctx, c.remoteStats)
}

func (c *call) remoteStats(ctx context.Context, n *troupe.Node) int {
	doc, err := n.FetchStats(ctx, c.node)
	if err != nil {
		return c.fail(err)
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
			state, left := p.State, windowLeft(p.WindowLeft)
			if p.Member {
				state, left = state+" (member)", "-"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\n", p.Addr, p.Name, orDash(p.AppVersion), p.UID, state, left, p.BytesIn, p.BytesOut)
		}
		for _, q := range s.Quarantined {
			fmt.Fprintf(tw, "%s\t%s\t-\t%s\tquarantined\t-\t-\t-\t(%s)\n", strings.Join(q.Addrs, ","), q.Name, q.UID, q.Cause)
		}
	case "actors":
		slices.SortStableFunc(s.ActorList, func(a, b mailbox) int { return b.Waiting - a.Waiting })
		fmt.Fprintln(tw, "PATH\tWAITING")
		for _, a := range s.ActorList {
			fmt.Fprintf(tw, "%s\t%d\n", a.Path, a.Waiting)
		}
	default:
		printSummary(tw, s)
	}
	return 0
}

// printSummary prints what troupe stats shows of a node's stats.
func printSummary(tw io.Writer, s nodeStats) {
	byState := map[string]int{}
	for _, p := range s.Peers {
		byState[p.State]++
	}
	fmt.Fprintf(tw, "node\t%s (%s) on %s\n", printable(s.Name), s.UID, strings.Join(s.Addrs, ","))
	if s.AppVersion != "" {
		fmt.Fprintf(tw, "version\t%s\n", s.AppVersion)
	}
	counts := []string{fmt.Sprintf("%d up", byState["up"])}
	for _, st := range []string{"connecting", "suspended", "ending", "leaving", "retiring", "closed"} {
		if byState[st] > 0 {
			counts = append(counts, fmt.Sprintf("%d %s", byState[st], st))
		}
	}
	if s.Observers > 0 {
		counts = append(counts, fmt.Sprintf("and %d observer(s) such as this command", s.Observers))
	}
	fmt.Fprintf(tw, "peers\t%s\n", strings.Join(counts, ", "))
	fmt.Fprintf(tw, "quarantined\t%d\n", len(s.Quarantined))
	fmt.Fprintf(tw, "actors\t%d\n", s.Actors)
	if len(s.Mailboxes) == 0 {
		fmt.Fprintf(tw, "deepest mailboxes\tnone waiting\n")
	}
	for i, m := range s.Mailboxes {
		label := ""
		if i == 0 {
			label = "deepest mailboxes"
		}
		fmt.Fprintf(tw, "%s\t%s %d waiting\n", label, printable(m.Path), m.Waiting)
	}
	var reasons []string
	for r, n := range s.DeadLetters {
		reasons = append(reasons, fmt.Sprintf("%s %d", r, n))
	}
	slices.Sort(reasons)
	if len(reasons) == 0 {
		reasons = []string{"none"}
	}
	fmt.Fprintf(tw, "dead letters\t%s\n", strings.Join(reasons, ", "))
	if s.Registrar {
		fmt.Fprintf(tw, "registrar\tyes, holding %d registration(s)\n", s.Registrations)
	}
	if s.ClusterBlocked != "" {
		fmt.Fprintf(tw, "cluster\tBLOCKED: %s\n", printable(s.ClusterBlocked))
	}
	for _, m := range s.Members {
		fmt.Fprintf(tw, "member\t%s %s %s reachable=%v version=%s\n", m.Addr, orDash(printable(m.Name)), m.Status, m.Reachable, orDash(m.AppVersion))
	}
}

// quarantineRow is one quarantined peer as the node's stats document has
// it.
type quarantineRow struct {
	UID   string   `json:"uid"`
	Name  string   `json:"name"`
	Addrs []string `json:"addrs"`
	Since string   `json:"since"`
	Cause string   `json:"cause"`
}

// quarantine lists a node's quarantines, or clears one.
func quarantine(ctx context.Context, c *call) int {
	return c.atNode(ctx, c.quarantine)
}

func (c *call) quarantine(ctx context.Context, n *troupe.Node) int {
	if c.args[0] == "clear" {
		peer := c.args[1]
		cleared, err := n.ClearQuarantine(ctx, peer, troupe.OnNode(c.node))
		switch {
		case errors.Is(err, troupe.ErrBadAddr):
			fmt.Fprintf(c.stderr, "troupe %s: %s\nusage: %s\n", c.cmd.name, strings.TrimPrefix(err.Error(), "troupe: "), c.cmd.usage)
			return 2
		case err != nil:
			return c.fail(err)
		case !cleared:
			return c.failf("%s is not quarantined at %s", printable(peer), c.node)
		}
		fmt.Fprintf(c.stdout, "%s: quarantine lifted at %s\n", printable(peer), c.node)
		return 0
	}
	doc, err := n.FetchStats(ctx, c.node)
	if err != nil {
		return c.fail(err)
	}
	var s struct {
		Quarantined []quarantineRow `json:"quarantined"`
	}
	if err := json.Unmarshal(doc, &s); err != nil {
		return c.failf("the node's answer is not a stats document: %v", err)
	}
	if s.Quarantined == nil {
		s.Quarantined = []quarantineRow{}
	}
	if c.asJSON {
		return c.printJSON(s.Quarantined)
	}
	tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
	defer tw.Flush()
	fmt.Fprintln(tw, "ADDRS\tNAME\tUID\tSINCE\tCAUSE")
	for _, q := range s.Quarantined {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", orDash(strings.Join(q.Addrs, ",")), printable(q.Name), q.UID, q.Since, printable(q.Cause))
	}
	return 0
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
