package troupe

import (
	"bytes"
	"encoding/binary"
	"errors"
	"reflect"
	"strings"
	"testing"
)

// TestParseHeaders: headers a peer sends are held to the same bounds as
// those this node sends; past them, or doubled, they are malformed.
func TestParseHeaders(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	enc := func(count int, kv ...string) []byte {
		b := binary.AppendUvarint(nil, uint64(count))
		for _, s := range kv {
			b = appendString(b, s)
		}
		return append(b, 0xee) // the tell fields that follow
	}
	many := func(n int) []string {
		var kv []string
		for i := range n {
			kv = append(kv, string(rune('a'+i%26))+strings.Repeat("k", i/26), "v")
		}
		return kv
	}
	cases := []struct {
		name string
		in   []byte
		err  string // "" parses
	}{
		{"one", enc(1, "traceparent", "00-ab"), ""},
		{"sixteen", enc(16, many(16)...), ""},
		{"an empty value", enc(1, "k", ""), ""},
		{"none", enc(0), "0 headers"},
		{"seventeen", enc(17, many(17)...), "17 headers"},
		{"a huge count", binary.AppendUvarint(nil, 1<<40), "headers (1 to 16)"},
		{"an empty key", enc(1, "", "v"), "a 0-byte key"},
		{"a long key", enc(1, strings.Repeat("k", maxHeaderKey+1), "v"), "a 129-byte key"},
		{"a long value", enc(1, "k", strings.Repeat("v", maxHeaderValue+1)), "a 1025-byte value"},
		{"too much in all", enc(5, "a", strings.Repeat("v", 1000), "b", strings.Repeat("v", 1000), "c", strings.Repeat("v", 1000), "d", strings.Repeat("v", 1000), "e", strings.Repeat("v", 100)), "more than 4096 bytes"},
		{"a key twice", enc(2, "k", "1", "k", "2"), "twice"},
		{"truncated", enc(2, "k", "1")[:6], "bad uvarint"},
		{"no count at all", nil, "bad uvarint"},
	}
	for _, c := range cases {
		h, rest, err := parseHeaders(c.in)
		if c.err == "" {
			if err != nil || !bytes.Equal(rest, []byte{0xee}) {
				t.Errorf("%s: %v, rest %x", c.name, err, rest)
			}
			if again, _, err := parseHeaders(append(appendHeaders(nil, h), 0xee)); err != nil || len(again) != len(h) {
				t.Errorf("%s: encoded again: %v, %v", c.name, again, err)
			}
			continue
		}
		if !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), c.err) {
			t.Errorf("%s: %v, want ErrMalformed saying %q", c.name, err, c.err)
		}
	}
}

// A peer that does not announce headers in its hello (an older troupe)
// gets a plain tell: the message without its headers, rather than a frame
// it would take for malformed.
func TestAPeerWithoutHeadersGetsAPlainTell(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	uid := NodeUID{1}
	target := &handle{key: refKey{node: uid, path: "/user/echo", uuid: UUID{2}}}
	for _, takes := range []bool{false, true} {
		a := newAssoc(nil, true, tcpAddr("127.0.0.1:7001"))
		a.n = &Node{cfg: Config{MaxFrameSize: defaultMaxFrameSize}}
		a.peer.uid, a.peer.headers = uid, takes
		if err := a.sendTellHeadersLocked(target, typeOf(reflect.TypeFor[count]()), count{N: 1}, Headers{"trace": "x"}); err != nil {
			t.Fatal(err)
		}
		var kinds []frameKind
		out := a.out.take()
		out.each(func(f []byte) bool { kinds = append(kinds, frameKind(f[frameBodyAt(f)])); return true })
		want := frameTell
		if takes {
			want = frameTellHeaders
		}
		if len(kinds) != 1 || kinds[0] != want {
			t.Errorf("a peer that takes headers: %v; frames %v, want one %v", takes, kinds, want)
		}
	}
}
