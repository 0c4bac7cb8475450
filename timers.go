package troupe

import (
	"context"
	"log/slog"
	"maps"
	"time"
)

// An actor's everyday tools tied to its lifetime: a context.Context that
// ends when it stops, and timers that deliver messages to it.

// actorTools holds what only some actors use — timers, a context, and
// terminations waiting behind messages — so an idle actor does not pay for
// them.
type actorTools[T any] struct {
	later    []sysMsg // terminations (and the like: follows) waiting for the messages ahead of them
	timers   map[any]*actorTimer[T]
	timerSeq uint64
	ctx      context.Context
	cancel   context.CancelFunc
	failed   error // reported by Context.Fail during the current handler
	log      *slog.Logger
	sup      *supState // failures and a pending restart (supervised actors)
	fence    Fence     // a singleton instance's or an entity's (fence.go)
	// awaitingChildren: the actor is stopping, and waits for its children
	// to stop first (see terminate).
	awaitingChildren bool
	// hdrs are the headers of messages of the batch being handled (see
	// heldHeaders); cur those of the message being handled, curCtx the
	// Context.Context that carries them, made on first use.
	hdrs   []heldHeaders
	cur    Headers
	curCtx context.Context
	// stopTaken: the signals being handled hold a stop that cancels the
	// context (see drainSys).
	stopTaken bool
}

// Context returns a context.Context that is done as soon as the actor is
// asked to stop (by [Context.Stop] once the handler returns, by its
// parent's stop, by [Node.Stop]), or its node starts closing
// ([Node.Close], [Node.Shutdown]).
// Pass it to blocking calls a handler starts — an HTTP request, a
// database query — so that they end with the actor, and the node's
// Close does not wait on them.
//
// While the actor handles a message that carries headers, the context
// carries them too (see [WithHeaders]): a handler that sends or asks with
// it passes them on.
func (c *Context[T]) Context() context.Context {
	t := c.c.tooling()
	if t.cur != nil {
		if t.curCtx == nil {
			t.curCtx = context.WithValue(c.c.actorContext(), headersKey{}, t.cur)
		}
		return t.curCtx
	}
	return c.c.actorContext()
}

// headers returns a copy of the headers of the message being handled, or
// nil: what HeadersFrom(c.Context()) returns, without making the actor's
// context.
func (c *Context[T]) headers() Headers {
	if t := c.c.tools; t != nil {
		return maps.Clone(t.cur)
	}
	return nil
}

// Log returns the node's logger (Config.Logger, which names the node as
// "node") with the actor's path as "path", the key troupe's own logs about
// an actor use, so that what a handler logs says where it came from. Call
// it on the actor's goroutine, like every Context method; the logger it
// returns may be used anywhere. It is made once per actor.
func (c *Context[T]) Log() *slog.Logger {
	t := c.c.tooling()
	if t.log == nil {
		t.log = c.c.n.log.With("path", c.c.self.key.path)
	}
	return t.log
}

// actorTimer is one of an actor's timers.
type actorTimer[T any] struct {
	t     *time.Timer
	msg   T
	every time.Duration // 0: once
	gen   uint64        // which start of the key this is
}

// StartTimer delivers msg to the actor once, after d. Starting a timer
// with a key that is running replaces it: the old one's message is not
// delivered, even if it is already due. Timers are cancelled when the
// actor stops. The message is handled on the actor's goroutine like any
// other, and an idle timer holds no goroutine.
func (c *Context[T]) StartTimer(key any, d time.Duration, msg T) {
	c.c.startTimer(key, d, 0, msg)
}

// StartTicker delivers msg to the actor every period, starting one period
// from now, until [Context.CancelTimer] or the actor stops. Keys are shared
// with [Context.StartTimer].
func (c *Context[T]) StartTicker(key any, period time.Duration, msg T) {
	c.c.startTimer(key, period, max(period, time.Millisecond), msg)
}

// CancelTimer cancels the timer with key; its message is not delivered,
// even if it is already due. It reports whether such a timer was running.
func (c *Context[T]) CancelTimer(key any) bool {
	if c.c.tools == nil {
		return false
	}
	t, ok := c.c.tools.timers[key]
	if ok {
		t.t.Stop()
		delete(c.c.tools.timers, key)
	}
	return ok
}
