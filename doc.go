// Package troupe is an actor runtime for Go services that must find each
// other by name and survive each other's failure.
//
// A process runs a [Node]. A node hosts actors — each a mailbox and a
// behavior, run by a goroutine only while it has messages — and talks to
// other nodes over TCP or Unix domain sockets with a small hand-written
// binary codec. A [Ref] to an actor may travel inside a message to another
// node and arrives there as a usable ref, so replies find their way back.
//
// # The calls a newcomer needs
//
//   - [Start] with a [Config] starts a node; [Node.Shutdown] stops it
//     gracefully and [Node.Close] at once.
//   - [SetWireKey] gives a message type that crosses the wire its key.
//   - [Spawn] starts an actor with a [Behavior] under a node or a parent's
//     [Context] and returns its [Ref].
//   - [Ref.Tell] sends without waiting; [Ref.Send] waits for room.
//   - [Ask] sends a request carrying a temporary reply ref and waits for
//     the reply.
//   - [Resolve] turns a ref string made by [FormatRef] into a [Ref].
//   - [FindActor] and [WaitForActor] find an actor by its name in the
//     registry ([Config.RegistryAddrs]).
//   - [Context.Watch] asks for a [Terminated] signal, handled by
//     [Behavior.Signal], when an actor stops, on this node or another.
//   - [Supervise] restarts a failing actor with fresh state.
//   - [Subscribe] follows a node's events: dead letters, peers.
//
// The README's tour is a complete program with all of them; the guides in
// docs/ hold the detail.
//
// # How values are made
//
// Each kind of value is made one way, so that its name says how:
//
//   - Configuration and plain values are struct literals, and a zero field
//     means its documented default: [Config], [ClusterConfig],
//     [ShardingConfig], [SingletonConfig], [Behavior], [PhiAccrual], a
//     [ServiceKey] or [Topic] (troupe.ServiceKey[Job]{Name: "jobs"}). A
//     type whose zero value works has no constructor: the zero [Strategy]
//     stops (every actor's default), new(troupe.FaultNet) is a network
//     with nothing cut.
//   - A strategy, a choice among behaviors, is made by a function named
//     for the choice: [ResumeOnFailure], [RestartOnFailure] and
//     [RestartWithBackoff] (refined by Strategy's With methods);
//     [RoundRobin], [RandomRoute] and [ConsistentHash]; [KeepMajority],
//     [StaticQuorum], [KeepOldest], [DownAll] and [LeaseMajority].
//   - What runs is started by a verb that returns its handle: [Start] (a
//     [Node]), [StartCluster], [Spawn], [SpawnGroupRouter], [Singleton],
//     [Sharding], [Produce], [Worker]; it ends with the handle's Close or
//     Shutdown, or an actor's Stop.
//   - A client of something outside the node is made by New and what it
//     reaches: [NewNodeLease], [NewEtcdLease] (which also returns the
//     function that closes it, as context.WithCancel returns its cancel).
//   - Text is read by Parse and what it reads, [ParseAddr] and [ParseRef],
//     and written by the value's String (or [FormatRef]).
//   - A call's options are values made by functions named for what they
//     ask: [WithRegistries] (a [LookupOption]); [Reconnect] and [OnNode]
//     (a [ClearOption]).
//
// # Watching a remote actor
//
// The seed's central pattern: watch an actor on another node, and when it
// stops — or its node dies, or can no longer be reached — rebuild the work
// somewhere that answers:
//
//	func boss(worker troupe.Ref[Job]) troupe.Behavior[Job] {
//		return troupe.Behavior[Job]{
//			Setup: func(c *troupe.Context[Job]) {
//				c.Watch(worker) // local or remote: the same call
//			},
//			Receive: func(c *troupe.Context[Job], j Job) {
//				worker.Tell(j)
//			},
//			Signal: func(c *troupe.Context[Job], s troupe.Signal) {
//				if t, ok := s.(troupe.Terminated); ok {
//					c.Log().Warn("worker gone", "reason", t.Reason)
//					local, err := troupe.Spawn(c, "worker", newWorker()) // here, as a child
//					if err != nil {
//						c.Fail(err)
//						return
//					}
//					worker = local
//				}
//			},
//		}
//	}
//
// with worker found by name on another node:
//
//	worker, err := troupe.FindActor[Job](ctx, n, "worker")
//
// [Terminated] comes once, after every message the worker sent that
// reached this node first. Its Reason is [ErrPeerLeft] when the worker's
// node closed, and wraps [ErrPeerUnreachable] when this node gave up
// waiting for it: a conclusion, not a fact, which is why the work is
// rebuilt rather than resumed (see "When a node stops answering" below).
//
// # Starting and stopping a node
//
//	n, err := troupe.Start(ctx, troupe.Config{
//		Name:   "billing",
//		Listen: []string{"tcp://127.0.0.1:7001", "unix:///run/billing.sock"},
//	})
//	if err != nil { ... }
//	defer n.Close()
//
// [Node.Close] ends everything at once — dials and handshakes are aborted,
// queued messages become dead letters, and only a goodbye is written — and
// waits for every goroutine the node started (a cluster member leaves
// first, for a few seconds at most). [Node.Shutdown] is the
// graceful path: it delivers what is queued, has the peers acknowledge it,
// says goodbye, and returns when done or when its context ends. Both are
// idempotent. Each call to [Start] mints a fresh random [NodeUID], so a
// node restarted at the same address is a different peer.
//
// # Actors
//
// An actor's protocol is the type of message it accepts; a protocol of
// several messages is an interface type. [Spawn] starts an actor with a
// [Behavior] and returns its [Ref]:
//
//	counter, err := troupe.Spawn(n, "counter", troupe.Behavior[Add]{
//		Receive: func(c *troupe.Context[Add], m Add) { total += m.N },
//	})
//	counter.Tell(Add{N: 2})
//
// Handlers of one actor never run concurrently, so its state needs no
// lock. [Ref.Tell] never blocks on the network: where there is no room it
// makes a dead letter; [Ref.Send] waits for room instead. [Ask] sends a request
// carrying a temporary reply ref and waits for the reply. [Context.Watch]
// asks for a [Terminated] signal when another actor — local or remote —
// stops; it is handled after every message from that actor that reached
// the watcher's node first, and nothing from it follows. Children spawned
// from a [Context] stop with their parent.
//
// A handler that panics, or reports an error with [Context.Fail], fails:
// by default its actor (never the node) stops with the failure as the
// reason. [Supervise] wraps a factory of behaviors in a [Strategy] —
// [ResumeOnFailure], [RestartOnFailure], [RestartWithBackoff], with
// [Strategy.WithLimit] — so that the actor resumes or restarts with fresh
// state instead; [PreRestart] and [PostStop] let a behavior clean up.
// [MessageAdapter] makes a ref of another message type that converts into
// the actor's protocol; it is addressable across the wire.
// [Context.StartTimer], [Context.StartTicker] and [Context.CancelTimer]
// give an actor keyed timers that end with it, and [Context.Context] a
// context.Context that is done when it stops.
//
// # Remote messaging
//
// Only message types that cross a link need a wire key, given once with
// [SetWireKey]. [Resolve] turns a ref string such as
// "troupe://127.0.0.1:7001/user/counter" into a ref, checking that the
// remote actor exists and accepts the type asked for. Two nodes keep one
// association (one connection) however they first met, and messages from
// one sender to one actor arrive in the order sent. The byte layout is in
// wire.md beside wire.go.
//
// # Discovery
//
// With [Config.RegistryAddrs] (or [Config.Discovery]) a node probes the
// registry addresses at start: it joins a registrar that answers, refuses an
// address held by anything else ([ErrRegistryOccupied]) or by a registrar
// whose shared secret differs ([ErrAuth]), and becomes the
// registrar when every address is free. Nodes and named actors register
// themselves; [FindActor], [FindActorPerRegistrar], [WaitForActor],
// [Node.QueryActor] and [Node.Registry] look them up by name. Nodes never quarantine a
// registrar: they register everything again when one comes back, and when
// the registry address is left empty, one of them binds it and becomes the
// registrar (failover). The cmd/troupe command runs a dedicated registrar
// and lists or queries one.
//
// A [ServiceKey] names a typed set of actors: [ServiceKey.Register] adds
// one of the node's actors, [ServiceKey.Find] lists the set, and
// [ServiceKey.Watch] follows it as it changes, pushed by the registry
// ([ServiceKey.Subscribe]
// sends each listing to an actor). A [Topic] carries
// messages to every subscriber on every node ([Topic.Subscribe],
// [Topic.Publish]), one copy per node on the wire, and [SpawnGroupRouter]
// spreads messages over a service key's set.
//
// # When a node stops answering
//
// Associations heartbeat every [Config.HeartbeatInterval]. A connection
// that breaks without a goodbye suspends the session ([PeerLinkLost]):
// the side that dialed dials again, and the same incarnation answering
// resumes it, every queued frame arriving once and in order
// ([PeerResumed]). A peer silent for [Config.UnreachableAfter], or whose
// address refuses the new connection or answers as another incarnation,
// is declared unreachable: watchers of its actors get
// [Terminated] with a reason wrapping [ErrPeerUnreachable], the peer is
// quarantined (sends become dead letters wrapping [ErrQuarantined], pending
// asks fail), and a [PeerUnreachable] event is published. Nothing
// reconnects to that incarnation until [Node.ClearQuarantine] is called
// (with [Reconnect] it associates again at once); a quarantine binds the incarnation,
// so a process restarted at the same address is a new peer, admitted.
// Remote refs are bound to the association session they came from.
// Registrars and cluster members are exempt from quarantine. A
// [FaultNet] runs nodes over a network that tests can partition, pause,
// reset, heal and kill.
//
// # Clusters
//
// [StartCluster] makes a node a member of a cluster: gossiped membership,
// a [PhiAccrual] detector per member, a deterministic leader, and a
// [DowningStrategy] ([KeepMajority], [StaticQuorum], [KeepOldest],
// [DownAll], [LeaseMajority] with a [Lease]) so that the surviving side of
// a split is a fact. The strategies follow Akka's Split Brain Resolver
// rule for rule, and members that are only indirectly connected (a
// partial or one-way partition) are downed first: [ResolveSplit] is the
// whole decision as a pure function. Without a strategy an unreachable
// member blocks the cluster, which is the safe default.
//
// # Work you can hand to somebody else
//
// [Produce] starts a [Producer] that hands jobs to the workers of a
// [ServiceKey], on any node, each job to one worker at a time as the
// workers have room; [Worker] starts one, whose actor gets each job as a
// [Delivery] and confirms it. The producer watches every worker: the jobs
// a worker held unconfirmed when it stopped, restarted or could no
// longer be reached go to the others at once, so each job is processed
// at least once and confirmed once. Send waits while the producer's
// window is full; with a journal ([WorkConfig].Journal) the unconfirmed
// jobs outlive the producer's process. See docs/work.md.
//
// # Events and dead letters
//
// Each node has an event stream; subscribe with [Subscribe] or
// [SubscribeChan], and publish a program's own with [Node.PublishEvent]. Every message that cannot be delivered
// becomes a [DeadLetter] event naming the target and the reason; a peer
// that sends bytes this node cannot accept has its connection closed and a
// [ProtocolError] event published, and nothing else is disturbed.
//
// # Seeing into a node
//
// [Node.Stats] is a snapshot of a node: its associations and how close
// each peer is to being declared unreachable, quarantines, actors and the
// deepest mailboxes, dead letters by reason, cluster members.
// [Node.DebugHandler] serves it as a live HTML page and as JSON,
// [Node.MetricsHandler] in the Prometheus text format, and
// [Node.FetchStats] fetches another node's over the protocol (troupe
// peers, actors and stats).
//
// # Errors
//
// Errors are values: compare with errors.Is against the exported sentinels
// ([ErrNodeClosed], [ErrNoSuchActor], [ErrWrongType], [ErrPeerLeft],
// [ErrSessionEnded], [ErrNoWireKey], [ErrMalformed], …) and use
// errors.As for [*PanicError] and [*AskError]; [IsFailure] tells an
// actor's failure (a panic, or [Context.Fail]) from any other stop.
//
// # Concurrency
//
// [Node], [Ref], [Subscription] and the package functions are safe for
// concurrent use. A [Context] belongs to its actor's goroutine and must be
// used only inside that actor's handlers. Event callbacks run on the
// goroutine that published the event and must not block.
package troupe
