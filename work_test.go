package troupe_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"troupe"
)

// task is the job of the work-pulling tests: a number and a body of a
// realistic size.
type task struct {
	N    int
	Body []byte
}

func init() { troupe.SetWireKey[task]("troupe.test.work.task") }

var tasksKey = troupe.ServiceKey[task]{Name: "tasks"}

// workTally records which worker processed which task, how often.
type workTally struct {
	mu   sync.Mutex
	runs map[int][]string
	redo int // deliveries marked Redelivered
}

func newWorkTally() *workTally { return &workTally{runs: map[int][]string{}} }

func (t *workTally) add(n int, who string, again bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.runs[n] = append(t.runs[n], who)
	if again {
		t.redo++
	}
}

// has reports whether task n was processed.
func (t *workTally) has(n int) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.runs[n]) > 0
}

// missing lists the tasks 1..n that no worker processed.
func (t *workTally) missing(n int) []int {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []int
	for i := 1; i <= n; i++ {
		if len(t.runs[i]) == 0 {
			out = append(out, i)
		}
	}
	return out
}

// counting is a worker that records each task and confirms it.
func counting(t *workTally, who string) troupe.Behavior[troupe.Delivery[task]] {
	return troupe.Behavior[troupe.Delivery[task]]{Receive: func(_ *troupe.Context[troupe.Delivery[task]], d troupe.Delivery[task]) {
		t.add(d.Job.N, who, d.Redelivered)
		d.Confirm()
	}}
}

// workNodes starts a registrar on a fault network (the producer's node)
// and more nodes that use it.
func workNodes(t *testing.T, f *troupe.FaultNet, names ...string) (*troupe.Node, []*troupe.Node) {
	t.Helper()
	return workNodesWith(t, f, func(string) troupe.Config {
		return troupe.Config{HeartbeatInterval: 100 * time.Millisecond, UnreachableAfter: time.Second}
	}, names...)
}

// workNodesWith is workNodes with each node's Config from cfg (its name,
// registry and logger set here).
func workNodesWith(t *testing.T, f *troupe.FaultNet, cfg func(name string) troupe.Config, names ...string) (*troupe.Node, []*troupe.Node) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	start := func(name string) *troupe.Node {
		c := cfg(name)
		c.Name, c.RegistryAddrs, c.Logger = name, []string{addr}, slog.New(slog.NewTextHandler(io.Discard, nil))
		n, err := f.Start(context.Background(), c)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { n.Close() })
		return n
	}
	reg := start("producer")
	var out []*troupe.Node
	for _, name := range names {
		out = append(out, start(name))
	}
	return reg, out
}

// Jobs go to the workers on every node, each to one worker, and every
// one is confirmed; Wait returns once they are.
func TestWorkReachesEveryWorkerAndIsConfirmed(t *testing.T) {
	t.Parallel()
	f := new(troupe.FaultNet)
	prod, ws := workNodes(t, f, "w1", "w2")
	tl := newWorkTally()
	for i, n := range append([]*troupe.Node{prod}, ws...) {
		if _, err := troupe.Worker(n, "worker", tasksKey, counting(tl, fmt.Sprint(i)), troupe.WorkConfig{}); err != nil {
			t.Fatal(err)
		}
	}
	p := mustProduce(t, prod, tasksKey, troupe.WorkConfig{})
	ctx := ctxFor(t)
	waitWorkers(t, p, 3)
	const jobs = 3000
	for i := 1; i <= jobs; i++ {
		if err := p.Send(ctx, task{N: i, Body: make([]byte, 100+i%1000)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if m := tl.missing(jobs); len(m) > 0 {
		t.Fatalf("%d tasks were not processed: %v", len(m), m[:min(10, len(m))])
	}
	per := map[string]int{}
	for n, who := range tl.runs {
		if len(who) != 1 {
			t.Fatalf("task %d processed %d times without a fault: %v", n, len(who), who)
		}
		per[who[0]]++
	}
	if len(per) != 3 {
		t.Fatalf("the tasks went to %d workers, not 3: %v", len(per), per)
	}
	st := p.Stats()
	if st.Sent != jobs || st.Confirmed != jobs || st.Unconfirmed != 0 || st.Redelivered != 0 {
		t.Fatalf("stats %+v, want %d sent and confirmed, none unconfirmed or redelivered", st, jobs)
	}
}

// A worker whose node vanishes mid-run has its unconfirmed jobs handed to
// the others: every job is processed, and confirmed once.
func TestWorkOfAVanishedWorkerGoesToTheOthers(t *testing.T) {
	t.Parallel()
	f := new(troupe.FaultNet)
	prod, ws := workNodes(t, f, "w1", "w2", "w3")
	tl := newWorkTally()
	stuck := make(chan struct{}, 1) // (a room: w2 may take its first job before the test waits)
	// w2's worker takes its room of jobs and never confirms them.
	for i, n := range ws {
		b := counting(tl, fmt.Sprint("w", i+1))
		if i == 1 {
			b = troupe.Behavior[troupe.Delivery[task]]{Receive: func(_ *troupe.Context[troupe.Delivery[task]], d troupe.Delivery[task]) {
				tl.add(d.Job.N, "w2", d.Redelivered)
				select {
				case stuck <- struct{}{}:
				default:
				}
			}}
		}
		if _, err := troupe.Worker(n, "worker", tasksKey, b, troupe.WorkConfig{Room: 4}); err != nil {
			t.Fatal(err)
		}
	}
	p := mustProduce(t, prod, tasksKey, troupe.WorkConfig{Window: 50})
	ctx := ctxFor(t)
	waitWorkers(t, p, 3)
	const jobs = 500
	sent := make(chan error, 1)
	go func() {
		for i := 1; i <= jobs; i++ {
			if err := p.Send(ctx, task{N: i, Body: make([]byte, 1000)}); err != nil {
				sent <- err
				return
			}
		}
		sent <- nil
	}()
	<-stuck
	if err := f.Kill(ws[1]); err != nil {
		t.Fatal(err)
	}
	if err := <-sent; err != nil {
		t.Fatal(err)
	}
	if err := p.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if m := tl.missing(jobs); len(m) > 0 {
		t.Fatalf("%d tasks were not processed: %v", len(m), m[:min(10, len(m))])
	}
	// The jobs w2 held may come back before its watch reports it gone (the
	// session's end hands back what it carried): the producer drops w2
	// when the watch does.
	waitWorkers(t, p, 2)
	st := p.Stats()
	if st.Confirmed != jobs || st.Unconfirmed != 0 || st.Redelivered < 1 || st.Workers != 2 {
		t.Fatalf("stats %+v, want %d confirmed, some redelivered, two workers left", st, jobs)
	}
	tl.mu.Lock()
	defer tl.mu.Unlock()
	if tl.redo != st.Redelivered {
		t.Fatalf("workers saw %d redelivered jobs, the producer counts %d", tl.redo, st.Redelivered)
	}
}

// A supervised worker that fails on a job is restarted, and the fresh
// behavior gets the unconfirmed jobs again, marked Redelivered.
func TestWorkOfARestartedWorkerIsHandedAgain(t *testing.T) {
	t.Parallel()
	f := new(troupe.FaultNet)
	prod, ws := workNodes(t, f, "w1")
	tl := newWorkTally()
	var once sync.Once
	b := troupe.Supervise(func() troupe.Behavior[troupe.Delivery[task]] {
		return troupe.Behavior[troupe.Delivery[task]]{Receive: func(c *troupe.Context[troupe.Delivery[task]], d troupe.Delivery[task]) {
			failed := false
			if d.Job.N == 7 {
				once.Do(func() { failed = true })
			}
			if failed {
				c.Fail(errors.New("task 7 failed once"))
				return
			}
			tl.add(d.Job.N, "w1", d.Redelivered)
			d.Confirm()
		}}
	}, troupe.RestartOnFailure())
	if _, err := troupe.Worker(ws[0], "worker", tasksKey, b, troupe.WorkConfig{Room: 5}); err != nil {
		t.Fatal(err)
	}
	p := mustProduce(t, prod, tasksKey, troupe.WorkConfig{})
	ctx := ctxFor(t)
	waitWorkers(t, p, 1)
	const jobs = 100
	sendTasks(t, ctx, p, 1, jobs)
	if err := p.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if m := tl.missing(jobs); len(m) > 0 {
		t.Fatalf("tasks not processed: %v", m)
	}
	tl.mu.Lock()
	defer tl.mu.Unlock()
	if len(tl.runs[7]) != 1 || tl.redo == 0 {
		t.Fatalf("task 7 ran %d times after its failure, %d deliveries were marked redelivered; want once, and some", len(tl.runs[7]), tl.redo)
	}
	for n, who := range tl.runs {
		if len(who) != 1 {
			t.Fatalf("task %d ran %d times: a delivery made before the restart was handled after it", n, len(who))
		}
	}
}

// Send waits while the window is full of unconfirmed jobs, and returns
// ctx's error when ctx ends first; Close makes the unconfirmed jobs dead
// letters and later Sends fail.
func TestWorkSendWaitsForTheWindow(t *testing.T) {
	t.Parallel()
	f := new(troupe.FaultNet)
	prod, _ := workNodes(t, f)
	p, err := troupe.Produce(prod, tasksKey, troupe.WorkConfig{Window: 3})
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxFor(t)
	sendTasks(t, ctx, p, 1, 3)
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if err := p.Send(short, task{N: 4}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Send with a full window and no worker: %v, want the deadline", err)
	}
	dead := make(chan troupe.DeadLetter, 10)
	sub := troupe.SubscribeChan(prod, dead)
	defer sub.Unsubscribe()
	p.Close()
	for i := 1; i <= 3; i++ {
		select {
		case d := <-dead:
			if strings.HasPrefix(fmt.Sprintf("%T", d.Message), "troupe.") {
				i--
				continue // troupe's own: the producer's listing
			}
			if tk, ok := d.Message.(task); !ok || tk.N != i || !errors.Is(d.Reason, troupe.ErrActorStopped) {
				t.Fatalf("dead letter %d: %+v", i, d)
			}
		case <-ctx.Done():
			t.Fatalf("the unconfirmed task %d did not become a dead letter", i)
		}
	}
	if err := p.Send(ctx, task{N: 5}); !errors.Is(err, troupe.ErrActorStopped) {
		t.Fatalf("Send after Close: %v, want ErrActorStopped", err)
	}
}

// A producer with a journal keeps its unconfirmed jobs across Close: the
// next producer of the directory hands them out (marked Redelivered) and
// numbers new jobs after them; once every job is confirmed the journal is
// empty, and one producer at a time uses a directory.
func TestWorkJournalKeepsUnconfirmedJobs(t *testing.T) {
	t.Parallel()
	f := new(troupe.FaultNet)
	prod, ws := workNodes(t, f, "w1")
	dir := t.TempDir()
	ctx := ctxFor(t)
	p, err := troupe.Produce(prod, tasksKey, troupe.WorkConfig{Journal: dir})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := troupe.Produce(prod, tasksKey, troupe.WorkConfig{Journal: dir}); err == nil || !strings.Contains(err.Error(), "in use") {
		t.Fatalf("a second producer of one journal: %v, want an error saying it is in use", err)
	}
	const jobs = 200
	for i := 1; i <= jobs; i++ {
		if err := p.Send(ctx, task{N: i, Body: make([]byte, i*50)}); err != nil {
			t.Fatal(err)
		}
	}
	p.Close() // no worker yet: all 200 unconfirmed, kept

	p, err = troupe.Produce(prod, tasksKey, troupe.WorkConfig{Journal: dir})
	if err != nil {
		t.Fatal(err)
	}
	if st := p.Stats(); st.Recovered != jobs || st.Unconfirmed != jobs {
		t.Fatalf("reopened: %+v, want %d recovered and unconfirmed", st, jobs)
	}
	seqs := make(chan troupe.Delivery[task], 2*jobs)
	if _, err := troupe.Worker(ws[0], "worker", tasksKey, troupe.Behavior[troupe.Delivery[task]]{
		Receive: func(_ *troupe.Context[troupe.Delivery[task]], d troupe.Delivery[task]) {
			seqs <- d
			d.Confirm()
		}}, troupe.WorkConfig{}); err != nil {
		t.Fatal(err)
	}
	if err := p.Send(ctx, task{N: jobs + 1}); err != nil {
		t.Fatal(err)
	}
	if err := p.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	got := map[int]troupe.Delivery[task]{}
	for len(got) < jobs+1 {
		d := <-seqs
		got[d.Job.N] = d
	}
	for i := 1; i <= jobs; i++ {
		d := got[i]
		if d.Seq != uint64(i) || !d.Redelivered || len(d.Job.Body) != i*50 {
			t.Fatalf("job %d from the journal came as seq %d, redelivered %v, %d bytes", i, d.Seq, d.Redelivered, len(d.Job.Body))
		}
	}
	if d := got[jobs+1]; d.Seq != jobs+1 || d.Redelivered {
		t.Fatalf("the new job came as seq %d, redelivered %v; want %d, false", d.Seq, d.Redelivered, jobs+1)
	}
	p.Close()
	p, err = troupe.Produce(prod, tasksKey, troupe.WorkConfig{Journal: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if st := p.Stats(); st.Recovered != 0 {
		t.Fatalf("after every job was confirmed the journal still holds %d", st.Recovered)
	}
}

// A journal whose last record was cut short by a crash opens without it;
// one damaged before its end does not open, with an error saying where.
func TestWorkJournalCutShortOrDamaged(t *testing.T) {
	t.Parallel()
	f := new(troupe.FaultNet)
	prod, _ := workNodes(t, f)
	ctx := ctxFor(t)
	fill := func(dir string, n int) string {
		p, err := troupe.Produce(prod, tasksKey, troupe.WorkConfig{Journal: dir})
		if err != nil {
			t.Fatal(err)
		}
		for i := 1; i <= n; i++ {
			if err := p.Send(ctx, task{N: i, Body: []byte("payload")}); err != nil {
				t.Fatal(err)
			}
		}
		p.Close()
		segs, _ := filepath.Glob(filepath.Join(dir, "*.journal"))
		if len(segs) != 1 {
			t.Fatalf("segments: %v, want one", segs)
		}
		return segs[0]
	}
	cut := t.TempDir()
	seg := fill(cut, 3)
	b, _ := os.ReadFile(seg)
	os.WriteFile(seg, b[:len(b)-3], 0o600) // the third job's record, cut short
	p, err := troupe.Produce(prod, tasksKey, troupe.WorkConfig{Journal: cut})
	if err != nil {
		t.Fatal(err)
	}
	if st := p.Stats(); st.Recovered != 2 {
		t.Fatalf("a journal cut short in its last record: %d recovered, want 2", st.Recovered)
	}
	p.Close()

	for _, later := range []bool{false, true} {
		bad := t.TempDir()
		seg = fill(bad, 10)
		b, _ = os.ReadFile(seg)
		b[len(b)/4] ^= 0xff // a record near the start
		os.WriteFile(seg, b, 0o600)
		if later {
			os.WriteFile(filepath.Join(bad, "ffffffffffffff00.journal"), nil, 0o600)
		}
		if _, err := troupe.Produce(prod, tasksKey, troupe.WorkConfig{Journal: bad}); err == nil || !strings.Contains(err.Error(), "damaged") {
			t.Fatalf("a journal damaged before its end (later segment: %v): %v, want an error saying it is damaged", later, err)
		}
	}
}

// A journal whose jobs are confirmed as they go stays small: once its
// segment holds more than twice the live jobs' bytes (and 4 MiB), a new
// segment starts with the live jobs and the old one is removed.
func TestWorkJournalIsCompacted(t *testing.T) {
	t.Parallel()
	f := new(troupe.FaultNet)
	prod, ws := workNodes(t, f, "w1")
	dir := t.TempDir()
	ctx := ctxFor(t)
	if _, err := troupe.Worker(ws[0], "worker", tasksKey, counting(newWorkTally(), "w1"), troupe.WorkConfig{}); err != nil {
		t.Fatal(err)
	}
	p := mustProduce(t, prod, tasksKey, troupe.WorkConfig{Journal: dir, NoSync: true, Window: 20})
	body := make([]byte, 100<<10)
	for i := 1; i <= 200; i++ { // 20 MB in all
		if err := p.Send(ctx, task{N: i, Body: body}); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	segs, _ := filepath.Glob(filepath.Join(dir, "*.journal"))
	var size int64
	for _, s := range segs {
		fi, err := os.Stat(s)
		if err != nil {
			t.Fatal(err)
		}
		size += fi.Size()
	}
	if len(segs) != 1 || size > 9<<20 {
		t.Fatalf("after 20 MB of confirmed jobs the journal is %d segments, %d bytes; want one of at most 9 MiB", len(segs), size)
	}
}

// One worker sees the jobs in their order, across a restart too: the
// fresh behavior gets the unconfirmed jobs first, then the later ones.
func TestWorkToOneWorkerKeepsItsOrderAcrossARestart(t *testing.T) {
	t.Parallel()
	f := new(troupe.FaultNet)
	prod, ws := workNodes(t, f, "w1")
	var mu sync.Mutex
	var order []int
	failed := false
	b := troupe.Supervise(func() troupe.Behavior[troupe.Delivery[task]] {
		return troupe.Behavior[troupe.Delivery[task]]{Receive: func(c *troupe.Context[troupe.Delivery[task]], d troupe.Delivery[task]) {
			mu.Lock()
			defer mu.Unlock()
			if d.Job.N == 50 && !failed {
				failed = true
				time.Sleep(20 * time.Millisecond) // later jobs arrive meanwhile
				c.Fail(errors.New("job 50 fails once"))
				return
			}
			order = append(order, d.Job.N)
			d.Confirm()
		}}
	}, troupe.RestartOnFailure())
	if _, err := troupe.Worker(ws[0], "worker", tasksKey, b, troupe.WorkConfig{Room: 20}); err != nil {
		t.Fatal(err)
	}
	p := mustProduce(t, prod, tasksKey, troupe.WorkConfig{})
	ctx := ctxFor(t)
	waitWorkers(t, p, 1)
	const jobs = 300
	sendTasks(t, ctx, p, 1, jobs)
	if err := p.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	for i, n := range order {
		if n != i+1 {
			t.Fatalf("the worker processed %v... (at %d: %d, want %d)", order[max(0, i-3):min(len(order), i+5)], i, n, i+1)
		}
	}
	if len(order) != jobs {
		t.Fatalf("processed %d jobs, want %d", len(order), jobs)
	}
}

// Close right after a burst of Sends: every job Send took is a dead
// letter of its own (none lost, none as a wrapper), counted once.
func TestWorkCloseAfterABurstLosesNoJobSilently(t *testing.T) {
	t.Parallel()
	f := new(troupe.FaultNet)
	prod, _ := workNodes(t, f)
	p, err := troupe.Produce(prod, tasksKey, troupe.WorkConfig{})
	if err != nil {
		t.Fatal(err)
	}
	dead := make(chan troupe.DeadLetter, 2000)
	sub := troupe.SubscribeChan(prod, dead)
	defer sub.Unsubscribe()
	ctx := ctxFor(t)
	const jobs = 1000
	for i := 1; i <= jobs; i++ {
		if err := p.Send(ctx, task{N: i, Body: make([]byte, 64)}); err != nil {
			t.Fatal(err)
		}
	}
	p.Close()
	seen := map[int]bool{}
	for len(seen) < jobs {
		select {
		case d := <-dead:
			if strings.HasPrefix(fmt.Sprintf("%T", d.Message), "troupe.") {
				continue // troupe's own: the producer's listing, a late confirmation
			}
			tk, ok := d.Message.(task)
			if !ok || !errors.Is(d.Reason, troupe.ErrActorStopped) || seen[tk.N] {
				t.Fatalf("dead letter %+v (%T): want each task once, reason ErrActorStopped", d, d.Message)
			}
			seen[tk.N] = true
		case <-ctx.Done():
			t.Fatalf("%d of %d tasks became dead letters", len(seen), jobs)
		}
	}
}

// The producer's node closing ends a Send waiting for the window and a
// Wait, with an error wrapping ErrActorStopped: no wait outlives its node.
func TestWorkWaitAndSendEndWhenTheNodeCloses(t *testing.T) {
	t.Parallel()
	f := new(troupe.FaultNet)
	prod, _ := workNodes(t, f)
	p, err := troupe.Produce(prod, tasksKey, troupe.WorkConfig{Window: 1})
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxFor(t) // bounds the test only: the calls below have no deadline
	if err := p.Send(ctx, task{N: 1}); err != nil {
		t.Fatal(err)
	}
	waitErr, sendErr := make(chan error, 1), make(chan error, 1)
	go func() { waitErr <- p.Wait(context.Background()) }()
	go func() { sendErr <- p.Send(context.Background(), task{N: 2}) }()
	prod.Close()
	for name, ch := range map[string]chan error{"Wait": waitErr, "Send": sendErr} {
		select {
		case err := <-ch:
			if !errors.Is(err, troupe.ErrActorStopped) {
				t.Errorf("%s after the node closed: %v, want ErrActorStopped", name, err)
			}
		case <-ctx.Done():
			t.Fatalf("%s still waits after the producer's node closed", name)
		}
	}
	if err := p.Wait(ctx); !errors.Is(err, troupe.ErrActorStopped) {
		t.Fatalf("Wait after the node closed: %v, want ErrActorStopped", err)
	}
}

// A job too big for the link to a remote worker (over MaxFrameSize) can
// go to no worker: it is given up as a dead letter of its own, saying
// why, and the jobs after it go on.
func TestWorkJobTooBigForTheWireIsADeadLetter(t *testing.T) {
	t.Parallel()
	f := new(troupe.FaultNet)
	prod, ws := workNodes(t, f, "w1")
	tl := newWorkTally()
	if _, err := troupe.Worker(ws[0], "worker", tasksKey, counting(tl, "w1"), troupe.WorkConfig{}); err != nil {
		t.Fatal(err)
	}
	dead := make(chan troupe.DeadLetter, 100)
	sub := troupe.SubscribeChan(prod, dead)
	defer sub.Unsubscribe()
	p := mustProduce(t, prod, tasksKey, troupe.WorkConfig{})
	waitWorkers(t, p, 1)
	ctx := ctxFor(t)
	for i, size := range []int{100, 5 << 20, 3 << 20} { // MaxFrameSize is 4 MiB
		if err := p.Send(ctx, task{N: i + 1, Body: make([]byte, size)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Wait(ctx); err != nil {
		t.Fatalf("Wait: %v (stats %+v)", err, p.Stats())
	}
	if m := tl.missing(3); len(m) != 1 || m[0] != 2 {
		t.Fatalf("unprocessed: %v, want job 2 only", m)
	}
	for {
		select {
		case d := <-dead:
			if tk, ok := d.Message.(task); ok {
				if tk.N != 2 || !errors.Is(d.Reason, troupe.ErrFrameTooBig) {
					t.Fatalf("dead letter of task %d: %v, want task 2, ErrFrameTooBig", tk.N, d.Reason)
				}
				return
			}
		case <-ctx.Done():
			t.Fatal("the job too big for the wire made no dead letter")
		}
	}
}

// A burst of 1 MiB jobs to a worker with room for all of them, past the
// association's 64 MiB send budget: the jobs that find no room wait, and
// every one is processed.
func TestWorkBurstPastTheSendBudgetWaits(t *testing.T) {
	t.Parallel()
	slowTest(t)
	f := new(troupe.FaultNet)
	// The default Config: under -race on a loaded machine, the fast
	// failure detection of workNodes could give the worker up while 64
	// MiB wait unacknowledged.
	prod, ws := workNodesWith(t, f, func(string) troupe.Config { return troupe.Config{} }, "w1")
	tl := newWorkTally()
	if _, err := troupe.Worker(ws[0], "worker", tasksKey, counting(tl, "w1"), troupe.WorkConfig{Room: 100}); err != nil {
		t.Fatal(err)
	}
	p := mustProduce(t, prod, tasksKey, troupe.WorkConfig{})
	dead := make(chan troupe.DeadLetter, 1000)
	sub := troupe.SubscribeChan(prod, dead)
	defer sub.Unsubscribe()
	waitWorkers(t, p, 1)
	// 100 MiB through one association under -race on a loaded machine:
	// a bound for the whole, not a timing assertion.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	body := make([]byte, 1<<20)
	const jobs = 100
	for i := 1; i <= jobs; i++ {
		if err := p.Send(ctx, task{N: i, Body: body}); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Wait(ctx); err != nil {
		for len(dead) > 0 {
			d := <-dead
			t.Logf("dead letter: %T to %s: %v", d.Message, d.Target, d.Reason)
		}
		t.Fatalf("Wait: %v (stats %+v; the worker node's dead letters %v, its peers %+v)", err, p.Stats(), ws[0].Stats().DeadLetters, ws[0].Stats().Peers)
	}
	if m := tl.missing(jobs); len(m) > 0 {
		t.Fatalf("unprocessed: %v", m)
	}
}

// A worker supervised with ResumeOnFailure gets the job it failed on
// again: a resumed behavior goes on, and the job is not dropped.
func TestWorkResumedWorkerGetsTheFailedJobAgain(t *testing.T) {
	t.Parallel()
	f := new(troupe.FaultNet)
	prod, ws := workNodes(t, f, "w1")
	tl := newWorkTally()
	failed := false
	b := troupe.Supervise(func() troupe.Behavior[troupe.Delivery[task]] {
		return troupe.Behavior[troupe.Delivery[task]]{Receive: func(c *troupe.Context[troupe.Delivery[task]], d troupe.Delivery[task]) {
			if d.Job.N == 1 && !failed {
				failed = true
				c.Fail(errors.New("job 1 fails once"))
				return
			}
			if d.Job.N == 2 && d.Redelivered == false && !tl.has(2) {
				tl.add(2, "w1", false)
				panic("job 2 panics once")
			}
			tl.add(d.Job.N, "w1", d.Redelivered)
			d.Confirm()
		}}
	}, troupe.ResumeOnFailure())
	if _, err := troupe.Worker(ws[0], "worker", tasksKey, b, troupe.WorkConfig{}); err != nil {
		t.Fatal(err)
	}
	p := mustProduce(t, prod, tasksKey, troupe.WorkConfig{})
	ctx := ctxFor(t)
	sendTasks(t, ctx, p, 1, 3)
	if err := p.Wait(ctx); err != nil {
		t.Fatalf("Wait: %v (stats %+v)", err, p.Stats())
	}
	if m := tl.missing(3); len(m) > 0 {
		t.Fatalf("unprocessed: %v", m)
	}
}

// A journal's job numbers never repeat, and its producer's identity
// stays: the next producer of a directory whose jobs were all confirmed
// (and compacted away) goes on from the highest number used.
func TestWorkJournalNumbersNeverRepeat(t *testing.T) {
	t.Parallel()
	f := new(troupe.FaultNet)
	prod, ws := workNodes(t, f, "w1")
	dir := t.TempDir()
	ctx := ctxFor(t)
	got := make(chan troupe.Delivery[task], 10)
	if _, err := troupe.Worker(ws[0], "worker", tasksKey, troupe.Behavior[troupe.Delivery[task]]{
		Receive: func(_ *troupe.Context[troupe.Delivery[task]], d troupe.Delivery[task]) { got <- d; d.Confirm() }}, troupe.WorkConfig{}); err != nil {
		t.Fatal(err)
	}
	send := func(n int) troupe.Delivery[task] {
		p, err := troupe.Produce(prod, tasksKey, troupe.WorkConfig{Journal: dir})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		if err := p.Send(ctx, task{N: n}); err != nil {
			t.Fatal(err)
		}
		if err := p.Wait(ctx); err != nil {
			t.Fatal(err)
		}
		return <-got
	}
	first := send(1)
	for range 2 { // opened and closed: each open compacts
		p, err := troupe.Produce(prod, tasksKey, troupe.WorkConfig{Journal: dir})
		if err != nil {
			t.Fatal(err)
		}
		p.Close()
	}
	second := send(2)
	if first.Seq != 1 || second.Seq != 2 || first.Producer != second.Producer || first.Producer == (troupe.UUID{}) {
		t.Fatalf("deliveries (%v, %d) and (%v, %d): want seqs 1 and 2 of one producer", first.Producer, first.Seq, second.Producer, second.Seq)
	}
}

// A link flap between the producer and a worker mid-stream (the
// connection reset, the session resumed) loses nothing and hands nothing
// out again: the jobs and confirmations in flight arrive once.
func TestWorkLinkFlapLosesAndRepeatsNothing(t *testing.T) {
	t.Parallel()
	f := new(troupe.FaultNet)
	prod, ws := workNodes(t, f, "w1")
	tl := newWorkTally()
	half := make(chan struct{})
	var once sync.Once
	if _, err := troupe.Worker(ws[0], "worker", tasksKey, troupe.Behavior[troupe.Delivery[task]]{
		Receive: func(_ *troupe.Context[troupe.Delivery[task]], d troupe.Delivery[task]) {
			tl.add(d.Job.N, "w1", d.Redelivered)
			if d.Job.N == 250 {
				once.Do(func() { close(half) })
			}
			d.Confirm()
		}}, troupe.WorkConfig{}); err != nil {
		t.Fatal(err)
	}
	p := mustProduce(t, prod, tasksKey, troupe.WorkConfig{})
	ctx := ctxFor(t)
	const jobs = 500
	sent := make(chan error, 1)
	go func() {
		for i := 1; i <= jobs; i++ {
			if err := p.Send(ctx, task{N: i, Body: make([]byte, 4096)}); err != nil {
				sent <- err
				return
			}
		}
		sent <- nil
	}()
	<-half
	if f.Reset(prod, ws[0]) == 0 {
		t.Fatal("no connection between the producer and the worker to reset")
	}
	if err := <-sent; err != nil {
		t.Fatal(err)
	}
	if err := p.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if m := tl.missing(jobs); len(m) > 0 {
		t.Fatalf("unprocessed: %v", m)
	}
	tl.mu.Lock()
	defer tl.mu.Unlock()
	for n, who := range tl.runs {
		if len(who) != 1 {
			t.Fatalf("task %d processed %d times across a resumed link flap", n, len(who))
		}
	}
	if st := p.Stats(); st.Redelivered != 0 || st.Workers != 1 {
		t.Fatalf("stats %+v: a resumed link flap handed jobs out again or lost the worker", st)
	}
}

// A consumer that moves: the worker is a child of a cluster singleton's
// instance. When the member that runs it leaves, the instance stops there
// and its worker with it; the instance starts on the next member with a
// worker of its own, and the jobs the first held go to it. None is lost.
func TestWorkConsumerMovesWithItsSingleton(t *testing.T) {
	t.Parallel()
	f := new(troupe.FaultNet)
	tl := newWorkTally()
	var nodes []*troupe.Node
	var members []*troupe.Cluster
	for _, name := range []string{"a", "b", "c"} {
		n, c := joinRegistryless(t, f, name, nodes, troupe.ClusterConfig{Downing: troupe.KeepMajority(), StableAfter: singletonStable})
		nodes, members = append(nodes, n), append(members, c)
		waitAllUp(t, members, len(members))
	}
	var once sync.Once
	half := make(chan struct{})
	// Until the move, a worker holds the jobs after the first hundred
	// without confirming them (work in hand when its member leaves).
	var moved atomic.Bool
	var inHand sync.Map // jobs a worker held unconfirmed before the move
	for i, c := range members {
		name := []string{"a", "b", "c"}[i]
		if _, err := troupe.Singleton(c, "consumer", func() troupe.Behavior[tick] {
			return troupe.Behavior[tick]{
				Setup: func(ctx *troupe.Context[tick]) {
					_, err := troupe.Worker(ctx, "worker", tasksKey, troupe.Behavior[troupe.Delivery[task]]{
						Receive: func(_ *troupe.Context[troupe.Delivery[task]], d troupe.Delivery[task]) {
							tl.add(d.Job.N, name, d.Redelivered)
							if d.Job.N > 100 && !moved.Load() {
								inHand.Store(d.Job.N, true)
								once.Do(func() { close(half) })
								return // in hand
							}
							d.Confirm()
						}}, troupe.WorkConfig{Room: 5})
					if err != nil {
						ctx.Fail(err)
					}
				},
				Receive: func(*troupe.Context[tick], tick) {},
			}
		}, troupe.SingletonConfig{RemovalMargin: time.Hour}); err != nil {
			t.Fatal(err)
		}
	}
	p := mustProduce(t, nodes[2], tasksKey, troupe.WorkConfig{})
	ctx := ctxFor(t)
	const jobs = 400
	sent := make(chan error, 1)
	go func() {
		for i := 1; i <= jobs; i++ {
			if err := p.Send(ctx, task{N: i}); err != nil {
				sent <- err
				return
			}
		}
		sent <- nil
	}()
	<-half
	moved.Store(true)
	if err := members[0].Close(); err != nil { // a leaves: the singleton moves to b
		t.Fatal(err)
	}
	if err := <-sent; err != nil {
		t.Fatal(err)
	}
	if err := p.Wait(ctx); err != nil {
		t.Fatalf("Wait: %v (stats %+v)", err, p.Stats())
	}
	if m := tl.missing(jobs); len(m) > 0 {
		t.Fatalf("unprocessed: %v", m)
	}
	tl.mu.Lock()
	defer tl.mu.Unlock()
	on := map[string]int{}
	for _, who := range tl.runs {
		for _, w := range who {
			on[w]++
		}
	}
	held := 0
	inHand.Range(func(k, _ any) bool {
		held++
		if who := tl.runs[k.(int)]; who[len(who)-1] != "b" {
			t.Errorf("job %d, held unconfirmed on a when it left, was last done on %v, not b", k, who)
		}
		return true
	})
	if on["a"] < 100 || on["b"] == 0 || on["c"] != 0 || held == 0 {
		t.Fatalf("jobs done on each member: %v, %d held on a when it left; want a's first hundred, then b's, a's in hand among them", on, held)
	}
}

// workFaultsDuration is how long the random fault schedules of the work
// tests inject faults: $TROUPE_WORK_FAULTS (a Go duration), 4 s by
// default.
func workFaultsDuration() time.Duration {
	if d, err := time.ParseDuration(os.Getenv("TROUPE_WORK_FAULTS")); err == nil {
		return d
	}
	return 4 * time.Second
}

// pjob is a job whose encoding panics for N == 2.
type pjob struct{ N int }

func (j pjob) AppendWire(b []byte) []byte {
	if j.N == 2 {
		panic("pjob 2 cannot be encoded")
	}
	return append(b, byte(j.N))
}

func (j *pjob) UnmarshalWire(b []byte) error {
	if len(b) != 1 {
		return errors.New("pjob: one byte")
	}
	j.N = int(b[0])
	return nil
}

func init() { troupe.SetWireKey[pjob]("troupe.test.work.pjob") }

// A job whose encoding fails (its AppendWire panics) can go to no remote
// worker: it is a dead letter of its own, and the workers go on with the
// rest.
func TestWorkJobThatCannotEncodeIsADeadLetter(t *testing.T) {
	t.Parallel()
	f := new(troupe.FaultNet)
	prod, ws := workNodes(t, f, "w1", "w2")
	key := troupe.ServiceKey[pjob]{Name: "pjobs"}
	var mu sync.Mutex
	done := map[int]bool{}
	for _, n := range ws {
		if _, err := troupe.Worker(n, "worker", key, troupe.Behavior[troupe.Delivery[pjob]]{
			Receive: func(_ *troupe.Context[troupe.Delivery[pjob]], d troupe.Delivery[pjob]) {
				mu.Lock()
				done[d.Job.N] = true
				mu.Unlock()
				d.Confirm()
			}}, troupe.WorkConfig{}); err != nil {
			t.Fatal(err)
		}
	}
	dead := make(chan troupe.DeadLetter, 100)
	sub := troupe.SubscribeChan(prod, dead)
	defer sub.Unsubscribe()
	p := mustProduce(t, prod, key, troupe.WorkConfig{})
	waitWorkers(t, p, 2)
	ctx := ctxFor(t)
	for i := 1; i <= 10; i++ {
		if err := p.Send(ctx, pjob{N: i}); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Wait(ctx); err != nil {
		t.Fatalf("Wait: %v (stats %+v)", err, p.Stats())
	}
	mu.Lock()
	if len(done) != 9 || done[2] {
		t.Fatalf("done: %v, want every job but 2", done)
	}
	mu.Unlock()
	for {
		select {
		case d := <-dead:
			if j, ok := d.Message.(pjob); ok && j.N == 2 {
				return
			}
		case <-ctx.Done():
			t.Fatal("the job that cannot be encoded made no dead letter")
		}
	}
}

// A worker supervised with ResumeOnFailure keeps its order: the job it
// failed on comes again before the ones behind it; and a job that fails
// every time is handed again ever more slowly, not in a tight loop.
func TestWorkResumedWorkerKeepsItsOrderAndBacksOff(t *testing.T) {
	t.Parallel()
	f := new(troupe.FaultNet)
	prod, ws := workNodes(t, f, "w1")
	var mu sync.Mutex
	var order []int
	tries := 0
	failedOnce := false
	b := troupe.Supervise(func() troupe.Behavior[troupe.Delivery[task]] {
		return troupe.Behavior[troupe.Delivery[task]]{Receive: func(c *troupe.Context[troupe.Delivery[task]], d troupe.Delivery[task]) {
			mu.Lock()
			defer mu.Unlock()
			switch {
			case d.Job.N == 50 && !failedOnce:
				failedOnce = true
				c.Fail(errors.New("job 50 fails once"))
				return
			case d.Job.N == 1000: // fails every time
				tries++
				c.Fail(errors.New("job 1000 always fails"))
				return
			}
			order = append(order, d.Job.N)
			d.Confirm()
		}}
	}, troupe.ResumeOnFailure())
	if _, err := troupe.Worker(ws[0], "worker", tasksKey, b, troupe.WorkConfig{Room: 20}); err != nil {
		t.Fatal(err)
	}
	p := mustProduce(t, prod, tasksKey, troupe.WorkConfig{})
	ctx := ctxFor(t)
	const jobs = 300
	sendTasks(t, ctx, p, 1, jobs)
	if err := p.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	for i, n := range order {
		if n != i+1 {
			mu.Unlock()
			t.Fatalf("the resumed worker processed %v (at %d: %d, want %d)", order[max(0, i-3):min(len(order), i+5)], i, n, i+1)
		}
	}
	mu.Unlock()
	if err := p.Send(ctx, task{N: 1000}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	waitUntil(t, 10*time.Second, "job 1000 tried a few times", func() bool { mu.Lock(); defer mu.Unlock(); return tries >= 5 })
	waited := time.Since(start)
	mu.Lock()
	n := tries
	mu.Unlock()
	// Five tries back off 0, 10, 20, 40 ms: at least 70 ms; a tight loop
	// makes thousands in that time.
	if waited < 70*time.Millisecond || n > 50 {
		t.Fatalf("a job failing every time was tried %d times in %v: no backoff", n, waited)
	}
}

// Work pulling under a random schedule of the fault network's faults
// (seeded; $TROUPE_WORK_SEED replays it), jobs paced through them:
// partitions and one-way cuts between the producer and a worker, within
// the failure window (the link recovers) and past it (the worker is
// given up on and quarantined, and a new worker node replaces it),
// resets, pauses and vanished nodes. Every job sent is processed, and
// Wait returns; it reports the counts.
func TestWorkUnderRandomPartitions(t *testing.T) {
	t.Parallel()
	slowTest(t)
	seed := time.Now().UnixNano()
	if s, err := strconv.ParseInt(os.Getenv("TROUPE_WORK_SEED"), 10, 64); err == nil {
		seed = s
	}
	rng := rand.New(rand.NewPCG(uint64(seed), 1))
	t.Logf("seed %d (TROUPE_WORK_SEED replays the schedule)", seed)
	f := new(troupe.FaultNet)
	prod, first := workNodes(t, f, "w1", "w2", "w3")
	tl := newWorkTally()
	reg := prod.Addrs()[0].String()
	made := 3
	start := func() *troupe.Node {
		made++
		name := fmt.Sprint("w", made)
		n, err := f.Start(context.Background(), troupe.Config{Name: name, RegistryAddrs: []string{reg},
			HeartbeatInterval: 100 * time.Millisecond, UnreachableAfter: time.Second,
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { n.Close() })
		if _, err := troupe.Worker(n, "worker", tasksKey, counting(tl, name), troupe.WorkConfig{Room: 5}); err != nil {
			t.Fatal(err)
		}
		return n
	}
	var workers []*troupe.Node
	for i, n := range first {
		if _, err := troupe.Worker(n, "worker", tasksKey, counting(tl, fmt.Sprint("w", i+1)), troupe.WorkConfig{Room: 5}); err != nil {
			t.Fatal(err)
		}
		workers = append(workers, n)
	}
	p := mustProduce(t, prod, tasksKey, troupe.WorkConfig{Window: 200})
	ctx, cancel := context.WithTimeout(context.Background(), workFaultsDuration()+time.Minute)
	defer cancel()
	stop := make(chan struct{})
	sent := make(chan int, 1)
	go func() {
		n := 0
		defer func() { sent <- n }()
		pace := time.NewTicker(2 * time.Millisecond)
		defer pace.Stop()
		for {
			select {
			case <-stop:
				return
			case <-pace.C:
			}
			if err := p.Send(ctx, task{N: n + 1, Body: make([]byte, 256)}); err != nil {
				t.Errorf("Send: %v", err)
				return
			}
			n++
		}
	}()
	counts := map[string]int{}
	for end := time.Now().Add(workFaultsDuration()); time.Now().Before(end); {
		time.Sleep(time.Duration(100+rng.IntN(400)) * time.Millisecond)
		i := rng.IntN(len(workers))
		w := workers[i]
		long := rng.IntN(3) == 0
		d := time.Duration(100+rng.IntN(500)) * time.Millisecond
		if long {
			d = 1500*time.Millisecond + time.Duration(rng.IntN(500))*time.Millisecond
		}
		switch rng.IntN(5) {
		case 0:
			counts[fmt.Sprint("partition, long: ", long)]++
			f.Partition(prod, w)
			time.Sleep(d)
			f.Heal()
		case 1:
			if rng.IntN(2) == 0 {
				counts[fmt.Sprint("one-way cut from the worker, long: ", long)]++
				f.Drop(w, prod)
			} else {
				counts[fmt.Sprint("one-way cut to the worker, long: ", long)]++
				f.Drop(prod, w)
			}
			time.Sleep(d)
			f.Heal()
		case 2:
			counts["reset"]++
			f.Reset(prod, w)
			long = false
		case 3:
			counts["pause the worker"]++
			f.Pause(w)
			time.Sleep(d)
			f.Resume(w)
		case 4:
			counts["the worker vanishes"]++
			f.Kill(w)
			long = true
		}
		if long { // given up on (or gone): a new worker node takes its place
			w.Close()
			workers[i] = start()
		}
	}
	close(stop)
	n := <-sent
	if err := p.Wait(ctx); err != nil {
		t.Fatalf("Wait: %v (stats %+v)", err, p.Stats())
	}
	if m := tl.missing(n); len(m) > 0 {
		t.Fatalf("%d of %d jobs were not processed: %v", len(m), n, m[:min(10, len(m))])
	}
	twice := 0
	tl.mu.Lock()
	for _, who := range tl.runs {
		if len(who) > 1 {
			twice++
		}
	}
	tl.mu.Unlock()
	t.Logf("faults: %v; %d jobs, all processed, %d more than once; stats %+v", counts, n, twice, p.Stats())
}

// checkConfirmedOnce checks a producer's STATS line ("sent recovered
// confirmed redelivered"): each job it took was confirmed once.
func checkConfirmedOnce(t *testing.T, stats string) {
	t.Helper()
	var sent, recovered, confirmed, redelivered int
	if _, err := fmt.Sscan(stats, &sent, &recovered, &confirmed, &redelivered); err != nil {
		t.Fatalf("stats %q: %v", stats, err)
	}
	if confirmed != sent+recovered {
		t.Fatalf("the last producer took %d jobs (%d sent, %d recovered) and confirmed %d", sent+recovered, sent, recovered, confirmed)
	}
}

// checkJournalEmpty opens the journal in dir on a node of its own: no job
// is left in it.
func checkJournalEmpty(t *testing.T, dir string) {
	t.Helper()
	n := startQuiet(t, troupe.Config{Name: "check", Listen: []string{"tcp://127.0.0.1:0"}, ServeRegistry: true,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	p := mustProduce(t, n, tasksKey, troupe.WorkConfig{Journal: dir})
	if r := p.Stats().Recovered; r != 0 {
		t.Fatalf("the journal holds %d jobs after all were confirmed", r)
	}
}

// mustProduce starts a producer on n for key, closed when the test ends.
func mustProduce[T any](t *testing.T, n *troupe.Node, key troupe.ServiceKey[T], cfg troupe.WorkConfig) *troupe.Producer[T] {
	t.Helper()
	p, err := troupe.Produce(n, key, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// waitWorkers waits until p knows n workers.
func waitWorkers[T any](t *testing.T, p *troupe.Producer[T], n int) {
	t.Helper()
	waitUntil(t, 10*time.Second, fmt.Sprintf("the producer sees %d workers", n), func() bool { return p.Stats().Workers == n })
}

// sendTasks sends the tasks numbered from to to, in order.
func sendTasks(t *testing.T, ctx context.Context, p *troupe.Producer[task], from, to int) {
	t.Helper()
	for i := from; i <= to; i++ {
		if err := p.Send(ctx, task{N: i}); err != nil {
			t.Fatal(err)
		}
	}
}

// peerUp reports whether n has a session up with the node named name.
func peerUp(n *troupe.Node, name string) bool {
	for _, p := range n.Stats().Peers {
		if p.Name == name && p.State == "up" {
			return true
		}
	}
	return false
}

// Jobs sent while the link to their worker is down (the connection
// reset, the network cut) are handed out once it is back; one that cannot
// be encoded is a dead letter of its own, the rest are done, and Wait
// returns. The default Config: the link is down for far less than
// UnreachableAfter.
func TestWorkJobThatCannotEncodeAcrossALinkFlap(t *testing.T) {
	t.Parallel()
	f := new(troupe.FaultNet)
	prod, ws := workNodesWith(t, f, func(string) troupe.Config { return troupe.Config{} }, "w1")
	w1 := ws[0]
	key := troupe.ServiceKey[pjob]{Name: "pjobs-refused"}
	var mu sync.Mutex
	done := map[int]bool{}
	if _, err := troupe.Worker(w1, "worker", key, troupe.Behavior[troupe.Delivery[pjob]]{
		Receive: func(_ *troupe.Context[troupe.Delivery[pjob]], d troupe.Delivery[pjob]) {
			mu.Lock()
			done[d.Job.N] = true
			mu.Unlock()
			d.Confirm()
		}}, troupe.WorkConfig{}); err != nil {
		t.Fatal(err)
	}
	dead := make(chan troupe.DeadLetter, 100)
	sub := troupe.SubscribeChan(prod, dead)
	defer sub.Unsubscribe()
	p := mustProduce(t, prod, key, troupe.WorkConfig{})
	ctx := ctxFor(t)
	if err := p.Send(ctx, pjob{N: 1}); err != nil {
		t.Fatal(err)
	}
	if err := p.Wait(ctx); err != nil {
		t.Fatalf("Wait for the first job: %v (stats %+v)", err, p.Stats())
	}
	// The link goes down: the connection is reset and the network cut at
	// once, so that the redial's handshake is held (again, if the cut
	// came too late to hold either end's view of the reset).
	for attempt := 1; ; attempt++ {
		if f.Reset(prod, w1) == 0 {
			t.Fatal("no connection to reset")
		}
		f.Partition(prod, w1)
		deadline := time.Now().Add(3 * time.Second)
		for peerUp(prod, "w1") && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if !peerUp(prod, "w1") {
			break
		}
		if attempt == 5 {
			t.Fatal("the link to w1 stays up through a reset and a cut")
		}
		f.Heal()
	}
	for _, n := range []int{2, 3} {
		if err := p.Send(ctx, pjob{N: n}); err != nil {
			t.Fatal(err)
		}
	}
	f.Heal()
	if err := p.Wait(ctx); err != nil {
		t.Fatalf("Wait: %v (stats %+v)", err, p.Stats())
	}
	mu.Lock()
	if !done[1] || !done[3] || done[2] {
		t.Errorf("done: %v, want 1 and 3", done)
	}
	mu.Unlock()
	for {
		select {
		case d := <-dead:
			if j, ok := d.Message.(pjob); ok && j.N == 2 {
				return
			}
		case <-ctx.Done():
			t.Fatal("the job that cannot be encoded made no dead letter")
		}
	}
}

// A consumer that is a sharded entity starts its Worker from its Setup:
// jobs reach it once its first message has started it, and when its
// member leaves, the jobs it held unconfirmed go to the worker the
// entity starts on its next member (with its next message).
func TestWorkConsumerMovesWithItsEntity(t *testing.T) {
	t.Parallel()
	f := new(troupe.FaultNet)
	tl := newWorkTally()
	key := troupe.ServiceKey[task]{Name: "entity-jobs"}
	names := []string{"a", "b", "c"}
	var nodes []*troupe.Node
	var members []*troupe.Cluster
	for _, name := range names {
		n, c := joinRegistryless(t, f, name, nodes, troupe.ClusterConfig{Downing: troupe.KeepMajority(), StableAfter: singletonStable})
		nodes, members = append(nodes, n), append(members, c)
		waitAllUp(t, members, len(members))
	}
	var once sync.Once
	half := make(chan struct{})
	var moved atomic.Bool
	var inHand sync.Map // jobs a worker held unconfirmed before the move
	hosts := make(chan string, 10)
	var kinds []*troupe.Sharded[tick]
	for i, c := range members {
		name := names[i]
		sh, err := troupe.Sharding(c, "consumers", func(id string) troupe.Behavior[tick] {
			return troupe.Behavior[tick]{
				Setup: func(ctx *troupe.Context[tick]) {
					hosts <- name
					_, err := troupe.Worker(ctx, "worker", key, troupe.Behavior[troupe.Delivery[task]]{
						Receive: func(_ *troupe.Context[troupe.Delivery[task]], d troupe.Delivery[task]) {
							tl.add(d.Job.N, name, d.Redelivered)
							if d.Job.N > 100 && !moved.Load() {
								inHand.Store(d.Job.N, true)
								once.Do(func() { close(half) })
								return // in hand
							}
							d.Confirm()
						}}, troupe.WorkConfig{Room: 5})
					if err != nil {
						ctx.Fail(err)
					}
				},
				Receive: func(*troupe.Context[tick], tick) {},
			}
		}, troupe.ShardingConfig{})
		if err != nil {
			t.Fatal(err)
		}
		kinds = append(kinds, sh)
	}
	// Members joining and leaving, an entity moving, under -race on a
	// loaded machine: a bound for the whole, not a timing assertion.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	kinds[0].Entity("e1").Tell(tick{N: 1}) // starts it
	var first string
	select {
	case first = <-hosts:
	case <-ctx.Done():
		t.Fatal("the entity did not start")
	}
	// The producer runs on another member than the entity's.
	pi := slices.IndexFunc(names, func(s string) bool { return s != first })
	p := mustProduce(t, nodes[pi], key, troupe.WorkConfig{})
	waitUntil(t, 30*time.Second, "the producer sees the entity's worker", func() bool { return p.Stats().Workers == 1 })
	const jobs = 400
	sent := make(chan error, 1)
	go func() {
		for i := 1; i <= jobs; i++ {
			if err := p.Send(ctx, task{N: i}); err != nil {
				sent <- err
				return
			}
		}
		sent <- nil
	}()
	select {
	case <-half:
	case <-ctx.Done():
		t.Fatalf("the entity's worker got no job past the hundredth (stats %+v)", p.Stats())
	}
	moved.Store(true)
	fi := slices.Index(names, first)
	if err := members[fi].Close(); err != nil { // the entity's member leaves: its shard moves
		t.Fatal(err)
	}
	kinds[pi].Entity("e1").Tell(tick{N: 2}) // starts it on its next member
	var second string
	select {
	case second = <-hosts:
	case <-ctx.Done():
		t.Fatal("the entity did not start again")
	}
	if second == first {
		t.Fatalf("the entity started again on %s, which left", second)
	}
	if err := <-sent; err != nil {
		t.Fatal(err)
	}
	if err := p.Wait(ctx); err != nil {
		t.Fatalf("Wait: %v (stats %+v)", err, p.Stats())
	}
	if m := tl.missing(jobs); len(m) > 0 {
		t.Fatalf("unprocessed: %v", m)
	}
	tl.mu.Lock()
	defer tl.mu.Unlock()
	held := 0
	inHand.Range(func(k, _ any) bool {
		held++
		if who := tl.runs[k.(int)]; who[len(who)-1] != second {
			t.Errorf("job %d, held unconfirmed on %s when it left, was last done on %v, not %s", k, first, who, second)
		}
		return true
	})
	if held == 0 {
		t.Fatal("no job was in hand when the entity's member left")
	}
}

// The jobs a worker cut off held (written and unacknowledged, or not yet
// written) go to the other worker in their order when its session ends:
// the slow other worker sees its own jobs in order, then the cut-off
// one's and the rest in order, with one step back between.
func TestWorkOfACutOffWorkerGoesToTheOtherInOrder(t *testing.T) {
	t.Parallel()
	f := new(troupe.FaultNet)
	prod, ws := workNodes(t, f, "w1", "w2")
	tl := newWorkTally()
	if _, err := troupe.Worker(ws[0], "worker", tasksKey, counting(tl, "w1"), troupe.WorkConfig{Room: 20}); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var seen []int
	if _, err := troupe.Worker(ws[1], "worker", tasksKey, troupe.Behavior[troupe.Delivery[task]]{Receive: func(_ *troupe.Context[troupe.Delivery[task]], d troupe.Delivery[task]) {
		tl.add(d.Job.N, "w2", d.Redelivered)
		mu.Lock()
		seen = append(seen, d.Job.N)
		mu.Unlock()
		time.Sleep(2 * time.Millisecond) // slow: the cut-off worker gets most
		d.Confirm()
	}}, troupe.WorkConfig{Room: 2}); err != nil {
		t.Fatal(err)
	}
	p := mustProduce(t, prod, tasksKey, troupe.WorkConfig{})
	waitWorkers(t, p, 2)
	ctx := ctxFor(t)
	// Jobs one by one until each worker has done one (the producer knows
	// both workers' room).
	warm := 0
	for on := map[string]bool{}; len(on) < 2; {
		warm++
		if warm > 100 {
			t.Fatal("a worker gets no job")
		}
		sendTasks(t, ctx, p, warm, warm)
		if err := p.Wait(ctx); err != nil {
			t.Fatal(err)
		}
		tl.mu.Lock()
		on[tl.runs[warm][0]] = true
		tl.mu.Unlock()
	}
	mu.Lock()
	seen = nil
	mu.Unlock()
	f.Partition(prod, ws[0])
	const jobs = 30
	sendTasks(t, ctx, p, warm+1, warm+jobs)
	if err := p.Wait(ctx); err != nil {
		t.Fatalf("Wait: %v (stats %+v)", err, p.Stats())
	}
	if m := tl.missing(warm + jobs); len(m) > 0 {
		t.Fatalf("unprocessed: %v", m)
	}
	mu.Lock()
	defer mu.Unlock()
	back := 0
	for i := 1; i < len(seen); i++ {
		if seen[i] < seen[i-1] {
			back++
		}
	}
	if back > 1 || len(seen) < jobs {
		t.Fatalf("the other worker got %v: want every job, in order but for one step back", seen)
	}
}

// A worker's jobs are bounded by its room, not by the worker node's
// Config.MailboxBytes: a job larger than it (the default's 64 MiB, or a
// smaller setting) still reaches the worker, where an ordinary actor's
// message would be refused.
func TestWorkJobsPastMailboxBytesReachTheWorker(t *testing.T) {
	t.Parallel()
	f := new(troupe.FaultNet)
	prod, ws := workNodesWith(t, f, func(name string) troupe.Config {
		if name == "w1" {
			return troupe.Config{MailboxBytes: 64 << 10}
		}
		return troupe.Config{}
	}, "w1")
	w1 := ws[0]
	tl := newWorkTally()
	if _, err := troupe.Worker(w1, "worker", tasksKey, counting(tl, "w1"), troupe.WorkConfig{Room: 4}); err != nil {
		t.Fatal(err)
	}
	p := mustProduce(t, prod, tasksKey, troupe.WorkConfig{})
	waitWorkers(t, p, 1)
	ctx := ctxFor(t)
	body := make([]byte, 100<<10)
	const jobs = 20
	for i := 1; i <= jobs; i++ {
		if err := p.Send(ctx, task{N: i, Body: body}); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Wait(ctx); err != nil {
		t.Fatalf("Wait: %v (stats %+v, the worker node's dead letters %v)", err, p.Stats(), w1.Stats().DeadLetters)
	}
	if m := tl.missing(jobs); len(m) > 0 {
		t.Fatalf("unprocessed: %v", m)
	}
}

// A producer closed while workers come and go makes no dead letter: the
// workers' listing it follows is troupe's own, and one on its way when
// the producer stops is no loss (docs/work.md's example once saw one).
func TestWorkProducerClosedAmidWorkerChangesMakesNoDeadLetter(t *testing.T) {
	t.Parallel()
	f := new(troupe.FaultNet)
	prod, _ := workNodes(t, f)
	var mu sync.Mutex
	var dead []string
	sub := troupe.Subscribe(prod, func(d troupe.DeadLetter) {
		mu.Lock()
		defer mu.Unlock()
		dead = append(dead, fmt.Sprintf("%T to %s: %v", d.Message, d.Target, d.Reason))
	})
	defer sub.Unsubscribe()
	ctx := ctxFor(t)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			w, err := troupe.Worker(prod, fmt.Sprint("churn-", i), tasksKey, counting(newWorkTally(), "c"), troupe.WorkConfig{})
			if err != nil {
				t.Error(err)
				return
			}
			prod.Stop(w)
		}
	})
	for range 100 {
		p, err := troupe.Produce(prod, tasksKey, troupe.WorkConfig{})
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Send(ctx, task{N: 1}); err != nil {
			t.Fatal(err)
		}
		p.Close()
	}
	close(stop)
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	var own []string
	for _, d := range dead {
		if !strings.HasPrefix(d, "troupe_test.task ") { // (the one job of each, unconfirmed at Close)
			own = append(own, d)
		}
	}
	if len(own) > 0 {
		t.Fatalf("closing producers made %d dead letters of troupe's own: %v", len(own), own[:min(5, len(own))])
	}
}
