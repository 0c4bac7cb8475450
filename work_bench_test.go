//go:build unix

package troupe_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"troupe"
)

// The work-pulling benchmarks (#57): jobs per second to workers in other
// processes against plain Send on the same path, the confirmation's cost
// in one process, the time from a worker's kill -9 to its jobs done
// elsewhere, and the journal's throughput. The default Config, but for a
// quiet logger and the registry; jobs of 256 bytes.

// benchProbe asks a helper process how many jobs and tasks it has taken.
type benchProbe struct{ ReplyTo troupe.Ref[int] }

func init() { troupe.SetWireKey[benchProbe]("troupe.test.work.probe") }

func benchWorkConfig(name, reg string) troupe.Config {
	return troupe.Config{Name: name, RegistryAddrs: []string{reg}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
}

// TestHelperWorkBenchProcess is not a test: the work benchmarks run it in
// child processes. It starts a node using the registry
// $TROUPE_HELPER_WORKBENCH with $TROUPE_HELPER_WORKERS workers of
// $TROUPE_HELPER_KEY (each confirming at once, or never, with
// TROUPE_HELPER_STALL set), a "sink" taking tasks and a "probe" that
// answers with how many jobs and tasks were taken; it says READY and
// serves until its stdin closes.
func TestHelperWorkBenchProcess(t *testing.T) {
	t.Parallel()
	reg := os.Getenv("TROUPE_HELPER_WORKBENCH")
	if reg == "" {
		t.Skip("helper for the work benchmarks")
	}
	n, err := troupe.Start(context.Background(), benchWorkConfig("bench-"+strconv.Itoa(os.Getpid()), reg))
	if err != nil {
		fmt.Println("ERR", err)
		return
	}
	defer n.Close()
	var taken atomic.Int64
	stall := os.Getenv("TROUPE_HELPER_STALL") != ""
	workers, _ := strconv.Atoi(os.Getenv("TROUPE_HELPER_WORKERS"))
	key := troupe.ServiceKey[task]{Name: os.Getenv("TROUPE_HELPER_KEY")}
	room := 0 // the default
	if stall {
		room = 5
	}
	for i := range workers {
		if _, err := troupe.Worker(n, fmt.Sprint("worker-", i), key, troupe.Behavior[troupe.Delivery[task]]{
			Receive: func(_ *troupe.Context[troupe.Delivery[task]], d troupe.Delivery[task]) {
				taken.Add(1)
				if !stall {
					d.Confirm()
				}
			}}, troupe.WorkConfig{Room: room}); err != nil {
			fmt.Println("ERR", err)
			return
		}
	}
	if _, err := troupe.Spawn(n, "sink", troupe.Behavior[task]{Receive: func(*troupe.Context[task], task) { taken.Add(1) }}); err != nil {
		fmt.Println("ERR", err)
		return
	}
	if _, err := troupe.Spawn(n, "probe", troupe.Behavior[benchProbe]{Receive: func(_ *troupe.Context[benchProbe], p benchProbe) {
		p.ReplyTo.Tell(int(taken.Load()))
	}}); err != nil {
		fmt.Println("ERR", err)
		return
	}
	fmt.Println("READY", n.Addrs()[0].String())
	bufio.NewReader(os.Stdin).ReadString('\n')
}

// benchHelper is a helper process of the work benchmarks.
type benchHelper struct {
	cmd  *exec.Cmd
	addr string
}

func startBenchHelper(b *testing.B, reg, key string, workers int, stall bool) benchHelper {
	b.Helper()
	exe, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^TestHelperWorkBenchProcess$")
	cmd.Env = append(os.Environ(), "TROUPE_HELPER_WORKBENCH="+reg, "TROUPE_HELPER_KEY="+key, fmt.Sprint("TROUPE_HELPER_WORKERS=", workers))
	if stall {
		cmd.Env = append(cmd.Env, "TROUPE_HELPER_STALL=1")
	}
	cmd.Stderr = os.Stderr
	stdin, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { stdin.Close(); cmd.Process.Kill(); cmd.Wait() })
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if addr, ok := strings.CutPrefix(sc.Text(), "READY "); ok {
			go io.Copy(io.Discard, out)
			return benchHelper{cmd: cmd, addr: addr}
		}
		if strings.HasPrefix(sc.Text(), "ERR") {
			b.Fatal(sc.Text())
		}
	}
	b.Fatal("a helper ended before it was ready")
	return benchHelper{}
}

// benchRegistrar starts the benchmark's node, the registrar.
func benchRegistrar(b *testing.B) (*troupe.Node, string) {
	b.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	reg := l.Addr().String()
	l.Close()
	n, err := troupe.Start(context.Background(), benchWorkConfig("producer", reg))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { n.Close() })
	return n, reg
}

func benchCtx(b *testing.B) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	b.Cleanup(cancel)
	return ctx
}

// BenchmarkWorkPullingProcess: b.N jobs through a producer to 1, 4 or 16
// workers in two other processes (one for one worker), each job confirmed
// at once, until every job is confirmed; and, as the baseline, b.N tasks
// of the same size sent with Ref.Send to one actor in another process,
// until it has taken them all.
func BenchmarkWorkPullingProcess(b *testing.B) {
	body := make([]byte, 256)
	for _, workers := range []int{1, 4, 16} {
		n, reg := benchRegistrar(b)
		key := fmt.Sprint("bench-", workers)
		procs := min(workers, 2)
		for range procs {
			startBenchHelper(b, reg, key, workers/procs, false)
		}
		p, err := troupe.Produce(n, troupe.ServiceKey[task]{Name: key}, troupe.WorkConfig{})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { p.Close() })
		ctx := benchCtx(b)
		for p.Stats().Workers < workers {
			time.Sleep(10 * time.Millisecond) // (the listing is pushed; set-up only)
		}
		b.Run(fmt.Sprintf("workers=%d", workers), func(b *testing.B) {
			b.ReportAllocs()
			for i := range b.N {
				body[0] = byte(i)
				if err := p.Send(ctx, task{N: i, Body: body}); err != nil {
					b.Fatal(err)
				}
			}
			if err := p.Wait(ctx); err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "jobs/s")
		})
	}
	n, reg := benchRegistrar(b)
	h := startBenchHelper(b, reg, "bench-tell", 0, false)
	ctx := benchCtx(b)
	sink, err := troupe.Resolve[task](ctx, n, troupe.FormatRef(mustAddr(h.addr), "/user/sink"))
	if err != nil {
		b.Fatal(err)
	}
	probe, err := troupe.Resolve[benchProbe](ctx, n, troupe.FormatRef(mustAddr(h.addr), "/user/probe"))
	if err != nil {
		b.Fatal(err)
	}
	taken := func() int {
		v, err := troupe.Ask(ctx, probe, func(r troupe.Ref[int]) benchProbe { return benchProbe{ReplyTo: r} })
		if err != nil {
			b.Fatal(err)
		}
		return v
	}
	b.Run("send", func(b *testing.B) {
		b.ReportAllocs()
		start := taken()
		for i := range b.N {
			body[0] = byte(i)
			if err := sink.Send(ctx, task{N: i, Body: body}); err != nil {
				b.Fatal(err)
			}
		}
		for taken()-start < b.N {
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "jobs/s")
	})
}

// BenchmarkWorkPullingLocal: the confirmation's cost in one process, a
// producer and one worker on one node (each job sent, handed, confirmed),
// against Ref.Send of the same task to a local actor.
func BenchmarkWorkPullingLocal(b *testing.B) {
	body := make([]byte, 256)
	b.Run("work", func(b *testing.B) {
		n, _ := benchRegistrar(b)
		key := troupe.ServiceKey[task]{Name: "local"}
		if _, err := troupe.Worker(n, "worker", key, troupe.Behavior[troupe.Delivery[task]]{
			Receive: func(_ *troupe.Context[troupe.Delivery[task]], d troupe.Delivery[task]) { d.Confirm() }}, troupe.WorkConfig{}); err != nil {
			b.Fatal(err)
		}
		p, err := troupe.Produce(n, key, troupe.WorkConfig{})
		if err != nil {
			b.Fatal(err)
		}
		defer p.Close()
		ctx := benchCtx(b)
		for p.Stats().Workers < 1 {
			time.Sleep(10 * time.Millisecond)
		}
		b.ReportAllocs()
		b.ResetTimer()
		for i := range b.N {
			if err := p.Send(ctx, task{N: i, Body: body}); err != nil {
				b.Fatal(err)
			}
		}
		if err := p.Wait(ctx); err != nil {
			b.Fatal(err)
		}
	})
	b.Run("send", func(b *testing.B) {
		n, _ := benchRegistrar(b)
		done := make(chan struct{})
		seen := 0
		total := b.N
		sink, err := troupe.Spawn(n, "sink", troupe.Behavior[task]{Receive: func(*troupe.Context[task], task) {
			if seen++; seen == total {
				close(done)
			}
		}})
		if err != nil {
			b.Fatal(err)
		}
		ctx := benchCtx(b)
		b.ReportAllocs()
		b.ResetTimer()
		for i := range b.N {
			if err := sink.Send(ctx, task{N: i, Body: body}); err != nil {
				b.Fatal(err)
			}
		}
		<-done
	})
}

// BenchmarkWorkHandOverAfterKill: a worker in another process holds five
// jobs unconfirmed and is killed (kill -9); each op is the time from the
// kill until a worker of the producer's node has done all five.
func BenchmarkWorkHandOverAfterKill(b *testing.B) {
	for i := range b.N {
		b.StopTimer()
		n, reg := benchRegistrar(b)
		key := troupe.ServiceKey[task]{Name: fmt.Sprint("handover-", i)}
		h := startBenchHelper(b, reg, key.Name, 1, true)
		p, err := troupe.Produce(n, key, troupe.WorkConfig{})
		if err != nil {
			b.Fatal(err)
		}
		ctx := benchCtx(b)
		for p.Stats().Workers < 1 {
			time.Sleep(10 * time.Millisecond)
		}
		for j := range 5 {
			if err := p.Send(ctx, task{N: j}); err != nil {
				b.Fatal(err)
			}
		}
		probe, err := troupe.Resolve[benchProbe](ctx, n, troupe.FormatRef(mustAddr(h.addr), "/user/probe"))
		if err != nil {
			b.Fatal(err)
		}
		for {
			v, err := troupe.Ask(ctx, probe, func(r troupe.Ref[int]) benchProbe { return benchProbe{ReplyTo: r} })
			if err != nil {
				b.Fatal(err)
			}
			if v == 5 {
				break
			}
		}
		// The local worker joins now, so that the five are the killed one's.
		if _, err := troupe.Worker(n, "worker", key, troupe.Behavior[troupe.Delivery[task]]{
			Receive: func(_ *troupe.Context[troupe.Delivery[task]], d troupe.Delivery[task]) { d.Confirm() }}, troupe.WorkConfig{}); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		h.cmd.Process.Signal(syscall.SIGKILL)
		if err := p.Wait(ctx); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		p.Close()
		n.Close()
	}
}

// BenchmarkWorkJournal: Send's throughput with a journal, each job
// synced (the default: concurrent Sends share an fsync) or not (NoSync),
// from 1 or 8 goroutines, to a worker on the same node that confirms at
// once; 1 KiB jobs.
func BenchmarkWorkJournal(b *testing.B) {
	body := make([]byte, 1024)
	for _, sync := range []bool{true, false} {
		for _, senders := range []int{1, 8} {
			name := fmt.Sprintf("sync=%v/senders=%d", sync, senders)
			b.Run(name, func(b *testing.B) {
				n, _ := benchRegistrar(b)
				key := troupe.ServiceKey[task]{Name: "journal"}
				if _, err := troupe.Worker(n, "worker", key, troupe.Behavior[troupe.Delivery[task]]{
					Receive: func(_ *troupe.Context[troupe.Delivery[task]], d troupe.Delivery[task]) { d.Confirm() }}, troupe.WorkConfig{Room: 100}); err != nil {
					b.Fatal(err)
				}
				p, err := troupe.Produce(n, key, troupe.WorkConfig{Journal: b.TempDir(), NoSync: !sync})
				if err != nil {
					b.Fatal(err)
				}
				defer p.Close()
				ctx := benchCtx(b)
				var next atomic.Int64
				b.ResetTimer()
				done := make(chan error, senders)
				for range senders {
					go func() {
						for {
							i := next.Add(1)
							if i > int64(b.N) {
								done <- nil
								return
							}
							if err := p.Send(ctx, task{N: int(i), Body: body}); err != nil {
								done <- err
								return
							}
						}
					}()
				}
				for range senders {
					if err := <-done; err != nil {
						b.Fatal(err)
					}
				}
				if err := p.Wait(ctx); err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "jobs/s")
			})
		}
	}
}
