package troupe

import (
	"os"
	"testing"
)

// longRun skips t unless TROUPE_LONG is set: see long_test.go.
func longRun(t *testing.T, orSet ...string) {
	t.Helper()
	for _, env := range orSet {
		if os.Getenv(env) != "" {
			return
		}
	}
	if os.Getenv("TROUPE_LONG") == "" {
		t.Skip("a long run: TROUPE_LONG=1 runs it (.ci/run's long-run step does)")
	}
}

// slowTest skips t under -short: it takes a second or more, and -short is
// for the edit-and-run loop (the default suite and CI run it).
func slowTest(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("takes a second or more: runs without -short")
	}
}
