package troupe

import (
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"
)

type diffItemV1 struct{ SKU string }
type diffItemV2 struct {
	SKU  string
	Note string
}
type diffTree struct {
	Name string
	Kids []*diffTree
}
type diffMapRec struct{ M map[*diffMapRec]int }

type diffTree2 struct {
	Kids []*diffTree2
	Name string
	Size int
}

// schemaOf is t's schema as a node reports it, under key.
func schemaOf(key string, t reflect.Type) MessageSchema {
	raw := shapeOf(t)
	s, _ := parseShape(raw)
	return MessageSchema{Key: key, Type: t.String(), Raw: raw, Shape: s.text(0)}
}

// TestDiffSchemas: the verdicts troupe schema diff prints, type pair by
// type pair, are the rules a session applies.
func TestDiffSchemas(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	type (
		base struct {
			ID   int64
			Name string
		}
		added struct {
			ID   int64
			Name string
			Tags []string
		}
		moved struct {
			Name string
			ID   int32
		}
		kind struct {
			ID   string
			Name string
		}
		nested1 struct{ Items []diffItemV1 }
		nested2 struct{ Items []diffItemV2 }
		nestedK struct{ Items []struct{ SKU int } }
		arr3    struct{ A [3]int }
		arr4    struct{ A [4]int }
		mapS    struct{ M map[string]int }
		mapI    struct{ M map[int]int }
		mapV    struct{ M map[string]uint8 }
		ptr     struct{ P *diffItemV1 }
		ptr2    struct{ P *diffItemV2 }
	)
	cases := []struct {
		name         string
		a, b         any
		same         bool
		onlyA, onlyB []string
		aToB, bToA   string // "" compatible, else a substring of the error
	}{
		{"same", base{}, base{}, true, nil, nil, "", ""},
		{"a field added", base{}, added{}, false, nil, []string{"Tags"}, "", ""},
		{"reordered and narrowed", base{}, moved{}, false, nil, nil, "", ""},
		{"a kind changed", base{}, kind{}, false, nil, nil, "field ID: the sender's is a signed integer, the receiver's string", "field ID: the sender's is string"},
		{"a nested field added", nested1{}, nested2{}, false, nil, []string{"Items[].Note"}, "", ""},
		{"a nested kind changed", nested1{}, nestedK{}, false, nil, nil, "field Items: field SKU:", "field Items: field SKU:"},
		{"an array's length", arr3{}, arr4{}, false, nil, nil, "an array of 3, the receiver's of 4", "an array of 4"},
		{"a map's key", mapS{}, mapI{}, false, nil, nil, "key type changed", "key type changed"},
		{"a map's value", mapS{}, mapV{}, false, nil, nil, "field M: the sender's is a signed integer, the receiver's uint8", "the sender's is uint8"},
		{"through a pointer", ptr{}, ptr2{}, false, nil, []string{"P.Note"}, "", ""},
		{"a recursive type", diffTree{}, diffTree2{}, false, nil, []string{"Size"}, "", ""},
	}
	cases = append(cases, struct {
		name         string
		a, b         any
		same         bool
		onlyA, onlyB []string
		aToB, bToA   string
	}{"a recursive map key, the same", diffMapRec{}, diffMapRec{}, true, nil, nil, "", ""})
	for _, c := range cases {
		a, b := schemaOf("k", reflect.TypeOf(c.a)), schemaOf("k", reflect.TypeOf(c.b))
		d := DiffSchemas(a, b)
		// The verdict is the session's: a conversion builds exactly when
		// the diff says the direction is compatible.
		for _, dir := range []struct {
			from, to reflect.Type
			err      error
		}{{reflect.TypeOf(c.a), reflect.TypeOf(c.b), d.AToB}, {reflect.TypeOf(c.b), reflect.TypeOf(c.a), d.BToA}} {
			var convErr error
			if string(shapeOf(dir.from)) != string(shapeOf(dir.to)) { // (a session takes the same shape as it is: matchShape)
				rs, _ := parseShape(shapeOf(dir.from))
				_, convErr = buildConv(rs, dir.to)
			}
			if (convErr == nil) != (dir.err == nil) {
				t.Errorf("%s: %v to %v: the diff says %v, a session %v", c.name, dir.from, dir.to, dir.err, convErr)
			}
		}
		check := func(dir string, err error, want string) {
			switch {
			case want == "" && err != nil:
				t.Errorf("%s: %s: %v, want compatible", c.name, dir, err)
			case want != "" && (err == nil || !errors.Is(err, ErrIncompatibleMessage) || !strings.Contains(err.Error(), want)):
				t.Errorf("%s: %s: %v, want ErrIncompatibleMessage with %q", c.name, dir, err, want)
			}
		}
		check("a to b", d.AToB, c.aToB)
		check("b to a", d.BToA, c.bToA)
		if d.Same != c.same || !slices.Equal(d.OnlyA, c.onlyA) || !slices.Equal(d.OnlyB, c.onlyB) {
			t.Errorf("%s: same %v, only a %q, only b %q; want %v, %q, %q", c.name, d.Same, d.OnlyA, d.OnlyB, c.same, c.onlyA, c.onlyB)
		}
		if (d.AToB == nil && d.BToA == nil) != (c.aToB == "" && c.bToA == "") {
			t.Errorf("%s: both ways nil is %v", c.name, d.AToB == nil && d.BToA == nil)
		}
	}
	if got := schemaOf("k", reflect.TypeOf(diffTree{})).Shape; got != "struct { Name string; Kids []*(recursive) }" {
		t.Errorf("a recursive type's text: %q", got)
	}
	if got := schemaOf("k", reflect.TypeOf(struct {
		M map[string][2]float64
		B []byte
	}{})).Shape; got != "struct { M map[string][2]float64; B []byte }" {
		t.Errorf("the text: %q", got)
	}
	shapeless := MessageSchema{Key: "k", Type: "main.Big", Shape: "(none: decoded positionally)"}
	if d := DiffSchemas(shapeless, shapeless); d.Same || (d.AToB == nil && d.BToA == nil) || !errors.Is(d.AToB, ErrIncompatibleMessage) || !strings.Contains(d.AToB.Error(), "no shape") {
		t.Errorf("two types without a shape, one name: %+v", d)
	}
	if d := DiffSchemas(MessageSchema{Key: "a", Raw: []byte{shapeInt}}, MessageSchema{Key: "b", Raw: []byte{shapeInt}}); d.AToB == nil && d.BToA == nil {
		t.Error("two keys compared as compatible")
	}
	if d := DiffSchemas(MessageSchema{Key: "a", Raw: []byte{shapeStruct, 9}}, MessageSchema{Key: "a", Raw: []byte{shapeInt}}); (d.AToB == nil && d.BToA == nil) || d.AToB == nil || !strings.Contains(d.AToB.Error(), "malformed") {
		t.Errorf("a malformed shape: %+v", d)
	}
}
