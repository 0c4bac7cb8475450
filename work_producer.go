package troupe

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// The producer's side of work pulling: Produce, the Producer handle that
// Send, Wait, Stats and Close use from any goroutine, and the producer's
// actor, which owns the jobs and the workers.

// errProducerClosed is the dead-letter reason of a job that was not
// confirmed when its producer closed, and Send's error after Close.
var errProducerClosed = fmt.Errorf("%w: the producer is closed", ErrActorStopped)

// Producer hands jobs of type T to the workers of its key (see [Worker]),
// on this node and others, one worker per job, as the workers ask: each
// worker holds at most its room of unconfirmed jobs. A job whose worker
// stops, is downed or becomes unreachable before confirming it goes to
// another worker at once (the producer watches every worker, it does not
// time jobs out): each job is processed at least once, and confirmed
// once. Its methods may be called from any goroutine.
type Producer[T any] struct {
	n    *Node
	self Ref[producerMsg]
	// unwatch ends the following of the workers' listing.
	unwatch context.CancelFunc

	// slots holds a token for each unconfirmed job: Send waits for room
	// in it, a confirmation takes one out.
	slots     chan struct{}
	closed    chan struct{}
	closeOnce sync.Once
	stopped   chan struct{} // closed when the actor has stopped

	// id is the producer's identity (the store's, or random); j is
	// where the unconfirmed jobs are kept (nil: memory only); mt is T's
	// registered type.
	id        UUID
	j         workStore
	mt        *msgType
	recovered int

	seq                          atomic.Uint64
	sent, confirmed, redelivered atomic.Int64
	workers                      atomic.Int64

	mu      mutex[lkWork]
	waiting []chan struct{} // Wait's, closed when nothing is unconfirmed
}

// Produce starts a producer for the workers registered under key, on n
// and on every node whose registry n shares (or, on a cluster member that
// uses no registry, the cluster's). T must have a wire key
// ([SetWireKey]). It returns [ErrBadConfig], [ErrBadName], [ErrNoWireKey],
// [ErrNoRegistry] or [ErrNodeClosed].
func Produce[T any](n *Node, key ServiceKey[T], cfg WorkConfig) (*Producer[T], error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if err := checkName(key.Name); err != nil {
		return nil, err
	}
	if err := registerWorkJob[T](); err != nil {
		return nil, err
	}
	p := &Producer[T]{n: n, closed: make(chan struct{}), stopped: make(chan struct{}), mt: typeOf(reflect.TypeFor[T]())}
	pr := &producer[T]{p: p, jobs: map[uint64]*workEntry[T]{}, workers: map[refKey]*workerState{}}
	window := cfg.Window
	if cfg.Journal != "" {
		j, found, top, err := openJournal(cfg.Journal, !cfg.NoSync, p.mt)
		if err != nil {
			return nil, err
		}
		d := &decoder{binder: journalBinder{n}}
		for _, jj := range found {
			v, err := d.payload(p.mt, jj.payload)
			if err != nil {
				j.close()
				return nil, fmt.Errorf("%w: job %d in %s: %v", errJournal, jj.seq, cfg.Journal, err)
			}
			pr.jobs[jj.seq] = &workEntry[T]{job: v.(T), handed: 1}
			pr.queue = append(pr.queue, jj.seq)
		}
		p.j, p.recovered, p.id = j, len(found), j.id
		p.seq.Store(top)
		window = max(window, len(found))
	}
	if p.j == nil {
		rand.Read(p.id[:])
	}
	p.slots = make(chan struct{}, window)
	for range p.recovered {
		p.slots <- struct{}{}
	}
	if _, err := n.disc.serviceSources(nil); err != nil {
		if p.j != nil {
			p.j.close()
		}
		return nil, fmt.Errorf("Produce: %w", err)
	}
	// The workers' listing is followed by a goroutine of the node's that
	// passes it on to the producer, waiting for room in its mailbox
	// (later changes fold into the next listing), until the producer
	// stops.
	ctx, unwatch := context.WithCancel(n.lc.actorsCtx)
	p.unwatch = unwatch
	name := "producer-" + strconv.FormatUint(workSeq.Add(1), 36)
	self, err := Spawn(systemParent{n}, name, Behavior[producerMsg]{Receive: pr.receive, Signal: pr.signal})
	if err != nil {
		unwatch()
		if p.j != nil {
			p.j.close()
		}
		return nil, err
	}
	p.self = self
	n.wg.Go(func() {
		err := workersKey(key).Watch(ctx, n, func(refs []Ref[workerMsg]) {
			self.Send(ctx, workListing{refs: refs})
		})
		if errors.Is(err, ErrClusterStopped) {
			self.Send(ctx, workListing{}) // (no worker is known any longer)
		}
	})
	return p, nil
}

// Send hands job to the producer, waiting while the producer holds its
// window of unconfirmed jobs; it returns once the producer has it (not
// when a worker has done it: see Wait). It returns ctx's error if ctx
// ends first, or an error wrapping [ErrActorStopped] once the producer
// is closed (or [ErrNodeClosed]).
func (p *Producer[T]) Send(ctx context.Context, job T) error {
	select {
	case <-p.closed:
		return errProducerClosed
	case <-p.stopped:
		return errProducerClosed
	default:
	}
	select {
	case p.slots <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	case <-p.closed:
		return errProducerClosed
	case <-p.stopped: // its node closed
		return errProducerClosed
	}
	select {
	case <-p.closed: // it may win the select above
		p.release(1)
		return errProducerClosed
	default:
	}
	seq := p.seq.Add(1)
	if p.j != nil {
		// Encoded here, with no lock held (AppendWire is the user's).
		b, err := journalPayload(p.mt, job)
		if err == nil {
			err = p.j.add(seq, b)
		}
		if err != nil {
			p.release(1)
			if p.isClosed() {
				return errProducerClosed // (the journal closed under it)
			}
			return err
		}
	}
	if err := p.self.Send(ctx, workSubmit[T]{seq: seq, job: job}); err != nil {
		if p.j != nil {
			p.j.confirm(seq) // not the producer's after all
		}
		p.release(1)
		if errors.Is(err, ErrActorStopped) {
			return errProducerClosed
		}
		return err
	}
	p.sent.Add(1)
	return nil
}

// Wait returns nil once no job is unconfirmed (at once if none is): once
// every job sent so far is confirmed, if no more are sent meanwhile. It
// returns ctx's error if ctx ends first, or an error wrapping
// [ErrActorStopped] if the producer is closed (or its node).
func (p *Producer[T]) Wait(ctx context.Context) error {
	if p.isClosed() {
		return errProducerClosed
	}
	p.mu.Lock()
	if len(p.slots) == 0 {
		p.mu.Unlock()
		return nil
	}
	ch := make(chan struct{})
	p.waiting = append(p.waiting, ch)
	p.mu.Unlock()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-p.closed:
		return errProducerClosed
	case <-p.stopped: // its node closed
		return errProducerClosed
	}
}

// journalPayload encodes a job for the journal; a panic of its
// AppendWire is an error.
func journalPayload(mt *msgType, job any) (b []byte, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("%w: encoding %s for the journal panicked: %v", ErrMalformed, mt.key, p)
		}
	}()
	var e encoder
	return e.payload(nil, mt, job)
}

// isClosed reports whether Close was called or the producer stopped.
func (p *Producer[T]) isClosed() bool {
	select {
	case <-p.closed:
		return true
	case <-p.stopped:
		return true
	default:
		return false
	}
}

// Stats counts the producer's jobs: sent to it, found unconfirmed in its
// journal when it started, confirmed by a worker, handed out again (after
// their worker stopped, restarted or could no longer be reached, or from
// the journal), unconfirmed now, and the workers it knows.
func (p *Producer[T]) Stats() struct{ Sent, Recovered, Confirmed, Redelivered, Unconfirmed, Workers int } {
	return struct{ Sent, Recovered, Confirmed, Redelivered, Unconfirmed, Workers int }{
		Sent: int(p.sent.Load()), Recovered: p.recovered, Confirmed: int(p.confirmed.Load()),
		Redelivered: int(p.redelivered.Load()), Unconfirmed: len(p.slots), Workers: int(p.workers.Load()),
	}
}

// Close stops the producer: its unconfirmed jobs stay in its journal for
// the next producer of the directory, or, without one, become dead
// letters (reason: an error wrapping [ErrActorStopped]); confirmations
// that arrive later are dropped. It returns once the producer has stopped, or
// its node has closed. It is idempotent and returns nil.
func (p *Producer[T]) Close() error {
	p.closeOnce.Do(func() {
		close(p.closed)
		p.unwatch()
		// Through the mailbox, behind the jobs Send put there (or at
		// once, if there is no room).
		if p.self.h.local.tellAny(workClose{}) != nil {
			p.n.Stop(p.self)
		}
		select {
		case <-p.stopped:
		case <-p.n.Done():
		}
	})
	return nil
}

// release takes k tokens out of the window, and wakes Wait when none is
// left.
func (p *Producer[T]) release(k int) {
	p.mu.Lock()
	for range k {
		<-p.slots
	}
	var wake []chan struct{}
	if len(p.slots) == 0 {
		wake, p.waiting = p.waiting, nil
	}
	p.mu.Unlock()
	for _, ch := range wake {
		close(ch)
	}
}

// The producer's actor's messages.
type producerMsg interface{ producerMsg() }

// workReady is a worker's answer to workHello: how many jobs it holds at
// once.
type workReady struct {
	Worker Ref[workerMsg]
	Room   int
}

// workDone confirms jobs.
type workDone struct {
	Worker Ref[workerMsg]
	Seqs   []uint64
}

// workSubmit is a job from Send (local).
type workSubmit[T any] struct {
	seq uint64
	job T
}

// workListing is the workers' listing, passed on (local). One that
// reaches a stopped producer is no loss.
type workListing struct{ refs []Ref[workerMsg] }

func (workListing) pushedToSubscriber() {}

// workRetry ends the stalls (a timer's, local).
type workRetry struct{}

// workRetryAfter is how long a worker whose job found no room waits
// before it is tried again (unless it confirms a job first).
const workRetryAfter = 50 * time.Millisecond

// workerGoing reports whether a send's error says that its target is
// going away, so that a Terminated will follow.
func workerGoing(err error) bool {
	for _, e := range []error{ErrActorStopped, ErrNoSuchActor, ErrNodeClosed, ErrPeerLeft, ErrSessionEnded,
		ErrPeerUnreachable, ErrQuarantined, ErrQuarantinedByPeer, ErrPeerShuttingDown, ErrRejected, ErrAuth} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// tryTell sends msg to h as Tell would, but returns the error rather than
// make a dead letter of it.
func tryTell(h *handle, msg any) error {
	switch {
	case h.local != nil:
		return h.local.tellAny(msg)
	case h.assoc != nil:
		return h.assoc.send(nil, h, msg, nil)
	}
	return ErrNoSuchActor
}

// workRetryable reports whether a job whose send failed with err may be
// handed again: there was no room on the way (the send budget, the
// worker's mailbox), or its worker is going. Any other failure is the
// job's own (it cannot travel).
func workRetryable(err error) bool {
	return errors.Is(err, ErrSendQueueFull) || errors.Is(err, ErrMailboxFull) || workerGoing(err)
}

// workRefused is a job handed to a worker that became a dead letter on
// the producer's node after its send was accepted: a record queued while
// the session was not writing, refused when it was encoded, or dropped
// when the session ended (local, from the dead-letter path, on the
// system lane: a full mailbox does not refuse it).
type workRefused struct {
	id    UUID   // the producer's identity
	seq   uint64 // the job
	to    refKey // the worker its send was for
	why   error  // the dead letter's reason
	retry bool   // workRetryable: hand it again
	// unconfirmed: it was written, and may have reached the worker;
	// otherwise it certainly did not.
	unconfirmed bool
}

// takeBack passes a job that became a dead letter on n to its producer,
// if that lives on n, and reports whether it did: the producer then hands
// the job again, or gives it up and reports its dead letter itself (once:
// not if it was handed on since, nor if the producer stops first, whose
// stop reports every job it holds or keeps it in its journal).
func (j workJob[T]) takeBack(n *Node, to refKey, reason error, unconfirmed bool) bool {
	h := j.Producer.h
	if h == nil || h.node != n || h.local == nil || to == (refKey{}) {
		return false // (on the worker's node: its Terminated tells the producer)
	}
	h.local.sysPush(sysMsg{kind: sysPost, timerKey: workRefused{id: j.ID, seq: j.Seq, to: to, why: reason,
		retry: workRetryable(reason), unconfirmed: unconfirmed}})
	return true // (false: the producer has stopped, and reported or kept the job)
}

// workClose is Close's (local): the producer stops once it has taken the
// jobs ahead of it.
type workClose struct{}

// unwrap makes a job that never reached the producer's actor (a Send
// that met Close) a dead letter of its own.
func (s workSubmit[T]) unwrap() (string, any) { return "", s.job }

func (workReady) producerMsg()     {}
func (workDone) producerMsg()      {}
func (workSubmit[T]) producerMsg() {}
func (workListing) producerMsg()   {}
func (workClose) producerMsg()     {}
func (workRetry) producerMsg()     {}
func (workRefused) producerMsg()   {}

func init() {
	SetWireKey[workReady]("troupe.work.ready")
	SetWireKey[workDone]("troupe.work.done")
	// Never sent across: registered so that a listing left in the
	// producer's mailbox is a dead letter of troupe's own (quiet).
	SetWireKey[workListing]("troupe.work.listing-passed")
}

// workEntry is an unconfirmed job.
type workEntry[T any] struct {
	job    T
	out    bool   // handed to worker, unconfirmed
	worker refKey // whose, when out
	handed int    // times handed out
}

// workerState is a worker as its producer sees it.
type workerState struct {
	ref    Ref[workerMsg]
	room   int // 0 until it answers the hello
	out    int // jobs it holds
	listed bool
	// stalled: the last job for it found no room on the way (the send
	// budget, its mailbox); it gets none until it confirms one, or a
	// workRetry.
	stalled bool
}

// producer is a Producer's actor: its goroutine owns everything here.
type producer[T any] struct {
	p       *Producer[T]
	jobs    map[uint64]*workEntry[T]
	queue   []uint64 // not handed out, in order: handed-again jobs first
	workers map[refKey]*workerState
	ring    []refKey // the workers in the order jobs go round them
	next    int

	journalErr bool // a journal failure was logged
	retrying   bool // a workRetry timer runs
}

func (pr *producer[T]) receive(c *Context[producerMsg], m producerMsg) {
	switch m := m.(type) {
	case workSubmit[T]:
		pr.jobs[m.seq] = &workEntry[T]{job: m.job}
		pr.queue = append(pr.queue, m.seq)
	case workListing:
		pr.listing(c, m.refs)
	case workReady:
		if ws := pr.workers[m.Worker.h.key]; ws != nil {
			ws.room = min(max(m.Room, 1), maxWorkRoom)
		}
	case workDone:
		if ws := pr.workers[m.Worker.h.key]; ws != nil {
			ws.stalled = false
		}
		for _, seq := range m.Seqs {
			pr.done(m.Worker.h.key, seq)
		}
	case workRetry:
		pr.retrying = false
		for _, ws := range pr.workers {
			ws.stalled = false
		}
	case workRefused:
		pr.refused(c, m)
	case workClose:
		c.Stop()
		return
	}
	pr.dispatch(c)
}

// listing follows the workers' set: a new worker is greeted and watched;
// one that left gets no more jobs, but keeps its own until it confirms
// them or stops.
func (pr *producer[T]) listing(c *Context[producerMsg], refs []Ref[workerMsg]) {
	seen := make(map[refKey]bool, len(refs))
	for _, r := range refs {
		k := r.h.key
		seen[k] = true
		if ws := pr.workers[k]; ws != nil {
			ws.listed = true
			continue
		}
		pr.workers[k] = &workerState{ref: r, listed: true}
		pr.ring = append(pr.ring, k)
		c.Watch(r)
		r.Tell(workHello{Producer: c.Self()})
	}
	for k, ws := range pr.workers {
		if !seen[k] {
			ws.listed = false
		}
	}
	pr.p.workers.Store(int64(len(pr.workers)))
}

// done confirms job seq, wherever it is: with the worker that confirms
// it, with another (it was handed on), or waiting to be handed again.
func (pr *producer[T]) done(from refKey, seq uint64) {
	e := pr.jobs[seq]
	if e == nil {
		return // confirmed already
	}
	if e.out {
		if ws := pr.workers[e.worker]; ws != nil {
			ws.out--
		}
	}
	delete(pr.jobs, seq) // the queue skips it
	if pr.p.j != nil {
		if err := pr.p.j.confirm(seq); err != nil {
			pr.journalFailed(err)
		}
	}
	pr.p.confirmed.Add(1)
	pr.p.release(1)
}

// dispatch hands out queued jobs while a worker has room, going round
// the workers.
func (pr *producer[T]) dispatch(c *Context[producerMsg]) {
	for len(pr.queue) > 0 {
		seq := pr.queue[0]
		e := pr.jobs[seq]
		if e == nil || e.out {
			pr.queue = pr.queue[1:]
			continue
		}
		ws := pr.pick()
		if ws == nil {
			break
		}
		err := tryTell(ws.ref.h, workJob[T]{Producer: c.Self(), ID: pr.p.id, Seq: seq, Redelivered: e.handed > 0, Job: e.job})
		switch {
		case err == nil:
		case workRetryable(err):
			// No room on the way to this worker now, or the worker is
			// going (its Terminated will hand on what it holds): the job
			// waits at the head of the queue, and the worker gets no more
			// until it confirms one or a moment has passed.
			pr.stall(c, ws)
			continue
		default:
			// The job itself cannot go (too big for the wire, its
			// AppendWire failed or panicked): it is given up, as a dead
			// letter of its own.
			pr.queue = pr.queue[1:]
			pr.p.n.dead.deadLetter(ws.ref.String(), e.job, err)
			pr.giveUp(seq)
			continue
		}
		pr.queue = pr.queue[1:]
		e.out, e.worker = true, ws.ref.h.key
		ws.out++
		if e.handed > 0 {
			pr.p.redelivered.Add(1)
		}
		e.handed++
	}
	if len(pr.queue) == 0 {
		pr.queue = nil // let the backing array go
	}
}

// giveUp forgets job seq, which cannot travel (its dead letter is
// reported): it is confirmed in the journal, and frees its place in the
// window.
func (pr *producer[T]) giveUp(seq uint64) {
	delete(pr.jobs, seq)
	if pr.p.j != nil {
		if err := pr.p.j.confirm(seq); err != nil {
			pr.journalFailed(err)
		}
	}
	pr.p.release(1)
}

// stall gives worker ws no more jobs until it confirms one or
// workRetryAfter passes.
func (pr *producer[T]) stall(c *Context[producerMsg], ws *workerState) {
	ws.stalled = true
	if !pr.retrying {
		pr.retrying = true
		c.StartTimer(workRetry{}, workRetryAfter, workRetry{})
	}
}

// refused takes back job seq, handed out, which became a dead letter on
// this node after its send was accepted (see workRefused): it is handed
// again, first, if the way was full or its worker is going (the worker
// gets no more for a moment), or given up if it cannot travel.
func (pr *producer[T]) refused(c *Context[producerMsg], m workRefused) {
	e := pr.jobs[m.seq]
	if m.id != pr.p.id || e == nil || !e.out || e.worker != m.to {
		return // confirmed, taken back already, or handed on since
	}
	e.out = false
	if !m.unconfirmed {
		e.handed-- // (it never reached the worker: not redelivered)
	}
	ws := pr.workers[e.worker]
	if ws != nil {
		ws.out--
	}
	if !m.retry {
		pr.p.n.dead.deadLetter(ws.ref.String(), e.job, m.why) // (ws: e was out with it)
		pr.giveUp(m.seq)
		return
	}
	// Among the jobs to hand again, in order: a session that ends takes
	// back its jobs one by one, first to last.
	i := slices.IndexFunc(pr.queue, func(s uint64) bool { return s > m.seq })
	if i < 0 {
		i = len(pr.queue)
	}
	pr.queue = slices.Insert(pr.queue, i, m.seq)
	if ws != nil {
		pr.stall(c, ws)
	}
}

// pick returns the next worker round the ring with room, or nil.
func (pr *producer[T]) pick() *workerState {
	for range pr.ring {
		if pr.next >= len(pr.ring) {
			pr.next = 0
		}
		ws := pr.workers[pr.ring[pr.next]]
		pr.next++
		if ws.listed && !ws.stalled && ws.out < ws.room {
			return ws
		}
	}
	return nil
}

func (pr *producer[T]) signal(c *Context[producerMsg], s Signal) {
	switch s := s.(type) {
	case Terminated:
		pr.lost(s.Ref.handle().key)
		pr.dispatch(c)
	case PostStop:
		pr.stop(c)
	}
}

// lost hands the jobs of a worker that stopped, or that this node could
// no longer reach (or whose watch was refused: nothing would say when it
// stops), to the others: first, in their order.
func (pr *producer[T]) lost(k refKey) {
	if pr.workers[k] == nil {
		return
	}
	delete(pr.workers, k)
	if i := slices.Index(pr.ring, k); i >= 0 {
		pr.ring = slices.Delete(pr.ring, i, i+1)
	}
	pr.p.workers.Store(int64(len(pr.workers)))
	var again []uint64
	for seq, e := range pr.jobs {
		if e.out && e.worker == k {
			e.out = false
			again = append(again, seq)
		}
	}
	slices.Sort(again)
	pr.queue = append(again, pr.queue...)
}

// journalFailed logs the journal's first failure to write a confirmation
// (the job would be handed out again by the next producer).
func (pr *producer[T]) journalFailed(err error) {
	if !pr.journalErr {
		pr.journalErr = true
		pr.p.n.log.Error("work journal: a confirmation was not written; the next producer of the directory hands the job out again", "err", err)
	}
}

// stop closes the journal, which keeps the unconfirmed jobs, or makes
// them dead letters.
func (pr *producer[T]) stop(c *Context[producerMsg]) {
	defer close(pr.p.stopped)
	pr.p.unwatch()
	if pr.p.j != nil {
		if err := pr.p.j.close(); err != nil {
			pr.journalFailed(err)
		}
		pr.jobs = nil
		return
	}
	seqs := make([]uint64, 0, len(pr.jobs))
	for seq := range pr.jobs {
		seqs = append(seqs, seq)
	}
	slices.Sort(seqs)
	for _, seq := range seqs {
		pr.p.n.dead.deadLetter(c.Self().String(), pr.jobs[seq].job, errProducerClosed)
	}
	pr.jobs = nil
}
