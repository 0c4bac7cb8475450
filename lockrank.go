package troupe

import (
	"bytes"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"
)

// The lock order: every lock of the package, ranked. A goroutine that
// holds a lock takes only locks ranked after it (a lock of its own rank
// only where lockNests says so, in either order; TryLock, which cannot
// block, anything). Race builds of the package's tests check
// it at every acquisition (as does any race build run with
// TROUPE_LOCKRANK=check): a lock taken out of order ends the process,
// naming both locks, so that a test that takes two locks the wrong way round fails
// the first time it runs, not the day two goroutines interleave. (The Go
// runtime checks its own locks the same way: runtime/lockrank.go.)
//
// Each lock is a mutex[R] or rwMutex[R] whose type parameter R is its
// rank; the zero value is ready to use, as a sync.Mutex is. The order
// was read from the pairs the suite takes one inside the other: run it
// with -race and TROUPE_LOCKRANK_RECORD=file to list them (main_test.go).

// lockRank is a lock's place in the order.
type lockRank int

const (
	lockNone lockRank = iota
	// Outermost: what is held while the core is called.
	// regFollower.mu (service.go): a service watch's or a topic's one
	// delivery at a time; the delivery resolves refs and spawns
	lockFollower
	// topicRelay.regMu (topic.go): a topic relay's registration, made
	// with the registries
	lockRelayReg
	// topicPub.umu (topic.go): a topic publisher's one update at a time
	lockPubUpdate
	// receptionist.sendMu (cluster_services.go): the cluster registry's
	// pushes to members, in order
	lockRecepSend
	// singletons.mu (cluster_singleton.go): the cluster's singletons
	lockSingletons
	// region.mu (sharding_region.go): a shard region's entities
	lockRegion
	// regTable.pubMu (registrar.go): a registrar's pushes to its
	// watchers, in order
	lockRegPublish
	// regTable.mu (registrar.go): a registrar's table
	lockRegTable
	// topics.mu (topic.go): the node's topics
	lockTopics
	// promise.mu (ref.go): an Ask's reply, registered as a temporary
	// actor
	lockPromise
	// cell.mu (actor.go): one actor's state and watchers
	lockCell
	// peerTable.mu (assoc_table.go): the associations by uid and
	// address, the claims, the dial counts
	lockPeers
	// assoc.mu (assoc.go): one association; two at once only as a merge
	// or a resume takes one over (the old one first)
	lockAssoc
	// assoc.due.mu (creditDue, credit.go): the credit an association owes; two at once
	// only as a resume moves it (the old one first)
	lockAssocCredit
	// actorTable.mu (actor_table.go): the node's actors by path and name
	lockActors
	// receptionist.mu (cluster_services.go): the cluster registry's
	// entries
	lockRecep
	// topicPub.mu (topic.go): a topic publisher's subscribers
	lockPub
	// topicRelay.mu (topic.go): a topic relay's subscribers
	lockRelay
	// Cluster.mu (cluster.go): the membership
	lockCluster
	// singleton.mu (cluster_singleton.go): one singleton
	lockSingleton
	// singletonSeq (cluster_singleton.go): singleton instance numbers
	lockSingletonSeq
	// shardings.mu (sharding.go): the node's sharded types
	lockShardings
	// services.mu (service.go): the node's service entries
	lockServices
	// serviceSubs.mu (service_subscribe.go): service subscriptions
	lockServiceSubs
	// registryClient.mu (register.go): registrars pending re-
	// registration
	lockRegistrars
	// foundRefs.mu (lookup.go): the lookups' fast path
	lockFoundRefs
	// addrChecks.mu (registrar_check.go): a registrar's checks of
	// contested addresses
	lockAddrChecks
	// etcdSync.mu (etcd_sync.go): what etcd confirmed of this node's
	// entries
	lockEtcdSync
	// etcdRegistry.mu (etcd_registry.go): the endpoint that answered
	// last, the lease
	lockEtcdRegistry
	// etcdLease.mu (etcd.go): an etcd lease
	lockEtcdLease
	// nodeLease.mu (lease.go): a lease
	lockNodeLease
	// tokenTable.mu (token.go): session tokens
	lockTokens
	// creditWaiters.mu (credit.go): senders waiting for credit
	lockCreditWaiters
	// listenerSet.mu (listen.go): the listeners
	lockListeners
	// inboundLimits.mu (listen.go): connections per source, those in
	// their handshake
	lockInbound
	// quarantineTable.mu (quarantine.go): the quarantine (read by
	// admission under peerTable.mu)
	lockQuarantine
	// lifecycle.hooksMu (lifecycle.go): shutdown hooks
	lockHooks
	// recentStops.mu (actor_stop.go): the last stop reasons
	lockRecentStops
	// eventStream.mu (events.go): event subscribers
	lockEvents
	// deadLetterLog.mu (deadletters.go)
	lockDeadLetterLog
	// deadLetterCounts.mu (deadletters.go)
	lockDeadLetterCounts
	// deadLetterSamples.mu (deadletters.go)
	lockDeadLetterSamples
	// wakeup.mu (seams.go): a broadcast signal (a cluster starting to
	// serve as the registry, the registry client's epoch)
	lockWakeup
	// workJournal.syncMu (work_journal.go): one fsync or rotation of a
	// producer's journal at a time
	lockJournalSync
	// workJournal.mu (work_journal.go): the journal's file and tables
	lockJournal
	// Producer.mu (work_producer.go): its window's waiters
	lockWork
	// openNodes (deadletters.go): the process's open nodes
	lockOpenNodes
	// wireTypes.mu (codec.go): the registered message types
	lockWireTypes
	// FaultNet.mu (faultnet.go): the test network's links, taken by its
	// connections' methods
	lockFaultNet
	lockRanks // (the number of ranks)
)

var lockNames = map[lockRank]string{
	lockFollower:          "Follower",
	lockRelayReg:          "RelayReg",
	lockPubUpdate:         "PubUpdate",
	lockRecepSend:         "RecepSend",
	lockSingletons:        "Singletons",
	lockRegion:            "Region",
	lockRegPublish:        "RegPublish",
	lockRegTable:          "RegTable",
	lockTopics:            "Topics",
	lockPromise:           "Promise",
	lockCell:              "Cell",
	lockPeers:             "Peers",
	lockAssoc:             "Assoc",
	lockAssocCredit:       "AssocCredit",
	lockActors:            "Actors",
	lockRecep:             "Recep",
	lockPub:               "Pub",
	lockRelay:             "Relay",
	lockCluster:           "Cluster",
	lockSingleton:         "Singleton",
	lockSingletonSeq:      "SingletonSeq",
	lockShardings:         "Shardings",
	lockServices:          "Services",
	lockServiceSubs:       "ServiceSubs",
	lockJournalSync:       "JournalSync",
	lockJournal:           "Journal",
	lockWork:              "Work",
	lockRegistrars:        "Registrars",
	lockFoundRefs:         "FoundRefs",
	lockAddrChecks:        "AddrChecks",
	lockEtcdSync:          "EtcdSync",
	lockEtcdRegistry:      "EtcdRegistry",
	lockEtcdLease:         "EtcdLease",
	lockNodeLease:         "NodeLease",
	lockTokens:            "Tokens",
	lockCreditWaiters:     "CreditWaiters",
	lockListeners:         "Listeners",
	lockInbound:           "Inbound",
	lockQuarantine:        "Quarantine",
	lockHooks:             "Hooks",
	lockRecentStops:       "RecentStops",
	lockEvents:            "Events",
	lockDeadLetterLog:     "DeadLetterLog",
	lockDeadLetterCounts:  "DeadLetterCounts",
	lockDeadLetterSamples: "DeadLetterSamples",
	lockWakeup:            "Wakeup",
	lockOpenNodes:         "OpenNodes",
	lockWireTypes:         "WireTypes",
	lockFaultNet:          "FaultNet",
}

// lockNests lists the ranks of which a goroutine may hold two at once.
var lockNests = map[lockRank]bool{lockAssoc: true, lockAssocCredit: true}

// ranker is a lock's rank, as a type: lk<Name> below.
type ranker interface{ rank() lockRank }

type lkCell struct{}

func (lkCell) rank() lockRank { return lockCell }

type lkRecentStops struct{}

func (lkRecentStops) rank() lockRank { return lockRecentStops }

type lkActors struct{}

func (lkActors) rank() lockRank { return lockActors }

type lkAssocCredit struct{}

func (lkAssocCredit) rank() lockRank { return lockAssocCredit }

type lkAssoc struct{}

func (lkAssoc) rank() lockRank { return lockAssoc }

type lkQuarantine struct{}

func (lkQuarantine) rank() lockRank { return lockQuarantine }

type lkPeers struct{}

func (lkPeers) rank() lockRank { return lockPeers }

type lkCluster struct{}

func (lkCluster) rank() lockRank { return lockCluster }

type lkRecepSend struct{}

func (lkRecepSend) rank() lockRank { return lockRecepSend }

type lkRecep struct{}

func (lkRecep) rank() lockRank { return lockRecep }

type lkJournalSync struct{}

func (lkJournalSync) rank() lockRank { return lockJournalSync }

type lkJournal struct{}

func (lkJournal) rank() lockRank { return lockJournal }

type lkWork struct{}

func (lkWork) rank() lockRank { return lockWork }

type lkWakeup struct{}

func (lkWakeup) rank() lockRank { return lockWakeup }

type lkSingletons struct{}

func (lkSingletons) rank() lockRank { return lockSingletons }

type lkSingleton struct{}

func (lkSingleton) rank() lockRank { return lockSingleton }

type lkSingletonSeq struct{}

func (lkSingletonSeq) rank() lockRank { return lockSingletonSeq }

type lkWireTypes struct{}

func (lkWireTypes) rank() lockRank { return lockWireTypes }

type lkCreditWaiters struct{}

func (lkCreditWaiters) rank() lockRank { return lockCreditWaiters }

type lkOpenNodes struct{}

func (lkOpenNodes) rank() lockRank { return lockOpenNodes }

type lkDeadLetterLog struct{}

func (lkDeadLetterLog) rank() lockRank { return lockDeadLetterLog }

type lkDeadLetterCounts struct{}

func (lkDeadLetterCounts) rank() lockRank { return lockDeadLetterCounts }

type lkDeadLetterSamples struct{}

func (lkDeadLetterSamples) rank() lockRank { return lockDeadLetterSamples }

type lkEtcdLease struct{}

func (lkEtcdLease) rank() lockRank { return lockEtcdLease }

type lkEtcdRegistry struct{}

func (lkEtcdRegistry) rank() lockRank { return lockEtcdRegistry }

type lkEtcdSync struct{}

func (lkEtcdSync) rank() lockRank { return lockEtcdSync }

type lkEvents struct{}

func (lkEvents) rank() lockRank { return lockEvents }

type lkFaultNet struct{}

func (lkFaultNet) rank() lockRank { return lockFaultNet }

type lkNodeLease struct{}

func (lkNodeLease) rank() lockRank { return lockNodeLease }

type lkHooks struct{}

func (lkHooks) rank() lockRank { return lockHooks }

type lkListeners struct{}

func (lkListeners) rank() lockRank { return lockListeners }

type lkInbound struct{}

func (lkInbound) rank() lockRank { return lockInbound }

type lkFoundRefs struct{}

func (lkFoundRefs) rank() lockRank { return lockFoundRefs }

type lkPromise struct{}

func (lkPromise) rank() lockRank { return lockPromise }

type lkRegistrars struct{}

func (lkRegistrars) rank() lockRank { return lockRegistrars }

type lkRegTable struct{}

func (lkRegTable) rank() lockRank { return lockRegTable }

type lkRegPublish struct{}

func (lkRegPublish) rank() lockRank { return lockRegPublish }

type lkAddrChecks struct{}

func (lkAddrChecks) rank() lockRank { return lockAddrChecks }

type lkServices struct{}

func (lkServices) rank() lockRank { return lockServices }

type lkFollower struct{}

func (lkFollower) rank() lockRank { return lockFollower }

type lkServiceSubs struct{}

func (lkServiceSubs) rank() lockRank { return lockServiceSubs }

type lkShardings struct{}

func (lkShardings) rank() lockRank { return lockShardings }

type lkRegion struct{}

func (lkRegion) rank() lockRank { return lockRegion }

type lkTokens struct{}

func (lkTokens) rank() lockRank { return lockTokens }

type lkTopics struct{}

func (lkTopics) rank() lockRank { return lockTopics }

type lkRelay struct{}

func (lkRelay) rank() lockRank { return lockRelay }

type lkRelayReg struct{}

func (lkRelayReg) rank() lockRank { return lockRelayReg }

type lkPubUpdate struct{}

func (lkPubUpdate) rank() lockRank { return lockPubUpdate }

type lkPub struct{}

func (lkPub) rank() lockRank { return lockPub }

// mutex is a sync.Mutex with a place in the lock order.
type mutex[R ranker] struct{ mu sync.Mutex }

func (m *mutex[R]) Lock() {
	if raceEnabled && lockTrack.on {
		var r R
		lockAcquire(unsafe.Pointer(m), r.rank(), true)
	}
	m.mu.Lock()
}

func (m *mutex[R]) TryLock() bool {
	ok := m.mu.TryLock()
	if ok && raceEnabled && lockTrack.on {
		var r R
		lockAcquire(unsafe.Pointer(m), r.rank(), false)
	}
	return ok
}

func (m *mutex[R]) Unlock() {
	if raceEnabled && lockTrack.on {
		lockRelease(unsafe.Pointer(m))
	}
	m.mu.Unlock()
}

// rwMutex is a sync.RWMutex with a place in the lock order; a read lock
// takes its place as a write lock does.
type rwMutex[R ranker] struct{ mu sync.RWMutex }

func (m *rwMutex[R]) Lock() {
	if raceEnabled && lockTrack.on {
		var r R
		lockAcquire(unsafe.Pointer(m), r.rank(), true)
	}
	m.mu.Lock()
}

func (m *rwMutex[R]) Unlock() {
	if raceEnabled && lockTrack.on {
		lockRelease(unsafe.Pointer(m))
	}
	m.mu.Unlock()
}

func (m *rwMutex[R]) RLock() {
	if raceEnabled && lockTrack.on {
		var r R
		lockAcquire(unsafe.Pointer(m), r.rank(), true)
	}
	m.mu.RLock()
}

func (m *rwMutex[R]) RUnlock() {
	if raceEnabled && lockTrack.on {
		lockRelease(unsafe.Pointer(m))
	}
	m.mu.RUnlock()
}

// heldLock is a lock a goroutine holds.
type heldLock struct {
	m    unsafe.Pointer
	rank lockRank
}

// lockShard holds, for some goroutines (by getg), the locks each holds.
// A shard's lock makes the goroutines that share it look synchronized to
// the race detector at each lock they take: with 1,024 shards, a pair of
// goroutines shares one seldom (TROUPE_LOCKRANK=off runs a race build
// without the checks).
type lockShard struct {
	sync.Mutex
	held map[uintptr][]heldLock
}

// lockShardOf is the shard of the goroutine g.
func lockShardOf(g uintptr) *lockShard {
	return &lockTrack.shards[uint64(g)*0x9e3779b97f4a7c15>>54]
}

// lockTrack is what race builds know of the locks held.
var lockTrack struct {
	shards [1024]lockShard
	// pairs records every pair of ranks held one inside the other, outer
	// first (lockOrderSeen).
	pairs [lockRanks][lockRanks]atomic.Bool
	// on: locks are tracked and checked (race builds only). It is set
	// before anything locks: by the package's tests (main_test.go), or
	// by TROUPE_LOCKRANK=check in the environment.
	on bool
	// record has a lock taken out of order recorded (in pairs), not
	// panic: set while the order is being worked out.
	record bool
}

func init() {
	lockTrack.on = raceEnabled && os.Getenv("TROUPE_LOCKRANK") == "check"
}

// lockCheckInTests is whether the package's own race-built tests check
// the order: unless TROUPE_LOCKRANK=off.
func lockCheckInTests() bool {
	return raceEnabled && os.Getenv("TROUPE_LOCKRANK") != "off"
}

func (t *lockShard) init() {
	if t.held == nil {
		t.held = map[uintptr][]heldLock{}
	}
}

// lockAcquire checks that the calling goroutine may take the lock m of
// rank r (check: it may block, not TryLock) and records it as held.
func lockAcquire(m unsafe.Pointer, r lockRank, check bool) {
	g := getg()
	sh := lockShardOf(g)
	sh.Lock()
	sh.init()
	held := sh.held[g]
	bad := lockNone
	for _, h := range held {
		if p := &lockTrack.pairs[h.rank][r]; !p.Load() {
			p.Store(true)
		}
		if check && (h.rank > r || h.rank == r && !lockNests[r]) && bad == lockNone {
			bad = h.rank
		}
	}
	if bad == lockNone || lockTrack.record {
		sh.held[g] = append(held, heldLock{m, r})
	}
	sh.Unlock()
	if bad != lockNone && !lockTrack.record {
		lockFatal(fmt.Sprintf("troupe: lock order: taking %s while holding %s (lockrank.go ranks %s first)", lockNames[r], lockNames[bad], lockNames[min(r, bad)]))
	}
}

// lockFatal ends the process with msg and the goroutine's stack, as the
// runtime ends it for a lock taken out of its order: not a panic, which
// the package recovers from in handlers, subscribers and encoders.
func lockFatal(msg string) {
	fmt.Fprintf(os.Stderr, "%s\n\n%s", msg, debug.Stack())
	os.Exit(2)
}

// lockRelease forgets the lock m: held by the calling goroutine, or, when
// another goroutine locked it, by that one.
func lockRelease(m unsafe.Pointer) {
	g := getg()
	sh := lockShardOf(g)
	sh.Lock()
	sh.init()
	ok := drop(sh.held, g, m)
	sh.Unlock()
	if ok {
		return
	}
	for i := range lockTrack.shards {
		sh := &lockTrack.shards[i]
		sh.Lock()
		for other := range sh.held {
			if drop(sh.held, other, m) {
				sh.Unlock()
				return
			}
		}
		sh.Unlock()
	}
}

// drop removes m from what g holds. A runtime g is reused by the
// goroutines that come after, so its slice is kept for their locks; a
// goroutine id (getgReused false) never comes back, so its entry goes.
func drop(held map[uintptr][]heldLock, g uintptr, m unsafe.Pointer) bool {
	hs := held[g]
	for i := len(hs) - 1; i >= 0; i-- {
		if hs[i].m == m {
			hs = append(hs[:i], hs[i+1:]...)
			if len(hs) == 0 && !getgReused {
				delete(held, g)
			} else {
				held[g] = hs
			}
			return true
		}
	}
	return false
}

// goid is the calling goroutine's id, read from its stack trace's first
// line: getg where no assembly reads the runtime's g (race builds only).
func goid() int64 {
	var buf [64]byte
	b := bytes.TrimPrefix(buf[:runtime.Stack(buf[:], false)], []byte("goroutine "))
	if i := bytes.IndexByte(b, ' '); i > 0 {
		b = b[:i]
	}
	id, _ := strconv.ParseInt(string(b), 10, 64)
	return id
}

// lockOrderSeen lists every pair of locks a race build saw held one
// inside the other, outer first, one pair a line.
func lockOrderSeen() string {
	var lines []string
	for outer := range lockTrack.pairs {
		for inner := range lockTrack.pairs[outer] {
			if lockTrack.pairs[outer][inner].Load() {
				lines = append(lines, lockNames[lockRank(outer)]+" "+lockNames[lockRank(inner)])
			}
		}
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}
