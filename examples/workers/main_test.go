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
		t.Fatalf("run: %v\noutput so far:\n%s", err, out.String())
	}
	want := `front: 9 workers on 3 nodes serve 30 customers, each always by the same worker
front: w2 vanished
front: 6 workers on 2 nodes serve them now
front: only the customers of w2's workers moved: true
front: every other customer kept its worker: true
`
	if out.String() != want {
		t.Fatalf("output:\n%s\nwant:\n%s", out.String(), want)
	}
}
