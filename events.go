package troupe

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"
)

// eventStream is a node's event stream: the node publishes [DeadLetter],
// [PeerConnected], [PeerUnreachable], [ProtocolError] and the other
// events on it, and programs may publish their own
// ([Node.PublishEvent]). Subscribe with [Subscribe] or [SubscribeChan].
// It is safe for concurrent use.
type eventStream struct {
	node *Node // for logging; nil in tests of the stream alone

	// mu serializes Subscribe and Unsubscribe; subs is replaced, never
	// mutated, so Publish reads it without a lock.
	mu   mutex[lkEvents]
	subs atomic.Pointer[[]*Subscription]
}

// Subscription is one subscription: a callback or a channel that follows
// a node's events ([Subscribe], [SubscribeChan]), or an actor that follows
// a service key's listing ([ServiceKey.Subscribe]). Call Unsubscribe to
// end it; it is safe to call more than once.
type Subscription struct {
	es      *eventStream
	match   func(any) bool
	deliver func(any) bool // false when the event could not be handed over
	dropped atomic.Uint64
	off     atomic.Bool
	// own: one of troupe's own consumers, which sees only the events
	// troupe publishes (emit), never one a program publishes.
	own bool
	// cancel and done, for a service key's subscription: cancel ends
	// it, done is closed once it has ended.
	cancel context.CancelFunc
	done   chan struct{}
}

// Subscribe calls fn with every event published on n's event stream
// whose dynamic type is E, or implements E when E is an interface type
// (Subscribe[any] sees everything): the [DeadLetter], [PeerConnected],
// [PeerUnreachable], [ProtocolError] and other events troupe publishes,
// and those a program publishes ([Node.PublishEvent]). It returns the
// subscription; call Unsubscribe to stop.
//
// Publishing is synchronous: each matching callback runs on the
// publishing goroutine, in subscription order, so a callback must be
// quick and must not block (hand work to an actor or a goroutine of your
// own if it is slow). A callback that panics is unsubscribed, and the
// panic is logged.
func Subscribe[E any](n *Node, fn func(E)) *Subscription {
	return subscribe(&n.events, fn, false)
}

// subscribeOwn is Subscribe for troupe's own consumers: fn sees only the
// events troupe itself publishes, not those of [Node.PublishEvent].
func subscribeOwn[E any](es *eventStream, fn func(E)) *Subscription {
	return subscribe(es, fn, true)
}

func subscribe[E any](es *eventStream, fn func(E), own bool) *Subscription {
	s := &Subscription{
		es:    es,
		match: func(e any) bool { _, ok := e.(E); return ok },
		deliver: func(e any) bool {
			fn(e.(E))
			return true
		},
		own: own,
	}
	es.add(s)
	return s
}

// SubscribeChan sends every event of type E published on n's event
// stream (as [Subscribe] matches them) to ch without blocking. When ch is
// full the event is not delivered and the subscription's
// [Subscription.Dropped] count goes up, so a slow reader loses events
// visibly rather than stalling the node. Size the channel for the bursts
// you expect.
func SubscribeChan[E any](n *Node, ch chan<- E) *Subscription {
	return subscribeChan(&n.events, ch, false)
}

// subscribeOwnChan is SubscribeChan for troupe's own consumers: ch gets
// only the events troupe itself publishes, not those of [Node.PublishEvent].
func subscribeOwnChan[E any](es *eventStream, ch chan<- E) *Subscription {
	return subscribeChan(es, ch, true)
}

func subscribeChan[E any](es *eventStream, ch chan<- E, own bool) *Subscription {
	s := &Subscription{
		es:    es,
		match: func(e any) bool { _, ok := e.(E); return ok },
		deliver: func(e any) bool {
			select {
			case ch <- e.(E):
				return true
			default:
				return false
			}
		},
		own: own,
	}
	es.add(s)
	return s
}

// Unsubscribe ends the subscription. No callback starts after it
// returns (one already running on another goroutine may still finish),
// and no listing is sent. It may be called from any goroutine, a handler
// included.
func (s *Subscription) Unsubscribe() {
	if s.cancel != nil {
		s.cancel()
		<-s.done
		return
	}
	if s.off.Swap(true) {
		return
	}
	s.es.remove(s)
}

// Dropped returns how many events a [SubscribeChan] subscription could not
// deliver because its channel was full (0 for any other subscription: a
// service listing waits for room, and a later change is folded into it).
func (s *Subscription) Dropped() uint64 { return s.dropped.Load() }

func (es *eventStream) add(s *Subscription) {
	es.mu.Lock()
	defer es.mu.Unlock()
	var next []*Subscription
	if cur := es.subs.Load(); cur != nil {
		next = append(next, *cur...)
	}
	next = append(next, s)
	es.subs.Store(&next)
}

func (es *eventStream) remove(s *Subscription) {
	es.mu.Lock()
	defer es.mu.Unlock()
	cur := es.subs.Load()
	if cur == nil {
		return
	}
	next := make([]*Subscription, 0, len(*cur))
	for _, x := range *cur {
		if x != s {
			next = append(next, x)
		}
	}
	es.subs.Store(&next)
}

// PublishEvent hands e to every subscription of n's event stream that
// matches its type ([Subscribe], [SubscribeChan]), on the calling
// goroutine. An event a program publishes reaches the program's
// subscribers only: troupe itself never acts on it, even when it is one
// of troupe's own types (a [PeerUnreachable] published by hand does not
// make the registrar drop the node, nor a service listing look again).
func (n *Node) PublishEvent(e any) { n.events.publish(e, false) }

// emit publishes an event of troupe's own: every subscription that
// matches it gets it, troupe's own consumers included.
func (es *eventStream) emit(e any) { es.publish(e, true) }

func (es *eventStream) publish(e any, fromTroupe bool) {
	cur := es.subs.Load()
	if cur == nil {
		return
	}
	for _, s := range *cur {
		if s.off.Load() || (s.own && !fromTroupe) || !s.match(e) {
			continue
		}
		es.deliver(s, e)
	}
}

// hasSubscribers reports whether anything is subscribed, so hot paths can
// skip building an event nobody reads.
func (es *eventStream) hasSubscribers() bool {
	cur := es.subs.Load()
	return cur != nil && len(*cur) > 0
}

func (es *eventStream) deliver(s *Subscription, e any) {
	defer func() {
		if p := recover(); p != nil {
			s.Unsubscribe()
			if es.node != nil {
				es.node.log.Error("troupe: event subscriber panicked; unsubscribed", "event", fmt.Sprintf("%T", e), "panic", p)
			}
		}
	}()
	if !s.deliver(e) {
		s.dropped.Add(1)
	}
}

// DeadLetter is published for every message that could not be delivered:
// the target actor is gone, the peer is unreachable or has left, the
// message's type has no wire key, a queue was full, the node is closed, ….
// Nothing troupe fails to deliver is dropped without one. (A [Worker]'s
// job that fails on its way on its producer's node, after its send was
// taken, is not reported when the producer takes it back to hand it out
// again: it is not lost.)
type DeadLetter struct {
	// Target names the intended recipient: a ref string such as
	// "troupe://127.0.0.1:7001/user/worker", or a local actor path.
	Target string
	// Message is the undelivered message (nil when only its bytes were
	// left, as for a frame that named an unknown actor). A message for
	// another node is kept encoded once sent; its dead letter carries it
	// decoded again: an equal value, not the one sent, whose refs reach
	// the same actors.
	Message any
	// Reason says why; compare it with errors.Is against ErrActorStopped,
	// ErrNoSuchActor, ErrNoWireKey, ErrMailboxFull, ErrSendQueueFull,
	// ErrNodeClosed, ErrPeerLeft, ErrSessionEnded and the other sentinels.
	Reason error
	// Unconfirmed is true for a message that was written to the peer but
	// whose receipt the peer never confirmed before the association ended:
	// it may or may not have been delivered. Every other dead letter was
	// certainly not delivered.
	Unconfirmed bool
}

// PeerConnected is published when an association with another node is
// established (after a successful handshake).
type PeerConnected struct {
	Addr Addr    // an address of the peer (the one dialed, or its first listen address)
	UID  NodeUID // the peer incarnation's uid
	Name string  // the peer's configured name
}

// ProtocolError is published when a peer sent something this node could not
// accept (a malformed, truncated, oversized or unknown frame, a failed
// handshake) and the association or connection was closed because of it.
// No other peer is affected.
type ProtocolError struct {
	Remote string // the remote network address of the connection
	Err    error
}

// PeerLinkLost is published when the connection of a session with a peer
// broke without a goodbye (EOF, a reset) and the session is suspended
// rather than ended: the dialing side dials again at once. [PeerResumed]
// follows if the same incarnation answers; [PeerUnreachable] if it does
// not within [Config.UnreachableAfter], or the address refuses
// connections, or another incarnation answers.
type PeerLinkLost struct {
	Addr  Addr
	UID   NodeUID
	Name  string
	Cause error
}

// PeerResumed is published when a suspended session continues over a new
// connection to the same incarnation. Resent counts the messages and
// control frames sent again because the peer had not confirmed them; each
// arrives once. Down is how long the session had no connection.
type PeerResumed struct {
	Addr   Addr
	UID    NodeUID
	Name   string
	Resent int
	Down   time.Duration
}
