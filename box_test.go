package troupe

import (
	"reflect"
	"testing"
)

// BenchmarkBox measures what box.go saves when a decoded value becomes an
// interface: box reuses the decoder's allocation, where reflect's
// Interface copies the value into a second one. Both sides allocate the
// value itself (reflect.New) as the decoder does; values vary with i.
func BenchmarkBox(b *testing.B) {
	mt := &msgType{t: reflect.TypeFor[boxed]()}
	mt.initBox()
	var sink any
	for _, way := range []struct {
		name string
		f    func(p reflect.Value) any
	}{
		{"box", mt.box},
		{"reflect-Interface", func(p reflect.Value) any { return p.Elem().Interface() }},
	} {
		b.Run(way.name, func(b *testing.B) {
			b.ReportAllocs()
			for i := range b.N {
				p := reflect.New(mt.t)
				v := p.Interface().(*boxed)
				v.N, v.At = i, int64(i)*7
				sink = way.f(p)
			}
		})
	}
	_ = sink
}

// TestBoxEqualsReflect checks that box gives the same interface value as
// reflect's Interface for direct and indirect types alike.
func TestBoxEqualsReflect(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	type one struct{ P *int }
	type two struct {
		P *int
		N int
	}
	x := 7
	for _, v := range []any{boxed{N: 3, At: 9}, one{P: &x}, two{P: &x, N: 2}, &x, map[string]int{"a": 1}, [1]*int{&x}, "text", 42} {
		mt := &msgType{t: reflect.TypeOf(v)}
		mt.initBox()
		p := reflect.New(mt.t)
		p.Elem().Set(reflect.ValueOf(v))
		got := mt.box(p)
		if !reflect.DeepEqual(got, v) || reflect.TypeOf(got) != reflect.TypeOf(v) {
			t.Errorf("%T: box gave %#v, want %#v", v, got, v)
		}
	}
}

type shape interface{ area() int }

type square struct{ s int }
type rect struct{ w, h int }

func (q square) area() int { return q.s * q.s }
func (r rect) area() int   { return r.w * r.h }

// TestConvertMatchesTheAssertion: converting a run of messages of mixed
// dynamic types to an interface protocol through the itab cache gives
// what the type assertion gives, and refuses what it refuses.
func TestConvertMatchesTheAssertion(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	msgs := []any{square{2}, square{3}, rect{2, 5}, rect{1, 1}, square{4}, "not a shape", square{5}}
	var c convCache
	c.iface = isMethodIface[shape]()
	if !c.iface || isMethodIface[any]() || isMethodIface[square]() {
		t.Fatal("isMethodIface is wrong")
	}
	for _, m := range msgs {
		got, ok := convert[shape](m, &c)
		want, wantOK := m.(shape)
		if ok != wantOK || ok && (got != want || got.area() != want.area()) {
			t.Fatalf("convert(%#v) = %#v, %v; the assertion gives %#v, %v", m, got, ok, want, wantOK)
		}
	}
	var plain convCache
	if v, ok := convert[square](square{7}, &plain); !ok || v.s != 7 {
		t.Fatalf("convert to a concrete type = %v, %v", v, ok)
	}
}
