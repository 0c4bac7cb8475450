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
