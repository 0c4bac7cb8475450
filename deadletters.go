package troupe

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"reflect"
	"time"
)

// deadLetterSummaryEvery is how often the count of dead letters that were
// not logged one by one is logged.
const deadLetterSummaryEvery = time.Minute

// deadLetters is what a node keeps of its dead letters: the paced log,
// the counts by reason and the last samples for Stats; each has a lock
// of its own.
type deadLetters struct {
	n       *Node
	log     deadLetterLog
	counts  deadLetterCounts
	samples deadLetterSamples
}

// deadLetter reports a message that cannot be delivered: a DeadLetter
// event (if anything listens) and the node's rate-limited log.
func (dl *deadLetters) deadLetter(target string, msg any, reason error) {
	dl.reportDeadLetter(DeadLetter{Target: target, Message: msg, Reason: reason})
}

// errZeroRef is the reason of a message told to the zero Ref.
var errZeroRef = errors.New("troupe: the zero Ref refers to no actor (a ReplyTo never set?)")

// openNodes holds this process's nodes from Start until they close. A
// message told to the zero Ref belongs to no node, so it is a dead letter
// on each of them (in a service, the one node it runs).
var openNodes struct {
	mutex[lkOpenNodes]
	set map[*Node]struct{}
}

func rememberNode(n *Node) {
	openNodes.Lock()
	defer openNodes.Unlock()
	if openNodes.set == nil {
		openNodes.set = map[*Node]struct{}{}
	}
	openNodes.set[n] = struct{}{}
}

func forgetNode(n *Node) {
	openNodes.Lock()
	defer openNodes.Unlock()
	delete(openNodes.set, n)
}

// zeroRefDeadLetter reports msg, told to the zero Ref, on every open node,
// or on the default logger when the process has none.
func zeroRefDeadLetter(msg any) {
	openNodes.Lock()
	nodes := make([]*Node, 0, len(openNodes.set))
	for n := range openNodes.set {
		nodes = append(nodes, n)
	}
	openNodes.Unlock()
	for _, n := range nodes {
		n.dead.deadLetter("<zero ref>", msg, errZeroRef)
	}
	if len(nodes) == 0 {
		slog.Error("troupe: dead letter", "target", "<zero ref>", "reason", errZeroRef, "type", fmt.Sprintf("%T", msg))
	}
}

// wrapped is a message that troupe carries inside another, such as a
// sharded entity's on its way through a region or a job on its way into
// a producer: a dead letter names the user's message and its target (if
// the wrapper names one), not the wrapper.
type wrapped interface {
	unwrap() (target string, msg any)
}

// takenBack is a message whose sender may take it back when it becomes
// a dead letter on the sender's node after its send was accepted (a work
// producer's job, refused when its queued record was encoded or dropped
// when its session ended): to is the actor it was for, unconfirmed says
// that the peer may have received it. One taken back is not lost, so it
// is not reported.
type takenBack interface {
	takeBack(n *Node, to refKey, reason error, unconfirmed bool) bool
}

// deadLetterTo is deadLetter (unconfirmed: perhaps received) for a message
// that a session took for the actor to, which its sender may take back.
func (dl *deadLetters) deadLetterTo(to refKey, target string, msg any, reason error, unconfirmed bool) {
	if tb, ok := msg.(takenBack); ok && tb.takeBack(dl.n, to, reason, unconfirmed) {
		return
	}
	dl.reportDeadLetter(DeadLetter{Target: target, Message: msg, Reason: reason, Unconfirmed: unconfirmed})
}

// pushToSubscriber is a message pushed to a subscriber that the
// subscriber no longer wants once it has stopped: a registrar's push to a
// Registry.Watch that ended while its unsubscribe was on its way, or the
// workers' listing passed on to a producer that has closed. Such a push
// is no loss, and not reported when its target is gone.
type pushToSubscriber interface{ pushedToSubscriber() }

func (regEvent) pushedToSubscriber() {}

func (dl *deadLetters) reportDeadLetter(d DeadLetter) {
	if _, ok := d.Message.(pushToSubscriber); ok && (errors.Is(d.Reason, ErrActorStopped) || errors.Is(d.Reason, ErrNoSuchActor)) {
		return
	}
	if w, ok := d.Message.(wrapped); ok {
		target, msg := w.unwrap()
		d.Message = msg
		if target != "" {
			d.Target = target
			if errors.Is(d.Reason, ErrActorStopped) {
				d.Reason = ErrEntityUnavailable // (the region stopped)
			}
		}
	}
	switch {
	case errors.Is(d.Reason, ErrNodeClosed) || dl.n.lc.isClosed():
		// This node is closing (whatever the session's own end says, as
		// when the peer answers the goodbye first): nothing the user
		// forgot.
	case quietDeadLetter(d):
		if dl.n.cfg.DeadLetterLog >= 0 && dl.n.log.Enabled(context.Background(), slog.LevelDebug) {
			dl.n.log.Debug("troupe: dead letter", "target", d.Target, "reason", d.Reason, "type", fmt.Sprintf("%T", d.Message))
		}
	default:
		dl.samples.add(d) // (the user's only: troupe's own would crowd them out)
		if dl.n.cfg.DeadLetterLog >= 0 {
			dl.log.note(dl.n, d)
		}
	}
	dl.counts.add(d.Reason)
	if dl.n.events.hasSubscribers() {
		dl.n.events.emit(d)
	}
}

// quietDeadLetter reports whether d is logged at debug level only, not
// one by one at warning level: a message of troupe's own (gossip, stats,
// registry traffic), which the user cannot have forgotten to register or
// handle, or one that an Observer's session could not deliver.
func quietDeadLetter(d DeadLetter) bool {
	if se, ok := errors.AsType[*sessionError](d.Reason); ok && se.observer {
		return true
	}
	if mt := typeOfValue(d.Message); mt != nil {
		return mt.internal
	}
	return false
}

// deadLetterLog logs the first [Config.DeadLetterLog] dead letters, then
// counts the rest and logs the count once a minute, so that a forgotten
// SetWireKey leaves a trace without a flood burying the log.
type deadLetterLog struct {
	mu         mutex[lkDeadLetterLog]
	logged     int       // dead letters logged one by one
	suppressed int       // dead letters counted since the last summary
	since      time.Time // when counting started
}

// note logs one dead letter, or counts it once the limit is reached.
func (l *deadLetterLog) note(n *Node, d DeadLetter) {
	limit := n.cfg.DeadLetterLog
	l.mu.Lock()
	if l.logged >= limit {
		if l.suppressed == 0 {
			l.since = time.Now()
		}
		l.suppressed++
		l.mu.Unlock()
		return
	}
	l.logged++
	last := l.logged == limit
	l.mu.Unlock()
	args := []any{"target", d.Target, "reason", d.Reason, "type", fmt.Sprintf("%T", d.Message)}
	if d.Unconfirmed {
		args = append(args, "unconfirmed", true)
	}
	if last {
		args = append(args, "note", "further dead letters are counted and logged once a minute (Config.DeadLetterLog)")
	}
	n.log.Warn("troupe: dead letter", args...)
}

// summarize logs how many dead letters were counted but not logged, at
// most once a minute. The heartbeat loop calls it.
func (l *deadLetterLog) summarize(n *Node, now time.Time) {
	l.mu.Lock()
	if l.suppressed == 0 || now.Sub(l.since) < deadLetterSummaryEvery {
		l.mu.Unlock()
		return
	}
	count, since := l.suppressed, l.since
	l.suppressed = 0
	l.mu.Unlock()
	n.log.Warn("troupe: dead letters not logged one by one", "count", count, "since", since.Format(time.RFC3339))
}

// deadLetterCounts counts dead letters by reason, for Stats.
type deadLetterCounts struct {
	mu     mutex[lkDeadLetterCounts]
	counts map[string]uint64
}

// deadLetterReasons are the reasons Stats counts by name; anything else
// counts as "other".
var deadLetterReasons = []struct {
	name string
	err  error
}{
	{"actor-stopped", ErrActorStopped}, {"no-such-actor", ErrNoSuchActor}, {"wrong-type", ErrWrongType},
	{"mailbox-full", ErrMailboxFull}, {"send-queue-full", ErrSendQueueFull}, {"quarantined", ErrQuarantined},
	{"peer-left", ErrPeerLeft}, {"node-closed", ErrNodeClosed}, {"session-ended", ErrSessionEnded},
	{"not-registered", ErrNoWireKey}, {"incompatible", ErrIncompatibleMessage},
}

// deadLetterReasonNames lists every reason Stats counts by, "other"
// last, so that the metrics give each one from 0.
func deadLetterReasonNames() []string {
	names := make([]string, 0, len(deadLetterReasons)+1)
	for _, r := range deadLetterReasons {
		names = append(names, r.name)
	}
	return append(names, "other")
}

func (c *deadLetterCounts) add(reason error) {
	name := "other"
	for _, r := range deadLetterReasons {
		if errors.Is(reason, r.err) {
			name = r.name
			break
		}
	}
	c.mu.Lock()
	if c.counts == nil {
		c.counts = map[string]uint64{}
	}
	c.counts[name]++
	c.mu.Unlock()
}

func (c *deadLetterCounts) snapshot() map[string]uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.counts)
}

// deadLetterSampleCount is how many recent dead letters Stats keeps.
const deadLetterSampleCount = 16

// deadLetterSamples keeps the node's last dead letters, for Stats and the
// debug page. A sample's type and reason are made into text only when
// read.
type deadLetterSamples struct {
	mu   mutex[lkDeadLetterSamples]
	ring [deadLetterSampleCount]struct {
		at     time.Time
		target string
		typ    reflect.Type
		reason error
	}
	n int // how many were added, ever
}

func (s *deadLetterSamples) add(d DeadLetter) {
	s.mu.Lock()
	e := &s.ring[s.n%deadLetterSampleCount]
	e.at, e.target, e.typ, e.reason = time.Now(), d.Target, reflect.TypeOf(d.Message), d.Reason
	s.n++
	s.mu.Unlock()
}

// list returns the samples, newest first.
func (s *deadLetterSamples) list() []deadLetterSample {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := []deadLetterSample{}
	for i := s.n - 1; i >= 0 && i >= s.n-deadLetterSampleCount; i-- {
		e := s.ring[i%deadLetterSampleCount]
		typ := "<nil>"
		if e.typ != nil {
			typ = e.typ.String()
		}
		reason := ""
		if e.reason != nil {
			reason = e.reason.Error()
		}
		out = append(out, deadLetterSample{At: e.at, Target: e.target, Type: typ, Reason: reason})
	}
	return out
}
