package troupe

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestUnixSocketPathTooLongIsAnError(t *testing.T) {
	for _, long := range []string{
		"/tmp/" + strings.Repeat("d", maxSocketPath-len("/tmp/")+1), // one byte past this platform's limit
		"/tmp/" + strings.Repeat("d", 120),                          // past every platform's
	} {
		_, err := Start(ctxT(t, 5*time.Second), testConfig("unix://"+long))
		if err == nil || !strings.Contains(err.Error(), long) || !strings.Contains(err.Error(), strconv.Itoa(len(long))+" bytes") {
			t.Fatalf("Start on a %d-byte socket path: %v", len(long), err)
		}
	}
}

func TestLongRuntimeDirIsAnErrorNotAPanic(t *testing.T) {
	base := filepath.Join(t.TempDir(), strings.Repeat("r", 100))
	if err := os.MkdirAll(base, 0o700); err != nil {
		t.Fatal(err)
	}
	t.Setenv("XDG_RUNTIME_DIR", base)
	cfg := testConfig("unix://" + shortSocket(t))
	cfg.Discovery = true // the default registry socket goes in the runtime directory
	_, err := Start(ctxT(t, 5*time.Second), cfg)
	if err == nil || !strings.Contains(err.Error(), base) {
		t.Fatalf("Start with a long XDG_RUNTIME_DIR: %v", err)
	}
}

func TestUnixSocketDirectoryIsCreated(t *testing.T) {
	dir := filepath.Join(shortDir(t), "a", "b")
	n := startNode(t, testConfig("unix://"+filepath.Join(dir, "n.sock")))
	fi, err := os.Stat(dir)
	if err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("socket directory: %v, %v", fi, err)
	}
	if _, err := Resolve[int](ctxT(t, 5*time.Second), startNode(t, testConfig()), FormatRef(n.Addrs()[0], "/user/none")); !errors.Is(err, ErrNoSuchActor) {
		t.Fatalf("the node in the created directory does not answer: %v", err)
	}
}

func TestUnixSocketDirectoryThatCannotBeCreated(t *testing.T) {
	file := filepath.Join(shortDir(t), "f")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := Start(context.Background(), testConfig("unix://"+filepath.Join(file, "n.sock")))
	if err == nil || !strings.Contains(err.Error(), file) {
		t.Fatalf("Start under a plain file: %v", err)
	}
}

func TestUnixSocketLockFilesAreRemovedOnClose(t *testing.T) {
	dir := shortDir(t)
	for i := range 5 {
		n := startNode(t, testConfig("unix://"+filepath.Join(dir, "n.sock")))
		if err := n.Close(); err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
	}
	left, _ := filepath.Glob(filepath.Join(dir, "*"))
	if len(left) != 0 {
		t.Fatalf("files left in the socket directory after Close: %v", left)
	}
}
