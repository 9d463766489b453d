// Package jobbroker is the Go client of the jobbroker job broker: a producer API (Enqueue,
// EnqueueBatch, EnqueueAndWait), the unary worker calls (Lease, Heartbeat, Ack, Fail, Release),
// every operator call of the Admin service, and a Worker that runs handlers for jobs pushed
// over a Broker.Work stream, with heartbeats, retries, graceful shutdown, durable steps (see
// Step) and middleware (Worker.Use, Options.EnqueueMiddleware). One Options value configures
// the connection (addresses, TLS, token, deadline, keepalive pings) for the client and its
// workers.
//
// Every error that comes from the broker is a gRPC status error, so
//
//	if status.Code(err) == codes.InvalidArgument { ... }
//
// works, as do the helpers IsInvalidArgument, IsNotFound and friends.
package jobbroker

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "jobbroker.dev/client/go/jobbrokerv1"
)

// Version is this library's version; ClientName, sent with every call, carries it.
const Version = "0.1.0"

// ClientName is the "jobbroker-client" metadata of every call: Admin.ListWorkers shows it, so
// an operator can tell which library (and version) a worker runs.
const ClientName = "jobbroker-go/" + Version

// clientHeader is the metadata key the broker reads ClientName from.
const clientHeader = "jobbroker-client"

// DefaultAddress is used when Options names no address and $JOBBROKER_ADDRESS is unset.
const DefaultAddress = "127.0.0.1:7070"

// DefaultDeadline bounds a unary call whose context has no deadline (Options.DefaultDeadline).
const DefaultDeadline = 10 * time.Second

// DefaultKeepaliveTime is how long a connection may go without a frame from the broker before
// the client pings it (Options.KeepaliveTime).
const DefaultKeepaliveTime = 10 * time.Second

// DefaultKeepaliveTimeout is how long a ping waits for its answer before the connection is given
// up (Options.KeepaliveTimeout).
const DefaultKeepaliveTimeout = 5 * time.Second

// Options configure a Client, and through it every Worker made with it: one set of connection
// settings for producers, operators and workers. The zero value is a plaintext client of
// $JOBBROKER_ADDRESS (else DefaultAddress) with the token of $JOBBROKER_TOKEN, if set.
type Options struct {
	// The broker, "host:port" (a comma-separated list is taken as Addresses). Empty and no
	// Addresses: $JOBBROKER_ADDRESS (the same form), else DefaultAddress.
	Address string
	// Several brokers (a cluster's nodes), tried in order: the client connects to the first
	// that answers and, when that one becomes unreachable, tries them again from the first.
	// Any node serves every call (a node forwards to the partition's leader). With Address,
	// Address comes first. In a cluster these are only where the client first asks for the
	// cluster's layout: calls then go to the leader of their partition (see Client).
	Addresses []string

	// TLS turns TLS on, trusting the system's roots unless CAFile or CAPEM is set. Setting any
	// of CAFile, CAPEM, CertFile or CertPEM turns it on too.
	TLS bool
	// The CA certificates (PEM) that the broker's certificate must chain to, as a file or as
	// bytes; they replace the system's roots.
	CAFile string
	CAPEM  []byte
	// A client certificate and its key (PEM) for mutual TLS (the broker's --tls-client-ca), as
	// files or as bytes.
	CertFile, KeyFile string
	CertPEM, KeyPEM   []byte
	// The name the broker's certificate must carry; default the host of the address.
	ServerName string

	// Bearer token sent as "authorization: Bearer <token>" with every call (docs/security.md).
	// Empty: $JOBBROKER_TOKEN, if set. Send it over TLS only: on a plaintext connection anyone
	// on the path can read it.
	Token string

	// Bounds each unary call whose context has no deadline, retries included (a context's own
	// deadline always wins: that is the per-call override). 0 means DefaultDeadline (10 s); a
	// negative value means no bound. Streams (Work, WatchJob) are never bounded.
	DefaultDeadline time.Duration

	// Producer middleware: wraps every Enqueue, EnqueueBatch and EnqueueAndWait, the first one
	// the outermost (see EnqueueMiddleware).
	EnqueueMiddleware []EnqueueMiddleware

	// Enqueue coalescing (docs/worker-contract.md §10): concurrent Enqueue calls (and
	// EnqueueJSON, EnqueueAndWait) are merged into EnqueueBatch calls, one per partition, and
	// each caller still gets its own answer. A lone call is sent at once, as a unary Enqueue.
	// DisableBatching sends every Enqueue as one unary call, as before; WithoutBatching does so
	// for one call. EnqueueBatch is always sent as it is.
	DisableBatching bool
	// A batch is sent once it holds this many jobs: 1 to 1000; 0 means 100.
	BatchMaxJobs int
	// ... or once its jobs' payload and header (name and value) bytes reach this; 0 means 1 MiB.
	BatchMaxBytes int
	// How long a batch that could be sent waits for more jobs. 0 (the default): none; the
	// caller sends it at once, and jobs gather only while BatchMaxInFlight batches are out.
	BatchLinger time.Duration
	// Batches of one partition in flight at once; later jobs wait in the open batch, which is
	// sent when one of them ends. 0 means 4.
	BatchMaxInFlight int

	// Keepalive pings (HTTP/2 PING) on every connection the client dials, its workers' Work
	// streams included: a broker that froze, lost power or sits behind a firewall that drops
	// packets is noticed (TCP alone does not notice it), the connection is closed, its calls and
	// streams end Unavailable, and a Worker reconnects with its backoff (in a cluster, to another
	// node). A ping goes out after KeepaliveTime without a frame from the broker, also while no
	// call is open, and the connection is given up when its answer has not come KeepaliveTimeout
	// later. The broker accepts pings as often as once a second. DisableKeepalive sends none
	// (gRPC's default); a grpc.WithKeepaliveParams in DialOptions replaces these settings.
	DisableKeepalive bool
	// 0 means DefaultKeepaliveTime (10 s); gRPC raises a value below 10 s to 10 s.
	KeepaliveTime time.Duration
	// 0 means DefaultKeepaliveTimeout (5 s).
	KeepaliveTimeout time.Duration

	// Extra gRPC dial options, applied after the client's own, so they win over them (an
	// interceptor, a custom dialer, grpc.WithKeepaliveParams).
	DialOptions []grpc.DialOption
}

// Client talks to one broker (or one cluster). It is safe for concurrent use; make one and
// share it.
//
// Every call carries the "jobbroker-client" name and the bearer token. A unary call whose
// context has no deadline gets Options.DefaultDeadline. A unary call the broker answers
// Unavailable (down, restarting, draining) is tried up to 3 times in all, 100 ms then 200 ms
// apart (jittered), only when a repeat cannot do its work twice: reads, Heartbeat, Ack, Fail,
// Release, the calls that set a state, and an Enqueue or EnqueueBatch whose every job has a
// dedup key. An Enqueue without one is tried once and the error is the caller's to handle.
//
// In a cluster a client made by New sends each call straight to the leader of its partition,
// found from the queue's name or the job id with the layout Admin.GetCluster gives; calls for
// no partition (ListQueues, GetCluster, ListWorkers, schedules by id) go to a live node. It
// asks for the layout before its first call and again after a call failed Unavailable or
// DeadlineExceeded (a leader moved or died), so a retry goes to the new leader. A broker
// outside a cluster, or one that refuses GetCluster (older than cluster mode, a token without
// the admin role), is reached at the given addresses as described in Options.Addresses.
type Client struct {
	// Sends each call to the node that serves it; nil when made by NewClientFromConn, whose
	// connection is used as it is.
	router *router
	// The connection every call goes through (it adds the metadata).
	calls  *callConn
	broker pb.BrokerClient
	admin  pb.AdminClient
	// Constant after construction.
	enqueueMiddleware []EnqueueMiddleware
	defaultDeadline   time.Duration // < 0: none
	batcher           *coalescer    // nil: Options.DisableBatching
}

// New makes a client with opts. Like grpc.NewClient it does not connect yet: the first call
// does, so a broker that is down shows up as an Unavailable error of that call (retried when
// that is safe, see Client). It fails only on bad options (an unreadable CA or key file, a
// batching or keepalive option out of range).
func New(opts Options) (*Client, error) {
	batching, err := batchConfigOf(opts)
	if err != nil {
		return nil, err
	}
	keepalives, err := keepaliveOf(opts)
	if err != nil {
		return nil, err
	}
	addresses := resolveAddresses(opts)
	if opts.Token == "" {
		opts.Token = os.Getenv("JOBBROKER_TOKEN")
	}
	creds, err := transportCredentials(opts)
	if err != nil {
		return nil, err
	}
	dial := []grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		// Reconnect to a restarted broker within seconds, not gRPC's default of up to 2 min.
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 2, Jitter: 0.2, MaxDelay: 5 * time.Second},
			MinConnectTimeout: 5 * time.Second,
		}),
	}
	if keepalives != nil {
		dial = append(dial, grpc.WithKeepaliveParams(*keepalives))
	}
	// Each cluster node's own connection (router.go) has one address: no resolver of ours.
	nodeDial := append(slices.Clip(dial), opts.DialOptions...)
	target := addresses[0]
	if len(addresses) > 1 {
		// A resolver of our own hands gRPC the whole list; its default policy, pick_first,
		// connects to the first address that answers, in the order given.
		r := manual.NewBuilderWithScheme("jobbroker")
		state := resolver.State{}
		for _, a := range addresses {
			state.Addresses = append(state.Addresses, resolver.Address{Addr: a, ServerName: serverName(opts, a)})
		}
		r.InitialState(state)
		dial = append(dial, grpc.WithResolvers(r))
		target = r.Scheme() + ":///brokers"
	}
	conn, err := grpc.NewClient(target, append(dial, opts.DialOptions...)...)
	if err != nil {
		return nil, err
	}
	routing := newRouter(addresses, conn, nodeDial)
	c := newClientOnConn(routing, opts, batching, routing.partitionCount)
	c.router = routing
	return c, nil
}

// NewClient makes a client of the broker at address ("host:port"; "" as in Options.Address)
// with the default Options and extra dial options; New takes every option.
func NewClient(address string, dialOptions ...grpc.DialOption) (*Client, error) {
	return New(Options{Address: address, DialOptions: dialOptions})
}

// NewClientFromConn makes a client that uses an existing connection (whose dial options say
// how it connects); Close does not close it, but waits for the batches of Enqueue calls. Of
// opts, only Token ($JOBBROKER_TOKEN is not read), DefaultDeadline, EnqueueMiddleware and the
// batching options apply (keepalive pings are the connection's: grpc.WithKeepaliveParams
// when dialling it); batches are made per queue, as the cluster's layout is not asked for. It
// panics on a batching option out of range, which New returns as an error.
func NewClientFromConn(conn grpc.ClientConnInterface, opts ...Options) *Client {
	var o Options
	if len(opts) > 0 {
		o = opts[0]
	}
	batching, err := batchConfigOf(o)
	if err != nil {
		panic(err)
	}
	return newClientOnConn(conn, o, batching, func() uint32 { return 0 })
}

// newClientOnConn makes a client of conn; batching nil: off. partitions is the partition count
// batches are keyed by, 0 while unknown.
func newClientOnConn(conn grpc.ClientConnInterface, opts Options, batching *batchConfig, partitions func() uint32) *Client {
	deadline := opts.DefaultDeadline
	if deadline == 0 {
		deadline = DefaultDeadline
	}
	cc := &callConn{ClientConnInterface: conn, token: opts.Token, deadline: deadline}
	c := &Client{
		calls:             cc,
		broker:            pb.NewBrokerClient(cc),
		admin:             pb.NewAdminClient(cc),
		enqueueMiddleware: slices.Clone(opts.EnqueueMiddleware),
		defaultDeadline:   deadline,
	}
	if batching != nil {
		c.batcher = newCoalescer(*batching, deadline, c.sendJobs, partitions)
	}
	return c
}

// keepaliveOf checks the keepalive options and returns the client's parameters; nil: no pings.
func keepaliveOf(opts Options) (*keepalive.ClientParameters, error) {
	switch {
	case opts.KeepaliveTime < 0:
		return nil, fmt.Errorf("jobbroker: Options.KeepaliveTime is %v; it must not be negative (0: the default, %v; DisableKeepalive: no pings)",
			opts.KeepaliveTime, DefaultKeepaliveTime)
	case opts.KeepaliveTimeout < 0:
		return nil, fmt.Errorf("jobbroker: Options.KeepaliveTimeout is %v; it must not be negative (0: the default, %v)",
			opts.KeepaliveTimeout, DefaultKeepaliveTimeout)
	}
	if opts.DisableKeepalive {
		return nil, nil
	}
	kp := &keepalive.ClientParameters{
		Time:                opts.KeepaliveTime,
		Timeout:             opts.KeepaliveTimeout,
		PermitWithoutStream: true, // a producer's idle connection, a worker between streams
	}
	if kp.Time == 0 {
		kp.Time = DefaultKeepaliveTime
	}
	if kp.Timeout == 0 {
		kp.Timeout = DefaultKeepaliveTimeout
	}
	return kp, nil
}

func resolveAddresses(opts Options) []string {
	out := splitAddresses(opts.Address)
	for _, a := range opts.Addresses {
		out = append(out, splitAddresses(a)...)
	}
	if len(out) == 0 {
		out = splitAddresses(os.Getenv("JOBBROKER_ADDRESS"))
	}
	if len(out) == 0 {
		out = append(out, DefaultAddress)
	}
	return out
}

// splitAddresses reads "host:port[,host:port...]", the form of $JOBBROKER_ADDRESS and of the
// command-line flags that name a cluster.
func splitAddresses(list string) []string {
	var out []string
	for _, a := range strings.Split(list, ",") {
		if a = strings.TrimSpace(a); a != "" {
			out = append(out, a)
		}
	}
	return out
}

func serverName(opts Options, address string) string {
	if opts.ServerName != "" {
		return opts.ServerName
	}
	if host, _, err := net.SplitHostPort(address); err == nil {
		return host
	}
	return address
}

// transportCredentials builds TLS from the options, or plaintext when none asks for it.
func transportCredentials(opts Options) (credentials.TransportCredentials, error) {
	useTLS := opts.TLS || opts.CAFile != "" || len(opts.CAPEM) > 0 || opts.CertFile != "" || len(opts.CertPEM) > 0
	if !useTLS {
		return insecure.NewCredentials(), nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: opts.ServerName}
	ca := opts.CAPEM
	if opts.CAFile != "" {
		b, err := os.ReadFile(opts.CAFile)
		if err != nil {
			return nil, fmt.Errorf("jobbroker: reading the CA file: %w", err)
		}
		ca = append(slices.Clone(ca), b...)
	}
	if len(ca) > 0 {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(ca) {
			return nil, errors.New("jobbroker: no PEM certificate in the CA")
		}
		cfg.RootCAs = pool
	}
	certPEM, keyPEM := opts.CertPEM, opts.KeyPEM
	if opts.CertFile != "" || opts.KeyFile != "" {
		var err error
		if certPEM, err = os.ReadFile(opts.CertFile); err != nil {
			return nil, fmt.Errorf("jobbroker: reading the client certificate: %w", err)
		}
		if keyPEM, err = os.ReadFile(opts.KeyFile); err != nil {
			return nil, fmt.Errorf("jobbroker: reading the client key: %w", err)
		}
	}
	if len(certPEM) > 0 || len(keyPEM) > 0 {
		pair, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			return nil, fmt.Errorf("jobbroker: the client certificate and key: %w", err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return credentials.NewTLS(cfg), nil
}

// callConn adds what every call carries (the "jobbroker-client" name, the bearer token), and
// to unary calls the default deadline and the safe retries. Wrapping the connection rather
// than installing interceptors covers NewClientFromConn's connections too, whose dial options
// are not ours.
type callConn struct {
	grpc.ClientConnInterface
	token    string
	deadline time.Duration // < 0: none
}

// Unary calls are tried this many times in all when the broker answers Unavailable and a
// repeat cannot do the work twice (retrySafe).
const unaryAttempts = 3

// The wait before the second attempt; it doubles for the third.
const firstRetryDelay = 100 * time.Millisecond

func (c *callConn) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	ctx = c.withMetadata(ctx)
	if _, ok := ctx.Deadline(); !ok && c.deadline > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.deadline)
		defer cancel()
	}
	attempts := 1
	if retrySafe(method, args) {
		attempts = unaryAttempts
	}
	delay := firstRetryDelay
	for attempt := 1; ; attempt++ {
		err := c.ClientConnInterface.Invoke(ctx, method, args, reply, opts...)
		if err == nil || attempt == attempts || status.Code(err) != codes.Unavailable {
			return err
		}
		// Jitter keeps many clients that lost the same broker from retrying in step.
		wait := delay/2 + rand.N(delay/2+1)
		select {
		case <-ctx.Done():
			return err
		case <-time.After(wait):
		}
		delay *= 2
	}
}

func (c *callConn) NewStream(ctx context.Context, desc *grpc.StreamDesc, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	return c.ClientConnInterface.NewStream(c.withMetadata(ctx), desc, method, opts...)
}

func (c *callConn) withMetadata(ctx context.Context) context.Context {
	md, _ := metadata.FromOutgoingContext(ctx)
	if len(md.Get(clientHeader)) == 0 { // else the caller named itself (a wrapper library, say)
		ctx = metadata.AppendToOutgoingContext(ctx, clientHeader, ClientName)
	}
	if c.token != "" && len(md.Get("authorization")) == 0 {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+c.token)
	}
	return ctx
}

// retrySafe reports whether a unary call may be sent again after Unavailable without the risk
// of doing its work twice: the first attempt may have been applied and only its answer lost.
// Reads repeat harmlessly; a repeated Heartbeat, Ack, Fail or Release of the same lease is
// answered like the first; setting a policy, a pause or a schedule twice sets it once. An
// Enqueue repeats harmlessly only when its dedup key makes the broker answer the repeat with
// the first job; without one it would enqueue a second job, so it is tried once and the caller
// decides. Not retried: Lease (a lost answer would hide its jobs until their leases ran out),
// and CancelJob, RetryJob, DeleteJob, PurgeQueue, DeleteSchedule, TriggerSchedule, whose
// repeat either acts again or turns a success into an error.
func retrySafe(method string, args any) bool {
	switch method {
	case pb.Broker_Enqueue_FullMethodName:
		r, ok := args.(*pb.EnqueueRequest)
		return ok && r.GetDedupKey() != ""
	case pb.Broker_EnqueueBatch_FullMethodName:
		r, ok := args.(*pb.EnqueueBatchRequest)
		if !ok || len(r.GetJobs()) == 0 {
			return false
		}
		for _, j := range r.GetJobs() {
			if j.GetDedupKey() == "" {
				return false
			}
		}
		return true
	case pb.Broker_Heartbeat_FullMethodName, pb.Broker_Ack_FullMethodName,
		pb.Broker_Fail_FullMethodName, pb.Broker_Release_FullMethodName,
		pb.Admin_GetJob_FullMethodName, pb.Admin_ListJobs_FullMethodName,
		pb.Admin_ListQueues_FullMethodName, pb.Admin_GetQueue_FullMethodName,
		pb.Admin_GetCluster_FullMethodName, pb.Admin_ListWorkers_FullMethodName,
		pb.Admin_GetSchedule_FullMethodName, pb.Admin_ListSchedules_FullMethodName,
		pb.Admin_UpdateQueuePolicy_FullMethodName, pb.Admin_PauseQueue_FullMethodName,
		pb.Admin_ResumeQueue_FullMethodName, pb.Admin_PutSchedule_FullMethodName:
		return true
	}
	return false
}

// markRoutingStale makes the next call ask for the cluster's layout first: a stream ended in a
// way that may mean its node no longer leads.
func (c *Client) markRoutingStale() {
	if c.router != nil {
		c.router.markStale()
	}
}

// workGroups groups a worker's queues by the cluster's layout as it is now (routing_table.go's
// groupQueues): one group for every queue without a router (NewClientFromConn) or a table.
// recheck: the layout is to be fetched again after each backoff delay while these groups run,
// because one of them is for any node (recheckTableFor).
func (c *Client) workGroups(ctx context.Context, queues []string, maxInFlight int) (groups []streamGroup, recheck bool) {
	if c.router == nil {
		return groupQueues(nil, queues, maxInFlight), false
	}
	return c.router.workGroups(c.calls.withMetadata(ctx), queues, maxInFlight)
}

// Close sends the open batches of Enqueue calls, waits until the batches in flight are
// answered, and closes the connections New opened.
func (c *Client) Close() error {
	if c.batcher != nil {
		c.batcher.close()
	}
	if c.router == nil {
		return nil
	}
	return c.router.Close()
}

// Broker is the generated stub of the Broker service, for what this package does not wrap.
func (c *Client) Broker() pb.BrokerClient { return c.broker }

// Admin is the generated stub of the Admin service (ListJobs, GetQueue, UpdateQueuePolicy,
// PauseQueue, PurgeQueue, ...).
func (c *Client) Admin() pb.AdminClient { return c.admin }

// EnqueueOption sets an optional field of a job being enqueued.
type EnqueueOption func(*pb.EnqueueRequest)

// WithHeaders adds metadata handed to the worker (trace ids, content types).
func WithHeaders(headers map[string]string) EnqueueOption {
	return func(r *pb.EnqueueRequest) {
		if r.Headers == nil {
			r.Headers = make(map[string]string, len(headers))
		}
		for k, v := range headers {
			r.Headers[k] = v
		}
	}
}

// WithHeader adds one header.
func WithHeader(key, value string) EnqueueOption {
	return WithHeaders(map[string]string{key: value})
}

// WithPriority: higher runs first; FIFO within one priority. Default 0.
func WithPriority(priority int32) EnqueueOption {
	return func(r *pb.EnqueueRequest) { r.Priority = priority }
}

// WithDelay runs the job no earlier than d from now. Not together with WithRunAt.
func WithDelay(d time.Duration) EnqueueOption {
	return func(r *pb.EnqueueRequest) { r.Delay = durationpb.New(d) }
}

// WithRunAt runs the job no earlier than t. Not together with WithDelay.
func WithRunAt(t time.Time) EnqueueOption {
	return func(r *pb.EnqueueRequest) { r.RunAt = timestamppb.New(t) }
}

// WithDedupKey: while a job of the queue holds key, another Enqueue with it returns that job's
// id with Deduplicated set (ALREADY_EXISTS if the payload differs). The key is also the jobs'
// idempotency key.
func WithDedupKey(key string) EnqueueOption {
	return func(r *pb.EnqueueRequest) { r.DedupKey = key }
}

// WithDedupTTL: how long the dedup key blocks duplicates; default the queue's dedup_ttl.
func WithDedupTTL(d time.Duration) EnqueueOption {
	return func(r *pb.EnqueueRequest) { r.DedupTtl = durationpb.New(d) }
}

// WithMaxAttempts: attempts in total, the first included; default the queue's.
func WithMaxAttempts(n int32) EnqueueOption {
	return func(r *pb.EnqueueRequest) { r.MaxAttempts = n }
}

// WithLeaseDuration: lease length when the worker names none; default the queue's.
func WithLeaseDuration(d time.Duration) EnqueueOption {
	return func(r *pb.EnqueueRequest) { r.LeaseDuration = durationpb.New(d) }
}

// WithConcurrencyKey groups jobs for the queue's max_concurrency_per_key (e.g. a tenant id).
func WithConcurrencyKey(key string) EnqueueOption {
	return func(r *pb.EnqueueRequest) { r.ConcurrencyKey = key }
}

// WithTimeout limits each attempt's run time to d (100 ms to 720 h): an attempt still running
// then ends TIMED_OUT even while it heartbeats (the Worker cancels its handler's ctx with
// ErrTimedOut) and counts as a failed attempt. Default the queue's timeout (none).
func WithTimeout(d time.Duration) EnqueueOption {
	return func(r *pb.EnqueueRequest) { r.Timeout = durationpb.New(d) }
}

// WithExpireAt: no attempt starts at or after t; a job still waiting then (READY or SCHEDULED)
// ends FAILED with FAIL_REASON_EXPIRED. t must be after the job could first run.
func WithExpireAt(t time.Time) EnqueueOption {
	return func(r *pb.EnqueueRequest) { r.ExpireAt = timestamppb.New(t) }
}

// WithDependsOn makes the job wait (JOB_STATE_WAITING) until the jobs with these ids have
// completed; their results come with it (Job.DependencyResults). When one of them fails, is
// cancelled or deleted, the job ends FAILED with FAIL_REASON_DEPENDENCY_FAILED. The ids are
// those Enqueue returned, of queues in the same partition (any queue on a single node).
func WithDependsOn(jobIDs ...string) EnqueueOption {
	return func(r *pb.EnqueueRequest) { r.DependsOn = append(r.DependsOn, jobIDs...) }
}

// WithDependsOnIndex, in an EnqueueBatch only, makes the job wait for earlier jobs of the same
// batch, by their position in it (from 0): a whole graph in one call.
func WithDependsOnIndex(indexes ...int32) EnqueueOption {
	return func(r *pb.EnqueueRequest) { r.DependsOnIndex = append(r.DependsOnIndex, indexes...) }
}

// WithoutBatching sends this one job at once as a unary Enqueue, outside the coalescing of
// concurrent calls (Options.DisableBatching does so for every call). It means nothing to
// NewEnqueueRequest: EnqueueBatch is always sent as it is.
func WithoutBatching() EnqueueOption {
	return func(r *pb.EnqueueRequest) { unbatched.Store(r, struct{}{}) }
}

// unbatched holds the requests that WithoutBatching was applied to, until the Enqueue (or
// NewEnqueueRequest) building them takes the mark. A mark outside the request itself, because
// EnqueueOption is a function of the wire request, which has no field for it; the option
// keeps that type so that options written by users go on working.
var unbatched sync.Map

// NewEnqueueRequest builds the request Enqueue sends; EnqueueBatch takes a slice of them.
func NewEnqueueRequest(queue string, payload []byte, opts ...EnqueueOption) *pb.EnqueueRequest {
	r, _ := newEnqueueRequest(queue, payload, opts)
	return r
}

// newEnqueueRequest builds a request and says whether WithoutBatching was among opts.
func newEnqueueRequest(queue string, payload []byte, opts []EnqueueOption) (r *pb.EnqueueRequest, withoutBatching bool) {
	r = &pb.EnqueueRequest{Queue: queue, Payload: payload}
	for _, o := range opts {
		o(r)
	}
	_, withoutBatching = unbatched.LoadAndDelete(r)
	return r, withoutBatching
}

// Enqueued is what Enqueue returns.
type Enqueued struct {
	// The job's id (a ULID).
	JobID string
	// True when the dedup key matched an existing job: JobID is that job; nothing was created.
	Deduplicated bool
}

// Enqueue adds one job to queue. It returns once the job is durably stored.
// InvalidArgument names a malformed field; AlreadyExists means the dedup key is held by a job
// with another payload; ResourceExhausted means the queue is full or the payload too large.
// Unavailable (the broker is down) is retried only when the job has a dedup key: without one,
// a repeat could enqueue the job twice, so the caller sees the error and decides.
//
// Unless batching is off (Options.DisableBatching, WithoutBatching), the job goes in a batch
// with the jobs of concurrent calls for the same partition (see Options.BatchMaxJobs), after
// the producer middleware has run for this call; the answer is still this job's own. A batch
// the broker refuses whole (one bad job) is sent again one job per call, so an error names this
// job's own fault. A caller that gives up (ctx ends) does not take its job out of the batch:
// it may be created, as with a unary call cancelled in flight.
func (c *Client) Enqueue(ctx context.Context, queue string, payload []byte, opts ...EnqueueOption) (Enqueued, error) {
	req, withoutBatching := newEnqueueRequest(queue, payload, opts)
	send := func(ctx context.Context, jobs []*pb.EnqueueRequest) ([]Enqueued, error) {
		// depends_on_index names jobs of the same EnqueueBatch: in a merged batch it would name
		// other callers' jobs, so such a job goes alone and is refused as before.
		if c.batcher == nil || withoutBatching || len(jobs) != 1 || len(jobs[0].GetDependsOnIndex()) > 0 {
			return c.sendJobs(ctx, jobs[:1])
		}
		result, err := c.batcher.enqueue(ctx, jobs[0])
		if err != nil {
			return nil, err
		}
		return []Enqueued{result}, nil
	}
	out, err := c.throughMiddleware(send)(ctx, []*pb.EnqueueRequest{req})
	if err != nil {
		return Enqueued{}, err
	}
	if len(out) != 1 {
		return Enqueued{}, fmt.Errorf("jobbroker: enqueue middleware returned %d results for one job", len(out))
	}
	return out[0], nil
}

// EnqueueJSON enqueues the JSON encoding of v.
func (c *Client) EnqueueJSON(ctx context.Context, queue string, v any, opts ...EnqueueOption) (Enqueued, error) {
	payload, err := json.Marshal(v)
	if err != nil {
		return Enqueued{}, err
	}
	return c.Enqueue(ctx, queue, payload, opts...)
}

// EnqueueBatch adds several jobs (1 to 1000, see NewEnqueueRequest), all or nothing: any
// invalid job refuses the whole batch. The results are in the order of jobs. Unavailable is
// retried only when every job has a dedup key (see Enqueue). The batch is sent as it is, never
// merged with other calls' jobs nor split.
func (c *Client) EnqueueBatch(ctx context.Context, jobs []*pb.EnqueueRequest) ([]Enqueued, error) {
	return c.throughMiddleware(c.sendBatch)(ctx, jobs)
}

func (c *Client) sendBatch(ctx context.Context, jobs []*pb.EnqueueRequest) ([]Enqueued, error) {
	resp, err := c.broker.EnqueueBatch(ctx, &pb.EnqueueBatchRequest{Jobs: jobs})
	if err != nil {
		return nil, err
	}
	out := make([]Enqueued, len(resp.GetResults()))
	for i, r := range resp.GetResults() {
		out[i] = Enqueued{JobID: r.GetJobId(), Deduplicated: r.GetDeduplicated()}
	}
	return out, nil
}

// sendJobs sends jobs as one call, the coalescer's batches included (rule 5 of §10): one job as
// unary Enqueue, more as EnqueueBatch.
func (c *Client) sendJobs(ctx context.Context, jobs []*pb.EnqueueRequest) ([]Enqueued, error) {
	if len(jobs) != 1 {
		return c.sendBatch(ctx, jobs)
	}
	resp, err := c.broker.Enqueue(ctx, jobs[0])
	if err != nil {
		return nil, err
	}
	return []Enqueued{{JobID: resp.GetJobId(), Deduplicated: resp.GetDeduplicated()}}, nil
}

// LeaseOptions are the optional fields of Lease. The zero value is fine.
type LeaseOptions struct {
	// Names the worker in the job's attempt history; default "<hostname>-<pid>".
	WorkerID string
	// At most this many jobs; 0 means 1.
	MaxJobs int32
	// Lease length; 0 = the job's, else the queue's (100 ms to 12 h).
	LeaseDuration time.Duration
	// Long poll: when no job is ready, wait up to this long (at most 60 s) for one.
	Wait time.Duration
}

// Lease leases up to opts.MaxJobs ready jobs of queue, waiting up to opts.Wait for one (the
// default deadline counts from the end of that wait). An empty result means none was ready in
// time. Answer each job with Ack, Fail or Release, and
// Heartbeat it while it runs longer than its lease.
func (c *Client) Lease(ctx context.Context, queue string, opts LeaseOptions) ([]*pb.LeasedJob, error) {
	req := &pb.LeaseRequest{Queue: queue, WorkerId: opts.WorkerID, MaxJobs: opts.MaxJobs}
	if req.WorkerId == "" {
		req.WorkerId = defaultWorkerID()
	}
	if opts.LeaseDuration > 0 {
		req.LeaseDuration = durationpb.New(opts.LeaseDuration)
	}
	if opts.Wait > 0 {
		req.Wait = durationpb.New(opts.Wait)
		// The long poll is not the broker being slow: the default deadline bounds the call
		// beyond it.
		if _, ok := ctx.Deadline(); !ok && c.defaultDeadline > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, opts.Wait+c.defaultDeadline)
			defer cancel()
		}
	}
	resp, err := c.broker.Lease(ctx, req)
	if err != nil {
		return nil, err
	}
	return resp.GetJobs(), nil
}

// HeartbeatOptions are the optional fields of Heartbeat.
type HeartbeatOptions struct {
	// New deadline = now + ExtendBy; 0 = now + the lease's own duration.
	ExtendBy time.Duration
	// When non-nil, saved durably with the job and handed to every later attempt.
	Checkpoint []byte
}

// Heartbeat extends the lease of a job and optionally saves a checkpoint. FailedPrecondition
// means the lease is no longer held: stop working on the job. The response says whether an
// operator cancelled the job.
func (c *Client) Heartbeat(ctx context.Context, jobID, leaseID string, opts HeartbeatOptions) (*pb.HeartbeatResponse, error) {
	req := &pb.HeartbeatRequest{JobId: jobID, LeaseId: leaseID, Checkpoint: opts.Checkpoint}
	if opts.ExtendBy > 0 {
		req.ExtendBy = durationpb.New(opts.ExtendBy)
	}
	return c.broker.Heartbeat(ctx, req)
}

// Ack completes a job; result (may be nil) is kept with it. Idempotent per lease.
// FailedPrecondition for a stale lease.
func (c *Client) Ack(ctx context.Context, jobID, leaseID string, result []byte) error {
	_, err := c.broker.Ack(ctx, &pb.AckRequest{JobId: jobID, LeaseId: leaseID, Result: result})
	return err
}

// FailOptions are the optional fields of Fail.
type FailOptions struct {
	// No retry: the job dies (FAILED) with FAIL_REASON_PERMANENT.
	Permanent bool
	// Wait this long before the next attempt instead of the queue's backoff; 0 = the backoff.
	RetryAfter time.Duration
}

// Fail fails the attempt with the error text errText: the job is retried after a backoff
// (state JOB_STATE_SCHEDULED) or dies (JOB_STATE_FAILED). FailedPrecondition for a stale lease.
func (c *Client) Fail(ctx context.Context, jobID, leaseID, errText string, opts FailOptions) (*pb.FailResponse, error) {
	req := &pb.FailRequest{JobId: jobID, LeaseId: leaseID, Error: errText, Permanent: opts.Permanent}
	if opts.RetryAfter > 0 {
		req.RetryAfter = durationpb.New(opts.RetryAfter)
	}
	return c.broker.Fail(ctx, req)
}

// Release gives a job back unstarted: it is READY again and no attempt is counted.
func (c *Client) Release(ctx context.Context, jobID, leaseID string) error {
	_, err := c.broker.Release(ctx, &pb.ReleaseRequest{JobId: jobID, LeaseId: leaseID})
	return err
}

func defaultWorkerID() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "worker"
	}
	return host + "-" + itoa(os.Getpid())
}
