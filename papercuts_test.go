package troupe_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"troupe"
)

// zeroReq is a request whose ReplyTo its sender may forget to set.
type zeroReq struct {
	ReplyTo troupe.Ref[string]
}

// A reply told to a forgotten (zero) ReplyTo is a dead letter naming the
// zero ref, and the replying actor goes on (#55): it used to panic, which
// stopped the actor. Send and Ask on the zero Ref fail with the same
// reason.
func TestTellingTheZeroRefIsADeadLetter(t *testing.T) {
	// Not beside other tests: the zero Ref belongs to no node, so its dead
	// letter goes to every node the process has open, and other tests'
	// nodes must not hear it.
	n := quietNode(t, nil)
	dead := make(chan troupe.DeadLetter, 10)
	troupe.SubscribeChan(n, dead)
	r, err := troupe.Spawn(n, "replier", troupe.Behavior[zeroReq]{Receive: func(_ *troupe.Context[zeroReq], m zeroReq) {
		m.ReplyTo.Tell("done")
	}})
	if err != nil {
		t.Fatal(err)
	}
	r.Tell(zeroReq{}) // no ReplyTo
	d := within(t, dead, 10*time.Second, "the reply's dead letter")
	if d.Target != "<zero ref>" || d.Message != "done" || !strings.Contains(d.Reason.Error(), "zero Ref") {
		t.Fatalf("dead letter = %+v, want the reply to <zero ref>", d)
	}
	got, err := troupe.Ask(ctxFor(t), r, func(to troupe.Ref[string]) zeroReq { return zeroReq{ReplyTo: to} })
	if err != nil || got != "done" {
		t.Fatalf("after the zero-ref reply the actor answers %q, %v; want done: it should have gone on", got, err)
	}

	var zero troupe.Ref[string]
	if err := zero.Send(context.Background(), "sent"); err == nil || !strings.Contains(err.Error(), "zero Ref") {
		t.Fatalf("Send on the zero Ref = %v, want an error naming the zero Ref", err)
	}
	if d := within(t, dead, 10*time.Second, "the Send's dead letter"); d.Message != "sent" {
		t.Fatalf("dead letter = %+v, want the Send's", d)
	}
	var zeroReqRef troupe.Ref[zeroReq]
	if _, err := troupe.Ask(ctxFor(t), zeroReqRef, func(to troupe.Ref[string]) zeroReq { return zeroReq{ReplyTo: to} }); err == nil || !strings.Contains(err.Error(), "zero Ref") {
		t.Fatalf("Ask on the zero Ref = %v, want an error naming the zero Ref", err)
	}
}

// FormatRef puts the slash a path forgot, and ParseRef's errors point to
// FormatRef when a ref was glued together by hand (#55).
func TestRefStringsMadeByHandGetAHint(t *testing.T) {
	t.Parallel()
	addr, err := troupe.ParseAddr("127.0.0.1:7001")
	if err != nil {
		t.Fatal(err)
	}
	if got := troupe.FormatRef(addr, "ping"); got != "troupe://127.0.0.1:7001/ping" {
		t.Errorf(`FormatRef(addr, "ping") = %q, want troupe://127.0.0.1:7001/ping`, got)
	}
	for _, s := range []string{"troupe://" + addr.String() + "/user/x", "troupe://127.0.0.1/user/x"} {
		_, _, err := troupe.ParseRef(s)
		if !errors.Is(err, troupe.ErrBadAddr) || !strings.Contains(err.Error(), "FormatRef") {
			t.Errorf("ParseRef(%q) = %v, want ErrBadAddr pointing to FormatRef", s, err)
		}
	}
	if _, err := troupe.ParseAddr("garbage"); err == nil || strings.Count(err.Error(), "garbage") != 1 {
		t.Errorf(`ParseAddr("garbage") = %v, want the address named once`, err)
	}
}

// StartCluster on a node that has closed says so, not that the node
// should listen somewhere (#55).
func TestStartClusterOnAClosedNodeSaysItIsClosed(t *testing.T) {
	t.Parallel()
	for _, listen := range [][]string{{"127.0.0.1:0"}, nil} {
		n, err := troupe.Start(ctxFor(t), troupe.Config{Listen: listen, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		n.Close()
		if _, err := troupe.StartCluster(ctxFor(t), n, troupe.ClusterConfig{}); !errors.Is(err, troupe.ErrNodeClosed) {
			t.Errorf("StartCluster on a closed node (Listen %q) = %v, want ErrNodeClosed", listen, err)
		}
	}
}
