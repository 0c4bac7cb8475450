package troupe_test

import (
	"context"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode"
)

// The promises of README.md's "Use it in your module": a copy of the
// package's files builds and runs in another module, and so does a
// replace directive. Every Go snippet in the README and the guides
// (docs/) runs: see doc_snippets_test.go.

// readmeBlocks returns the README's fenced code blocks of the given
// language, in order.
func readmeBlocks(t *testing.T, lang string) []string {
	t.Helper()
	return markdownBlocks(t, "README.md", lang)
}

// docFiles are the Markdown files whose snippets and links the tests
// check: the README and every guide in docs/.
func docFiles(t *testing.T) []string {
	t.Helper()
	guides, err := filepath.Glob(filepath.Join("docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	if len(guides) == 0 {
		t.Fatal("no guides in docs/")
	}
	return append([]string{"README.md"}, guides...)
}

// markdownBlocks returns the fenced code blocks of the given language in
// the Markdown file name, in order.
func markdownBlocks(t *testing.T, name, lang string) []string {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	var cur []string
	in := false
	for line := range strings.SplitSeq(string(b), "\n") {
		switch {
		case !in && line == "```"+lang:
			in, cur = true, nil
		case in && line == "```":
			in = false
			out = append(out, strings.Join(cur, "\n")+"\n")
		case in:
			cur = append(cur, line)
		}
	}
	return out
}

// readmeProgram returns the README's one complete program: the tour.
func readmeProgram(t *testing.T) string {
	for _, b := range readmeBlocks(t, "go") {
		if strings.HasPrefix(b, "package main") {
			return b
		}
	}
	t.Fatal("README.md has no complete program (a go block starting with package main)")
	return ""
}

// goCmd runs the go command in dir and returns its combined output. A
// failure to fetch a module (no proxy, empty module cache) skips the test.
func goCmd(t *testing.T, dir string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
	out, err := cmd.CombinedOutput()
	if err != nil && regexp.MustCompile(`dial tcp|no such host|proxy|GOPROXY|module lookup disabled`).Match(out) {
		t.Skipf("go %s needs golang.org/x/sys, which neither the module cache nor a proxy provides here:\n%s", strings.Join(args, " "), out)
	}
	return string(out), err
}

// needGo skips a test when the go command is not at hand or -short asks
// for speed.
func needGo(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a module with the go command")
	}
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go command on PATH")
	}
}

// buildsBesideTheSuite skips a test that builds and runs programs with
// the go command unless TROUPE_DOCS is set, and always under the race
// detector (see raceBuild): .ci/run runs it in a step of its own,
// without the detector. Beside the whole suite such a build takes 15 s
// of two busy cores; alone, 8.
func buildsBesideTheSuite(t *testing.T) {
	t.Helper()
	if raceBuild {
		t.Skip("builds programs with the go command: run without -race (.ci/run's step \"the docs' programs\" does)")
	}
	if os.Getenv("TROUPE_DOCS") == "" {
		t.Skip("builds programs with the go command: set TROUPE_DOCS=1 (.ci/run's step \"the docs' programs\" does)")
	}
}

// tourOutput is what the README's tour prints, line by line, in any
// order: the printer actor prints on its own goroutine.
var tourOutput = []string{
	"asked: pong 2 from home",
	"pong 1 from home",
	"asked: pong 3 from away",
	"worker stopped: troupe: peer node left",
	"asked: pong 4 from home",
}

// buildAndRun tidies the module in dir, builds it and runs the program
// (the README's tour) to its end, within a minute, checking that it
// prints what the README says it prints.
func buildAndRun(t *testing.T, dir string) {
	t.Helper()
	if out, err := goCmd(t, dir, "mod", "tidy"); err != nil {
		t.Fatalf("go mod tidy: %v\n%s", err, out)
	}
	bin := filepath.Join(dir, "app")
	if runtime.GOOS == "windows" {
		bin += ".exe"
	}
	if out, err := goCmd(t, dir, "build", "-o", bin, "."); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin).CombinedOutput()
	if err != nil {
		t.Fatalf("the README's tour: %v (%v)\n%s", err, ctx.Err(), out)
	}
	got := strings.Split(strings.TrimSpace(string(out)), "\n")
	slices.Sort(got)
	want := slices.Clone(tourOutput)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("the README's tour printed\n%s\nwant, in any order:\n%s", out, strings.Join(tourOutput, "\n"))
	}
}

// writeFile writes content to dir/name, creating dir.
func writeFile(t *testing.T, dir, name, content string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestVendoredCopy(t *testing.T) {
	longRun(t)
	needGo(t)
	dir := t.TempDir()
	// Exactly the README's steps: the library's non-test files and the
	// licence, copied into a directory of the module.
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, "LICENSE")
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		writeFile(t, filepath.Join(dir, "troupe"), f, string(b))
	}
	writeFile(t, dir, "go.mod", "module example.com/app\n\ngo 1.26.0\n")
	writeFile(t, dir, "main.go", readmeProgram(t))
	buildAndRun(t, dir)
}

func TestReplaceDirective(t *testing.T) {
	t.Parallel()
	slowTest(t)
	needGo(t)
	buildsBesideTheSuite(t)
	here, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	writeFile(t, dir, "go.mod", fmt.Sprintf("module example.com/app\n\ngo 1.26.0\n\nrequire troupe v0.0.0\n\nreplace troupe => %s\n", filepath.ToSlash(here)))
	writeFile(t, dir, "main.go", strings.Replace(readmeProgram(t), `"example.com/app/troupe"`, `"troupe"`, 1))
	buildAndRun(t, dir)
}

// README.md's "Where things are" names every library file of the package
// (a name with * stands for the files it matches), and every file it
// names exists: the map a newcomer opens first cannot rot (#30).
func TestWhereThingsAreIsComplete(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "\n## Where things are\n")
	if !ok {
		t.Fatal(`README.md has no "## Where things are" section`)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	named := regexp.MustCompile("`([A-Za-z0-9_*]+\\.go)`").FindAllStringSubmatch(section, -1)
	var patterns []string
	for _, m := range named {
		patterns = append(patterns, m[1])
		files, _ := filepath.Glob(m[1])
		if len(files) == 0 {
			t.Errorf("README's table names %s, which is not in the package", m[1])
		}
	}
	lib, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range lib {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		listed := false
		for _, p := range patterns {
			if ok, _ := filepath.Match(p, f); ok {
				listed = true
				break
			}
		}
		if !listed {
			t.Errorf("%s is not in README's \"Where things are\" table", f)
		}
	}
}

// TestTypesHaveOneStory is the package's rule of cohesion (see "Where
// things are" in the README): Node wires subsystems (at most 25 fields
// and 50 methods), no struct has more than 40 fields, and a type's
// methods live in at most three files. Node's exported methods are its
// API and stay with the subject they belong to (Stats in stats.go), so
// only the files of its unexported methods count. The types that do not
// meet the rule yet are listed in shapeCeilings with what they have
// today; the test fails when one has more, and when one has less, so
// that the ceiling comes down with it. A function past about 120 lines
// is logged, not failed: short by judgement, not split at a line count.
// A field of an unnamed struct type counts as one field.
func TestTypesHaveOneStory(t *testing.T) {
	t.Parallel()
	const maxFields, maxFiles, maxFuncLines = 40, 3, 120
	lib, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fs := token.NewFileSet()
	fields := map[string]int{}
	methods := map[string]map[string]bool{} // by type, by name: a method in each platform's file is one
	files := map[string]map[string]bool{}
	for _, name := range lib {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fs, name, nil, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		// A file built for some platforms only (peercred_linux.go and
		// its siblings) is one file with its siblings: its stem.
		stem := strings.TrimSuffix(name, ".go")
		if k := strings.LastIndexByte(stem, '_'); k > 0 && (isBuildTagged(f) || platforms[stem[k+1:]]) {
			stem = stem[:k]
		}
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.GenDecl:
				for _, sp := range d.Specs {
					ts, ok := sp.(*ast.TypeSpec)
					if !ok {
						continue
					}
					if st, ok := ts.Type.(*ast.StructType); ok {
						n := 0
						for _, fl := range st.Fields.List {
							n += max(1, len(fl.Names))
						}
						// (a struct declared in each platform's file is one)
						fields[ts.Name.Name] = max(fields[ts.Name.Name], n)
					}
				}
			case *ast.FuncDecl:
				if n := fs.Position(d.End()).Line - fs.Position(d.Pos()).Line + 1; n > maxFuncLines {
					t.Logf("%s: %s has %d lines; is it still one step?", name, d.Name.Name, n)
				}
				if d.Recv == nil {
					continue
				}
				typ := d.Recv.List[0].Type
				if st, ok := typ.(*ast.StarExpr); ok {
					typ = st.X
				}
				if ix, ok := typ.(*ast.IndexExpr); ok {
					typ = ix.X
				}
				if ix, ok := typ.(*ast.IndexListExpr); ok {
					typ = ix.X
				}
				id, ok := typ.(*ast.Ident)
				if !ok {
					continue
				}
				if methods[id.Name] == nil {
					methods[id.Name], files[id.Name] = map[string]bool{}, map[string]bool{}
				}
				methods[id.Name][d.Name.Name] = true
				if id.Name != "Node" || !d.Name.IsExported() {
					files[id.Name][stem] = true
				}
			}
		}
	}
	if fields["Node"] == 0 || len(methods["Node"]) == 0 {
		t.Fatalf("counted %d fields and %d methods of Node: the count is broken", fields["Node"], len(methods["Node"]))
	}
	if fields["Node"] > 25 || len(methods["Node"]) > 50 {
		t.Errorf("Node has %d fields and %d methods, more than 25 and 50: it wires subsystems, it is not one", fields["Node"], len(methods["Node"]))
	}
	for typ, n := range fields {
		limit := shapeCeilings[typ]
		switch {
		case limit.fields == 0 && n > maxFields:
			t.Errorf("%s has %d fields, more than %d: which owner does each belong to?", typ, n, maxFields)
		case limit.fields != 0 && n != limit.fields:
			t.Errorf("%s has %d fields, its ceiling in shapeCeilings is %d: it may come down, never go up", typ, n, limit.fields)
		}
	}
	for typ, fs := range files {
		limit := shapeCeilings[typ]
		switch {
		case limit.files == 0 && len(fs) > maxFiles:
			t.Errorf("%s has methods in %d files, more than %d: %v", typ, len(fs), maxFiles, slices.Sorted(maps.Keys(fs)))
		case limit.files != 0 && len(fs) != limit.files:
			t.Errorf("%s has methods in %d files, its ceiling in shapeCeilings is %d: it may come down, never go up: %v", typ, len(fs), limit.files, slices.Sorted(maps.Keys(fs)))
		}
	}
}

// platforms are the file-name suffixes that build a file on one system
// only, without a //go:build line.
var platforms = map[string]bool{"linux": true, "windows": true, "darwin": true, "freebsd": true, "openbsd": true, "netbsd": true, "dragonfly": true, "solaris": true, "illumos": true, "aix": true, "android": true, "ios": true, "plan9": true, "js": true, "wasip1": true}

// isBuildTagged reports whether f has a //go:build constraint.
func isBuildTagged(f *ast.File) bool {
	for _, cg := range f.Comments {
		if cg.Pos() > f.Package {
			break
		}
		for _, c := range cg.List {
			if strings.HasPrefix(c.Text, "//go:build ") {
				return true
			}
		}
	}
	return false
}

// The cluster, sharding, the lease and etcd plug into the core from above
// (clusterPlug in seams.go, storeClient in registries.go): no core file
// names an unexported name that only their files define.
func TestTheCoreNamesNoLayer(t *testing.T) {
	t.Parallel()
	layer := regexp.MustCompile(`^(cluster|sharding|membership|downing|lease|etcd)`)
	lib, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fs := token.NewFileSet()
	parsed := map[string]*ast.File{}
	layerNames, coreNames := map[string]bool{}, map[string]bool{}
	for _, name := range lib {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fs, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		parsed[name] = f
		defined := coreNames
		if layer.MatchString(name) {
			defined = layerNames
		}
		// What a file defines: its functions, methods, types and
		// package-level values; a core file's struct fields and interface
		// methods too (a layer type's field is reached through a value
		// the core was handed).
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				defined[d.Name.Name] = true
			case *ast.GenDecl:
				for _, sp := range d.Specs {
					switch sp := sp.(type) {
					case *ast.TypeSpec:
						defined[sp.Name.Name] = true
						if layer.MatchString(name) {
							break
						}
						switch ty := sp.Type.(type) {
						case *ast.StructType:
							for _, fl := range ty.Fields.List {
								for _, id := range fl.Names {
									defined[id.Name] = true
								}
							}
						case *ast.InterfaceType:
							for _, fl := range ty.Methods.List {
								for _, id := range fl.Names {
									defined[id.Name] = true
								}
							}
						}
					case *ast.ValueSpec:
						for _, id := range sp.Names {
							defined[id.Name] = true
						}
					}
				}
			}
		}
	}
	for name := range coreNames {
		delete(layerNames, name)
	}
	// Words too common to tell a call into a layer from a local variable.
	for _, w := range strings.Fields("reply pause merged keys touched") {
		delete(layerNames, w)
	}
	for name, f := range parsed {
		if layer.MatchString(name) {
			continue
		}
		ast.Inspect(f, func(n ast.Node) bool {
			if id, ok := n.(*ast.Ident); ok && layerNames[id.Name] && !ast.IsExported(id.Name) {
				t.Errorf("%s: %s names %s, which only the layer files define: the core offers a hook (seams.go, registries.go) and the layer installs it", fs.Position(id.Pos()), name, id.Name)
			}
			return true
		})
	}
	if len(layerNames) == 0 {
		t.Fatal("found no names the layer files define: the file pattern no longer matches them")
	}
}

// shapeCeilings are the types that do not yet meet TestTypesHaveOneStory,
// with what they have (fields, files holding their methods; Node's
// unexported ones only): a change lowers a ceiling when it lowers the
// count, and never raises one. None today: every type meets the rule.
var shapeCeilings = map[string]struct{ fields, files int }{}

// mdLink matches a Markdown link's target: [text](target).
var mdLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// codeSpan matches inline code, where a ](x) is not a link.
var codeSpan = regexp.MustCompile("`[^`\n]*`")

// prose returns a Markdown text without its fenced code blocks and its
// inline code.
func prose(text string) string {
	var out []string
	in := false
	for line := range strings.SplitSeq(text, "\n") {
		if strings.HasPrefix(line, "```") {
			in = !in
			continue
		}
		if !in {
			out = append(out, codeSpan.ReplaceAllString(line, ""))
		}
	}
	return strings.Join(out, "\n")
}

// headingAnchor is the anchor GitHub makes of a heading: lower case,
// punctuation dropped, spaces as hyphens.
func headingAnchor(h string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(h)) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// anchors returns the anchors of a Markdown file's headings (outside code
// blocks).
func anchors(t *testing.T, name string) map[string]bool {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	in := false
	for line := range strings.SplitSeq(string(b), "\n") {
		if strings.HasPrefix(line, "```") {
			in = !in
			continue
		}
		if !in && strings.HasPrefix(line, "#") {
			out[headingAnchor(strings.TrimLeft(line, "#"))] = true
		}
	}
	return out
}

// Every relative link of the README and the guides reaches a file that
// exists (and a heading of it, when the link names one), and the README
// links every guide: a newcomer can reach each from the first page (#55).
func TestDocsLinksResolve(t *testing.T) {
	t.Parallel()
	linked := map[string]bool{}
	for _, f := range docFiles(t) {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range mdLink.FindAllStringSubmatch(prose(string(b)), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			path, frag, _ := strings.Cut(target, "#")
			file := f
			if path != "" {
				if filepath.IsAbs(path) {
					t.Errorf("%s: link %s is absolute; links between the docs are relative", f, target)
					continue
				}
				file = filepath.Join(filepath.Dir(f), filepath.FromSlash(path))
			}
			if _, err := os.Stat(file); err != nil {
				t.Errorf("%s: link %s: %v", f, target, err)
				continue
			}
			if f == "README.md" {
				linked[filepath.ToSlash(file)] = true
			}
			if frag != "" && strings.HasSuffix(file, ".md") && !anchors(t, file)[frag] {
				t.Errorf("%s: link %s: %s has no heading with the anchor #%s", f, target, file, frag)
			}
		}
	}
	for _, f := range docFiles(t)[1:] {
		if !linked[filepath.ToSlash(f)] {
			t.Errorf("README.md does not link %s", f)
		}
	}
}

// testFuncs returns the names of the test, benchmark and fuzz functions of
// the module's test files.
func testFuncs(t *testing.T) map[string]bool {
	t.Helper()
	decl := regexp.MustCompile(`(?m)^func ((?:Test|Benchmark|Fuzz)\w+)\(`)
	out := map[string]bool{}
	for _, pattern := range []string{"*_test.go", "*/*_test.go", "*/*/*_test.go"} {
		files, err := filepath.Glob(pattern)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range decl.FindAllStringSubmatch(string(b), -1) {
				out[m[1]] = true
			}
		}
	}
	return out
}

// Every test the README and the guides name ("Tested by" lines, the long
// runs) exists, so that a renamed or removed test cannot leave a promise
// citing nothing; and the README shows what its tour prints.
func TestDocsNameRealTests(t *testing.T) {
	t.Parallel()
	have := testFuncs(t)
	named := regexp.MustCompile("`((?:Test|Benchmark|Fuzz)[A-Z]\\w*)`")
	for _, f := range docFiles(t) {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range named.FindAllStringSubmatch(string(b), -1) {
			if !have[m[1]] {
				t.Errorf("%s names %s, which no test file declares", f, m[1])
			}
		}
	}
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	if shown := "```\n" + strings.Join(tourOutput, "\n") + "\n```"; !strings.Contains(string(readme), shown) {
		t.Errorf("README.md does not show what the tour prints:\n%s", shown)
	}
}
