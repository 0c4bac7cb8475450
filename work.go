package troupe

import (
	"bytes"
	"cmp"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strconv"
	"sync/atomic"
	"time"
	"unsafe"
)

// Work pulling: a Producer hands jobs to the workers registered under a
// service key, each job to one worker at a time, as the workers have room;
// a worker confirms each job it has processed, and the jobs a worker held
// unconfirmed when it stopped, was downed or became unreachable go to the
// others at once (the producer watches every worker). See docs/work.md.
//
// The worker's side lives in this file: Worker, Delivery and the worker's
// controller, an actor of its node that takes the jobs off the wire,
// hands them to the user's actor and reports its confirmations. The
// producer's side is in work_producer.go.

// WorkConfig configures a [Producer] (Window, Journal, NoSync) and a
// [Worker] (Room). A zero field means its default.
type WorkConfig struct {
	// Window is the most jobs a producer holds unconfirmed, in memory:
	// Producer.Send waits for one to be confirmed beyond it. Default:
	// 1,000.
	Window int
	// Room is how many jobs a worker holds at once from each producer,
	// handed to it and not yet confirmed: the producer sends a worker no
	// more. Default: 10.
	Room int
	// Journal, if set, is a directory where a producer keeps its
	// unconfirmed jobs, so that a producer started again with the same
	// directory (after a crash, or Close) hands them out again: Send
	// returns once the job is written. One producer at a time uses a
	// directory. Default: none, the jobs are held in memory only.
	Journal string
	// NoSync makes the journal's writes reach the operating system but
	// not wait for the disk (fsync): faster, and a job sent just before
	// the machine itself fails may be lost. Default: each Send's job is
	// on disk when Send returns (the fsyncs of Sends that meet are
	// shared).
	NoSync bool
}

func (c WorkConfig) withDefaults() (WorkConfig, error) {
	if c.Window < 0 || c.Room < 0 {
		return c, fmt.Errorf("%w: WorkConfig's Window and Room must not be negative", ErrBadConfig)
	}
	if c.Window == 0 {
		c.Window = 1000
	}
	if c.Room == 0 {
		c.Room = 10
	}
	if c.Room > maxWorkRoom {
		return c, fmt.Errorf("%w: WorkConfig.Room is at most %d", ErrBadConfig, maxWorkRoom)
	}
	return c, nil
}

// maxWorkRoom bounds a worker's room, so that what a producer may send a
// worker always fits in its mailbox.
const maxWorkRoom = 1 << 16

// Delivery is a job as a worker's actor receives it: the job, its number
// and whether it was handed out before. The actor calls Confirm once it
// has processed the job; until then the job counts against the worker's
// room, and if the worker stops, restarts, or its node goes away first,
// the job is handed out again.
type Delivery[T any] struct {
	// Job is the job the producer was given.
	Job T
	// Producer is the identity of the producer that numbered the job:
	// random for each, or, with a journal, the journal's, kept across the
	// producer's restarts.
	Producer UUID
	// Seq is the producer's number for the job: each job sent to one
	// producer has its own, counting up from 1 in the order Send takes
	// them (across its restarts, with a journal), and keeps it when it is
	// handed out again. A worker that must not process a job twice keeps
	// the (Producer, Seq) pairs it has done.
	Seq uint64
	// Redelivered says that the job was handed out before, to this
	// worker before it restarted or to another that stopped or could no
	// longer be reached: it may have been processed already.
	Redelivered bool

	ctl      Ref[workerMsg]
	producer refKey
	inc      uint32
}

// Confirm tells the producer that the job is done: it is not handed out
// again, and the worker has room for another. A second Confirm, or one of
// a delivery that was handed to another worker meanwhile, does nothing.
// It may be called from any goroutine, at any time after the delivery
// arrived.
func (d Delivery[T]) Confirm() {
	if d.ctl.h == nil {
		return
	}
	d.ctl.Tell(workConfirm{producer: d.producer, seq: d.Seq, inc: d.inc})
}

// Worker starts an actor that takes jobs from the producers of key (see
// [Produce]), on this node or others: b handles each as a [Delivery] and
// confirms it when done. It is spawned under p with name as [Spawn]
// spawns (b may be supervised: a restart hands the unconfirmed jobs to the
// fresh behavior again), and a controller is started beside it that
// registers under key's internal name, so that producers find it, and
// asks each producer for at most cfg.Room jobs at a time. The worker
// leaves the set when its actor stops.
//
// T must have a wire key ([SetWireKey]). It returns the actor's ref, or
// Spawn's errors, [ErrNoWireKey], or [ServiceKey.Register]'s.
func Worker[T any](p Spawner, name string, key ServiceKey[T], b Behavior[Delivery[T]], cfg WorkConfig) (Ref[Delivery[T]], error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return Ref[Delivery[T]]{}, err
	}
	n, _ := p.spawnParent()
	if err := registerWorkJob[T](); err != nil {
		return Ref[Delivery[T]]{}, err
	}
	if err := checkName(key.Name); err != nil {
		return Ref[Delivery[T]]{}, err
	}
	w := &workWorker[T]{n: n, room: cfg.Room, known: 1, held: map[workHeld]*workJob[T]{}, producers: map[refKey]Ref[producerMsg]{},
		confirmed: map[refKey][]uint64{}, fresh: map[workHeld]bool{}}
	ctl, err := Spawn(systemParent{n}, "worker-"+strconv.FormatUint(workSeq.Add(1), 36), Behavior[workerMsg]{
		Receive: w.receive, Signal: w.signal,
	})
	if err != nil {
		return Ref[Delivery[T]]{}, err
	}
	w.self = ctl
	w.bound()
	ref, err := Spawn(p, name, w.wrap(b))
	if err != nil {
		n.Stop(ctl)
		return Ref[Delivery[T]]{}, err
	}
	ctl.Tell(workAttach[T]{child: ref})
	if err := workersKey(key).Register(n, ctl); err != nil {
		n.Stop(ctl)
		n.Stop(ref)
		return Ref[Delivery[T]]{}, fmt.Errorf("Worker: %w", err)
	}
	return ref, nil
}

// workSeq numbers the node's work controllers (their names).
var workSeq atomic.Uint64

// workersKey is the key the workers of key register their controllers
// under.
func workersKey[T any](key ServiceKey[T]) ServiceKey[workerMsg] {
	return ServiceKey[workerMsg]{Name: "troupe.work." + key.Name}
}

// registerWorkJob gives workJob[T] its wire key, made of T's: both ends
// make the same one, and the job's shape travels with T's.
func registerWorkJob[T any]() error {
	mt := typeOf(reflect.TypeFor[T]())
	if mt == nil {
		return fmt.Errorf("%w: %s (give it one with SetWireKey before it is worked on)", ErrNoWireKey, reflect.TypeFor[T]())
	}
	alloc := func() unsafe.Pointer { return unsafe.Pointer(new(workJob[T])) }
	return registerType(reflect.TypeFor[workJob[T]](), "troupe.work/"+mt.key, alloc)
}

// The worker controller's messages.
type workerMsg interface{ workerMsg() }

// workHello is a producer's greeting: it found the worker and watches it.
type workHello struct{ Producer Ref[producerMsg] }

// workJob is a job on its way to a worker.
type workJob[T any] struct {
	Producer    Ref[producerMsg]
	ID          UUID // the producer's identity
	Seq         uint64
	Redelivered bool
	Job         T
}

// workConfirm is a delivery's Confirm (local).
type workConfirm struct {
	producer refKey
	seq      uint64
	inc      uint32
}

// workRestarted says that the worker's actor starts a new incarnation
// (local): inc is its number; failed, that a failure ended the last.
type workRestarted struct {
	inc    uint32
	failed bool
}

// workRedeliver hands the unconfirmed jobs to incarnation inc, after a
// failure's backoff (a timer's, local).
type workRedeliver struct{ inc uint32 }

// workFlush sends the confirmations gathered (local, to itself).
type workFlush struct{}

// workAttach hands the controller its worker's actor (local, first).
type workAttach[T any] struct{ child Ref[Delivery[T]] }

func (workHello) workerMsg()     {}
func (workJob[T]) workerMsg()    {}
func (workConfirm) workerMsg()   {}
func (workRestarted) workerMsg() {}
func (workFlush) workerMsg()     {}
func (workRedeliver) workerMsg() {}
func (workAttach[T]) workerMsg() {}

// unwrap makes a job that a worker's controller could not take a dead
// letter of the user's job.
func (j workJob[T]) unwrap() (string, any) { return "", j.Job }

func init() {
	SetWireKey[workHello]("troupe.work.hello")
}

// workHeld names a job a worker holds: its producer and number.
type workHeld struct {
	producer refKey
	seq      uint64
}

// workWorker is a worker's controller; its actor's goroutine owns it but
// for inc, which the worker's actor's behavior reads and counts up.
type workWorker[T any] struct {
	n         *Node
	self      Ref[workerMsg]
	child     Ref[Delivery[T]]
	room      int
	inc       atomic.Uint32
	known     uint32 // the incarnation the controller delivers to
	held      map[workHeld]*workJob[T]
	producers map[refKey]Ref[producerMsg]
	confirmed map[refKey][]uint64 // confirmations not yet sent, by producer
	flushing  bool                // a workFlush is in the mailbox
	failures  int                 // failures in a row, none confirmed between
	waiting   bool                // a workRedeliver timer runs: jobs are held, not handed
	fresh     map[workHeld]bool   // jobs held meanwhile, never handed
}

// wrap makes the worker's actor's behavior: b, counting incarnations —
// a restart (Setup again) starts one, and so does a failure that the
// behavior's supervisor resumes — so that the controller hands the new
// one every unconfirmed job again, in order, and the deliveries made to
// the old one, still in the mailbox, are dropped.
func (w *workWorker[T]) wrap(b Behavior[Delivery[T]]) Behavior[Delivery[T]] {
	supervised := b.sup != nil
	one := func(b Behavior[Delivery[T]]) Behavior[Delivery[T]] {
		setup, receive := b.Setup, b.Receive
		b.Setup = func(c *Context[Delivery[T]]) {
			if inc := w.inc.Add(1); inc > 1 {
				w.self.Tell(workRestarted{inc: inc})
			}
			if setup != nil {
				setup(c)
			}
		}
		b.Receive = func(c *Context[Delivery[T]], d Delivery[T]) {
			if d.inc != w.inc.Load() {
				return // made for an incarnation before a restart: handed again
			}
			returned := false
			defer func() {
				// A failure (a panic, or Fail) that a supervisor handles
				// ends the incarnation: the jobs go to the behavior again
				// (resumed or restarted). Unsupervised, the actor stops,
				// and the producer hands them to the others.
				if supervised && (!returned || c.c.tools != nil && c.c.tools.failed != nil) {
					w.self.Tell(workRestarted{inc: w.inc.Add(1), failed: true})
				}
			}()
			receive(c, d)
			returned = true
		}
		return b
	}
	if !supervised {
		return one(b)
	}
	build := b.sup.build
	return Supervise(func() Behavior[Delivery[T]] { return one(build()) }, b.sup.strategy)
}

func (w *workWorker[T]) receive(c *Context[workerMsg], m workerMsg) {
	switch m := m.(type) {
	case workAttach[T]:
		w.child = m.child
		c.Watch(m.child)
	case workHello:
		k := m.Producer.h.key
		if _, ok := w.producers[k]; !ok {
			w.producers[k] = m.Producer
			c.Watch(m.Producer)
			w.bound()
		}
		m.Producer.Tell(workReady{Worker: w.self, Room: w.room})
	case workJob[T]:
		k := m.Producer.h.key
		if _, ok := w.producers[k]; !ok {
			return // from a producer that stopped: its jobs are gone with it
		}
		held := &m
		h := workHeld{producer: k, seq: m.Seq}
		w.held[h] = held
		if w.waiting {
			w.fresh[h] = true // handed with the others after the backoff, in order
			return
		}
		w.deliver(held, k, false)
	case workConfirm:
		h := workHeld{producer: m.producer, seq: m.seq}
		if _, ok := w.held[h]; !ok {
			return
		}
		delete(w.held, h)
		delete(w.fresh, h)
		w.failures = 0
		if _, ok := w.producers[m.producer]; ok {
			// Confirmations that meet go in one message: the flush comes
			// after those already in the mailbox.
			w.confirmed[m.producer] = append(w.confirmed[m.producer], m.seq)
			if !w.flushing {
				w.flushing = true
				c.Self().Tell(workFlush{})
			}
		}
	case workFlush:
		w.flushing = false
		for k, seqs := range w.confirmed {
			if p, ok := w.producers[k]; ok {
				p.Tell(workDone{Worker: w.self, Seqs: seqs})
			}
			delete(w.confirmed, k)
		}
	case workRestarted:
		if m.inc <= w.known {
			return
		}
		// Until now, jobs went to the old incarnation (and were
		// dropped): none overtakes these.
		w.known = m.inc
		if m.failed {
			w.failures++
		}
		if d := workBackoff(w.failures); d > 0 {
			// A job that fails every time is handed again ever more
			// slowly, not in a tight loop.
			c.StartTimer(workRedeliver{}, d, workRedeliver{inc: m.inc})
			w.waiting = true
			return
		}
		w.redeliver()
	case workRedeliver:
		if m.inc == w.known {
			w.redeliver()
		}
	}
}

// redeliver hands the incarnation the controller knows of every
// unconfirmed job again, in each producer's order.
func (w *workWorker[T]) redeliver() {
	for _, h := range sortedHeld(w.held) {
		w.deliver(w.held[h], h.producer, !w.fresh[h])
	}
	w.waiting = false
	clear(w.fresh)
}

// workBackoff is the pause before the unconfirmed jobs are handed again
// after failures failures in a row (none confirmed between): none after
// the first, then 10 ms, doubling, up to a second.
func workBackoff(failures int) time.Duration {
	if failures <= 1 {
		return 0
	}
	return min(10*time.Millisecond<<min(failures-2, 10), time.Second)
}

// bound sets the controller's mailbox bound: its jobs are bounded by its
// room, from each producer, so it takes a room of the largest frames from
// each producer it knows (one at least) where Config.MailboxBytes is
// smaller.
func (w *workWorker[T]) bound() {
	producers := int64(min(max(len(w.producers), 1), maxWorkRoom))
	b := min(producers*int64(w.room)*int64(w.n.cfg.MaxFrameSize), math.MaxInt)
	w.self.h.local.(*cell[workerMsg]).setByteLimit(int(b))
}

// deliver hands a held job to the worker's actor, for the incarnation
// the controller knows of (not a fresher one whose workRestarted it has
// not handled yet: that one would get it ahead of the jobs handed again).
func (w *workWorker[T]) deliver(j *workJob[T], producer refKey, again bool) {
	w.child.Tell(Delivery[T]{Job: j.Job, Producer: j.ID, Seq: j.Seq, Redelivered: j.Redelivered || again,
		ctl: w.self, producer: producer, inc: w.known})
}

func (w *workWorker[T]) signal(c *Context[workerMsg], s Signal) {
	t, ok := s.(Terminated)
	if !ok {
		return
	}
	h := t.Ref.handle()
	if w.child.h != nil && h.key == w.child.h.key {
		c.Stop() // the worker is gone: the producers hand its jobs on
		return
	}
	if _, ok := w.producers[h.key]; ok {
		delete(w.producers, h.key)
		delete(w.confirmed, h.key)
		for k := range w.held {
			if k.producer == h.key {
				delete(w.held, k)
				delete(w.fresh, k)
			}
		}
	}
}

// sortedHeld lists held's keys by producer, then number.
func sortedHeld[T any](held map[workHeld]*workJob[T]) []workHeld {
	ks := make([]workHeld, 0, len(held))
	for k := range held {
		ks = append(ks, k)
	}
	slices.SortFunc(ks, func(a, b workHeld) int {
		if a.producer != b.producer {
			if c := bytes.Compare(a.producer.node[:], b.producer.node[:]); c != 0 {
				return c
			}
			return cmp.Compare(a.producer.path, b.producer.path)
		}
		return cmp.Compare(a.seq, b.seq)
	})
	return ks
}
