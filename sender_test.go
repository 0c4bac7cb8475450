package troupe

import (
	"reflect"
	"testing"
)

// Who sent a message is one mechanism: every registered message type of
// troupe's own that embeds sentBy is stamped by the association, and a
// message arriving from a peer carries that peer's uid whatever its
// bytes say (the sender's fields never cross the wire).
func TestEveryMessageThatCarriesItsSenderIsStamped(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	sentByType := reflect.TypeFor[sentBy]()
	carriers := 0
	for _, mt := range *wireTypes.byKey.Load() {
		embeds := false
		if mt.t.Kind() == reflect.Struct {
			f, ok := mt.t.FieldByName("sentBy")
			embeds = ok && f.Anonymous && f.Type == sentByType
		}
		if embeds != mt.stamped {
			t.Errorf("%s (%s): embeds sentBy %v, stamped %v", mt.key, mt.t, embeds, mt.stamped)
		}
		if !embeds {
			continue
		}
		carriers++
		zero := reflect.New(mt.t).Elem().Interface()
		peer := NodeUID{7}
		got := reflect.New(mt.t).Elem()
		got.Set(reflect.ValueOf(stampSender(zero, peer)))
		s := got.FieldByName("sentBy")
		if NodeUID(s.Field(0).Bytes()) != peer || !s.Field(1).Bool() {
			t.Errorf("%s: stamped as %+v", mt.key, got)
		}
	}
	if carriers < 12 { // the registrar's request, four of the receptionist's, the singleton's, six of sharding's
		t.Errorf("%d message types carry their sender, want at least 12", carriers)
	}
}
