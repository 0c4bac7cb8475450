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
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var out strings.Builder
	if err := run(ctx, &out); err != nil {
		t.Fatalf("run: %v", err)
	}
	want := `store: n1 wrote "first"
n1: the write stalls midway; the network cuts n1 off
store: n2 wrote "from n2"
n1: the stalled write goes on
store: n1: refused "from n1, stalled": its fence is older than one the store has seen
`
	if out.String() != want {
		t.Fatalf("output:\n%s\nwant:\n%s", out.String(), want)
	}
}
