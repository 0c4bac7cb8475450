package main

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"troupe"
)

// pkiFiles writes a CA and a certificate it signs for 127.0.0.1 as PEM
// files in dir, and returns their paths and the TLS config a node uses
// with them.
type pkiFiles struct {
	ca, cert, key string
	config        *tls.Config
}

func writePKI(t *testing.T, dir string) pkiFiles {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "troupe CLI test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "troupe"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		KeyUsage:    x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalECPrivateKey(key)
	p := pkiFiles{ca: filepath.Join(dir, "ca.pem"), cert: filepath.Join(dir, "cert.pem"), key: filepath.Join(dir, "key.pem")}
	write := func(path, kind string, b []byte) {
		if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: b}), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(p.ca, "CERTIFICATE", caDER)
	write(p.cert, "CERTIFICATE", der)
	write(p.key, "EC PRIVATE KEY", keyDER)
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	p.config = &tls.Config{
		Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}},
		RootCAs:      pool, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12,
	}
	return p
}

// startRegistrar runs `troupe registrar` with args until the test ends and
// returns the address it printed.
func startRegistrar(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	out := &lineWriter{lines: make(chan string, 8)}
	errOut := &lockedBuffer{}
	exited := make(chan int, 1)
	go func() {
		exited <- run(ctx, append([]string{"registrar", "--addr", "127.0.0.1:0"}, args...), out, errOut)
	}()
	t.Cleanup(func() {
		cancel()
		if code := <-exited; code != 0 {
			t.Errorf("registrar exited %d after SIGINT: %s", code, errOut)
		}
	})
	select {
	case line := <-out.lines:
		addr, ok := strings.CutPrefix(line, "registrar listening on ")
		if !ok {
			t.Fatalf("registrar said %q", line)
		}
		return addr
	case code := <-exited:
		exited <- code
		t.Fatalf("the registrar exited %d: %s", code, errOut)
	case <-time.After(10 * time.Second):
		t.Fatal("the registrar printed no address")
	}
	return ""
}

// Every command reaches a node that has a shared secret and mutual TLS,
// given the flags or the environment variables; without them it fails in
// one line that says why.
func TestCommandsReachASecuredNode(t *testing.T) {
	// Not beside other tests: it sets environment variables (t.Setenv),
	// which belong to the whole process.
	dir := t.TempDir()
	const secret = "a shared secret of the fleet, 32+"
	secretFile := filepath.Join(dir, "secret")
	if err := os.WriteFile(secretFile, []byte(secret+"\n"), 0o600); err != nil { // as echo writes it
		t.Fatal(err)
	}
	pki := writePKI(t, dir)
	flags := []string{"--secret-file", secretFile, "--tls-cert", pki.cert, "--tls-key", pki.key, "--tls-ca", pki.ca}
	reg := startRegistrar(t, flags...)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	svc, err := troupe.Start(ctx, troupe.Config{Name: "billing-node", RegistryAddrs: []string{reg}, Listen: []string{"tcp://127.0.0.1:0"},
		Secret: []byte(secret), TLS: pki.config, Logger: quiet})
	if err != nil {
		t.Fatalf("a node with the registrar's secret and TLS: %v", err)
	}
	defer svc.Close()
	if _, err := troupe.Spawn(svc, "billing", troupe.Behavior[string]{Receive: func(*troupe.Context[string], string) {}}); err != nil {
		t.Fatal(err)
	}
	node := svc.Addrs()[0].String()
	run1 := func(args ...string) (string, string, int) {
		var out, errOut bytes.Buffer
		code := run(ctx, args, &out, &errOut)
		return out.String(), errOut.String(), code
	}
	waitLs := func(args ...string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			out, errOut, code := run1(append([]string{"ls", "--registry", reg}, args...)...)
			if code == 0 && strings.Contains(out, "billing") {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("ls %v: exit %d\n%s%s", args, code, out, errOut)
			}
			time.Sleep(50 * time.Millisecond) // the registration is asynchronous, and ls has no way to wait for it
		}
	}
	waitLs(flags...)
	if out, errOut, code := run1(append([]string{"query", "billing", "--registry", reg}, flags...)...); code != 0 || !strings.Contains(out, "127.0.0.1") {
		t.Fatalf("query: exit %d\n%s%s", code, out, errOut)
	}
	for _, cmd := range []string{"peers", "actors", "stats", "schema"} {
		if out, errOut, code := run1(append([]string{cmd, "--node", node}, flags...)...); code != 0 || out == "" {
			t.Fatalf("%s: exit %d\n%s%s", cmd, code, out, errOut)
		}
	}
	if out, errOut, code := run1(append([]string{"quarantine", "ls", "--node", node}, flags...)...); code != 0 || !strings.Contains(out, "CAUSE") {
		t.Fatalf("quarantine ls: exit %d\n%s%s", code, out, errOut)
	}

	// Set once in the environment, for a shell session.
	t.Setenv("TROUPE_SECRET_FILE", secretFile)
	t.Setenv("TROUPE_TLS_CERT", pki.cert)
	t.Setenv("TROUPE_TLS_KEY", pki.key)
	t.Setenv("TROUPE_TLS_CA", pki.ca)
	t.Setenv("TROUPE_REGISTRY", reg)
	t.Setenv("TROUPE_NODE", node)
	if out, errOut, code := run1("ls"); code != 0 || !strings.Contains(out, "billing") {
		t.Fatalf("ls with the environment: exit %d\n%s%s", code, out, errOut)
	}
	if out, errOut, code := run1("stats"); code != 0 || !strings.Contains(out, "billing-node") {
		t.Fatalf("stats with the environment: exit %d\n%s%s", code, out, errOut)
	}
	if out, errOut, code := run1("schema"); code != 0 || !strings.Contains(out, "troupe.string") {
		t.Fatalf("schema with the environment: exit %d\n%s%s", code, out, errOut)
	}

	// Without the secret: one line that says authentication failed.
	t.Setenv("TROUPE_SECRET_FILE", "")
	for _, args := range [][]string{{"ls"}, {"peers"}, {"query", "billing"}} {
		_, errOut, code := run1(append(args, "--timeout", "5s")...)
		if code != 1 || strings.Count(errOut, "\n") != 1 || !strings.Contains(errOut, "authentication failed") || !strings.Contains(errOut, "--secret-file") {
			t.Fatalf("%v without the secret: exit %d, %q; want one line saying authentication failed", args, code, errOut)
		}
	}
	// With the secret but a certificate another CA signed: one line that
	// says TLS failed.
	t.Setenv("TROUPE_SECRET_FILE", secretFile)
	other := writePKI(t, t.TempDir())
	_, errOut, code := run1("peers", "--tls-cert", other.cert, "--tls-key", other.key, "--tls-ca", other.ca, "--timeout", "5s")
	if code != 1 || strings.Count(errOut, "\n") != 1 || !strings.Contains(errOut, "TLS") {
		t.Fatalf("peers with another CA's certificate: exit %d, %q; want one line saying TLS failed", code, errOut)
	}
	// With the secret and no TLS at all: one line that says TLS may be
	// what is missing.
	t.Setenv("TROUPE_TLS_CERT", "")
	t.Setenv("TROUPE_TLS_KEY", "")
	t.Setenv("TROUPE_TLS_CA", "")
	for _, args := range [][]string{{"ls"}, {"peers"}} {
		_, errOut, code := run1(append(args, "--timeout", "5s")...)
		if code != 1 || strings.Count(errOut, "\n") != 1 || !strings.Contains(errOut, "--tls-") {
			t.Fatalf("%v without TLS against a TLS node: exit %d, %q; want one line naming the TLS flags", args, code, errOut)
		}
	}
	// A flag naming a file that is not there is a usage error.
	if _, errOut, code := run1("peers", "--secret-file", filepath.Join(dir, "missing")); code != 2 || !strings.Contains(errOut, "--secret-file") {
		t.Fatalf("peers with a missing secret file: exit %d, %q", code, errOut)
	}
	t.Setenv("TROUPE_TLS_KEY", "")
	if _, errOut, code := run1("peers", "--tls-cert", pki.cert); code != 2 || !strings.Contains(errOut, "--tls-key") {
		t.Fatalf("peers with --tls-cert and no key: exit %d, %q", code, errOut)
	}
}

// troupe quarantine ls lists what a node gave up on, and clear lifts it:
// the peer may connect again. Clearing what is not quarantined exits 1.
func TestQuarantineLsAndClear(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	f := new(troupe.FaultNet)
	defer f.Heal()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	start := func(name string) *troupe.Node {
		n, err := f.Start(ctx, troupe.Config{Name: name, Logger: quiet, HeartbeatInterval: 50 * time.Millisecond, UnreachableAfter: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { n.Close() })
		return n
	}
	a, b := start("alpha"), start("beta")
	if _, err := troupe.Spawn(b, "echo", troupe.Behavior[string]{Receive: func(*troupe.Context[string], string) {}}); err != nil {
		t.Fatal(err)
	}
	if _, err := troupe.Resolve[string](ctx, a, troupe.FormatRef(b.Addrs()[0], "/user/echo")); err != nil {
		t.Fatal(err)
	}
	node, beta := a.Addrs()[0].String(), b.Addrs()[0].String()
	run1 := func(args ...string) (string, string, int) {
		var out, errOut bytes.Buffer
		code := run(ctx, args, &out, &errOut)
		return out.String(), errOut.String(), code
	}
	if out, errOut, code := run1("quarantine", "ls", "--node", node, "--json"); code != 0 || strings.TrimSpace(out) != "[]" {
		t.Fatalf("quarantine ls before: exit %d\n%s%s", code, out, errOut)
	}
	f.Partition(a, b)
	deadline := time.Now().Add(10 * time.Second)
	for len(a.Stats().Quarantined) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("alpha did not give up on beta across a partition")
		}
		time.Sleep(20 * time.Millisecond) // the failure detector's window, which has no event a command could wait on
	}
	out, errOut, code := run1("quarantine", "ls", "--node", node)
	if code != 0 || !strings.Contains(out, "beta") || !strings.Contains(out, beta) || !strings.Contains(out, b.UID().String()) {
		t.Fatalf("quarantine ls: exit %d\n%s%s", code, out, errOut)
	}
	// The CLI itself is not a peer of alpha's.
	if out, _, _ := run1("peers", "--node", node); strings.Contains(out, "troupe-cli") {
		t.Fatalf("the command lists itself among alpha's peers:\n%s", out)
	}
	if out, errOut, code := run1("quarantine", "clear", beta, "--node", node); code != 0 || !strings.Contains(out, "lifted") {
		t.Fatalf("quarantine clear: exit %d\n%s%s", code, out, errOut)
	}
	if q := a.Stats().Quarantined; len(q) != 0 {
		t.Fatalf("after clear, alpha still quarantines %+v", q)
	}
	if _, errOut, code := run1("quarantine", "clear", beta, "--node", node); code != 1 || !strings.Contains(errOut, "not quarantined") || strings.Count(errOut, "\n") != 1 {
		t.Fatalf("clearing what is not quarantined: exit %d, %q", code, errOut)
	}
	// By uid, as ls prints it: beta holds alpha, which dialed it, by uid
	// alone.
	for len(b.Stats().Quarantined) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("beta did not give up on alpha across a partition")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if out, errOut, code := run1("quarantine", "ls", "--node", beta); code != 0 || !strings.Contains(out, a.UID().String()) {
		t.Fatalf("quarantine ls at beta: exit %d\n%s%s", code, out, errOut)
	}
	if out, errOut, code := run1("quarantine", "clear", a.UID().String(), "--node", beta); code != 0 || len(b.Stats().Quarantined) != 0 {
		t.Fatalf("quarantine clear by uid: exit %d\n%s%s; beta still quarantines %+v", code, out, errOut, b.Stats().Quarantined)
	}
	for _, args := range [][]string{{"quarantine"}, {"quarantine", "clear"}, {"quarantine", "rm", "x"}, {"quarantine", "ls", "extra"}} {
		if _, errOut, code := run1(append(args, "--node", node)...); code != 2 || !strings.Contains(errOut, "usage:") {
			t.Fatalf("%v: exit %d, %q; want a usage error", args, code, errOut)
		}
	}
}
