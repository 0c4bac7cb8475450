package troupe

import (
	"encoding/binary"
	"math"
	"reflect"
	"unsafe"
)

// The codec's fast path for flat messages: a registered type made only of
// scalars (booleans, integers, floats, strings), directly or in nested
// structs, is encoded and decoded field by field at known offsets, with
// no reflect.Value on the way. The bytes are exactly those of the general
// plans (see fillPlan); TestFlatMatchesThePlans checks it.

// flatField is one scalar of a flat message: where it lies in the value
// and how it is written.
type flatField struct {
	off  uintptr
	kind reflect.Kind
	bits uint8        // integers: the width, to refuse a decoded value that overflows
	t    reflect.Type // integers: the field's type, to say so
}

// flatFields returns the fields of t in wire order if t is flat, else
// nil. A flat type without fields (struct{}) has an empty, non-nil list.
func flatFields(t reflect.Type) []flatField {
	fields := []flatField{}
	if !appendFlat(&fields, t, 0) {
		return nil
	}
	return fields
}

func appendFlat(fields *[]flatField, t reflect.Type, off uintptr) bool {
	switch {
	case t.Implements(refCarrierType), t == timeType, t.Implements(wireMarshalerType), reflect.PointerTo(t).Implements(wireUnmarshalerType):
		return false // types with plans of their own
	}
	switch k := t.Kind(); k {
	case reflect.Bool, reflect.Int8, reflect.Uint8, reflect.Float32, reflect.Float64, reflect.String:
		*fields = append(*fields, flatField{off: off, kind: k})
	case reflect.Int, reflect.Int16, reflect.Int32, reflect.Int64, reflect.Uint, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		*fields = append(*fields, flatField{off: off, kind: k, bits: uint8(t.Bits()), t: t})
	case reflect.Struct:
		for i := range t.NumField() {
			f := t.Field(i)
			if !f.IsExported() {
				continue
			}
			if !appendFlat(fields, f.Type, off+f.Offset) {
				return false
			}
		}
	default:
		return false
	}
	return true
}

// flatMaxSize is the most bytes appendFlatValue can write for the flat
// value at p.
func flatMaxSize(fields []flatField, p unsafe.Pointer) int {
	size := 0
	for _, f := range fields {
		size += binary.MaxVarintLen64
		if f.kind == reflect.String {
			size += len(*(*string)(unsafe.Add(p, f.off)))
		}
	}
	return size
}

// appendFlatValue appends the encoding of the flat value at p.
func appendFlatValue(b []byte, fields []flatField, p unsafe.Pointer) []byte {
	for _, f := range fields {
		q := unsafe.Add(p, f.off)
		switch f.kind {
		case reflect.Bool:
			var x byte
			if *(*bool)(q) {
				x = 1
			}
			b = append(b, x)
		case reflect.Int8:
			b = append(b, byte(*(*int8)(q)))
		case reflect.Uint8:
			b = append(b, *(*uint8)(q))
		case reflect.Int:
			b = binary.AppendVarint(b, int64(*(*int)(q)))
		case reflect.Int16:
			b = binary.AppendVarint(b, int64(*(*int16)(q)))
		case reflect.Int32:
			b = binary.AppendVarint(b, int64(*(*int32)(q)))
		case reflect.Int64:
			b = binary.AppendVarint(b, *(*int64)(q))
		case reflect.Uint:
			b = binary.AppendUvarint(b, uint64(*(*uint)(q)))
		case reflect.Uint16:
			b = binary.AppendUvarint(b, uint64(*(*uint16)(q)))
		case reflect.Uint32:
			b = binary.AppendUvarint(b, uint64(*(*uint32)(q)))
		case reflect.Uint64:
			b = binary.AppendUvarint(b, *(*uint64)(q))
		case reflect.Uintptr:
			b = binary.AppendUvarint(b, uint64(*(*uintptr)(q)))
		case reflect.Float32:
			b = binary.LittleEndian.AppendUint32(b, math.Float32bits(*(*float32)(q)))
		case reflect.Float64:
			b = binary.LittleEndian.AppendUint64(b, math.Float64bits(*(*float64)(q)))
		case reflect.String:
			s := *(*string)(q)
			b = binary.AppendUvarint(b, uint64(len(s)))
			b = append(b, s...)
		}
	}
	return b
}

// decodeFlat decodes into the zeroed flat value at p what appendFlatValue
// wrote, refusing what the general plans refuse.
func (d *decoder) decodeFlat(fields []flatField, p unsafe.Pointer) {
	for _, f := range fields {
		if d.err != nil {
			return
		}
		q := unsafe.Add(p, f.off)
		switch f.kind {
		case reflect.Bool:
			switch d.byte() {
			case 0:
			case 1:
				*(*bool)(q) = true
			default:
				d.fail("bool is not 0 or 1")
			}
		case reflect.Int8:
			*(*int8)(q) = int8(d.byte())
		case reflect.Uint8:
			*(*uint8)(q) = d.byte()
		case reflect.Int, reflect.Int16, reflect.Int32, reflect.Int64:
			x := d.varint()
			if s := 64 - uint(f.bits); x<<s>>s != x {
				d.fail("%d overflows %s", x, f.t)
				return
			}
			switch f.kind {
			case reflect.Int:
				*(*int)(q) = int(x)
			case reflect.Int16:
				*(*int16)(q) = int16(x)
			case reflect.Int32:
				*(*int32)(q) = int32(x)
			default:
				*(*int64)(q) = x
			}
		case reflect.Uint, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
			x := d.uvarint()
			if f.bits < 64 && x>>f.bits != 0 {
				d.fail("%d overflows %s", x, f.t)
				return
			}
			switch f.kind {
			case reflect.Uint:
				*(*uint)(q) = uint(x)
			case reflect.Uint16:
				*(*uint16)(q) = uint16(x)
			case reflect.Uint32:
				*(*uint32)(q) = uint32(x)
			case reflect.Uintptr:
				*(*uintptr)(q) = uintptr(x)
			default:
				*(*uint64)(q) = x
			}
		case reflect.Float32:
			if b := d.take(4); b != nil {
				*(*float32)(q) = math.Float32frombits(binary.LittleEndian.Uint32(b))
			}
		case reflect.Float64:
			if b := d.take(8); b != nil {
				*(*float64)(q) = math.Float64frombits(binary.LittleEndian.Uint64(b))
			}
		case reflect.String:
			*(*string)(q) = d.string()
		}
	}
}
