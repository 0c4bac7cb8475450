package troupe_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// The default suite stays fast because its tests run side by side (README,
// "Tests"): every test calls t.Parallel first, or is a long run (its own
// CI step), or says in a comment opening its body why it must run alone
// ("// Not beside other tests: ..."). A new test that does none of these
// would run alone, and the suite would slow down without anyone choosing it.
func TestTestsRunSideBySide(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob("*_test.go")
	if err != nil {
		t.Fatal(err)
	}
	more, _ := filepath.Glob("*/*_test.go")
	deeper, _ := filepath.Glob("*/*/*_test.go")
	files = append(append(files, more...), deeper...)
	test := regexp.MustCompile(`(?m)^func (Test\w+)\(t \*testing\.T\) \{\n((?:\t[^\n]*\n){0,6})`)
	found := 0
	for _, f := range files {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range test.FindAllSubmatch(src, -1) {
			found++
			head := string(m[2])
			if strings.Contains(head, "\tt.Parallel()") || strings.Contains(head, "\tlongRun(t") ||
				strings.Contains(head, "// Not beside other tests:") {
				continue
			}
			t.Errorf("%s (%s) neither calls t.Parallel() first nor says why not (\"// Not beside other tests: ...\")", m[1], f)
		}
	}
	if found < 400 {
		t.Fatalf("found %d tests: the pattern no longer matches how they are written", found)
	}
}
