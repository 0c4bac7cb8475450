package troupe

import (
	"cmp"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Schemas: which message types a node speaks, and whether two versions
// of a program agree on them. A node's schema is the shape (see shape.go)
// of every message type with a wire key in its process; troupe schema prints
// it, and troupe schema diff compares two nodes' type by type with the
// rules a session applies to each message.

// MessageSchema is one message type with a wire key as it travels: its wire
// key, its Go type, and its shape (field names and kinds, recursively).
type MessageSchema struct {
	Key string `json:"key"`
	// Type is the Go type, as the node's process names it, but for
	// troupe's own types, named "troupe." and their name wherever the
	// package lives (type arguments too).
	Type string `json:"type"`
	// Shape is the shape as Go-like text, for example
	// "struct { ID int; Tags []string }" (int, int16, int32 and int64 read
	// "int", and the unsigned ones "uint": they share an encoding; int8
	// and uint8 are one byte, kinds of their own).
	Shape string `json:"shape"`
	// Raw is the shape's bytes (see Shapes in wire.md): what a session
	// sends before the type's first message, except for a type that
	// encodes itself (a WireMarshaler, whose Raw is the one byte of that
	// kind and which is sent without a shape); nil for a type too large
	// or too deep for a shape (it decodes positionally).
	Raw []byte `json:"raw,omitempty"`
}

// Schema returns the schema of every message type with a wire key in this
// process ([SetWireKey], and troupe's own), by wire key.
func Schema() []MessageSchema {
	m := wireTypes.byKey.Load()
	if m == nil {
		return nil
	}
	out := make([]MessageSchema, 0, len(*m))
	for key, mt := range *m {
		raw := cachedShape(mt.t)
		s := MessageSchema{Key: key, Type: withoutPkgPath(mt.t.String(), ownPkgPath), Raw: raw, Shape: "(none: decoded positionally)"}
		if rs, err := parseShape(raw); err == nil {
			s.Shape = rs.text(0)
		}
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b MessageSchema) int { return cmp.Compare(a.Key, b.Key) })
	return out
}

// FetchSchema asks the node listening at address, through n, for its
// [Schema], the way [Node.FetchStats] asks for its stats.
func (n *Node) FetchSchema(ctx context.Context, address string) ([]MessageSchema, error) {
	doc, err := fetchStats(ctx, n, address, statsRequest{Schema: true})
	if err != nil {
		return nil, err
	}
	var v struct {
		Schema *[]MessageSchema `json:"schema"`
	}
	if err := json.Unmarshal(doc, &v); err != nil {
		return nil, fmt.Errorf("the node at %s answered something that is not a stats document: %w", address, err)
	}
	if v.Schema == nil {
		return nil, fmt.Errorf("the node at %s answered without its schema", address)
	}
	return *v.Schema, nil
}

// schemaDiff is what DiffSchemas returns.
type schemaDiff = struct {
	Key          string
	Same         bool
	OnlyA, OnlyB []string
	AToB, BToA   error
}

// DiffSchemas compares two schemas of one wire key, by the rules a session
// applies to each message (see docs/upgrades.md): fields match by name, a
// field only the sender has is skipped, one only the receiver has stays
// zero, and a change of a field's kind, of an array's length or of a
// map's key type is incompatible. Same says the shapes are identical;
// OnlyA and OnlyB are the fields, as dotted paths from the message
// ("Items[].Note"), that only one side has. AToB is nil when messages
// sent under A's schema decode into B's, else why not (wrapping
// [ErrIncompatibleMessage], naming the field and both kinds; or saying
// that a side has no shape, or that one is malformed); BToA the other
// way. Messages decode both ways when both are nil. An int, int16, int32
// or int64 widened or narrowed among those (or an unsigned one among its
// own) compares as compatible: a value that does not fit the receiver's
// width is still one dead letter when it comes. A type that encodes
// itself (a [WireMarshaler]) compares as compatible: its bytes are its
// author's to keep readable.
func DiffSchemas(a, b MessageSchema) struct {
	Key          string
	Same         bool
	OnlyA, OnlyB []string
	AToB, BToA   error
} {
	d := schemaDiff{Key: a.Key}
	if a.Key != b.Key {
		d.AToB = fmt.Errorf("%w: wire keys %q and %q", ErrIncompatibleMessage, a.Key, b.Key)
		d.BToA = d.AToB
		return d
	}
	if a.Raw == nil || b.Raw == nil {
		// A type without a shape (too large or too deep) decodes
		// positionally: nothing can say whether two versions agree.
		d.AToB = fmt.Errorf("%w: %s: a side has no shape (too large or too deep), so troupe cannot check it: messages decode by position, or not at all", ErrIncompatibleMessage, a.Key)
		d.BToA = d.AToB
		return d
	}
	if string(a.Raw) == string(b.Raw) {
		d.Same = true // (as a session: the same shape decodes with the type's own plan)
		return d
	}
	sa, err := parseShape(a.Raw)
	if err == nil {
		var sb *rawShape
		if sb, err = parseShape(b.Raw); err == nil {
			ab := shapeComparer{s: sa, r: sb, seen: map[[2]int]bool{}}
			if e := ab.compare(0, 0, ""); e != nil {
				d.AToB = fmt.Errorf("%w: %s: %w", ErrIncompatibleMessage, a.Key, e)
			}
			ba := shapeComparer{s: sb, r: sa, seen: map[[2]int]bool{}}
			if e := ba.compare(0, 0, ""); e != nil {
				d.BToA = fmt.Errorf("%w: %s: %w", ErrIncompatibleMessage, a.Key, e)
			}
			d.OnlyA, d.OnlyB = ab.onlySender, ba.onlySender
			return d
		}
	}
	d.AToB = fmt.Errorf("%w: %s: %w", ErrIncompatibleMessage, a.Key, err)
	d.BToA = d.AToB
	return d
}

// shapeComparer walks a sender's and a receiver's shapes side by side, as
// buildConv walks a shape and a type.
type shapeComparer struct {
	s, r       *rawShape
	seen       map[[2]int]bool // pairs of nodes compared or being compared (recursion)
	onlySender []string        // fields only the sender has, as dotted paths
}

func (c *shapeComparer) compare(sa, ra int, path string) error {
	sa, ra = c.s.target(sa), c.r.target(ra)
	if c.seen[[2]int{sa, ra}] {
		return nil
	}
	if !c.s.hasBack(sa) && !c.r.hasBack(ra) && string(c.s.b[sa:c.s.end[sa]]) == string(c.r.b[ra:c.r.end[ra]]) {
		return nil // the same shape: decoded with the receiver's own plan, as buildConv does
	}
	c.seen[[2]int{sa, ra}] = true
	sk, rk := c.s.b[sa], c.r.b[ra]
	if sk != rk {
		return fmt.Errorf("the sender's is %s, the receiver's %s", shapeNames[sk], shapeNames[rk])
	}
	switch sk {
	case shapeSlice:
		return c.compare(sa+1, ra+1, path+"[]")
	case shapePointer:
		return c.compare(sa+1, ra+1, path)
	case shapeArray:
		sn, sq := binary.Uvarint(c.s.b[sa+1:])
		rn, rq := binary.Uvarint(c.r.b[ra+1:])
		if sn != rn {
			return fmt.Errorf("the sender's is an array of %d, the receiver's of %d", sn, rn)
		}
		return c.compare(sa+1+sq, ra+1+rq, path+"[]")
	case shapeMap:
		sv, rv := int(c.s.end[sa+1]), int(c.r.end[ra+1])
		if c.s.hasBack(sa+1) || c.r.hasBack(ra+1) || string(c.s.b[sa+1:sv]) != string(c.r.b[ra+1:rv]) {
			return errors.New("the map's key type changed")
		}
		return c.compare(sv, rv, path+"[]")
	case shapeStruct:
		mine := map[string]int{}
		c.r.fields(ra, func(name string, at int) { mine[name] = at })
		if path != "" {
			path += "."
		}
		var err error
		c.s.fields(sa, func(name string, at int) {
			ra, ok := mine[name]
			switch {
			case !ok:
				c.onlySender = append(c.onlySender, path+name)
			case err == nil:
				if e := c.compare(at, ra, path+name); e != nil {
					err = fmt.Errorf("field %s: %w", name, e)
				}
			}
		})
		return err
	}
	return nil
}

// fields calls f with each field's name and shape node of the struct
// node at at.
func (s *rawShape) fields(at int, f func(name string, at int)) {
	n, q := binary.Uvarint(s.b[at+1:])
	p := at + 1 + q
	for range n {
		l, q := binary.Uvarint(s.b[p:])
		node := p + q + int(l)
		f(string(s.b[p+q:node]), node)
		p = int(s.end[node])
	}
}

// text renders the node at at as Go-like text.
func (s *rawShape) text(at int) string {
	k := s.b[at]
	switch k {
	case shapeBool:
		return "bool"
	case shapeInt8:
		return "int8"
	case shapeUint8:
		return "uint8"
	case shapeInt:
		return "int"
	case shapeUint:
		return "uint"
	case shapeFloat32:
		return "float32"
	case shapeFloat64:
		return "float64"
	case shapeString:
		return "string"
	case shapeBytes:
		return "[]byte"
	case shapeRef:
		return "Ref"
	case shapeTime:
		return "time.Time"
	case shapeOpaque:
		return "WireMarshaler"
	case shapeBack:
		return "(recursive)"
	case shapeSlice:
		return "[]" + s.text(at+1)
	case shapePointer:
		return "*" + s.text(at+1)
	case shapeArray:
		n, q := binary.Uvarint(s.b[at+1:])
		return "[" + strconv.FormatUint(n, 10) + "]" + s.text(at+1+q)
	case shapeMap:
		return "map[" + s.text(at+1) + "]" + s.text(int(s.end[at+1]))
	case shapeStruct:
		var b strings.Builder
		b.WriteString("struct {")
		first := true
		s.fields(at, func(name string, f int) {
			if !first {
				b.WriteByte(';')
			}
			first = false
			b.WriteString(" " + name + " " + s.text(f))
		})
		if !first {
			b.WriteByte(' ')
		}
		b.WriteByte('}')
		return b.String()
	}
	return "?"
}
