package troupe

import (
	"bytes"
	"encoding/binary"
	"errors"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"time"
)

// Versions of message types, as two releases of a service would have them.
type (
	shPart   struct{ P int }
	shPartV2 struct {
		Z bool
		P int
	}
	shOld struct {
		ID   int
		Name string
	}
	shNew struct {
		ID    int
		Extra []string
		Name  string
		More  map[string]int
	}
	shNoName  struct{ ID int }
	shSwapped struct {
		Name string
		ID   int
	}
	shNestV2 struct {
		In   shPartV2
		List []shPartV2
		M    map[string]shPartV2
		Ptr  *shPartV2
		Arr  [2]shPartV2
	}
	shNest struct {
		In   shPart
		List []shPart
		M    map[string]shPart
		Ptr  *shPart
		Arr  [2]shPart
	}
	shListV2 struct {
		V     int
		Extra string
		Next  *shListV2
	}
	shList struct {
		V    int
		Next *shList
	}
	shNarrow  struct{ N int32 }
	shWide    struct{ N int64 }
	shCodeStr struct{ Code string }
	shCodeInt struct{ Code int64 }
	shInStr   struct{ In shCodeStr }
	shInInt   struct{ In shCodeInt }
	shSeq     struct{ In []shPart }
	shRefsV2  struct {
		When time.Time
		X    int
		R    Ref[testPong]
		E    struct{}
		Es   []struct{}
	}
	shRefs struct {
		R    Ref[testPong]
		When time.Time
	}
	shKeysV2 struct{ M map[shPartV2]int }
	shKeys   struct{ M map[shPart]int }
)

func init() {
	for i, v := range []any{shOld{}, shNew{}, shNoName{}, shSwapped{}, shNestV2{}, shNest{}, shListV2{}, shList{},
		shNarrow{}, shWide{}, shCodeStr{}, shCodeInt{}, shInStr{}, shInInt{}, shSeq{}, shRefsV2{}, shRefs{}, shKeysV2{}, shKeys{}} {
		if err := registerType(reflect.TypeOf(v), "troupe.test.shape."+string(rune('a'+i)), nil); err != nil {
			panic(err)
		}
	}
}

// sendAs encodes msg (its own type's shape) and decodes it as a value of
// type T through the conversion a receiver of T builds, as a session
// does when the shapes differ.
func sendAs[T any](t *testing.T, msg any) (T, error) {
	t.Helper()
	var zero T
	from := typeOf(reflect.TypeOf(msg))
	to := typeOf(reflect.TypeFor[T]())
	b, err := encodePayload(nil, from, msg)
	if err != nil {
		t.Fatal(err)
	}
	rs, err := parseShape(from.shape)
	if err != nil {
		t.Fatalf("the shape of %T does not parse: %v", msg, err)
	}
	c, err := buildConv(rs, to.t)
	if err != nil {
		return zero, err
	}
	var d decoder
	v, err := d.convert(to, c, b)
	if err != nil {
		return zero, err
	}
	return v.(T), nil
}

// The rules of a rolling upgrade, one per case: fields are matched by
// name, a field only the sender has is skipped, one only the receiver
// has keeps its zero value, and the same holds inside nested structs,
// slices, maps, pointers, arrays and recursive types.
func TestShapesMatchFieldsByName(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	t.Run("added fields are skipped", func(t *testing.T) {
		got, err := sendAs[shOld](t, shNew{ID: 7, Extra: []string{"a", "b"}, Name: "n", More: map[string]int{"x": 1}})
		if err != nil || got != (shOld{ID: 7, Name: "n"}) {
			t.Fatalf("%+v, %v", got, err)
		}
	})
	t.Run("removed fields keep their zero value", func(t *testing.T) {
		got, err := sendAs[shOld](t, shNoName{ID: 7})
		if err != nil || got != (shOld{ID: 7}) {
			t.Fatalf("%+v, %v", got, err)
		}
	})
	t.Run("reordered fields", func(t *testing.T) {
		got, err := sendAs[shOld](t, shSwapped{Name: "n", ID: 7})
		if err != nil || got != (shOld{ID: 7, Name: "n"}) {
			t.Fatalf("%+v, %v", got, err)
		}
	})
	t.Run("nested structs, slices, maps, pointers, arrays", func(t *testing.T) {
		p := shPartV2{Z: true, P: 3}
		got, err := sendAs[shNest](t, shNestV2{In: p, List: []shPartV2{p, {P: 4}}, M: map[string]shPartV2{"k": p}, Ptr: &p, Arr: [2]shPartV2{p, {P: 5}}})
		want := shNest{In: shPart{3}, List: []shPart{{3}, {4}}, M: map[string]shPart{"k": {3}}, Ptr: &shPart{3}, Arr: [2]shPart{{3}, {5}}}
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Fatalf("%+v, %v", got, err)
		}
		back, err := sendAs[shNestV2](t, want)
		wantBack := shNestV2{In: shPartV2{P: 3}, List: []shPartV2{{P: 3}, {P: 4}}, M: map[string]shPartV2{"k": {P: 3}}, Ptr: &shPartV2{P: 3}, Arr: [2]shPartV2{{P: 3}, {P: 5}}}
		if err != nil || !reflect.DeepEqual(back, wantBack) {
			t.Fatalf("back: %+v, %v", back, err)
		}
	})
	t.Run("a recursive type", func(t *testing.T) {
		got, err := sendAs[shList](t, shListV2{V: 1, Extra: "x", Next: &shListV2{V: 2, Next: &shListV2{V: 3, Extra: "y"}}})
		want := shList{V: 1, Next: &shList{V: 2, Next: &shList{V: 3}}}
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Fatalf("%+v, %v", got, err)
		}
	})
	t.Run("refs, times and empty structs", func(t *testing.T) {
		when := time.Date(2026, 12, 2, 1, 0, 0, 0, time.UTC)
		got, err := sendAs[shRefs](t, shRefsV2{When: when, X: 9, Es: make([]struct{}, 500)})
		if err != nil || !got.When.Equal(when) || !got.R.IsZero() {
			t.Fatalf("%+v, %v", got, err)
		}
	})
	t.Run("a widened integer", func(t *testing.T) {
		got, err := sendAs[shWide](t, shNarrow{N: -5})
		if err != nil || got.N != -5 {
			t.Fatalf("%+v, %v", got, err)
		}
		if got, err := sendAs[shNarrow](t, shWide{N: 1 << 20}); err != nil || got.N != 1<<20 {
			t.Fatalf("narrowed, fitting: %+v, %v", got, err)
		}
		_, err = sendAs[shNarrow](t, shWide{N: 1 << 40})
		if !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), "field N") || !strings.Contains(err.Error(), "overflows") {
			t.Fatalf("narrowed, overflowing: %v", err)
		}
	})
}

// A field whose kind changed cannot be matched: the error names it.
func TestShapesRefuseAChangedKind(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	for _, tc := range []struct {
		name string
		conv func() error
		want string
	}{
		{"string to int64", func() error { _, err := sendAs[shCodeInt](t, shCodeStr{Code: "x"}); return err }, "field Code: the sender's is string, this node's int64"},
		{"nested", func() error { _, err := sendAs[shInInt](t, shInStr{}); return err }, "field In: field Code"},
		{"struct to slice", func() error { _, err := sendAs[shSeq](t, shNest{}); return err }, "field In: the sender's is a struct"},
		{"a map's key type", func() error { _, err := sendAs[shKeys](t, shKeysV2{}); return err }, "field M: the map's key type changed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.conv()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("%v, want an error saying %q", err, tc.want)
			}
		})
	}
}

// Types of the same shape under other names have the same shape bytes:
// a receiver decodes them as always, with no conversion.
func TestEqualShapesAreTheSameBytes(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	type renamed struct {
		ID   int
		Name string
	}
	if !bytes.Equal(shapeOf(reflect.TypeFor[shOld]()), shapeOf(reflect.TypeFor[renamed]())) {
		t.Fatal("two types of one shape have different shapes")
	}
	if bytes.Equal(shapeOf(reflect.TypeFor[shOld]()), shapeOf(reflect.TypeFor[shSwapped]())) {
		t.Fatal("reordered fields have the same shape")
	}
}

// Shapes from a peer are checked before they are used.
func TestParseShapeRefusesBadShapes(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	deep := bytes.Repeat([]byte{shapePointer}, maxDepth+1)
	deep = append(deep, shapeInt)
	for _, tc := range []struct {
		name  string
		shape []byte
	}{
		{"empty", nil},
		{"unknown kind", []byte{99}},
		{"truncated struct", []byte{shapeStruct, 2, 1, 'A', shapeInt}},
		{"trailing bytes", []byte{shapeInt, shapeInt}},
		{"too deep", deep},
		{"a name past its bytes", []byte{shapeStruct, 1, 200, 'A', shapeInt}},
		{"a reference to itself", []byte{shapeBack, 0}},
		{"a reference without a pointer", []byte{shapeStruct, 1, 1, 'A', shapeBack, 0}},
		{"a reference to a sibling", []byte{shapeStruct, 2, 1, 'A', shapeInt, 1, 'B', shapePointer, shapeBack, 4}},
		{"a huge array", []byte{shapeArray, 0xff, 0xff, 0xff, 0xff, 0x0f, shapeInt}},
		{"a name twice", []byte{shapeStruct, 2, 1, 'A', shapeInt, 1, 'A', shapeInt}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := parseShape(tc.shape); !errors.Is(err, ErrMalformed) {
				t.Fatalf("parseShape(%x): %v, want ErrMalformed", tc.shape, err)
			}
		})
	}
	if _, err := parseShape([]byte{shapeStruct, 1, 1, 'N', shapePointer, shapeBack, 0}); err != nil {
		t.Fatalf("a recursive struct through a pointer: %v", err)
	}
}

// A hostile shape costs about three bytes of memory per byte it took,
// however it is built, and a conversion to a small type stays small.
func TestAShapeCostsAboutItsBytes(t *testing.T) {
	// Not beside other tests: it measures the process's heap, goroutines or
	// allocations, which tests running beside it would change.
	// A struct of thousands of one-byte fields with two-byte names: about
	// the most nodes per byte a shape can have.
	var e []byte
	e = append(e, shapeStruct, 0xa0, 0x1f) // 4,000 fields
	for i := range 4000 {
		e = append(e, 2, byte('a'+i%64), byte('a'+i/64), shapeBool)
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	rs, err := parseShape(e)
	if err != nil {
		t.Fatal(err)
	}
	c, err := buildConv(rs, reflect.TypeFor[shOld]())
	if err != nil || c == nil {
		t.Fatal(err)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	// What a session keeps: about 3× (the bytes, where each node ends,
	// two bitmaps), with room for what else the process holds meanwhile;
	// a tree of nodes would keep about 100× (1.6 MB here).
	if kept := int64(after.HeapAlloc) - int64(before.HeapAlloc); kept > 8*int64(len(e))+64<<10 {
		t.Fatalf("a %d-byte shape keeps %d bytes once parsed and converted", len(e), kept)
	}
	runtime.KeepAlive(rs)
	runtime.KeepAlive(c)
}

func FuzzShape(f *testing.F) {
	for _, v := range []any{sampleEverything(), shNew{ID: 1, Extra: []string{"x"}, Name: "n"}, shListV2{V: 1, Next: &shListV2{V: 2}}, shNestV2{Ptr: &shPartV2{}}} {
		mt := typeOf(reflect.TypeOf(v))
		b, _ := encodePayload(nil, mt, v)
		f.Add(mt.shape, b)
	}
	targets := []*msgType{typeOf(reflect.TypeFor[everything]()), typeOf(reflect.TypeFor[shOld]()), typeOf(reflect.TypeFor[shList]()), typeOf(reflect.TypeFor[shNest]())}
	f.Fuzz(func(t *testing.T, shape, payload []byte) {
		rs, err := parseShape(shape)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v does not wrap ErrMalformed", err)
			}
			return
		}
		for _, mt := range targets {
			c, err := buildConv(rs, mt.t)
			if err != nil {
				continue // incompatible: every message is a dead letter
			}
			var d decoder
			if _, err := d.convert(mt, c, payload); err != nil && !errors.Is(err, ErrMalformed) {
				t.Fatalf("converting into %s: %v does not wrap ErrMalformed", mt.t, err)
			}
		}
	})
}

// A type a receiver would refuse the shape of (too deep, an array too
// long) is sent without one, never with a shape that ends the link.
func TestTypesBeyondTheShapeBoundsGoWithoutOne(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	type hugeArray struct{ D *[maxShapeArray + 1]bool }
	deep := reflect.TypeFor[int]()
	for range 40 {
		deep = reflect.SliceOf(reflect.StructOf([]reflect.StructField{{Name: "X", Type: deep}}))
	}
	for _, typ := range []reflect.Type{reflect.TypeFor[hugeArray](), deep} {
		if s := shapeOf(typ); s != nil {
			t.Fatalf("%s: a shape of %d bytes, which a receiver refuses", typ, len(s))
		}
	}
}

// Skipping a field is work charged to the payload: a shape of many empty
// fields cannot make a receiver loop for long over a slice of them.
func TestSkippingManyEmptyFieldsIsBounded(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	var e []byte
	e = append(e, shapeStruct, 1, 1, 'S', shapeSlice, shapeStruct)
	e = binary.AppendUvarint(e, 6001)
	for i := range 6000 {
		e = append(e, 2, byte('a'+i%64), byte('a'+i/64))
		e = append(e, shapeStruct, 0) // an empty struct
	}
	e = append(e, 1, '~', shapeBool)
	rs, err := parseShape(e)
	if err != nil {
		t.Fatal(err)
	}
	c, err := buildConv(rs, reflect.TypeFor[shOld]()) // S is skipped
	if err != nil {
		t.Fatal(err)
	}
	payload := binary.AppendUvarint(nil, 200_001) // 200,000 elements of one bool each
	payload = append(payload, make([]byte, 200_000)...)
	var d decoder
	_, err = d.convert(typeOf(reflect.TypeFor[shOld]()), c, payload)
	if !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), "allocate more") {
		t.Fatalf("a payload that skips 1.2e9 empty fields: %v, want the decoder's budget refusing it", err)
	}
}

// The shapes a session holds are counted while they wait for their key:
// a session that defined many keys still decodes the next one by name.
func TestShapesHeldAreCountedNotShapesEverSent(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	a := newAssoc(nil, true, tcpAddr("127.0.0.1:7001"))
	a.n = &Node{cfg: Config{MaxFrameSize: defaultMaxFrameSize}}
	old := typeOf(reflect.TypeFor[shOld]())
	big := shapeOf(reflect.TypeFor[shNest]())
	for range 2 * maxShapeSession / len(big) {
		if err := a.rd.onShape(appendShapeFrame(nil, old.key, big)[1:]); err != nil {
			t.Fatal(err)
		}
		ty := &inType{key: old.key, mt: old}
		a.rd.matchShape(ty)
		if ty.conv == nil && ty.incompat == nil {
			t.Fatal("a shape was not matched")
		}
	}
	if err := a.rd.onShape(appendShapeFrame(nil, old.key, shapeOf(reflect.TypeFor[shSwapped]()))[1:]); err != nil {
		t.Fatal(err)
	}
	ty := &inType{key: old.key, mt: old}
	a.rd.matchShape(ty)
	if ty.conv == nil {
		t.Fatalf("after %d bytes of shapes, a reordered type decodes positionally (held %d)", 2*maxShapeSession, a.rd.shapeBytes)
	}
}
