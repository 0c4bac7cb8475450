package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	"troupe"
)

// cliNode starts the command's own node: an observer (the nodes it asks
// do not list it as a peer, nor quarantine it when it goes), with the
// secret and TLS settings of the flags. The caller closes it.
func (c *call) cliNode(ctx context.Context) (*troupe.Node, int) {
	secret, tlsConfig, code := c.security(false)
	if code != 0 {
		return nil, code
	}
	cfg := troupe.Config{Name: "troupe-cli", Observer: true, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Secret: secret, TLS: tlsConfig}
	n, err := troupe.Start(ctx, cfg)
	if err != nil {
		return nil, c.fail(err)
	}
	return n, 0
}

// atNode runs f with the command's own node, within the command's
// timeout, for a command that asks the node at --node (required: a usage
// error without it).
func (c *call) atNode(ctx context.Context, f func(ctx context.Context, n *troupe.Node) int) int {
	if c.node == "" {
		fmt.Fprintf(c.stderr, "troupe %s: --node is required\nusage: %s\n", c.cmd.name, c.cmd.usage)
		return 2
	}
	return c.withCLINode(ctx, f)
}

// withCLINode runs f with the command's own node, within the command's
// timeout, and closes the node after.
func (c *call) withCLINode(ctx context.Context, f func(ctx context.Context, n *troupe.Node) int) int {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	n, code := c.cliNode(ctx)
	if n == nil {
		return code
	}
	defer n.Close()
	return f(ctx, n)
}

// security reads the secret and TLS flags: the shared secret (nil without
// --secret-file) and the TLS config (nil without any --tls flag). For a
// server (the registrar), a --tls-ca also makes it require and verify the
// dialer's certificate. A flag naming a file that cannot be used is a
// usage error (exit 2).
func (c *call) security(server bool) ([]byte, *tls.Config, int) {
	usage := func(flag string, err error) ([]byte, *tls.Config, int) {
		fmt.Fprintf(c.stderr, "troupe %s: %s: %v\n", c.cmd.name, flag, err)
		return nil, nil, 2
	}
	var secret []byte
	if c.secretFile != "" {
		var err error
		if secret, err = troupe.ReadSecretFile(c.secretFile); err != nil {
			return usage("--secret-file", err)
		}
	}
	if c.tlsCert == "" && c.tlsKey == "" && c.tlsCA == "" {
		return secret, nil, 0
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	switch {
	case (c.tlsCert == "") != (c.tlsKey == ""):
		return usage("--tls-cert", errors.New("--tls-cert and --tls-key go together"))
	case c.tlsCert != "":
		cert, err := tls.LoadX509KeyPair(c.tlsCert, c.tlsKey)
		if err != nil {
			return usage("--tls-cert", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	if c.tlsCA != "" {
		pem, err := os.ReadFile(c.tlsCA)
		if err != nil {
			return usage("--tls-ca", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return usage("--tls-ca", fmt.Errorf("%s holds no PEM certificate", c.tlsCA))
		}
		cfg.RootCAs = pool
		if server {
			cfg.ClientCAs, cfg.ClientAuth = pool, tls.RequireAndVerifyClientCert
		}
	}
	if server && len(cfg.Certificates) == 0 {
		return usage("--tls-cert", errors.New("a registrar serving TLS needs --tls-cert and --tls-key"))
	}
	return secret, cfg, 0
}

// fail prints err in one line and returns exit code 1; an authentication
// failure says what to give.
func (c *call) fail(err error) int {
	if errors.Is(err, troupe.ErrAuth) {
		why := err.Error()
		if i := strings.LastIndex(why, troupe.ErrAuth.Error()); i >= 0 {
			why = why[i+len(troupe.ErrAuth.Error()):]
		}
		why = strings.TrimLeft(why, ": ")
		hint := "give the shared secret with --secret-file (or TROUPE_SECRET_FILE)"
		switch {
		case strings.Contains(why, "unix peer uid"):
			hint = "run the command as the node's user, or list yours in its Config.AllowUIDs"
		case strings.Contains(why, "no shared secret configured"):
			hint = "that node has no secret: drop --secret-file (and TROUPE_SECRET_FILE)"
		case c.secretFile != "":
			hint = "check that --secret-file (or TROUPE_SECRET_FILE) holds the node's secret, read as troupe.ReadSecretFile reads it"
		}
		return c.failf("authentication failed: %s; %s", why, hint)
	}
	if c.maybeTLS(err) {
		return c.failf("%v; if the node serves TLS (Config.TLS), give --tls-cert, --tls-key and --tls-ca (or TROUPE_TLS_CERT, TROUPE_TLS_KEY, TROUPE_TLS_CA)", err)
	}
	if tlsFailure(err) {
		return c.failf("TLS failed: %v; check --tls-cert, --tls-key and --tls-ca (or TROUPE_TLS_CERT, TROUPE_TLS_KEY, TROUPE_TLS_CA)", err)
	}
	if errors.Is(err, troupe.ErrMalformed) && c.node != "" {
		return c.failf("something answers at %s but does not speak troupe's protocol: is it an HTTP port (a debug page, /metrics)? give the address the node listens on", c.node)
	}
	return c.failf("%v", err)
}

// maybeTLS reports whether err is a handshake the node cut short while
// this command spoke no TLS: what a TLS node does with a plain hello.
func (c *call) maybeTLS(err error) bool {
	return c.tlsCert == "" && c.tlsCA == "" && strings.Contains(err.Error(), "handshake: EOF")
}

// tlsFailure reports whether err came from a TLS handshake.
func tlsFailure(err error) bool {
	var verify *tls.CertificateVerificationError
	var alert tls.AlertError
	var rec tls.RecordHeaderError
	return errors.As(err, &verify) || errors.As(err, &alert) || errors.As(err, &rec) || strings.Contains(err.Error(), "tls: ")
}
