package main

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"unicode"
	"unicode/utf8"

	"troupe"
)

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
	if len(c.addrs) == 0 && !diff && os.Getenv("TROUPE_NODE") != "" {
		c.addrs = addrList{os.Getenv("TROUPE_NODE")}
	}
	if want := map[bool]int{false: 1, true: 2}[diff]; len(c.addrs) != want {
		fmt.Fprintf(c.stderr, "troupe schema: give --node %d time(s), got %d\nusage: %s\n", want, len(c.addrs), c.cmd.usage)
		return 2
	}
	return c.withCLINode(ctx, func(ctx context.Context, n *troupe.Node) int { return c.schema(ctx, n, diff) })
}

// schema fetches the nodes' schemas through n and prints them, or their
// diff.
func (c *call) schema(ctx context.Context, n *troupe.Node, diff bool) int {
	var schemas [][]troupe.MessageSchema
	for _, addr := range c.addrs {
		s, err := n.FetchSchema(ctx, addr)
		if err != nil {
			return c.fail(err)
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
			case d.AToB == nil && d.BToA == nil:
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
