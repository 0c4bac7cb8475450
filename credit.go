package troupe

import (
	"fmt"
	"slices"
	"sync/atomic"
)

// Per-actor flow control across the wire, like HTTP/2's stream windows: a
// sender may have only so many messages outstanding for one remote actor
// (its credit), and the receiving node grants more as that actor's
// mailbox makes room. A slow actor then holds up its own senders only:
// Send waits for credit, Tell makes a dead letter the sender sees, and
// the connection, and every other actor on it, keeps moving.
//
// Each side's first frame in a session says how many messages its
// mailboxes take (its MailboxLimit): that is every target's credit when
// it enters the table, and the receiver grants more as the target's
// mailbox drains, so that what a sender has outstanding never exceeds
// the room the mailbox has. Both nodes must say so in their hellos
// (helloCredit); with an older peer, or one without a mailbox limit, a
// full remote mailbox makes dead letters on the receiving node, as
// before.

// maxCredit bounds a grant and a mailbox limit announced on the wire.
const maxCredit = 1 << 40

// errNoCredit is why a Tell to a remote actor fails when its sender has
// no credit left for it: the actor has not taken what was sent to it.
var errNoCredit = fmt.Errorf("%w: the remote actor has not yet taken what was sent to it (no credit from its node)", ErrMailboxFull)

// creditAcct is the receiving side's account of one target of a session:
// what the sender was granted in all, and what it sent.
type creditAcct struct {
	a        atomic.Pointer[assoc] // the session (it moves with a resume)
	id       uint32
	target   localTarget  // nil: no such actor
	received int64        // tell frames received for it (the reader's)
	seen     atomic.Int64 // received, as the reader last published it
	granted  atomic.Int64 // credit granted in all, creditInit included
	queued   atomic.Bool  // in the session's due list
	waiting  atomic.Bool  // registered with the target's mailbox for room
}

// creditDue is a session's list of the accounts whose credit the writer
// is to consider granting, under a lock of its own: the reader and the
// mailboxes that make room add to it, the writer takes it.
type creditDue struct {
	a     *assoc // whose credit this is
	mu    mutex[lkAssocCredit]
	accts []*creditAcct
	has   atomic.Bool // accts is not empty
}

// newAcct opens the account of a target the peer just defined
// (reader; a.mu not held).
func (d *creditDue) newAcct(id uint32, target localTarget) *creditAcct {
	a := d.a
	ac := &creditAcct{id: id, target: target}
	ac.a.Store(a)
	ac.granted.Store(a.n.cfg.mailboxCredit())
	return ac
}

// received counts one tell frame for ac's target (reader) and, when the
// sender runs low, has the writer consider a grant.
func (d *creditDue) received(ac *creditAcct) {
	a := d.a
	ac.received++
	if ac.granted.Load()-ac.received <= a.n.cfg.mailboxCredit()/2 {
		ac.seen.Store(ac.received)
		d.queue(ac)
	}
}

// queue queues ac for the writer to grant what its target has room
// for.
func (d *creditDue) queue(ac *creditAcct) {
	a := d.a
	if !ac.queued.CompareAndSwap(false, true) {
		return
	}
	d.mu.Lock()
	if now := ac.a.Load(); now != a {
		// A resume moved the account meanwhile (under d.mu): queue it
		// on the session it answers to now.
		d.mu.Unlock()
		ac.queued.Store(false)
		now.due.queue(ac)
		return
	}
	d.accts = append(d.accts, ac)
	d.mu.Unlock()
	d.has.Store(true)
	a.notify()
}

// moveTo hands a's credit accounts over to w, which resumes a's
// session (both are a resume's, before w's writer starts): what was due
// is due on w.
func (d *creditDue) moveTo(w *assoc) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.accts = nil
	for i := range w.rd.inTargets {
		if ac := w.rd.inTargets[i].acct; ac != nil {
			ac.a.Store(w)
			ac.queued.Store(false)
			w.due.queue(ac)
		}
	}
}

// grant grants each target that is due what its mailbox has room
// for, as credit frames (writer; a.mu not held). A target with little room is left registered with its mailbox,
// which wakes it when it drains.
func (d *creditDue) grant() {
	a := d.a
	if !d.has.Load() || !d.has.Swap(false) {
		return
	}
	d.mu.Lock()
	due := d.accts
	d.accts = nil
	d.mu.Unlock()
	for _, ac := range due {
		ac.queued.Store(false)
		limit := a.n.cfg.mailboxCredit()
		room := limit
		if ct, ok := ac.target.(creditTarget); ok {
			room = min(int64(ct.creditRoom(ac)), limit)
		}
		out := ac.granted.Load() - ac.seen.Load()
		g := room - out
		if g <= 0 || g < limit/2 && out > 0 {
			continue // the sender has enough for now
		}
		ac.granted.Add(g)
		a.mu.Lock()
		if a.life.state < assocClosed {
			// Straight into the chain, past any records: a grant refers
			// to the peer's table, not this side's, and a Send of this
			// side's may be waiting behind it for the peer's grant.
			a.encodeControl(appendCredit(nil, ac.id, uint64(g)), false)
		}
		a.mu.Unlock()
	}
}

// creditTarget is a local target whose mailbox has a limit: the room it
// has for credit, and a wake-up when it makes more.
type creditTarget interface {
	// creditRoom returns how many more messages the mailbox takes, and
	// registers ac to be told when it makes room if that is little.
	creditRoom(ac *creditAcct) int
}

// creditWaiters holds, by actor, the credit accounts that wait for its
// mailbox to make room. mu guards waiters; waiting is its length, read
// without the lock on every mailbox's drain.
type creditWaiters struct {
	mu      mutex[lkCreditWaiters]
	waiters map[*handle][]*creditAcct
	waiting atomic.Int32
}

// add makes ac wait for room in h's mailbox.
func (w *creditWaiters) add(h *handle, ac *creditAcct) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.waiters == nil {
		w.waiters = make(map[*handle][]*creditAcct)
	}
	w.waiters[h] = append(w.waiters[h], ac)
	w.waiting.Store(int32(len(w.waiters)))
}

// take returns the accounts waiting for h's mailbox, which no longer
// wait.
func (w *creditWaiters) take(h *handle) []*creditAcct {
	w.mu.Lock()
	defer w.mu.Unlock()
	ws := w.waiters[h]
	delete(w.waiters, h)
	w.waiting.Store(int32(len(w.waiters)))
	return ws
}

// forget drops a's accounts from every mailbox's list.
func (w *creditWaiters) forget(a *assoc) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for h, ws := range w.waiters {
		ws = slices.DeleteFunc(ws, func(ac *creditAcct) bool { return ac.a.Load() == a })
		if len(ws) == 0 {
			delete(w.waiters, h)
		} else {
			w.waiters[h] = ws
		}
	}
	w.waiting.Store(int32(len(w.waiters)))
}

// wake tells ac's session that the target's mailbox made room.
func (ac *creditAcct) wake() {
	ac.waiting.Store(false)
	if a := ac.a.Load(); a != nil {
		a.due.queue(ac)
	}
}

// creditTeller is a local target, not a batchTarget, whose sender's
// credit counts: a message adapter. A message within the credit this
// node granted is taken past the mailbox's limit, as in a batch: a grant
// can count room that a message just received but not yet pushed will
// take, and a new session's first credit can meet a full mailbox.
type creditTeller interface {
	tellCredited(msg any, size int, hd Headers, credited bool) error
}

// creditRoom of a message adapter is its owner's: the messages land in
// the owner's mailbox.
func (a *adapter[U, T]) creditRoom(ac *creditAcct) int { return a.owner.creditRoom(ac) }

// wake wakes the credit accounts waiting for room in the mailbox
// of h (the mailbox drained, or its actor stopped).
func (w *creditWaiters) wake(h *handle) {
	for _, ac := range w.take(h) {
		ac.wake()
	}
}
