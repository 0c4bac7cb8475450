//go:build unix

package troupe

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestHelperRegistrarProcess is not a test: TestRegistrarKilledInAnother
// Process runs it in a child process, which becomes the registrar at
// $TROUPE_HELPER_REGISTRAR, spawns "svc-child", says READY and waits to
// be killed.
func TestHelperRegistrarProcess(t *testing.T) {
	t.Parallel()
	reg := os.Getenv("TROUPE_HELPER_REGISTRAR")
	if reg == "" {
		t.Skip("helper for TestRegistrarKilledInAnotherProcess")
	}
	cfg := failConfig("child", 50*time.Millisecond, time.Second)
	cfg.RegistryAddrs = []string{reg}
	n, err := Start(ctxT(t, 5*time.Second), cfg)
	if err != nil || !n.registrar.isRegistrar() {
		fmt.Println("ERR", err)
		return
	}
	spawnEcho(t, n, "svc-child")
	fmt.Println("READY")
	time.Sleep(time.Minute)
}

// TestRegistrarKilledInAnotherProcess: the embedded registrar is a node in
// another process; kill -9 it, and the two survivors elect a new registrar
// and find each other's named actors again. It logs how long that took.
func TestRegistrarKilledInAnotherProcess(t *testing.T) {
	t.Parallel()
	for _, tr := range []string{"tcp", "unix"} {
		t.Run(tr, func(t *testing.T) {
			reg := freeRegistryAddr(t, tr)
			exe, err := os.Executable()
			if err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(exe, "-test.run=^TestHelperRegistrarProcess$")
			cmd.Env = append(os.Environ(), "TROUPE_HELPER_REGISTRAR="+reg)
			out, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
			lines := bufio.NewScanner(out)
			if !lines.Scan() || strings.TrimSpace(lines.Text()) != "READY" {
				t.Fatalf("the registrar process said %q", lines.Text())
			}
			cfg := func(name string) Config {
				c := failConfig(name, 50*time.Millisecond, time.Second)
				c.RegistryAddrs = []string{reg}
				return c
			}
			a := startNode(t, cfg("a"))
			b := startNode(t, cfg("b"))
			spawnEcho(t, a, "svc-a")
			spawnEcho(t, b, "svc-b")
			if _, err := FindActor[testPing](ctxT(t, 5*time.Second), a, "svc-child"); err != nil {
				t.Fatalf("svc-child is not found through the registrar process: %v", err)
			}
			cmd.Process.Signal(syscall.SIGKILL)
			killed := time.Now()
			waitFor(t, 10*time.Second, "a new registrar, with both survivors' actors", func() bool {
				return oneRegistrarFindingAll(t, reg, a, b)
			})
			t.Logf("%s: %v from kill -9 to lookups working everywhere (heartbeat 50 ms, window 1 s)", tr, time.Since(killed).Round(time.Millisecond))
		})
	}
}
