// Command tracing follows one request across three troupe nodes by its
// trace id, the way a tracer such as OpenTelemetry would: a gateway asks
// an orders service, which asks a stock service, each on its own node.
// Config.OnSend writes the current span into the message's headers as a
// W3C traceparent; Config.OnReceive reads it on the other node, starts a
// child span and hands it to the handler in its context, so every log
// line carries the same trace id. No tracing library is needed for this;
// with OpenTelemetry, OnSend and OnReceive call its propagator instead
// (troupe.Headers is a propagation.TextMapCarrier).
//
// Run it with: go run ./examples/tracing
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log"
	"log/slog"
	"os"
	"strings"
	"time"

	"troupe"
)

// Order asks for an order to be placed; Reserve asks for stock. Both
// cross the wire, with the ref to answer to inside.
type Order struct {
	Item    string
	ReplyTo troupe.Ref[string]
}

type Reserve struct {
	Item    string
	ReplyTo troupe.Ref[string]
}

func init() {
	troupe.SetWireKey[Order]("tracing.order")
	troupe.SetWireKey[Reserve]("tracing.reserve")
}

// span is the current span of a request: its trace, its own id and its
// parent's. It lives in a context.Context, as a tracer's does.
type span struct{ trace, id, parent string }

type spanKey struct{}

func spanFrom(ctx context.Context) span { s, _ := ctx.Value(spanKey{}).(span); return s }

func newID(bytes int) string {
	b := make([]byte, bytes)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// inject is Config.OnSend: the span of the sending context goes with the
// message as a traceparent header ("00-trace-span-01").
func inject(ctx context.Context, to string, h troupe.Headers) {
	if s := spanFrom(ctx); s.trace != "" {
		h.Set("traceparent", "00-"+s.trace+"-"+s.id+"-01")
	}
}

// extract is Config.OnReceive: a message with a traceparent is handled in
// a child span of the sender's.
func extract(ctx context.Context, to string, h troupe.Headers, handle func(context.Context)) {
	if f := strings.Split(h.Get("traceparent"), "-"); len(f) == 4 {
		ctx = context.WithValue(ctx, spanKey{}, span{trace: f[1], id: newID(8), parent: f[2]})
	}
	handle(ctx)
}

// logged logs what a handler does with its span's ids.
func logged(ctx context.Context, l *slog.Logger, msg string) {
	s := spanFrom(ctx)
	l.Info(msg, "trace_id", s.trace, "span_id", s.id, "parent_id", s.parent)
}

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := run(ctx, os.Stdout); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context, w io.Writer) error {
	// One log for the three nodes, without times (each line says which
	// node it is from).
	logger := slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
		if a.Key == slog.TimeKey {
			return slog.Attr{}
		}
		return a
	}}))
	start := func(name string) (*troupe.Node, error) {
		return troupe.Start(ctx, troupe.Config{Name: name, Listen: []string{"tcp://127.0.0.1:0"},
			Logger: logger, OnSend: inject, OnReceive: extract})
	}
	var nodes []*troupe.Node
	defer func() {
		for _, n := range nodes {
			n.Close()
		}
	}()
	for _, name := range []string{"gateway", "orders", "stock"} {
		n, err := start(name)
		if err != nil {
			return err
		}
		nodes = append(nodes, n)
	}
	gateway, orders, stock := nodes[0], nodes[1], nodes[2]

	// The stock service answers at once.
	if _, err := troupe.Spawn(stock, "stock", troupe.Behavior[Reserve]{Receive: func(c *troupe.Context[Reserve], m Reserve) {
		logged(c.Context(), c.Log(), "reserved "+m.Item)
		m.ReplyTo.Tell("reserved")
	}}); err != nil {
		return err
	}
	stockRef, err := troupe.Resolve[Reserve](ctx, orders, troupe.FormatRef(stock.Addrs()[0], "/user/stock"))
	if err != nil {
		return err
	}

	// The orders service asks the stock service, with its handler's
	// context: the span goes on. (A real service would not block its
	// actor on a remote call; it keeps the example short.)
	if _, err := troupe.Spawn(orders, "orders", troupe.Behavior[Order]{Receive: func(c *troupe.Context[Order], m Order) {
		logged(c.Context(), c.Log(), "placing an order for "+m.Item)
		answer, err := troupe.Ask(c.Context(), stockRef, func(r troupe.Ref[string]) Reserve { return Reserve{Item: m.Item, ReplyTo: r} })
		if err != nil {
			answer = err.Error()
		}
		m.ReplyTo.Tell("order placed, stock " + answer)
	}}); err != nil {
		return err
	}
	ordersRef, err := troupe.Resolve[Order](ctx, gateway, troupe.FormatRef(orders.Addrs()[0], "/user/orders"))
	if err != nil {
		return err
	}

	// The gateway starts the trace, as it would for an incoming request.
	root := span{trace: newID(16), id: newID(8)}
	reqCtx := context.WithValue(ctx, spanKey{}, root)
	logged(reqCtx, logger.With("node", gateway.Name()), "request for a book")
	answer, err := troupe.Ask(reqCtx, ordersRef, func(r troupe.Ref[string]) Order { return Order{Item: "book", ReplyTo: r} })
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "gateway: %s (trace %s)\n", answer, root.trace)
	return nil
}
