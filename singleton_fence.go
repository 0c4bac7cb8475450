package troupe

import (
	"sync/atomic"
	"time"
)

// A process that stood still (SIGSTOP, a long stall) wakes
// with its singleton instance's timers overdue, and its goroutines run in
// no particular order: the instance's may run before the singleton's loop
// sees the pause and stops it — while the others, who downed this member
// meanwhile, run the instance elsewhere. pauseFence closes that window
// for every message the instance's Receive has not begun to handle (its
// signal handlers, and the goroutines it starts, are not fenced): the loop
// publishes, at each turn, whether this process stood still, and the
// instance's handler, before running, checks that the loop turned
// recently; if it has not, it waits for a turn with a recent beat to say.
// (A handler already running when the process stopped goes on when it
// continues: only the outside store the handler writes to can refuse it,
// with a fencing token.)
type pauseFence struct {
	epoch  time.Time                     // the clock the beats count from (monotonic)
	beat   atomic.Int64                  // when the loop last turned: nanoseconds since epoch
	fenced atomic.Bool                   // the loop saw this process stand still: the instance may not run
	turned atomic.Pointer[chan struct{}] // closed at the loop's next turn
}

func newPauseFence() *pauseFence {
	f := &pauseFence{epoch: time.Now()}
	ch := make(chan struct{})
	f.turned.Store(&ch)
	return f
}

// turn is the loop's: at the start of each turn (at now, the time the
// loop measured its pauses to), stood says whether this process stood
// still within the removal margin. The fence is written before the beat,
// so a handler that sees the new beat sees the fence; the beat is now,
// not the time of writing, so a pause between the two leaves the beat
// stale, and a handler waits for the next turn.
func (f *pauseFence) turn(now time.Time, stood bool) {
	if stood {
		f.fenced.Store(true)
	}
	f.beat.Store(int64(now.Sub(f.epoch)))
	next := make(chan struct{})
	close(*f.turned.Swap(&next))
}

// open lets an instance started from now on run (the loop's, before it
// starts one: the pause is a removal margin old).
func (f *pauseFence) open() { f.fenced.Store(false) }

// mayRun is the instance's, before each message: false if the loop saw a
// pause. If the loop has not turned within budget, it waits (at most
// wait, or until done closes) for a turn with a recent beat to tell: a
// turn whose clock reading is as stale as the message's (the process
// stood still between the loop's reading and its turn) tells nothing,
// and the next turn, which measures that pause, will. A turn that does
// not come in time tells nothing either, and the message does not run.
func (f *pauseFence) mayRun(budget, wait time.Duration, done <-chan struct{}) bool {
	var timeout <-chan time.Time
	for {
		turned := *f.turned.Load() // (before the beat: a turn after this closes it)
		beat := f.beat.Load()      // (before the fence: see turn)
		if f.fenced.Load() {
			return false
		}
		if time.Duration(int64(time.Since(f.epoch))-beat) <= budget {
			return true
		}
		if timeout == nil {
			t := time.NewTimer(wait)
			defer t.Stop()
			timeout = t.C
		}
		select {
		case <-turned:
		case <-timeout:
			return false
		case <-done:
			return false
		}
	}
}
