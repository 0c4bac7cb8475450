package troupe

import (
	"bytes"
	"math"
	"math/rand/v2"
	"reflect"
	"testing"
	"unsafe"
)

type flatInner struct {
	F32 float32
	U16 uint16
	S   string
}

type flatAll struct {
	B      bool
	I8     int8
	U8     uint8
	I      int
	I16    int16
	I32    int32
	I64    int64
	U      uint
	U32    uint32
	U64    uint64
	P      uintptr
	F64    float64
	S      string
	In     flatInner
	hidden int // unexported: not sent (and left zero here)
	D      flatLevel
}

type flatLevel int32

// TestFlatMatchesThePlans: the flat fast path writes exactly the bytes of
// the general plans and reads them back to the same value, for values
// across each field's range.
func TestFlatMatchesThePlans(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	r := rand.New(rand.NewPCG(1, 2))
	for _, typ := range []reflect.Type{reflect.TypeFor[flatAll](), reflect.TypeFor[count](), reflect.TypeFor[int](), reflect.TypeFor[string](), reflect.TypeFor[struct{}]()} {
		fields := flatFields(typ)
		if fields == nil {
			t.Fatalf("%s is not flat", typ)
		}
		p, err := planFor(typ)
		if err != nil {
			t.Fatal(err)
		}
		for range 1000 {
			v := reflect.New(typ)
			fillRandom(r, v.Elem())
			var e encoder
			e.b = nil
			p.enc(&e, v.Elem())
			want := e.b
			got := appendFlatValue(nil, fields, v.UnsafePointer())
			if !bytes.Equal(got, want) {
				t.Fatalf("%s %+v: flat wrote %x, the plan %x", typ, v.Elem(), got, want)
			}
			back := reflect.New(typ)
			d := decoder{b: got, budget: 1 << 20}
			d.decodeFlat(fields, back.UnsafePointer())
			if d.err != nil || d.remaining() != 0 {
				t.Fatalf("%s: decoding %x: %v, %d left", typ, got, d.err, d.remaining())
			}
			if !reflect.DeepEqual(back.Elem().Interface(), v.Elem().Interface()) {
				t.Fatalf("%s: sent %+v, read back %+v", typ, v.Elem(), back.Elem())
			}
		}
	}
	for _, typ := range []reflect.Type{reflect.TypeFor[testPing](), reflect.TypeFor[[]int](), reflect.TypeFor[struct{ P *int }]()} {
		if flatFields(typ) != nil {
			t.Errorf("%s taken for flat", typ)
		}
	}
}

// TestFlatRefusesWhatThePlansRefuse: an integer too wide for its field
// and a bool that is neither 0 nor 1 are malformed either way.
func TestFlatRefusesWhatThePlansRefuse(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	type small struct {
		A int8
		B int16
		C uint16
		D bool
	}
	fields := flatFields(reflect.TypeFor[small]())
	for _, b := range [][]byte{
		{1, 0x80, 0x80, 0x04, 0, 0}, // B = 32768
		{1, 0, 0x80, 0x80, 0x04, 0}, // C = 65536
		{1, 0, 0, 2},                // D = 2
	} {
		var v small
		d := decoder{b: b, budget: 1 << 20}
		d.decodeFlat(fields, unsafePointer(&v))
		if d.err == nil {
			t.Errorf("%x decoded as %+v", b, v)
		}
	}
}

func fillRandom(r *rand.Rand, v reflect.Value) {
	switch v.Kind() {
	case reflect.Bool:
		v.SetBool(r.IntN(2) == 1)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		x := int64(r.Uint64()) >> r.IntN(64)
		if !v.OverflowInt(x) {
			v.SetInt(x)
		}
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		x := r.Uint64() >> r.IntN(64)
		if !v.OverflowUint(x) {
			v.SetUint(x)
		}
	case reflect.Float32, reflect.Float64:
		v.SetFloat([]float64{0, -1.5, math.Inf(1), r.Float64() * 1e9}[r.IntN(4)])
	case reflect.String:
		v.SetString(string(make([]byte, r.IntN(300))))
	case reflect.Struct:
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				fillRandom(r, v.Field(i))
			}
		}
	}
}

func unsafePointer[T any](p *T) unsafe.Pointer { return unsafe.Pointer(p) }
