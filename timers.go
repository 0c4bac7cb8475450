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
	later    []sysMsg // terminations waiting for the messages ahead of them
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

// tooling returns the actor's tools, making them on first use.
func (c *cell[T]) tooling() *actorTools[T] {
	if c.tools == nil {
		c.tools = &actorTools[T]{}
	}
	return c.tools
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

// actorContext returns the actor's context, made on first use (see
// Context.Context).
func (c *cell[T]) actorContext() context.Context {
	t := c.tooling()
	if t.ctx == nil {
		t.ctx, t.cancel = context.WithCancel(c.n.lc.actorsCtx)
		if c.stopping || t.stopTaken {
			t.cancel() // asked for in PostStop, or after Stop
		}
		// A stop pushed from elsewhere cancels it at once, while a
		// handler may still be waiting on it (see sysPush).
		c.mu.Lock()
		c.moreFor().cancel = t.cancel
		pushed := c.stopPushedLocked() // before this call: nothing cancelled it
		c.mu.Unlock()
		if pushed {
			t.cancel()
		}
	}
	return t.ctx
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

func (c *cell[T]) startTimer(key any, d, every time.Duration, msg T) {
	tt := c.tooling()
	if old, ok := tt.timers[key]; ok {
		old.t.Stop()
	}
	if tt.timers == nil {
		tt.timers = make(map[any]*actorTimer[T])
	}
	tt.timerSeq++
	gen := tt.timerSeq
	at := &actorTimer[T]{msg: msg, every: every, gen: gen}
	at.t = time.AfterFunc(d, func() { c.sysPush(sysMsg{kind: sysTimer, timerKey: key, timerGen: gen}) })
	tt.timers[key] = at
}

// fireTimer handles a due timer on the actor's goroutine: its message is
// received unless the timer was cancelled or replaced meanwhile.
func (c *cell[T]) fireTimer(key any, gen uint64) {
	if c.tools == nil || c.stopping {
		return
	}
	at, ok := c.tools.timers[key]
	if !ok || at.gen != gen {
		return // cancelled or replaced after it fell due
	}
	if at.every > 0 {
		at.t.Reset(at.every)
	} else {
		delete(c.tools.timers, key)
	}
	c.receive(at.msg)
}

// stopTimers cancels every timer and the actor's context as it stops.
func (c *cell[T]) stopTimers() {
	if c.tools == nil {
		return
	}
	for _, at := range c.tools.timers {
		at.t.Stop()
	}
	c.tools.timers = nil
	if c.tools.cancel != nil {
		c.tools.cancel()
	}
	if st := c.tools.sup; st != nil && st.timer != nil {
		st.timer.Stop()
		st.timer = nil
	}
}
