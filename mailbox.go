package troupe

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync/atomic"
	"time"
	"unsafe"
)

// An actor's mailbox, from the sender's side: how a message is pushed
// (Tell, Send, a batch decoded from a peer, a system message), and the
// limits it meets there (MailboxLimit, MailboxBytes).

// push queues a user message and schedules the cell if it was idle.
func (c *cell[T]) push(msg T) error { return c.pushSized(msg, 0, nil) }

// pushWait is push, with the message's headers, that waits while the
// mailbox is full: until there is room, the actor stops, or ctx ends.
func (c *cell[T]) pushWait(ctx context.Context, msg T, hd Headers) error {
	return c.pushWaitUnless(ctx, msg, hd, nil)
}

// pushWaitUnless is pushWait for a message adapter's Send: while it
// waits, the adapter may be retired (its actor restarted), and then the
// message is not taken (errAdapterRetired).
func (c *cell[T]) pushWaitUnless(ctx context.Context, msg T, hd Headers, retired *atomic.Bool) error {
	for {
		if retired != nil && retired.Load() {
			return errAdapterRetired
		}
		err := c.pushSized(msg, 0, hd)
		if !errors.Is(err, ErrMailboxFull) {
			return err
		}
		c.mu.Lock()
		if lim := c.limit(); c.closed || lim <= 0 || c.q == nil || len(c.q.in) < lim {
			c.mu.Unlock()
			continue // it changed meanwhile: try again
		}
		w := c.waitsFor()
		if w.room == nil {
			w.room = make(chan struct{})
		}
		room := w.room
		c.mu.Unlock()
		select {
		case <-room:
		case <-ctx.Done():
			return ctx.Err()
		case <-c.n.lc.workDone():
			return ErrNodeClosed
		}
	}
}

// pushSized is push for a message that arrived over the wire in size
// encoded bytes, counted against [Config.MailboxBytes], or that carries
// headers hd.
func (c *cell[T]) pushSized(msg T, size int, hd Headers) error {
	return c.pushCredited(msg, size, hd, false)
}

// pushCredited is pushSized; a credited message (its sender spent credit
// on it, which this node granted) is taken past the mailbox's limit, as
// in tellWireBatch.
func (c *cell[T]) pushCredited(msg T, size int, hd Headers, credited bool) error {
	return c.pushAsked(msg, size, hd, credited, nil)
}

// pushAsked is pushCredited for the request of a local Ask: if it is
// taken, ask is failed should the actor stop before it replies (see
// removeAsker).
func (c *cell[T]) pushAsked(msg T, size int, hd Headers, credited bool, ask pendingAsk) error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return ErrActorStopped
	}
	q := c.lanesFor()
	if lim := c.limit(); lim > 0 && len(q.in) >= lim && !credited {
		c.mu.Unlock()
		return ErrMailboxFull
	}
	if lim := c.byteLimit(); size > 0 && lim > 0 && q.inBytes+size > lim {
		waiting := q.inBytes
		c.mu.Unlock()
		return fmt.Errorf("%w: %d bytes from other nodes waiting (%s is %d)", ErrMailboxFull, waiting, c.byteLimitName(), lim)
	}
	q.inBytes += size
	if len(q.in) == 0 && c.n.lat.Load() != nil {
		c.moreFor().firstAt = int64(time.Since(c.n.epoch))
	}
	if hd != nil {
		// Kept beside the mailbox by the message's index, so that a
		// mailbox of messages without headers holds nothing more.
		c.holdHeaders(hd)
	}
	q.in = append(q.in, msg)
	q.entered++
	if ask != nil {
		q.addAsker(ask)
	}
	start := !c.scheduled && !c.held
	c.scheduled = c.scheduled || start
	c.mu.Unlock()
	if start {
		c.start()
	}
	return nil
}

func (c *cell[T]) tellWire(msg any, size int, hd Headers) error {
	v, ok := msg.(T)
	if !ok {
		return c.tellAny(msg)
	}
	return c.pushSized(v, size, hd)
}

func (c *cell[T]) tellWireBatch(ms []wireMsg, arena []uint64) (int, error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return 0, ErrActorStopped
	}
	var err error
	q := c.lanesFor()
	if len(q.in) == 0 && len(ms) > 0 && c.n.lat.Load() != nil {
		c.moreFor().firstAt = int64(time.Since(c.n.epoch))
	}
	var conv convCache
	conv.iface = isMethodIface[T]()
	own := flatTypeFor[T]() // a plain value of this type is copied straight in
	limit := c.limit()
	k := 0
	for ; k < len(ms); k++ {
		var v T
		if m := &ms[k]; m.msg == nil && m.mt != nil && m.mt == own {
			v = *(*T)(unsafe.Pointer(&arena[m.at]))
		} else {
			var ok bool
			msg := m.value(arena)
			if v, ok = convert[T](msg, &conv); !ok {
				err = fmt.Errorf("%w: %s accepts %s, not %T", ErrWrongType, c.self.key.path, reflect.TypeFor[T](), msg)
				break
			}
		}
		if limit > 0 && len(q.in) >= limit && !ms[k].credited {
			err = ErrMailboxFull
			break
		}
		size := ms[k].size
		if lim := c.byteLimit(); size > 0 && lim > 0 && q.inBytes+size > lim {
			err = fmt.Errorf("%w: %d bytes from other nodes waiting (%s is %d)", ErrMailboxFull, q.inBytes, c.byteLimitName(), lim)
			break
		}
		q.inBytes += size
		if hd := ms[k].hd; hd != nil {
			c.holdHeaders(hd)
		}
		q.in = append(q.in, v)
		q.entered++
	}
	start := k > 0 && !c.scheduled && !c.held
	c.scheduled = c.scheduled || start
	c.mu.Unlock()
	if start {
		c.start()
	}
	return k, err
}

func (c *cell[T]) tellAny(msg any) error {
	v, ok := msg.(T)
	if !ok {
		return fmt.Errorf("%w: %s accepts %s, not %T", ErrWrongType, c.self.key.path, reflect.TypeFor[T](), msg)
	}
	return c.push(v)
}

// sysPush queues a signal; false if the actor has stopped.
func (c *cell[T]) sysPush(m sysMsg) bool {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return false
	}
	q := c.lanesFor()
	if m.follows() {
		m.after = q.entered
	}
	var cancel context.CancelFunc
	if m.kind == sysStop && !m.drain && c.waits != nil && c.waits.more != nil {
		// A handler waiting on the actor's context returns now, so that
		// the stop (and a stopping parent waiting for it) is not held up.
		cancel = c.waits.more.cancel
	}
	q.sys = append(q.sys, m)
	c.hasSys.Store(true)
	start := !c.scheduled
	c.scheduled = true
	c.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	if start {
		c.start()
	}
	return true
}

// stopPushedLocked says whether a stop that cancels the actor's context
// (see sysPush) waits in its mailbox (mu held).
func (c *cell[T]) stopPushedLocked() bool {
	if c.q == nil {
		return false
	}
	return stopIn(c.q.sys)
}

// lanes is an actor's mailbox: what waits (under the cell's mu) and the
// batch being handled (owned by the goroutine running the cell).
type lanes[T any] struct {
	in      []T      // waiting user messages
	sys     []sysMsg // waiting signals
	entered uint64   // user messages ever appended to in
	inBytes int      // encoded size of the messages in in that came over the wire

	// the local Asks waiting on the actor, failed when it stops: the
	// first without a map, the others in one
	asker  pendingAsk
	askers map[pendingAsk]struct{}
	// runFn runs the cell on a goroutine of its own: made once, so that
	// a goroutine starts without an allocation
	runFn func()

	batch   []T    // the user messages taken from in, being handled
	handled uint64 // user messages taken out of the mailbox and handled
}

// lanesFor returns the cell's mailbox, made on first use (mu held).
func (c *cell[T]) lanesFor() *lanes[T] {
	if c.q == nil {
		c.q = &lanes[T]{runFn: c.runThenDone}
	}
	return c.q
}

// addAsker records a local Ask waiting on the actor (mu held).
func (q *lanes[T]) addAsker(p pendingAsk) {
	switch {
	case q.asker == nil:
		q.asker = p
	case q.askers == nil:
		q.askers = map[pendingAsk]struct{}{p: {}}
	default:
		q.askers[p] = struct{}{}
	}
}

// removeAsker forgets a local Ask that ended.
func (c *cell[T]) removeAsker(p pendingAsk) {
	c.mu.Lock()
	if q := c.q; q == nil {
		// (never pushed to)
	} else if q.asker == p {
		q.asker = nil
	} else {
		delete(q.askers, p)
		if len(q.askers) == 0 {
			q.askers = nil
		}
	}
	c.mu.Unlock()
}

// limit is the mailbox's limit; 0 means none.
func (c *cell[T]) limit() int { return c.n.cfg.MailboxLimit }

// byteLimit bounds the bytes from other nodes waiting in the mailbox (mu
// held): Config.MailboxBytes, or the cell's own bound.
func (c *cell[T]) byteLimit() int {
	if c.maxBytes != 0 && c.n.cfg.MailboxBytes > 0 {
		return c.maxBytes
	}
	return c.n.cfg.MailboxBytes
}

// byteLimitName names the bound byteLimit returns, for its error (mu
// held).
func (c *cell[T]) byteLimitName() string {
	if c.maxBytes != 0 {
		return "a worker's room of the largest frames (WorkConfig.Room × Config.MaxFrameSize, per producer)"
	}
	return "Config.MailboxBytes"
}

// setByteLimit gives the mailbox its own bound in bytes, in place of a
// smaller Config.MailboxBytes (maxBytes).
func (c *cell[T]) setByteLimit(b int) {
	c.mu.Lock()
	c.maxBytes = max(b, c.n.cfg.MailboxBytes)
	c.mu.Unlock()
}

// waiting is how many user messages wait in the actor's mailbox.
func (c *cell[T]) waiting() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.q == nil {
		return 0
	}
	return len(c.q.in)
}

// creditRoom is the room a mailbox has for credit; with less than half
// of its limit free, ac is registered to be woken when it drains.
func (c *cell[T]) creditRoom(ac *creditAcct) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	limit := c.limit()
	if c.closed || limit <= 0 {
		return int(c.n.cfg.mailboxCredit()) // the receiving node reports what cannot be delivered
	}
	room := limit
	if c.q != nil {
		room = max(limit-len(c.q.in), 0)
	}
	if (room == 0 || room < limit/2) && ac.waiting.CompareAndSwap(false, true) {
		c.n.credit.add(c.self, ac)
	}
	return room
}
