// Package jobbroker is the Go client of the jobbroker job broker: a producer API (Enqueue,
// EnqueueBatch), the unary worker calls (Lease, Heartbeat, Ack, Fail, Release), a few admin
// calls, and a Worker that runs handlers for jobs pushed over a Broker.Work stream, with
// heartbeats, retries, graceful shutdown and durable steps (see Step).
//
// Every error that comes from the broker is a gRPC status error, so
//
//	if status.Code(err) == codes.InvalidArgument { ... }
//
// works, as do the helpers IsInvalidArgument, IsNotFound and friends.
package jobbroker

import (
	"context"
	"encoding/json"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
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

// DefaultAddress is used when NewClient gets an empty address and $JOBBROKER_ADDRESS is unset.
const DefaultAddress = "127.0.0.1:7070"

// Client talks to one broker. It is safe for concurrent use; make one and share it.
type Client struct {
	conn   *grpc.ClientConn // nil when made by NewClientFromConn
	broker pb.BrokerClient
	admin  pb.AdminClient
}

// NewClient makes a client of the broker at address ("host:port"). An empty address means
// $JOBBROKER_ADDRESS, else DefaultAddress. The connection is plaintext unless opts carry
// transport credentials (grpc.WithTransportCredentials); reconnects back off from 100 ms to 5 s
// unless opts carry grpc.WithConnectParams. Like grpc.NewClient it does not
// connect yet: the first call does, so a broker that is down shows up as an Unavailable error
// of that call.
func NewClient(address string, opts ...grpc.DialOption) (*Client, error) {
	if address == "" {
		address = os.Getenv("JOBBROKER_ADDRESS")
	}
	if address == "" {
		address = DefaultAddress
	}
	defaults := []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		// Reconnect to a restarted broker within seconds, not gRPC's default of up to 2 min.
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 2, Jitter: 0.2, MaxDelay: 5 * time.Second},
			MinConnectTimeout: 5 * time.Second,
		}),
	}
	all := append(defaults, opts...)
	conn, err := grpc.NewClient(address, all...)
	if err != nil {
		return nil, err
	}
	c := NewClientFromConn(conn)
	c.conn = conn
	return c, nil
}

// NewClientFromConn makes a client that uses an existing connection; Close does not close it.
func NewClientFromConn(conn grpc.ClientConnInterface) *Client {
	named := namedConn{conn}
	return &Client{broker: pb.NewBrokerClient(named), admin: pb.NewAdminClient(named)}
}

// namedConn adds the "jobbroker-client" metadata to every call, unary and streaming. Wrapping
// the connection rather than installing interceptors covers NewClientFromConn's connections
// too, whose dial options are not ours.
type namedConn struct{ grpc.ClientConnInterface }

func (c namedConn) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	return c.ClientConnInterface.Invoke(withClientName(ctx), method, args, reply, opts...)
}

func (c namedConn) NewStream(ctx context.Context, desc *grpc.StreamDesc, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	return c.ClientConnInterface.NewStream(withClientName(ctx), desc, method, opts...)
}

func withClientName(ctx context.Context) context.Context {
	if md, ok := metadata.FromOutgoingContext(ctx); ok && len(md.Get(clientHeader)) > 0 {
		return ctx // the caller named itself (a wrapper library, say)
	}
	return metadata.AppendToOutgoingContext(ctx, clientHeader, ClientName)
}

// Close closes the connection NewClient opened.
func (c *Client) Close() error {
	if c.conn == nil {
		return nil
	}
	return c.conn.Close()
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

// NewEnqueueRequest builds the request Enqueue sends; EnqueueBatch takes a slice of them.
func NewEnqueueRequest(queue string, payload []byte, opts ...EnqueueOption) *pb.EnqueueRequest {
	r := &pb.EnqueueRequest{Queue: queue, Payload: payload}
	for _, o := range opts {
		o(r)
	}
	return r
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
func (c *Client) Enqueue(ctx context.Context, queue string, payload []byte, opts ...EnqueueOption) (Enqueued, error) {
	resp, err := c.broker.Enqueue(ctx, NewEnqueueRequest(queue, payload, opts...))
	if err != nil {
		return Enqueued{}, err
	}
	return Enqueued{JobID: resp.GetJobId(), Deduplicated: resp.GetDeduplicated()}, nil
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
// invalid job refuses the whole batch. The results are in the order of jobs.
func (c *Client) EnqueueBatch(ctx context.Context, jobs []*pb.EnqueueRequest) ([]Enqueued, error) {
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

// Lease leases up to opts.MaxJobs ready jobs of queue, waiting up to opts.Wait for one. An
// empty result means none was ready in time. Answer each job with Ack, Fail or Release, and
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

// GetJob returns a job with its state, attempts, result and checkpoint. NotFound for an
// unknown job.
func (c *Client) GetJob(ctx context.Context, jobID string) (*pb.Job, error) {
	return c.admin.GetJob(ctx, &pb.GetJobRequest{JobId: jobID})
}

// CancelJob cancels a job: READY or SCHEDULED ones at once; for an ACTIVE one the worker is
// told (its handler's context is cancelled). FailedPrecondition if the job has ended.
func (c *Client) CancelJob(ctx context.Context, jobID string) (*pb.Job, error) {
	return c.admin.CancelJob(ctx, &pb.CancelJobRequest{JobId: jobID})
}

// RetryJob puts a FAILED or CANCELLED job back to READY with its attempts reset.
func (c *Client) RetryJob(ctx context.Context, jobID string) (*pb.Job, error) {
	resp, err := c.admin.RetryJob(ctx, &pb.RetryJobRequest{JobId: jobID})
	if err != nil {
		return nil, err
	}
	return resp.GetJob(), nil
}

// GetQueue returns a queue's effective policy and its job counts by state.
func (c *Client) GetQueue(ctx context.Context, queue string) (*pb.QueueInfo, error) {
	return c.admin.GetQueue(ctx, &pb.GetQueueRequest{Queue: queue})
}

func defaultWorkerID() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "worker"
	}
	return host + "-" + itoa(os.Getpid())
}
