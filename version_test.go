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
	"strings"
	"testing"
	"time"

	"troupe"
)

// Two versions of one message type under one wire key: the helper
// process (TROUPE_SHAPE_V2 set) runs v2, which added a field.
type shapeV1 struct {
	ID   int64
	Name string
}

type shapeV2 struct {
	ID   int64
	Name string
	Tags []string
}

const shapeKey = "troupe.test.shape"

func init() {
	if os.Getenv("TROUPE_SHAPE_V2") != "" {
		troupe.RegisterMessage[shapeV2](shapeKey)
	} else {
		troupe.RegisterMessage[shapeV1](shapeKey)
	}
}

// TestHelperShapeV2 is the v2 side of TestAnIncompatibleMessageIsOneDeadLetter.
func TestHelperShapeV2(t *testing.T) {
	if os.Getenv("TROUPE_SHAPE_V2") == "" {
		t.Skip("helper for TestAnIncompatibleMessageIsOneDeadLetter")
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
	troupe.SubscribeChan(n.Events(), dead)
	troupe.Spawn(n, "sink", troupe.Behavior[shapeV2]{Receive: func(_ *troupe.Context[shapeV2], m shapeV2) { out <- fmt.Sprint("GOT ", m.ID) }})
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
			plain, err2 := troupe.Resolve[string](ctx, n, f[1]+"/user/plain")
			cancel()
			if err := errors.Join(err1, err2); err != nil {
				fmt.Println("ERR", err)
				return
			}
			for i := range 3 {
				sink.Tell(shapeV2{ID: int64(i), Name: "v2", Tags: []string{"new"}})
			}
			plain.Tell("after")
		}
	}
}

// A v2 node sends a struct with one more field to a v1 node, and the v1
// node sends its struct to the v2 node: each such message is one dead
// letter on its receiver, with ErrIncompatibleMessage naming the wire
// key; the association goes on, nobody is quarantined, and the messages
// around them arrive.
func TestAnIncompatibleMessageIsOneDeadLetter(t *testing.T) {
	n := defaultNode(t, "v1")
	dead := make(chan troupe.DeadLetter, 64)
	troupe.SubscribeChan(n.Events(), dead)
	lost := make(chan troupe.PeerUnreachable, 4)
	troupe.SubscribeChan(n.Events(), lost)
	got := make(chan string, 64)
	if _, err := troupe.Spawn(n, "sink", troupe.Behavior[shapeV1]{Receive: func(_ *troupe.Context[shapeV1], m shapeV1) { got <- fmt.Sprint("GOT ", m.ID) }}); err != nil {
		t.Fatal(err)
	}
	if _, err := troupe.Spawn(n, "plain", troupe.Behavior[string]{Receive: func(_ *troupe.Context[string], s string) { got <- "PLAIN " + s }}); err != nil {
		t.Fatal(err)
	}

	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	p := &memberProcess{cmd: exec.Command(exe, "-test.run=^TestHelperShapeV2$"), lines: make(chan string, 64)}
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
	v2 := "troupe://" + strings.TrimPrefix(ready[1], "tcp://")

	// v1 → v2: three incompatible messages, then a plain one.
	ctx := ctxFor(t)
	sink, err := troupe.Resolve[shapeV1](ctx, n, v2+"/user/sink")
	if err != nil {
		t.Fatal(err)
	}
	plain, err := troupe.Resolve[string](ctx, n, v2+"/user/plain")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		sink.Tell(shapeV1{ID: int64(i), Name: "v1"})
	}
	plain.Tell("before")
	deadSeen, before := 0, false // (the helper prints them in any order)
	for range 4 {
		l := p.line(t)
		switch {
		case strings.HasPrefix(l, "DEAD ") && strings.Contains(l, "incompatible") && strings.Contains(l, shapeKey) && strings.Contains(l, "field Tags"):
			deadSeen++ // (v1's message ends where v2's field Tags begins)
		case l == "PLAIN before":
			before = true
		default:
			t.Fatalf("the v2 process said %q", l)
		}
	}
	if deadSeen != 3 || !before {
		t.Fatalf("the v2 process saw %d incompatible dead letters (want 3), the plain message: %v", deadSeen, before)
	}

	// v2 → v1: the same the other way.
	self := "troupe://" + strings.TrimPrefix(n.Addrs()[0].String(), "tcp://")
	fmt.Fprintf(p.stdin, "send %s\n", self)
	for i := range 3 {
		d := within(t, dead, 10*time.Second, "a dead letter of an incompatible message")
		if !errors.Is(d.Reason, troupe.ErrIncompatibleMessage) || !strings.Contains(d.Reason.Error(), shapeKey) || !strings.Contains(d.Reason.Error(), "more fields") {
			t.Fatalf("dead letter %d: %v, want ErrIncompatibleMessage naming %s and saying the sender's type has more fields", i, d.Reason, shapeKey)
		}
		if i == 0 {
			t.Logf("v1's dead letter: %v", d.Reason)
		}
	}
	if g := within(t, got, 10*time.Second, "the plain message after them"); g != "PLAIN after" {
		t.Fatalf("v1 received %q", g)
	}
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
	if c := n.Stats().DeadLetters["incompatible"]; c != 3 {
		t.Fatalf("Stats counts %d incompatible dead letters, want 3", c)
	}
}
