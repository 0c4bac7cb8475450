package troupe

import (
	"errors"
	"testing"
	"time"
)

type testPing struct {
	N       int
	ReplyTo Ref[testPong]
}

type testPong struct {
	N    int
	From string
}

func init() {
	RegisterMessage[testPing]("troupe.test.ping")
	RegisterMessage[testPong]("troupe.test.pong")
}

// spawnEcho spawns an actor that answers each ping with a pong.
func spawnEcho(t testing.TB, n *Node, name string) Ref[testPing] {
	t.Helper()
	r, err := Spawn(n, name, Behavior[testPing]{Receive: func(c *Context[testPing], m testPing) {
		m.ReplyTo.Tell(testPong{N: m.N, From: c.Node().Name()})
	}})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// spawnCollector spawns an actor that forwards what it receives to a channel.
func spawnCollector[T any](t testing.TB, n *Node, name string, size int) (Ref[T], chan T) {
	t.Helper()
	ch := make(chan T, size)
	r, err := Spawn(n, name, Behavior[T]{Receive: func(_ *Context[T], m T) { ch <- m }})
	if err != nil {
		t.Fatal(err)
	}
	return r, ch
}

func TestRemoteAskAndOrderedTell(t *testing.T) {
	forEachTransport(t, func(t *testing.T, listen func(testing.TB) string) {
		a := startNode(t, testConfig(listen(t)))
		b := startNode(t, testConfig(listen(t)))
		spawnEcho(t, b, "echo")

		echo, err := Resolve[testPing](ctxT(t, 5*time.Second), a, FormatRef(b.Addrs()[0], "/user/echo"))
		if err != nil {
			t.Fatalf("Resolve: %v", err)
		}
		if echo.IsLocal() || echo.NodeUID() != b.UID() {
			t.Fatalf("resolved ref = %v (local %v), want a remote ref to %v", echo, echo.IsLocal(), b.UID())
		}
		pong, err := Ask(ctxT(t, 5*time.Second), echo, func(r Ref[testPong]) testPing { return testPing{N: 7, ReplyTo: r} })
		if err != nil {
			t.Fatalf("Ask: %v", err)
		}
		if pong.N != 7 || pong.From != b.Name() {
			t.Fatalf("Ask reply = %+v, want N=7 from %s", pong, b.Name())
		}

		sink, got := spawnCollector[testPong](t, a, "sink", 2000)
		const count = 2000
		for i := range count {
			echo.Tell(testPing{N: i, ReplyTo: sink})
		}
		for i := range count {
			if p := recv(t, got, "pong"); p.N != i {
				t.Fatalf("pong %d has N=%d: messages arrived out of order", i, p.N)
			}
		}
	})
}

func TestResolveErrors(t *testing.T) {
	forEachTransport(t, func(t *testing.T, listen func(testing.TB) string) {
		a := startNode(t, testConfig(listen(t)))
		b := startNode(t, testConfig(listen(t)))
		spawnEcho(t, b, "echo")
		ctx := ctxT(t, 5*time.Second)
		if _, err := Resolve[testPing](ctx, a, FormatRef(b.Addrs()[0], "/user/nobody")); !errors.Is(err, ErrNoSuchActor) {
			t.Errorf("Resolve of a missing actor: err = %v, want ErrNoSuchActor", err)
		}
		if _, err := Resolve[testPong](ctx, a, FormatRef(b.Addrs()[0], "/user/echo")); !errors.Is(err, ErrWrongType) {
			t.Errorf("Resolve with the wrong protocol: err = %v, want ErrWrongType", err)
		}
		if _, err := Resolve[testPing](ctx, a, "troupe://127.0.0.1:1/user/echo"); err == nil {
			t.Errorf("Resolve of an address nobody listens on succeeded")
		}
	})
}
