package troupe_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"troupe"
)

// hdrMsg is a message whose handler reports the headers it came with.
type hdrMsg struct {
	N     int
	Reply troupe.Ref[string]
}

func init() { troupe.SetWireKey[hdrMsg]("troupe.test.hdrmsg") }

// seen is what a handler saw of one message's headers.
type seen struct {
	n       int
	headers troupe.Headers // HeadersFrom(Context.Context), read first
	fromCtx troupe.Headers // HeadersFrom(Context.Context), read again
}

// spawnHeaderProbe spawns an actor that reports each message's headers on
// the channel it returns, and answers an Ask with its "trace" header.
func spawnHeaderProbe(t *testing.T, n *troupe.Node, name string) (troupe.Ref[hdrMsg], chan seen) {
	t.Helper()
	ch := make(chan seen, 10_000)
	r, err := troupe.Spawn(n, name, troupe.Behavior[hdrMsg]{Receive: func(c *troupe.Context[hdrMsg], m hdrMsg) {
		ch <- seen{n: m.N, headers: troupe.HeadersFrom(c.Context()), fromCtx: troupe.HeadersFrom(c.Context())}
		if !m.Reply.IsZero() {
			m.Reply.Tell(troupe.HeadersFrom(c.Context()).Get("trace"))
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	return r, ch
}

func quietConfig(name string) troupe.Config {
	return troupe.Config{Name: name, Listen: []string{"tcp://127.0.0.1:0"}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
}

// remoteRef resolves the actor at path on n from the node from.
func remoteRef[T any](t *testing.T, from, n *troupe.Node, path string) troupe.Ref[T] {
	t.Helper()
	r, err := troupe.Resolve[T](ctxFor(t), from, troupe.FormatRef(n.Addrs()[0], path))
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// Headers put in a context with WithHeaders reach the handler, by Send and
// by Ask, on the same node and on another: the handler's context has them, and
// the handler's Context.Context carries them.
func TestHeadersReachTheHandler(t *testing.T) {
	t.Parallel()
	here := startQuiet(t, quietConfig("here"))
	there := startQuiet(t, quietConfig("there"))
	local, localSeen := spawnHeaderProbe(t, here, "probe")
	_, remoteSeen := spawnHeaderProbe(t, there, "probe")
	remote := remoteRef[hdrMsg](t, here, there, "/user/probe")
	for _, c := range []struct {
		name string
		to   troupe.Ref[hdrMsg]
		seen chan seen
	}{{"local", local, localSeen}, {"remote", remote, remoteSeen}} {
		ctx := troupe.WithHeaders(ctxFor(t), troupe.Headers{"trace": c.name + "-1", "tenant": "acme"})
		ctx = troupe.WithHeaders(ctx, troupe.Headers{"trace": c.name + "-2"}) // over the first
		if err := c.to.Send(ctx, hdrMsg{N: 1}); err != nil {
			t.Fatal(err)
		}
		s := within(t, c.seen, 5*time.Second, c.name+" send")
		want := fmt.Sprint(troupe.Headers{"trace": c.name + "-2", "tenant": "acme"})
		if fmt.Sprint(s.headers) != want || fmt.Sprint(s.fromCtx) != want {
			t.Errorf("%s: the handler saw %v and %v in its context, want %s", c.name, s.headers, s.fromCtx, want)
		}
		got, err := troupe.Ask(ctx, c.to, func(r troupe.Ref[string]) hdrMsg { return hdrMsg{N: 2, Reply: r} })
		if err != nil || got != c.name+"-2" {
			t.Errorf("%s: Ask answered %q, %v; want the trace header %q", c.name, got, err, c.name+"-2")
		}
		within(t, c.seen, 5*time.Second, c.name+" ask")
		// Tell takes no context: no headers.
		c.to.Tell(hdrMsg{N: 3})
		if s := within(t, c.seen, 5*time.Second, c.name+" tell"); s.headers != nil || s.fromCtx != nil {
			t.Errorf("%s: a Tell arrived with headers %v, %v", c.name, s.headers, s.fromCtx)
		}
	}
}

// A handler that asks with its Context.Context passes the headers on: one
// trace across three nodes.
func TestHeadersFollowARequestAcrossThreeNodes(t *testing.T) {
	t.Parallel()
	a := startQuiet(t, quietConfig("a"))
	b := startQuiet(t, quietConfig("b"))
	c := startQuiet(t, quietConfig("c"))
	_, atC := spawnHeaderProbe(t, c, "last")
	last := remoteRef[hdrMsg](t, b, c, "/user/last")
	if _, err := troupe.Spawn(b, "middle", troupe.Behavior[hdrMsg]{Receive: func(cx *troupe.Context[hdrMsg], m hdrMsg) {
		got, err := troupe.Ask(cx.Context(), last, func(r troupe.Ref[string]) hdrMsg { return hdrMsg{N: m.N, Reply: r} })
		if err != nil {
			got = err.Error()
		}
		m.Reply.Tell(got)
	}}); err != nil {
		t.Fatal(err)
	}
	middle := remoteRef[hdrMsg](t, a, b, "/user/middle")
	ctx := troupe.WithHeaders(ctxFor(t), troupe.Headers{"trace": "4bf92f3577b34da6a3ce929d0e0e4736"})
	got, err := troupe.Ask(ctx, middle, func(r troupe.Ref[string]) hdrMsg { return hdrMsg{N: 7, Reply: r} })
	if err != nil || got != "4bf92f3577b34da6a3ce929d0e0e4736" {
		t.Fatalf("the third node answered %q, %v; want the trace id", got, err)
	}
	if s := within(t, atC, 5*time.Second, "the third node"); s.n != 7 || s.headers.Get("trace") != "4bf92f3577b34da6a3ce929d0e0e4736" {
		t.Fatalf("the third node saw %+v", s)
	}
}

// Messages with and without headers, interleaved, each arrive with their
// own: locally, and remotely where messages without headers are decoded in
// batches; and a link reset in the middle (the session resumes, and sends
// what was not acknowledged again) changes nothing.
func TestEachMessageKeepsItsOwnHeaders(t *testing.T) {
	t.Parallel()
	f := new(troupe.FaultNet)
	cfg := func(name string) troupe.Config {
		c := quietConfig(name)
		c.HeartbeatInterval, c.UnreachableAfter = 50*time.Millisecond, 10*time.Second
		return c
	}
	start := func(name string) *troupe.Node {
		n, err := f.Start(ctxFor(t), cfg(name))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { n.Close() })
		return n
	}
	here, there := start("here"), start("there")
	t.Cleanup(f.Heal)
	local, localSeen := spawnHeaderProbe(t, here, "probe")
	_, remoteSeen := spawnHeaderProbe(t, there, "probe")
	remote := remoteRef[hdrMsg](t, here, there, "/user/probe")
	const total = 3000
	for _, c := range []struct {
		name string
		to   troupe.Ref[hdrMsg]
		seen chan seen
	}{{"local", local, localSeen}, {"remote", remote, remoteSeen}} {
		base := ctxFor(t)
		for i := range total {
			if c.name == "remote" && i == total/3 {
				// What is sent from here on is written into the cut and
				// lost with the connection: only a resume sends it.
				f.Partition(here, there)
			}
			if i%3 == 0 {
				ctx := troupe.WithHeaders(base, troupe.Headers{"n": strconv.Itoa(i)})
				if err := c.to.Send(ctx, hdrMsg{N: i}); err != nil {
					t.Fatal(err)
				}
			} else {
				c.to.Tell(hdrMsg{N: i})
			}
			if c.name == "remote" && i == total*2/3 {
				if f.Reset(here, there) == 0 {
					t.Fatal("no connection to reset")
				}
				f.Heal()
			}
		}
		for i := range total {
			s := within(t, c.seen, 10*time.Second, fmt.Sprintf("%s message %d", c.name, i))
			want := ""
			if i%3 == 0 {
				want = strconv.Itoa(i)
			}
			if s.n != i || s.headers.Get("n") != want || (want == "") != (s.headers == nil) {
				t.Fatalf("%s: message %d arrived as %d with headers %v", c.name, i, s.n, s.headers)
			}
		}
	}
	if r := here.Stats().Totals.LinksResumed; r == 0 {
		t.Fatal("the session was not resumed: nothing was sent again")
	}
}

// A restart that waits (a backoff) puts the messages it had not handled
// back in the mailbox: they keep their headers.
func TestHeadersOutliveARestart(t *testing.T) {
	t.Parallel()
	n := startQuiet(t, quietConfig("n"))
	ch := make(chan seen, 100)
	gate := make(chan struct{})
	r, err := troupe.Spawn(n, "fragile", troupe.Supervise(func() troupe.Behavior[hdrMsg] {
		return troupe.Behavior[hdrMsg]{Receive: func(c *troupe.Context[hdrMsg], m hdrMsg) {
			switch m.N {
			case -1:
				<-gate // while the others arrive, to be handled in one go
				return
			case 0:
				panic("the first message breaks it")
			}
			ch <- seen{n: m.N, headers: troupe.HeadersFrom(c.Context())}
		}}
	}, troupe.RestartWithBackoff(50*time.Millisecond, time.Second, 0)))
	if err != nil {
		t.Fatal(err)
	}
	r.Tell(hdrMsg{N: -1})
	for i := range 5 {
		ctx := ctxFor(t)
		if i%2 == 1 {
			ctx = troupe.WithHeaders(ctx, troupe.Headers{"n": strconv.Itoa(i)})
		}
		if err := r.Send(ctx, hdrMsg{N: i}); err != nil {
			t.Fatal(err)
		}
	}
	close(gate)
	for i := 1; i < 5; i++ {
		s := within(t, ch, 5*time.Second, fmt.Sprintf("message %d", i))
		want := ""
		if i%2 == 1 {
			want = strconv.Itoa(i)
		}
		if s.n != i || s.headers.Get("n") != want {
			t.Fatalf("message %d arrived as %d with %v, want n=%q", i, s.n, s.headers, want)
		}
	}
}

type spanKey struct{}

// Config.OnSend adds to what a send carries; Config.OnReceive wraps the
// handler and chooses the context it sees. Tell calls neither.
func TestSendAndReceiveInterceptors(t *testing.T) {
	t.Parallel()
	sends := make(chan string, 10)
	cfg := quietConfig("traced")
	cfg.OnSend = func(ctx context.Context, to string, h troupe.Headers) {
		sends <- to
		if span, ok := ctx.Value(spanKey{}).(string); ok {
			h.Set("traceparent", span)
		}
	}
	order := make(chan string, 10)
	cfg.OnReceive = func(ctx context.Context, to string, h troupe.Headers, handle func(context.Context)) {
		order <- "before " + to
		handle(context.WithValue(ctx, spanKey{}, "child of "+h.Get("traceparent")))
		order <- "after"
	}
	n := startQuiet(t, cfg)
	ch := make(chan string, 10)
	r, err := troupe.Spawn(n, "svc", troupe.Behavior[hdrMsg]{Receive: func(c *troupe.Context[hdrMsg], m hdrMsg) {
		span, _ := c.Context().Value(spanKey{}).(string)
		ch <- fmt.Sprintf("%d %s %s", m.N, span, troupe.HeadersFrom(c.Context()).Get("traceparent"))
	}})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Send(context.WithValue(ctxFor(t), spanKey{}, "span-1"), hdrMsg{N: 1}); err != nil {
		t.Fatal(err)
	}
	if got := within(t, ch, 5*time.Second, "the handler"); got != "1 child of span-1 span-1" {
		t.Fatalf("the handler saw %q", got)
	}
	if to := within(t, sends, time.Second, "OnSend"); to != "/user/svc" {
		t.Fatalf("OnSend was told the target %q", to)
	}
	if got := within(t, order, 5*time.Second, "OnReceive") + ", " + within(t, order, 5*time.Second, "OnReceive's end"); got != "before /user/svc, after" {
		t.Fatalf("OnReceive ran as %v", got)
	}
	// A Send whose context has nothing for OnSend carries no headers: the
	// handler runs without OnReceive.
	r.Tell(hdrMsg{N: 2})
	if err := r.Send(ctxFor(t), hdrMsg{N: 3}); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"2  ", "3  "} {
		if got := within(t, ch, 5*time.Second, "the handler"); got != want {
			t.Fatalf("the handler saw %q, want %q", got, want)
		}
	}
	if len(sends) != 1 || len(order) != 0 {
		t.Fatalf("OnSend ran %d times for a Tell and a Send, want once (Tell calls it not); OnReceive %d times, want none (no headers)", len(sends), len(order)/2)
	}
}

// Headers past their bounds fail the send with ErrBadHeaders; the message
// is not sent and no dead letter is published.
func TestHeadersPastTheirBoundsAreRefused(t *testing.T) {
	t.Parallel()
	cfg := quietConfig("bounded")
	big := false
	cfg.OnSend = func(ctx context.Context, to string, h troupe.Headers) {
		if big {
			h.Set("baggage", strings.Repeat("x", 1024+1))
		}
	}
	n := startQuiet(t, cfg)
	there := startQuiet(t, quietConfig("there"))
	dead := make(chan troupe.DeadLetter, 10)
	troupe.SubscribeChan(n, dead)
	local, localSeen := spawnHeaderProbe(t, n, "probe")
	spawnHeaderProbe(t, there, "probe")
	remote := remoteRef[hdrMsg](t, n, there, "/user/probe")
	many := troupe.Headers{}
	for i := range 16 + 1 {
		many["k"+strconv.Itoa(i)] = "v"
	}
	cases := []struct {
		name string
		h    troupe.Headers
		big  bool
		says string
	}{
		{"seventeen headers", many, false, "17 headers"},
		{"an empty key", troupe.Headers{"": "v"}, false, "a key of 0 bytes"},
		{"a long key", troupe.Headers{strings.Repeat("k", 128+1): "v"}, false, "a key of 129 bytes"},
		{"too much in all", troupe.Headers{"a": strings.Repeat("v", 1000), "b": strings.Repeat("v", 1000), "c": strings.Repeat("v", 1000), "d": strings.Repeat("v", 1000), "e": strings.Repeat("v", 200)}, false, "4205 bytes"},
		{"a long value from OnSend", nil, true, "value of 1025 bytes"},
	}
	for _, c := range cases {
		big = c.big
		ctx := troupe.WithHeaders(ctxFor(t), c.h)
		for _, to := range []troupe.Ref[hdrMsg]{local, remote} {
			err := to.Send(ctx, hdrMsg{N: 1})
			if !errors.Is(err, troupe.ErrBadHeaders) || !strings.Contains(err.Error(), c.says) {
				t.Errorf("%s: Send to %s: %v, want ErrBadHeaders saying %q", c.name, to, err, c.says)
			}
			_, err = troupe.Ask(ctx, to, func(r troupe.Ref[string]) hdrMsg { return hdrMsg{N: 2, Reply: r} })
			if !errors.Is(err, troupe.ErrBadHeaders) {
				t.Errorf("%s: Ask of %s: %v, want ErrBadHeaders", c.name, to, err)
			}
		}
	}
	big = false
	// The node goes on: a message within bounds is delivered, and nothing
	// refused became a dead letter.
	if err := local.Send(troupe.WithHeaders(ctxFor(t), troupe.Headers{"k": strings.Repeat("v", 1024)}), hdrMsg{N: 9}); err != nil {
		t.Fatal(err)
	}
	if s := within(t, localSeen, 5*time.Second, "a message within bounds"); s.n != 9 {
		t.Fatalf("got %+v", s)
	}
	select {
	case d := <-dead:
		t.Fatalf("a refused send made a dead letter: %+v", d)
	default:
	}
}

// A panic in OnReceive is the actor's failure, as a panic in its handler
// is: an Ask waiting on it learns so at once.
func TestAPanicInOnReceiveIsTheActorsFailure(t *testing.T) {
	t.Parallel()
	cfg := quietConfig("n")
	cfg.OnReceive = func(ctx context.Context, to string, h troupe.Headers, handle func(context.Context)) {
		if h.Get("boom") != "" {
			panic("the interceptor broke")
		}
		handle(ctx)
	}
	n := startQuiet(t, cfg)
	r, _ := spawnHeaderProbe(t, n, "probe")
	ctx := troupe.WithHeaders(ctxFor(t), troupe.Headers{"boom": "1"})
	_, err := troupe.Ask(ctx, r, func(r troupe.Ref[string]) hdrMsg { return hdrMsg{Reply: r} })
	var ae *troupe.AskError
	var pe *troupe.PanicError
	if !errors.As(err, &ae) || !errors.As(err, &pe) || !strings.Contains(fmt.Sprint(pe.Value), "the interceptor broke") {
		t.Fatalf("Ask: %v, want an AskError with the panic", err)
	}
}

// Headers count towards MailboxBytes like the message they come with.
func TestHeadersCountTowardsMailboxBytes(t *testing.T) {
	t.Parallel()
	cfg := quietConfig("there")
	cfg.MailboxBytes = 16 << 10
	here, there := startQuiet(t, quietConfig("here")), startQuiet(t, cfg)
	gate, busy := make(chan struct{}), make(chan struct{}, 1)
	t.Cleanup(func() { close(gate) })
	if _, err := troupe.Spawn(there, "slow", troupe.Behavior[hdrMsg]{Receive: func(*troupe.Context[hdrMsg], hdrMsg) {
		select {
		case busy <- struct{}{}:
		default:
		}
		<-gate
	}}); err != nil {
		t.Fatal(err)
	}
	dead := make(chan troupe.DeadLetter, 64)
	troupe.SubscribeChan(there, dead)
	to := remoteRef[hdrMsg](t, here, there, "/user/slow")
	to.Tell(hdrMsg{})
	within(t, busy, 5*time.Second, "the actor busy") // so that what follows waits in its mailbox
	// 3 KiB of headers and a few bytes of message each: the sixth passes
	// the 16 KiB.
	ctx := troupe.WithHeaders(ctxFor(t), troupe.Headers{"a": strings.Repeat("a", 1000), "b": strings.Repeat("b", 1000), "c": strings.Repeat("c", 1000)})
	for i := range 8 {
		if err := to.Send(ctx, hdrMsg{N: i}); err != nil {
			t.Fatal(err)
		}
	}
	d := within(t, dead, 5*time.Second, "a dead letter past MailboxBytes")
	if !errors.Is(d.Reason, troupe.ErrMailboxFull) || !strings.Contains(d.Reason.Error(), "MailboxBytes") {
		t.Fatalf("dead letter %+v, want ErrMailboxFull naming MailboxBytes", d)
	}
}

// The interceptors run for user actors only: troupe's own requests (stats,
// lookups) carry no headers and go on whatever OnSend and OnReceive do.
func TestInterceptorsLeaveTroupesOwnActorsAlone(t *testing.T) {
	t.Parallel()
	cfg := func(name string) troupe.Config {
		c := quietConfig(name)
		c.OnSend = func(ctx context.Context, to string, h troupe.Headers) { h.Set("x", "1") }
		c.OnReceive = func(ctx context.Context, to string, h troupe.Headers, handle func(context.Context)) {
			panic("OnReceive refuses " + to)
		}
		return c
	}
	here, there := startQuiet(t, cfg("here")), startQuiet(t, cfg("there"))
	for range 2 {
		if _, err := here.FetchStats(ctxFor(t), there.Addrs()[0].String()); err != nil {
			t.Fatalf("FetchStats through interceptors that panic: %v", err)
		}
	}
	// A user actor does meet them.
	spawnHeaderProbe(t, there, "probe")
	_, err := troupe.Ask(ctxFor(t), remoteRef[hdrMsg](t, here, there, "/user/probe"), func(rr troupe.Ref[string]) hdrMsg { return hdrMsg{Reply: rr} })
	var ae *troupe.AskError
	if !errors.As(err, &ae) || !strings.Contains(err.Error(), "OnReceive refuses /user/probe") {
		t.Fatalf("an Ask of a user actor: %v, want the panic of OnReceive", err)
	}
}

// OnReceive gets a copy of the headers: what it changes is not the
// sender's (nor a race with it, under -race).
func TestOnReceiveChangesOnlyItsCopy(t *testing.T) {
	t.Parallel()
	cfg := quietConfig("n")
	cfg.OnReceive = func(ctx context.Context, to string, h troupe.Headers, handle func(context.Context)) {
		h.Set("seen-by", "receiver")
		handle(ctx)
	}
	n := startQuiet(t, cfg)
	r, ch := spawnHeaderProbe(t, n, "probe")
	ctx := troupe.WithHeaders(ctxFor(t), troupe.Headers{"trace": "t1"})
	for i := range 100 {
		if err := r.Send(ctx, hdrMsg{N: i}); err != nil {
			t.Fatal(err)
		}
		if h := troupe.HeadersFrom(ctx); len(h) != 1 {
			t.Fatalf("the sender's headers became %v", h)
		}
	}
	for i := range 100 {
		if s := within(t, ch, 5*time.Second, "a message"); s.headers.Get("seen-by") != "" || s.headers.Get("trace") != "t1" {
			t.Fatalf("message %d: the handler saw %v", i, s.headers)
		}
	}
}

// An OnReceive that does not call handle drops the message; one that
// calls it twice handles it once; the context it is given carries the
// headers.
func TestOnReceiveDecidesWhetherTheHandlerRuns(t *testing.T) {
	t.Parallel()
	cfg := quietConfig("n")
	cfg.OnReceive = func(ctx context.Context, to string, h troupe.Headers, handle func(context.Context)) {
		if troupe.HeadersFrom(ctx).Get("trace") != h.Get("trace") {
			panic("the context given to OnReceive lacks the headers")
		}
		switch h.Get("do") {
		case "drop":
		case "twice":
			handle(ctx)
			handle(ctx)
		default:
			handle(ctx)
		}
	}
	n := startQuiet(t, cfg)
	r, ch := spawnHeaderProbe(t, n, "probe")
	for i, do := range []string{"drop", "twice", "once"} {
		if err := r.Send(troupe.WithHeaders(ctxFor(t), troupe.Headers{"do": do, "trace": "t"}), hdrMsg{N: i}); err != nil {
			t.Fatal(err)
		}
	}
	r.Tell(hdrMsg{N: 9}) // no headers: no OnReceive
	var got []int
	for range 3 {
		got = append(got, within(t, ch, 5*time.Second, "a message").n)
	}
	if fmt.Sprint(got) != "[1 2 9]" {
		t.Fatalf("handled %v, want [1 2 9]", got)
	}
}

// A handler that forwards with Send(c.Context(), …) passes the headers on.
func TestForwardingWithSendKeepsTheHeaders(t *testing.T) {
	t.Parallel()
	a, b := startQuiet(t, quietConfig("a")), startQuiet(t, quietConfig("b"))
	_, ch := spawnHeaderProbe(t, b, "last")
	last := remoteRef[hdrMsg](t, a, b, "/user/last")
	fwd, err := troupe.Spawn(a, "fwd", troupe.Behavior[hdrMsg]{Receive: func(c *troupe.Context[hdrMsg], m hdrMsg) {
		last.Send(c.Context(), m)
	}})
	if err != nil {
		t.Fatal(err)
	}
	fwd.Tell(hdrMsg{N: 1})
	if err := fwd.Send(troupe.WithHeaders(ctxFor(t), troupe.Headers{"trace": "t2"}), hdrMsg{N: 2}); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"1 ", "2 t2"} {
		s := within(t, ch, 5*time.Second, "a forwarded message")
		if got := fmt.Sprint(s.n, " ", s.headers.Get("trace")); got != want {
			t.Fatalf("forwarded: %q, want %q", got, want)
		}
	}
}

// Headers is a TextMapCarrier (OpenTelemetry's propagation interface),
// without troupe importing it.
var _ interface {
	Get(key string) string
	Set(key, value string)
	Keys() []string
} = troupe.Headers{}
