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
	want := `home: poked by away, still working
home: gave up on away, quarantined
home: told that /user/steady has stopped
home: poked by home itself, still working
home: network repaired, and still no association
home: reconnected, because somebody decided to
away: poked by home, still working
away: gave up on home, quarantined
away: told that /user/steady has stopped
away: poked by away itself, still working
`
	if out.String() != want {
		t.Fatalf("output:\n%s\nwant:\n%s", out.String(), want)
	}
}
