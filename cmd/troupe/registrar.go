package main

import (
	"context"
	"encoding/json"
	"errors"
	"expvar"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"troupe"
)

func registrar(ctx context.Context, c *call) int {
	addrs := c.addrs
	if len(addrs) == 0 {
		addrs = addrList{troupe.DefaultRegistryTCP}
		if r := os.Getenv("TROUPE_REGISTRY"); r != "" && !strings.HasPrefix(r, "etcd") {
			addrs = addrList{r}
		}
	}
	secret, tlsConfig, code := c.security(true)
	if code != 0 {
		return code
	}
	logger := slog.New(slog.NewTextHandler(c.stderr, nil))
	n, err := troupe.Start(ctx, troupe.Config{Name: "registrar", RegistryAddrs: addrs, EnsureRegistry: true, Logger: logger, Secret: secret, TLS: tlsConfig})
	switch {
	case errors.Is(err, troupe.ErrAuth):
		return c.failf("%v", err)
	case errors.Is(err, troupe.ErrRegistryRunning):
		return c.failf("a registrar already serves %s; stop it first, or pick another --addr", strings.Join(addrs, ", "))
	case err != nil:
		return c.failf("%v", err)
	}
	for _, a := range n.Addrs() {
		fmt.Fprintf(c.stdout, "registrar listening on %s\n", a)
	}
	if c.httpAddr != "" {
		l, err := net.Listen("tcp", c.httpAddr)
		if err != nil {
			n.Close()
			return c.failf("--http: %v", err)
		}
		mux := http.NewServeMux()
		mux.Handle("/debug/troupe", n.DebugHandler())
		mux.Handle("/metrics", n.MetricsHandler())
		mux.Handle("/debug/vars", varsHandler(n))
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		served := make(chan struct{})
		go func() {
			defer close(served)
			if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
				logger.Error("registrar: the HTTP server stopped", "err", err)
			}
		}()
		defer func() { srv.Close(); <-served }()
		fmt.Fprintf(c.stdout, "registrar serving HTTP on http://%s\n", l.Addr())
	}
	logger.Info("registrar started", "addrs", fmt.Sprint(n.Addrs()), "uid", n.UID().String())
	<-ctx.Done()
	logger.Info("registrar stopping")
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := n.Shutdown(sctx); err != nil {
		return c.failf("shutdown: %v", err)
	}
	return 0
}

// varsHandler serves expvar's variables, as expvar.Handler does, with the
// node's stats document added as "troupe" (without publishing it in the
// process-wide expvar table, which would outlive the node).
func varsHandler(n *troupe.Node) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		doc, err := json.Marshal(n.Stats())
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json; charset=utf-8")
		fmt.Fprintf(w, "{\n%q: %s", "troupe", doc)
		expvar.Do(func(kv expvar.KeyValue) {
			if kv.Key != "troupe" {
				fmt.Fprintf(w, ",\n%q: %s", kv.Key, kv.Value)
			}
		})
		fmt.Fprintf(w, "\n}\n")
	})
}
