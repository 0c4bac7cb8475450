package troupe

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"
)

type inner struct {
	Label string
	Tags  []string
}

type everything struct {
	B        bool
	I        int
	I8       int8
	I16      int16
	I32      int32
	I64      int64
	U        uint
	U8       uint8
	U16      uint16
	U32      uint32
	U64      uint64
	F32      float32
	F64      float64
	S        string
	Bytes    []byte
	NilBytes []byte
	Ints     []int
	Arr      [3]uint16
	M        map[string]int
	NilMap   map[string]int
	Nested   inner
	Ptr      *inner
	NilPtr   *inner
	When     time.Time
	Wait     time.Duration
	Reply    Ref[testPong]
	NoReply  Ref[testPong]
	hidden   int
}

type selfEncoded struct{ X, Y uint32 }

func (s selfEncoded) AppendWire(b []byte) []byte {
	return append(b, byte(s.X), byte(s.Y))
}

func (s *selfEncoded) UnmarshalWire(b []byte) error {
	if len(b) != 2 {
		return errors.New("want 2 bytes")
	}
	s.X, s.Y = uint32(b[0]), uint32(b[1])
	return nil
}

type holdsSelfEncoded struct {
	A selfEncoded
	B []selfEncoded
}

func init() {
	SetWireKey[everything]("troupe.test.everything")
	SetWireKey[selfEncoded]("troupe.test.self")
	SetWireKey[holdsSelfEncoded]("troupe.test.holds-self")
}

func sampleEverything() everything {
	return everything{
		B: true, I: -123456, I8: -8, I16: -1600, I32: 1 << 30, I64: math.MinInt64,
		U: 7, U8: 255, U16: 65535, U32: 1<<32 - 1, U64: math.MaxUint64,
		F32: 1.5, F64: math.Pi, S: "héllo", Bytes: []byte{0, 1, 2}, Ints: []int{-1, 0, 1},
		Arr: [3]uint16{1, 2, 3}, M: map[string]int{"a": 1}, Nested: inner{"n", []string{"x", ""}},
		Ptr: &inner{Label: "p"}, When: time.Date(2026, 11, 30, 12, 0, 0, 5, time.UTC), Wait: 1500 * time.Millisecond,
		Reply:  Ref[testPong]{h: &handle{key: refKey{path: "/user/sink", uuid: UUID{1, 2, 3}}}},
		hidden: 99,
	}
}

func TestCodecRoundTrip(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	in := sampleEverything()
	mt := typeOf(reflect.TypeFor[everything]())
	b, err := encodePayload(nil, mt, in)
	if err != nil {
		t.Fatal(err)
	}
	v, err := decodePayload(mt, b)
	if err != nil {
		t.Fatalf("decode: %v", err)
	}
	out := v.(everything)
	if out.Reply.h == nil || out.Reply.h.key.path != "/user/sink" || out.Reply.h.key.uuid != in.Reply.h.key.uuid {
		t.Fatalf("ref field did not survive: %+v", out.Reply.h)
	}
	if !out.NoReply.IsZero() {
		t.Fatalf("zero ref decoded as %v", out.NoReply)
	}
	if out.hidden != 0 {
		t.Errorf("unexported field crossed the wire")
	}
	if out.NilBytes != nil || out.NilMap != nil || out.NilPtr != nil || out.Bytes == nil {
		t.Errorf("nil-ness not kept: %#v %#v %#v %#v", out.NilBytes, out.NilMap, out.NilPtr, out.Bytes)
	}
	in.Reply, out.Reply, in.hidden = Ref[testPong]{}, Ref[testPong]{}, 0
	if !reflect.DeepEqual(in, out) {
		t.Fatalf("round trip:\n got %+v\nwant %+v", out, in)
	}
}

func TestCodecFastPath(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	for _, v := range []any{selfEncoded{X: 3, Y: 4}, holdsSelfEncoded{A: selfEncoded{1, 2}, B: []selfEncoded{{5, 6}}}} {
		mt := typeOf(reflect.TypeOf(v))
		b, err := encodePayload(nil, mt, v)
		if err != nil {
			t.Fatal(err)
		}
		got, err := decodePayload(mt, b)
		if err != nil || !reflect.DeepEqual(got, v) {
			t.Errorf("round trip of %#v = %#v, %v", v, got, err)
		}
	}
	if b, _ := encodePayload(nil, typeOf(reflect.TypeFor[selfEncoded]()), selfEncoded{X: 9, Y: 8}); !bytes.Equal(b, []byte{9, 8}) {
		t.Errorf("fast path payload = %x, want 0908", b)
	}
}

func TestSetWireKeyRejects(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	type withChan struct{ C chan int }
	type withIface struct{ V any }
	type ok struct{ N int }
	tests := []struct {
		name string
		t    reflect.Type
		key  string
		want string
	}{
		{"empty key", reflect.TypeFor[ok](), "", "1 to 255 bytes"},
		{"chan field", reflect.TypeFor[withChan](), "k.chan", "cannot cross the wire"},
		{"interface field", reflect.TypeFor[withIface](), "k.iface", "cannot cross the wire"},
		{"key taken", reflect.TypeFor[ok](), "troupe.test.ping", "already the wire key of"},
		{"type taken", reflect.TypeFor[testPing](), "other.key", "already has the wire key"},
	}
	for _, tt := range tests {
		err := registerType(tt.t, tt.key, nil)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: registerType = %v, want an error mentioning %q", tt.name, err, tt.want)
		}
	}
	if err := registerType(reflect.TypeFor[testPing](), "troupe.test.ping", nil); err != nil {
		t.Errorf("registering the same pair again: %v", err)
	}
}

func TestDecodeRejectsHostileLengths(t *testing.T) {
	// Not beside other tests: it measures the process's heap, goroutines or
	// allocations, which tests running beside it would change.
	mt := typeOf(reflect.TypeFor[everything]())
	good, _ := encodePayload(nil, mt, sampleEverything())
	for cut := range len(good) {
		if _, err := decodePayload(mt, good[:cut]); !errors.Is(err, ErrMalformed) {
			t.Fatalf("truncated at %d: err = %v, want ErrMalformed", cut, err)
		}
	}
	// A slice claiming 2^60 elements must fail before allocating.
	type many struct{ X []uint64 }
	if err := registerType(reflect.TypeFor[many](), "troupe.test.many", nil); err != nil {
		t.Fatal(err)
	}
	huge := []byte{0x81, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x10}
	allocs := testing.AllocsPerRun(10, func() {
		if _, err := decodePayload(typeOf(reflect.TypeFor[many]()), huge); !errors.Is(err, ErrMalformed) {
			t.Fatalf("huge count: %v", err)
		}
	})
	if allocs > 64 { // error formatting only; never the claimed 2^60 elements
		t.Fatalf("decoding a hostile count made %v allocations", allocs)
	}
	if _, err := decodePayload(mt, append(good, 0)); !errors.Is(err, ErrMalformed) {
		t.Fatalf("trailing byte: %v", err)
	}
}

type deep struct{ Next *deep }

func TestDecodeDepthLimit(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	if err := registerType(reflect.TypeFor[deep](), "troupe.test.deep", nil); err != nil {
		t.Fatal(err)
	}
	b := bytes.Repeat([]byte{1}, 10000)
	b = append(b, 0)
	if _, err := decodePayload(typeOf(reflect.TypeFor[deep]()), b); !errors.Is(err, ErrMalformed) {
		t.Fatalf("deep nesting: %v, want ErrMalformed", err)
	}
}

func FuzzDecodePayload(f *testing.F) {
	mt := typeOf(reflect.TypeFor[everything]())
	good, _ := encodePayload(nil, mt, sampleEverything())
	f.Add(good)
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		v, err := decodePayload(mt, b)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v does not wrap ErrMalformed", err)
			}
			return
		}
		again, err := encodePayload(nil, mt, v)
		if err != nil {
			t.Fatalf("re-encode: %v", err)
		}
		if _, err := decodePayload(mt, again); err != nil {
			t.Fatalf("decoding the re-encoding of %x: %v", b, err)
		}
	})
}

func TestDecodeAmplificationIsBounded(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	slowTest(t)
	type strMap struct{ M map[string]string }
	type strs struct{ S []string }
	SetWireKey[strMap]("troupe.test.strmap")
	SetWireKey[strs]("troupe.test.strs")
	// A map of empty strings: two wire bytes an entry, ~66 bytes decoded.
	m := strMap{M: map[string]string{}}
	for i := range 200_000 {
		m.M[fmt.Sprint(i)] = ""
	}
	mt := typeOf(reflect.TypeFor[strMap]())
	b, err := encodePayload(nil, mt, m)
	if err != nil {
		t.Fatal(err)
	}
	// n entries of ("", ""), written by hand: a real map cannot hold
	// repeated keys, and the receiver must refuse before it finds out.
	n := 2_000_000
	raw := binary.AppendUvarint(nil, uint64(n)+1)
	raw = append(raw, make([]byte, 2*n)...)
	if _, err := decodePayload(mt, raw); !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), "allocate") {
		t.Fatalf("a 4 MB map of empty strings: %v, want refused for its allocation", err)
	}
	if _, err := decodePayload(mt, b); err != nil {
		t.Fatalf("an ordinary map: %v", err)
	}
	// A slice of empty strings (16 bytes of header per wire byte) fits.
	raw = binary.AppendUvarint(nil, uint64(n)+1)
	raw = append(raw, make([]byte, n)...)
	v, err := decodePayload(typeOf(reflect.TypeFor[strs]()), raw)
	if err != nil || len(v.(strs).S) != n {
		t.Fatalf("a slice of %d empty strings: %v", n, err)
	}
}

// encodePayload and decodePayload are one-shot forms of the codec, with
// refs relative to no node.
func encodePayload(dst []byte, mt *msgType, msg any) ([]byte, error) {
	var e encoder
	return e.payload(dst, mt, msg)
}

func decodePayload(mt *msgType, b []byte) (any, error) {
	var d decoder
	return d.payload(mt, b)
}

// A pointer's flag is 0 (nil) or 1 (a value follows): anything else is
// refused.
func TestAPointerFlagOtherThanZeroOrOneIsRefused(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	mt := typeOf(reflect.TypeFor[withPtr]())
	for flag, want := range map[byte]string{0: "", 1: "", 2: "pointer flag is not 0 or 1"} {
		b := []byte{flag}
		if flag == 1 {
			b = binary.AppendVarint(b, 42)
		}
		v, err := decodePayload(mt, b)
		switch {
		case want == "" && err != nil:
			t.Errorf("flag %d: %v", flag, err)
		case want != "" && (err == nil || !strings.Contains(err.Error(), want)):
			t.Errorf("flag %d: %+v, %v; want an error saying %q", flag, v, err, want)
		case flag == 1 && (v.(withPtr).P == nil || *v.(withPtr).P != 42):
			t.Errorf("flag 1: %+v", v)
		}
	}
}

type withPtr struct{ P *int64 }

func init() { SetWireKey[withPtr]("troupe.test.withptr") }

// The cache in front of the type-word map answers every registered type
// with its own entry, whichever types share its slots, in any order and
// from many goroutines at once; a type is kept in one of its two slots
// unless both hold others.
func TestTheTypeCacheAnswersEveryType(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	all := *wireTypes.byWord.Load()
	slots := map[uint64]int{}
	shared := 0
	for w := range all {
		s := typeSlot(w) &^ 1
		if slots[s]++; slots[s] == 3 {
			shared++
		}
	}
	if shared == 0 {
		t.Fatalf("no three of the %d registered types share a pair of slots: the test proves nothing", len(all))
	}
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 3 {
				for w, mt := range all {
					if got := typeOfWord(w); got != mt {
						t.Errorf("typeOfWord gave %v for %s", got, mt.key)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	for w, mt := range all {
		i := typeSlot(w)
		a, b := typeCache[i].Load(), typeCache[i^1].Load()
		if a != mt && b != mt && (a == nil || b == nil) {
			t.Fatalf("%s is in neither of its slots, and one is free", mt.key)
		}
	}
	var unknown int
	if typeOfWord(unsafe.Pointer(&unknown)) != nil {
		t.Fatal("a word no type has was given a type")
	}
}

type namedByte uint8

type byteArrays struct {
	A   [4]byte
	L   [][4]byte
	N   [2]namedByte
	UID NodeUID
}

func init() { SetWireKey[byteArrays]("troupe.test.byte-arrays") }

// An array of bytes is its bytes, whether the encoder reaches it in a
// struct passed by value (one byte at a time) or in a slice (copied
// whole), and decodes back the same.
func TestByteArraysEncodeAsTheirBytes(t *testing.T) {
	t.Parallel()
	in := byteArrays{A: [4]byte{1, 2, 3, 4}, L: [][4]byte{{5, 6, 7, 8}, {9, 10, 11, 12}}, N: [2]namedByte{13, 14}, UID: NodeUID{15, 16}}
	mt := typeOf(reflect.TypeFor[byteArrays]())
	b, err := encodePayload(nil, mt, in)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range [][]byte{{1, 2, 3, 4}, {5, 6, 7, 8, 9, 10, 11, 12}, {13, 14, 15, 16, 0, 0}} {
		if !bytes.Contains(b, want) {
			t.Errorf("encoding % x does not hold % x", b, want)
		}
	}
	v, err := decodePayload(mt, b)
	if err != nil {
		t.Fatalf("decode: %v", err)
	}
	if !reflect.DeepEqual(v, in) {
		t.Fatalf("round trip:\n got %+v\nwant %+v", v, in)
	}
	if _, err := decodePayload(mt, b[:len(b)-1]); err == nil {
		t.Fatal("a payload one byte short decoded")
	}
}
