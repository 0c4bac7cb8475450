package troupe

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"io"
	"math/big"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func secretConfig(secret string) Config {
	cfg := testConfig("tcp://127.0.0.1:0")
	if secret != "" {
		cfg.Secret = []byte(secret)
	}
	return cfg
}

func TestSharedSecret(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	const good, bad = "correct horse battery staple", "wrong horse battery staple!"
	server := startNode(t, secretConfig(good))
	var delivered atomic.Int64
	Spawn(server, "echo", Behavior[testPing]{Receive: func(_ *Context[testPing], m testPing) {
		delivered.Add(1)
		m.ReplyTo.Tell(testPong{N: m.N})
	}})
	refused := make(chan ProtocolError, 4)
	SubscribeChan(server, refused)
	ref := FormatRef(server.Addrs()[0], "/user/echo")

	friend := startNode(t, secretConfig(good))
	echo, err := Resolve[testPing](ctxT(t, 5*time.Second), friend, ref)
	if err != nil {
		t.Fatalf("same secret: %v", err)
	}
	if _, err := Ask(ctxT(t, 5*time.Second), echo, func(r Ref[testPong]) testPing { return testPing{ReplyTo: r} }); err != nil {
		t.Fatal(err)
	}
	before := delivered.Load()
	for _, tc := range []struct{ name, secret string }{{"wrong secret", bad}, {"no secret", ""}} {
		stranger := startNode(t, secretConfig(tc.secret))
		start := time.Now()
		_, err := Resolve[testPing](ctxT(t, 5*time.Second), stranger, ref)
		if !errors.Is(err, ErrAuth) && !errors.Is(err, ErrRejected) {
			t.Errorf("%s: Resolve = %v, want an authentication refusal", tc.name, err)
		}
		if took := time.Since(start); took > time.Second {
			t.Errorf("%s: refused after %v, want within a second", tc.name, took)
		}
		if ev := recv(t, refused, "ProtocolError for "+tc.name); !errors.Is(ev.Err, ErrAuth) {
			t.Errorf("%s: event %v", tc.name, ev.Err)
		}
	}
	// A node with a secret refuses a server that has none.
	open := startNode(t, secretConfig(""))
	spawnEcho(t, open, "echo")
	if _, err := Resolve[testPing](ctxT(t, 5*time.Second), friend, FormatRef(open.Addrs()[0], "/user/echo")); !errors.Is(err, ErrAuth) {
		t.Errorf("dialing a server without the secret = %v, want ErrAuth", err)
	}
	if got := delivered.Load(); got != before {
		t.Fatalf("%d messages from unauthenticated peers were delivered", got-before)
	}
	// The refusals are counted as such, not as protocol errors (#55).
	if tot := server.Stats().Totals; tot.AuthRefused < 2 || tot.ProtocolErrors != 0 {
		t.Errorf("after two refused strangers: %d refused authentications, %d protocol errors; want at least 2 and 0", tot.AuthRefused, tot.ProtocolErrors)
	}
}

func TestSecretTooShortIsRejected(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	if _, err := Start(ctxT(t, time.Second), Config{Secret: []byte("short")}); !errors.Is(err, ErrBadConfig) {
		t.Fatalf("Start with a short secret = %v", err)
	}
}

// testPKI makes a CA and certificates it signs, valid for 127.0.0.1.
type testPKI struct {
	pool *x509.CertPool
	ca   *x509.Certificate
	key  *ecdsa.PrivateKey
}

func newTestPKI(t *testing.T) *testPKI {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "troupe test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	return &testPKI{pool: pool, ca: ca, key: key}
}

func (p *testPKI) cert(t *testing.T, name string) tls.Certificate {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		KeyUsage:    x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, &key.PublicKey, p.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

func (p *testPKI) config(t *testing.T, name string) *tls.Config {
	return &tls.Config{
		Certificates: []tls.Certificate{p.cert(t, name)},
		RootCAs:      p.pool, ClientCAs: p.pool,
		ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS13,
	}
}

func TestMutualTLS(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	pki := newTestPKI(t)
	cfg := func(tc *tls.Config) Config {
		c := testConfig("tcp://127.0.0.1:0")
		c.TLS = tc
		return c
	}
	server := startNode(t, cfg(pki.config(t, "server")))
	spawnEcho(t, server, "echo")
	ref := FormatRef(server.Addrs()[0], "/user/echo")
	client := startNode(t, cfg(pki.config(t, "client")))
	echo, err := Resolve[testPing](ctxT(t, 5*time.Second), client, ref)
	if err != nil {
		t.Fatalf("mutual TLS: %v", err)
	}
	if _, err := Ask(ctxT(t, 5*time.Second), echo, func(r Ref[testPong]) testPing { return testPing{ReplyTo: r} }); err != nil {
		t.Fatal(err)
	}
	// A client whose certificate another CA signed is refused.
	rogue := startNode(t, cfg(newTestPKI(t).config(t, "rogue")))
	if _, err := Resolve[testPing](ctxT(t, 5*time.Second), rogue, ref); err == nil {
		t.Fatal("a client with a certificate from another CA was accepted")
	}
	// So is one that speaks no TLS at all.
	plain := startNode(t, testConfig())
	if _, err := Resolve[testPing](ctxT(t, 5*time.Second), plain, ref); err == nil {
		t.Fatal("a client without TLS was accepted")
	}
}

func TestRegistryIsBehindTheSecret(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	const secret = "registry secret, sixteen+ bytes"
	reg := freeRegistryAddr(t, "tcp")
	cfg := discoveryConfig("registrar", reg)
	cfg.Secret = []byte(secret)
	registrar := startNode(t, cfg)
	member := discoveryConfig("member", reg)
	member.Secret = []byte(secret)
	m := startNode(t, member)
	spawnEcho(t, m, "svc")
	// Without the secret a node can neither join (and so register) nor look
	// anything up.
	checkLeaks(t)
	if _, err := Start(ctxT(t, 5*time.Second), discoveryConfig("intruder", reg)); err == nil {
		t.Fatal("a node without the secret joined the registry")
	}
	outsider := startNode(t, testConfig())
	if _, err := FindActor[testPing](ctxT(t, 5*time.Second), outsider, "svc", WithRegistries(registrar.Addrs()[0].String())); !errors.Is(err, ErrAuth) {
		t.Fatalf("lookup without the secret = %v, want ErrAuth", err)
	}
	if got := registrar.registrar.reg().find("svc"); len(got) != 1 {
		t.Fatalf("registry holds %v", got)
	}
}

// TestAResumeClaimNeedsTheSecret sends, without the secret, a hello that
// claims a connected peer's uid and asks to resume its session: it is
// refused before it can touch that session, which stays up.
func TestAResumeClaimNeedsTheSecret(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	const secret = "correct horse battery staple"
	server := startNode(t, secretConfig(secret))
	spawnEcho(t, server, "echo")
	friend := startNode(t, secretConfig(secret))
	echo, err := Resolve[testPing](ctxT(t, 5*time.Second), friend, FormatRef(server.Addrs()[0], "/user/echo"))
	if err != nil {
		t.Fatal(err)
	}
	lost := make(chan PeerLinkLost, 1)
	SubscribeChan(server, lost)
	addr := server.Addrs()[0]
	c, err := net.Dial(addr.Network(), addr.Address())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	h := &hello{version: protocolVersion, name: "impostor", uid: friend.UID(), flags: helloResumable | helloResuming}
	if _, err := c.Write(appendFrame(nil, func(b []byte) []byte { return appendHello(b, frameHello, h) })); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	io.Copy(io.Discard, c) // refused: the server closes after its verdict
	select {
	case ev := <-lost:
		t.Fatalf("an unauthenticated resume claim broke the session: %+v", ev)
	default:
	}
	if _, err := Ask(ctxT(t, 5*time.Second), echo, func(r Ref[testPong]) testPing { return testPing{ReplyTo: r} }); err != nil {
		t.Fatalf("the friend's session after the claim: %v", err)
	}
	if p := server.Stats().Peers; len(p) != 1 || p[0].UID != friend.UID() || p[0].State != "up" {
		t.Fatalf("server's peers after the claim: %+v", p)
	}
}

// A node with mutual TLS joins a registrar with mutual TLS from the same
// CA; one whose certificate another CA signed fails with ErrAuth, saying
// the TLS handshake failed.
func TestARegistrarOverTLS(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	pki := newTestPKI(t)
	reg := freeRegistryAddr(t, "tcp")
	cfg := discoveryConfig("registrar", reg)
	cfg.TLS = pki.config(t, "registrar")
	startNode(t, cfg)
	member := discoveryConfig("member", reg)
	member.TLS = pki.config(t, "member")
	m := startNode(t, member)
	spawnEcho(t, m, "svc")
	if _, err := FindActor[testPing](ctxT(t, 5*time.Second), m, "svc"); err != nil {
		t.Fatalf("a member over TLS cannot find its own actor in the registry: %v", err)
	}
	rogue := discoveryConfig("rogue", reg)
	rogue.TLS = newTestPKI(t).config(t, "rogue")
	noCert := discoveryConfig("no-cert", reg)
	noCert.TLS = &tls.Config{RootCAs: pki.pool, MinVersion: tls.VersionTLS13} // trusts the registrar, presents nothing
	for name, cfg := range map[string]Config{"another CA's certificate": rogue, "no certificate": noCert} {
		n, err := Start(ctxT(t, 5*time.Second), cfg)
		if n != nil {
			n.Close()
		}
		if !errors.Is(err, ErrAuth) || errors.Is(err, ErrRegistryOccupied) || !strings.Contains(err.Error(), "TLS") {
			t.Fatalf("a node with %s: Start = %v, want ErrAuth naming TLS", name, err)
		}
	}
	// Something that is not a TLS server at all is no authentication
	// failure: the address is occupied.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("SSH-2.0-OpenSSH_9.6\r\n"))
			c.Close()
		}
	}()
	banner := discoveryConfig("member", l.Addr().String())
	banner.TLS = pki.config(t, "member")
	if n, err := Start(ctxT(t, 5*time.Second), banner); !errors.Is(err, ErrRegistryOccupied) || errors.Is(err, ErrAuth) {
		if n != nil {
			n.Close()
		}
		t.Fatalf("a TLS node probing an SSH banner: Start = %v, want ErrRegistryOccupied", err)
	}
}
