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
	want := `home: cluster up with 2 members
home: away is unreachable
home: holds the lease, so it downed away and keeps serving
home: the split is resolved; home survived
away: cluster up with 2 members
away: home is unreachable
away: could not take the lease, so it downed itself
`
	if out.String() != want {
		t.Fatalf("output:\n%s\nwant:\n%s", out.String(), want)
	}
}
