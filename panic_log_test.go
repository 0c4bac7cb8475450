package troupe_test

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"troupe"
)

//go:noinline
func explodeForTheLog() { panic("boom") }

// A panic's stack is logged as one key per frame ("stack.0" is the
// function that panicked), not as one escaped string of tabs and
// newlines under the default text handler.
func TestAPanicStackIsLoggedFrameByFrame(t *testing.T) {
	t.Parallel()
	var logs lockedBuffer
	n, err := troupe.Start(ctxFor(t), troupe.Config{Name: "p", Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	ref, err := troupe.Spawn(n, "bomb", troupe.Behavior[string]{Receive: func(*troupe.Context[string], string) { explodeForTheLog() }})
	if err != nil {
		t.Fatal(err)
	}
	ref.Tell("go")
	waitUntil(t, 10*time.Second, "the failure is logged", func() bool { return strings.Contains(logs.String(), "actor failed") })
	line := ""
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, "actor failed") {
			line = l
		}
	}
	if !strings.Contains(line, `stack.0="troupe_test.explodeForTheLog `) || !strings.Contains(line, "panic_log_test.go:") {
		t.Fatalf("the first frame is not the function that panicked:\n%s", line)
	}
	if strings.Contains(line, `\n`) || strings.Contains(line, `\t`) || strings.Contains(line, "goroutine ") {
		t.Fatalf("the stack is logged as one escaped string:\n%s", line)
	}
}
