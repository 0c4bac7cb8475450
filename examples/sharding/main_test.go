package main

import (
	"context"
	"strings"
	"testing"
	"time"
)

func TestRun(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("runs the whole demonstration (seconds): runs without -short")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var out strings.Builder
	if err := run(ctx, &out); err != nil {
		t.Fatalf("run: %v\noutput so far:\n%s", err, out.String())
	}
	want := `bank: 30 accounts on 3 nodes took 300 deposits sent from every node; balances right: true
bank: n2 is killed; n1 and n3 see it unreachable
bank: n2's accounts run on n1 and n3 now, the others where they were: true
bank: 300 more deposits; balances right (n2's accounts began again from zero): true
bank: an account never ran on two nodes at once: true
`
	if out.String() != want {
		t.Fatalf("output:\n%s\nwant:\n%s", out.String(), want)
	}
}
