package troupe

import (
	"reflect"
	"testing"
)

// troupe's own types are named on the wire without the package's path
// (TestCopiesAtTwoModulePathsFormOneCluster runs copies at two paths):
// here, how a reflect name loses a copy's path, and only its.
func TestWithoutPkgPath(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	const path = "example.com/app/troupe"
	for _, c := range []struct{ in, want string }{
		{"example.com/app/troupe.clusterMsg", "troupe.clusterMsg"},
		{"Ref[example.com/app/troupe.Member]", "Ref[troupe.Member]"},
		{"example.com/x.Box[map[string]*example.com/app/troupe.Ref[example.com/x.Foo]]", "example.com/x.Box[map[string]*troupe.Ref[example.com/x.Foo]]"},
		{"Pair[example.com/app/troupe.A,example.com/app/troupe.B]", "Pair[troupe.A,troupe.B]"},
		{"Box[struct { A example.com/app/troupe.Foo }]", "Box[struct { A troupe.Foo }]"},
		{"[]troupe.Ref[example.com/app/troupe.Ref[string]]", "[]troupe.Ref[troupe.Ref[string]]"},
		// paths that only end or start like it are another package's
		{"example.org/example.com/app/troupe.Foo", "example.org/example.com/app/troupe.Foo"},
		{"my.example.com/app/troupe.Foo", "my.example.com/app/troupe.Foo"},
		{"example.com/app/troupe/sub.Foo", "example.com/app/troupe/sub.Foo"},
		{"Box[x-example.com/app/troupe.Foo]", "Box[x-example.com/app/troupe.Foo]"},
		{"string", "string"},
	} {
		if got := withoutPkgPath(c.in, path); got != c.want {
			t.Errorf("withoutPkgPath(%q) = %q, want %q", c.in, got, c.want)
		}
	}
	if got := withoutPkgPath("troupe.Ref[troupe.Member]", "troupe"); got != "troupe.Ref[troupe.Member]" {
		t.Errorf("at path troupe: %q", got)
	}
}

func TestProtocolNames(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	for _, c := range []struct {
		t    reflect.Type
		want string
	}{
		{reflect.TypeFor[clusterMsg](), "troupe.clusterMsg"},
		{reflect.TypeFor[Ref[Member]](), "troupe.Ref[troupe.Member]"},
		{reflect.TypeFor[[]Ref[string]](), "[]troupe.Ref[string]"},
		{reflect.TypeFor[downRequest](), "troupe.cluster.down"}, // registered: its wire key
		{reflect.TypeFor[string](), "troupe.string"},
	} {
		if got := protocolName(c.t); got != c.want {
			t.Errorf("protocolName(%v) = %q, want %q", c.t, got, c.want)
		}
		if !sameProtocol(c.want, c.t) {
			t.Errorf("sameProtocol(%q, %v) is false", c.want, c.t)
		}
	}
	if sameProtocol("example.com/other/troupe.clusterMsg", reflect.TypeFor[clusterMsg]()) {
		t.Error("a name with another copy's path matches")
	}
	if sameProtocol("troupe.cluster.down", reflect.TypeFor[clusterMsg]()) || sameProtocol("troupe.downRequest", reflect.TypeFor[downRequest]()) {
		t.Error("another type's name, or a registered type's Go name, matches")
	}
}
