package main

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"
)

// One trace id on each of the three nodes, each span the child of the one
// before.
func TestRun(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var out strings.Builder
	if err := run(ctx, &out); err != nil {
		t.Fatalf("run: %v", err)
	}
	line := regexp.MustCompile(`node=(\w+) .*trace_id=(\w+) span_id=(\w+) parent_id=(\w*)`)
	last := regexp.MustCompile(`(?m)^gateway: order placed, stock reserved \(trace (\w{32})\)$`).FindStringSubmatch(out.String())
	if last == nil {
		t.Fatalf("no answer with a trace id in:\n%s", out.String())
	}
	var nodes []string
	parent := ""
	for _, l := range strings.Split(out.String(), "\n") {
		m := line.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		if m[2] != last[1] || m[4] != parent {
			t.Errorf("%s: want trace %s, parent %q", l, last[1], parent)
		}
		nodes = append(nodes, m[1])
		parent = m[3]
	}
	if strings.Join(nodes, " ") != "gateway orders stock" {
		t.Fatalf("the trace was logged on %v, want gateway, orders, stock:\n%s", nodes, out.String())
	}
}
