//go:build unix

package troupe

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A helper process outlives nothing: when the test process that started it
// dies (here kill -9 of a middle process that started a helper and waits),
// the helper exits within a second, so that a test binary killed by its
// timeout leaves no process behind to hold ports and cores.
func TestAHelperEndsWithTheProcessThatStartedIt(t *testing.T) {
	t.Parallel()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	middle := exec.Command(exe, "-test.run=^TestHelperStartsAHelper$")
	middle.Env = append(os.Environ(), "TROUPE_HELPER_STARTS=1")
	out, err := middle.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := middle.Start(); err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewScanner(out)
	pid := 0
	for pid == 0 && lines.Scan() {
		if s, ok := strings.CutPrefix(lines.Text(), "HELPER "); ok {
			pid, _ = strconv.Atoi(s)
		}
	}
	if pid == 0 {
		middle.Process.Kill()
		middle.Wait()
		t.Fatal("the middle process never said its helper's pid")
	}
	if !alive(pid) {
		t.Fatalf("the helper (pid %d) was gone before the process that started it", pid)
	}
	middle.Process.Kill()
	middle.Wait()
	deadline := time.Now().Add(10 * time.Second)
	for alive(pid) {
		if time.Now().After(deadline) {
			syscall.Kill(pid, syscall.SIGKILL)
			b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
			t.Fatalf("the helper (pid %d) outlived the process that started it by 10 s:\n%s", pid, b)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// alive reports whether process pid runs: it exists and, where /proc
// says, is not a zombie waiting for an adoptive parent to reap it.
func alive(pid int) bool {
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return !os.IsNotExist(err) || !dirExists("/proc/self")
	}
	// The state follows the command's closing parenthesis.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

func dirExists(p string) bool { fi, err := os.Stat(p); return err == nil && fi.IsDir() }

// TestHelperStartsAHelper starts a helper that waits for good, says its
// pid, and waits to be killed.
func TestHelperStartsAHelper(t *testing.T) {
	t.Parallel()
	if os.Getenv("TROUPE_HELPER_STARTS") == "" {
		t.Skip("helper for TestAHelperEndsWithTheProcessThatStartedIt")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	helper := exec.Command(exe, "-test.run=^TestHelperWaitsForGood$")
	helper.Env = append(os.Environ(), "TROUPE_HELPER_WAITS=1")
	if err := helper.Start(); err != nil {
		t.Fatal(err)
	}
	fmt.Printf("HELPER %d\n", helper.Process.Pid)
	helper.Wait() // (killed first)
}

// TestHelperWaitsForGood waits until it is made to exit.
func TestHelperWaitsForGood(t *testing.T) {
	t.Parallel()
	if os.Getenv("TROUPE_HELPER_WAITS") == "" {
		t.Skip("helper for TestAHelperEndsWithTheProcessThatStartedIt")
	}
	select {}
}
