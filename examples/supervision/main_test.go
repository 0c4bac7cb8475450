package main

import (
	"context"
	"strings"
	"testing"
	"time"
)

func TestRun(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out strings.Builder
	if err := run(ctx, &out); err != nil {
		t.Fatalf("run: %v", err)
	}
	want := `parent: 3 squared is 9 (worker run 1, job 1 of the run)
parent: 4 squared is 16 (worker run 1, job 2 of the run)
parent: worker run 1 failed (troupe: actor panicked: bad input "oops"); it restarts after a pause
parent: 5 squared is 25 (worker run 2, job 1 of the run)
parent: worker run 2 failed (troupe: actor panicked: bad input "x"); it restarts after a pause
parent: 6 squared is 36 (worker run 3, job 1 of the run)
parent: the worker stopped for good, failing on bad input "?"
`
	if out.String() != want {
		t.Fatalf("output:\n%s\nwant:\n%s", out.String(), want)
	}
}
