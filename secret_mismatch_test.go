package troupe_test

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"troupe"
)

// A node and a registrar that disagree about the shared secret are told
// so: Start fails with ErrAuth, not with "occupied by something that is
// not a registrar", in either direction.
func TestARegistrarWithAnotherSecretIsAnAuthenticationFailure(t *testing.T) {
	t.Parallel()
	const secret = "sixteen bytes or more of secret"
	discard := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, tc := range []struct {
		name                  string
		registrar, node, want string
	}{
		{"the node has a secret, the registrar none", "", secret, "no shared secret"},
		{"the registrar has a secret, the node none", secret, "", "a shared secret is required"},
		{"both have secrets that differ", secret, secret + "!", "shared secret"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := troupe.Config{Name: "registrar", RegistryAddrs: []string{"127.0.0.1:0"}, EnsureRegistry: true, Logger: discard}
			if tc.registrar != "" {
				cfg.Secret = []byte(tc.registrar)
			}
			reg, err := troupe.Start(ctxFor(t), cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer reg.Close()
			ncfg := troupe.Config{Name: "svc", RegistryAddrs: []string{reg.Addrs()[0].String()}, Logger: discard}
			if tc.node != "" {
				ncfg.Secret = []byte(tc.node)
			}
			n, err := troupe.Start(ctxFor(t), ncfg)
			if err == nil {
				n.Close()
				t.Fatal("a node whose secret differs from the registrar's started")
			}
			if !errors.Is(err, troupe.ErrAuth) || errors.Is(err, troupe.ErrRegistryOccupied) {
				t.Fatalf("Start = %v; want an error wrapping ErrAuth and not ErrRegistryOccupied", err)
			}
			if !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
				t.Fatalf("Start = %q; want one line that says %q", err, tc.want)
			}
		})
	}
}

// ReadSecretFile reads a secret as the troupe command's --secret-file
// does: one trailing newline of a one-line text file is dropped; a binary
// secret is taken whole.
func TestReadSecretFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for i, tc := range []struct {
		content, want string
		bad           bool
	}{
		{content: "sixteen-byte-key!\n", want: "sixteen-byte-key!"},
		{content: "sixteen-byte-key!\r\n", want: "sixteen-byte-key!"},
		{content: "sixteen-byte-key!", want: "sixteen-byte-key!"},
		{content: "sixteen-byte-key!\n\n", want: "sixteen-byte-key!\n\n"},
		{content: "two lines of it, ok\nsecond\n", want: "two lines of it, ok\nsecond\n"},
		{content: "binary\x00\xff\xfe secret bytes\n", want: "binary\x00\xff\xfe secret bytes\n"},
		{content: "short\n", bad: true},
		{content: "", bad: true},
	} {
		path := filepath.Join(dir, fmt.Sprint(i))
		if err := os.WriteFile(path, []byte(tc.content), 0o600); err != nil {
			t.Fatal(err)
		}
		got, err := troupe.ReadSecretFile(path)
		if tc.bad {
			if !errors.Is(err, troupe.ErrBadConfig) {
				t.Errorf("%q: err = %v, want ErrBadConfig", tc.content, err)
			}
			continue
		}
		if err != nil || string(got) != tc.want {
			t.Errorf("%q: = %q, %v; want %q", tc.content, got, err, tc.want)
		}
	}
	if _, err := troupe.ReadSecretFile(filepath.Join(dir, "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a missing file: %v", err)
	}
}
