//go:build unix

package troupe_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"troupe"
)

// TestHelperClusterMember is not a test: cluster process tests run it in
// a child process. It starts a node on $TROUPE_MEMBER_LISTEN that joins
// the cluster at $TROUPE_MEMBER_SEED, prints "READY addr uid", and then
// stops the way stdin says: "shutdown" (Node.Shutdown), "close"
// (Node.Close), "cluster-close" (Cluster.Close, then Node.Close). SIGTERM
// calls Node.Shutdown, the way a service's main does. It prints "STOPPED"
// when done.
func TestHelperClusterMember(t *testing.T) {
	t.Parallel()
	listen := os.Getenv("TROUPE_MEMBER_LISTEN")
	if listen == "" {
		t.Skip("helper for the cluster process tests")
	}
	n, err := troupe.Start(context.Background(), troupe.Config{Name: "member", Listen: []string{listen},
		Logger:            slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})),
		HeartbeatInterval: 50 * time.Millisecond, UnreachableAfter: 2 * time.Second})
	if err != nil {
		fmt.Println("ERR", err)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	c, err := troupe.StartCluster(ctx, n, troupe.ClusterConfig{Seeds: []string{os.Getenv("TROUPE_MEMBER_SEED")}, StableAfter: time.Second})
	cancel()
	if err != nil {
		fmt.Println("ERR", err)
		n.Close()
		return
	}
	n.OnShutdown(troupe.PhaseLeave, func(context.Context) error { fmt.Println("HOOK leave"); return nil })
	n.OnShutdown(troupe.PhaseFlush, func(context.Context) error { fmt.Println("HOOK flush"); return nil })
	signalled := make(chan error, 1)
	go func() { signalled <- n.ShutdownOnSignal(10 * time.Second) }()
	fmt.Printf("READY %s %s\n", n.Addrs()[0], n.UID())
	cmds := make(chan string)
	go func() {
		in := bufio.NewScanner(os.Stdin)
		for in.Scan() {
			cmds <- in.Text()
		}
		close(cmds)
	}()
	var cmd string
	select {
	case cmd = <-cmds:
	case err := <-signalled:
		fmt.Println("SIGNALLED", err)
	}
	switch cmd {
	case "":
	case "shutdown":
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		n.Shutdown(ctx)
		cancel()
	case "cluster-close":
		c.Close()
		n.Close()
	default:
		n.Close()
	}
	fmt.Println("STOPPED")
}

// memberProcess is a cluster member in another OS process.
type memberProcess struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan string
	uid   string
}

func startMemberProcess(t *testing.T, seed string) *memberProcess {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	p := &memberProcess{cmd: exec.Command(exe, "-test.run=^TestHelperClusterMember$"), lines: make(chan string, 16)}
	p.cmd.Env = append(os.Environ(), "TROUPE_MEMBER_LISTEN=127.0.0.1:0", "TROUPE_MEMBER_SEED="+seed)
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
	line := p.line(t)
	f := strings.Fields(line)
	if len(f) != 3 || f[0] != "READY" {
		t.Fatalf("member process said %q", line)
	}
	p.uid = f[2]
	return p
}

func (p *memberProcess) line(t *testing.T) string {
	t.Helper()
	select {
	case l, ok := <-p.lines:
		if !ok {
			t.Fatal("member process ended")
		}
		return l
	case <-time.After(15 * time.Second):
		t.Fatal("member process said nothing")
		return ""
	}
}

// A member in another process that stops — by SIGTERM and Node.Shutdown,
// by Node.Close, or by Cluster.Close — is seen by the others as leaving,
// exiting and removed, never as unreachable; with no downing strategy, a
// crash would have blocked the cluster instead.
func TestAMemberThatStopsLeaves(t *testing.T) {
	t.Parallel()
	slowTest(t)
	for _, how := range []string{"SIGTERM", "close", "cluster-close"} {
		t.Run(how, func(t *testing.T) {
			home, err := troupe.Start(ctxFor(t), troupe.Config{Name: "home", Listen: []string{"127.0.0.1:0"},
				Logger:            slog.New(slog.NewTextHandler(io.Discard, nil)),
				HeartbeatInterval: 50 * time.Millisecond, UnreachableAfter: 2 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { home.Close() })
			events := make(chan troupe.MemberEvent, 64)
			troupe.SubscribeChan(home, events)
			c, err := troupe.StartCluster(ctxFor(t), home, troupe.ClusterConfig{StableAfter: time.Second})
			if err != nil {
				t.Fatal(err)
			}
			p := startMemberProcess(t, home.Addrs()[0].String())
			waitUntil(t, 10*time.Second, "the member process up", func() bool {
				for _, m := range c.Members() {
					if m.UID.String() == p.uid {
						return m.Status == troupe.MemberUp
					}
				}
				return false
			})
			if how == "SIGTERM" {
				p.cmd.Process.Signal(syscall.SIGTERM)
			} else {
				fmt.Fprintln(p.stdin, how)
			}
			seen := map[troupe.MemberStatus]bool{}
			deadline := time.After(10 * time.Second)
			for !seen[troupe.MemberRemoved] {
				select {
				case e := <-events:
					if e.Member.UID.String() != p.uid {
						continue
					}
					if e.Kind == "unreachable" {
						t.Fatalf("the stopped member was seen unreachable (a crash), not leaving: %+v", e)
					}
					if e.Kind == "status" {
						seen[e.Member.Status] = true
					}
				case <-deadline:
					t.Fatalf("the stopped member was not removed within 10 s; statuses seen %v; members %v, unreachable %v", seen, c.Members(), c.Unreachable())
				}
			}
			if !seen[troupe.MemberExiting] {
				t.Errorf("removed without exiting: statuses seen %v", seen)
			}
			want := []string{"STOPPED"}
			switch how {
			case "SIGTERM": // ShutdownOnSignal: Shutdown's phases, with the hooks
				want = []string{"HOOK leave", "HOOK flush", "SIGNALLED <nil>", "STOPPED"}
			}
			for _, w := range want {
				if l := p.line(t); l != w {
					t.Errorf("member process said %q, want %q", l, w)
				}
			}
			if got := len(c.Members()); got != 1 {
				for _, m := range c.Members() {
					if m.UID.String() == p.uid && m.Status != troupe.MemberRemoved {
						t.Errorf("the leaver is still a member: %v", m)
					}
				}
			}
			if b := home.Stats().ClusterBlocked; b != "" {
				t.Errorf("the cluster says it is blocked: %s", b)
			}
		})
	}
}
