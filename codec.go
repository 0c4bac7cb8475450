package troupe

import (
	"encoding/binary"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync/atomic"
	"time"
	"unsafe"
)

// Errors of the payload codec.
var (
	// ErrNoWireKey is the dead-letter reason for a message told to a
	// remote actor whose type has no wire key (see [SetWireKey]), and
	// for an inbound message naming a key this node does not know.
	ErrNoWireKey = errors.New("troupe: message type has no wire key")
	// ErrMalformed is wrapped by every error about bytes that do not decode:
	// a truncated, oversized or inconsistent frame or payload.
	ErrMalformed = errors.New("troupe: malformed input")
	// ErrIncompatibleMessage is the dead-letter reason of a message whose
	// frame was whole but whose payload does not decode into the type
	// that has its wire key here — most often a peer that runs
	// another version of the type. The error names the key and, where it
	// can, the field. Only that message is lost: the association goes on.
	// [DiffSchemas] wraps it, too, for a direction in which messages would
	// not decode.
	ErrIncompatibleMessage = errors.New("troupe: incompatible message")
)

// WireMarshaler is the fast path for a message type that encodes itself:
// AppendWire appends the encoding of the value to b and returns the result.
// A type that implements it must also implement [WireUnmarshaler] on its
// pointer; [SetWireKey] checks.
//
// AppendWire is called on the goroutine that sends the message (Tell,
// Send, Ask), with no troupe lock held, so it may itself send, to the
// same node too; for a message sent before its association's handshake
// completes, it is called later on the association's writer goroutine,
// likewise with no lock held. It must not retain b.
type WireMarshaler interface {
	AppendWire(b []byte) []byte
}

// WireUnmarshaler decodes what [WireMarshaler.AppendWire] wrote. b holds
// exactly those bytes and must not be retained after the call returns.
type WireUnmarshaler interface {
	UnmarshalWire(b []byte) error
}

// msgType is a registered message type: its wire key and its codec plan.
type msgType struct {
	key  string
	t    reflect.Type
	p    *plan
	fast bool        // encodes itself (WireMarshaler)
	flat []flatField // non-nil: made of scalars only (see flat.go)
	// flatMax bounds a flat value's encoding, but for its strings'
	// bytes; flatStrings says whether it has any.
	flatMax     int
	flatStrings bool
	alloc       func() unsafe.Pointer // a new zero value (nil: reflect.New)
	// plain: flat, without strings, and not empty: no pointers, so a value
	// may be decoded into, and copied out of, plain memory (see box.go),
	// of words 8-byte words.
	plain bool
	words int

	// shape is the type's shape (see shape.go), sent once a session
	// before its first message; nil for a WireMarshaler or a shape
	// longer than maxShapeSize.
	shape []byte

	// internal: one of troupe's own messages (gossip, stats, registry),
	// not a user's, nor a built-in like string.
	internal bool

	direct   bool           // stored directly in an interface (see box)
	typeWord unsafe.Pointer // the interface type word of t

	// stamped: one of troupe's own messages that carries its sender,
	// which the association stamps (sender.go).
	stamped bool
}

// wireTypes holds every registered message type. Reads go through snapshots so the
// hot path takes no lock.
var wireTypes struct {
	mu     mutex[lkWireTypes]
	byKey  atomic.Pointer[map[string]*msgType]
	byType atomic.Pointer[map[reflect.Type]*msgType]
	byWord atomic.Pointer[map[unsafe.Pointer]*msgType] // by interface type word
}

// SetWireKey gives T the wire key key, so that values of T can cross a
// link; only types that cross a link need one. string, int, int64, uint64,
// bool, float64, []byte and struct{} have theirs already. Both nodes must
// give the same type the same key. Call it from init or main, before the
// first message of T is sent.
//
// T's fields are encoded. Fields may be bool, integers, floats, strings,
// []byte, slices, arrays, maps, nested structs, pointers, time.Time,
// time.Duration and [Ref] values; interfaces, channels, funcs and complex
// numbers are refused, and so are unexported fields, at any depth (the
// error names the field's path): a local send would keep them and a remote
// one lose them. Blank (_) fields are allowed. A type may instead implement
// [WireMarshaler] and [WireUnmarshaler] to encode itself, and a field of
// such a type is not looked into.
//
// SetWireKey panics if the key is empty or longer than 255 bytes, if
// the key is already another type's or the type already has another key,
// or if T cannot be encoded: these are programming errors, found at
// start-up. Setting the same pair twice is allowed.
func SetWireKey[T any](key string) {
	alloc := func() unsafe.Pointer { return unsafe.Pointer(new(T)) }
	if err := registerType(reflect.TypeFor[T](), key, alloc); err != nil {
		panic(err)
	}
}

// ownPkgPath is troupe's import path, which its own message types have.
var ownPkgPath = reflect.TypeFor[Node]().PkgPath()

// registerType registers t under key; alloc, if not nil, allocates a zero
// value of t (faster than reflect.New).
func registerType(t reflect.Type, key string, alloc func() unsafe.Pointer) error {
	if key == "" || len(key) > maxWireKey {
		return fmt.Errorf("troupe: SetWireKey[%s]: key must be 1 to %d bytes", t, maxWireKey)
	}
	wireTypes.mu.Lock()
	defer wireTypes.mu.Unlock()
	byKey, byType := map[string]*msgType{}, map[reflect.Type]*msgType{}
	if m := wireTypes.byKey.Load(); m != nil {
		for k, v := range *m {
			byKey[k] = v
			byType[v.t] = v
		}
	}
	if old, ok := byKey[key]; ok {
		if old.t == t {
			return nil
		}
		return fmt.Errorf("troupe: SetWireKey[%s]: key %q is already the wire key of %s", t, key, old.t)
	}
	if old, ok := byType[t]; ok {
		return fmt.Errorf("troupe: SetWireKey[%s]: the type already has the wire key %q", t, old.key)
	}
	mt := &msgType{key: key, t: t, alloc: alloc, internal: t.PkgPath() == ownPkgPath}
	mt.stamped = mt.internal && t.Implements(stampableType)
	if t.Implements(wireMarshalerType) || reflect.PointerTo(t).Implements(wireUnmarshalerType) {
		if !t.Implements(wireMarshalerType) || !reflect.PointerTo(t).Implements(wireUnmarshalerType) {
			return fmt.Errorf("troupe: SetWireKey[%s]: implement both AppendWire on %s and UnmarshalWire on *%s", t, t, t)
		}
		mt.fast = true
	}
	// troupe's own messages are exempt: their unexported fields (the
	// sender's uid) are stamped by the receiving association, never read
	// from the wire.
	if !mt.fast && !mt.internal {
		root := t.Name()
		if root == "" {
			root = t.String()
		}
		if path, in := unexportedField(t, root, map[reflect.Type]bool{}); path != "" {
			return fmt.Errorf("troupe: SetWireKey[%s]: field %s is unexported, so it would not cross the wire "+
				"(a message sent on the same node would keep it, one sent to another node would lose it): "+
				"export it, or implement WireMarshaler and WireUnmarshaler on %s", t, path, in)
		}
	}
	p, err := planFor(t)
	if err != nil {
		return fmt.Errorf("SetWireKey[%s]: %w", t, err)
	}
	mt.p = p
	if !mt.fast {
		mt.shape = shapeOf(t)
		mt.flat = flatFields(t)
		mt.plain = mt.flat != nil && alloc != nil && t.Size() > 0
		mt.words = int(t.Size()+7) / 8
		for _, f := range mt.flat {
			mt.plain = mt.plain && f.kind != reflect.String
			mt.flatStrings = mt.flatStrings || f.kind == reflect.String
		}
		mt.flatMax = binary.MaxVarintLen64 * len(mt.flat)
	}
	mt.initBox()
	byKey[key] = mt
	byType[t] = mt
	byWord := make(map[unsafe.Pointer]*msgType, len(byType))
	for _, v := range byType {
		byWord[v.typeWord] = v
	}
	wireTypes.byKey.Store(&byKey)
	wireTypes.byType.Store(&byType)
	wireTypes.byWord.Store(&byWord)
	return nil
}

// Built-in types that may cross the wire without registration, so that
// simple replies (Ask for a string or an int) need no declaration.
func init() {
	SetWireKey[string]("troupe.string")
	SetWireKey[int]("troupe.int")
	SetWireKey[int64]("troupe.int64")
	SetWireKey[uint64]("troupe.uint64")
	SetWireKey[bool]("troupe.bool")
	SetWireKey[float64]("troupe.float64")
	SetWireKey[[]byte]("troupe.bytes")
	SetWireKey[struct{}]("troupe.empty")
}

func typeByKey(key string) *msgType {
	if m := wireTypes.byKey.Load(); m != nil {
		return (*m)[key]
	}
	return nil
}

func typeOf(t reflect.Type) *msgType {
	if m := wireTypes.byType.Load(); m != nil {
		return (*m)[t]
	}
	return nil
}

// typeOfValue returns the registered type of msg's dynamic type, or nil:
// typeOf without reflect, by the interface's type word.
func typeOfValue(msg any) *msgType {
	return typeOfWord((*eface)(unsafe.Pointer(&msg)).typ)
}

// typeOfWord returns the registered type whose interface type word is w.
// A small cache in front of the map (every remote Tell asks): two slots
// a word, each filled once with the first type that finds it empty, and
// never written again. A type's entry never changes once registered, so a
// slot is never wrong, and two hot types that share slots do not take
// them from each other (the one without a slot asks the map, as before).
func typeOfWord(w unsafe.Pointer) *msgType {
	i := typeSlot(w)
	if mt := typeCache[i].Load(); mt != nil && mt.typeWord == w {
		return mt
	}
	if mt := typeCache[i^1].Load(); mt != nil && mt.typeWord == w {
		return mt
	}
	m := wireTypes.byWord.Load()
	if m == nil {
		return nil
	}
	mt := (*m)[w]
	if mt != nil && !typeCache[i].CompareAndSwap(nil, mt) {
		typeCache[i^1].CompareAndSwap(nil, mt)
	}
	return mt
}

const typeCacheBits = 7

func typeSlot(w unsafe.Pointer) uint64 {
	return uint64(uintptr(w)) * 0x9e3779b97f4a7c15 >> (64 - typeCacheBits)
}

var typeCache [1 << typeCacheBits]atomic.Pointer[msgType]

// protocolName is how a protocol type is named on the wire for [Resolve]:
// its wire key if registered, otherwise its name (see typeName), which
// does not depend on where troupe's package lives.
func protocolName(t reflect.Type) string {
	if mt := typeOf(t); mt != nil {
		return mt.key
	}
	return typeName(t)
}

// typeName names an unregistered type for another node: a named type by
// its package path and name, but troupe's own types as "troupe." and
// their name, and so in type arguments too ("troupe.Ref[troupe.Member]",
// "example.com/app.Box[troupe.Ref[string]]"), so that copies of the
// package at two module paths (or a copy and the troupe module) name them
// alike; an unnamed type as reflect does, troupe's path left out the same
// way. A user's own type keeps its package path: two programs that share
// an unregistered protocol type import it from one path.
func typeName(t reflect.Type) string {
	if t.Name() != "" && t.PkgPath() != "" {
		pkg := t.PkgPath()
		if pkg == ownPkgPath {
			pkg = "troupe"
		}
		return pkg + "." + withoutPkgPath(t.Name(), ownPkgPath)
	}
	return withoutPkgPath(t.String(), ownPkgPath)
}

// legacyTypeName is what typeName was before it left troupe's path out:
// what a node built from an earlier copy of the package sends, which
// names the same type when that copy lives at this one's path.
func legacyTypeName(t reflect.Type) string {
	if t.Name() != "" && t.PkgPath() != "" {
		return t.PkgPath() + "." + t.Name()
	}
	return t.String()
}

// sameProtocol reports whether name, a protocol's name from another node,
// names t: it is t's [protocolName], or, t being unregistered, the name an
// earlier copy of the package at this one's path gave it (a rolling
// upgrade of a program that copied the package has both).
func sameProtocol(name string, t reflect.Type) bool {
	return name == protocolName(t) || typeOf(t) == nil && name == legacyTypeName(t)
}

// withoutPkgPath writes "troupe." for each qualified name of the package
// at path in s, a reflect type name: where path is preceded by the start
// of s or by a character that cannot be in an import path (so a path
// that merely ends like it is left alone).
func withoutPkgPath(s, path string) string {
	if path == "troupe" || !strings.Contains(s, path+".") {
		return s
	}
	var b strings.Builder
	for {
		i := strings.Index(s, path+".")
		if i < 0 {
			b.WriteString(s)
			return b.String()
		}
		if i > 0 && isImportPathByte(s[i-1]) {
			b.WriteString(s[:i+1])
			s = s[i+1:]
			continue
		}
		b.WriteString(s[:i])
		b.WriteString("troupe.")
		s = s[i+len(path)+1:]
	}
}

// isImportPathByte reports whether c may be in an import path (letters,
// digits, and "-._~+/", as the go command allows).
func isImportPathByte(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("-._~+/", c) >= 0
}

var (
	stampableType       = reflect.TypeFor[stampable]()
	wireMarshalerType   = reflect.TypeFor[WireMarshaler]()
	wireUnmarshalerType = reflect.TypeFor[WireUnmarshaler]()
	timeType            = reflect.TypeFor[time.Time]()
)

// present reads a pointer's flag: whether a value follows (0 no, 1 yes;
// anything else fails d).
func (d *decoder) present() bool {
	switch d.byte() {
	case 0:
		return false
	case 1:
		return true
	}
	d.fail("pointer flag is not 0 or 1")
	return false
}

// encoder appends one payload. It has no effect beyond its buffer: refs
// are encoded relative to the receiving node (peer), and the temporary
// reply refs it meets are listed in exports for the caller to make
// reachable before the payload is sent.
type encoder struct {
	b       []byte
	peer    NodeUID // the node the payload is for (zero in codec tests)
	exports []exporter
	depth   int
	err     error
}

func (e *encoder) enter() bool {
	if e.depth++; e.depth > maxDepth {
		if e.err == nil {
			e.err = fmt.Errorf("%w: value nested deeper than %d", ErrMalformed, maxDepth)
		}
		return false
	}
	return true
}

func (e *encoder) appendString(s string) {
	e.b = binary.AppendUvarint(e.b, uint64(len(s)))
	e.b = append(e.b, s...)
}

func (e *encoder) appendBytes(b []byte) {
	e.b = binary.AppendUvarint(e.b, uint64(len(b)))
	e.b = append(e.b, b...)
}

// Ref kinds on the wire. Append only: values are on the wire.
const (
	refNil      byte = 0 // the zero Ref
	refSender   byte = 1 // an actor on the node that sent the payload
	refReceiver byte = 2 // an actor on the node that receives it
	refThird    byte = 3 // an actor on another node: uid and address follow
	refHasUUID  byte = 0x80
)

// appendRef writes h relative to the association: the sender's own actors
// and the receiver's actors need no address.
func (e *encoder) appendRef(h *handle) {
	if h == nil {
		e.b = append(e.b, refNil)
		return
	}
	kind := refThird
	switch {
	case h.local != nil:
		kind = refSender
		if x, ok := h.local.(exporter); ok {
			e.exports = append(e.exports, x)
		}
	case e.peer != (NodeUID{}) && h.key.node == e.peer:
		kind = refReceiver
	}
	if h.key.uuid != (UUID{}) {
		kind |= refHasUUID
	}
	e.b = append(e.b, kind)
	e.appendString(h.key.path)
	if kind&refHasUUID != 0 {
		e.b = append(e.b, h.key.uuid[:]...)
	}
	if kind&^refHasUUID == refThird {
		e.b = append(e.b, h.key.node[:]...)
		var addr string
		if h.assoc != nil {
			addr = h.assoc.addr().String()
		}
		e.appendString(addr) // empty: the receiver cannot reach it
	}
}

// decoder reads one payload, or one frame body. The first error sticks;
// every read after it returns zero values, so plans need not check after
// each step. It has no effect beyond the value it builds: a ref is read as
// its key and address, and handed to binder, which the frame handler
// supplies, to be bound to an actor or an association.
type decoder struct {
	b      []byte
	off    int
	binder refBinder // nil: refs keep their identity only (codec tests)
	depth  int
	err    error
	budget int // bytes the payload's slices, maps and pointers may still allocate
}

// refBinder turns a ref read from a payload into the handle the decoded
// value holds. The association a payload arrived on is the binder of its
// refs (see assoc.bindRef): only it knows which node is the sender.
type refBinder interface {
	bindRef(kind byte, key refKey, addr string) *handle
}

// A decoded payload may allocate, for its slices, maps and pointers,
// decodeBudgetFactor times its encoded size plus decodeBudgetBase: a
// []string of empty strings (16 bytes of header per wire byte) fits, a
// payload built to multiply the receiver's memory does not.
const (
	decodeBudgetFactor = 16
	decodeBudgetBase   = 64 << 10
)

// spend charges n bytes against the payload's allocation budget; false
// (and a malformed payload) past it.
func (d *decoder) spend(n int) bool {
	if n < 0 || n > d.budget {
		d.fail("the payload would allocate more than %d× its %d bytes", decodeBudgetFactor, len(d.b))
		return false
	}
	d.budget -= n
	return true
}

// mapEntryCost estimates what one entry of a map of type t takes: its key
// and value, and as much again for the buckets around them.
func mapEntryCost(t reflect.Type) int {
	return 2 * int(t.Key().Size()+t.Elem().Size()+1)
}

func (d *decoder) fail(format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: %s", ErrMalformed, fmt.Sprintf(format, args...))
	}
}

func (d *decoder) enter() bool {
	if d.depth++; d.depth > maxDepth {
		d.fail("value nested deeper than %d", maxDepth)
		return false
	}
	return true
}

func (d *decoder) remaining() int { return len(d.b) - d.off }

func (d *decoder) take(n int) []byte {
	if d.err != nil {
		return nil
	}
	if n < 0 || n > d.remaining() {
		d.fail("need %d bytes, have %d", n, d.remaining())
		return nil
	}
	b := d.b[d.off : d.off+n]
	d.off += n
	return b
}

func (d *decoder) byte() byte {
	if b := d.take(1); b != nil {
		return b[0]
	}
	return 0
}

func (d *decoder) u32() uint32 {
	if b := d.take(4); b != nil {
		return binary.BigEndian.Uint32(b)
	}
	return 0
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	x, n := binary.Uvarint(d.b[d.off:])
	if n <= 0 {
		d.fail("bad uvarint")
		return 0
	}
	d.off += n
	return x
}

func (d *decoder) varint() int64 {
	if d.err != nil {
		return 0
	}
	x, n := binary.Varint(d.b[d.off:])
	if n <= 0 {
		d.fail("bad varint")
		return 0
	}
	d.off += n
	return x
}

// maxWireKey bounds a wire key: long enough for any reverse-domain name,
// and short enough that a type table entry stays small (maxTableEntry).
const maxWireKey = 255

// zeroSizeCount is how many elements of a zero-size type (which take no
// bytes on the wire) a payload may declare: enough for any real use, and
// bounded so that a hostile count costs no time.
const zeroSizeCount = 1024

// count reads a nil-or-length prefix (0 = nil, n+1 = n elements) and checks
// that n elements of at least min bytes each can fit in what is left, so a
// hostile length never makes the decoder allocate. ok is false for nil or
// on error.
func (d *decoder) count(min int) (int, bool) {
	x := d.uvarint()
	if x == 0 || d.err != nil {
		return 0, false
	}
	n := x - 1
	limit := uint64(d.remaining())
	if min > 0 {
		limit /= uint64(min)
	} else if limit < zeroSizeCount {
		limit = zeroSizeCount
	}
	if n > limit {
		d.fail("%d elements cannot fit in %d bytes", n, d.remaining())
		return 0, false
	}
	return int(n), true
}

func (d *decoder) bytes() []byte {
	x := d.uvarint()
	if x > uint64(d.remaining()) {
		d.fail("length %d exceeds the %d bytes left", x, d.remaining())
		return nil
	}
	return d.take(int(x))
}

func (d *decoder) string() string {
	return string(d.bytes())
}

func (d *decoder) readRef() *handle {
	kind := d.byte()
	if d.err != nil || kind == refNil {
		return nil
	}
	base := kind &^ refHasUUID
	if base < refSender || base > refThird {
		d.fail("unknown ref kind %d", kind)
		return nil
	}
	var key refKey
	key.path = d.string()
	if kind&refHasUUID != 0 {
		copy(key.uuid[:], d.take(16))
	}
	var addr string
	if base == refThird {
		copy(key.node[:], d.take(16))
		addr = d.string()
	}
	if d.err != nil {
		return nil
	}
	if d.binder == nil {
		return &handle{key: key}
	}
	return d.binder.bindRef(base, key, addr)
}

// payload appends the encoding of msg (of registered type mt). The encoder
// is reused message after message, so encoding allocates nothing of its
// own.
func (e *encoder) payload(dst []byte, mt *msgType, msg any) ([]byte, error) {
	clear(e.exports)
	e.exports = e.exports[:0]
	if mt.fast {
		return msg.(WireMarshaler).AppendWire(dst), nil
	}
	if mt.flat != nil {
		return appendFlatValue(dst, mt.flat, (*eface)(unsafe.Pointer(&msg)).data), nil
	}
	e.b, e.depth, e.err = dst, 0, nil
	mt.p.enc(e, reflect.ValueOf(msg))
	dst, err := e.b, e.err
	e.b = nil
	return dst, err
}

// flatInto decodes the flat value of mt in b, which must be consumed
// whole, into the zeroed value at p.
func (d *decoder) flatInto(mt *msgType, b []byte, p unsafe.Pointer) error {
	d.b, d.off, d.depth, d.err = b, 0, 0, nil
	d.decodeFlat(mt.flat, p)
	if d.err == nil && d.remaining() != 0 {
		d.fail("%d bytes left over after the last field of %s (the sender's type has more fields, or fields of other kinds)", d.remaining(), mt.key)
	}
	d.b = nil
	if d.err != nil {
		return fmt.Errorf("payload %q: %w", mt.key, d.err)
	}
	return nil
}

// explain decodes b as mt once more, field by field (not along the flat
// fast path, which does not track fields), to say which field a payload
// that failed to decode broke at.
func (d *decoder) explain(mt *msgType, b []byte) error {
	v := reflect.New(mt.t)
	d.b, d.off, d.depth, d.err = b, 0, 0, nil
	d.budget = decodeBudgetFactor*len(b) + decodeBudgetBase
	mt.p.dec(d, v.Elem())
	if d.err == nil && d.remaining() != 0 {
		d.fail("%d bytes left over after the last field (the sender's type has more fields, or fields of other kinds)", d.remaining())
	}
	d.b = nil
	return d.err
}

// payload decodes a value of mt from b, which must be consumed whole.
func (d *decoder) payload(mt *msgType, b []byte) (any, error) {
	if mt.flat != nil && mt.alloc != nil && !mt.direct {
		p := mt.alloc()
		if err := d.flatInto(mt, b, p); err != nil {
			return nil, err
		}
		return mt.boxAt(p), nil
	}
	v := reflect.New(mt.t)
	if mt.fast {
		if err := v.Interface().(WireUnmarshaler).UnmarshalWire(b); err != nil {
			return nil, fmt.Errorf("%w: %s: %v", ErrMalformed, mt.key, err)
		}
		return mt.box(v), nil
	}
	d.b, d.off, d.depth, d.err = b, 0, 0, nil
	d.budget = decodeBudgetFactor*len(b) + decodeBudgetBase
	if mt.flat != nil {
		d.decodeFlat(mt.flat, v.UnsafePointer())
	} else {
		mt.p.dec(d, v.Elem())
	}
	if d.err == nil && d.remaining() != 0 {
		d.fail("%d bytes left over after the last field of %s (the sender's type has more fields, or fields of other kinds)", d.remaining(), mt.key)
	}
	d.b = nil
	if d.err != nil {
		return nil, fmt.Errorf("payload %q: %w", mt.key, d.err)
	}
	return mt.box(v), nil
}

// whole returns the decoder's error, or one if bytes are left over: every
// frame body must be consumed whole.
func (d *decoder) whole(what string) error {
	if d.err == nil && d.remaining() != 0 {
		d.fail("%d bytes after the %s frame", d.remaining(), what)
	}
	return d.err
}
