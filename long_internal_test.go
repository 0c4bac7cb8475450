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
