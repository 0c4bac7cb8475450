package troupe_test

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"troupe"
)

// Types for the rule that a message type's fields must all be exported:
// the codec sends only exported fields, so an unexported one would arrive
// whole on the same node and as its zero value on another.
type (
	lowerOrder struct {
		id  string
		qty int
	}
	lowerLine struct {
		SKU string
		qty int
	}
	lowerCart   struct{ Lines []lowerLine }
	lowerBoxed  struct{ Line *lowerLine }
	lowerByKey  struct{ Lines map[string]lowerLine }
	lowerArray  struct{ Lines [2]lowerLine }
	lowerNested struct{ Cart lowerCart }
	lowerBase   struct{ ID string }
	lowerEmbeds struct {
		lowerBase
		N int
	}
	// blankField has a blank field, which holds nothing: allowed.
	blankField struct {
		_ struct{}
		N int
	}
)

// selfCoded keeps its fields unexported and encodes them itself.
type selfCoded struct {
	id  string
	qty uint8
}

func (s selfCoded) AppendWire(b []byte) []byte {
	return append(append(b, s.qty), s.id...)
}

func (s *selfCoded) UnmarshalWire(b []byte) error {
	if len(b) < 1 {
		return errors.New("selfCoded: empty")
	}
	s.qty, s.id = b[0], string(b[1:])
	return nil
}

// holdsSelfCoded holds a self-encoding type: its unexported fields are
// that type's business.
type holdsSelfCoded struct {
	Items []selfCoded
	One   *selfCoded
}

// registerErr registers T under key and returns SetWireKey's panic
// as an error, or nil.
func registerErr[T any](key string) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%v", r)
		}
	}()
	troupe.SetWireKey[T](key)
	return nil
}

// SetWireKey refuses a type with an unexported field at any depth
// (nested structs, slices, arrays, maps, pointers, an embedded struct),
// with an error that names the field by its path and says how to fix it;
// a type that encodes itself, or a field of such a type, is accepted, and
// so is a blank field.
func TestSetWireKeyRefusesUnexportedFields(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name  string
		err   error
		field string
	}{
		{"top level", registerErr[lowerOrder]("troupe.test.lower.order"), "lowerOrder.id"},
		{"slice of structs", registerErr[lowerCart]("troupe.test.lower.cart"), "lowerCart.Lines[].qty"},
		{"pointer", registerErr[lowerBoxed]("troupe.test.lower.boxed"), "lowerBoxed.Line.qty"},
		{"map of structs", registerErr[lowerByKey]("troupe.test.lower.bykey"), "lowerByKey.Lines[].qty"},
		{"array of structs", registerErr[lowerArray]("troupe.test.lower.array"), "lowerArray.Lines[].qty"},
		{"nested struct", registerErr[lowerNested]("troupe.test.lower.nested"), "lowerNested.Cart.Lines[].qty"},
		{"embedded unexported struct", registerErr[lowerEmbeds]("troupe.test.lower.embeds"), "lowerEmbeds.lowerBase"},
	} {
		if c.err == nil {
			t.Errorf("%s: registered, want refused for %s", c.name, c.field)
			continue
		}
		msg := c.err.Error()
		for _, want := range []string{"field " + c.field + " ", "unexported", "export it", "WireMarshaler"} {
			if !strings.Contains(msg, want) {
				t.Errorf("%s: error %q does not mention %q", c.name, msg, want)
			}
		}
	}
	for _, c := range []struct {
		name string
		err  error
	}{
		{"a WireMarshaler", registerErr[selfCoded]("troupe.test.lower.self")},
		{"a field of WireMarshalers", registerErr[holdsSelfCoded]("troupe.test.lower.holds-self")},
		{"a blank field", registerErr[blankField]("troupe.test.lower.blank")},
	} {
		if c.err != nil {
			t.Errorf("%s: %v, want registered", c.name, c.err)
		}
	}
}

// Every field of a registered message, all exported, at every depth,
// arrives whole on another node as on the same one: nested structs,
// slices, arrays and maps of them, pointers, times, and a field that
// encodes itself with unexported fields of its own.
type (
	wholeLine struct {
		SKU   string
		Qty   int
		Price float64
		Tags  []string
	}
	wholeOrder struct {
		ID     string
		Lines  []wholeLine
		First  *wholeLine
		ByID   map[string]wholeLine
		Pair   [2]wholeLine
		Placed time.Time
		Wait   time.Duration
		Note   selfCoded
	}
)

type wholeMsg struct {
	Order wholeOrder
	Reply troupe.Ref[wholeOrder]
}

func init() {
	troupe.SetWireKey[wholeOrder]("troupe.test.whole.order")
	troupe.SetWireKey[wholeMsg]("troupe.test.whole.msg")
}

func TestAMessageArrivesWholeOnAnotherNode(t *testing.T) {
	t.Parallel()
	here := startQuiet(t, quietConfig("here"))
	there := startQuiet(t, quietConfig("there"))
	for _, n := range []*troupe.Node{here, there} {
		if _, err := troupe.Spawn(n, "echo", troupe.Behavior[wholeMsg]{Receive: func(c *troupe.Context[wholeMsg], m wholeMsg) {
			m.Reply.Tell(m.Order)
		}}); err != nil {
			t.Fatal(err)
		}
	}
	want := wholeOrder{
		ID:     "o-1",
		Lines:  []wholeLine{{SKU: "a", Qty: 2, Price: 1.5, Tags: []string{"x", ""}}, {SKU: "b", Qty: -1}},
		First:  &wholeLine{SKU: "f", Qty: 1},
		ByID:   map[string]wholeLine{"k": {SKU: "k", Qty: 7, Tags: []string{"t"}}},
		Pair:   [2]wholeLine{{SKU: "p0"}, {SKU: "p1", Price: 3}},
		Placed: time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC),
		Wait:   1500 * time.Millisecond,
		Note:   selfCoded{id: "note", qty: 9},
	}
	for _, c := range []struct {
		name string
		to   troupe.Ref[wholeMsg]
	}{
		{"same node", remoteRef[wholeMsg](t, here, here, "/user/echo")},
		{"other node", remoteRef[wholeMsg](t, here, there, "/user/echo")},
	} {
		got, err := troupe.Ask(ctxFor(t), c.to, func(r troupe.Ref[wholeOrder]) wholeMsg { return wholeMsg{Order: want, Reply: r} })
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: got\n%+v\nwant\n%+v", c.name, got, want)
		}
	}
}
