package troupe_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"troupe"
)

// Two versions of three message types, each under one wire key: the
// helper process (TROUPE_SHAPE_V2 set) runs v2. shape: v2 reordered the
// fields, added Tags and removed Old (compatible). kind: v2 changed
// Code's kind (incompatible). width: v2 widened N (compatible while the
// value fits).
type shapeV1 struct {
	ID   int64
	Name string
	Old  bool
}

type shapeV2 struct {
	Tags []string
	Name string
	ID   int64
}

type kindV1 struct {
	ID   int64
	Code string
}

type kindV2 struct {
	ID   int64
	Code int64
}

type widthV1 struct{ N int32 }

type widthV2 struct{ N int64 }

const (
	shapeKey = "troupe.test.shape"
	kindKey  = "troupe.test.kind"
	widthKey = "troupe.test.width"
)

func init() {
	if os.Getenv("TROUPE_SHAPE_V2") != "" {
		troupe.SetWireKey[shapeV2](shapeKey)
		troupe.SetWireKey[kindV2](kindKey)
		troupe.SetWireKey[widthV2](widthKey)
	} else {
		troupe.SetWireKey[shapeV1](shapeKey)
		troupe.SetWireKey[kindV1](kindKey)
		troupe.SetWireKey[widthV1](widthKey)
	}
}

// TestHelperShapeV2 is the v2 side of TestTwoVersionsOfAMessageTalk.
func TestHelperShapeV2(t *testing.T) {
	t.Parallel()
	if os.Getenv("TROUPE_SHAPE_V2") == "" {
		t.Skip("helper for TestTwoVersionsOfAMessageTalk")
	}
	n, err := troupe.Start(context.Background(), troupe.Config{Name: "v2", Listen: []string{"tcp://127.0.0.1:0"},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		fmt.Println("ERR", err)
		return
	}
	defer n.Close()
	out := make(chan string, 64)
	dead := make(chan troupe.DeadLetter, 64)
	troupe.SubscribeChan(n, dead)
	troupe.Spawn(n, "sink", troupe.Behavior[shapeV2]{Receive: func(_ *troupe.Context[shapeV2], m shapeV2) {
		out <- fmt.Sprintf("GOT %d %s %d", m.ID, m.Name, len(m.Tags))
	}})
	troupe.Spawn(n, "kinds", troupe.Behavior[kindV2]{Receive: func(_ *troupe.Context[kindV2], m kindV2) {
		out <- fmt.Sprintf("KIND %d", m.ID)
	}})
	troupe.Spawn(n, "plain", troupe.Behavior[string]{Receive: func(_ *troupe.Context[string], s string) { out <- "PLAIN " + s }})
	fmt.Printf("READY %s\n", n.Addrs()[0])
	cmds := make(chan string)
	go func() {
		in := bufio.NewScanner(os.Stdin)
		for in.Scan() {
			cmds <- in.Text()
		}
		close(cmds)
	}()
	for {
		select {
		case l := <-out:
			fmt.Println(l)
		case d := <-dead:
			fmt.Printf("DEAD %v\n", d.Reason)
		case c, ok := <-cmds:
			if !ok {
				return
			}
			f := strings.Fields(c)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			sink, err1 := troupe.Resolve[shapeV2](ctx, n, f[1]+"/user/sink")
			kinds, err2 := troupe.Resolve[kindV2](ctx, n, f[1]+"/user/kinds")
			widths, err3 := troupe.Resolve[widthV2](ctx, n, f[1]+"/user/widths")
			plain, err4 := troupe.Resolve[string](ctx, n, f[1]+"/user/plain")
			cancel()
			if err := errors.Join(err1, err2, err3, err4); err != nil {
				fmt.Println("ERR", err)
				return
			}
			for i := range 3 {
				sink.Tell(shapeV2{ID: int64(i), Name: "v2", Tags: []string{"new"}})
			}
			kinds.Tell(kindV2{ID: 1, Code: 42})
			widths.Tell(widthV2{N: 5})
			widths.Tell(widthV2{N: 1 << 40})
			plain.Tell("after")
		}
	}
}

// v2Process is the v2 helper process: its stdin, and its stdout's lines.
type v2Process struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan string
}

func (p *v2Process) line(t *testing.T) string {
	t.Helper()
	select {
	case l, ok := <-p.lines:
		if !ok {
			t.Fatal("the v2 process ended")
		}
		return l
	case <-time.After(15 * time.Second):
		t.Fatal("the v2 process said nothing")
		return ""
	}
}

// startV2 runs the v2 helper process and returns it with its address.
func startV2(t *testing.T) (*v2Process, string) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	p := &v2Process{cmd: exec.Command(exe, "-test.run=^TestHelperShapeV2$"), lines: make(chan string, 64)}
	p.cmd.Env = append(os.Environ(), "TROUPE_SHAPE_V2=1")
	p.cmd.Stderr = os.Stderr
	p.stdin, _ = p.cmd.StdinPipe()
	stdout, _ := p.cmd.StdoutPipe()
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waited := make(chan struct{})
	go func() {
		in := bufio.NewScanner(stdout)
		for in.Scan() {
			p.lines <- in.Text()
		}
		close(p.lines)
		p.cmd.Wait()
		close(waited)
	}()
	t.Cleanup(func() {
		p.stdin.Close()
		select {
		case <-waited:
		case <-time.After(15 * time.Second):
			p.cmd.Process.Kill()
			<-waited
		}
	})
	ready := strings.Fields(p.line(t))
	if len(ready) != 2 || ready[0] != "READY" {
		t.Fatalf("the v2 process said %q", ready)
	}
	return p, "troupe://" + strings.TrimPrefix(ready[1], "tcp://")
}

// A v1 node and a v2 node, in two processes, exchange three versions of
// message types: a struct whose fields were reordered, added and removed
// arrives with the fields both have (by name); a widened integer arrives
// while its value fits, and is one dead letter when it does not; a field
// whose kind changed makes each message of its key one dead letter
// (ErrIncompatibleMessage naming the field). The association goes on,
// nobody is quarantined, and the messages around them arrive.
func TestTwoVersionsOfAMessageTalk(t *testing.T) {
	t.Parallel()
	n := defaultNode(t, "v1")
	dead := make(chan troupe.DeadLetter, 64)
	troupe.SubscribeChan(n, dead)
	lost := make(chan troupe.PeerUnreachable, 4)
	troupe.SubscribeChan(n, lost)
	got := make(chan string, 64)
	spawn := func(err error) {
		if err != nil {
			t.Fatal(err)
		}
	}
	_, err := troupe.Spawn(n, "sink", troupe.Behavior[shapeV1]{Receive: func(_ *troupe.Context[shapeV1], m shapeV1) {
		got <- fmt.Sprintf("GOT %d %s %v", m.ID, m.Name, m.Old)
	}})
	spawn(err)
	_, err = troupe.Spawn(n, "kinds", troupe.Behavior[kindV1]{Receive: func(_ *troupe.Context[kindV1], m kindV1) { got <- fmt.Sprintf("KIND %d", m.ID) }})
	spawn(err)
	_, err = troupe.Spawn(n, "widths", troupe.Behavior[widthV1]{Receive: func(_ *troupe.Context[widthV1], m widthV1) { got <- fmt.Sprintf("WIDTH %d", m.N) }})
	spawn(err)
	_, err = troupe.Spawn(n, "plain", troupe.Behavior[string]{Receive: func(_ *troupe.Context[string], s string) { got <- "PLAIN " + s }})
	spawn(err)
	p, v2 := startV2(t)

	// v1 → v2.
	ctx := ctxFor(t)
	sink, err := troupe.Resolve[shapeV1](ctx, n, v2+"/user/sink")
	if err != nil {
		t.Fatal(err)
	}
	kinds, err := troupe.Resolve[kindV1](ctx, n, v2+"/user/kinds")
	if err != nil {
		t.Fatal(err)
	}
	plain, err := troupe.Resolve[string](ctx, n, v2+"/user/plain")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		sink.Tell(shapeV1{ID: int64(i), Name: "v1", Old: true})
	}
	kinds.Tell(kindV1{ID: 1, Code: "x"})
	plain.Tell("before")
	var lines []string
	for range 5 { // (the helper prints them in any order)
		lines = append(lines, p.line(t))
	}
	slices.Sort(lines)
	if lines[0] != "DEAD "+lines[0][5:] || !strings.Contains(lines[0], "incompatible") || !strings.Contains(lines[0], kindKey) || !strings.Contains(lines[0], "field Code") {
		t.Errorf("v2's dead letter for the changed kind: %q", lines[0])
	}
	if want := []string{"GOT 0 v1 0", "GOT 1 v1 0", "GOT 2 v1 0", "PLAIN before"}; !slices.Equal(lines[1:], want) {
		t.Fatalf("v2 received %q, want %q", lines[1:], want)
	}

	// v2 → v1.
	fmt.Fprintf(p.stdin, "send troupe://%s\n", strings.TrimPrefix(n.Addrs()[0].String(), "tcp://"))
	var recv []string
	for range 5 {
		recv = append(recv, within(t, got, 10*time.Second, "a message from v2"))
	}
	slices.Sort(recv) // (one actor's messages arrive in order; between actors, any)
	if want := []string{"GOT 0 v2 false", "GOT 1 v2 false", "GOT 2 v2 false", "PLAIN after", "WIDTH 5"}; !slices.Equal(recv, want) {
		t.Fatalf("v1 received %q, want %q", recv, want)
	}
	var reasons []string
	for range 2 {
		d := within(t, dead, 10*time.Second, "a dead letter")
		if !errors.Is(d.Reason, troupe.ErrIncompatibleMessage) {
			t.Fatalf("dead letter: %v, want ErrIncompatibleMessage", d.Reason)
		}
		reasons = append(reasons, d.Reason.Error())
	}
	slices.Sort(reasons)
	if !strings.Contains(reasons[0], kindKey) || !strings.Contains(reasons[0], "field Code") ||
		!strings.Contains(reasons[1], widthKey) || !strings.Contains(reasons[1], "field N") || !strings.Contains(reasons[1], "overflows") {
		t.Fatalf("dead letters: %q", reasons)
	}
	t.Logf("v1's dead letters: %q", reasons)

	// The link still carries messages both ways.
	plain.Tell("again")
	if l := p.line(t); l != "PLAIN again" {
		t.Fatalf("the v2 process said %q", l)
	}
	select {
	case u := <-lost:
		t.Fatalf("the peer was declared unreachable: %+v", u)
	default:
	}
	if q := n.Stats().Quarantined; len(q) != 0 {
		t.Fatalf("quarantined: %+v", q)
	}
	if c := n.Stats().DeadLetters["incompatible"]; c != 2 {
		t.Fatalf("Stats counts %d incompatible dead letters, want 2", c)
	}
}
