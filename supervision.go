package troupe

import (
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"
)

// Supervision: what happens to an actor whose handler fails. A behavior
// built by [Supervise] carries a [Strategy]; any other behavior stops on
// its first failure.

// Strategy says what an actor does when one of its handlers fails: stop
// (the default for every actor), resume, restart, or restart after a
// backoff, within optional limits. Make one with [ResumeOnFailure],
// [RestartOnFailure] or [RestartWithBackoff], refine it with its With
// methods, and attach it with [Supervise]. The zero Strategy stops the
// actor on its first failure, with the failure as the reason its
// watchers see: what every actor does unless it was spawned with
// another strategy.
type Strategy struct {
	action       failureAction
	maxFailures  int           // 0: no limit
	within       time.Duration // 0: the limit counts every failure ever
	minBackoff   time.Duration
	maxBackoff   time.Duration
	randomFactor float64
	keepChildren bool
}

type failureAction uint8

const (
	actStop failureAction = iota
	actResume
	actRestart
)

// ResumeOnFailure drops the message whose handling failed and goes on with
// the next one, keeping the actor's state as the failed handler left it.
// Use it when a failure cannot have corrupted the state (a bad input
// rejected before anything changed). A failure in Setup still stops the
// actor: it has no state to resume.
func ResumeOnFailure() Strategy { return Strategy{action: actResume} }

// RestartOnFailure drops the message whose handling failed, builds the
// behavior again from its factory (running its Setup) and goes on with the
// next message. Use it when the state may be broken and a fresh one is
// cheap. Without [Strategy.WithLimit], an actor that always fails restarts
// forever.
func RestartOnFailure() Strategy { return Strategy{action: actRestart} }

// RestartWithBackoff is [RestartOnFailure] after a pause: minPause after
// the first failure, doubling with each failure that follows within
// maxPause of the last restart, never more than maxPause, and each pause stretched by up to
// randomFactor of itself (0.2: up to 20% longer) so that actors failing
// together do not restart together. Messages that arrive during the pause
// wait in the mailbox (up to [Config.MailboxLimit]) and are handled by the
// restarted actor. Use it when failures come from something outside that
// needs time to recover, such as a database that is down.
func RestartWithBackoff(minPause, maxPause time.Duration, randomFactor float64) Strategy {
	if minPause <= 0 {
		minPause = time.Millisecond
	}
	return Strategy{action: actRestart, minBackoff: minPause, maxBackoff: max(minPause, maxPause), randomFactor: max(randomFactor, 0)}
}

// WithLimit allows at most n failures within the window (every failure
// ever when within is 0) to be resumed or restarted; the failure after
// them stops the actor, with that failure as its reason. With n of 0 or
// less, no failure is survived.
func (s Strategy) WithLimit(n int, within time.Duration) Strategy {
	s.maxFailures, s.within = max(n, 0), max(within, 0)
	if n <= 0 {
		s.maxFailures = -1 // no failure is survived
	}
	return s
}

// WithKeepChildren keeps the actor's children running across a restart.
// By default they are stopped, and the restart waits until they have
// stopped, so that the fresh state can spawn children with the same names.
func (s Strategy) WithKeepChildren() Strategy {
	s.keepChildren = true
	return s
}

// String describes the strategy, for logs.
func (s Strategy) String() string {
	var b []byte
	switch {
	case s.action == actResume:
		b = append(b, "resume"...)
	case s.action == actRestart && s.minBackoff > 0:
		b = fmt.Appendf(b, "restart with backoff %v..%v", s.minBackoff, s.maxBackoff)
	case s.action == actRestart:
		b = append(b, "restart"...)
	default:
		return "stop"
	}
	if s.maxFailures < 0 {
		b = append(b, ", no failure survived"...)
	} else if s.maxFailures > 0 {
		b = fmt.Appendf(b, ", at most %d failures", s.maxFailures)
		if s.within > 0 {
			b = fmt.Appendf(b, " within %v", s.within)
		}
	}
	return string(b)
}

// supervisor is what [Supervise] attaches to a behavior: how to build it
// again and what to do when it fails. Every actor spawned with the same
// behavior shares it; the per-actor state lives in the cell's tools.
type supervisor[T any] struct {
	build    func() Behavior[T]
	strategy Strategy
}

// Supervise returns a behavior whose state is built by newBehavior and
// whose failures are handled by s. newBehavior is called once when the
// actor is spawned and again on every restart, so that a restarted actor
// starts from fresh state: keep the state in variables that newBehavior
// declares, not outside it.
//
// A restart keeps the actor's mailbox, its ref, its name and registrations,
// and the watches others hold on it: nobody outside sees it stop. It drops
// what the old behavior set up: the failed message, the state, the
// actor's own watches, its timers, its [Context.Context] (which is
// cancelled), its message adapters (messages to them become dead letters;
// the fresh Setup makes new ones) and, unless
// [Strategy.WithKeepChildren], its children, which are stopped before the
// fresh behavior's Setup runs. The old behavior gets [PreRestart] first.
func Supervise[T any](newBehavior func() Behavior[T], s Strategy) Behavior[T] {
	return Behavior[T]{sup: &supervisor[T]{build: newBehavior, strategy: s}}
}

// behavior builds the behavior to run: b itself, or what its supervisor's
// factory makes, carrying the supervisor along.
func (b Behavior[T]) behavior() (built Behavior[T], err error) {
	if b.sup == nil {
		if b.Receive == nil {
			return b, fmt.Errorf("%w: Receive is nil", ErrBadConfig)
		}
		return b, nil
	}
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("%w: its factory panicked: %v", ErrBadConfig, p)
		}
	}()
	if b.sup.build == nil {
		return b, fmt.Errorf("%w: Supervise was given a nil factory", ErrBadConfig)
	}
	built = b.sup.build()
	if built.sup != nil {
		return b, fmt.Errorf("%w: a supervised behavior's factory returned a supervised behavior", ErrBadConfig)
	}
	if built.Receive == nil {
		return b, fmt.Errorf("%w: the factory built a behavior whose Receive is nil", ErrBadConfig)
	}
	built.sup = b.sup
	return built, nil
}

// PreRestart is the signal a supervised actor's behavior gets just before
// it is dropped for a restart: the last chance to release what the state
// holds. Reason is the failure that caused the restart.
type PreRestart struct{ Reason error }

func (PreRestart) isSignal() {}

// PostStop is the signal an actor's behavior gets once the actor has
// stopped: it no longer receives messages, its timers are cancelled, its
// context is done and its children have been told to stop; its watchers
// are told after the handler returns. Reason is the stop reason its
// watchers will see. A behavior that got [PreRestart] and was stopped
// before its restart completed does not get PostStop.
type PostStop struct{ Reason error }

func (PostStop) isSignal() {}

// failureError is the stop reason of an actor that reported a failure with
// [Context.Fail] and whose strategy stopped it.
type failureError struct{ Err error }

func (e *failureError) Error() string { return "troupe: actor failed: " + e.Err.Error() }

// Unwrap returns the reported error.
func (e *failureError) Unwrap() error { return e.Err }

// IsFailure reports whether err is, or wraps, the reason of an actor that
// failed — a panic in a handler ([*PanicError]) or an error it reported
// with [Context.Fail] (which it wraps) — rather than one that stopped
// itself, was stopped, or was cut off: a [Terminated] signal's Reason, or
// the error of an [Ask] whose target stopped (an [*AskError]). It holds
// across nodes too: a remote actor's failure arrives as an error whose
// text is the failure's. A parent that wants to fail when its child fails
// calls [Context.Fail] from its Signal handler when it sees this.
func IsFailure(err error) bool {
	var pe *PanicError
	var fe *failureError
	var re *remoteError
	return errors.As(err, &pe) || errors.As(err, &fe) || errors.As(err, &re) && re.Failed
}

// restartPhase is where a restart is: waiting for the children to stop,
// waiting out the backoff, or due.
type restartPhase uint8

const (
	restartNone restartPhase = iota
	restartChildren
	restartBackoff
	restartDue
)

// supState is a supervised actor's failure history and pending restart.
type supState struct {
	failures    []time.Time // when survived failures happened, oldest first
	backoffs    int         // consecutive restarts, for the backoff's exponent
	lastRestart time.Time
	phase       restartPhase
	reason      error         // the failure being restarted from
	timer       *time.Timer   // the backoff's timer
	gen         uint64        // which restart a sysRestart belongs to
	pause       time.Duration // the backoff chosen for the restart under way (logged when it begins)
}

// decide is the strategy's answer to a failure at now, given when the
// failures it survived before happened (oldest first). It returns the
// history to keep and, for a stop the strategy alone would not have
// chosen, why.
func (s Strategy) decide(history []time.Time, inSetup bool, now time.Time) (failureAction, []time.Time, string) {
	switch {
	case s.action == actStop:
		return actStop, history, ""
	case s.action == actResume && inSetup:
		return actStop, history, " (it failed in Setup, so there is no state to resume)"
	case s.maxFailures < 0:
		return actStop, history, " (its limit allows no failure)"
	case s.maxFailures == 0:
		return s.action, history, ""
	}
	if s.within > 0 {
		i := 0
		for i < len(history) && now.Sub(history[i]) >= s.within {
			i++
		}
		history = history[:copy(history, history[i:])]
	}
	if len(history) >= s.maxFailures {
		return actStop, history, fmt.Sprintf(" (it survived %d failures already, its limit)", len(history))
	}
	return s.action, append(history, now), ""
}

// backoff is the pause before restart number k (from 0) given a random
// number r in [0, 1).
func backoff(s Strategy, k int, r float64) time.Duration {
	d := s.maxBackoff
	if k < 62 {
		if e := s.minBackoff << k; e > 0 && e < d {
			d = e
		}
	}
	return d + time.Duration(float64(d)*s.randomFactor*r)
}

// maxStackFrames bounds the frames a failure's log line shows.
const maxStackFrames = 32

// stackAttr is a panic's stack as a log attribute: a group of frames
// "function file:line", numbered from the one that panicked, so that a
// text handler writes one readable key per frame (not one escaped
// string of tabs and newlines) and a JSON handler an object.
func stackAttr(stack []byte) slog.Attr {
	lines := strings.Split(strings.TrimSpace(string(stack)), "\n")
	var frames []any
	for i := 1; i+1 < len(lines); i += 2 { // (lines[0] is "goroutine N [running]:")
		fn := lines[i]
		if by, ok := strings.CutPrefix(fn, "created by "); ok {
			fn, _, _ = strings.Cut(by, " in goroutine ")
			fn = "created by " + fn
		} else if j := strings.LastIndexByte(fn, '('); j > 0 {
			fn = fn[:j]
		}
		file := strings.TrimSpace(lines[i+1])
		if j := strings.LastIndex(file, " +0x"); j > 0 {
			file = file[:j]
		}
		if fn == "panic" {
			frames = frames[:0] // what led to the panic's recovery is troupe's
			continue
		}
		if len(frames) < 2*maxStackFrames {
			frames = append(frames, strconv.Itoa(len(frames)/2), fn+" "+file)
		}
	}
	return slog.Group("stack", frames...)
}
