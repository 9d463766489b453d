# frozen_string_literal: true

require "json"
require "monitor"
require "securerandom"
require "jobbroker"

module Jobbroker
  # Test your code without a broker, in the habit of Sidekiq::Testing:
  #
  #   require "jobbroker/testing"
  #
  #   Jobbroker::Testing.fake!            # enqueues are recorded in memory, nothing is sent
  #   SignupService.call(user)            # calls client.enqueue("emails", {...}) somewhere
  #   assert_equal 1, Jobbroker::Testing.jobs("emails").size
  #   assert_equal "a@example.com", Jobbroker::Testing.jobs("emails").first.json["to"]
  #   Jobbroker::Testing.drain("emails")  # runs them through the registered handlers
  #
  #   Jobbroker::Testing.inline! do       # every enqueue runs its handler before it returns
  #     SignupService.call(user)
  #   end
  #
  # While faking (fake! or inline!), Client#enqueue and #enqueue_batch of every Client build
  # their requests and run the producer middleware as usual, then hand the jobs to this module
  # instead of the broker; they return EnqueueResponses with made-up job ids (a dedup_key seen
  # before returns the first job's id, deduplicated: true). Every other call still goes to a
  # broker. disable! (the default) sends everything again.
  #
  # Handlers: every Worker#handle(queue) also registers its handler (with that worker's
  # middleware) here, the last one per queue winning, so building the app's worker in a test is
  # enough; Testing.handle(queue) { |job| ... } registers one directly. The handler gets a
  # JobContext as on a real worker (json, headers, attempt 1, step, progress; Testing.progress
  # and the job's #checkpoint record what they sent).
  #
  # Errors: an exception of the handler propagates out of #drain (or, inline, out of enqueue),
  # as Sidekiq's do; the job is then no longer pending. Jobbroker::PermanentError, RetryAfter and
  # Snooze propagate too: there is no broker to retry or snooze. run_at, delay, depends_on and
  # the queue's policy are recorded but not waited for: drain runs every pending job.
  module Testing
    # A job recorded while faking.
    class FakeJob
      attr_reader :job_id, :request, :enqueued_at
      # :pending, then :completed (result holds the handler's result as bytes) or :failed
      # (error holds the exception).
      attr_accessor :state, :result, :error, :checkpoint, :progress

      def initialize(job_id, request)
        @job_id = job_id
        @request = request
        @enqueued_at = Time.now
        @state = :pending
        @checkpoint = "".b
        @progress = []
      end

      def queue
        @request.queue
      end

      # The payload bytes as the broker would have stored them.
      def payload
        @request.payload
      end

      # The payload parsed as JSON.
      def json
        JSON.parse(payload)
      end

      def text
        payload.dup.force_encoding(Encoding::UTF_8)
      end

      def headers
        @request.headers.to_h
      end

      def priority
        @request.priority
      end

      def dedup_key
        @request.dedup_key
      end

      def max_attempts
        @request.max_attempts
      end

      # When the job was meant to run: run_at, or enqueued_at plus delay; nil for at once.
      def run_at
        return Jobbroker.to_time(@request.run_at) if @request.run_at
        return @enqueued_at + (@request.delay.seconds + @request.delay.nanos / 1e9) if @request.delay

        nil
      end

      # The dedup key when there is one, else the job id (as the broker's).
      def idempotency_key
        dedup_key.empty? ? job_id : dedup_key
      end

      def inspect
        "#<Jobbroker::Testing::FakeJob #{job_id} queue=#{queue} state=#{state} " \
          "payload=#{payload.bytesize}B>"
      end
    end

    # What a JobContext reports to while faking: records progress and checkpoints on the job.
    class FakeReporter
      def initialize(job)
        @job = job
      end

      def send_progress(_ctx, bytes)
        @job.progress << bytes
      end

      def save_checkpoint(_ctx, bytes)
        @job.checkpoint = bytes
      end
    end

    # No handler is registered for the queue of a job being run.
    class NoHandler < StandardError; end

    MODES = %i[disabled fake inline].freeze

    @mu = Monitor.new
    @mode = :disabled
    @pending = [] # FakeJobs not yet run, in enqueue order
    @recorded = {} # job id => FakeJob, every job since the last clear!
    @dedup = {} # dedup key => job id
    @handlers = {} # queue => [handler, worker or nil]

    class << self
      # :disabled, :fake or :inline.
      def mode
        @mu.synchronize { @mode }
      end

      # Records enqueues in memory; with a block, only while it runs (the mode before is
      # restored after).
      def fake!(&block)
        switch(:fake, &block)
      end

      # Runs each enqueued job's handler before enqueue returns; with a block, only while it
      # runs.
      def inline!(&block)
        switch(:inline, &block)
      end

      # Sends enqueues to the broker again (the default); with a block, only while it runs.
      def disable!(&block)
        switch(:disabled, &block)
      end

      def fake?
        mode == :fake
      end

      def inline?
        mode == :inline
      end

      # True while enqueues are faked (fake! or inline!).
      def enabled?
        mode != :disabled
      end

      # The jobs not yet run, in enqueue order: of `queue`, or of every queue.
      def jobs(queue = nil)
        @mu.synchronize do
          queue.nil? ? @pending.dup : @pending.select { |j| j.queue == queue.to_s }
        end
      end

      # The pending jobs by queue name.
      def queues
        jobs.group_by(&:queue)
      end

      # Every job recorded since the last clear!, run or not, by job id (nil when unknown).
      def find(job_id)
        @mu.synchronize { @recorded[job_id] }
      end

      # Forgets the pending jobs of `queue`, or every recorded job and dedup key.
      def clear!(queue = nil)
        @mu.synchronize do
          if queue
            @pending.reject! { |j| j.queue == queue.to_s }
          else
            @pending.clear
            @recorded.clear
            @dedup.clear
          end
        end
        nil
      end

      # clear!, forgets every registered handler and disables faking.
      def reset!
        @mu.synchronize do
          clear!
          @handlers.clear
          @mode = :disabled
        end
        nil
      end

      # Registers a handler for `queue` for tests (no middleware). Worker#handle does this too.
      def handle(queue, &handler)
        raise ArgumentError, "handle(#{queue.inspect}) needs a block" unless handler

        register(queue, handler, nil)
      end

      # Runs the pending jobs of `queue` (or of every queue) through their handlers, jobs those
      # handlers enqueue included, until none is left; highest priority first, then in enqueue
      # order. Returns how many ran. A handler's exception propagates (that job is no longer
      # pending; the others stay).
      def drain(queue = nil)
        count = 0
        while (job = take(queue))
          perform(job)
          count += 1
        end
        count
      end

      # Runs one pending job (a FakeJob from #jobs). Returns the handler's result as bytes.
      def run(job)
        @mu.synchronize { @pending.delete(job) }
        perform(job)
      end

      # --- used by Client and Worker while this file is loaded ---

      # Internal: Worker#handle's registration.
      def register(queue, handler, worker)
        @mu.synchronize { @handlers[queue.to_s] = [handler, worker] }
        nil
      end

      # Internal: Client's enqueue while faking. Returns the EnqueueResponses.
      def enqueue(requests)
        responses = []
        fresh = []
        @mu.synchronize do
          requests.each do |request|
            existing = request.dedup_key.empty? ? nil : @dedup[request.dedup_key]
            if existing
              responses << V1::EnqueueResponse.new(job_id: existing, deduplicated: true)
              next
            end
            job = FakeJob.new(SecureRandom.uuid, request.dup)
            @recorded[job.job_id] = job
            @dedup[request.dedup_key] = job.job_id unless request.dedup_key.empty?
            @pending << job
            fresh << job
            responses << V1::EnqueueResponse.new(job_id: job.job_id, deduplicated: false)
          end
        end
        fresh.each { |job| run(job) } if inline?
        responses
      end

      private

      def switch(new_mode)
        raise ArgumentError, "unknown mode #{new_mode}" unless MODES.include?(new_mode)

        before = nil
        @mu.synchronize do
          before = @mode
          @mode = new_mode
        end
        return nil unless block_given?

        begin
          yield
        ensure
          @mu.synchronize { @mode = before }
        end
      end

      def take(queue)
        @mu.synchronize do
          candidates = queue.nil? ? @pending : @pending.select { |j| j.queue == queue.to_s }
          # max_by keeps the first of equals: enqueue order within one priority.
          job = candidates.max_by(&:priority)
          @pending.delete(job) if job
          job
        end
      end

      def perform(job)
        handler, worker = @mu.synchronize { @handlers[job.queue] }
        unless handler
          job.state = :failed
          job.error = NoHandler.new("no handler registered for queue #{job.queue.inspect}: " \
                                    "build the worker (Worker#handle) or call " \
                                    "Jobbroker::Testing.handle(queue) first")
          raise job.error
        end

        ctx = JobContext.new(leased(job), FakeReporter.new(job))
        begin
          value = worker ? worker.send(:through_middleware, ctx, handler) : handler.call(ctx)
        rescue StandardError, ScriptError => e
          job.state = :failed
          job.error = e
          raise
        end
        job.result = result_bytes(value)
        job.state = :completed
        job.result
      end

      def leased(job)
        r = job.request
        V1::LeasedJob.new(
          job_id: job.job_id, lease_id: "fake-lease-#{job.job_id}", queue: r.queue,
          payload: r.payload, headers: r.headers.to_h, attempt: 1, max_attempts: r.max_attempts,
          idempotency_key: job.idempotency_key, checkpoint: job.checkpoint,
          enqueued_at: Jobbroker.timestamp(job.enqueued_at),
          lease_deadline: Jobbroker.timestamp(Time.now + 60)
        )
      end

      def result_bytes(value)
        case value
        when nil then "".b
        when String then value.b
        else JSON.generate(value).b
        end
      end
    end

    # Prepended to Client: enqueue and enqueue_batch go to Testing while faking.
    module ClientHook
      private

      # While faking, each enqueue is recorded (or, inline, run) before it returns, as without
      # coalescing: a batch would defer it, and an inline handler that enqueues could wait for
      # the batch its own call is in.
      def send_enqueue(job, deadline, batch)
        super(job, deadline, batch && !Testing.enabled?)
      end

      def unary(service, method, request, **kwargs)
        return super unless Testing.enabled? && service == V1::Broker

        case method
        when :enqueue then Testing.enqueue([request]).first
        when :enqueue_batch
          V1::EnqueueBatchResponse.new(results: Testing.enqueue(request.jobs.to_a))
        else super
        end
      end
    end

    # Prepended to Worker: every handler registered is a handler here too.
    module WorkerHook
      def handle(queue, &handler)
        result = super
        Testing.register(queue, handler, self)
        result
      end
    end
  end

  Client.prepend(Testing::ClientHook)
  Worker.prepend(Testing::WorkerHook)
end
