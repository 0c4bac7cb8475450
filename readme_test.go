package troupe_test

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
)

// The promises of README.md's "Use it in your module": a copy of the
// package's files builds and runs in another module, so does a replace
// directive, and every Go snippet in the README compiles.

// readmeBlocks returns the README's fenced code blocks of the given
// language, in order.
func readmeBlocks(t *testing.T, lang string) []string {
	t.Helper()
	b, err := os.ReadFile("README.md")
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

// readmeProgram returns the README's one complete program.
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

// buildAndRun tidies the module in dir, builds it and runs the program,
// checking that it prints the reply.
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
	out, err := exec.Command(bin).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "pong 1 from pong") {
		t.Fatalf("the README's program: %v\n%s", err, out)
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
	here, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	writeFile(t, dir, "go.mod", fmt.Sprintf("module example.com/app\n\ngo 1.26.0\n\nrequire troupe v0.0.0\n\nreplace troupe => %s\n", filepath.ToSlash(here)))
	writeFile(t, dir, "main.go", strings.Replace(readmeProgram(t), `"example.com/app/troupe"`, `"troupe"`, 1))
	buildAndRun(t, dir)
}

// snippetImports are the packages every snippet file may use.
const snippetImports = `import (
	"context"
	"expvar"
	"fmt"
	"log"
	"net/http"
	"testing"
	"time"

	"troupe"
	"troupe/hostnet"
)
`

// snippetPrelude declares what the README's fragments use without
// declaring: the message types and the variables of the surrounding code.
const snippetPrelude = `package main

` + snippetImports + `
type Ping struct {
	N       int
	ReplyTo troupe.Ref[Pong]
}

type Pong struct {
	N    int
	From string
}

type Quote struct{ Price float64 }

type Job struct{ ID int }

var (
	_ = expvar.Handler
	_ = fmt.Sprint
	_ = log.Println
	_ = http.NewServeMux
	_ = time.Second
	_ = hostnet.New
)

func main() {}
`

// ignoredSnippetErrors are the compiler's complaints that a fragment
// cannot avoid: it shows a call, not what is done with its result.
var ignoredSnippetErrors = regexp.MustCompile(`declared and not used|imported and not used|^#|^\s*$`)

func TestReadmeSnippetsCompile(t *testing.T) {
	t.Parallel()
	needGo(t)
	if runtime.GOOS != "linux" {
		t.Skip("one snippet uses hostnet, which is Linux only")
	}
	here, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	writeFile(t, dir, "go.mod", fmt.Sprintf("module example.com/snippets\n\ngo 1.26.0\n\nrequire troupe v0.0.0\n\nreplace troupe => %s\n", filepath.ToSlash(here)))
	writeFile(t, dir, "prelude.go", snippetPrelude)
	count := 0
	for i, block := range readmeBlocks(t, "go") {
		if strings.HasPrefix(block, "package main") {
			continue // the complete program: built by TestVendoredCopy
		}
		count++
		// Top-level functions and one-line variables stay at top level;
		// the rest is a body.
		var decls, body []string
		inDecl := false
		for line := range strings.SplitSeq(block, "\n") {
			switch {
			case strings.HasPrefix(line, "func "):
				inDecl = true
				decls = append(decls, line)
			case strings.HasPrefix(line, "var ") && !strings.HasSuffix(line, "("):
				decls = append(decls, line) // a one-line package variable
			case inDecl:
				decls = append(decls, line)
				if line == "}" {
					inDecl = false
				}
			default:
				body = append(body, line)
			}
		}
		src := fmt.Sprintf(`package main

%s
%s

func snippet%d(ctx context.Context, t *testing.T, n, node, pingNode, pongNode *troupe.Node, a, b string) error {
%s
	return nil
}
`, snippetImports, strings.Join(decls, "\n"), i, strings.Join(body, "\n"))
		writeFile(t, dir, fmt.Sprintf("snippet%d.go", i), src)
	}
	if count < 5 {
		t.Fatalf("found only %d Go snippets in README.md", count)
	}
	out, err := goCmd(t, dir, "mod", "tidy")
	if err != nil {
		t.Fatalf("go mod tidy: %v\n%s", err, out)
	}
	out, _ = goCmd(t, dir, "build", "-gcflags=-e", "-o", os.DevNull, ".")
	var real []string
	for line := range strings.SplitSeq(out, "\n") {
		if !ignoredSnippetErrors.MatchString(line) {
			real = append(real, line)
		}
	}
	if len(real) > 0 {
		t.Fatalf("README snippets do not compile:\n%s", strings.Join(real, "\n"))
	}
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

// TestLibraryFilesStaySmall: no library file is over maxFileLines and no
// function over maxFuncLines, so that each file keeps answering one
// question (see "Where things are" in the README). A file that grows
// past it is split by question, not trimmed.
func TestLibraryFilesStaySmall(t *testing.T) {
	t.Parallel()
	const maxFileLines, maxFuncLines = 720, 120
	lib, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fs := token.NewFileSet()
	for _, name := range lib {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fs, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		if n := fs.File(f.Pos()).LineCount(); n > maxFileLines {
			t.Errorf("%s has %d lines, more than %d: split it by question", name, n, maxFileLines)
		}
		for _, d := range f.Decls {
			if fd, ok := d.(*ast.FuncDecl); ok {
				if n := fs.Position(fd.End()).Line - fs.Position(fd.Pos()).Line + 1; n > maxFuncLines {
					t.Errorf("%s: %s has %d lines, more than %d", name, fd.Name.Name, n, maxFuncLines)
				}
			}
		}
	}
}
