package troupe

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"
)

// silentListener accepts TCP connections and never says a word; accepted
// tells of each new connection.
func silentListener(t *testing.T) (addr string, accepted chan struct{}) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	accepted = make(chan struct{}, 16)
	var conns []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c)
			accepted <- struct{}{}
		}
	}()
	t.Cleanup(func() {
		l.Close()
		<-done
		for _, c := range conns {
			c.Close()
		}
	})
	return l.Addr().String(), accepted
}

func TestCloseAbortsAHangingHandshake(t *testing.T) {
	t.Parallel()
	checkLeaks(t) // registered first: runs after the listener is gone
	addr, accepted := silentListener(t)
	cfg := testConfig()
	cfg.HandshakeTimeout = time.Minute
	n, err := Start(ctxT(t, 5*time.Second), cfg)
	if err != nil {
		t.Fatal(err)
	}
	resolved := make(chan error, 1)
	go func() {
		_, err := Resolve[int](context.Background(), n, "troupe://"+addr+"/user/x")
		resolved <- err
	}()
	recv(t, accepted, "the dial")
	start := time.Now()
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("Close took %v with a handshake in progress (HandshakeTimeout 1m)", took)
	}
	if err := recv(t, resolved, "Resolve to fail"); !errors.Is(err, ErrNodeClosed) {
		t.Fatalf("Resolve during Close = %v, want ErrNodeClosed", err)
	}
}

func TestShutdownDeliversWhatIsQueued(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	home := startNode(t, testConfig("tcp://127.0.0.1:0"))
	away, err := Start(ctxT(t, 5*time.Second), testConfig("tcp://127.0.0.1:0"))
	if err != nil {
		t.Fatal(err)
	}
	const total = 20_000
	got := make(chan int, 1)
	count := 0
	sink, _ := Spawn(home, "sink", Behavior[int]{Receive: func(_ *Context[int], m int) {
		if count++; count == total {
			got <- count
		}
	}})
	dead := make(chan DeadLetter, 1)
	SubscribeChan(away, dead)
	r, err := Resolve[int](ctxT(t, 5*time.Second), away, FormatRef(home.Addrs()[0], sink.Path()))
	if err != nil {
		t.Fatal(err)
	}
	for i := range total {
		r.Tell(i)
	}
	if err := away.Shutdown(ctxT(t, 10*time.Second)); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	recv(t, got, "every queued message")
	select {
	case d := <-dead:
		t.Fatalf("a dead letter during a graceful shutdown: %+v", d)
	default:
	}
}

// frozenPeer starts a node away (closed by the caller) with a ref to an
// actor on a peer whose network is frozen, so that nothing away writes is
// delivered and its goodbye cannot finish.
func frozenPeer(t *testing.T) (*Node, Ref[testPing]) {
	f := new(FaultNet)
	home := startOn(t, f, failConfig("home", 50*time.Millisecond, 5*time.Second))
	away, err := f.Start(ctxT(t, 5*time.Second), failConfig("away", 50*time.Millisecond, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	sink := spawnEcho(t, home, "sink")
	r, err := Resolve[testPing](ctxT(t, 5*time.Second), away, FormatRef(home.Addrs()[0], sink.Path()))
	if err != nil {
		t.Fatal(err)
	}
	f.Pause(home)
	t.Cleanup(func() { f.Resume(home) })
	return away, r
}

func TestShutdownReturnsWhenItsContextEnds(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	away, r := frozenPeer(t)
	for range 1000 {
		r.Tell(testPing{})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := away.Shutdown(ctx)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Shutdown against a frozen peer = %v, want DeadlineExceeded", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("Shutdown took %v with a 300 ms context", took)
	}
	if err := away.Close(); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Close after Shutdown returns %v, want Shutdown's result", err)
	}
}

func TestCloseCutsAShutdownShort(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	away, r := frozenPeer(t)
	r.Tell(testPing{})
	shut := make(chan error, 1)
	go func() { shut <- away.Shutdown(context.Background()) }()
	waitFor(t, 5*time.Second, "the shutdown to begin", func() bool {
		select {
		case <-away.Done():
			return true
		default:
			return false
		}
	})
	away.Close()
	if err := recv(t, shut, "Shutdown to return after Close"); !errors.Is(err, context.Canceled) {
		t.Fatalf("Shutdown cut short by Close = %v, want context.Canceled", err)
	}
}
