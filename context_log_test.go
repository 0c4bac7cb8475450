package troupe_test

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"troupe"
)

// Context.Log is the node's logger (which names the node) with the
// actor's path as an attribute.
func TestContextLogNamesTheActorAndNode(t *testing.T) {
	t.Parallel()
	var out lockedBuffer
	n, err := troupe.Start(ctxFor(t), troupe.Config{Name: "logger-node", Logger: slog.New(slog.NewTextHandler(&out, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	done := make(chan struct{})
	r, err := troupe.Spawn(n, "talker", troupe.Behavior[string]{Receive: func(c *troupe.Context[string], s string) {
		c.Log().Info("handled", "said", s)
		if c.Log() != c.Log() {
			t.Error("Log made a new logger on each call")
		}
		close(done)
	}})
	if err != nil {
		t.Fatal(err)
	}
	r.Tell("hi")
	within(t, done, 5*time.Second, "the handler")
	if got := out.String(); !strings.Contains(got, `msg=handled node=logger-node path=/user/talker said=hi`) {
		t.Fatalf("the log line: %q", got)
	}
}
