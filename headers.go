package troupe

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync/atomic"
)

// Message headers: a few key/value pairs that travel with a message, taken
// from the sender's context.Context and put into the handler's, so that a
// trace (W3C traceparent, a request id) follows a request across nodes.
// Config.OnSend and Config.OnReceive let a tracer (OpenTelemetry, or a
// dozen lines of one's own) take part without troupe depending on it.

// Headers are a message's metadata: key/value pairs carried with it to the
// handler, on this node or another. A message carries at most 16 of
// them, keys of 1 to 128 bytes, values of at most 1 KiB, 4 KiB in all; a
// send with more fails with [ErrBadHeaders].
//
// Headers has the Get, Set and Keys methods of OpenTelemetry's
// propagation.TextMapCarrier, so a propagator injects into and extracts
// from it directly.
type Headers map[string]string

// Bounds of a message's headers.
const (
	maxHeaders     = 16
	maxHeaderKey   = 128
	maxHeaderValue = 1 << 10
	maxHeadersSize = 4 << 10
)

// ErrBadHeaders is the error of a send whose headers break their bounds
// (see [Headers]). The message is not sent, and no dead letter is
// published: the caller still holds it.
var ErrBadHeaders = errors.New("troupe: bad message headers")

// Get returns the value of key, or "".
func (h Headers) Get(key string) string { return h[key] }

// Set sets key to value (h must not be nil).
func (h Headers) Set(key, value string) { h[key] = value }

// Keys returns the keys, sorted.
func (h Headers) Keys() []string { return slices.Sorted(maps.Keys(h)) }

// headersKey is the context key of the headers a context carries.
type headersKey struct{}

// headersUsed is set once any context has been given headers, so that a
// program that never uses them does not look for them in each send's
// context.
var headersUsed atomic.Bool

// WithHeaders returns a copy of ctx that carries h, over any headers ctx
// carries already (a key in both takes h's value). [Ref.Send] and [Ask]
// send a context's headers with the message; the handler's
// [Context.Context] carries them (read them with [HeadersFrom]), so that
// a handler that sends or asks with it passes them along. h is copied:
// changing it afterwards changes nothing sent.
func WithHeaders(ctx context.Context, h Headers) context.Context {
	if len(h) == 0 {
		return ctx
	}
	headersUsed.Store(true)
	old, _ := ctx.Value(headersKey{}).(Headers)
	merged := make(Headers, len(old)+len(h))
	maps.Copy(merged, old)
	maps.Copy(merged, h)
	return context.WithValue(ctx, headersKey{}, merged)
}

// HeadersFrom returns a copy of the headers ctx carries, or nil.
func HeadersFrom(ctx context.Context) Headers {
	h, _ := ctx.Value(headersKey{}).(Headers)
	return maps.Clone(h)
}

// checkHeaders says how h breaks the bounds, if it does.
func checkHeaders(h Headers) error {
	if len(h) > maxHeaders {
		return fmt.Errorf("%w: %d headers, at most %d", ErrBadHeaders, len(h), maxHeaders)
	}
	total := 0
	for k, v := range h {
		if len(k) == 0 || len(k) > maxHeaderKey {
			return fmt.Errorf("%w: a key of %d bytes (1 to %d)", ErrBadHeaders, len(k), maxHeaderKey)
		}
		if len(v) > maxHeaderValue {
			return fmt.Errorf("%w: %q has a value of %d bytes, at most %d", ErrBadHeaders, k, len(v), maxHeaderValue)
		}
		total += len(k) + len(v)
	}
	if total > maxHeadersSize {
		return fmt.Errorf("%w: %d bytes, at most %d", ErrBadHeaders, total, maxHeadersSize)
	}
	return nil
}

// userPath reports whether path is a user actor's (or its adapter's):
// only those take headers.
func userPath(path string) bool { return strings.HasPrefix(path, "/user/") }

// headersSize bounds the encoded size of h.
func headersSize(h Headers) int {
	size := binary.MaxVarintLen32
	for k, v := range h {
		size += 2*binary.MaxVarintLen32 + len(k) + len(v)
	}
	return size
}

// appendHeaders appends h (not empty, within its bounds) as a tell with
// headers carries them: a count, then each key and value, keys sorted.
func appendHeaders(b []byte, h Headers) []byte {
	b = binary.AppendUvarint(b, uint64(len(h)))
	var keys [maxHeaders]string
	ks := keys[:0]
	for k := range h {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	for _, k := range ks {
		b = appendString(b, k)
		b = appendString(b, h[k])
	}
	return b
}

// parseHeaders reads the headers at the front of a tell with headers and
// returns them with the rest of the body. Headers past their bounds, an
// empty key or a key twice are malformed.
func parseHeaders(b []byte) (Headers, []byte, error) {
	d := decoder{b: b}
	count := d.uvarint()
	if d.err != nil {
		return nil, nil, d.err
	}
	if count == 0 || count > maxHeaders {
		return nil, nil, fmt.Errorf("%w: %d headers (1 to %d)", ErrMalformed, count, maxHeaders)
	}
	h := make(Headers, count)
	total := 0
	for range count {
		k, v := d.bytes(), d.bytes()
		if d.err != nil {
			return nil, nil, d.err
		}
		// The bounds before the strings are made.
		if len(k) == 0 || len(k) > maxHeaderKey || len(v) > maxHeaderValue {
			return nil, nil, fmt.Errorf("%w: a header of a %d-byte key and a %d-byte value (keys 1 to %d bytes, values at most %d)", ErrMalformed, len(k), len(v), maxHeaderKey, maxHeaderValue)
		}
		if total += len(k) + len(v); total > maxHeadersSize {
			return nil, nil, fmt.Errorf("%w: more than %d bytes of headers", ErrMalformed, maxHeadersSize)
		}
		if _, dup := h[string(k)]; dup {
			return nil, nil, fmt.Errorf("%w: the header %q twice", ErrMalformed, k)
		}
		h[headerKey(k)] = string(v)
	}
	return h, b[d.off:], nil
}

// headerKey returns k as a string, without a copy for the keys W3C trace
// context and baggage use.
func headerKey(k []byte) string {
	switch string(k) { // (compared without a copy)
	case "traceparent":
		return "traceparent"
	case "tracestate":
		return "tracestate"
	case "baggage":
		return "baggage"
	}
	return string(k)
}

// heldHeaders are the headers of an actor's message, known by its index:
// how many user messages entered the mailbox before it. They wait beside
// the mailbox (cellMore.hdrs), then beside the batch being handled
// (actorTools.hdrs), in the order of their index.
type heldHeaders struct {
	at uint64
	h  Headers
}

// headersOf returns the headers of the message with index at, the next to
// be handled, and forgets them (and any of messages before it).
func (t *actorTools[T]) headersOf(at uint64) Headers {
	for len(t.hdrs) > 0 && t.hdrs[0].at <= at {
		held := t.hdrs[0]
		t.hdrs[0] = heldHeaders{}
		t.hdrs = t.hdrs[1:]
		if held.at == at {
			return held.h
		}
	}
	return nil
}

// outHeaders returns the headers a send to h with ctx carries: ctx's,
// with what onSend (Config.OnSend) adds; nil for none. It costs nothing to a
// program that uses neither.
func outHeaders(ctx context.Context, onSend func(context.Context, string, Headers), h *handle) (Headers, error) {
	if onSend == nil && !headersUsed.Load() || ctx == nil || !userPath(h.key.path) {
		return nil, nil // (troupe's own actors take none, and run no interceptor)
	}
	hd, _ := ctx.Value(headersKey{}).(Headers)
	if onSend != nil {
		hd = maps.Clone(hd)
		if hd == nil {
			hd = make(Headers, 2)
		}
		onSend(ctx, h.key.path, hd)
	}
	if len(hd) == 0 {
		return nil, nil
	}
	if err := checkHeaders(hd); err != nil {
		return nil, err
	}
	return hd, nil
}
