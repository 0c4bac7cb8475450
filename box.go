package troupe

import (
	"reflect"
	"unsafe"
)

// box returns the value *p (p from reflect.New(mt.t)) as an interface
// without copying it into a second allocation: for a type stored
// indirectly in an interface, the interface's data word is simply p.
// Pointer-shaped types are stored directly, and reflect boxes them without
// allocating.
func (mt *msgType) box(p reflect.Value) any {
	if mt.direct {
		return p.Elem().Interface()
	}
	var x any
	e := (*eface)(unsafe.Pointer(&x))
	e.typ, e.data = mt.typeWord, p.UnsafePointer()
	return x
}

// boxAt returns the value at p, a value of mt's type that nothing else
// refers to (allocated for it), as an interface. mt is not direct.
func (mt *msgType) boxAt(p unsafe.Pointer) any {
	var x any
	e := (*eface)(unsafe.Pointer(&x))
	e.typ, e.data = mt.typeWord, p
	return x
}

// boxCopy returns a copy of the plain value at p as an interface.
func (mt *msgType) boxCopy(p unsafe.Pointer) any {
	q := mt.alloc()
	n := int(mt.t.Size())
	copy(unsafe.Slice((*byte)(q), n), unsafe.Slice((*byte)(p), n))
	return mt.boxAt(q)
}

// eface is the layout of an empty interface value.
type eface struct {
	typ  unsafe.Pointer
	data unsafe.Pointer
}

// initBox records what box needs about t.
func (mt *msgType) initBox() {
	mt.direct = isDirectIface(mt.t)
	z := reflect.New(mt.t).Elem().Interface()
	mt.typeWord = (*eface)(unsafe.Pointer(&z)).typ
}

// isDirectIface reports whether values of t are stored in an interface's
// data word itself (pointer-shaped types) rather than behind a pointer.
func isDirectIface(t reflect.Type) bool {
	switch t.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Chan, reflect.Func, reflect.UnsafePointer:
		return true
	case reflect.Struct:
		if t.NumField() == 1 {
			return isDirectIface(t.Field(0).Type)
		}
		// A struct of one pointer-shaped field and zero-size fields is
		// not direct; only the exact one-field case is.
		return false
	case reflect.Array:
		return t.Len() == 1 && isDirectIface(t.Elem())
	}
	return false
}

// iface is the layout of an interface value with methods.
type iface struct {
	tab  unsafe.Pointer // the itab: the interface's methods for the dynamic type
	data unsafe.Pointer
}

// convCache remembers, across a batch of messages converted to one
// protocol type, the itab of the last dynamic type seen, so that a run of
// messages of one type costs one itab lookup, not one each.
type convCache struct {
	iface bool           // the protocol is an interface with methods
	typ   unsafe.Pointer // the last dynamic type's type word
	tab   unsafe.Pointer // its itab for the protocol
}

// isMethodIface reports whether T is an interface type with methods (an
// iface, not an eface).
func isMethodIface[T any]() bool {
	t := reflect.TypeFor[T]()
	return t.Kind() == reflect.Interface && t.NumMethod() > 0
}

// convert is msg.(T). For an interface T with methods it builds the
// result from the cached itab when msg's dynamic type is the last one
// seen: the same two words msg.(T) would produce.
func convert[T any](msg any, c *convCache) (T, bool) {
	if !c.iface {
		v, ok := msg.(T)
		return v, ok
	}
	e := (*eface)(unsafe.Pointer(&msg))
	if e.typ != nil && e.typ == c.typ {
		var v T
		*(*iface)(unsafe.Pointer(&v)) = iface{c.tab, e.data}
		return v, true
	}
	v, ok := msg.(T)
	if ok {
		c.typ, c.tab = e.typ, (*iface)(unsafe.Pointer(&v)).tab
	}
	return v, ok
}
