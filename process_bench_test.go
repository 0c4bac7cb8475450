package troupe

import (
	"bufio"
	"context"
	"encoding/binary"
	"io"
	"math"
	"net"
	"os"
	"os/exec"
	"runtime"
	"runtime/pprof"
	"runtime/trace"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// sinkMsg is the protocol of the counting sink in the child process.
type sinkMsg interface{ isSink() }

// sinkQuery asks the sink for a count: of the messages it took, or (What)
// of those the counter took, or of the child's heap allocations so far.
type sinkQuery struct {
	ReplyTo Ref[count]
	What    int
}

// What a sinkQuery asks.
const (
	querySink    = iota // messages the sink took
	queryCounter        // messages the counter took
	queryMallocs        // the child's heap allocations
)

func (count) isSink()     {}
func (sinkQuery) isSink() {}

func init() { SetWireKey[sinkQuery]("troupe.test.sink-query") }

// TestHelperSinkProcess is not a test: the process benchmarks run it in a
// child process. It serves, over loopback TCP or (TROUPE_HELPER_NET=unix)
// Unix sockets, a node with a counting sink (protocol sinkMsg, an
// interface), a counter (protocol count, the message type itself) and an
// echo actor, and the raw floors: a stream sink and a request-reply echo
// of length-prefixed 8-byte integers (see floorFrame). It prints the
// three addresses and serves until its stdin closes.
func TestHelperSinkProcess(t *testing.T) {
	// Not beside other tests: it is the body of a child process that a
	// benchmark starts, and returns at once anywhere else.
	if os.Getenv("TROUPE_HELPER_SINK") == "" {
		t.Skip("helper for BenchmarkRemoteTellProcess")
	}
	if path := os.Getenv("TROUPE_HELPER_CPUPROFILE"); path != "" {
		// The receiver's profile, for looking into the process benchmarks.
		f, err := os.Create(path)
		if err != nil {
			t.Fatal(err)
		}
		pprof.StartCPUProfile(f)
		defer pprof.StopCPUProfile()
	}
	if path := os.Getenv("TROUPE_HELPER_TRACE"); path != "" {
		// The receiver's execution trace (go tool trace), for the round
		// trip's hops.
		f, err := os.Create(path)
		if err != nil {
			t.Fatal(err)
		}
		trace.Start(f)
		defer trace.Stop()
	}
	network, listen := "tcp", "tcp://127.0.0.1:0"
	floorAt := func(string) string { return "127.0.0.1:0" }
	if os.Getenv("TROUPE_HELPER_NET") == "unix" {
		dir, err := os.MkdirTemp("", "troupe-bench")
		if err != nil {
			t.Fatal(err)
		}
		defer os.RemoveAll(dir)
		network, listen = "unix", "unix://"+dir+"/node.sock"
		floorAt = func(name string) string { return dir + "/" + name + ".sock" }
	}
	n, err := Start(context.Background(), benchConfig(listen))
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	var counted atomic.Int64
	Spawn(n, "counter", Behavior[count]{Receive: func(*Context[count], count) { counted.Add(1) }})
	seen := 0
	Spawn(n, "sink", Behavior[sinkMsg]{Receive: func(_ *Context[sinkMsg], m sinkMsg) {
		switch m := m.(type) {
		case count:
			seen++
		case sinkQuery:
			switch m.What {
			case querySink:
				m.ReplyTo.Tell(count{N: seen})
			case queryCounter:
				m.ReplyTo.Tell(count{N: int(counted.Load())})
			case queryMallocs:
				var ms runtime.MemStats
				runtime.ReadMemStats(&ms)
				m.ReplyTo.Tell(count{N: int(ms.Mallocs)})
			}
		}
	}})
	spawnEcho(t, n, "echo")
	stream, rr := serveFloor(t, network, floorAt("stream"), floorCount), serveFloor(t, network, floorAt("rr"), floorEcho)
	os.Stdout.WriteString("ADDR " + n.Addrs()[0].String() + " " + stream + " " + rr + "\n")
	bufio.NewReader(os.Stdin).ReadString('\n')
}

// The raw floors' frame: a uvarint length (8) and an 8-byte big-endian
// integer, written through a bufio.Writer and read through a bufio.Reader
// that decodes every integer — the least a framed stream of integers costs.
const floorFrame = 9

// floorEnd is the integer that ends a counted stream: the sink answers
// with how many integers it decoded before it.
const floorEnd = math.MaxUint64

type floorMode int

const (
	floorCount floorMode = iota // decode and count; answer the count at floorEnd
	floorEcho                   // answer every frame with itself
)

// serveFloor serves one raw floor at addr and returns its address.
func serveFloor(t *testing.T, network, addr string, mode floorMode) string {
	l, err := net.Listen(network, addr)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r, w := bufio.NewReaderSize(c, 64<<10), bufio.NewWriterSize(c, 64<<10)
				var n uint64
				for {
					size, err := binary.ReadUvarint(r)
					if err != nil || size != 8 {
						return
					}
					var b [8]byte
					if _, err := io.ReadFull(r, b[:]); err != nil {
						return
					}
					v := binary.BigEndian.Uint64(b[:])
					switch {
					case mode == floorEcho:
						w.Write([]byte{8})
						w.Write(b[:])
						w.Flush()
					case v == floorEnd:
						w.Write(binary.BigEndian.AppendUint64(nil, n))
						w.Flush()
						n = 0
					default:
						n++
					}
				}
			}()
		}
	}()
	return l.Addr().String()
}

// writeFloor writes one floor frame carrying v.
func writeFloor(w *bufio.Writer, v uint64) {
	buf := append(w.AvailableBuffer(), 8)
	w.Write(binary.BigEndian.AppendUint64(buf, v))
}

// sinkChild is what startChildNode started.
type sinkChild struct {
	network       string // "tcp" or "unix"
	sink          Ref[sinkMsg]
	counter       Ref[count]
	echo          Ref[testPing]
	stream, reply string // the raw floors' addresses
}

// startChildNode runs the helper in a child process, serving over network
// ("tcp" or "unix").
func startChildNode(b *testing.B, n *Node, network string) sinkChild {
	exe, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^TestHelperSinkProcess$")
	cmd.Env = append(os.Environ(), "TROUPE_HELPER_SINK=1", "TROUPE_HELPER_NET="+network)
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { stdin.Close(); cmd.Wait() })
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "ADDR ") {
		b.Fatalf("child said %q, %v", line, err)
	}
	fields := strings.Fields(strings.TrimPrefix(line, "ADDR "))
	if len(fields) != 3 {
		b.Fatalf("child said %q", line)
	}
	addr, err := ParseAddr(fields[0])
	if err != nil {
		b.Fatal(err)
	}
	c := sinkChild{network: network, stream: fields[1], reply: fields[2]}
	if c.sink, err = Resolve[sinkMsg](ctxT(b, 10*time.Second), n, FormatRef(addr, "/user/sink")); err != nil {
		b.Fatal(err)
	}
	if c.counter, err = Resolve[count](ctxT(b, 10*time.Second), n, FormatRef(addr, "/user/counter")); err != nil {
		b.Fatal(err)
	}
	if c.echo, err = Resolve[testPing](ctxT(b, 10*time.Second), n, FormatRef(addr, "/user/echo")); err != nil {
		b.Fatal(err)
	}
	return c
}

// query asks the child's sink a sinkQuery.
func (c sinkChild) query(b *testing.B, what int) int {
	got, err := Ask(ctxT(b, 30*time.Second), c.sink, func(r Ref[count]) sinkMsg { return sinkQuery{ReplyTo: r, What: what} })
	if err != nil {
		b.Fatal(err)
	}
	return got.N
}

// overNetworks runs bench as a sub-benchmark over loopback TCP and over
// Unix sockets.
func overNetworks(b *testing.B, bench func(b *testing.B, network string)) {
	for _, network := range []string{"tcp", "unix"} {
		b.Run(network, func(b *testing.B) { bench(b, network) })
	}
}

// BenchmarkRemoteTellProcess measures Tell throughput to an actor in
// another OS process: b.N tells of count{N: i} (values that grow like real
// data: varints of 1 to 4 bytes) to the counter, whose protocol is count
// itself, then queries until it has taken all. It reports the
// allocations per message on both sides: the sender's (B/op, allocs/op)
// and the receiver's (recv-allocs/msg, its heap allocations over the run
// divided by b.N). Deviation from the default Config: no mailbox or
// send-queue limit (benchConfig), so that a burst of b.N is not cut short.
func BenchmarkRemoteTellProcess(b *testing.B) {
	overNetworks(b, func(b *testing.B, network string) {
		n := startNode(b, benchConfig())
		child := startChildNode(b, n, network)
		measureTells(b, n, child, queryCounter, func() {
			for i := range b.N {
				child.counter.Tell(count{N: i})
			}
		})
	})
}

// BenchmarkRemoteTellProcessProtocol is BenchmarkRemoteTellProcess to an
// actor whose protocol is an interface (sinkMsg) that count implements:
// the sender's conversion to the interface, and the receiver's value,
// each take an allocation.
func BenchmarkRemoteTellProcessProtocol(b *testing.B) {
	overNetworks(b, func(b *testing.B, network string) {
		n := startNode(b, benchConfig())
		child := startChildNode(b, n, network)
		measureTells(b, n, child, querySink, func() {
			for i := range b.N {
				child.sink.Tell(count{N: i})
			}
		})
	})
}

// measureTells times tells, which sends b.N messages, until the child's
// count (what) has grown by b.N, and reports the receiver's allocations
// and the bytes on the wire per message.
func measureTells(b *testing.B, n *Node, child sinkChild, what int, tells func()) {
	start := child.query(b, what)
	mallocs := child.query(b, queryMallocs)
	before := n.peers.bytesWritten()
	b.ReportAllocs()
	b.ResetTimer()
	tells()
	for child.query(b, what)-start < b.N {
		// (the counter and the sink are different actors: no order
		// between them, so ask until all have been taken)
	}
	b.StopTimer()
	b.ReportMetric(float64(child.query(b, queryMallocs)-mallocs)/float64(b.N), "recv-allocs/msg")
	b.ReportMetric(float64(n.peers.bytesWritten()-before)/float64(b.N), "wire-B/msg")
}

// BenchmarkFloorStreamProcess is the raw floor of
// BenchmarkRemoteTellProcess: b.N integers i, length-prefixed (9 bytes a
// frame), through a bufio.Writer to another OS process that decodes and
// counts them, then waits for its count.
func BenchmarkFloorStreamProcess(b *testing.B) {
	overNetworks(b, func(b *testing.B, network string) {
		n := startNode(b, benchConfig())
		child := startChildNode(b, n, network)
		c, err := net.Dial(network, child.stream)
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		w := bufio.NewWriterSize(c, 64<<10)
		b.ResetTimer()
		for i := range b.N {
			writeFloor(w, uint64(i))
		}
		writeFloor(w, floorEnd)
		w.Flush()
		var got [8]byte
		if _, err := io.ReadFull(c, got[:]); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		if v := binary.BigEndian.Uint64(got[:]); v != uint64(b.N) {
			b.Fatalf("the floor's sink counted %d of %d", v, b.N)
		}
		b.ReportMetric(floorFrame, "wire-B/msg")
	})
}

// latencies reports the median and the 99th percentile of took.
func latencies(b *testing.B, took []time.Duration) {
	slices.Sort(took)
	b.ReportMetric(float64(took[len(took)/2].Nanoseconds()), "p50-ns")
	b.ReportMetric(float64(took[len(took)*99/100].Nanoseconds()), "p99-ns")
}

// BenchmarkRemoteAskProcess measures an Ask round trip to an echo actor
// in another OS process, with a deadline per call.
func BenchmarkRemoteAskProcess(b *testing.B) {
	overNetworks(b, func(b *testing.B, network string) {
		n := startNode(b, benchConfig())
		echo := startChildNode(b, n, network).echo
		took := make([]time.Duration, 0, b.N)
		b.ReportAllocs()
		b.ResetTimer()
		for i := range b.N {
			start := time.Now()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_, err := Ask(ctx, echo, func(r Ref[testPong]) testPing { return testPing{N: i, ReplyTo: r} })
			cancel()
			took = append(took, time.Since(start))
			if err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		latencies(b, took)
	})
}

// BenchmarkFloorRequestReplyProcess is the raw floor of
// BenchmarkRemoteAskProcess: one 9-byte frame out, flushed, and the same
// frame back from another OS process.
func BenchmarkFloorRequestReplyProcess(b *testing.B) {
	overNetworks(b, func(b *testing.B, network string) {
		n := startNode(b, benchConfig())
		child := startChildNode(b, n, network)
		c, err := net.Dial(network, child.reply)
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		r, w := bufio.NewReader(c), bufio.NewWriter(c)
		var back [floorFrame]byte
		took := make([]time.Duration, 0, b.N)
		b.ResetTimer()
		for i := range b.N {
			start := time.Now()
			writeFloor(w, uint64(i))
			w.Flush()
			if _, err := io.ReadFull(r, back[:]); err != nil {
				b.Fatal(err)
			}
			took = append(took, time.Since(start))
		}
		b.StopTimer()
		latencies(b, took)
	})
}
