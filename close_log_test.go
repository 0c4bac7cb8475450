package troupe_test

import (
	"io"
	"log/slog"
	"strings"
	"testing"

	"troupe"
)

// A node closed while its messages are in flight logs none of them as a
// dead letter: a closing node's own dead letters are not logged (they are
// still published and counted), unconfirmed ones included.
func TestClosingWithMessagesInFlightLogsNoDeadLetter(t *testing.T) {
	t.Parallel()
	b, err := troupe.Start(ctxFor(t), troupe.Config{Name: "b", Listen: []string{"tcp://127.0.0.1:0"}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if _, err := troupe.Spawn(b, "sink", troupe.Behavior[[]byte]{Receive: func(*troupe.Context[[]byte], []byte) {}}); err != nil {
		t.Fatal(err)
	}
	for run := range 10 {
		var logs lockedBuffer
		a, err := troupe.Start(ctxFor(t), troupe.Config{Name: "a", Logger: slog.New(slog.NewTextHandler(&logs, nil))})
		if err != nil {
			t.Fatal(err)
		}
		sink, err := troupe.Resolve[[]byte](ctxFor(t), a, troupe.FormatRef(b.Addrs()[0], "/user/sink"))
		if err != nil {
			t.Fatal(err)
		}
		msg := make([]byte, 1024)
		for i := range 5000 {
			msg[i%len(msg)]++
			sink.Tell(msg)
		}
		a.Close()
		if strings.Contains(logs.String(), "dead letter") {
			t.Fatalf("run %d: a closing node logged its own dead letters:\n%s", run, logs.String())
		}
	}
}
