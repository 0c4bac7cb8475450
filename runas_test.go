//go:build unix

package troupe

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// runAs re-runs the test binary as uid to dial the unix socket at sock and
// print what the node answered.
func runAs(t *testing.T, uid int, sock string) (string, error) {
	exe, err := os.Executable()
	if err != nil {
		return "", err
	}
	// The build directory is private to root; run a copy from a place
	// the other user can read.
	dir, err := os.MkdirTemp("", "trpexe")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(dir)
	os.Chmod(dir, 0o755)
	bin, err := os.ReadFile(exe)
	if err != nil {
		return "", err
	}
	copyExe := filepath.Join(dir, "troupe.test")
	if err := os.WriteFile(copyExe, bin, 0o755); err != nil {
		return "", err
	}
	cmd := exec.Command(copyExe, "-test.run=^TestHelperDialUnix$")
	cmd.Env = append(os.Environ(), "TROUPE_HELPER_SOCK="+sock)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid)}}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// TestHelperDialUnix is not a test: runAs runs it in a child process.
func TestHelperDialUnix(t *testing.T) {
	t.Parallel()
	sock := os.Getenv("TROUPE_HELPER_SOCK")
	if sock == "" {
		t.Skip("helper for TestUnixPeerCredentials")
	}
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	fr := newFrameReader(c, defaultMaxFrameSize)
	body, err := fr.next()
	if err != nil {
		t.Fatal(err)
	}
	d := decoder{b: body[1:]}
	code := d.byte()
	d.take(16)
	os.Stdout.WriteString(frameKind(body[0]).String() + " " + string(rune('0'+code)) + " " + d.string() + "\n")
}

func TestUnixPeerCredentials(t *testing.T) {
	t.Parallel()
	if os.Getuid() != 0 {
		t.Skip("needs root to connect as another user")
	}
	n := startNode(t, testConfig("unix://"+shortSocket(t)))
	sock := n.Addrs()[0].Address()
	os.Chmod(sock, 0o777)
	os.Chmod(strings.TrimSuffix(sock, "/n.sock"), 0o777)
	// Connect as uid 65534 (nobody) from a child process.
	out, err := runAs(t, 65534, sock)
	if err != nil {
		t.Fatalf("helper: %v\n%s", err, out)
	}
	if !strings.Contains(out, "uid 65534") || !strings.Contains(out, "not allowed") {
		t.Fatalf("a peer of another user was not refused with its uid: %q", out)
	}
}
