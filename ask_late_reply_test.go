package troupe_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"

	"troupe"
)

type lateAsk struct {
	N       int
	Cancel  context.CancelFunc
	ReplyTo troupe.Ref[int]
}

// A reply that arrives as its Ask ends is never lost: the Ask returns it,
// or it becomes a DeadLetter. The actor here ends each Ask's context and
// then replies, so that the two race; every reply must be accounted for.
func TestAReplyRacingTheEndOfItsAskIsNotLost(t *testing.T) {
	t.Parallel()
	n, err := troupe.Start(ctxFor(t), troupe.Config{Name: "late", Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	dead := make(chan troupe.DeadLetter, 4096)
	troupe.SubscribeChan(n, dead)
	r, err := troupe.Spawn(n, "late", troupe.Behavior[lateAsk]{Receive: func(_ *troupe.Context[lateAsk], m lateAsk) {
		m.Cancel()
		m.ReplyTo.Tell(m.N)
	}})
	if err != nil {
		t.Fatal(err)
	}
	const asks = 2000
	returned := 0
	for i := range asks {
		ctx, cancel := context.WithCancel(context.Background())
		v, err := troupe.Ask(ctx, r, func(reply troupe.Ref[int]) lateAsk { return lateAsk{N: i, Cancel: cancel, ReplyTo: reply} })
		cancel()
		switch {
		case err == nil:
			if v != i {
				t.Fatalf("Ask %d returned the reply %d", i, v)
			}
			returned++
		case !errors.Is(err, context.Canceled):
			t.Fatalf("Ask %d: %v", i, err)
		}
	}
	lost := asks - returned
	wait := ctxFor(t)
	for lost > 0 {
		select {
		case d := <-dead:
			if _, ok := d.Message.(int); !ok || !errors.Is(d.Reason, troupe.ErrActorStopped) {
				t.Fatalf("a dead letter that is not a late reply: %+v", d)
			}
			lost--
		case <-wait.Done():
			t.Fatalf("%d of %d replies neither returned nor dead letters (%d returned)", lost, asks, returned)
		}
	}
	t.Logf("%d replies returned, %d dead letters", returned, asks-returned)
}
