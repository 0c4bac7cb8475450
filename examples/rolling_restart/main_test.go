package main

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestMain makes the test binary a service process when run as one.
func TestMain(m *testing.M) {
	if registry := os.Getenv(serviceEnv); registry != "" {
		slot, _ := strconv.Atoi(os.Getenv(slotEnv))
		if err := service(registry, slot); err != nil {
			os.Stderr.WriteString(err.Error() + "\n")
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// Three service processes restarted in turn by SIGTERM while a client
// asks steadily: no request is lost, and every process — the three old
// and the three new — answered some.
func TestRollingRestartLosesNoRequest(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("runs the whole demonstration (seconds): runs without -short")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	res, err := run(ctx, exe, []string{"-test.run=^$"})
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	res.print(&out)
	t.Log(out.String())
	if res.Lost != 0 {
		t.Errorf("%d requests lost", res.Lost)
	}
	if res.Restarts != slots || res.Services != 2*slots {
		t.Errorf("%d restarts, %d service processes answered; want %d and %d", res.Restarts, res.Services, slots, 2*slots)
	}
	if res.Requests < 100 {
		t.Errorf("only %d requests during the deploy", res.Requests)
	}
}
