package troupe_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"regexp"
	"strings"
	"testing"
)

// longRun skips t unless TROUPE_LONG is set: a long run (a soak, a
// multi-process scenario, a build of the package elsewhere), which CI
// runs in its own step of .ci/run on every submission, and
// `TROUPE_LONG=1 go test -run <name> .` runs by hand. The default suite
// stays fast without it. Any of the variables orSet runs it too (a
// nemesis's duration or seed, say).
func longRun(t *testing.T, orSet ...string) {
	t.Helper()
	for _, env := range orSet {
		if os.Getenv(env) != "" {
			return
		}
	}
	if os.Getenv("TROUPE_LONG") == "" {
		t.Skip("a long run: TROUPE_LONG=1 runs it (.ci/run's long-run step does)")
	}
}

// slowTest skips t under -short: it takes a second or more, and -short is
// for the edit-and-run loop (the default suite and CI run it).
func slowTest(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("takes a second or more: runs without -short")
	}
}

// Every long run is in CI's long-run step: a test that calls longRun and
// that .ci/run does not name would never run. Names are matched whole, in
// the -run patterns of .ci/run's steps (a name in a comment, or the
// prefix of another, does not count), and every name a step runs is a
// test that exists (a renamed test would make its step run nothing).
func TestLongRunsAreInCI(t *testing.T) {
	t.Parallel()
	ci, err := os.ReadFile(".ci/run")
	if err != nil {
		t.Fatal(err)
	}
	// The steps' patterns: -run='^(A|B)$' or -run '^A$' (fuzzing's
	// -run='^$' runs no test).
	steps := map[string]string{} // test name → the line of .ci/run that runs it
	runFlag := regexp.MustCompile(`-run[= ]'\^\(?([\w|]+)\)?\$'`)
	for line := range strings.SplitSeq(string(ci), "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "#") {
			continue
		}
		for _, m := range runFlag.FindAllStringSubmatch(line, -1) {
			for name := range strings.SplitSeq(m[1], "|") {
				steps[name] = line
			}
		}
	}
	if len(steps) == 0 {
		t.Fatal("found no -run patterns in .ci/run: the pattern no longer matches how its steps are written")
	}
	fset := token.NewFileSet()
	pkgs, err := parser.ParseDir(fset, ".", func(fi fs.FileInfo) bool { return strings.HasSuffix(fi.Name(), "_test.go") }, 0)
	if err != nil {
		t.Fatal(err)
	}
	tests := map[string]bool{}
	found, besides := 0, 0
	for _, pkg := range pkgs {
		for name, f := range pkg.Files {
			for _, d := range f.Decls {
				fd, ok := d.(*ast.FuncDecl)
				if !ok || fd.Recv != nil || !strings.HasPrefix(fd.Name.Name, "Test") || fd.Body == nil {
					continue
				}
				test := fd.Name.Name
				tests[test] = true
				ast.Inspect(fd.Body, func(n ast.Node) bool {
					call, ok := n.(*ast.CallExpr)
					if !ok {
						return true
					}
					id, ok := call.Fun.(*ast.Ident)
					if !ok {
						return true
					}
					switch id.Name {
					case "longRun":
						found++
						if line, ok := steps[test]; !ok || !strings.Contains(line, "TROUPE_LONG=1") {
							t.Errorf("%s (%s) is a long run that no step of .ci/run runs with TROUPE_LONG=1", test, name)
						}
					case "buildsBesideTheSuite":
						// A test that skips under -race runs in the docs'
						// step, without it: CI's default run is a race run.
						besides++
						if line, ok := steps[test]; !ok || strings.Contains(line, "-race") {
							t.Errorf("%s (%s) skips under -race, and no step of .ci/run runs it without -race", test, name)
						}
					}
					return true
				})
			}
		}
	}
	for name := range steps {
		if !tests[name] {
			t.Errorf(".ci/run runs %s, which is no test: a step that runs nothing passes", name)
		}
	}
	if besides == 0 {
		t.Error("found no test that calls buildsBesideTheSuite: the pattern no longer matches how they are written")
	}
	if found == 0 {
		t.Fatal("found no long runs: the pattern no longer matches how they are written")
	}
}
