# frozen_string_literal: true

module Jobbroker
  # Merges concurrent Client#enqueue calls into EnqueueBatch calls and answers each caller on
  # its own (docs/worker-contract.md §10, docs/decisions.md "Producer coalescing"). Internal to
  # the gem: the Client makes one when its options have `batching` on.
  #
  # A job joins the open batch of its key: its partition (nil: the queue name) and whether it
  # has a dedup key. Batches of one key are started in the order they were opened, at most
  # `max_in_flight` of them in flight at once:
  # - a batch is full at `max_jobs` jobs or `max_bytes` payload and header bytes (a job that
  #   would carry it past `max_bytes` closes it and opens the next one instead, so a request
  #   stays near the limit); a full batch starts as soon as the in-flight limit allows;
  # - an open batch starts at once with a linger of 0, else `linger` seconds after it opened,
  #   if the limit allows then; one that had to wait for the limit starts when a batch of its
  #   key ends; #close starts every open batch.
  #
  # Threads. Nothing runs in the background: every job's caller waits in #enqueue for its
  # answer, and the callers do the work. The caller that makes a batch startable sends it from
  # its own thread (linger 0 under the limit: at once, alone). Otherwise the batch's leader
  # (the caller of its first job) sends it: woken by the thread that ended an in-flight batch of
  # its key, by #close, or by its own timed wait of `linger` (the timer: one per batch, none per
  # job). The sender hands each caller its result; after a refusal that applied nothing, each
  # caller sends its own job again as a unary Enqueue, all at once, from its own thread. A
  # leader that leaves before its batch is sent (an exception such as Timeout's, Thread#kill)
  # hands the role to another caller of the batch, or to a thread made for it when none is left.
  class Coalescer
    Codes = GRPC::Core::StatusCodes

    # A batch refused with one of these applied none of its jobs, so each is safe to send again
    # alone: only the bad job then fails, with the message its unary call gives.
    REFUSED = [Codes::INVALID_ARGUMENT, Codes::RESOURCE_EXHAUSTED, Codes::ALREADY_EXISTS,
               Codes::FAILED_PRECONDITION, Codes::NOT_FOUND, Codes::OUT_OF_RANGE,
               Codes::PERMISSION_DENIED].freeze

    # One enqueue() call waiting in a batch. state: :waiting, then :done (result or error) or
    # :alone (send the job again by itself).
    class Entry
      attr_reader :request, :deadline_at, :bytes
      attr_accessor :state, :result, :error, :abandoned

      def initialize(request, deadline_at)
        @request = request
        @deadline_at = deadline_at
        @bytes = Coalescer.job_bytes(request)
        @state = :waiting
        @abandoned = false
      end
    end

    # The jobs of one call. state: :open (jobs may join), :sealed (full, waiting for the
    # in-flight limit), :go (started: its leader is to send it), :sending, :done.
    class Batch
      attr_reader :key, :entries, :bytes, :deadline_at, :due, :leader_cv, :members_cv
      attr_accessor :state, :leader, :blocked

      def initialize(key, leader, due, blocked)
        @key = key
        @leader = leader
        @due = due
        @blocked = blocked
        @entries = []
        @bytes = 0
        @deadline_at = nil
        @state = :open
        @leader_cv = ConditionVariable.new
        @members_cv = ConditionVariable.new
      end

      def add(entry)
        @entries << entry
        @bytes += entry.bytes
        # The earliest of the callers' deadlines (nil: that caller has none).
        @deadline_at = entry.deadline_at if entry.deadline_at &&
                                            (@deadline_at.nil? || entry.deadline_at < @deadline_at)
      end

      def done?
        @state == :done
      end
    end

    # The batches of one key: the open one, the full ones waiting for the in-flight limit
    # (oldest first), and how many are in flight.
    class KeyState
      attr_accessor :open, :in_flight
      attr_reader :sealed

      def initialize
        @open = nil
        @sealed = []
        @in_flight = 0
      end

      def idle?
        @open.nil? && @sealed.empty? && @in_flight.zero?
      end
    end

    # Stands in for the leader of a batch whose callers all left before it was sent.
    PROXY = Object.new.freeze

    # The bytes a job counts for max_bytes: its payload and its headers' names and values.
    def self.job_bytes(request)
      bytes = request.payload.bytesize
      request.headers.each { |name, value| bytes += name.bytesize + value.bytesize }
      bytes
    end

    # `send_one.call(request, deadline_at)` sends one job as a unary Enqueue and returns its
    # EnqueueResponse; `send_many.call(requests, deadline_at)` sends an EnqueueBatch and
    # returns its results. Both raise the call's GRPC::BadStatus, after the client's retries.
    def initialize(send_one:, send_many:, max_jobs:, max_bytes:, linger:, max_in_flight:)
      @send_one = send_one
      @send_many = send_many
      @max_jobs = max_jobs
      @max_bytes = max_bytes
      @linger = linger.to_f
      @max_in_flight = max_in_flight
      @mu = Mutex.new
      @idle = ConditionVariable.new
      @closing = 0
      reset_locked
    end

    # Sends `request` (an EnqueueRequest) in a batch of its key; returns its EnqueueResponse,
    # or raises what a unary Enqueue of it would. `deadline_at`: a Time or nil; `partition`: the
    # queue's partition, nil when the client knows no partition count.
    def enqueue(request, deadline_at, partition)
      entry = Entry.new(request, deadline_at)
      key = [partition.nil? ? request.queue : partition, !request.dedup_key.empty?]
      # An exception raised into this thread (Timeout, Rack::Timeout) is held back while it
      # holds a batch others wait for, until it waits or calls: there #await hands the batch
      # on, or #send_batch settles it; never between taking the batch and sending it.
      Thread.handle_interrupt(Object => :never) do
        batch, mine = @mu.synchronize do
          # A client made before a fork: the parent's batches and their callers are not here.
          reset_locked unless @pid == Process.pid
          join_locked(key, entry)
        end
        send_batch(batch) if mine || await(batch, entry, entry)
      end
      answer(entry)
    end

    # How many jobs wait in batches not yet sent (open or full): for tests and debugging.
    def queued
      @mu.synchronize do
        @keys.each_value.sum do |state|
          state.sealed.sum { |batch| batch.entries.size } + (state.open&.entries&.size || 0)
        end
      end
    end

    # Starts every open batch and waits until every batch there was then has ended.
    def close
      @mu.synchronize do
        return unless @pid == Process.pid

        pending = @live.keys
        @closing += 1
        begin
          @keys.each_value { |state| pump_locked(state) }
          @idle.wait(@mu) until pending.all?(&:done?)
        ensure
          @closing -= 1
        end
      end
    end

    private

    def reset_locked
      @pid = Process.pid
      @keys = {}
      @live = {}.compare_by_identity # batches not yet done, for #close
    end

    def now
      Process.clock_gettime(Process::CLOCK_MONOTONIC)
    end

    # Adds `entry` to its key's open batch (opening one), starts what may start, and answers
    # [its batch, whether this thread sends it now].
    def join_locked(key, entry)
      state = (@keys[key] ||= KeyState.new)
      batch = state.open
      # Keep a request near max_bytes: a job that would carry the batch past it goes in the next.
      seal_locked(state, batch) if batch && batch.bytes + entry.bytes > @max_bytes
      batch = state.open
      unless batch
        batch = Batch.new(key, entry, now + @linger, state.in_flight >= @max_in_flight)
        state.open = batch
        @live[batch] = true
      end
      batch.add(entry)
      seal_locked(state, batch) if batch.entries.size >= @max_jobs || batch.bytes >= @max_bytes
      [batch, pump_locked(state, batch)]
    end

    def seal_locked(state, batch)
      state.open = nil
      batch.state = :sealed
      state.sealed << batch
    end

    # Starts the key's batches while the in-flight limit allows: the sealed ones in order, then
    # the open one if it need not linger. Each goes to its leader (:go), except `mine`, which
    # the calling thread sends itself: answers whether `mine` started.
    def pump_locked(state, mine = nil)
      started_mine = false
      while state.in_flight < @max_in_flight
        batch = state.sealed.shift
        if batch.nil? && state.open && may_start_open?(state.open)
          batch = state.open
          state.open = nil
        end
        break unless batch

        state.in_flight += 1
        if batch.equal?(mine)
          batch.state = :sending
          started_mine = true
        else
          batch.state = :go
          batch.leader_cv.signal
        end
      end
      started_mine
    end

    # An open batch need not wait for more jobs with a linger of 0, once its linger passed, when
    # it waited for the in-flight limit (rule 4: sent when a batch of its key ends), or while
    # the coalescer closes.
    def may_start_open?(batch)
      @linger.zero? || batch.blocked || @closing.positive? || now >= batch.due
    end

    # Waits as `me` (an Entry of `batch`, or PROXY) until `me` is to send the batch (true) or
    # the entry has its answer (false). Interruptible only inside the wait, where the batch is
    # still :go or earlier for #abandon_locked to hand on; it becomes :sending after that.
    def await(batch, entry, me)
      done = false
      @mu.synchronize do
        must_send = Thread.handle_interrupt(Object => :immediate) { wait_locked(batch, entry, me) }
        done = true
        batch.state = :sending if must_send
        must_send
      ensure
        abandon_locked(batch, me) unless done
      end
    end

    def wait_locked(batch, entry, me)
      loop do
        return false if entry ? entry.state != :waiting : %i[sending done].include?(batch.state)

        if batch.leader.equal?(me)
          return true if take_turn_locked(batch)
        else
          batch.members_cv.wait(@mu)
        end
      end
    end

    # The leader's part: send the batch once it has started, or once its linger passed while
    # the limit allows; else wait for one of those. True when this thread is to send it (:go).
    def take_turn_locked(batch)
      case batch.state
      when :go then return true
      when :open
        unless @linger.zero? || batch.blocked || @closing.positive?
          remaining = batch.due - now
          if remaining.positive?
            batch.leader_cv.wait(@mu, remaining)
            return false
          end
          state = @keys[batch.key]
          if state.in_flight < @max_in_flight && state.sealed.empty?
            state.open = nil
            state.in_flight += 1
            batch.state = :go
            return true
          end
          # Rule 4: it now waits for a batch of its key to end, and goes when one does.
          batch.blocked = true
        end
      end
      batch.leader_cv.wait(@mu)
      false
    end

    # `me` left #await before its batch was answered (an exception, Thread#kill). Its job stays
    # in the batch; if it was to send the batch, another caller of it does, or a new thread.
    def abandon_locked(batch, me)
      me.abandoned = true unless me.equal?(PROXY)
      return unless batch.leader.equal?(me) && %i[open sealed go].include?(batch.state)

      successor = batch.entries.find { |e| !e.abandoned && e.state == :waiting }
      if successor
        batch.leader = successor
        batch.members_cv.broadcast
      else
        batch.leader = PROXY
        Thread.new { send_batch(batch) if await(batch, nil, PROXY) }
      end
    end

    # Sends the batch (this thread took it: :sending) and settles every entry. Called with
    # interrupts held back: they may arrive during the call only, and the batch is settled.
    def send_batch(batch)
      entries = batch.entries
      outcome = nil
      begin
        outcome = Thread.handle_interrupt(Object => :immediate) do
          if entries.size == 1
            [:results, [@send_one.call(entries.first.request, batch.deadline_at)]]
          else
            results = @send_many.call(entries.map(&:request), batch.deadline_at)
            check_results(results, entries.size)
          end
        end
      rescue GRPC::BadStatus => e
        outcome = entries.size > 1 && REFUSED.include?(e.code) ? [:alone] : [:error, e]
      rescue Exception => e # rubocop:disable Lint/RescueException -- settled, then re-raised
        # Not the broker's answer: an exception raised into the sending thread (Timeout) or a
        # local failure. Its caller gets it; the others may have had their jobs created.
        outcome = [:error, interrupted("raised #{e.class}: #{e.message}")]
        raise
      ensure
        outcome ||= [:error, interrupted("was killed")] # Thread#kill runs only ensure
        @mu.synchronize { finish_locked(batch, outcome) }
      end
    end

    def interrupted(what)
      GRPC::Cancelled.new("the thread sending this job's batch #{what}; the job may have been " \
                          "created")
    end

    def check_results(results, count)
      return [:results, results] if results.size == count

      [:error, GRPC::Internal.new("EnqueueBatch answered #{results.size} results for " \
                                  "#{count} jobs")]
    end

    # Settles the batch's entries, wakes its callers, and starts what its end lets start.
    def finish_locked(batch, outcome)
      kind, value = outcome
      batch.entries.each_with_index do |entry, i|
        case kind
        when :results
          entry.result = value[i]
          entry.state = :done
        when :alone then entry.state = :alone
        else
          entry.error = value
          entry.state = :done
        end
      end
      batch.state = :done
      @live.delete(batch)
      batch.members_cv.broadcast
      batch.leader_cv.broadcast
      state = @keys[batch.key]
      # A batch of the parent's after a fork (reset_locked) has no state here.
      if state
        state.in_flight -= 1
        pump_locked(state)
        @keys.delete(batch.key) if state.idle?
      end
      @idle.broadcast if @closing.positive?
    end

    def answer(entry)
      case entry.state
      when :alone then @send_one.call(entry.request, entry.deadline_at)
      else
        # The same error goes to every caller of the batch: each raises its own copy.
        raise entry.error.dup if entry.error

        entry.result
      end
    end
  end
end
