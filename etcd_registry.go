package troupe

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// A registry kept in etcd rather than in a registrar: named in
// Config.RegistryAddrs (or WithRegistries) as
//
//	etcd://host:port[,host:port...]/prefix     plain HTTP
//	etcds://host:port[,host:port...]/prefix    HTTPS, with Config.TLS
//
// It is reached through etcd's JSON gateway with net/http, as NewEtcdLease's lease is.
// Each registration is one key, prefix/name/uuid (the uuid in hex), whose
// value is the JSON of etcdEntry, attached to the node's one etcd lease.
// The lease's time to live is Config.UnreachableAfter (at least etcd's
// minimum): a node that dies, or is cut off from etcd, loses its entries
// when it expires, and registers everything again when it regains etcd.

// Bounds of the etcd client.
const (
	// etcdRetryWait is the pause between two rounds of the endpoints.
	etcdRetryWait = 100 * time.Millisecond
	// etcdMinTTL is the shortest lease this client asks of etcd, whatever
	// its election timeout (etcd's own minimum is 1.5 election timeouts).
	etcdMinTTL = 2 * time.Second
	// etcdWatchRenew bounds one watch stream: a member that stops
	// answering without closing the stream (a partition) holds a wait up
	// for at most this long before the wait reads again and fails over.
	// Quiet streams cost one read per waiter per period.
	etcdWatchRenew = 30 * time.Second
)

// etcdTiming is what the etcd client derives from the election timeout
// of the etcd cluster (Config.EtcdElectionTimeout, T below).
//
// When etcd's leader dies, its followers notice after a randomised
// timeout between T and 2T from the leader's last heartbeat, and a vote
// takes a round trip more: for up to about 2.5T no member can commit, and
// each holds the writes and linearizable reads it is sent until a leader
// is elected. So one attempt on one member is bounded by T (a member that
// has said nothing for T is passed over for the next: a dead or cut-off
// member costs at most T), and a request goes on trying the members,
// every etcdRetryWait, for the whole election and one attempt more,
// 3.5T: an election ends in the attempt that was in flight when the new
// leader took over, not in an error. The measured stall, with etcd's
// default T of 1 s, is in BENCHMARKS.md ("etcd: a leader kill").
type etcdTiming struct {
	attempt  time.Duration // one request to one member
	election time.Duration // the longest no member can commit after the leader dies
	window   time.Duration // how long a request goes on trying the members
	minTTL   time.Duration // the shortest lease to ask for
}

func etcdTimingFor(t time.Duration) etcdTiming {
	if t <= 0 {
		t = defaultEtcdElectionTimeout
	}
	election := 2*t + t/2
	return etcdTiming{
		attempt:  t,
		election: election,
		window:   election + t,
		minTTL:   max(etcdMinTTL, (3*t/2+time.Second-1)/time.Second*time.Second),
	}
}

// etcdEntry is the value of a registration key: a layout other tools can
// read.
type etcdEntry struct {
	Name       string    `json:"name"`
	UUID       string    `json:"uuid"`           // hex
	Path       string    `json:"path,omitempty"` // "" for a node's own registration
	Node       string    `json:"node"`           // the node incarnation's uid, hex
	NodeName   string    `json:"node_name"`
	Addrs      []string  `json:"addrs"` // URL form: tcp://host:port, unix:///path
	Registered time.Time `json:"registered"`
}

// etcdRegistry is one etcd registry as a node uses it.
type etcdRegistry struct {
	url       string   // as configured
	endpoints []string // http(s)://host:port, tried in turn
	prefix    string   // "/" + the path, with a trailing "/"
	client    *http.Client
	timing    etcdTiming

	mu    mutex[lkEtcdRegistry]
	first int    // the endpoint that answered last
	lease string // the node's lease ID, "" before the first grant
}

// isEtcdURL reports whether s names an etcd registry.
func isEtcdURL(s string) bool {
	return strings.HasPrefix(s, "etcd://") || strings.HasPrefix(s, "etcds://")
}

// parseEtcdURL reads an etcd registry address. tlsCfg is used for etcds;
// election is the etcd cluster's election timeout (zero: etcd's default).
func parseEtcdURL(s string, tlsCfg *tls.Config, election time.Duration) (*etcdRegistry, error) {
	scheme, rest, _ := strings.Cut(s, "://")
	hosts, path, _ := strings.Cut(rest, "/")
	path = strings.Trim(path, "/")
	if path == "" {
		path = "troupe"
	}
	r := &etcdRegistry{url: s, prefix: "/" + path + "/", timing: etcdTimingFor(election)}
	web := "http://"
	tr := &http.Transport{MaxIdleConnsPerHost: 16, IdleConnTimeout: time.Minute}
	if scheme == "etcds" {
		web = "https://"
		if tlsCfg != nil {
			tr.TLSClientConfig = tlsCfg.Clone()
		}
	}
	for h := range strings.SplitSeq(hosts, ",") {
		if h == "" {
			continue
		}
		if _, err := parseHostPort(h); err != nil {
			return nil, fmt.Errorf("%w: etcd endpoint %q in %q: %v", ErrBadAddr, h, s, err)
		}
		r.endpoints = append(r.endpoints, web+h)
	}
	if len(r.endpoints) == 0 {
		return nil, fmt.Errorf("%w: %q names no etcd endpoint", ErrBadAddr, s)
	}
	r.client = &http.Client{Transport: tr}
	return r, nil
}

func (r *etcdRegistry) String() string { return r.url }

// call posts in to the gateway path on the first endpoint that answers,
// trying each in turn, and decodes the answer into out.
func (r *etcdRegistry) call(ctx context.Context, path string, in, out any) error {
	body, err := json.Marshal(in)
	if err != nil {
		return err
	}
	start := time.Now()
	for {
		r.mu.Lock()
		first := r.first
		r.mu.Unlock()
		var errs []error
		electing, refused := false, true
		for i := range r.endpoints {
			k := (first + i) % len(r.endpoints)
			err := r.callOne(ctx, r.endpoints[k], path, body, out)
			if err == nil {
				r.mu.Lock()
				r.first = k
				r.mu.Unlock()
				return nil
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			electing = electing || errors.Is(err, errEtcdUnavailable) || errors.Is(err, context.DeadlineExceeded)
			refused = refused && isRefusal(err)
			errs = append(errs, err)
		}
		if refused {
			return fmt.Errorf("etcd %s: %w: %w", r.url, errEtcdRefused, errors.Join(errs...))
		}
		if !electing || time.Since(start) >= r.timing.window || !sleepCtx(ctx, etcdRetryWait) {
			return fmt.Errorf("etcd %s: %w", r.url, errors.Join(errs...))
		}
	}
}

// errEtcdUnavailable is wrapped by the error of a member that answered
// 503 Service Unavailable (no leader, or the leader changed).
var errEtcdUnavailable = errors.New("unavailable")

// errEtcdRefused is wrapped by the error of a call that every member
// refused at once (no connection could be made to any): no election is
// under way, and no answer is coming soon.
var errEtcdRefused = errors.New("every member refused the connection")

// isRefusal reports whether err is a dial that failed at once (refused,
// or no route): not a member that is slow or electing.
func isRefusal(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial" && !op.Timeout()
}

func (r *etcdRegistry) callOne(ctx context.Context, endpoint, path string, body []byte, out any) error {
	// The attempt's bound is on the member's answer, not on reading it:
	// a member that does not answer within it is given up for the next,
	// but a large answer (a range of ten thousand entries on a slow
	// machine) is read to its end within the caller's ctx.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	answer := time.AfterFunc(r.timing.attempt, cancel)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint+path, bytes.NewReader(body))
	if err != nil {
		answer.Stop()
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := r.client.Do(req)
	if !answer.Stop() {
		if err == nil {
			resp.Body.Close()
		}
		return fmt.Errorf("%s%s: no answer within %v: %w", endpoint, path, r.timing.attempt, context.DeadlineExceeded)
	}
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	// (reading the answer: bounded by the caller's ctx, and by the
	// window, so that a member that stalls mid-answer cannot hold a
	// caller without one)
	reading := time.AfterFunc(r.timing.window, cancel)
	defer reading.Stop()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		err := fmt.Errorf("%s%s: %s: %s", endpoint, path, resp.Status, bytes.TrimSpace(msg))
		if resp.StatusCode == http.StatusServiceUnavailable {
			err = fmt.Errorf("%w (%w)", err, errEtcdUnavailable)
		}
		return err
	}
	return json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(out)
}

// key is the key of the registration of name with uuid.
func (r *etcdRegistry) key(name string, uuid UUID) string {
	return r.prefix + name + "/" + hex.EncodeToString(uuid[:])
}

// rangeEnd is the end of the range of every key that starts with p.
func rangeEnd(p string) string {
	b := []byte(p)
	for i := len(b) - 1; i >= 0; i-- {
		if b[i] < 0xff {
			b[i]++
			return string(b[:i+1])
		}
	}
	return "\x00"
}

// grant takes a new lease for the node, with ttl.
func (r *etcdRegistry) grant(ctx context.Context, ttl time.Duration) (string, error) {
	var res struct{ ID string }
	secs := int64((max(ttl, r.timing.minTTL) + time.Second - 1) / time.Second)
	if err := r.call(ctx, "/v3/lease/grant", map[string]any{"TTL": secs}, &res); err != nil {
		return "", err
	}
	if res.ID == "" {
		return "", fmt.Errorf("etcd %s: a lease grant without an id", r.url)
	}
	return res.ID, nil
}

// keepAlive renews lease once: false when etcd no longer has it.
func (r *etcdRegistry) keepAlive(ctx context.Context, lease string) (bool, error) {
	var res struct {
		Result struct{ TTL string }
	}
	if err := r.call(ctx, "/v3/lease/keepalive", map[string]any{"ID": lease}, &res); err != nil {
		return false, err
	}
	ttl, _ := strconv.ParseInt(res.Result.TTL, 10, 64)
	return ttl > 0, nil
}

// put writes reg under the node's lease.
func (r *etcdRegistry) put(ctx context.Context, lease string, reg Registration) error {
	v, err := entryValue(reg)
	if err != nil {
		return err
	}
	put := map[string]any{"key": b64(r.key(reg.Name, reg.UUID)), "value": v, "lease": lease}
	return r.call(ctx, "/v3/kv/put", put, &struct{}{})
}

// del removes the registration of name with uuid.
func (r *etcdRegistry) del(ctx context.Context, name string, uuid UUID) error {
	return r.call(ctx, "/v3/kv/deleterange", map[string]any{"key": b64(r.key(name, uuid))}, &struct{}{})
}

// etcdKV is a key and value as the gateway returns them.
type etcdKV struct {
	Key            string `json:"key"`
	Value          string `json:"value"`
	CreateRevision string `json:"create_revision"`
}

// decode turns a kv into a registration; false for a value that is not
// one (another tool's key under the prefix).
func (kv etcdKV) decode() (Registration, bool) {
	raw, err := base64.StdEncoding.DecodeString(kv.Value)
	if err != nil {
		return Registration{}, false
	}
	var e etcdEntry
	if json.Unmarshal(raw, &e) != nil || e.Name == "" {
		return Registration{}, false
	}
	reg := Registration{Name: e.Name, Path: e.Path, NodeName: e.NodeName}
	if hex.DecodedLen(len(e.UUID)) != len(reg.UUID) || hex.DecodedLen(len(e.Node)) != len(reg.Node) {
		return Registration{}, false
	}
	if _, err := hex.Decode(reg.UUID[:], []byte(e.UUID)); err != nil {
		return Registration{}, false
	}
	if _, err := hex.Decode(reg.Node[:], []byte(e.Node)); err != nil {
		return Registration{}, false
	}
	for _, s := range e.Addrs {
		if a, err := ParseAddr(s); err == nil {
			reg.Addrs = append(reg.Addrs, a)
		}
	}
	reg.Seq, _ = strconv.ParseUint(kv.CreateRevision, 10, 64)
	return reg, true
}

// decode turns a kv of this registry into a registration: false for one
// that is not (another tool's key, or an entry of a deployment whose
// prefix nests under this one's, such as "nest/canary" under "nest":
// its key is not prefix/name/uuid of what its value says).
func (r *etcdRegistry) decode(kv etcdKV) (Registration, bool) {
	reg, ok := kv.decode()
	if !ok {
		return reg, false
	}
	key, err := base64.StdEncoding.DecodeString(kv.Key)
	return reg, err == nil && string(key) == r.key(reg.Name, reg.UUID)
}

// rangeOf returns the registrations whose keys start with p, oldest
// first, and the store's revision they were read at.
func (r *etcdRegistry) rangeOf(ctx context.Context, p string) ([]Registration, uint64, error) {
	var res struct {
		Header struct{ Revision string }
		Kvs    []etcdKV
	}
	req := map[string]any{"key": b64(p), "range_end": b64(rangeEnd(p)), "sort_target": "CREATE", "sort_order": "ASCEND"}
	if err := r.call(ctx, "/v3/kv/range", req, &res); err != nil {
		return nil, 0, err
	}
	rev, _ := strconv.ParseUint(res.Header.Revision, 10, 64)
	out := make([]Registration, 0, len(res.Kvs))
	for _, kv := range res.Kvs {
		if reg, ok := r.decode(kv); ok {
			out = append(out, reg)
		}
	}
	return out, rev, nil
}

// named returns the registrations under name, oldest first, and the
// revision they were read at. (A name with a slash in it shares a key
// range with its first segment: entries of other names are left out.)
func (r *etcdRegistry) named(ctx context.Context, name string) ([]Registration, uint64, error) {
	regs, rev, err := r.rangeOf(ctx, r.prefix+name+"/")
	regs = slices.DeleteFunc(regs, func(reg Registration) bool { return reg.Name != name })
	return regs, rev, err
}

// find returns the registrations under name, newest first.
func (r *etcdRegistry) find(ctx context.Context, name string) ([]Registration, error) {
	regs, _, err := r.named(ctx, name)
	slices.Reverse(regs)
	return regs, err
}

// list returns every registration, oldest first.
func (r *etcdRegistry) list(ctx context.Context) ([]Registration, error) {
	regs, _, err := r.rangeOf(ctx, r.prefix)
	return regs, err
}

// wait returns the registrations under name once one that c admits
// exists: at once if one does, else when etcd's watch stream reports it
// (pushed, not polled). A broken stream is opened again from where it
// stopped, on the next endpoint.
func (r *etcdRegistry) wait(ctx context.Context, name string, c waitCond) ([]Registration, error) {
	p := r.prefix + name + "/"
	for {
		regs, rev, err := r.named(ctx, name)
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			if !sleepCtx(ctx, r.timing.attempt/4) {
				return nil, ctx.Err()
			}
			continue
		}
		for _, reg := range regs {
			if c.admits(&reg) {
				slices.Reverse(regs)
				return regs, nil
			}
		}
		if err := r.watchFrom(ctx, p, rev+1, func(deleted bool, reg Registration, ok bool) bool {
			return ok && reg.Name == name && c.admits(&reg)
		}); err != nil {
			// The stream broke (a member died, the revision was
			// compacted): read again after a pause, on the next member.
			if ctx.Err() != nil || !sleepCtx(ctx, r.timing.attempt/4) {
				return nil, ctx.Err()
			}
		}
		// Something admitted was put, or the stream broke: read again.
	}
}

// rotate makes the endpoint after failed the first to try.
func (r *etcdRegistry) rotate(failed string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.endpoints[r.first] == failed {
		r.first = (r.first + 1) % len(r.endpoints)
	}
}

// sleepCtx waits d; false if ctx ended first.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// deleteAddr removes the registrations of the node incarnation uid that
// list addr: a lookup found that address refusing connections.
func (r *etcdRegistry) deleteAddr(ctx context.Context, uid NodeUID, addr Addr) {
	regs, _, err := r.rangeOf(ctx, r.prefix)
	if err != nil {
		return
	}
	for _, reg := range regs {
		if reg.Node == uid && containsAddr(reg.Addrs, addr) {
			r.del(ctx, reg.Name, reg.UUID)
		}
	}
}

// revoke ends lease, and with it every key attached to it.
func (r *etcdRegistry) revoke(ctx context.Context, lease string) error {
	return r.call(ctx, "/v3/lease/revoke", map[string]any{"ID": lease}, &struct{}{})
}

func (r *etcdRegistry) currentLease() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lease
}

func (r *etcdRegistry) setLease(lease string) {
	r.mu.Lock()
	r.lease = lease
	r.mu.Unlock()
}

func init() { installStore = newEtcdStore }

// newEtcdStore is n's etcd client as the core reaches it (storeClient,
// registries.go).
func newEtcdStore(n *Node) *storeClient {
	ec := &etcdClient{n: n}
	return &storeClient{
		impl:       ec,
		names:      isEtcdURL,
		configured: ec.etcdConfigured,
		start:      ec.startEtcdRegistry,
		active:     func() bool { return ec.reg != nil },
		own: func() registry {
			if ec.reg == nil {
				return nil
			}
			return etcdSource{ec, ec.reg}
		},
		at: func(s string) (registry, error) {
			r, err := ec.etcdFor(s)
			if err != nil {
				return nil, err
			}
			return etcdSource{ec, r}, nil
		},
		registerNode: ec.registerEtcd,
		pending:      ec.etcdPending,
		revoke:       ec.revokeEtcd,
		closeIdle:    ec.closeEtcdClients,
	}
}

// putEntry has the node's one writer put h's new entry r (with whatever else
// is due), and waits for it, boundedly: past RegistryTimeout, it is
// pending (Stats, Ready) until etcd takes it.
func (ec *etcdClient) putEntry(h *handle, r Registration) {
	ec.sync.poke(false)
	ctx, cancel := context.WithTimeout(ec.n.lc.ctx, ec.n.disc.registryTimeout())
	defer cancel()
	if !ec.awaitEtcd(ctx, h, r) {
		ec.n.log.Warn("troupe: etcd has not confirmed an actor's registration yet; it stays pending until etcd takes it", "path", h.key.path, "name", r.Name, "registry", ec.reg.String())
	}
}

// etcdConfigured reports whether Config.RegistryAddrs names an etcd.
func (ec *etcdClient) etcdConfigured() bool {
	for _, s := range ec.n.cfg.RegistryAddrs {
		if isEtcdURL(s) {
			return true
		}
	}
	return false
}

// startEtcdRegistry sets the node up to use the etcd registry of its
// config, and binds its own addresses (tcp://127.0.0.1:0 by default).
//
// Several entries name the endpoints of one etcd cluster, as commas in one
// entry do: they must agree on the scheme and the prefix, and none may be
// a registrar's address.
func (ec *etcdClient) startEtcdRegistry(ctx context.Context) error {
	if ec.n.cfg.EnsureRegistry || ec.n.cfg.ServeRegistry {
		return fmt.Errorf("%w: EnsureRegistry and ServeRegistry serve a registrar; with an etcd registry there is none to serve", ErrBadConfig)
	}
	var r *etcdRegistry
	for _, s := range ec.n.cfg.RegistryAddrs {
		if !isEtcdURL(s) {
			return fmt.Errorf("%w: RegistryAddrs: %q is not an etcd endpoint; an etcd registry and registrars cannot be mixed", ErrBadConfig, s)
		}
		one, err := parseEtcdURL(s, ec.registryTLS(), ec.n.cfg.EtcdElectionTimeout)
		if err != nil {
			return fmt.Errorf("%w: RegistryAddrs: %v", ErrBadConfig, err)
		}
		switch {
		case r == nil:
			r = one
		case one.prefix != r.prefix || strings.HasPrefix(one.endpoints[0], "https") != strings.HasPrefix(r.endpoints[0], "https"):
			return fmt.Errorf("%w: RegistryAddrs: %q and %q name different etcd registries (scheme or prefix)", ErrBadConfig, r.url, s)
		default:
			r.endpoints = append(r.endpoints, one.endpoints...)
		}
	}
	ec.reg = r
	listen := ec.n.cfg.Listen
	if len(listen) == 0 {
		listen = []string{"tcp://127.0.0.1:0"}
	}
	return ec.n.lis.listenAll(ctx, listen)
}

// etcdFor returns the etcd registry named s: the node's own, or one kept
// for lookups through WithRegistries.
func (ec *etcdClient) etcdFor(s string) (*etcdRegistry, error) {
	if ec.reg != nil && ec.reg.url == s {
		return ec.reg, nil
	}
	if v, ok := ec.others.Load(s); ok {
		return v.(*etcdRegistry), nil
	}
	r, err := parseEtcdURL(s, ec.registryTLS(), ec.n.cfg.EtcdElectionTimeout)
	if err != nil {
		return nil, err
	}
	v, _ := ec.others.LoadOrStore(s, r)
	return v.(*etcdRegistry), nil
}

// registryTLS is the TLS config for an etcds registry.
func (ec *etcdClient) registryTLS() *tls.Config {
	if ec.n.cfg.RegistryTLS != nil {
		return ec.n.cfg.RegistryTLS
	}
	return ec.n.cfg.TLS
}

// etcdTTL is the time to live of the node's etcd lease.
func (ec *etcdClient) etcdTTL() time.Duration {
	return max(ec.n.cfg.UnreachableAfter, etcdTimingFor(ec.n.cfg.EtcdElectionTimeout).minTTL)
}

// registerEtcd takes the node's etcd lease and registers the node with
// it before Start returns; a goroutine then keeps the lease alive.
func (ec *etcdClient) registerEtcd(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, ec.n.disc.registryTimeout())
	defer cancel()
	lease, err := ec.reg.grant(ctx, ec.etcdTTL())
	self := ec.n.disc.nodeRegistration()
	if err == nil {
		err = ec.reg.put(ctx, lease, self)
	}
	if err != nil {
		return fmt.Errorf("register with %w", err)
	}
	ec.reg.setLease(lease)
	ec.sync.init()
	ec.sync.written[ec.reg.key(self.Name, self.UUID)] = struct{}{}
	ec.n.wg.Go(ec.keepEtcd)
	ec.n.wg.Go(ec.syncEtcd)
	return nil
}

// keepEtcd renews the node's lease every third of its time to live. When
// etcd says the lease has expired (the node was cut off from etcd for
// longer than that), it takes a new one and registers everything again.
func (ec *etcdClient) keepEtcd() {
	r, ttl := ec.reg, ec.etcdTTL()
	t := time.NewTicker(ttl / 3)
	defer t.Stop()
	unreachable := false
	for {
		select {
		case <-ec.n.lc.done:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(ec.n.lc.ctx, ttl/3)
		alive, err := r.keepAlive(ctx, r.currentLease())
		switch {
		case err != nil:
			if !unreachable {
				ec.n.log.Warn("troupe: etcd registry unreachable; this node's entries expire if it stays so", "registry", r.String(), "ttl", ttl, "err", err)
				unreachable = true
			}
		case alive:
			if unreachable {
				ec.n.log.Info("troupe: etcd registry reachable again", "registry", r.String())
				unreachable = false
			}
		default:
			if ec.n.lc.isClosed() {
				break // (revoked by the shutdown)
			}
			// The lease expired, and the entries with it: a new lease,
			// and everything put again under it (in batches).
			lease, err := r.grant(ctx, ttl)
			if err != nil {
				ec.n.log.Warn("troupe: could not take a new etcd lease", "registry", r.String(), "err", err)
				break
			}
			r.setLease(lease)
			ec.leaseLost()
			ec.n.log.Info("troupe: etcd lease had expired; registering everything again", "registry", r.String())
			unreachable = false
			ec.n.disc.bump()
		}
		cancel()
	}
}

// revokeEtcd removes the node's entries as it closes (within d), by
// revoking its lease; an etcd that does not answer lets them expire.
func (ec *etcdClient) revokeEtcd(d time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	if lease := ec.reg.currentLease(); lease != "" {
		ec.reg.revoke(ctx, lease)
	}
}

// closeEtcdClients releases the idle connections of every etcd client.
func (ec *etcdClient) closeEtcdClients() {
	if ec.reg != nil {
		ec.reg.client.CloseIdleConnections()
	}
	ec.others.Range(func(_, v any) bool {
		v.(*etcdRegistry).client.CloseIdleConnections()
		return true
	})
}

// askEtcd answers a lookup request from an etcd registry.
func (ec *etcdClient) askEtcd(ctx context.Context, r *etcdRegistry, req regRequest) ([]Registration, error) {
	if ec.n.lc.workOver() {
		return nil, ErrNodeClosed
	}
	ctx, cancel := context.WithTimeout(ctx, ec.n.disc.registryTimeout())
	defer cancel()
	switch req.Op {
	case regOpFind:
		return r.find(ctx, req.Name)
	case regOpList:
		return r.list(ctx)
	case regOpRegister:
		lease := r.currentLease()
		if lease == "" {
			return nil, fmt.Errorf("etcd %s: only a node's own registry (Config.RegistryAddrs) takes its registrations", r.url)
		}
		for _, reg := range fromWire(req.Regs, Addr{}) {
			if err := r.put(ctx, lease, reg); err != nil {
				return nil, err
			}
		}
		return nil, nil
	}
	return nil, fmt.Errorf("etcd %s: request %d is for a registrar", r.url, req.Op)
}

// etcdClient is a node's use of etcd as its registry: the registry it
// registers with, what etcd confirmed of its entries, and the other
// etcd registries that lookups name. reg is set in Start, then
// read-only; sync has its own lock; others is a sync.Map.
type etcdClient struct {
	n      *Node
	reg    *etcdRegistry // the etcd registry this node registers with, if any
	sync   etcdSync      // what etcd confirmed of this node's entries (etcd_sync.go)
	others sync.Map      // URL -> *etcdRegistry: those named in WithRegistries
}
