# frozen_string_literal: true

require "jobbroker/coalescer"
require "jobbroker/options"
require "jobbroker/router"

module Jobbroker
  # The job ended FAILED or CANCELLED while #enqueue_and_wait waited for it. #job is the final
  # Jobbroker::V1::Job (fail_reason, last_error, attempts), #state its state.
  class JobFailed < StandardError
    attr_reader :job

    def initialize(job)
      @job = job
      why = job.last_error.to_s.empty? ? "" : ": #{job.last_error}"
      reason = job.state == :JOB_STATE_FAILED ? " (#{job.fail_reason})" : ""
      super("job #{job.id} ended #{job.state}#{reason}#{why}")
    end

    def state
      @job.state
    end
  end

  # #enqueue_and_wait's wait_timeout passed before the job ended. #job_id names the job, which
  # goes on without the waiter.
  class WaitTimeout < StandardError
    attr_reader :job_id

    def initialize(job_id, seconds)
      @job_id = job_id
      super("job #{job_id} did not end within #{seconds}s")
    end
  end

  # Producer and admin calls: one method per RPC of Broker (but Work, which Worker speaks)
  # and Admin. Errors are gRPC's status exceptions (GRPC::InvalidArgument, GRPC::NotFound, ...:
  # each a GRPC::BadStatus with #code and #details).
  #
  # Every unary call has the options' deadline (10 s) unless it names its own (`deadline:`
  # seconds, or a Time). A call is retried after UNAVAILABLE (3 attempts in all, 0.1 s then
  # 0.2 s apart, each routed again: see below) only when repeating it cannot do the work twice:
  # reads, Heartbeat/Ack/Fail/Release (a repeated answer for the same lease is answered as the
  # first), idempotent settings (UpdateQueuePolicy, Pause/ResumeQueue, PutSchedule), and
  # Enqueue/EnqueueBatch when every job has a dedup_key. An enqueue without one is tried once:
  # the broker may have stored the job before the connection broke, and only the caller can
  # tell whether a second copy is harmless.
  #
  # In a cluster each call goes straight to the leader of its partition (the queue's, or the
  # job's for calls that name a job id), as the latest Admin.GetCluster answer says; calls any
  # node serves go to the node that answered. A retry, and the first call after one failed
  # UNAVAILABLE or DEADLINE_EXCEEDED, asks GetCluster again first: the leader may have moved.
  # A broker that is not a cluster, or that will not answer GetCluster, is used as before:
  # the given addresses in turn (Router).
  #
  # Producer middleware (#use) wraps every enqueue, outermost first.
  #
  # Concurrent #enqueue calls share EnqueueBatch calls (docs/worker-contract.md §10, README
  # "Enqueue coalescing"; Coalescer), each caller still getting its own answer or error: the
  # options' batching and batch_* fields, `batch: false` for one call. The middleware runs per
  # #enqueue call, before its job joins a batch.
  #
  # Thread-safe. Nothing connects before the first call, and a client created before a fork
  # connects anew in the child (Connection).
  class Client
    RETRY_ATTEMPTS = 3
    RETRY_BACKOFF = 0.1
    TERMINAL_STATES = %i[JOB_STATE_COMPLETED JOB_STATE_FAILED JOB_STATE_CANCELLED].freeze

    attr_reader :options

    # `options`: a Jobbroker::Options; or its keyword arguments (address:, tls:, token:, ...)
    # directly. `address` may also come first, as in Jobbroker.connect("host:port").
    # `timeout:` is the old name of `deadline:`.
    def initialize(address = nil, options: nil, timeout: nil, **option_fields)
      option_fields[:deadline] = timeout if timeout
      option_fields[:address] = address if address
      @options = options ? options.with(**option_fields) : Options.new(**option_fields)
      @router = Router.new(Connection.new(@options))
      @middleware = []
      @coalescer = new_coalescer if @options.batching
    end

    # Where calls go (Router): its #observer sees the address of every call.
    attr_reader :router

    # The address of calls any node serves: in a cluster the node that answered GetCluster,
    # else the given address calls go to now (the first one, until one was UNAVAILABLE).
    def address
      @router.any_address
    end

    # The generated stubs for the address of calls any node serves, for what the methods here
    # do not wrap.
    def broker
      @router.stub(V1::Broker, @router.target(Router::Route::ANY))
    end

    def admin
      @router.stub(V1::Admin, @router.target(Router::Route::ANY))
    end

    # Sends the jobs still gathering in batches, waits for the batches in flight, then closes
    # the channels; a later call connects again.
    def close
      @coalescer&.close
      @router.close
    end

    # Adds a producer middleware: `call(jobs, next_call)` (a lambda, an object, or a block with
    # those two arguments) around every #enqueue and #enqueue_batch. `jobs` is the Array of
    # EnqueueRequests about to be sent (one for #enqueue), which it may change (add headers);
    # `next_call.call` sends them (through the later middleware) and returns the Array of
    # EnqueueResponses, which the middleware returns. The first registered is the outermost.
    # Register before sharing the client between threads. Returns self.
    def use(middleware = nil, &block)
      middleware ||= block
      raise ArgumentError, "use needs a middleware (call(jobs, next_call)) or a block" unless
        middleware

      @middleware << middleware
      self
    end

    # --- Broker ---

    # Adds one job; returns the EnqueueResponse (#job_id, #deduplicated). `payload`: a String
    # (bytes) or any JSON-able value. Options (every EnqueueRequest field): headers, priority,
    # delay (seconds) or run_at (Time), dedup_key, dedup_ttl, max_attempts, lease_duration,
    # concurrency_key, timeout (the run-time limit of each attempt), expire_at (Time),
    # depends_on (job ids). `deadline:` overrides the call's deadline.
    #
    # With the options' batching on (the default) the job may travel in an EnqueueBatch with
    # other threads' jobs of its partition; the answer and the errors are still this job's own,
    # as a unary Enqueue gives them. `batch: false` sends this one as a unary Enqueue at once.
    def enqueue(queue, payload = nil, deadline: nil, batch: true, **options)
      request = self.class.enqueue_request(queue, payload, **options)
      through_middleware([request]) do |jobs|
        [send_enqueue(jobs.first, deadline, batch)]
      end.first
    end

    # Adds several jobs, all or nothing. `jobs`: Hashes with :queue, :payload and the options
    # of #enqueue (also depends_on_index: indexes of earlier jobs of the batch). Returns the
    # EnqueueResponses in order. Retried only when every job has a dedup_key. Sent as it is:
    # never merged with other calls' jobs, never split.
    def enqueue_batch(jobs, deadline: nil)
      requests = jobs.map do |j|
        j = j.dup
        self.class.enqueue_request(j.delete(:queue), j.delete(:payload), **j)
      end
      through_middleware(requests) do |jobs|
        safe = jobs.all? { |job| !job.dedup_key.empty? }
        # All or nothing within one partition: the leader of the first job's queue, which
        # refuses a batch that spans partitions (INVALID_ARGUMENT naming them).
        route = jobs.empty? ? Router::Route::ANY : Router::Route.queue(jobs.first.queue)
        unary(V1::Broker, :enqueue_batch, V1::EnqueueBatchRequest.new(jobs: jobs),
              route: route, retry_safe: safe, deadline: deadline).results.to_a
      end
    end

    # Enqueues the job, then watches it (Admin.WatchJob) until it ends. Returns the final Job
    # when it COMPLETED (its #result holds the handler's result). Raises JobFailed when it
    # ended FAILED or CANCELLED, WaitTimeout after `wait_timeout` seconds (nil: wait for as
    # long as it takes). A watch the broker ended (UNAVAILABLE: it shut down) is opened again.
    # Options as for #enqueue; the caller's token needs the producer and the admin roles.
    def enqueue_and_wait(queue, payload = nil, wait_timeout: nil, **options)
      started = Worker.monotonic
      job_id = enqueue(queue, payload, **options).job_id
      wait_for(job_id, wait_timeout: wait_timeout && wait_timeout - (Worker.monotonic - started))
    end

    # Waits until the job ends, as #enqueue_and_wait does after its enqueue.
    def wait_for(job_id, wait_timeout: nil)
      give_up_at = wait_timeout && Time.now + wait_timeout
      attempt = 0
      loop do
        raise WaitTimeout.new(job_id, wait_timeout) if give_up_at && Time.now >= give_up_at

        target = @router.target(Router::Route.job(job_id))
        begin
          watch(target, job_id, give_up_at).each do |job|
            next unless TERMINAL_STATES.include?(job.state)
            raise JobFailed, job unless job.state == :JOB_STATE_COMPLETED

            return job
          end
          # Ended without a terminal state (not what the broker does): look again shortly.
          attempt = 0
          sleep(RETRY_BACKOFF)
        rescue GRPC::DeadlineExceeded
          raise WaitTimeout.new(job_id, wait_timeout)
        rescue GRPC::Unavailable
          @router.call_failed(target, unavailable: true)
          attempt += 1
          sleep(retry_pause(attempt))
        end
      end
    end

    # Leases up to `max_jobs` ready jobs of `queue`, waiting up to `wait` seconds for one;
    # returns the LeasedJobs (empty when none was ready in time). Not retried: a repeated lease
    # would hold jobs nobody works until their leases run out. The deadline is `wait` plus the
    # default one.
    def lease(queue, worker_id:, max_jobs: 1, lease_duration: nil, wait: nil, deadline: nil)
      request = V1::LeaseRequest.new(queue: queue.to_s, worker_id: worker_id, max_jobs: max_jobs,
                                     lease_duration: Jobbroker.duration(lease_duration),
                                     wait: Jobbroker.duration(wait))
      deadline ||= @options.deadline && @options.deadline + wait.to_f
      unary(V1::Broker, :lease, request, route: Router::Route.queue(queue), retry_safe: false,
                                         deadline: deadline).jobs.to_a
    end

    # Extends a lease (by `extend_by` seconds, else its own length), saving `checkpoint` and
    # `progress` (Strings, or JSON-able values for progress) when given. HeartbeatResponse.
    def heartbeat(job_id, lease_id, extend_by: nil, checkpoint: nil, progress: nil, deadline: nil)
      request = V1::HeartbeatRequest.new(job_id: job_id, lease_id: lease_id,
                                         extend_by: Jobbroker.duration(extend_by))
      request.checkpoint = checkpoint.b if checkpoint
      request.progress = Jobbroker.payload_bytes(progress) if progress
      unary(V1::Broker, :heartbeat, request, route: Router::Route.job(job_id), retry_safe: true,
                                         deadline: deadline)
    end

    # Completes the job with `result` (a String as it is, anything else as JSON).
    def ack(job_id, lease_id, result = nil, deadline: nil)
      request = V1::AckRequest.new(job_id: job_id, lease_id: lease_id,
                                   result: Jobbroker.payload_bytes(result))
      unary(V1::Broker, :ack, request, route: Router::Route.job(job_id), retry_safe: true,
                                         deadline: deadline)
      nil
    end

    # Fails the attempt (`permanent`: no retry; `retry_after`: seconds before the next one).
    # Returns the FailResponse (#state, #next_attempt_at).
    def fail(job_id, lease_id, error, permanent: false, retry_after: nil, deadline: nil)
      request = V1::FailRequest.new(job_id: job_id, lease_id: lease_id, error: error.to_s,
                                    permanent: permanent,
                                    retry_after: Jobbroker.duration(retry_after))
      unary(V1::Broker, :fail, request, route: Router::Route.job(job_id), retry_safe: true,
                                         deadline: deadline)
    end

    # Gives the job back unstarted; with `delay` (seconds) it is snoozed that long.
    def release(job_id, lease_id, delay: nil, deadline: nil)
      request = V1::ReleaseRequest.new(job_id: job_id, lease_id: lease_id,
                                       delay: Jobbroker.duration(delay))
      unary(V1::Broker, :release, request, route: Router::Route.job(job_id), retry_safe: true,
                                         deadline: deadline)
      nil
    end

    # --- Admin: jobs ---

    # The job (Jobbroker::V1::Job). GRPC::NotFound if unknown.
    def get_job(job_id, deadline: nil)
      admin_call(:get_job, V1::GetJobRequest.new(job_id: job_id),
                 route: Router::Route.job(job_id), deadline: deadline)
    end

    # The job now, then once per change until it ends: an Enumerator of Jobs (or, with a
    # block, yields each and returns nil). No deadline unless given (seconds or a Time).
    def watch_job(job_id, deadline: nil, &block)
      stream = watch(@router.target(Router::Route.job(job_id)), job_id, absolute(deadline))
      return stream unless block

      stream.each(&block)
      nil
    end

    # One page of the queue's jobs: a ListJobsResponse (#jobs, #next_page_token). `state`:
    # :ready, :JOB_STATE_READY, ... (nil: every state).
    def list_jobs(queue, state: nil, page_size: 0, page_token: "", newest_first: false,
                  dedup_key: "", deadline: nil)
      request = V1::ListJobsRequest.new(queue: queue.to_s, state: Jobbroker.job_state(state),
                                        page_size: page_size, page_token: page_token,
                                        newest_first: newest_first, dedup_key: dedup_key)
      admin_call(:list_jobs, request, route: Router::Route.queue(queue), deadline: deadline)
    end

    # Every job of the queue (in `state`), page after page: an Enumerator of Jobs.
    def each_job(queue, state: nil, newest_first: false)
      return enum_for(:each_job, queue, state: state, newest_first: newest_first) unless
        block_given?

      token = ""
      loop do
        page = list_jobs(queue, state: state, page_token: token, newest_first: newest_first)
        page.jobs.each { |job| yield job }
        token = page.next_page_token
        break if token.empty?
      end
    end

    # Cancels the job (READY/SCHEDULED: at once; ACTIVE: its worker is told). Returns the
    # Job. Not retried: a repeat of a cancel that went through is FAILED_PRECONDITION.
    def cancel_job(job_id, deadline: nil)
      unary(V1::Admin, :cancel_job, V1::CancelJobRequest.new(job_id: job_id),
            route: Router::Route.job(job_id), retry_safe: false, deadline: deadline)
    end

    # A FAILED or CANCELLED job back to READY (`job_id`), or with `queue:` every such job of
    # the queue (state: :failed by default, dry_run, limit). Returns the RetryJobResponse
    # (#job for one job, #matched, #retried).
    def retry_job(job_id = nil, queue: nil, state: nil, dry_run: false, limit: 0, deadline: nil)
      request = V1::RetryJobRequest.new(job_id: job_id.to_s, queue: queue.to_s,
                                        state: Jobbroker.job_state(state), dry_run: dry_run,
                                        limit: limit)
      route = queue.to_s.empty? ? Router::Route.job(job_id) : Router::Route.queue(queue)
      unary(V1::Admin, :retry_job, request, route: route, retry_safe: dry_run, deadline: deadline)
    end

    # Removes a job that is not ACTIVE.
    def delete_job(job_id, deadline: nil)
      unary(V1::Admin, :delete_job, V1::DeleteJobRequest.new(job_id: job_id),
            route: Router::Route.job(job_id), retry_safe: false, deadline: deadline)
      nil
    end

    # --- Admin: queues ---

    # Every queue the token may see: an Array of QueueInfo.
    def list_queues(deadline: nil)
      admin_call(:list_queues, V1::ListQueuesRequest.new, route: Router::Route::ANY,
                                                          deadline: deadline).queues.to_a
    end

    # The queue's QueueInfo (effective policy, counts by state). GRPC::NotFound if unknown.
    def get_queue(queue, deadline: nil)
      admin_call(:get_queue, V1::GetQueueRequest.new(queue: queue.to_s),
                 route: Router::Route.queue(queue), deadline: deadline)
    end

    # Changes the queue's policy at run time: a V1::QueuePolicy, or its fields as a Hash or
    # keywords (durations in seconds: `lease_duration: 30, retry: { max_attempts: 5 }`).
    # `reset`: first drop every run-time override. Returns the QueueInfo.
    def update_queue_policy(queue, policy = nil, reset: false, deadline: nil, **fields)
      policy = Jobbroker.message(V1::QueuePolicy, policy || fields)
      request = V1::UpdateQueuePolicyRequest.new(queue: queue.to_s, policy: policy, reset: reset)
      admin_call(:update_queue_policy, request, route: Router::Route.queue(queue),
                                                deadline: deadline)
    end

    # Stops leasing from the queue (enqueues go on). Returns the QueueInfo.
    def pause_queue(queue, deadline: nil)
      admin_call(:pause_queue, V1::PauseQueueRequest.new(queue: queue.to_s),
                 route: Router::Route.queue(queue), deadline: deadline)
    end

    def resume_queue(queue, deadline: nil)
      admin_call(:resume_queue, V1::ResumeQueueRequest.new(queue: queue.to_s),
                 route: Router::Route.queue(queue), deadline: deadline)
    end

    # Removes the queue's jobs in `states` (default: every terminal state). Returns how many.
    def purge_queue(queue, states: [], deadline: nil)
      request = V1::PurgeQueueRequest.new(queue: queue.to_s,
                                          states: states.map { |s| Jobbroker.job_state(s) })
      unary(V1::Admin, :purge_queue, request, route: Router::Route.queue(queue), retry_safe: false,
                                              deadline: deadline).purged
    end

    # --- Admin: cluster and workers ---

    # The ClusterInfo (nodes, partitions and their leaders); a single node answers as a
    # cluster of one.
    def get_cluster(deadline: nil)
      admin_call(:get_cluster, V1::GetClusterRequest.new, route: Router::Route::ANY,
                                                          deadline: deadline)
    end

    # The workers connected now (of `queue`, if given): an Array of WorkerInfo.
    def list_workers(queue: "", deadline: nil)
      admin_call(:list_workers, V1::ListWorkersRequest.new(queue: queue.to_s),
                 route: Router::Route::ANY, deadline: deadline).workers.to_a
    end

    # --- Admin: schedules ---

    # Creates or replaces the schedule `schedule_id`: every run enqueues `payload` into
    # `queue` with the enqueue options given (headers, priority, max_attempts, lease_duration,
    # concurrency_key, timeout, dedup_ttl). Exactly one of `cron` ("*/5 * * * *") and `every`
    # (seconds). Also takes a ready V1::Schedule instead. Returns the stored Schedule
    # (#next_run_at, ...).
    def put_schedule(schedule_id, queue = nil, payload = nil, cron: "", every: nil,
                     time_zone: "", paused: false, start_at: nil, end_at: nil, catch_up: nil,
                     deadline: nil, **template_options)
      schedule = if schedule_id.is_a?(V1::Schedule)
                   schedule_id
                 else
                   V1::Schedule.new(
                     schedule_id: schedule_id.to_s, cron: cron.to_s,
                     every: Jobbroker.duration(every), time_zone: time_zone.to_s,
                     template: self.class.enqueue_request(queue, payload, **template_options),
                     paused: paused, start_at: Jobbroker.timestamp(start_at),
                     end_at: Jobbroker.timestamp(end_at),
                     catch_up: catch_up ? Jobbroker.enum_value("SCHEDULE_CATCH_UP", catch_up) : 0
                   )
                 end
      admin_call(:put_schedule, V1::PutScheduleRequest.new(schedule: schedule),
                 route: Router::Route.queue(schedule.template&.queue), deadline: deadline)
    end

    # The Schedule. GRPC::NotFound if unknown.
    def get_schedule(schedule_id, deadline: nil)
      admin_call(:get_schedule, V1::GetScheduleRequest.new(schedule_id: schedule_id),
                 route: Router::Route::ANY, deadline: deadline)
    end

    # Every schedule (of `queue`, if given): an Array of Schedule, by id.
    def list_schedules(queue: "", deadline: nil)
      route = queue.to_s.empty? ? Router::Route::ANY : Router::Route.queue(queue)
      admin_call(:list_schedules, V1::ListSchedulesRequest.new(queue: queue.to_s),
                 route: route, deadline: deadline).schedules.to_a
    end

    # Removes the schedule; the jobs it enqueued stay.
    def delete_schedule(schedule_id, deadline: nil)
      unary(V1::Admin, :delete_schedule, V1::DeleteScheduleRequest.new(schedule_id: schedule_id),
            route: Router::Route::ANY, retry_safe: false, deadline: deadline)
      nil
    end

    # Enqueues one run now. Returns the TriggerScheduleResponse (#job_id, #deduplicated).
    def trigger_schedule(schedule_id, deadline: nil)
      unary(V1::Admin, :trigger_schedule,
            V1::TriggerScheduleRequest.new(schedule_id: schedule_id),
            route: Router::Route::ANY, retry_safe: false, deadline: deadline)
    end

    # Builds an EnqueueRequest from keyword options (see #enqueue).
    def self.enqueue_request(queue, payload = nil, headers: {}, priority: 0, delay: nil,
                             run_at: nil, dedup_key: "", dedup_ttl: nil, max_attempts: 0,
                             lease_duration: nil, concurrency_key: "", timeout: nil,
                             expire_at: nil, depends_on: [], depends_on_index: [])
      V1::EnqueueRequest.new(
        queue: queue.to_s, payload: Jobbroker.payload_bytes(payload),
        headers: headers.to_h { |k, v| [k.to_s, v.to_s] }, priority: priority,
        delay: Jobbroker.duration(delay), run_at: Jobbroker.timestamp(run_at),
        dedup_key: dedup_key.to_s, dedup_ttl: Jobbroker.duration(dedup_ttl),
        max_attempts: max_attempts, lease_duration: Jobbroker.duration(lease_duration),
        concurrency_key: concurrency_key.to_s, timeout: Jobbroker.duration(timeout),
        expire_at: Jobbroker.timestamp(expire_at), depends_on: Array(depends_on).map(&:to_s),
        depends_on_index: Array(depends_on_index)
      )
    end

    private

    # Where #enqueue's job goes after the middleware: into a batch of its key, or alone.
    def send_enqueue(job, deadline, batch)
      return unary_enqueue(job, deadline) unless batch && @coalescer

      @coalescer.enqueue(job, absolute(deadline.nil? ? @options.deadline : deadline),
                         @router.current_table&.partition_of_queue(job.queue))
    end

    def unary_enqueue(job, deadline)
      unary(V1::Broker, :enqueue, job, route: Router::Route.queue(job.queue),
                                       retry_safe: !job.dedup_key.empty?, deadline: deadline)
    end

    # The coalescer's calls: one job as Enqueue, several as EnqueueBatch to the leader of their
    # partition (the first job's queue), retried as #enqueue_batch is.
    def new_coalescer
      Coalescer.new(
        send_one: ->(job, deadline_at) { unary_enqueue(job, deadline_at) },
        send_many: lambda do |jobs, deadline_at|
          unary(V1::Broker, :enqueue_batch, V1::EnqueueBatchRequest.new(jobs: jobs),
                route: Router::Route.queue(jobs.first.queue),
                retry_safe: jobs.all? { |job| !job.dedup_key.empty? },
                deadline: deadline_at).results.to_a
        end,
        max_jobs: @options.batch_max_jobs, max_bytes: @options.batch_max_bytes,
        linger: @options.batch_linger, max_in_flight: @options.batch_max_in_flight
      )
    end

    # Reads and idempotent settings: always safe to repeat.
    def admin_call(method, request, route:, deadline:)
      unary(V1::Admin, method, request, route: route, retry_safe: true, deadline: deadline)
    end

    # One unary call, to the node `route` (a Router::Route) names, with the retry rule of the
    # class comment. Every attempt shares one deadline, so a retried call still ends within it;
    # each is routed anew, after the refresh its predecessor's failure asked for.
    def unary(service, method, request, route:, retry_safe:, deadline:)
      deadline_at = absolute(deadline.nil? ? @options.deadline : deadline)
      attempts = retry_safe ? RETRY_ATTEMPTS : 1
      attempt = 0
      begin
        attempt += 1
        target = @router.target(route)
        @router.stub(service, target, method).public_send(method, request, deadline: deadline_at)
      rescue GRPC::DeadlineExceeded
        @router.call_failed(target, unavailable: false)
        raise
      rescue GRPC::Unavailable
        @router.call_failed(target, unavailable: true)
        raise if attempt >= attempts

        pause = retry_pause(attempt)
        raise if deadline_at && Time.now + pause >= deadline_at

        sleep(pause)
        retry
      end
    end

    # The WatchJob stream of `job_id` at `target` (an Enumerator of Jobs).
    def watch(target, job_id, deadline_at)
      @router.stub(V1::Admin, target, :watch_job)
             .watch_job(V1::WatchJobRequest.new(job_id: job_id), deadline: deadline_at)
    end

    def retry_pause(attempt)
      RETRY_BACKOFF * (2**([attempt, 6].min - 1))
    end

    # Seconds from now or a Time -> a Time; nil stays nil.
    def absolute(deadline)
      deadline.is_a?(Numeric) ? Time.now + deadline : deadline
    end

    def through_middleware(jobs, &send_jobs)
      chain = @middleware.reverse.inject(send_jobs) do |inner, middleware|
        ->(js) { middleware.call(js, -> { inner.call(js) }) }
      end
      chain.call(jobs)
    end
  end
end
