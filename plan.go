package troupe

import (
	"encoding/binary"
	"fmt"
	"math"
	"reflect"
	"sync"
	"time"
)

// Type plans: how each Go type a message may hold is encoded and decoded,
// computed once per type (codec.go has the encoder and decoder they drive,
// and the registry of message types).

// plan encodes and decodes one type. It is computed once per type, so
// encoding a message walks values, never the type.
type plan struct {
	enc func(e *encoder, v reflect.Value)
	dec func(d *decoder, v reflect.Value) // v is settable
	min int                               // fewest bytes an encoding takes
}

var plans sync.Map // reflect.Type -> *plan

// maxDepth bounds nesting of pointers, slices and maps in one payload, so
// a hostile payload cannot recurse the decoder into a stack overflow.
const maxDepth = 64

func planFor(t reflect.Type) (*plan, error) {
	if p, ok := plans.Load(t); ok {
		return p.(*plan), nil
	}
	building := map[reflect.Type]*plan{}
	p, err := buildPlan(t, building)
	if err != nil {
		return nil, err
	}
	for bt, bp := range building {
		plans.LoadOrStore(bt, bp)
	}
	return p, nil
}

// buildPlan returns the plan for t, building it and the plans of the types
// inside it. building holds the plans under construction, so that a
// recursive type refers to its own plan; planFor publishes them once all
// are built.
func buildPlan(t reflect.Type, building map[reflect.Type]*plan) (*plan, error) {
	if p, ok := plans.Load(t); ok {
		return p.(*plan), nil
	}
	if p, ok := building[t]; ok {
		return p, nil // recursive type: filled in by the outer call
	}
	p := &plan{}
	building[t] = p
	if err := fillPlan(p, t, building); err != nil {
		return nil, err
	}
	return p, nil
}

// fillPlan fills p, the plan for t, with the constructor for t's kind.
func fillPlan(p *plan, t reflect.Type, building map[reflect.Type]*plan) error {
	switch {
	case t.Implements(refCarrierType) && t.Kind() == reflect.Struct:
		refPlan(p, t)
		return nil
	case t == timeType:
		timePlan(p)
		return nil
	case t.Kind() != reflect.Pointer && t.Implements(wireMarshalerType) && reflect.PointerTo(t).Implements(wireUnmarshalerType):
		marshalerPlan(p, t)
		return nil
	}
	switch t.Kind() {
	case reflect.Bool:
		boolPlan(p)
	case reflect.Int8:
		int8Plan(p)
	case reflect.Uint8:
		uint8Plan(p)
	case reflect.Int, reflect.Int16, reflect.Int32, reflect.Int64:
		intPlan(p, t)
	case reflect.Uint, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		uintPlan(p, t)
	case reflect.Float32:
		float32Plan(p)
	case reflect.Float64:
		float64Plan(p)
	case reflect.String:
		stringPlan(p)
	case reflect.Slice:
		return slicePlan(p, t, building)
	case reflect.Array:
		return arrayPlan(p, t, building)
	case reflect.Map:
		return mapPlan(p, t, building)
	case reflect.Pointer:
		return pointerPlan(p, t, building)
	case reflect.Struct:
		return structPlan(p, t, building)
	default:
		return fmt.Errorf("type %s (%s) cannot cross the wire", t, t.Kind())
	}
	return nil
}

// refPlan writes a Ref as its kind, path, uuid and, for a third node, its
// node and address (see appendRef).
func refPlan(p *plan, t reflect.Type) {
	zero := reflect.Zero(t).Interface().(refCarrier)
	p.min = 1
	p.enc = func(e *encoder, v reflect.Value) {
		e.appendRef(v.Interface().(refCarrier).handle())
	}
	p.dec = func(d *decoder, v reflect.Value) {
		if h := d.readRef(); h != nil {
			v.Set(reflect.ValueOf(zero.withHandle(h)))
		}
	}
}

// timePlan writes a time.Time in its binary form, monotonic reading
// dropped.
func timePlan(p *plan) {
	p.min = 1
	p.enc = func(e *encoder, v reflect.Value) {
		b, _ := v.Interface().(time.Time).AppendBinary(nil)
		e.appendBytes(b)
	}
	p.dec = func(d *decoder, v reflect.Value) {
		var tm time.Time
		if err := tm.UnmarshalBinary(d.bytes()); err != nil {
			d.fail("time: %v", err)
			return
		}
		v.Set(reflect.ValueOf(tm))
	}
}

// marshalerPlan lets a type that encodes itself do so inside a larger
// value, behind a 4-byte length.
func marshalerPlan(p *plan, t reflect.Type) {
	p.min = 1
	p.enc = func(e *encoder, v reflect.Value) {
		start := len(e.b)
		e.b = append(e.b, 0, 0, 0, 0)
		e.b = v.Interface().(WireMarshaler).AppendWire(e.b)
		binary.BigEndian.PutUint32(e.b[start:], uint32(len(e.b)-start-4))
	}
	p.dec = func(d *decoder, v reflect.Value) {
		n := d.u32()
		b := d.take(int(n))
		if d.err != nil {
			return
		}
		if err := v.Addr().Interface().(WireUnmarshaler).UnmarshalWire(b); err != nil {
			d.fail("%s: %v", t, err)
		}
	}
}

// boolPlan writes a bool as one byte, 0 or 1.
func boolPlan(p *plan) {
	p.min = 1
	p.enc = func(e *encoder, v reflect.Value) {
		var b byte
		if v.Bool() {
			b = 1
		}
		e.b = append(e.b, b)
	}
	p.dec = func(d *decoder, v reflect.Value) {
		switch d.byte() {
		case 0:
		case 1:
			v.SetBool(true)
		default:
			d.fail("bool is not 0 or 1")
		}
	}
}

// int8Plan writes an int8 as one byte.
func int8Plan(p *plan) {
	p.min = 1
	p.enc = func(e *encoder, v reflect.Value) { e.b = append(e.b, byte(v.Int())) }
	p.dec = func(d *decoder, v reflect.Value) { v.SetInt(int64(int8(d.byte()))) }
}

// uint8Plan writes a uint8 as one byte.
func uint8Plan(p *plan) {
	p.min = 1
	p.enc = func(e *encoder, v reflect.Value) { e.b = append(e.b, byte(v.Uint())) }
	p.dec = func(d *decoder, v reflect.Value) { v.SetUint(uint64(d.byte())) }
}

// intPlan writes a signed integer as a zigzag varint, refusing on decode
// a value that overflows t.
func intPlan(p *plan, t reflect.Type) {
	p.min = 1
	p.enc = func(e *encoder, v reflect.Value) { e.b = binary.AppendVarint(e.b, v.Int()) }
	p.dec = func(d *decoder, v reflect.Value) {
		x := d.varint()
		if v.OverflowInt(x) {
			d.fail("%d overflows %s", x, t)
			return
		}
		v.SetInt(x)
	}
}

// uintPlan writes an unsigned integer as a uvarint, refusing on decode a
// value that overflows t.
func uintPlan(p *plan, t reflect.Type) {
	p.min = 1
	p.enc = func(e *encoder, v reflect.Value) { e.b = binary.AppendUvarint(e.b, v.Uint()) }
	p.dec = func(d *decoder, v reflect.Value) {
		x := d.uvarint()
		if v.OverflowUint(x) {
			d.fail("%d overflows %s", x, t)
			return
		}
		v.SetUint(x)
	}
}

// float32Plan writes a float32 as 4 little-endian bytes.
func float32Plan(p *plan) {
	p.min = 4
	p.enc = func(e *encoder, v reflect.Value) {
		e.b = binary.LittleEndian.AppendUint32(e.b, math.Float32bits(float32(v.Float())))
	}
	p.dec = func(d *decoder, v reflect.Value) {
		if b := d.take(4); b != nil {
			v.SetFloat(float64(math.Float32frombits(binary.LittleEndian.Uint32(b))))
		}
	}
}

// float64Plan writes a float64 as 8 little-endian bytes.
func float64Plan(p *plan) {
	p.min = 8
	p.enc = func(e *encoder, v reflect.Value) {
		e.b = binary.LittleEndian.AppendUint64(e.b, math.Float64bits(v.Float()))
	}
	p.dec = func(d *decoder, v reflect.Value) {
		if b := d.take(8); b != nil {
			v.SetFloat(math.Float64frombits(binary.LittleEndian.Uint64(b)))
		}
	}
}

// stringPlan writes a string as its length and bytes.
func stringPlan(p *plan) {
	p.min = 1
	p.enc = func(e *encoder, v reflect.Value) { e.appendString(v.String()) }
	p.dec = func(d *decoder, v reflect.Value) { v.SetString(d.string()) }
}

// slicePlan writes nil as 0 and n elements as n+1 and the elements; a
// []byte is written in one piece.
func slicePlan(p *plan, t reflect.Type, building map[reflect.Type]*plan) error {
	if t.Elem().Kind() == reflect.Uint8 {
		p.min = 1
		p.enc = func(e *encoder, v reflect.Value) {
			if v.IsNil() {
				e.b = append(e.b, 0)
				return
			}
			e.b = binary.AppendUvarint(e.b, uint64(v.Len())+1)
			e.b = append(e.b, v.Bytes()...)
		}
		p.dec = func(d *decoder, v reflect.Value) {
			n, ok := d.count(1)
			if !ok {
				return
			}
			b := d.take(n)
			if d.err == nil {
				v.SetBytes(append(make([]byte, 0, n), b...))
			}
		}
		return nil
	}
	ep, err := buildPlan(t.Elem(), building)
	if err != nil {
		return err
	}
	p.min = 1
	p.enc = func(e *encoder, v reflect.Value) {
		if v.IsNil() {
			e.b = append(e.b, 0)
			return
		}
		n := v.Len()
		e.b = binary.AppendUvarint(e.b, uint64(n)+1)
		for i := range n {
			ep.enc(e, v.Index(i))
		}
	}
	p.dec = sliceDecoder(t, &ep.min, &ep.dec)
	return nil
}

// The decoders of slices, maps and pointers, shared by the plans and by
// the conversions of another version's shape (shape.go). They read min
// and the element decoders through pointers at each call: a recursive
// type's are filled in after the decoder is made.

// decodeFunc decodes into v, which is settable and zero.
type decodeFunc = func(d *decoder, v reflect.Value)

// sliceDecoder decodes a count, then that many elements of t by *elem,
// each at least *min bytes.
func sliceDecoder(t reflect.Type, min *int, elem *decodeFunc) decodeFunc {
	size := int(t.Elem().Size())
	return func(d *decoder, v reflect.Value) {
		n, ok := d.count(*min)
		if !ok || !d.enter() {
			return
		}
		if !d.spend(n * size) {
			d.depth--
			return
		}
		s := reflect.MakeSlice(t, n, n)
		for i := 0; i < n && d.err == nil; i++ {
			(*elem)(d, s.Index(i))
		}
		v.Set(s)
		d.depth--
	}
}

// mapDecoder decodes a count, then that many entries of t by *key and
// *val, whose encodings take at least *kmin and *vmin bytes.
func mapDecoder(t reflect.Type, kmin, vmin *int, key, val *decodeFunc) decodeFunc {
	return func(d *decoder, v reflect.Value) {
		n, ok := d.count(max(1, *kmin+*vmin))
		if !ok || !d.enter() {
			return
		}
		if !d.spend(n * mapEntryCost(t)) {
			d.depth--
			return
		}
		m := reflect.MakeMapWithSize(t, n)
		k, x := reflect.New(t.Key()).Elem(), reflect.New(t.Elem()).Elem()
		for i := 0; i < n && d.err == nil; i++ {
			k.SetZero()
			x.SetZero()
			(*key)(d, k)
			(*val)(d, x)
			m.SetMapIndex(k, x)
		}
		v.Set(m)
		d.depth--
	}
}

// pointerDecoder decodes a flag, then, for 1, the value t points to by
// *elem.
func pointerDecoder(t reflect.Type, elem *decodeFunc) decodeFunc {
	return func(d *decoder, v reflect.Value) {
		if !d.present() || !d.enter() {
			return
		}
		if !d.spend(int(t.Elem().Size())) {
			d.depth--
			return
		}
		x := reflect.New(t.Elem())
		(*elem)(d, x.Elem())
		v.Set(x)
		d.depth--
	}
}

// arrayPlan writes an array's elements, its length being its type's.
func arrayPlan(p *plan, t reflect.Type, building map[reflect.Type]*plan) error {
	ep, err := buildPlan(t.Elem(), building)
	if err != nil {
		return err
	}
	n := t.Len()
	p.min = n * ep.min
	if el := t.Elem(); el.Kind() == reflect.Uint8 && !(el.Implements(wireMarshalerType) && reflect.PointerTo(el).Implements(wireUnmarshalerType)) {
		bytesArrayPlan(p, n, ep)
		return nil
	}
	p.enc = func(e *encoder, v reflect.Value) {
		for i := range n {
			ep.enc(e, v.Index(i))
		}
	}
	p.dec = func(d *decoder, v reflect.Value) {
		for i := 0; i < n && d.err == nil; i++ {
			ep.dec(d, v.Index(i))
		}
	}
	return nil
}

// bytesArrayPlan is arrayPlan for an array of bytes (a NodeUID, a
// UUID): the same bytes, copied whole where the array is addressable (in
// a slice, or decoded into) rather than one reflect call a byte.
func bytesArrayPlan(p *plan, n int, ep *plan) {
	p.enc = func(e *encoder, v reflect.Value) {
		if v.CanAddr() {
			e.b = append(e.b, v.Bytes()...)
			return
		}
		for i := range n {
			ep.enc(e, v.Index(i))
		}
	}
	p.dec = func(d *decoder, v reflect.Value) {
		if b := d.take(n); b != nil {
			copy(v.Bytes(), b)
		}
	}
}

// mapPlan writes nil as 0 and n entries as n+1 and the keys and values.
func mapPlan(p *plan, t reflect.Type, building map[reflect.Type]*plan) error {
	kp, err := buildPlan(t.Key(), building)
	if err != nil {
		return err
	}
	vp, err := buildPlan(t.Elem(), building)
	if err != nil {
		return err
	}
	p.min = 1
	p.enc = func(e *encoder, v reflect.Value) {
		if v.IsNil() {
			e.b = append(e.b, 0)
			return
		}
		e.b = binary.AppendUvarint(e.b, uint64(v.Len())+1)
		it := v.MapRange()
		for it.Next() {
			kp.enc(e, it.Key())
			vp.enc(e, it.Value())
		}
	}
	p.dec = mapDecoder(t, &kp.min, &vp.min, &kp.dec, &vp.dec)
	return nil
}

// pointerPlan writes nil as 0, else 1 and the value pointed to.
func pointerPlan(p *plan, t reflect.Type, building map[reflect.Type]*plan) error {
	ep, err := buildPlan(t.Elem(), building)
	if err != nil {
		return err
	}
	p.min = 1
	p.enc = func(e *encoder, v reflect.Value) {
		if v.IsNil() {
			e.b = append(e.b, 0)
			return
		}
		e.b = append(e.b, 1)
		if !e.enter() {
			return
		}
		ep.enc(e, v.Elem())
		e.depth--
	}
	p.dec = pointerDecoder(t, &ep.dec)
	return nil
}

// structPlan writes the exported fields in order.
func structPlan(p *plan, t reflect.Type, building map[reflect.Type]*plan) error {
	type field struct {
		i    int
		p    *plan
		name string
	}
	var fields []field
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		fp, err := buildPlan(f.Type, building)
		if err != nil {
			return fmt.Errorf("field %s: %w", f.Name, err)
		}
		fields = append(fields, field{i, fp, f.Name})
		p.min += fp.min
	}
	p.enc = func(e *encoder, v reflect.Value) {
		for _, f := range fields {
			f.p.enc(e, v.Field(f.i))
		}
	}
	p.dec = func(d *decoder, v reflect.Value) {
		for _, f := range fields {
			if d.err != nil {
				return
			}
			f.p.dec(d, v.Field(f.i))
			if d.err != nil {
				d.err = fmt.Errorf("field %s: %w", f.name, d.err) // (the outer field wraps the inner)
			}
		}
	}
	return nil
}

// unexportedField returns the path of the first unexported field found in t
// at any depth (through nested structs, slices, arrays, maps and
// pointers), and the struct type that holds it, or "" if there is none.
// The codec does not send such a field, so a value sent to another node
// would arrive without it while one sent on the same node keeps it:
// [SetWireKey] refuses the type instead. A type with a plan of its
// own (a Ref, a time.Time, a WireMarshaler) is not looked into, nor is a
// blank field (_), which holds nothing.
func unexportedField(t reflect.Type, path string, seen map[reflect.Type]bool) (string, reflect.Type) {
	if seen[t] {
		return "", nil
	}
	seen[t] = true
	switch {
	case t.Implements(refCarrierType) && t.Kind() == reflect.Struct,
		t == timeType,
		t.Kind() != reflect.Pointer && t.Implements(wireMarshalerType) && reflect.PointerTo(t).Implements(wireUnmarshalerType):
		return "", nil
	}
	switch t.Kind() {
	case reflect.Slice, reflect.Array:
		return unexportedField(t.Elem(), path+"[]", seen)
	case reflect.Map:
		if p, in := unexportedField(t.Key(), path+"[key]", seen); p != "" {
			return p, in
		}
		return unexportedField(t.Elem(), path+"[]", seen)
	case reflect.Pointer:
		return unexportedField(t.Elem(), path, seen)
	case reflect.Struct:
		for i := range t.NumField() {
			f := t.Field(i)
			if f.Name == "_" {
				continue
			}
			if !f.IsExported() {
				return path + "." + f.Name, t
			}
			if p, in := unexportedField(f.Type, path+"."+f.Name, seen); p != "" {
				return p, in
			}
		}
	}
	return "", nil
}
