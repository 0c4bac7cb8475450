package troupe

import (
	"context"
	"errors"
	"testing"
	"time"
)

// timerMsg is what the timer tests' actors receive: either a command from
// the test or a timer's delivery.
type timerMsg struct {
	Cmd string
	N   int
}

func TestTimerOnceReplaceAndCancel(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	n := startNode(t, testConfig())
	got := make(chan int, 16)
	r, _ := Spawn(n, "timed", Behavior[timerMsg]{
		Receive: func(c *Context[timerMsg], m timerMsg) {
			switch m.Cmd {
			case "start":
				c.StartTimer("k", 20*time.Millisecond, timerMsg{Cmd: "fire", N: m.N})
			case "later":
				c.StartTimer("other", 80*time.Millisecond, timerMsg{Cmd: "fire", N: m.N})
			case "cancel":
				if !c.CancelTimer("k") {
					got <- -1
				}
			case "fire":
				got <- m.N
			}
		},
	})
	r.Tell(timerMsg{Cmd: "start", N: 1})
	r.Tell(timerMsg{Cmd: "start", N: 2}) // replaces the first: 1 is never delivered
	if v := recv(t, got, "the timer"); v != 2 {
		t.Fatalf("timer delivered %d, want 2 (the replacement)", v)
	}
	r.Tell(timerMsg{Cmd: "start", N: 3})
	r.Tell(timerMsg{Cmd: "cancel"})
	// A timer of another key, due well after the cancelled one was, comes
	// first: the cancelled one never fires.
	r.Tell(timerMsg{Cmd: "later", N: 4})
	if v := recv(t, got, "the timer after a cancel"); v != 4 {
		t.Fatalf("after cancel: %d, want 4 (3 was cancelled)", v)
	}
}

func TestTickerAndCancelOnStop(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	n := startNode(t, testConfig())
	ticks := make(chan int, 64)
	count := 0
	r, _ := Spawn(n, "ticking", Behavior[timerMsg]{
		Setup: func(c *Context[timerMsg]) { c.StartTicker("tick", 5*time.Millisecond, timerMsg{Cmd: "tick"}) },
		Receive: func(c *Context[timerMsg], m timerMsg) {
			count++
			ticks <- count
			if count == 5 {
				c.Stop()
			}
		},
	})
	stopped := watcher(t, n, "probe", r)
	for i := 1; i <= 5; i++ {
		if v := recv(t, ticks, "a tick"); v != i {
			t.Fatalf("tick %d, want %d", v, i)
		}
	}
	recv(t, stopped, "the actor to stop")
	// The ticker died with the actor: nothing more arrives, and a tick that
	// fired meanwhile is not a dead letter of a running timer.
	select {
	case v := <-ticks:
		t.Fatalf("tick %d after the actor stopped", v)
	case <-time.After(50 * time.Millisecond):
	}
}

func TestActorContextEndsWithTheActor(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	n := startNode(t, testConfig())
	ctxs := make(chan context.Context, 1)
	r, _ := Spawn(n, "ctx", Behavior[int]{
		Receive: func(c *Context[int], m int) {
			if m == 1 {
				ctxs <- c.Context()
				return
			}
			c.Stop()
		},
	})
	r.Tell(1)
	ctx := recv(t, ctxs, "the actor's context")
	if ctx.Err() != nil {
		t.Fatalf("the context of a running actor is done: %v", ctx.Err())
	}
	r.Tell(2)
	select {
	case <-ctx.Done():
		if !errors.Is(ctx.Err(), context.Canceled) {
			t.Fatalf("ctx.Err() = %v", ctx.Err())
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the actor stopped and its context is not done")
	}
}

func TestActorContextEndsWithTheNode(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	n, err := Start(ctxT(t, 5*time.Second), testConfig())
	if err != nil {
		t.Fatal(err)
	}
	checkLeaks(t)
	ctxs := make(chan context.Context, 1)
	r, _ := Spawn(n, "ctx", Behavior[int]{Receive: func(c *Context[int], _ int) { ctxs <- c.Context() }})
	r.Tell(1)
	ctx := recv(t, ctxs, "the actor's context")
	n.Close()
	if ctx.Err() == nil {
		t.Fatal("the node closed and the actor's context is not done")
	}
}
