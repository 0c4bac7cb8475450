package troupe_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"troupe"
)

// A lookup that finds the name registered but cannot hand out a ref says
// why: another message type is ErrWrongType, a context that ended is the
// context's error. Neither is ErrNotFound, which would say the name is
// not registered when it is.
func TestALookupThatFindsTheNameSaysWhyItReturnsNoRef(t *testing.T) {
	t.Parallel()
	start := registryStarter(t)
	service, finder := start("service"), start("finder")
	if _, err := troupe.Spawn(service, "echo", troupe.Behavior[string]{Receive: func(*troupe.Context[string], string) {}}); err != nil {
		t.Fatal(err)
	}
	// Another message type, on a peer and on this node.
	if _, err := troupe.FindActor[int](ctxFor(t), finder, "echo"); !errors.Is(err, troupe.ErrWrongType) || errors.Is(err, troupe.ErrNotFound) {
		t.Fatalf("FindActor[int] of a string actor on a peer = %v, want ErrWrongType and not ErrNotFound", err)
	}
	if _, err := troupe.FindActor[int](ctxFor(t), service, "echo"); !errors.Is(err, troupe.ErrWrongType) || errors.Is(err, troupe.ErrNotFound) {
		t.Fatalf("FindActor[int] of a string actor on its own node = %v, want ErrWrongType and not ErrNotFound", err)
	}
	if _, err := troupe.WaitForActor[int](ctxFor(t), finder, "echo"); !errors.Is(err, troupe.ErrWrongType) {
		t.Fatalf("WaitForActor[int] of a string actor = %v, want ErrWrongType", err)
	}
	// The right type is found, and a later wrong-type lookup still says so.
	if _, err := troupe.FindActor[string](ctxFor(t), finder, "echo"); err != nil {
		t.Fatalf("FindActor[string]: %v", err)
	}
	if _, err := troupe.FindActor[int](ctxFor(t), finder, "echo"); !errors.Is(err, troupe.ErrWrongType) {
		t.Fatalf("FindActor[int] after a FindActor[string] = %v, want ErrWrongType", err)
	}
	// A context that has ended: the context's error, however far the
	// lookup got.
	ctx, cancel := context.WithTimeout(context.Background(), time.Nanosecond)
	defer cancel()
	<-ctx.Done()
	other := start("other")
	if _, err := troupe.FindActor[string](ctx, other, "echo"); !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, troupe.ErrNotFound) {
		t.Fatalf("FindActor with an ended context = %v, want context.DeadlineExceeded and not ErrNotFound", err)
	}
}
