# frozen_string_literal: true

require_relative "test_helper"

# Enqueue coalescing (docs/worker-contract.md §10) against the real broker: what the caller of
# each enqueue gets, and how many calls the broker saw (its /metrics counts every call by
# method and status).
class CoalescingTest < Minitest::Test
  include BrokerTestHelpers

  PARTITIONS = 4
  ENQUEUE = "/jobbroker.v1.Broker/Enqueue"
  ENQUEUE_BATCH = "/jobbroker.v1.Broker/EnqueueBatch"

  # A broker of its own, so that no other test's calls move its counters; single node with
  # several partitions, which refuses a batch that spans them.
  def self.partitioned_broker
    @partitioned_broker ||= BrokerProcess.new(
      config: TEST_CONFIG, extra_args: ["--partitions", PARTITIONS.to_s]
    ).tap { |b| Minitest.after_run { b.stop } }
  end

  def broker
    self.class.partitioned_broker
  end

  def teardown
    @clients&.each(&:close)
  end

  def new_client(**options)
    (@clients ||= []) << Jobbroker::Client.new(address: broker.address, **options)
    @clients.last
  end

  # The broker's call counts: { [method, code] => count } for Enqueue and EnqueueBatch.
  def rpc_counts
    body = Net::HTTP.get(URI("http://#{broker.http_address}/metrics"))
    body.each_line.with_object(Hash.new(0)) do |line, counts|
      next unless line.start_with?("jobbroker_rpc_duration_seconds_count{")

      labels = line[/\{([^}]*)\}/, 1].scan(/(\w+)="([^"]*)"/).to_h
      next unless [ENQUEUE, ENQUEUE_BATCH].include?(labels["method"])

      counts[[labels["method"], labels["code"]]] += Integer(line.split.last)
    end
  end

  # How many calls of `method` (with status `code`, or any) were made between two readings.
  def rose(before, after, method, code = nil)
    after.sum { |(m, c), n| m == method && (code.nil? || c == code) ? n - before[[m, c]] : 0 }
  end

  # Runs the block on `n` threads released together (each gets its index); answers each
  # thread's [:ok, value] or [:error, exception], in index order.
  def concurrently(n)
    mu = Mutex.new
    cv = ConditionVariable.new
    ready = 0
    go = false
    threads = Array.new(n) do |i|
      Thread.new do
        mu.synchronize do
          ready += 1
          cv.broadcast
          cv.wait(mu) until go
        end
        begin
          [:ok, yield(i)]
        rescue StandardError => e
          [:error, e]
        end
      end
    end
    mu.synchronize do
      cv.wait(mu) until ready == n
      go = true
      cv.broadcast
    end
    threads.map(&:value)
  end

  def values(outcomes)
    errors = outcomes.select { |kind, _| kind == :error }.map(&:last)
    assert_empty errors.map(&:message), "every enqueue succeeds"
    outcomes.map(&:last)
  end

  def ready_count(client, queue)
    client.get_queue(queue).counts["JOB_STATE_READY"]
  end

  def test_concurrent_enqueues_with_a_linger_share_batches
    client = new_client(batch_linger: 0.05)
    queue = unique_queue
    before = rpc_counts
    ids = values(concurrently(200) { |i| client.enqueue(queue, "job #{i}") }).map(&:job_id)
    after = rpc_counts
    assert_equal 200, ids.uniq.size, "200 distinct job ids"
    assert_equal 200, ready_count(client, queue), "every job exists on the broker"
    calls = rose(before, after, ENQUEUE) + rose(before, after, ENQUEUE_BATCH)
    assert_operator calls, :<=, 100, "200 jobs in at most 100 calls"
    assert_operator rose(before, after, ENQUEUE_BATCH), :>=, 1, "at least one EnqueueBatch"
  end

  def test_default_options_coalesce_under_load
    client = new_client
    assert client.options.batching
    queue = unique_queue
    before = rpc_counts
    ids = values(concurrently(200) { |i| client.enqueue(queue, "job #{i}") }).map(&:job_id)
    after = rpc_counts
    assert_equal 200, ids.uniq.size
    assert_equal 200, ready_count(client, queue)
    calls = rose(before, after, ENQUEUE) + rose(before, after, ENQUEUE_BATCH)
    assert_operator calls, :<, 200, "fewer calls than jobs"
  end

  def test_one_bad_job_fails_only_its_own_call
    client = new_client(batch_linger: 0.05)
    queue = unique_queue
    bad = 17
    before = rpc_counts
    outcomes = concurrently(50) do |i|
      headers = i == bad ? { "" => "no name" } : { "n" => i.to_s }
      client.enqueue(queue, "job #{i}", headers: headers)
    end
    after = rpc_counts
    kind, error = outcomes[bad]
    assert_equal :error, kind
    assert_kind_of GRPC::InvalidArgument, error
    assert_includes error.details, "headers"
    refute_includes error.details, "jobs[", "the message of a unary call, not the batch's"
    good = outcomes.each_with_index.reject { |_, i| i == bad }.map(&:first)
    ids = values(good).map(&:job_id)
    assert_equal 49, ids.uniq.size
    ids.each { |id| assert_equal queue, client.get_job(id).queue }
    assert_equal 49, ready_count(client, queue)
    assert_operator rose(before, after, ENQUEUE_BATCH, "INVALID_ARGUMENT"), :>=, 1,
                    "the batch was refused whole, then split"
  end

  def test_batching_off_for_one_call_or_for_the_client
    client = new_client
    queue = unique_queue
    before = rpc_counts
    refute_empty client.enqueue(queue, "alone", batch: false).job_id
    after = rpc_counts
    assert_equal 1, rose(before, after, ENQUEUE)
    assert_equal 0, rose(before, after, ENQUEUE_BATCH)

    unbatched = new_client(batching: false)
    before = rpc_counts
    ids = values(concurrently(20) { |i| unbatched.enqueue(queue, "job #{i}") }).map(&:job_id)
    after = rpc_counts
    assert_equal 20, ids.uniq.size
    assert_equal 20, rose(before, after, ENQUEUE), "one unary Enqueue per job"
    assert_equal 0, rose(before, after, ENQUEUE_BATCH)
  end

  def test_concurrent_enqueues_of_one_dedup_key_make_one_job
    client = new_client(batch_linger: 0.05)
    queue = unique_queue
    responses = values(concurrently(20) { client.enqueue(queue, "once", dedup_key: "only-one") })
    assert_equal 1, responses.map(&:job_id).uniq.size, "one job id for all"
    assert_equal 1, responses.count { |r| !r.deduplicated }, "exactly one created it"
    assert_equal 1, ready_count(client, queue)
  end

  def test_batches_never_span_partitions
    client = new_client(batch_linger: 0.05)
    # Two queues of every partition.
    by_partition = Hash.new { |h, k| h[k] = [] }
    prefix = unique_queue("part")
    (0..).each do |i|
      queue = "#{prefix}-#{i}"
      list = by_partition[Jobbroker::Partition.of_queue(queue, PARTITIONS)]
      list << queue if list.size < 2
      break if by_partition.size == PARTITIONS && by_partition.values.all? { |l| l.size == 2 }
    end
    chosen = by_partition.values.flatten
    assert_equal 8, chosen.size
    # The client learns the partition count before the burst (its first call asks for it).
    client.enqueue(chosen.first, "warm-up", batch: false)
    chosen.each do |q|
      assert_equal Jobbroker::Partition.of_queue(q, PARTITIONS),
                   client.router.current_table.partition_of_queue(q)
    end
    before = rpc_counts
    outcomes = concurrently(200) { |i| client.enqueue(chosen[i % 8], "job #{i}") }
    after = rpc_counts
    assert_equal 200, values(outcomes).map(&:job_id).uniq.size
    # A batch that spanned partitions would be refused INVALID_ARGUMENT (and then split).
    assert_equal 0, rose(before, after, ENQUEUE_BATCH, "INVALID_ARGUMENT"),
                 "no batch spanned partitions"
    assert_operator rose(before, after, ENQUEUE_BATCH), :>=, 1
    chosen.each_with_index do |q, n|
      assert_equal 25 + (n.zero? ? 1 : 0), ready_count(client, q)
    end
  end

  def test_the_batch_options_are_validated
    [[{ batch_max_jobs: 0 }, /batch_max_jobs/], [{ batch_max_jobs: 1001 }, /batch_max_jobs/],
     [{ batch_max_jobs: 2.5 }, /batch_max_jobs/], [{ batch_max_bytes: 0 }, /batch_max_bytes/],
     [{ batch_linger: -0.1 }, /batch_linger/], [{ batch_linger: "5" }, /batch_linger/],
     [{ batch_max_in_flight: 0 }, /batch_max_in_flight/], [{ batching: "yes" }, /batching/]]
      .each do |option, message|
        error = assert_raises(ArgumentError, option.inspect) do
          Jobbroker::Client.new(address: broker.address, **option)
        end
        assert_match message, error.message
      end
    options = Jobbroker::Options.new
    assert_equal [true, 100, 1024 * 1024, 0, 4],
                 [options.batching, options.batch_max_jobs, options.batch_max_bytes,
                  options.batch_linger, options.batch_max_in_flight]
    assert_equal 1000, Jobbroker::Options.new(batch_max_jobs: 1000).batch_max_jobs
    assert_equal 0.02, options.with(batch_linger: 0.02).batch_linger
  end
end

# The Coalescer's rules with a stubbed sender (no broker): which jobs go in which call, in
# what order, how many calls at once, and what each caller gets.
class CoalescerRulesTest < Minitest::Test
  V1 = Jobbroker::V1

  # Stands in for the client's Enqueue (#one) and EnqueueBatch (#many) calls: records each
  # call's payloads, and with `hold` keeps each call until the test releases it.
  class StubSender
    attr_reader :max_outstanding
    attr_accessor :fail_with # ->(kind, requests) { an exception to raise, or nil }

    def initialize(hold: false)
      @mu = Mutex.new
      @cv = ConditionVariable.new
      @hold = hold
      @held = []
      @calls = []
      @outstanding = 0
      @max_outstanding = 0
    end

    def one
      ->(request, _deadline_at) { call(:one, [request]).first }
    end

    def many
      ->(requests, _deadline_at) { call(:many, requests) }
    end

    # [[kind, payloads], ...] in the order the calls were made.
    def calls
      @mu.synchronize { @calls.dup }
    end

    def held
      @mu.synchronize { @held.size }
    end

    # Lets the oldest held call answer.
    def release_one
      @mu.synchronize { @held.shift } << true
    end

    # Lets every held call answer, and the later ones answer at once.
    def release_all
      @mu.synchronize do
        @hold = false
        @held.each { |gate| gate << true }
        @held.clear
      end
    end

    private

    def call(kind, requests)
      gate = nil
      @mu.synchronize do
        @calls << [kind, requests.map(&:payload)]
        @outstanding += 1
        @max_outstanding = [@max_outstanding, @outstanding].max
        if @hold
          gate = Queue.new
          @held << gate
        end
      end
      gate&.pop
      error = fail_with&.call(kind, requests)
      raise error if error

      requests.map { |r| V1::EnqueueResponse.new(job_id: "id-#{r.payload}") }
    ensure
      @mu.synchronize { @outstanding -= 1 }
    end
  end

  def coalescer(sender, max_jobs: 100, max_bytes: 1 << 20, linger: 0, max_in_flight: 4)
    Jobbroker::Coalescer.new(send_one: sender.one, send_many: sender.many, max_jobs: max_jobs,
                             max_bytes: max_bytes, linger: linger, max_in_flight: max_in_flight)
  end

  def request(payload, **options)
    Jobbroker::Client.enqueue_request("q", payload, **options)
  end

  # Enqueues on a thread of its own; answers the thread (its value: the response, or the
  # exception it raised).
  def enqueue_async(coalescer, payload, **options)
    Thread.new do
      coalescer.enqueue(request(payload, **options), nil, 0)
    rescue StandardError => e
      e
    end
  end

  # Polls until the block is truthy (a give-up bound, not a timing assertion).
  def until_true(message)
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 30
    until yield
      flunk("gave up: #{message}") if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
      sleep 0.005
    end
  end

  # Enqueues each payload on its own thread, one after the other in that order (each waits in
  # a batch before the next starts); the first is sent alone and held, so the others gather.
  def enqueue_in_order(coalescer, sender, payloads)
    first = enqueue_async(coalescer, payloads.first)
    until_true("the first call is made") { sender.held == 1 }
    rest = payloads.drop(1).each_with_index.map do |payload, i|
      thread = enqueue_async(coalescer, payload)
      until_true("job #{payload} waits in a batch") { coalescer.queued == i + 1 }
      thread
    end
    [first, *rest]
  end

  def test_batches_hold_at_most_max_jobs_in_call_order
    sender = StubSender.new(hold: true)
    co = coalescer(sender, max_jobs: 10, max_in_flight: 1)
    payloads = (0...35).map(&:to_s)
    threads = enqueue_in_order(co, sender, payloads)
    sender.release_all
    assert_equal payloads.map { |p| "id-#{p}" }, threads.map { |t| t.value.job_id }
    calls = sender.calls
    assert_equal [[:one, ["0"]]], calls.first(1), "the first job went alone, at once"
    assert_equal [10, 10, 10, 4], calls.drop(1).map { |_, jobs| jobs.size }
    assert_equal [:many] * 4, calls.drop(1).map(&:first)
    assert_equal payloads, calls.flat_map(&:last), "every job once, in call order"
  end

  def test_a_batch_closes_at_max_bytes
    sender = StubSender.new(hold: true)
    co = coalescer(sender, max_bytes: 100, max_in_flight: 1)
    pad = ->(name, size) { name.ljust(size, ".") }
    first = enqueue_async(co, "h")
    until_true("the first call is made") { sender.held == 1 }
    # 40-byte jobs: two fit in 100 bytes, a third would not.
    jobs = [pad["a1", 40], pad["a2", 40], pad["a3", 40], pad["a4", 40], pad["a5", 40]]
    threads = jobs.each_with_index.map do |payload, i|
      t = enqueue_async(co, payload)
      until_true("#{payload} waits") { co.queued == i + 1 }
      t
    end
    # Header names and values count: 30 + 1 + 19 = 50 more bytes, 90 with a5.
    threads << enqueue_async(co, pad["hd", 30], headers: { "k" => "v" * 19 })
    until_true("the header job waits") { co.queued == 6 }
    threads << enqueue_async(co, pad["b", 60]) # would make 150: opens the next batch
    until_true("b waits") { co.queued == 7 }
    threads << enqueue_async(co, pad["big", 150]) # over the limit alone: a batch of its own
    until_true("big waits") { co.queued == 8 }
    sender.release_all
    [first, *threads].each { |t| refute_kind_of Exception, t.value }
    assert_equal [%w[h], %w[a1 a2], %w[a3 a4], %w[a5 hd], %w[b], %w[big]],
                 sender.calls.map { |_, payloads| payloads.map { |p| p.delete(".") } }
    assert_equal %i[one many many many one one], sender.calls.map(&:first)
  end

  def test_no_more_than_max_in_flight_batches_at_once
    sender = StubSender.new(hold: true)
    co = coalescer(sender, max_jobs: 3, max_in_flight: 2)
    threads = Array.new(20) { |i| enqueue_async(co, i.to_s) }
    until_true("two calls in flight") { sender.held == 2 }
    until_true("the others wait in batches") { co.queued == 18 }
    released = 0
    until threads.none?(&:alive?)
      if sender.held.positive?
        sender.release_one
        released += 1
      else
        sleep 0.002
      end
    end
    assert_equal 2, sender.max_outstanding, "never more than batch_max_in_flight calls"
    assert_equal (0...20).map { |i| "id-#{i}" }, threads.map { |t| t.value.job_id }
    assert_equal released, sender.calls.size
    assert(sender.calls.all? { |_, jobs| jobs.size <= 3 })
    assert_equal (0...20).map(&:to_s).sort, sender.calls.flat_map(&:last).sort
  end

  def test_close_sends_the_open_batches_and_waits_for_those_in_flight
    sender = StubSender.new
    co = coalescer(sender, linger: 3600) # never sent by its timer within the test
    threads = %w[x y z].each_with_index.map do |payload, i|
      t = enqueue_async(co, payload)
      until_true("#{payload} waits") { co.queued == i + 1 }
      t
    end
    assert_empty sender.calls, "lingering"
    co.close
    assert_equal [[:many, %w[x y z]]], sender.calls
    assert_equal %w[id-x id-y id-z], threads.map { |t| t.value.job_id }

    held = StubSender.new(hold: true)
    co = coalescer(held)
    in_flight = enqueue_async(co, "w")
    until_true("the call is made") { held.held == 1 }
    closer = Thread.new { co.close }
    refute closer.join(0.2), "close waits for the batch in flight"
    held.release_all
    assert closer.join(30)
    assert_equal "id-w", in_flight.value.job_id
  end

  def test_a_refused_batch_is_sent_again_one_job_per_call
    sender = StubSender.new(hold: true)
    sender.fail_with = lambda do |kind, requests|
      bad = requests.index { |r| r.payload == "bad" }
      next nil unless bad

      prefix = kind == :many ? "jobs[#{bad}]." : ""
      GRPC::InvalidArgument.new("#{prefix}headers must not have an empty name")
    end
    co = coalescer(sender, max_in_flight: 1)
    threads = enqueue_in_order(co, sender, %w[first ok-1 bad ok-2])
    sender.release_all
    values = threads.map(&:value)
    assert_equal %w[id-first id-ok-1], values.first(2).map(&:job_id)
    assert_kind_of GRPC::InvalidArgument, values[2]
    assert_equal "headers must not have an empty name", values[2].details
    assert_equal "id-ok-2", values[3].job_id
    calls = sender.calls
    assert_equal [[:one, %w[first]], [:many, %w[ok-1 bad ok-2]]], calls.first(2)
    assert_equal [[:one, %w[bad]], [:one, %w[ok-1]], [:one, %w[ok-2]]], calls.drop(2).sort
  end

  def test_another_failure_is_every_callers_error
    sender = StubSender.new(hold: true)
    sender.fail_with = ->(kind, _) { GRPC::Unavailable.new("broker gone") if kind == :many }
    co = coalescer(sender, max_in_flight: 1)
    threads = enqueue_in_order(co, sender, %w[first a b c])
    sender.release_all
    assert_equal "id-first", threads.first.value.job_id
    threads.drop(1).each do |t|
      assert_kind_of GRPC::Unavailable, t.value
      assert_equal "broker gone", t.value.details
    end
    assert_equal [[:one, %w[first]], [:many, %w[a b c]]], sender.calls, "not split, not resent"
  end

  def test_jobs_with_and_without_a_dedup_key_go_in_separate_batches
    sender = StubSender.new
    co = coalescer(sender, linger: 3600)
    threads = [["plain-1", {}], ["keyed", { dedup_key: "k" }], ["plain-2", {}]]
              .each_with_index.map do |(payload, options), i|
      t = enqueue_async(co, payload, **options)
      until_true("#{payload} waits") { co.queued == i + 1 }
      t
    end
    co.close
    threads.each { |t| refute_kind_of Exception, t.value }
    assert_equal [[:many, %w[plain-1 plain-2]], [:one, %w[keyed]]],
                 sender.calls.sort_by { |kind, _| kind == :many ? 0 : 1 }
  end

  def test_a_sender_interrupted_in_its_call_settles_the_batch
    sender = StubSender.new(hold: true)
    co = coalescer(sender, max_in_flight: 1)
    threads = enqueue_in_order(co, sender, %w[first a b])
    sender.release_one
    until_true("the batch of a and b is sent") { sender.calls.size == 2 && sender.held == 1 }
    # Its leader (a, the first caller) sends it: a Timeout-like exception raised into it.
    threads[1].raise(RuntimeError, "gave up")
    assert_equal "gave up", threads[1].value.message
    assert_kind_of GRPC::Cancelled, threads[2].value, "its job may have been created"
    assert_includes threads[2].value.details, "RuntimeError: gave up"
    sender.release_all
    assert_equal "id-first", threads[0].value.job_id
    assert_equal "id-c", co.enqueue(request("c"), nil, 0).job_id, "the in-flight slot is free"
  end

  def test_a_leader_that_leaves_hands_the_batch_to_another_caller
    sender = StubSender.new
    co = coalescer(sender, linger: 3600)
    threads = %w[leader second third].each_with_index.map do |payload, i|
      t = enqueue_async(co, payload)
      until_true("#{payload} waits") { co.queued == i + 1 }
      t
    end
    threads.first.kill.join
    co.close
    assert_equal [[:many, %w[leader second third]]], sender.calls, "its job stays in the batch"
    assert_equal %w[id-second id-third], threads.drop(1).map { |t| t.value.job_id }
  end
end
