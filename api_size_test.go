package troupe_test

import (
	"go/ast"
	"go/doc"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"
)

// maxExported is how many names the package may export (#55: the API
// page leads with the ten calls a newcomer needs, and a name added is one
// more to read past). 260 at #55; 270 since work pulling (#57), whose
// ten names docs/changes.md lists: a new capability's names are counted
// and listed, never added in passing.
const maxExported = 270

// exportedNames lists the package's exported names as go doc does: its
// constants, variables, functions and types, and the methods of its
// exported types (those of a type's constructors and values included).
// Test files do not count.
func exportedNames(t *testing.T) []string {
	t.Helper()
	paths, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	var files []*ast.File
	for _, p := range paths {
		if strings.HasSuffix(p, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, p, nil, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	d, err := doc.NewFromFiles(fset, files, "troupe")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	values := func(vs []*doc.Value) {
		for _, v := range vs {
			for _, s := range v.Decl.Specs {
				for _, n := range s.(*ast.ValueSpec).Names {
					if n.IsExported() {
						names = append(names, n.Name)
					}
				}
			}
		}
	}
	values(d.Consts)
	values(d.Vars)
	for _, f := range d.Funcs {
		names = append(names, f.Name)
	}
	for _, typ := range d.Types {
		names = append(names, typ.Name)
		values(typ.Consts)
		values(typ.Vars)
		for _, f := range typ.Funcs {
			names = append(names, f.Name)
		}
		for _, m := range typ.Methods {
			names = append(names, typ.Name+"."+m.Name)
		}
	}
	return names
}

// TestExportedNamesStayFew: the package exports at most maxExported
// names, so that the API stays one that can be read (#55).
func TestExportedNamesStayFew(t *testing.T) {
	t.Parallel()
	names := exportedNames(t)
	if len(names) < 100 {
		t.Fatalf("found only %d exported names: the count is broken", len(names))
	}
	if len(names) > maxExported {
		t.Errorf("troupe exports %d names, more than %d (#55). Before adding one, make what is there "+
			"do it: a method of the type the call is about, an option or a field of an existing config "+
			"rather than a new function, a value documented where it applies rather than a constant, a "+
			"result's struct written out rather than a type of its own; or unexport a name a user does "+
			"not need. If the name must stay, take another away, and list every change in "+
			"docs/changes.md. The names:\n%s", len(names), maxExported, strings.Join(names, " "))
	}
}
