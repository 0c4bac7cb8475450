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
	"runtime/pprof"
	"slices"
	"strings"
	"testing"
	"time"
)

// sinkMsg is the protocol of the counting sink in the child process.
type sinkMsg interface{ isSink() }

type sinkQuery struct{ ReplyTo Ref[count] }

func (count) isSink()     {}
func (sinkQuery) isSink() {}

func init() { RegisterMessage[sinkQuery]("troupe.test.sink-query") }

// TestHelperSinkProcess is not a test: the process benchmarks run it in a
// child process. It serves, over loopback TCP, a node with a counting sink
// and an echo actor, and the raw floors: a stream sink and a
// request-reply echo of length-prefixed 8-byte integers (see floorFrame).
// It prints the three addresses and serves until its stdin closes.
func TestHelperSinkProcess(t *testing.T) {
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
	n, err := Start(context.Background(), benchConfig("tcp://127.0.0.1:0"))
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	seen := 0
	Spawn(n, "sink", Behavior[sinkMsg]{Receive: func(_ *Context[sinkMsg], m sinkMsg) {
		switch m := m.(type) {
		case count:
			seen++
		case sinkQuery:
			m.ReplyTo.Tell(count{N: seen})
		}
	}})
	spawnEcho(t, n, "echo")
	stream, rr := serveFloor(t, floorCount), serveFloor(t, floorEcho)
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

// serveFloor serves one raw floor on loopback TCP and returns its address.
func serveFloor(t *testing.T, mode floorMode) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
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

// child is what startSinkProcess started.
type sinkChild struct {
	sink          Ref[sinkMsg]
	echo          Ref[testPing]
	stream, reply string // the raw floors' addresses
}

// startSinkProcess runs the helper sink in a child process and returns a
// ref to it.
func startSinkProcess(b *testing.B, n *Node) Ref[sinkMsg] { return startChildNode(b, n).sink }

// startChildNode runs the helper in a child process.
func startChildNode(b *testing.B, n *Node) sinkChild {
	exe, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^TestHelperSinkProcess$")
	cmd.Env = append(os.Environ(), "TROUPE_HELPER_SINK=1")
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
	c := sinkChild{stream: fields[1], reply: fields[2]}
	if c.sink, err = Resolve[sinkMsg](ctxT(b, 10*time.Second), n, FormatRef(addr, "/user/sink")); err != nil {
		b.Fatal(err)
	}
	if c.echo, err = Resolve[testPing](ctxT(b, 10*time.Second), n, FormatRef(addr, "/user/echo")); err != nil {
		b.Fatal(err)
	}
	return c
}

// BenchmarkRemoteTellProcess measures Tell throughput to an actor in
// another OS process over loopback TCP: b.N tells of count{N: i} (values
// that grow like real data: varints of 1 to 4 bytes, and boxes that
// allocate), then a query that returns once all have been handled.
// Deviation from the default Config: no mailbox or send-queue limit
// (benchConfig), so that a burst of b.N is not cut short.
func BenchmarkRemoteTellProcess(b *testing.B) {
	n := startNode(b, benchConfig())
	sink := startSinkProcess(b, n)
	// Per sender→receiver order: the query is handled after every tell.
	ask := func() int {
		c, err := Ask(context.Background(), sink, func(r Ref[count]) sinkMsg { return sinkQuery{ReplyTo: r} })
		if err != nil {
			b.Fatal(err)
		}
		return c.N
	}
	start := ask()
	before := n.bytesWritten()
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		sink.Tell(count{N: i})
	}
	got := ask()
	b.StopTimer()
	if got-start != b.N {
		b.Fatalf("sink counted %d, want %d", got-start, b.N)
	}
	b.ReportMetric(float64(n.bytesWritten()-before)/float64(b.N), "wire-B/msg")
}

// BenchmarkFloorTCPStreamProcess is the raw floor of
// BenchmarkRemoteTellProcess: b.N integers i, length-prefixed (9 bytes a
// frame), through a bufio.Writer to another OS process that decodes and
// counts them, then waits for its count.
func BenchmarkFloorTCPStreamProcess(b *testing.B) {
	n := startNode(b, benchConfig())
	child := startChildNode(b, n)
	c, err := net.Dial("tcp", child.stream)
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
}

// latencies reports the median and the 99th percentile of took.
func latencies(b *testing.B, took []time.Duration) {
	slices.Sort(took)
	b.ReportMetric(float64(took[len(took)/2].Nanoseconds()), "p50-ns")
	b.ReportMetric(float64(took[len(took)*99/100].Nanoseconds()), "p99-ns")
}

// BenchmarkRemoteAskProcess measures an Ask round trip to an echo actor
// in another OS process over loopback TCP, with a deadline per call.
func BenchmarkRemoteAskProcess(b *testing.B) {
	n := startNode(b, benchConfig())
	echo := startChildNode(b, n).echo
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
}

// BenchmarkFloorTCPRequestReplyProcess is the raw floor of
// BenchmarkRemoteAskProcess: one 9-byte frame out, flushed, and the same
// frame back from another OS process.
func BenchmarkFloorTCPRequestReplyProcess(b *testing.B) {
	n := startNode(b, benchConfig())
	child := startChildNode(b, n)
	c, err := net.Dial("tcp", child.reply)
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
}
