package troupe

import (
	"bufio"
	"context"
	"os"
	"os/exec"
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

// TestHelperSinkProcess is not a test: BenchmarkRemoteTellProcess runs it
// in a child process. It serves a counting sink over TCP until its stdin
// closes.
func TestHelperSinkProcess(t *testing.T) {
	if os.Getenv("TROUPE_HELPER_SINK") == "" {
		t.Skip("helper for BenchmarkRemoteTellProcess")
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
	os.Stdout.WriteString("ADDR " + n.Addrs()[0].String() + "\n")
	bufio.NewReader(os.Stdin).ReadString('\n')
}

// startSinkProcess runs the helper sink in a child process and returns a
// ref to it.
func startSinkProcess(b *testing.B, n *Node) Ref[sinkMsg] {
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
	addr, err := ParseAddr(strings.TrimSpace(strings.TrimPrefix(line, "ADDR ")))
	if err != nil {
		b.Fatal(err)
	}
	r, err := Resolve[sinkMsg](ctxT(b, 10*time.Second), n, FormatRef(addr, "/user/sink"))
	if err != nil {
		b.Fatal(err)
	}
	return r
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
