package troupe

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"reflect"
	"sync"
)

// Shapes: how two versions of a message type still talk. A payload is
// positional (the exported fields in declaration order), so a sender and
// a receiver that registered different shapes under one wire key would
// misread each other. Each session therefore carries, once per wire key
// and before the first message of it, the sender's shape: field names and
// kinds, recursively (a shape frame). A receiver whose own type has the
// same shape decodes as always; one whose type differs decodes through a
// conversion built once for the session, which matches fields by name:
// a field only the sender has is skipped, one only the receiver has keeps
// its zero value, order does not matter, and a field whose kind changed
// makes every message of that key a dead letter (ErrIncompatibleMessage,
// naming the field). See docs/upgrades.md.
//
// A shape from a peer is kept as its bytes, with two tables beside them
// (where each node ends, and which nodes encode to nothing): at most
// about three bytes of memory per byte received, and a conversion whose
// size is bounded by the receiver's own type.

// Shape kinds. Append only: values are on the wire.
const (
	shapeBool    uint8 = 1 + iota
	shapeInt8          // one byte
	shapeUint8         // one byte
	shapeInt           // a varint: int, int16, int32, int64, time.Duration
	shapeUint          // a uvarint: uint, uint16, uint32, uint64, uintptr
	shapeFloat32       // four bytes
	shapeFloat64       // eight bytes
	shapeString        // uvarint length, bytes
	shapeBytes         // []byte: uvarint length+1 (0: nil), bytes
	shapeSlice         // followed by the element's shape
	shapeArray         // uvarint length, the element's shape
	shapeMap           // the key's shape, the value's shape
	shapePointer       // the element's shape
	shapeStruct        // uvarint field count, then each field's name (string) and shape
	shapeRef           // a Ref
	shapeTime          // a time.Time
	shapeOpaque        // a WireMarshaler field: its own bytes
	shapeBack          // uvarint offset of an enclosing node: a recursive type
	shapeKinds         // one past the last
)

var shapeNames = [...]string{"invalid", "bool", "int8", "uint8", "a signed integer", "an unsigned integer", "float32", "float64",
	"string", "[]byte", "a slice", "an array", "a map", "a pointer", "a struct", "a Ref", "a time.Time", "a WireMarshaler", "a recursive reference"}

// Bounds on the shapes a peer sends.
const (
	// maxShapeSize bounds one shape (a node's end fits in a uint16); a
	// type whose shape is longer is sent without one.
	maxShapeSize = 32 << 10
	// maxShapeSession bounds the shape bytes one session takes from its
	// peer; past it, shapes are ignored (messages decode positionally,
	// as from a peer that sends none).
	maxShapeSession = 256 << 10
	// maxShapeArray bounds an array's length in a shape.
	maxShapeArray = 1 << 20
	// maxShapeName bounds a field name.
	maxShapeName = 255
)

// shapeOf returns the shape of t, or nil when a receiver would refuse it
// (longer than maxShapeSize, nested deeper than maxDepth, an array longer
// than maxShapeArray, a field name longer than maxShapeName): such a type
// is sent without a shape, and decodes positionally.
func shapeOf(t reflect.Type) []byte {
	var e shapeEnc
	e.add(t)
	if len(e.b) > maxShapeSize {
		return nil
	}
	if _, err := parseShape(e.b); err != nil {
		return nil
	}
	return e.b
}

var shapeCache sync.Map // reflect.Type -> []byte

// cachedShape is shapeOf(t), computed once.
func cachedShape(t reflect.Type) []byte {
	if s, ok := shapeCache.Load(t); ok {
		return s.([]byte)
	}
	s := shapeOf(t)
	shapeCache.Store(t, s)
	return s
}

type shapeEnc struct {
	b    []byte
	open []shapeOpen // the composite types being written, outermost first
}

type shapeOpen struct {
	t  reflect.Type
	at int
}

// add appends t's shape, as the codec's plan for t encodes it (see
// fillPlan).
func (e *shapeEnc) add(t reflect.Type) {
	for _, o := range e.open {
		if o.t == t {
			e.b = append(e.b, shapeBack)
			e.b = binary.AppendUvarint(e.b, uint64(o.at))
			return
		}
	}
	switch {
	case t.Implements(refCarrierType) && t.Kind() == reflect.Struct:
		e.b = append(e.b, shapeRef)
		return
	case t == timeType:
		e.b = append(e.b, shapeTime)
		return
	case t.Kind() != reflect.Pointer && t.Implements(wireMarshalerType) && reflect.PointerTo(t).Implements(wireUnmarshalerType):
		e.b = append(e.b, shapeOpaque)
		return
	}
	if k := scalarShape(t.Kind()); k != 0 {
		e.b = append(e.b, k)
		return
	}
	if t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.Uint8 {
		e.b = append(e.b, shapeBytes)
		return
	}
	e.open = append(e.open, shapeOpen{t, len(e.b)})
	defer func() { e.open = e.open[:len(e.open)-1] }()
	switch t.Kind() {
	case reflect.Slice:
		e.b = append(e.b, shapeSlice)
		e.add(t.Elem())
	case reflect.Array:
		e.b = append(e.b, shapeArray)
		e.b = binary.AppendUvarint(e.b, uint64(t.Len()))
		e.add(t.Elem())
	case reflect.Map:
		e.b = append(e.b, shapeMap)
		e.add(t.Key())
		e.add(t.Elem())
	case reflect.Pointer:
		e.b = append(e.b, shapePointer)
		e.add(t.Elem())
	case reflect.Struct:
		e.b = append(e.b, shapeStruct)
		var n uint64
		for i := range t.NumField() {
			if t.Field(i).IsExported() {
				n++
			}
		}
		e.b = binary.AppendUvarint(e.b, n)
		for i := range t.NumField() {
			f := t.Field(i)
			if !f.IsExported() {
				continue
			}
			e.b = binary.AppendUvarint(e.b, uint64(len(f.Name)))
			e.b = append(e.b, f.Name...)
			e.add(f.Type)
		}
	default:
		e.b = append(e.b, 0) // (a registered type has none: its plan was refused)
	}
}

// scalarShape is the shape of a scalar kind, or 0.
func scalarShape(k reflect.Kind) uint8 {
	switch k {
	case reflect.Bool:
		return shapeBool
	case reflect.Int8:
		return shapeInt8
	case reflect.Uint8:
		return shapeUint8
	case reflect.Int, reflect.Int16, reflect.Int32, reflect.Int64:
		return shapeInt
	case reflect.Uint, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return shapeUint
	case reflect.Float32:
		return shapeFloat32
	case reflect.Float64:
		return shapeFloat64
	case reflect.String:
		return shapeString
	}
	return 0
}

// shapeKindOf is the kind of t's own shape node.
func shapeKindOf(t reflect.Type) uint8 {
	b := cachedShape(t)
	if len(b) == 0 {
		return 0
	}
	return b[0]
}

// rawShape is a shape a peer sent, checked: its bytes, where each node
// ends, and which nodes encode to no bytes at all.
type rawShape struct {
	b    []byte
	end  []uint16 // end[i]: the end of the node that starts at i
	zero []byte   // bit i: the node at i encodes to nothing
	back []byte   // bit i: the node at i holds a recursive reference
}

func (s *rawShape) isZero(at int) bool  { return s.zero[at>>3]&(1<<(at&7)) != 0 }
func (s *rawShape) hasBack(at int) bool { return s.back[at>>3]&(1<<(at&7)) != 0 }

// min is a lower bound of the bytes the node at at encodes to.
func (s *rawShape) min(at int) int {
	if s.isZero(at) {
		return 0
	}
	return 1
}

// target follows a recursive reference to the node it names.
func (s *rawShape) target(at int) int {
	if s.b[at] != shapeBack {
		return at
	}
	x, _ := binary.Uvarint(s.b[at+1:])
	return int(x)
}

// parseShape checks a shape from a peer: known kinds, nesting at most
// maxDepth, counts and lengths that fit, names at most maxShapeName
// bytes, and recursive references only to an enclosing node, through a
// pointer, slice or map (so that a value of it cannot recurse without
// consuming bytes).
func parseShape(b []byte) (*rawShape, error) {
	if len(b) == 0 || len(b) > maxShapeSize {
		return nil, fmt.Errorf("%w: a shape of %d bytes (1 to %d)", ErrMalformed, len(b), maxShapeSize)
	}
	s := &rawShape{b: b, end: make([]uint16, len(b)), zero: make([]byte, (len(b)+7)/8), back: make([]byte, (len(b)+7)/8)}
	p := shapeParser{s: s}
	end := p.node(0)
	if p.err == nil && end != len(b) {
		p.fail("%d bytes after the shape", len(b)-end)
	}
	if p.err != nil {
		return nil, p.err
	}
	return s, nil
}

type shapeParser struct {
	s    *rawShape
	open []shapeAncestor
	err  error
}

type shapeAncestor struct {
	at       int
	indirect bool // a pointer, slice or map
}

func (p *shapeParser) fail(format string, args ...any) {
	if p.err == nil {
		p.err = fmt.Errorf("%w: shape: %s", ErrMalformed, fmt.Sprintf(format, args...))
	}
}

func (p *shapeParser) uvarint(at int) (uint64, int) {
	x, n := binary.Uvarint(p.s.b[min(at, len(p.s.b)):])
	if n <= 0 {
		p.fail("bad uvarint at %d", at)
		return 0, len(p.s.b)
	}
	return x, at + n
}

// node checks the node at at and returns where it ends.
func (p *shapeParser) node(at int) int {
	s := p.s
	if p.err != nil {
		return len(s.b)
	}
	if at >= len(s.b) {
		p.fail("truncated")
		return len(s.b)
	}
	if len(p.open) >= maxDepth {
		p.fail("nested deeper than %d", maxDepth)
		return len(s.b)
	}
	k := s.b[at]
	next := at + 1
	zero, back := false, false
	p.open = append(p.open, shapeAncestor{at: at, indirect: k == shapeSlice || k == shapeMap || k == shapePointer})
	switch k {
	case shapeBool, shapeInt8, shapeUint8, shapeInt, shapeUint, shapeFloat32, shapeFloat64,
		shapeString, shapeBytes, shapeRef, shapeTime, shapeOpaque:
	case shapeSlice, shapePointer:
		next = p.node(next)
		back = p.err == nil && s.hasBack(at+1)
	case shapeMap:
		kEnd := p.node(next)
		next = p.node(kEnd)
		back = p.err == nil && (s.hasBack(at+1) || s.hasBack(kEnd))
	case shapeArray:
		n, elem := p.uvarint(next)
		if n > maxShapeArray {
			p.fail("an array of %d (at most %d)", n, maxShapeArray)
			break
		}
		next = p.node(elem)
		if p.err == nil {
			zero = n == 0 || s.isZero(elem)
			back = s.hasBack(elem)
		}
	case shapeStruct:
		n, q := p.uvarint(next)
		if n > uint64(len(s.b)-q)/2 {
			p.fail("%d fields cannot fit in %d bytes", n, len(s.b)-q)
			break
		}
		zero = true
		names := make(map[string]struct{}, n)
		for range n {
			l, r := p.uvarint(q)
			if l > maxShapeName || l > uint64(len(s.b)-r) {
				p.fail("a field name of %d bytes", l)
				break
			}
			f := r + int(l)
			if _, dup := names[string(s.b[r:f])]; dup {
				p.fail("the field name %q twice in one struct", s.b[r:f])
				break
			}
			names[string(s.b[r:f])] = struct{}{}
			q = p.node(f)
			if p.err != nil {
				break
			}
			zero = zero && s.isZero(f)
			back = back || s.hasBack(f)
		}
		next = q
	case shapeBack:
		x, q := p.uvarint(next)
		next = q
		j := -1
		for i, o := range p.open[:len(p.open)-1] {
			if uint64(o.at) == x {
				j = i
			}
		}
		if j < 0 {
			p.fail("a recursive reference to %d, which does not enclose it", x)
			break
		}
		indirect := false
		for _, o := range p.open[j : len(p.open)-1] {
			indirect = indirect || o.indirect
		}
		if !indirect {
			p.fail("a recursive reference to %d not through a pointer, slice or map", x)
		}
		back = true
	default:
		p.fail("unknown kind %d at %d", k, at)
	}
	p.open = p.open[:len(p.open)-1]
	if p.err != nil {
		return len(s.b)
	}
	s.end[at] = uint16(next)
	if zero {
		s.zero[at>>3] |= 1 << (at & 7)
	}
	if back {
		s.back[at>>3] |= 1 << (at & 7)
	}
	return next
}

// skipShape reads past a value of the shape node at at (a field the
// receiver does not have).
func (d *decoder) skipShape(s *rawShape, at int) {
	if d.err != nil || s.isZero(at) {
		return
	}
	at = s.target(at)
	p := at + 1
	switch s.b[at] {
	case shapeBool, shapeInt8, shapeUint8:
		d.take(1)
	case shapeInt:
		d.varint()
	case shapeUint:
		d.uvarint()
	case shapeFloat32:
		d.take(4)
	case shapeFloat64:
		d.take(8)
	case shapeString, shapeTime:
		d.bytes()
	case shapeBytes:
		if n, ok := d.count(1); ok {
			d.take(n)
		}
	case shapeOpaque:
		n := d.u32()
		d.take(int(n))
	case shapeRef:
		d.skipRef()
	case shapeSlice:
		n, ok := d.count(s.min(p))
		if !ok || !d.enter() {
			return
		}
		for i := 0; i < n && d.err == nil; i++ {
			d.skipShape(s, p)
		}
		d.depth--
	case shapeArray:
		n, q := binary.Uvarint(s.b[p:])
		p += q
		if !d.enter() {
			return
		}
		for i := uint64(0); i < n && d.err == nil; i++ {
			d.skipShape(s, p)
		}
		d.depth--
	case shapeMap:
		v := int(s.end[p])
		n, ok := d.count(max(1, s.min(p)+s.min(v)))
		if !ok || !d.enter() {
			return
		}
		for i := 0; i < n && d.err == nil; i++ {
			d.skipShape(s, p)
			d.skipShape(s, v)
		}
		d.depth--
	case shapePointer:
		if !d.present() || !d.enter() {
			return
		}
		d.skipShape(s, p)
		d.depth--
	case shapeStruct:
		n, q := binary.Uvarint(s.b[p:])
		p += q
		if !d.enter() {
			return
		}
		for i := uint64(0); i < n && d.err == nil && d.spend(1); i++ {
			l, q := binary.Uvarint(s.b[p:])
			p += q + int(l)
			d.skipShape(s, p)
			p = int(s.end[p])
		}
		d.depth--
	}
}

// skipRef reads past a ref (see readRef).
func (d *decoder) skipRef() {
	kind := d.byte()
	if d.err != nil || kind == refNil {
		return
	}
	base := kind &^ refHasUUID
	if base < refSender || base > refThird {
		d.fail("unknown ref kind %d", kind)
		return
	}
	d.bytes()
	if kind&refHasUUID != 0 {
		d.take(16)
	}
	if base == refThird {
		d.take(16)
		d.bytes()
	}
}

// A conversion decodes values of a peer's shape into a local type.
type conv struct {
	dec func(d *decoder, v reflect.Value) // v is settable and zero
}

type convKey struct {
	at int
	t  reflect.Type
}

type convBuilder struct {
	s    *rawShape
	memo map[convKey]*conv
}

// buildConv returns the conversion from the peer's shape s to t, or why
// they are incompatible (naming the field).
func buildConv(s *rawShape, t reflect.Type) (*conv, error) {
	b := convBuilder{s: s, memo: map[convKey]*conv{}}
	return b.conv(0, t)
}

func (b *convBuilder) conv(at int, t reflect.Type) (*conv, error) {
	s := b.s
	at = s.target(at)
	key := convKey{at, t}
	if c, ok := b.memo[key]; ok {
		return c, nil // (a recursive type: filled in by the outer call)
	}
	c := &conv{}
	b.memo[key] = c
	k := s.b[at]
	mine := shapeKindOf(t)
	if !s.hasBack(at) && bytes.Equal(s.b[at:s.end[at]], cachedShape(t)) {
		p, err := planFor(t)
		if err != nil {
			return nil, err
		}
		c.dec = p.dec // the same shape: the type's own plan
		return c, nil
	}
	if k != mine {
		return nil, fmt.Errorf("the sender's is %s, this node's %s", shapeNames[k], t)
	}
	switch k {
	case shapeSlice:
		return c, b.slice(c, at+1, t)
	case shapeArray:
		n, q := binary.Uvarint(s.b[at+1:])
		if n != uint64(t.Len()) {
			return nil, fmt.Errorf("the sender's is an array of %d, this node's %s", n, t)
		}
		elem, err := b.conv(at+1+q, t.Elem())
		if err != nil {
			return nil, err
		}
		c.dec = func(d *decoder, v reflect.Value) {
			for i := 0; i < int(n) && d.err == nil; i++ {
				elem.dec(d, v.Index(i))
			}
		}
		return c, nil
	case shapeMap:
		return c, b.mapConv(c, at+1, t)
	case shapePointer:
		elem, err := b.conv(at+1, t.Elem())
		if err != nil {
			return nil, err
		}
		c.dec = pointerDecoder(t, &elem.dec)
		return c, nil
	case shapeStruct:
		return c, b.structConv(c, at+1, t)
	}
	// A scalar, []byte, a Ref, a time or a WireMarshaler: the same
	// kind is the same encoding (an integer's width is checked as it is
	// decoded).
	p, err := planFor(t)
	if err != nil {
		return nil, err
	}
	c.dec = p.dec
	return c, nil
}

func (b *convBuilder) slice(c *conv, elemAt int, t reflect.Type) error {
	elem, err := b.conv(elemAt, t.Elem())
	if err != nil {
		return err
	}
	min := b.s.min(elemAt)
	c.dec = sliceDecoder(t, &min, &elem.dec)
	return nil
}

func (b *convBuilder) mapConv(c *conv, keyAt int, t reflect.Type) error {
	valAt := int(b.s.end[keyAt])
	if b.s.hasBack(keyAt) || !bytes.Equal(b.s.b[keyAt:b.s.end[keyAt]], cachedShape(t.Key())) {
		// Converting keys could merge two of them into one: a key type
		// must not change.
		return fmt.Errorf("the map's key type changed (here %s)", t.Key())
	}
	kc, err := b.conv(keyAt, t.Key())
	if err != nil {
		return fmt.Errorf("key: %w", err)
	}
	vc, err := b.conv(valAt, t.Elem())
	if err != nil {
		return err
	}
	kmin, vmin := b.s.min(keyAt), b.s.min(valAt)
	c.dec = mapDecoder(t, &kmin, &vmin, &kc.dec, &vc.dec)
	return nil
}

// convField is one step of a struct's conversion: a field of the sender
// decoded into field i of the receiver, or a run of the sender's fields
// the receiver lacks, skipped.
type convField struct {
	i    int // the receiver's field; -1: skip
	name string
	c    *conv
	at   int // skip: where the run's first field (its name) starts
	n    int // skip: how many fields
}

func (b *convBuilder) structConv(c *conv, at int, t reflect.Type) error {
	s := b.s
	mine := map[string]int{}
	for i := range t.NumField() {
		if f := t.Field(i); f.IsExported() {
			mine[f.Name] = i
		}
	}
	n, q := binary.Uvarint(s.b[at:])
	p := at + q
	var steps []convField
	for range n {
		l, q := binary.Uvarint(s.b[p:])
		name := s.b[p+q : p+q+int(l)]
		node := p + q + int(l)
		if i, ok := mine[string(name)]; ok {
			fc, err := b.conv(node, t.Field(i).Type)
			if err != nil {
				return fmt.Errorf("field %s: %w", name, err)
			}
			steps = append(steps, convField{i: i, name: string(name), c: fc})
		} else if k := len(steps) - 1; k >= 0 && steps[k].i < 0 {
			steps[k].n++
		} else {
			steps = append(steps, convField{i: -1, at: p, n: 1})
		}
		p = int(s.end[node])
	}
	c.dec = func(d *decoder, v reflect.Value) {
		if !d.enter() {
			return
		}
		for _, st := range steps {
			if d.err != nil {
				break
			}
			if st.i < 0 {
				d.skipFields(s, st.at, st.n)
				continue
			}
			st.c.dec(d, v.Field(st.i))
			if d.err != nil {
				d.err = fmt.Errorf("field %s: %w", st.name, d.err)
			}
		}
		d.depth--
	}
	return nil
}

// skipFields reads past n consecutive fields of a struct's shape, the
// first of which (its name) starts at at.
func (d *decoder) skipFields(s *rawShape, at, n int) {
	for range n {
		if !d.spend(1) { // (a field skipped is work: a hostile shape of many empty fields is bounded by the payload's size)
			return
		}
		l, q := binary.Uvarint(s.b[at:])
		node := at + q + int(l)
		d.skipShape(s, node)
		at = int(s.end[node])
	}
}

// convert decodes a payload of the peer's shape into a new value of mt
// through c, consuming it whole.
func (d *decoder) convert(mt *msgType, c *conv, b []byte) (any, error) {
	v := reflect.New(mt.t)
	d.b, d.off, d.depth, d.err = b, 0, 0, nil
	d.budget = decodeBudgetFactor*len(b) + decodeBudgetBase
	c.dec(d, v.Elem())
	if d.err == nil && d.remaining() != 0 {
		d.fail("%d bytes left over after the sender's last field", d.remaining())
	}
	d.b = nil
	if d.err != nil {
		return nil, d.err
	}
	return mt.box(v), nil
}
