# frozen_string_literal: true

require "json"

module Jobbroker
  # Raise it from a handler to fail the job with no retry: it dies FAILED with
  # FAIL_REASON_PERMANENT (a bad address, a validation error: what another attempt cannot fix).
  class PermanentError < StandardError; end

  # The contract's name for PermanentError.
  Permanent = PermanentError

  # Raise it from a handler to fail the attempt and ask for the next one after `delay` seconds
  # instead of the queue's computed backoff (e.g. a provider's Retry-After).
  class RetryAfter < StandardError
    attr_reader :delay

    def initialize(delay, message = nil)
      @delay = delay
      super(message || "retry after #{delay}s")
    end
  end

  # Raise it from a handler to give the job back without spending an attempt: it is SCHEDULED
  # `delay` seconds later and its Job.snoozes counts one more (the queue's max_snoozes bounds it).
  class Snooze < StandardError
    attr_reader :delay

    def initialize(delay)
      @delay = delay
      super("snoozed for #{delay}s")
    end
  end

  # Raised inside a handler by JobContext#sleep, #step and #check_cancelled! once the job was
  # cancelled. #reason says why: :cancel_requested (an operator cancelled the job), :lease_lost,
  # :timed_out (the attempt reached LeasedJob.timeout_at) or :shutdown (a graceful stop ran past
  # its grace). What the worker answers depends on the reason, not on how the handler ends.
  class Cancelled < StandardError
    attr_reader :reason

    def initialize(reason)
      @reason = reason
      super("job cancelled: #{reason}")
    end
  end

  # The job's checkpoint is not a jobbroker.v1.StepCheckpoint: something other than durable
  # steps wrote it, so steps cannot resume from it and the attempt fails rather than run them
  # again.
  class StepCheckpointError < StandardError; end

  # The broker refused to save a durable step's result (other than for a lost lease, which is
  # Cancelled): the attempt fails, the step will run again on the next one.
  class StepSaveError < StandardError; end

  # What a handler sees of the one attempt it runs. The readers are frozen values; #progress,
  # #step, #sleep and #check_cancelled! are for the handler's own thread (progress may be called
  # from any thread).
  class JobContext
    attr_reader :job_id, :lease_id, :queue, :payload, :headers, :attempt, :max_attempts,
                :idempotency_key, :checkpoint, :enqueued_at, :lease_deadline, :timeout_at,
                :dependency_results

    # `worker` carries progress and checkpoints to the broker (see Worker#send_progress and
    # Worker#save_checkpoint); tests may pass any object with those two methods.
    def initialize(leased, worker)
      @worker = worker
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
      @lease_deadline = Jobbroker.to_time(leased.lease_deadline)
      @timeout_at = Jobbroker.to_time(leased.timeout_at)
      @dependency_results = leased.dependency_results.to_h.transform_values(&:b).freeze
      @cancel_mu = Mutex.new
      @cancel_cv = ConditionVariable.new
      @cancel_reason = nil
      @saved_steps = nil # name => JSON bytes, decoded from @checkpoint on the first step
      @step_checkpoint = nil
      @step_names_used = {}
    end

    # The payload parsed as JSON.
    def json
      JSON.parse(@payload)
    end

    # The payload as UTF-8 text.
    def text
      @payload.dup.force_encoding(Encoding::UTF_8)
    end

    # True once an operator cancelled the job, its lease was lost, its time-out came or a stop
    # ran past its grace. Code that does not call #sleep, #step or #check_cancelled! should
    # look at it: the worker cannot stop a handler that ignores it, and the handler keeps its
    # slot until it returns.
    def cancelled?
      !@cancel_reason.nil?
    end

    # Why the job was cancelled (see Cancelled#reason), or nil.
    attr_reader :cancel_reason

    # Raises Cancelled if the job was cancelled.
    def check_cancelled!
      reason = @cancel_reason
      raise Cancelled, reason if reason
    end

    # Sleeps `seconds`, waking at once to raise Cancelled when the job is cancelled meanwhile.
    def sleep(seconds)
      deadline = Worker.monotonic + seconds
      @cancel_mu.synchronize do
        until @cancel_reason
          left = deadline - Worker.monotonic
          return nil if left <= 0

          @cancel_cv.wait(@cancel_mu, left)
        end
      end
      raise Cancelled, @cancel_reason
    end

    # Reports progress: a String is sent as it is, anything else as JSON. It goes out at once;
    # while an earlier value is unanswered the newest one waits for that answer (values in
    # between are dropped, the newest always arrives). Admin.WatchJob shows it.
    def progress(value)
      @worker.send_progress(self, value.is_a?(String) ? value.b : JSON.generate(value).b)
      nil
    end

    # A durable step: runs the block once per job, across attempts and worker processes (of any
    # language: the checkpoint is a jobbroker.v1.StepCheckpoint with UTF-8 JSON results).
    #
    # If an earlier attempt finished the step `name`, returns its saved result without running
    # the block. Else runs it, saves its value as JSON in the job's checkpoint, waits until the
    # broker stored it, and returns the value as JSON decodes it (so a first run and a replay
    # return the same thing: Hash keys become Strings). Raises Cancelled if the job was
    # cancelled (before running the block, or when the save found the lease lost),
    # ArgumentError for an empty name or one used twice, StepCheckpointError for a checkpoint
    # durable steps did not write, StepSaveError when the broker refused the save; an exception
    # of the block propagates (finished steps stay saved).
    def step(name)
      raise ArgumentError, "a durable step needs a block" unless block_given?

      name = name.to_s
      raise ArgumentError, "a durable step needs a non-empty name" if name.empty?
      if @step_names_used[name]
        raise ArgumentError, "durable step #{name.inspect} was used twice in one job: " \
                             "step names must be unique within a job"
      end

      @step_names_used[name] = true
      check_cancelled!
      saved = saved_steps
      return JSON.parse(saved[name]) if saved.key?(name)

      encoded = JSON.generate(yield).b
      saved[name] = encoded
      @step_checkpoint.steps << V1::CompletedStep.new(name: name, result: encoded)
      @worker.save_checkpoint(self, V1::StepCheckpoint.encode(@step_checkpoint))
      JSON.parse(encoded)
    end

    # Internal (the worker): cancels the job; the first reason stays.
    def cancel!(reason)
      @cancel_mu.synchronize do
        @cancel_reason ||= reason
        @cancel_cv.broadcast
      end
    end

    # Decodes a checkpoint by the rules of steps.proto, shared by every language's helper:
    # unknown fields are ignored; bytes holding no step, a step without a name or named twice,
    # or a result that is not UTF-8 JSON were written by something else. Returns
    # [StepCheckpoint, {name => result bytes}] or raises StepCheckpointError.
    def self.decode_step_checkpoint(data)
      return [V1::StepCheckpoint.new, {}] if data.empty?

      begin
        checkpoint = V1::StepCheckpoint.decode(data)
      rescue Google::Protobuf::ParseError => e
        raise StepCheckpointError, "not a StepCheckpoint: #{e.message}"
      end
      raise StepCheckpointError, "it holds no step" if checkpoint.steps.empty?

      results = {}
      checkpoint.steps.each do |step|
        if step.name.empty? || results.key?(step.name)
          raise StepCheckpointError, "bad or repeated step name #{step.name.inspect}"
        end

        text = step.result.dup.force_encoding(Encoding::UTF_8)
        begin
          raise JSON::ParserError, "not UTF-8" unless text.valid_encoding?

          JSON.parse(text)
        rescue JSON::ParserError
          raise StepCheckpointError, "step #{step.name.inspect} has a result that is not JSON"
        end
        results[step.name] = step.result.b
      end
      [checkpoint, results]
    end

    private

    def saved_steps
      return @saved_steps if @saved_steps

      begin
        @step_checkpoint, @saved_steps = JobContext.decode_step_checkpoint(@checkpoint)
      rescue StepCheckpointError => e
        raise StepCheckpointError,
              "job #{@job_id}: its checkpoint (#{@checkpoint.bytesize} bytes) is not a " \
              "jobbroker.v1.StepCheckpoint (#{e.message}), so durable steps cannot resume from it"
      end
      @saved_steps
    end
  end
end
