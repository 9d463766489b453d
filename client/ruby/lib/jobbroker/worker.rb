# frozen_string_literal: true

require "json"
require "logger"
require "socket"

module Jobbroker
  # Raise it from a handler to fail the job with no retry: it dies FAILED with
  # FAIL_REASON_PERMANENT (a bad address, a validation error: what another attempt cannot fix).
  class PermanentError < StandardError; end

  # Raise it from a handler to fail the attempt and ask for the next one after `delay` seconds
  # instead of the queue's computed backoff (e.g. a provider's Retry-After).
  class RetryAfter < StandardError
    attr_reader :delay

    def initialize(delay, message = nil)
      @delay = delay
      super(message || "retry after #{delay}s")
    end
  end

  # The broker refused the Work subscription (e.g. INVALID_ARGUMENT for a bad queue name).
  # #code is the gRPC status code (GRPC::Core::StatusCodes).
  class SubscriptionRefused < StandardError
    attr_reader :code

    def initialize(code, message)
      @code = code
      super("subscription refused (code #{code}): #{message}")
    end
  end

  # What a handler sees of the job it runs. Thread-safe.
  class JobContext
    attr_reader :job_id, :lease_id, :queue, :payload, :headers, :attempt, :max_attempts,
                :idempotency_key, :checkpoint, :enqueued_at

    def initialize(leased)
      @job_id = leased.job_id
      @lease_id = leased.lease_id
      @queue = leased.queue
      @payload = leased.payload.b.freeze
      @headers = leased.headers.to_h.freeze
      @attempt = leased.attempt
      @max_attempts = leased.max_attempts
      @idempotency_key = leased.idempotency_key
      @checkpoint = leased.checkpoint.b.freeze
      @enqueued_at = Jobbroker.to_time(leased.enqueued_at)
      @cancel_reason = nil
    end

    # The payload parsed as JSON.
    def json
      JSON.parse(@payload)
    end

    # The payload as UTF-8 text.
    def text
      @payload.dup.force_encoding(Encoding::UTF_8)
    end

    # True once the lease was lost, an operator cancelled the job, or the worker is stopping
    # past its grace period: stop soon (the handler's outcome is still reported).
    def cancelled?
      !@cancel_reason.nil?
    end

    # Why the job was cancelled (:lease_lost, :cancel_requested, :shutdown), or nil.
    attr_reader :cancel_reason

    # Internal: set by the worker.
    def cancel!(reason)
      @cancel_reason ||= reason
    end
  end

  # Runs a handler for every job pushed over one Broker.Work stream: `concurrency` jobs at a
  # time, heartbeats while they run (every third of the lease), ack when the handler returns,
  # fail when it raises (PermanentError: no retry; RetryAfter: the given delay), reconnects with
  # backoff when the stream breaks, and stops gracefully.
  #
  #   worker = Jobbroker::Worker.new(queues: ["emails"], concurrency: 4) do |job|
  #     send_email(job.json, idempotency_key: job.idempotency_key)
  #   end
  #   worker.trap_signals          # SIGTERM/SIGINT -> graceful stop
  #   worker.run                   # blocks until stopped
  #
  # The handler's return value is kept as the job's result when it is a String.
  # #run and #stop may be called from different threads; #stop must not be called from a
  # signal trap (use #trap_signals, which does it from a thread).
  class Worker
    Stats = Struct.new(:acked, :failed, :released, :reconnects)

    attr_reader :worker_id, :stats

    # queues:          queue names to take jobs from.
    # address:         "host:port" (default $JOBBROKER_ADDRESS, else 127.0.0.1:7070).
    # concurrency:     handlers run at once.
    # prefetch:        jobs held ready beyond `concurrency` (max_in_flight = concurrency +
    #                  prefetch). They hold heartbeated leases while they wait; a graceful stop
    #                  releases them unstarted.
    # lease_duration:  seconds asked for each lease; nil = the job's, else the queue's.
    # grace:           seconds #run waits for running handlers after a stop before it marks
    #                  them cancelled.
    # reconnect_initial / reconnect_max: reconnect backoff in seconds (doubling).
    def initialize(queues:, address: Jobbroker.default_address, concurrency: 1, prefetch: 0,
                   worker_id: "#{Socket.gethostname}-#{Process.pid}", lease_duration: nil,
                   grace: 30, reconnect_initial: 0.1, reconnect_max: 5.0,
                   logger: Logger.new($stderr, progname: "jobbroker-worker"), &handler)
      raise ArgumentError, "a handler block is required" unless handler
      raise ArgumentError, "concurrency must be at least 1" if concurrency < 1

      @queues = Array(queues).map(&:to_s)
      @address = address
      @concurrency = concurrency
      @prefetch = prefetch
      @worker_id = worker_id
      @lease_duration = lease_duration
      @grace = grace
      @reconnect_initial = reconnect_initial
      @reconnect_max = reconnect_max
      @log = logger
      @handler = handler
      @stub = V1::Broker::Stub.new(address, :this_channel_is_insecure)
      @stats = Stats.new(0, 0, 0, 0)

      @mu = Mutex.new
      @cv = ConditionVariable.new
      @stopping = false
      @draining = false
      @held = {}    # job_id => HeldJob: every job received and not yet answered
      @waiting = [] # job_ids received but not started, oldest first
    end

    # Connects and runs jobs until #stop, then drains and returns. Raises SubscriptionRefused
    # if the broker refuses the subscription; an unreachable broker is retried with backoff.
    def run
      threads = Array.new(@concurrency) { Thread.new { handler_loop } }
      threads << Thread.new { heartbeat_loop }
      session = nil
      backoff = @reconnect_initial
      until stopping?
        session = Session.new(self, @stub, @log)
        begin
          session.open(subscribe_request)
          backoff = @reconnect_initial
          @log.info("subscribed to #{@queues.join(',')} as #{@worker_id}")
          @mu.synchronize { @cv.wait(@mu) until @stopping || session.closed? }
        rescue SubscriptionRefused
          stop
          session.close
          finish(threads, nil)
          raise
        rescue GRPC::BadStatus => e
          @log.warn("stream failed: #{e.class}: #{e.details}")
        rescue StandardError => e
          @log.warn("stream failed: #{e.class}: #{e.message}")
        end
        break if stopping? && !session.closed?

        session.close
        session = nil
        @log.warn("stream closed; reconnecting in #{backoff}s") unless stopping?
        wake_at = monotonic + backoff
        @mu.synchronize do
          @cv.wait(@mu, wake_at - monotonic) while !@stopping && monotonic < wake_at
          @stats.reconnects += 1 unless @stopping
        end
        backoff = [backoff * 2, @reconnect_max].min
      end
      finish(threads, session)
      @log.info("stopped: #{@stats.to_h}")
      nil
    end

    # Asks #run to stop gracefully: no new jobs (Flow 0), unstarted ones released, running ones
    # finished. Returns at once. Safe from any thread, not from a trap handler.
    def stop
      @mu.synchronize do
        @stopping = true
        @cv.broadcast
      end
    end

    # Installs traps that call #stop for the given signals.
    def trap_signals(*signals)
      signals = %w[TERM INT] if signals.empty?
      signals.each { |sig| Signal.trap(sig) { Thread.new { stop } } }
      self
    end

    # --- called by Session on its reader thread (must not block) ---

    def on_job(session, leased)
      release_now = false
      @mu.synchronize do
        if @stopping
          release_now = true
        else
          # Heartbeats start now: a prefetched job's lease must survive its wait too.
          lease_len = Jobbroker.to_time(leased.lease_deadline) - Time.now
          interval = [lease_len / 3.0, 0.05].max
          @held[leased.job_id] = HeldJob.new(session, leased, JobContext.new(leased), interval,
                                             monotonic + interval)
          @waiting << leased.job_id
          @cv.broadcast
        end
      end
      return unless release_now

      session.send_request(release: release_req(leased)) { |r| count_release(leased.job_id, r) }
    end

    def on_lease_lost(job_id)
      @mu.synchronize do
        # A job that has not started is simply dropped; a running one is told to stop.
        @held.delete(job_id) if @waiting.delete(job_id)
        @held[job_id]&.context&.cancel!(:lease_lost)
      end
      @log.warn("lease lost: #{job_id}")
    end

    def on_cancel(job_id)
      @mu.synchronize { @held[job_id]&.context&.cancel!(:cancel_requested) }
    end

    def session_closed
      @mu.synchronize { @cv.broadcast }
    end

    private

    HeldJob = Struct.new(:session, :leased, :context, :interval, :next_heartbeat)

    def stopping?
      @mu.synchronize { @stopping }
    end

    def monotonic
      Process.clock_gettime(Process::CLOCK_MONOTONIC)
    end

    def subscribe_request
      V1::SubscribeRequest.new(queues: @queues, worker_id: @worker_id,
                               max_in_flight: @concurrency + @prefetch,
                               lease_duration: Jobbroker.duration(@lease_duration))
    end

    def release_req(leased)
      V1::ReleaseRequest.new(job_id: leased.job_id, lease_id: leased.lease_id)
    end

    def count_release(job_id, result)
      if result.code.zero?
        @mu.synchronize { @stats.released += 1 }
      else
        @log.warn("release of #{job_id} refused: #{result.message}")
      end
    end

    # Graceful end: Flow 0, release what has not started, let handlers finish, close.
    def finish(threads, session)
      releases = []
      @mu.synchronize do
        @stopping = true
        @draining = true
        releases = @waiting.map { |id| @held.delete(id) }
        @waiting = []
        @cv.broadcast
      end
      if session && !session.closed?
        session.send_request(flow: V1::FlowRequest.new(max_in_flight: 0))
      end
      waits = releases.map do |held|
        held.session.send_request(release: release_req(held.leased)) do |r|
          count_release(held.leased.job_id, r)
        end
      end
      waits.zip(releases).each do |w, held|
        leased = held.leased
        r = w.wait(10)
        next unless r.nil? || !r.code.zero?

        # The stream could not carry it: the unary call can.
        count_release(leased.job_id, unary(:release, release_req(leased)))
      end
      handlers = threads[0...@concurrency]
      deadline = monotonic + @grace
      handlers.each { |t| t.join([deadline - monotonic, 0].max) }
      if handlers.any?(&:alive?)
        @log.warn("grace period over: cancelling running jobs")
        @mu.synchronize { @held.each_value { |h| h.context.cancel!(:shutdown) } }
        handlers.each { |t| t.join(5) }
      end
      @mu.synchronize do
        @held.clear
        @cv.broadcast
      end
      threads.last.join(5)
      session&.close
    end

    def handler_loop
      loop do
        item = @mu.synchronize do
          @cv.wait(@mu) while @waiting.empty? && !@stopping
          @stopping ? nil : @held[@waiting.shift]
        end
        break unless item

        run_one(item)
      end
    rescue StandardError => e
      @log.error("handler thread died: #{e.class}: #{e.message}")
    end

    def run_one(held)
      ctx = held.context
      if ctx.cancel_reason == :lease_lost # its lease ran out while it waited
        @mu.synchronize { @held.delete(ctx.job_id) }
        return
      end
      answer = begin
        value = @handler.call(ctx)
        result = value.is_a?(String) ? value.b : "".b
        { ack: V1::AckRequest.new(job_id: ctx.job_id, lease_id: ctx.lease_id, result: result) }
      rescue PermanentError => e
        { fail: fail_req(ctx, e, permanent: true) }
      rescue RetryAfter => e
        { fail: fail_req(ctx, e, retry_after: Jobbroker.duration(e.delay)) }
      rescue StandardError => e
        { fail: fail_req(ctx, e) }
      end
      session = held.session
      @mu.synchronize { @held.delete(ctx.job_id) }
      if ctx.cancel_reason == :lease_lost
        @log.warn("not answering #{ctx.job_id}: its lease was lost")
        return
      end
      deliver(session, answer, ctx)
    end

    def fail_req(ctx, error, permanent: false, retry_after: nil)
      text = error.message.to_s.empty? ? error.class.name : error.message
      V1::FailRequest.new(job_id: ctx.job_id, lease_id: ctx.lease_id, error: text,
                          permanent: permanent, retry_after: retry_after)
    end

    # Sends the ack/fail over the job's stream and waits for its result; if that stream is
    # gone, uses the unary call (the lease outlives the stream).
    def deliver(session, answer, ctx)
      kind = answer.keys.first
      result = session.send_request(**answer).wait(30)
      # The stream broke before the answer: the lease outlives it, so use the unary call.
      result = unary(kind, answer[kind]) if result.nil? || (!result.code.zero? && session.closed?)
      if result.code.zero?
        @mu.synchronize { kind == :ack ? @stats.acked += 1 : @stats.failed += 1 }
      else
        @log.warn("#{kind} of #{ctx.job_id} refused (code #{result.code}): #{result.message}")
      end
    end

    def unary(kind, req)
      @stub.public_send(kind, req, deadline: Time.now + 30)
      V1::WorkResult.new(code: 0)
    rescue GRPC::BadStatus => e
      V1::WorkResult.new(code: e.code, message: e.details)
    end

    # One thread heartbeats every running job once a third of its lease has passed.
    def heartbeat_loop
      loop do
        due = []
        done = @mu.synchronize do
          next true if @draining && @held.empty?

          now = monotonic
          @held.each_value do |r|
            next if now < r.next_heartbeat

            r.next_heartbeat = now + r.interval
            due << r
          end
          next_at = @held.values.map(&:next_heartbeat).min
          @cv.wait(@mu, next_at ? [next_at - now, 0.01].max : 1.0) if due.empty?
          false
        end
        break if done

        due.each { |r| heartbeat(r) }
      end
    rescue StandardError => e
      @log.error("heartbeat thread died: #{e.class}: #{e.message}")
    end

    def heartbeat(held)
      req = V1::HeartbeatRequest.new(job_id: held.leased.job_id, lease_id: held.leased.lease_id)
      ctx = held.context
      handle = lambda do |result|
        if result.code.zero?
          ctx.cancel!(:cancel_requested) if result.cancel_requested
        elsif result.code == GRPC::Core::StatusCodes::FAILED_PRECONDITION
          ctx.cancel!(:lease_lost)
          @log.warn("heartbeat of #{ctx.job_id} refused: #{result.message}")
        end
      end
      if held.session.closed?
        begin
          resp = @stub.heartbeat(req, deadline: Time.now + 10)
          handle.call(V1::WorkResult.new(code: 0, cancel_requested: resp.cancel_requested))
        rescue GRPC::BadStatus => e
          handle.call(V1::WorkResult.new(code: e.code, message: e.details))
        end
      else
        held.session.send_request(heartbeat: req, &handle)
      end
    end

    # One Work stream: a request queue feeding gRPC, a reader thread dispatching responses.
    class Session
      # A result some thread may wait for.
      class Pending
        def initialize(&callback)
          @mu = Mutex.new
          @cv = ConditionVariable.new
          @result = nil
          @callback = callback
        end

        def call(result)
          @callback&.call(result)
          @mu.synchronize do
            @result = result
            @cv.broadcast
          end
        end

        # The WorkResult, or nil after `timeout` seconds.
        def wait(timeout)
          deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + timeout
          @mu.synchronize do
            while @result.nil?
              left = deadline - Process.clock_gettime(Process::CLOCK_MONOTONIC)
              break if left <= 0

              @cv.wait(@mu, left)
            end
            @result
          end
        end
      end

      def initialize(worker, stub, log)
        @worker = worker
        @stub = stub
        @log = log
        @out = Queue.new
        @mu = Mutex.new
        @pending = {}
        @next_id = 0
        @closed = false
      end

      def closed?
        @mu.synchronize { @closed }
      end

      # Starts the stream and subscribes; raises SubscriptionRefused or the stream's error.
      def open(subscribe)
        out = @out
        requests = Enumerator.new do |y|
          while (req = out.pop)
            y << req
          end
        end
        @op = @stub.work(requests, return_op: true)
        responses = @op.execute
        @reader = Thread.new { read_loop(responses) }
        result = send_request(subscribe: subscribe).wait(30)
        raise GRPC::DeadlineExceeded, "no answer to subscribe" if result.nil?
        return if result.code.zero?

        if result.code == GRPC::Core::StatusCodes::UNAVAILABLE
          raise GRPC::Unavailable, result.message
        end

        raise SubscriptionRefused.new(result.code, result.message)
      end

      # Sends one request; the block (if any) gets its WorkResult. Returns a Pending.
      def send_request(**fields, &callback)
        pending = Pending.new(&callback)
        closed = @mu.synchronize do
          @closed ||= @out.closed?
          unless @closed
            @next_id += 1
            @pending[@next_id] = pending
            @out << V1::WorkRequest.new(request_id: @next_id, **fields)
          end
          @closed
        end
        pending.call(V1::WorkResult.new(code: GRPC::Core::StatusCodes::UNAVAILABLE,
                                        message: "stream closed")) if closed
        pending
      end

      # Half-closes the stream and waits briefly for the broker to end it, then cancels.
      def close
        @out.close
        return unless @reader

        @op.cancel unless @reader.join(5)
        @reader.join(5)
      end

      private

      def read_loop(responses)
        code = GRPC::Core::StatusCodes::UNAVAILABLE
        message = "stream ended"
        responses.each do |resp|
          case resp.response
          when :job then @worker.on_job(self, resp.job)
          when :result
            pending = @mu.synchronize { @pending.delete(resp.result.request_id) }
            pending&.call(resp.result)
          when :lease_lost then @worker.on_lease_lost(resp.lease_lost.job_id)
          when :cancel_requested then @worker.on_cancel(resp.cancel_requested.job_id)
          end
        end
      rescue GRPC::BadStatus => e
        code = e.code
        message = e.details
      rescue StandardError => e
        message = "#{e.class}: #{e.message}"
      ensure
        left = @mu.synchronize do
          @closed = true
          @pending.values.tap { @pending.clear }
        end
        @out.close
        left.each { |p| p.call(V1::WorkResult.new(code: code, message: message)) }
        @worker.session_closed
      end
    end
  end
end
