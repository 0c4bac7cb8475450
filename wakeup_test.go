package troupe_test

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"troupe"
)

// wakeReq is a type no other test sends: its first message in a session
// goes with its shape.
type wakeReq struct {
	ReplyTo troupe.Ref[string]
}

func init() { troupe.SetWireKey[wakeReq]("troupe.test.wakereq") }

// The writer of a session is woken for the first frames a session queues
// and for a type's first message (its shape goes first, two frames at
// once): a Resolve and an Ask right after the connection comes up answer
// at once, not at the next heartbeat. With heartbeats a minute apart, a
// frame left waiting would wait 15 seconds; the bound here is 5.
func TestTheFirstFramesOfASessionGoAtOnce(t *testing.T) {
	t.Parallel()
	cfg := func(name string) troupe.Config {
		return troupe.Config{Name: name, Listen: []string{"tcp://127.0.0.1:0"}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
			HeartbeatInterval: time.Minute, UnreachableAfter: 10 * time.Minute}
	}
	a, b := startQuiet(t, cfg("a")), startQuiet(t, cfg("b"))
	if _, err := troupe.Spawn(b, "svc", troupe.Behavior[wakeReq]{Receive: func(c *troupe.Context[wakeReq], m wakeReq) {
		m.ReplyTo.Tell("ok")
	}}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r, err := troupe.Resolve[wakeReq](ctx, a, troupe.FormatRef(b.Addrs()[0], "/user/svc"))
	if err != nil {
		t.Fatalf("the first Resolve of a session: %v", err)
	}
	if got, err := troupe.Ask(ctx, r, func(rr troupe.Ref[string]) wakeReq { return wakeReq{ReplyTo: rr} }); err != nil || got != "ok" {
		t.Fatalf("the first Ask of a type: %q, %v", got, err)
	}
}

func startQuiet(t *testing.T, cfg troupe.Config) *troupe.Node {
	t.Helper()
	n, err := troupe.Start(ctxFor(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}
