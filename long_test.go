package troupe_test

import (
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
// that .ci/run does not name would never run.
func TestLongRunsAreInCI(t *testing.T) {
	t.Parallel()
	ci, err := os.ReadFile(".ci/run")
	if err != nil {
		t.Fatal(err)
	}
	files, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	long := regexp.MustCompile(`func (Test\w+)\(t \*testing\.T\) \{\n(?:\t//[^\n]*\n)*\tlongRun\(t[,)]`)
	besideSuite := regexp.MustCompile(`func (Test\w+)\(t \*testing\.T\) \{\n(?:\t[^\n]*\n){0,6}?\tbuildsBesideTheSuite\(t\)`)
	found, besides := 0, 0
	for _, f := range files {
		if !strings.HasSuffix(f.Name(), "_test.go") {
			continue
		}
		src, err := os.ReadFile(f.Name())
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range long.FindAllSubmatch(src, -1) {
			found++
			if !strings.Contains(string(ci), string(m[1])) {
				t.Errorf("%s (%s) is a long run that .ci/run's long-run step does not name", m[1], f.Name())
			}
		}
		// A test that skips under -race (buildsBesideTheSuite) runs in
		// the docs' step, without it: CI's default run is a race run.
		for _, m := range besideSuite.FindAllSubmatch(src, -1) {
			besides++
			if !strings.Contains(string(ci), string(m[1])) {
				t.Errorf("%s (%s) skips under -race, and .ci/run's docs' programs step does not name it", m[1], f.Name())
			}
		}
	}
	if besides == 0 {
		t.Error("found no test that calls buildsBesideTheSuite: the pattern no longer matches how they are written")
	}
	if found == 0 {
		t.Fatal("found no long runs: the pattern no longer matches how they are written")
	}
}
