# frozen_string_literal: true

require "json"
require "logger"
require "socket"
require "jobbroker/job_context"
require "jobbroker/router"
require "jobbroker/work_session"

module Jobbroker
  # The broker refused the Work subscription, or ended the stream with a code that retrying
  # would only hide (INVALID_ARGUMENT for a bad queue name, UNAUTHENTICATED,
  # PERMISSION_DENIED). #code is the gRPC status code (GRPC::Core::StatusCodes).
  class SubscriptionRefused < StandardError
    attr_reader :code

    def initialize(code, message)
      @code = code
      super("subscription refused (code #{code}): #{message}")
    end
  end

  # Runs one handler per queue for the jobs pushed over a Broker.Work stream, as
  # docs/worker-contract.md defines it:
  #
  #   worker = Jobbroker::Worker.new(address: "127.0.0.1:7070", concurrency: 4)
  #   worker.handle("emails") do |job|
  #     id = job.step("send") { provider.send(job.json, key: job.idempotency_key) }
  #     { "message_id" => id }   # the result: a String as it is, anything else as JSON
  #   end
  #   worker.trap_signals        # SIGTERM/SIGINT -> graceful stop
  #   worker.run                 # blocks until stopped
  #
  # A handler that returns acks the job; one that raises fails the attempt (PermanentError: no
  # retry; RetryAfter: the next attempt after its delay; Snooze: released with a delay, no
  # attempt spent). Cancellation (operator cancel, lost lease, the job's time-out, the end of a
  # graceful stop's grace) turns JobContext#cancelled? true and makes the handler's next
  # #sleep, #step or #check_cancelled! raise Cancelled; the worker cannot stop code that
  # ignores it, and such a handler keeps its slot until it returns.
  #
  # In a cluster (Admin.GetCluster tells where each partition's leader is) the worker opens one
  # stream per leading node, each subscribing to the handled queues that node leads with a
  # share of max_in_flight (StreamGroups), so that no node relays its stream to another;
  # queues without a leader share one more stream to any node. A job's answers go on the
  # stream that pushed it while that one is open, else on any open stream (a node routes an
  # answer to its leader by job id). When a stream ends the worker waits its backoff, asks for
  # the cluster's layout again and regroups: streams whose group is unchanged keep running,
  # the others are ended and the missing ones opened, so it follows a leader that moved or
  # died. While some queues go to any node it also asks again after each backoff delay (up to
  # reconnect_max) and regroups, so that they move to their leader's own stream once the table
  # names it instead of staying relayed. Outside a cluster it holds one stream, on the given
  # addresses in turn (Router).
  #
  # Threads: `concurrency` handler threads (one pool across the streams), one timer thread
  # (heartbeats every third of each lease, time-outs, resends of answers refused UNAVAILABLE),
  # one connection thread (regroups with backoff) and one reader thread per stream. All state
  # shared by them is guarded by @mu; callbacks that take @mu are never called with it held.
  # #stop may be called from any thread but not from a trap handler (use #trap_signals, which
  # calls it from a thread).
  class Worker
    # acked/failed/released: answers the broker accepted; ack_messages: ack and ack_batch
    # messages sent (fewer than acks when acks were coalesced); reconnects: streams reopened.
    Stats = Struct.new(:acked, :failed, :released, :reconnects, :ack_messages)

    # The most acks one ack_batch carries (the broker's limit).
    ACK_BATCH_MAX = 1000
    # Stream end codes after which the worker reconnects; any other ends #run with that error.
    RETRYABLE_CODES = [
      GRPC::Core::StatusCodes::OK, GRPC::Core::StatusCodes::UNAVAILABLE,
      GRPC::Core::StatusCodes::UNKNOWN, GRPC::Core::StatusCodes::INTERNAL,
      GRPC::Core::StatusCodes::DEADLINE_EXCEEDED, GRPC::Core::StatusCodes::CANCELLED,
      GRPC::Core::StatusCodes::ABORTED, GRPC::Core::StatusCodes::RESOURCE_EXHAUSTED
    ].freeze
    # Answers that mean the lease is no longer ours: final, never an error of the worker.
    STALE_LEASE_CODES = [
      GRPC::Core::StatusCodes::FAILED_PRECONDITION, GRPC::Core::StatusCodes::NOT_FOUND
    ].freeze
    UNAVAILABLE = GRPC::Core::StatusCodes::UNAVAILABLE
    # Seconds to wait for the subscribe's answer before trying another stream.
    SUBSCRIBE_TIMEOUT = 30
    # An ack, fail, release or checkpoint save answered UNAVAILABLE (the partition is between
    # leaders, or the broker could not apply it now: "retry") is not final: it goes out again
    # after these seconds, or on the next stream if this one ends first. Dropping it would have
    # the job run again once its lease runs out.
    ANSWER_RETRY_DELAY = 0.25
    # Seconds step 6 of a stop waits for the connection thread after closing the streams (it
    # may be waiting for a GetCluster answer, which opens nothing once the stop closes).
    CONNECTION_JOIN = 1.0
    # Which WorkRequest field carries each kind of request.
    REQUEST_FIELD = {
      subscribe: :subscribe, heartbeat: :heartbeat, progress: :heartbeat,
      checkpoint: :heartbeat, ack: :ack, ack_batch: :ack_batch, fail: :fail,
      release: :release, flow: :flow
    }.freeze

    attr_reader :worker_id, :stats, :options
    # Where streams go (Router): its #observer sees the address of every stream opened.
    attr_reader :router

    def self.monotonic
      Process.clock_gettime(Process::CLOCK_MONOTONIC)
    end

    # options:         a Jobbroker::Options (addresses, TLS, token, keepalive, ...), the one a
    #                  Client takes too; default Options.new ($JOBBROKER_ADDRESS,
    #                  $JOBBROKER_TOKEN). Outside a cluster, a stream that ends UNAVAILABLE
    #                  (also when the broker stopped answering the keepalive pings) reconnects
    #                  to the next of its addresses.
    # address:, token:, credentials: shorthands that override those fields of `options`.
    # concurrency:     handlers run at once.
    # prefetch:        jobs held beyond `concurrency` (max_in_flight = concurrency + prefetch).
    #                  They are leased and heartbeated while they wait, start in arrival order,
    #                  and a graceful stop releases them unstarted.
    # lease_duration:  seconds asked for each lease; nil = the job's, else the queue's.
    # grace:           seconds a graceful stop lets running handlers finish before it cancels
    #                  them (their jobs are then released).
    # worker_id:       names the worker in attempt histories and Admin.ListWorkers.
    # reconnect_initial / reconnect_max: reconnect backoff in seconds (doubling, full jitter).
    # random:          jitter source (tests pass a seeded Random).
    # queues: + block: shorthand for calling #handle(queue, &block) for each queue.
    def initialize(options: nil, address: nil, token: nil, credentials: nil, queues: nil,
                   concurrency: 1, prefetch: 0,
                   worker_id: "#{Socket.gethostname}-#{Process.pid}", lease_duration: nil,
                   grace: 30, reconnect_initial: 0.1, reconnect_max: 5.0,
                   random: Random.new, logger: Logger.new($stderr, progname: "jobbroker-worker"),
                   &handler)
      raise ArgumentError, "concurrency must be at least 1" if concurrency < 1
      raise ArgumentError, "prefetch must not be negative" if prefetch.negative?

      overrides = { address: address, token: token, credentials: credentials }.compact
      @options = (options || Options.new(**overrides))
      @options = @options.with(**overrides) if options && !overrides.empty?
      @concurrency = concurrency
      @prefetch = prefetch
      @worker_id = worker_id
      @lease_duration = lease_duration
      @grace = grace
      @reconnect_initial = reconnect_initial
      @reconnect_max = reconnect_max
      @random = random
      @log = logger
      @router = Router.new(Connection.new(@options))
      @stats = Stats.new(0, 0, 0, 0, 0)
      @mu = Mutex.new
      @cv = ConditionVariable.new
      @running = false
      @stop_requested = false
      @handlers = {}
      @middleware = []
      Array(queues).each { |queue| handle(queue, &handler) } if handler
      raise ArgumentError, "queues: needs a handler block" if queues && !handler
    end

    # Adds a worker middleware around every handler call: `call(job, next_call)` (a lambda, an
    # object, or a block with those two arguments) gets the JobContext; `next_call.call` runs
    # the later middleware and the handler and returns the handler's result, which the
    # middleware returns (or its own; an exception it raises ends the attempt as a handler's
    # would). The first registered is the outermost, as in Sidekiq and asynq. Call it before
    # #run. Returns self.
    def use(middleware = nil, &block)
      middleware ||= block
      raise ArgumentError, "use needs a middleware (call(job, next_call)) or a block" unless
        middleware

      @mu.synchronize { raise "middleware must be added before run" if @running }
      @middleware << middleware
      self
    end

    # Registers the handler of `queue`; the worker subscribes to every queue that has one. The
    # block gets a JobContext. Returns self. Call it before #run.
    def handle(queue, &handler)
      raise ArgumentError, "handle(#{queue.inspect}) needs a block" unless handler

      queue = queue.to_s
      raise ArgumentError, "queue #{queue.inspect} already has a handler" if @handlers.key?(queue)

      @mu.synchronize { raise "handlers must be registered before run" if @running }
      @handlers[queue] = handler
      self
    end

    # Connects and runs jobs until #stop (or SIGTERM/SIGINT after #trap_signals), then stops
    # gracefully and returns nil. Raises ArgumentError when no handler is registered (before
    # connecting) and SubscriptionRefused when the broker refuses the subscription or ends the
    # stream with a code that is the caller's mistake; an unreachable broker is retried.
    def run
      raise ArgumentError, "no handler registered: call handle(queue) { |job| ... } first" if
        @handlers.empty?

      @mu.synchronize do
        raise "run is already running" if @running

        reset_state
        @running = true
      end
      @handler_threads = Array.new(@concurrency) { Thread.new { handler_loop } }
      @timer_thread = Thread.new { timer_loop }
      @connection_thread = Thread.new { connection_loop }
      fatal = @mu.synchronize do
        @cv.wait(@mu) until @stop_requested || @fatal
        @fatal
      end
      fatal ? abort_run(fatal) : graceful_stop
      @log.info("stopped: #{@stats.to_h}")
      nil
    ensure
      @mu.synchronize { @running = false }
    end

    # Starts the graceful stop of #run: no new jobs (Flow 0), unstarted ones released, running
    # ones given the grace, then cancelled and released. Returns at once; calling it again does
    # not skip any step. Safe from any thread, not from a trap handler.
    def stop
      @mu.synchronize do
        @stop_requested = true
        @cv.broadcast
      end
    end

    # Installs traps that call #stop for the given signals (default TERM and INT).
    def trap_signals(*signals)
      signals = %w[TERM INT] if signals.empty?
      signals.each { |sig| Signal.trap(sig) { Thread.new { stop } } }
      self
    end

    # --- called by JobContext on a handler thread ---

    # Sends `bytes` as the job's progress now, or when the progress heartbeat in flight is
    # answered (then only the newest value waiting goes out).
    def send_progress(ctx, bytes)
      @mu.synchronize do
        held = held_of_locked(ctx)
        next unless held

        if held.progress_in_flight || !any_open_locked?
          held.progress_waiting = bytes
        else
          send_progress_locked(held, bytes)
        end
      end
    end

    # Saves the job's checkpoint at once and waits for the broker's answer (across reconnects:
    # an unanswered save goes out again on the next stream; one answered UNAVAILABLE goes out
    # again after ANSWER_RETRY_DELAY). Raises Cancelled when the lease is gone, StepSaveError
    # when the broker refused the save.
    def save_checkpoint(ctx, bytes)
      answer = Answer.new
      held = @mu.synchronize do
        held = held_of_locked(ctx)
        raise Cancelled, ctx.cancel_reason || :lease_lost unless held

        request = Request.new(:checkpoint,
                              V1::HeartbeatRequest.new(job_id: ctx.job_id, lease_id: ctx.lease_id,
                                                       checkpoint: bytes),
                              held, nil, true)
        # UNAVAILABLE is not the save's answer: the save goes out again (retry_later).
        request.on_result = lambda do |r|
          r.code == UNAVAILABLE ? retry_later(request, r) : answer << r
        end
        send_or_keep_locked(request)
        held
      end
      result = wait_for_answer(ctx, answer)
      if result.code.zero?
        cancel_by_operator(held) if result.cancel_requested
        return
      end
      if STALE_LEASE_CODES.include?(result.code)
        lose_lease(ctx.job_id, :lease_lost, only: held)
        raise Cancelled, ctx.cancel_reason || :lease_lost
      end
      raise StepSaveError, "the broker refused to save the checkpoint of job #{ctx.job_id} " \
                           "(code #{result.code}): #{result.message}"
    end

    # --- called by WorkSession on its reader thread ---

    def on_job(leased, session)
      @mu.synchronize do
        if @stop_taking
          # Pushed after the stop began: back at once, unstarted.
          send_answer_locked(:release, release_request(leased), session)
          next
        end
        held = new_held(leased, session)
        @held[leased.job_id] = held
        @waiting << held
        @cv.broadcast
      end
    end

    def on_result(result)
      request = @mu.synchronize { @in_flight.delete(result.request_id) }
      request&.on_result&.call(result)
    end

    def on_lease_lost(job_id, outcome)
      reason = outcome == :ATTEMPT_OUTCOME_TIMED_OUT ? :timed_out : :lease_lost
      lose_lease(job_id, reason)
    end

    def on_cancel(job_id)
      held = @mu.synchronize { @held[job_id] }
      cancel_by_operator(held) if held
    end

    def on_session_end(session, code, message)
      subscribe_answers = []
      @mu.synchronize do
        stream = stream_of_locked(session)
        if stream
          stream.open = false
          # A stream ended by a regrouping is no stream end to react to: it just goes.
          @streams.delete(stream) if stream.retired
          # Back to the front: they go out first on another stream, same lease ids.
          @ack_queue.unshift(*stream.acks_in_flight) if stream.acks_in_flight
          stream.acks_in_flight = nil
        end
        ended = @in_flight.select { |_, r| r.session.equal?(session) }
        ended.each_key { |id| @in_flight.delete(id) }
        ended.sort_by(&:first).each do |_, request|
          case request.kind
          when :subscribe then subscribe_answers << request
          when :ack, :ack_batch then nil # back in @ack_queue above
          when :progress
            request.held.progress_in_flight = false
            request.held.progress_waiting ||= request.message.progress
          else
            # Fails, releases and checkpoints are resent; heartbeats and flows are not.
            @resend << request if request.resend
          end
        end
        # Another stream of the worker may still be open: what this one left goes out there.
        flush_locked
        @cv.broadcast
      end
      result = V1::WorkResult.new(code: code, message: message.to_s)
      subscribe_answers.each { |r| r.on_result.call(result) }
    end

    private

    # One request waiting for its WorkResult. `resend`: sent again on the next stream if this
    # one ends unanswered. `held`: the job a heartbeat, progress or checkpoint is about.
    # `session`: the stream it went on. `via`: the stream that pushed its job (it goes there
    # while that one is open, else on any open stream); nil: held's.
    Request = Struct.new(:kind, :message, :held, :on_result, :resend, :session, :via)

    # An ack waiting to go out, and the stream that pushed its job.
    PendingAck = Struct.new(:ack, :via)

    # One Work stream of the worker: its StreamGroups::Group and Router::Target, its
    # WorkSession, whether it is subscribed and not ended (`open`), whether a regrouping ended
    # it (`retired`), and the PendingAcks of its one ack message in flight.
    Stream = Struct.new(:group, :target, :session, :open, :retired, :acks_in_flight)

    # A WorkResult some thread waits for (Ruby 3.1's Queue#pop has no timeout).
    class Answer
      def initialize
        @mu = Mutex.new
        @cv = ConditionVariable.new
        @result = nil
      end

      def <<(result)
        @mu.synchronize do
          @result = result
          @cv.broadcast
        end
      end

      # The result, or nil after `timeout` seconds.
      def wait(timeout)
        deadline = Worker.monotonic + timeout
        @mu.synchronize do
          while @result.nil?
            left = deadline - Worker.monotonic
            break if left <= 0

            @cv.wait(@mu, left)
          end
          @result
        end
      end
    end

    # A job this worker holds a lease on: waiting for a handler, or running.
    # `session`: the stream that pushed it, where its answers go while it is open.
    Held = Struct.new(:leased, :context, :heartbeat_interval, :next_heartbeat, :timeout_at,
                      :progress_in_flight, :progress_waiting, :session) do
      def job_id
        leased.job_id
      end
    end

    def reset_state
      @stop_requested = false
      @stop_taking = false
      @closing = false
      @fatal = nil
      @streams = []         # Stream, in the order opened
      @any_node_group = false # the latest grouping has a group for any node
      @next_request_id = 0
      @in_flight = {}       # request_id => Request sent on an open stream
      @resend = []          # Requests to send again on the next stream
      @held = {}            # job_id => Held
      @waiting = []         # Held not yet started, oldest first
      @handlers_running = 0
      @ack_queue = []       # PendingAcks waiting for their stream's ack in flight (or a stream)
      @answers_unanswered = 0
      # Answered UNAVAILABLE, to send again at @retry_at (or on the next stream, if sooner).
      @ack_retry = []       # PendingAcks
      @refused = []         # fail, release and checkpoint Requests
      @retry_at = nil
    end

    def max_in_flight
      @concurrency + @prefetch
    end

    def subscribe_request(group)
      V1::SubscribeRequest.new(queues: group.queues, worker_id: @worker_id,
                               max_in_flight: group.share,
                               lease_duration: Jobbroker.duration(@lease_duration),
                               batch_pushes: true)
    end

    def new_held(leased, session)
      ctx = JobContext.new(leased, self)
      now = Worker.monotonic
      # The interval comes from the deadline the broker gave, so a 30 s lease beats every 10 s.
      lease_left = Jobbroker.to_time(leased.lease_deadline) - Time.now
      interval = [lease_left / 3.0, 0.05].max
      timeout_at = ctx.timeout_at && now + (ctx.timeout_at - Time.now)
      Held.new(leased, ctx, interval, now + interval, timeout_at, false, nil, session)
    end

    def release_request(leased, delay = nil)
      V1::ReleaseRequest.new(job_id: leased.job_id, lease_id: leased.lease_id,
                             delay: Jobbroker.duration(delay))
    end

    # --- sending ---

    def stream_of_locked(session)
      @streams.find { |stream| stream.session.equal?(session) }
    end

    def any_open_locked?
      @streams.any?(&:open)
    end

    # Where an answer about a job pushed by `via` goes: that stream while it is open, else any
    # open stream (a node routes an answer to its job's leader by job id); nil when none is.
    def session_for_locked(via)
      open = @streams.select(&:open)
      (open.find { |stream| stream.session.equal?(via) } || open.first)&.session
    end

    # Sends `request` on `session`, else on the stream its job came on (session_for_locked);
    # the caller holds @mu and has checked that there is one.
    def dispatch_locked(request, session = nil)
      session ||= session_for_locked(request.via || request.held&.session)
      @next_request_id += 1
      request.session = session
      @in_flight[@next_request_id] = request
      field = REQUEST_FIELD.fetch(request.kind)
      session.push(V1::WorkRequest.new(request_id: @next_request_id, field => request.message))
    end

    def send_or_keep_locked(request)
      any_open_locked? ? dispatch_locked(request) : @resend << request
    end

    # A fail or release of a job `via` pushed: counted until answered, resent after a
    # reconnect.
    def send_answer_locked(kind, message, via)
      @answers_unanswered += 1
      request = Request.new(kind, message, nil, nil, true, nil, via)
      request.on_result = ->(result) { on_answer_result(request, result) }
      send_or_keep_locked(request)
    end

    def on_answer_result(request, result)
      return retry_later(request, result) if result.code == UNAVAILABLE

      @mu.synchronize do
        @answers_unanswered -= 1
        if result.code.zero?
          request.kind == :release ? @stats.released += 1 : @stats.failed += 1
        else
          log_refused(request.kind, request.message.job_id, result)
        end
        @cv.broadcast
      end
    end

    # A fail, release or checkpoint save answered UNAVAILABLE: sent again after
    # ANSWER_RETRY_DELAY (or on the next stream if this one ends first); still unanswered.
    def retry_later(request, result)
      @mu.synchronize do
        @log.info("#{request.kind} of #{request.message.job_id} refused for now, sending it " \
                  "again: #{result.message}")
        @refused << request
        schedule_retry_locked
      end
    end

    def schedule_retry_locked
      @retry_at ||= Worker.monotonic + ANSWER_RETRY_DELAY
      @cv.broadcast # the timer thread waits for it
    end

    # Sends again what was answered UNAVAILABLE: the acks first in line, then the fails,
    # releases and checkpoint saves in their order (kept for the next stream if there is none
    # now). A save whose handler gave up on it (its lease is gone) is dropped.
    def resend_refused_locked
      @retry_at = nil
      unless @ack_retry.empty?
        @ack_queue.unshift(*@ack_retry)
        @ack_retry = []
      end
      refused = @refused
      @refused = []
      refused.each do |request|
        next if request.kind == :checkpoint && !@held[request.held.job_id].equal?(request.held)

        send_or_keep_locked(request)
      end
      send_acks_locked
    end

    def queue_ack_locked(ack, via)
      @answers_unanswered += 1
      @ack_queue << PendingAck.new(ack, via)
      send_acks_locked
    end

    # Per stream, one ack message in flight at a time: acks that end meanwhile wait and go out
    # together when it is answered, so a busy worker sends one ack message per round trip on
    # each stream. An ack goes on the stream that pushed its job, else on any open one.
    def send_acks_locked
      @streams.each do |stream|
        break if @ack_queue.empty?
        next unless stream.open && stream.acks_in_flight.nil?

        mine, others = @ack_queue.partition do |pending|
          session_for_locked(pending.via).equal?(stream.session)
        end
        next if mine.empty?

        @ack_queue = mine.drop(ACK_BATCH_MAX) + others
        send_ack_message_locked(stream, mine.first(ACK_BATCH_MAX))
      end
    end

    def send_ack_message_locked(stream, pending)
      stream.acks_in_flight = pending
      @stats.ack_messages += 1
      on_result = ->(result) { on_ack_result(stream, pending, result) }
      acks = pending.map(&:ack)
      request = if acks.size == 1
                  Request.new(:ack, acks.first, nil, on_result, true)
                else
                  Request.new(:ack_batch, V1::AckBatchRequest.new(acks: acks), nil, on_result, true)
                end
      dispatch_locked(request, stream.session)
    end

    def on_ack_result(stream, pending, result)
      @mu.synchronize do
        stream.acks_in_flight = nil if stream.acks_in_flight.equal?(pending)
        item_errors = result.item_errors.to_h { |e| [e.index, e] }
        pending.each_with_index do |entry, i|
          ack = entry.ack
          error = result.code.zero? ? item_errors[i] : result
          if error&.code == UNAVAILABLE
            # Not final: sent again after ANSWER_RETRY_DELAY, still unanswered.
            @log.info("ack of #{ack.job_id} refused for now, sending it again: #{error.message}")
            @ack_retry << entry
            next
          end
          @answers_unanswered -= 1
          if error
            log_refused(:ack, ack.job_id, error)
          else
            @stats.acked += 1
          end
        end
        schedule_retry_locked unless @ack_retry.empty?
        send_acks_locked
        @cv.broadcast
      end
    end

    def log_refused(kind, job_id, result)
      if STALE_LEASE_CODES.include?(result.code)
        @log.info("#{kind} of #{job_id} refused as stale (the broker already ended the " \
                  "attempt): #{result.message}")
      else
        @log.warn("#{kind} of #{job_id} refused (code #{result.code}): #{result.message}")
      end
    end

    def send_progress_locked(held, bytes)
      held.progress_in_flight = true
      request = V1::HeartbeatRequest.new(job_id: held.job_id, lease_id: held.leased.lease_id,
                                         progress: bytes)
      on_result = ->(result) { on_progress_result(held, result) }
      dispatch_locked(Request.new(:progress, request, held, on_result, false))
    end

    def on_progress_result(held, result)
      on_heartbeat_result(held, result)
      @mu.synchronize do
        held.progress_in_flight = false
        waiting = held.progress_waiting
        if waiting && any_open_locked? && @held[held.job_id].equal?(held)
          held.progress_waiting = nil
          send_progress_locked(held, waiting)
        end
      end
    end

    def on_heartbeat_result(held, result)
      if result.code.zero?
        cancel_by_operator(held) if result.cancel_requested
      elsif STALE_LEASE_CODES.include?(result.code)
        @log.warn("heartbeat of #{held.job_id} refused: #{result.message}")
        lose_lease(held.job_id, :lease_lost, only: held)
      end
    end

    def cancel_by_operator(held)
      @log.info("job #{held.job_id} cancelled by an operator")
      held.context.cancel!(:cancel_requested)
    end

    # The Held of `ctx`'s attempt while the worker still holds its lease, else nil.
    def held_of_locked(ctx)
      held = @held[ctx.job_id]
      held if held&.context.equal?(ctx)
    end

    # The broker ended the attempt (lease lost or timed out): stop heartbeating, answer
    # nothing, and cancel the handler if it runs; a job still waiting is just dropped.
    # `only`: the Held a refused heartbeat or save was about; a newer attempt of the same job
    # that arrived meanwhile is not touched. Without it (a lease_lost push, which the stream
    # orders after the job it is about), the job's current attempt.
    def lose_lease(job_id, reason, only: nil)
      held = @mu.synchronize do
        h = @held[job_id]
        next nil if h.nil? || (only && !h.equal?(only))

        @held.delete(job_id)
        @waiting.delete(h)
        @cv.broadcast
        h
      end
      return unless held

      @log.warn("job #{job_id}: #{reason == :timed_out ? 'timed out' : 'lease lost'}")
      held.context.cancel!(reason)
    end

    # Waits for a checkpoint's answer; gives up with Cancelled once the lease is gone or the
    # worker closes its stream (then no answer may ever come).
    def wait_for_answer(ctx, answer)
      loop do
        result = answer.wait(0.05)
        return result if result

        reason = ctx.cancel_reason
        raise Cancelled, reason if %i[lease_lost timed_out].include?(reason)
        raise Cancelled, reason || :shutdown if closing?
      end
    end

    # --- the stream ---

    # Opens the streams of the current grouping, then, each time one ends, waits the backoff
    # (one for the worker, back to its start once a stream subscribes) and regroups. While the
    # grouping has a group for any node (queues whose partition had no leader in the table), it
    # also fetches the table again after each backoff delay and regroups (§5): a node that knows
    # the new leader relays that stream, and no leader change would ever end the relay; the
    # next table shows the leader and the queues move to its own stream. Also while
    # a graceful stop runs (§6): a stream that ends before step 6 is reopened, so that the
    # answers of the handlers finishing in the grace reach the broker (a reopened stream gets
    # flow 0 at once, and what it is pushed is released). Nothing is opened once step 6 began
    # or the run failed; the streams are closed by #graceful_stop or #abort_run.
    def connection_loop
      backoff = @reconnect_initial
      until stopping?
        backoff = @reconnect_initial if regroup
        refresh_in = @any_node_group ? @random.rand * backoff : nil
        ended = wait_for_ended_streams(refresh_in)
        break unless ended

        if ended.empty?
          # The delay passed with a group for any node and no stream ended: where its queues
          # are led may be known now.
          @log.debug("a group of queues goes to any node: asking the cluster's layout again")
          @router.mark_stale
          backoff = [backoff * 2, @reconnect_max].min
          next
        end
        refused = ended.find do |stream|
          code = stream.session.end_code
          !code.nil? && !RETRYABLE_CODES.include?(code)
        end
        if refused
          fatal!(SubscriptionRefused.new(refused.session.end_code, refused.session.end_message))
          break
        end
        ended.each do |stream|
          code = stream.session.end_code
          # The node may have died or stopped leading the queues: the next grouping asks where
          # they are now; without a cluster, one that is down or draining (UNAVAILABLE) is
          # left for the next given address.
          @router.call_failed(stream.target, unavailable: code == UNAVAILABLE)
          @log.warn("stream to #{stream.target.address} ended (code #{code}: " \
                    "#{short(stream.session.end_message)}); reconnecting")
        end
        pause = @random.rand * backoff
        @mu.synchronize do
          wake_at = Worker.monotonic + pause
          @cv.wait(@mu, wake_at - Worker.monotonic) until @closing || Worker.monotonic >= wake_at
          @stats.reconnects += 1
        end
        backoff = [backoff * 2, @reconnect_max].min
      end
    rescue StandardError => e
      fatal!(e)
    end

    # No new stream once step 6 of the stop began or the run failed (a stop in its steps 1-5
    # still reopens: §6).
    def stopping?
      @mu.synchronize { @closing || @fatal }
    end

    # Groups the handled queues by the table (fetched again if a stream ended since), ends the
    # streams whose group is gone and opens the missing ones. True if one subscribed.
    def regroup
      wanted = @router.work_streams(@handlers.keys, max_in_flight)
      # Read by connection_loop only (its thread runs this).
      @any_node_group = StreamGroups.any_node?(wanted.map(&:first))
      retired = @mu.synchronize do
        gone = @streams.reject do |stream|
          stream.retired || wanted.any? { |group, _| group == stream.group }
        end
        gone.each do |stream|
          stream.retired = true
          stream.open = false
        end
        @streams.delete_if { |stream| stream.retired && stream.session.ended? }
        gone
      end
      retired.each do |stream|
        @log.info("regrouping: ending the stream to #{stream.target.address} " \
                  "(#{stream.group.queues.join(',')})")
        # Its held jobs keep running; their answers go on another stream (the leases stay).
        Thread.new { stream.session.close }
      end
      missing = @mu.synchronize do
        wanted.reject { |group, _| @streams.any? { |s| !s.retired && s.group == group } }
      end
      return false if missing.empty? || stopping?

      # Together: a node that does not answer its subscribe must not hold up the others.
      missing.map { |group, target| Thread.new { open_stream(group, target) } }
             .map(&:value).any?
    end

    # Until a stream (not one a regrouping ended) has ended: those, taken out of @streams; nil
    # once step 6 of the stop began or the run failed; [] once `refresh_in` seconds passed
    # (nil: no limit) with none ended.
    def wait_for_ended_streams(refresh_in = nil)
      refresh_at = refresh_in && Worker.monotonic + refresh_in
      @mu.synchronize do
        loop do
          return nil if @closing || @fatal

          ended = @streams.select { |stream| !stream.retired && stream.session.ended? }
          unless ended.empty?
            @streams -= ended
            return ended
          end
          if refresh_at.nil?
            @cv.wait(@mu)
          else
            left = refresh_at - Worker.monotonic
            return [] if left <= 0

            @cv.wait(@mu, left)
          end
        end
      end
    end

    # Step 6 of the stop, and the end of a failed run: every stream half-closed (cancelled
    # after 2 s), together. The caller has set @closing, so open_stream adds no stream after
    # this took them.
    def close_streams
      streams = @mu.synchronize do
        @streams.each { |stream| stream.open = false }
        @streams.dup
      end
      streams.map { |stream| Thread.new { stream.session.close } }.each(&:join)
    end

    # Opens the stream of `group` at `target` and subscribes on it; true once the broker
    # answered OK. False if it did not (the session is then closed, with the refusal's code as
    # its end code, and the connection loop sees it ended).
    def open_stream(group, target)
      session = WorkSession.new(@router.stub(V1::Broker, target, :work), @options.metadata, self)
      stream = Stream.new(group, target, session, false, false, nil)
      answer = Answer.new
      first = @mu.synchronize do
        # Step 6 began (or the run failed) while the table was fetched: close_streams has
        # taken the streams to close, this one would stay open.
        next nil if @closing || @fatal

        @streams << stream
        @next_request_id += 1
        request = Request.new(:subscribe, subscribe_request(group), nil, ->(r) { answer << r },
                              false, session)
        @in_flight[@next_request_id] = request
        V1::WorkRequest.new(request_id: @next_request_id, subscribe: request.message)
      end
      return false unless first

      session.start(first)
      result = wait_for_subscribed(answer)
      if result.nil?
        session.close(0.5)
        @log.warn("no answer to subscribe in #{SUBSCRIBE_TIMEOUT}s") unless closing?
        return false
      end
      return subscribed(stream) if result.code.zero?

      # Refused (UNAVAILABLE: a queue's partition has no leader yet), perhaps with the stream
      # left open: it would never push, so it is ended here, and counts as a stream that ended
      # with the refusal's code (connection_loop then regroups, or moves to the next address,
      # after its backoff, or raises for a code that is the caller's mistake).
      session.close(0.5, code: result.code, message: result.message)
      false
    end

    # The subscribe's answer; nil after SUBSCRIBE_TIMEOUT, or as soon as step 6 of the stop
    # began (the stop must not wait for a node that does not answer).
    def wait_for_subscribed(answer)
      deadline = Worker.monotonic + SUBSCRIBE_TIMEOUT
      loop do
        result = answer.wait([[deadline - Worker.monotonic, 0].max, 0.05].min)
        return result if result
        return nil if closing? || Worker.monotonic >= deadline
      end
    end

    # The stream is up: unanswered answers (and those answered UNAVAILABLE) go out again with
    # their lease ids, then waiting acks and progress; held jobs heartbeat at once. A stream
    # reopened while the worker stops gets flow 0 first (what it is pushed meanwhile is
    # released by on_job).
    def subscribed(stream)
      @mu.synchronize do
        return false if stream.session.ended? || @closing

        stream.open = true
        @log.info("subscribed to #{stream.group.queues.join(',')} at #{stream.target.address} " \
                  "as #{@worker_id}")
        if @stop_taking
          dispatch_locked(Request.new(:flow, V1::FlowRequest.new(max_in_flight: 0)),
                          stream.session)
        end
        flush_locked(refused: true)
        now = Worker.monotonic
        @held.each_value { |held| held.next_heartbeat = now }
        @cv.broadcast
      end
      true
    end

    # Sends on the open streams what waits for one: the answers left unanswered by an ended
    # stream, with `refused` those answered UNAVAILABLE (now, not at @retry_at), the acks, the
    # newest progress of each held job.
    def flush_locked(refused: false)
      return unless any_open_locked?

      resend = @resend
      @resend = []
      resend.each { |request| dispatch_locked(request) }
      resend_refused_locked if refused
      send_acks_locked
      @held.each_value do |held|
        waiting = held.progress_waiting
        next unless waiting && !held.progress_in_flight

        held.progress_waiting = nil
        send_progress_locked(held, waiting)
      end
    end

    # gRPC's messages carry a long debug string: the first sentence is what a reader needs.
    def short(message)
      message.to_s.split(" debug_error_string").first.to_s.lines.first.to_s.strip
    end

    def closing?
      @mu.synchronize { @closing }
    end

    def fatal!(error)
      @mu.synchronize do
        @fatal ||= error
        @cv.broadcast
      end
    end

    # --- handlers ---

    def handler_loop
      while (held = next_job)
        run_one(held)
      end
    rescue StandardError => e
      @log.error("handler thread died: #{e.class}: #{e.message}")
    end

    # The oldest waiting job, or nil once the stop began.
    def next_job
      @mu.synchronize do
        @cv.wait(@mu) while @waiting.empty? && !@stop_taking
        next nil if @stop_taking

        @handlers_running += 1
        @waiting.shift
      end
    end

    def run_one(held)
      ctx = held.context
      value = nil
      error = nil
      begin
        handler = @handlers.fetch(ctx.queue) { raise "no handler for queue #{ctx.queue.inspect}" }
        value = through_middleware(ctx, handler)
        value = result_bytes(value)
      rescue StandardError, ScriptError, SystemStackError => e
        # Never kills the worker: it is the attempt's failure.
        error = e
      end
      finish_job(held, value, error)
    end

    # The handler inside the middleware, first registered outermost.
    def through_middleware(ctx, handler)
      chain = @middleware.reverse.inject(handler) do |inner, middleware|
        ->(job) { middleware.call(job, -> { inner.call(job) }) }
      end
      chain.call(ctx)
    end

    # A String is kept as it is (bytes or UTF-8 text), nil as no result, anything else as JSON.
    def result_bytes(value)
      case value
      when nil then "".b
      when String then value.b
      else JSON.generate(value).b
      end
    end

    def finish_job(held, value, error)
      ctx = held.context
      @mu.synchronize do
        @handlers_running -= 1
        @cv.broadcast
        unless @held[ctx.job_id].equal?(held)
          # Lease lost or timed out: the broker already ended the attempt.
          @log.info("not answering #{ctx.job_id}: the broker already ended its attempt")
          next
        end
        @held.delete(ctx.job_id)
        answer_locked(held, value, error)
      end
    end

    def answer_locked(held, value, error)
      ctx = held.context
      via = held.session
      reason = ctx.cancel_reason
      if reason == :shutdown
        # The stop was not the job's fault: back unstarted, no attempt spent.
        send_answer_locked(:release, release_request(ctx), via)
      elsif error.is_a?(Snooze)
        send_answer_locked(:release, release_request(ctx, error.delay), via)
      elsif error && reason == :cancel_requested
        send_answer_locked(:fail, fail_request(ctx, "cancelled"), via)
      elsif error.is_a?(PermanentError)
        send_answer_locked(:fail, fail_request(ctx, error_text(error), permanent: true), via)
      elsif error.is_a?(RetryAfter)
        send_answer_locked(:fail, fail_request(ctx, error_text(error),
                                               retry_after: Jobbroker.duration(error.delay)), via)
      elsif error
        send_answer_locked(:fail, fail_request(ctx, error_text(error)), via)
      else
        queue_ack_locked(V1::AckRequest.new(job_id: ctx.job_id, lease_id: ctx.lease_id,
                                            result: value), via)
      end
    end

    def error_text(error)
      error.message.to_s.empty? ? error.class.name : error.message
    end

    def fail_request(ctx, text, permanent: false, retry_after: nil)
      V1::FailRequest.new(job_id: ctx.job_id, lease_id: ctx.lease_id, error: text,
                          permanent: permanent, retry_after: retry_after)
    end

    # --- heartbeats and time-outs ---

    def timer_loop
      loop do
        due, timed_out = @mu.synchronize { @closing ? nil : collect_due_locked }
        break unless due

        timed_out.each { |held| lose_lease(held.job_id, :timed_out, only: held) }
        due.each { |held| heartbeat(held) }
      end
    rescue StandardError => e
      @log.error("timer thread died: #{e.class}: #{e.message}")
    end

    # Waits until a heartbeat or time-out is due; returns [due heartbeats, timed-out jobs].
    # Meanwhile sends again, at @retry_at, the answers refused UNAVAILABLE.
    def collect_due_locked
      loop do
        now = Worker.monotonic
        resend_refused_locked if @retry_at && @retry_at <= now
        timed_out = @held.values.select { |h| h.timeout_at && h.timeout_at <= now }
        due = @held.values.select { |h| h.next_heartbeat <= now } - timed_out
        due.each { |h| h.next_heartbeat = now + h.heartbeat_interval }
        return [due, timed_out] unless due.empty? && timed_out.empty?

        next_at = [*@held.values.flat_map { |h| [h.next_heartbeat, h.timeout_at] }, @retry_at]
                  .compact.min
        @cv.wait(@mu, next_at ? [next_at - now, 0.005].max : 1.0)
        return [[], []] if @closing
      end
    end

    def heartbeat(held)
      @mu.synchronize do
        # No stream: not replayed; the held jobs heartbeat as soon as the next one subscribes.
        next unless any_open_locked? && @held[held.job_id].equal?(held)

        request = V1::HeartbeatRequest.new(job_id: held.job_id, lease_id: held.leased.lease_id)
        on_result = ->(result) { on_heartbeat_result(held, result) }
        dispatch_locked(Request.new(:heartbeat, request, held, on_result, false))
      end
    end

    # --- stopping ---

    # The contract's graceful stop (docs/worker-contract.md §6), in its order.
    def graceful_stop
      grace_end = Worker.monotonic + @grace
      @mu.synchronize do
        # 1. Stop taking; 2. release what has not started (on_job releases later pushes).
        @stop_taking = true
        @streams.each do |stream|
          next unless stream.open

          dispatch_locked(Request.new(:flow, V1::FlowRequest.new(max_in_flight: 0)),
                          stream.session)
        end
        @waiting.each do |held|
          @held.delete(held.job_id)
          send_answer_locked(:release, release_request(held.leased), held.session)
        end
        @waiting.clear
        @cv.broadcast
        # 3. Grace: running handlers finish, their answers go out as usual.
        wait_locked(grace_end) { @handlers_running.zero? }
      end
      # 4. Cancel: what still runs is cancelled, and its job released when it ends.
      still_running = @mu.synchronize { @held.values }
      unless still_running.empty?
        @log.warn("grace over: cancelling #{still_running.size} running job(s)")
        still_running.each { |held| held.context.cancel!(:shutdown) }
      end
      # 5. Wait for the answers, at most 1 s past the grace.
      @mu.synchronize do
        wait_locked(grace_end + 1) { @handlers_running.zero? && @answers_unanswered.zero? }
        @log.warn("#{@answers_unanswered} answer(s) unanswered at stop") unless
          @answers_unanswered.zero?
        @closing = true
        @cv.broadcast
      end
      # 6. Every stream half-closed, cancelled after 2 s; none is opened from now on. The
      # connection thread ends at once, unless it waits for a GetCluster answer: that one is
      # not waited for past a short bound (it opens nothing after its answer).
      close_streams
      @log.warn("the connection thread is still waiting for the cluster's layout") unless
        @connection_thread.join(CONNECTION_JOIN)
      @timer_thread.join
      @handler_threads.each { |t| t.join(0.1) }
    end

    def wait_locked(deadline)
      until yield
        left = deadline - Worker.monotonic
        break if left <= 0

        @cv.wait(@mu, left)
      end
    end

    # A refused subscription: nothing to finish gracefully, cancel everything and raise.
    def abort_run(error)
      @mu.synchronize do
        @stop_taking = true
        @closing = true
        @held.each_value { |held| held.context.cancel!(:shutdown) }
        @cv.broadcast
      end
      @connection_thread.join(5)
      close_streams
      @timer_thread.join(5)
      @handler_threads.each { |t| t.join(0.1) }
      raise error
    end
  end
end
