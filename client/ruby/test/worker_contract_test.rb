# frozen_string_literal: true

require_relative "test_helper"
require "socket"

# The worker contract (docs/worker-contract.md) in this process against the real broker: what
# tests/interop/conformance.py does not reach, or reaches only through a child process.
class WorkerContractTest < Minitest::Test
  include BrokerTestHelpers

  def new_worker(address = broker.address, **opts)
    Jobbroker::Worker.new(address: address, worker_id: "ruby-contract-test",
                          logger: Logger.new($stderr, level: :warn), **opts)
  end

  # Runs `worker` in a thread while the block runs, then stops it; returns what #run returned.
  def running(worker)
    result = nil
    thread = Thread.new { result = worker.run }
    begin
      yield
    ensure
      worker.stop
      thread.join(60) or flunk("worker did not stop")
    end
    result
  end

  def test_each_queue_runs_its_own_handler
    emails = unique_queue("emails")
    invoices = unique_queue("invoices")
    email_id = client.enqueue(emails, "e").job_id
    invoice_id = client.enqueue(invoices, "i").job_id
    worker = new_worker(concurrency: 2)
    worker.handle(emails) { |job| { "handler" => "emails", "queue" => job.queue } }
    worker.handle(invoices) { |job| { "handler" => "invoices", "queue" => job.queue } }
    running(worker) do
      wait_for_state(email_id, :JOB_STATE_COMPLETED)
      wait_for_state(invoice_id, :JOB_STATE_COMPLETED)
    end
    # A value that is not a String is kept as JSON.
    assert_equal({ "handler" => "emails", "queue" => emails },
                 JSON.parse(client.get_job(email_id).result))
    assert_equal({ "handler" => "invoices", "queue" => invoices },
                 JSON.parse(client.get_job(invoice_id).result))
  end

  def test_run_without_a_handler_is_an_error_before_connecting
    # Nothing listens there: the error must come before any connection attempt.
    worker = new_worker("127.0.0.1:1")
    assert_raises(ArgumentError) { worker.run }
  end

  def test_a_queue_cannot_have_two_handlers
    worker = new_worker
    worker.handle("q") { nil }
    assert_raises(ArgumentError) { worker.handle("q") { nil } }
  end

  def test_the_worker_names_its_library_in_list_workers
    queue = unique_queue
    worker = new_worker
    worker.handle(queue) { nil }
    running(worker) do
      listed = eventually(message: "the worker in ListWorkers") do
        client.admin.list_workers(V1::ListWorkersRequest.new).workers.find do |w|
          w.queues.include?(queue)
        end
      end
      assert_equal "jobbroker-ruby/#{Jobbroker::VERSION}", listed.client
    end
  end

  def test_snooze_releases_without_spending_an_attempt
    queue = unique_queue
    id = client.enqueue(queue, "later").job_id
    seen = Queue.new
    worker = new_worker
    worker.handle(queue) do |job|
      seen << job.attempt
      raise Jobbroker::Snooze, 0.2 if seen.size == 1
    end
    running(worker) { wait_for_state(id, :JOB_STATE_COMPLETED) }
    job = client.get_job(id)
    assert_equal 1, job.snoozes
    assert_equal 1, job.attempt
    assert_equal [1, 1], [seen.pop, seen.pop]
  end

  def test_progress_is_visible_while_the_handler_runs
    queue = unique_queue
    id = client.enqueue(queue, "report").job_id
    release = Queue.new
    worker = new_worker
    worker.handle(queue) do |job|
      job.progress({ "percent" => 10 })
      job.progress({ "percent" => 40 }) # the newest value always arrives
      release.pop
      "done"
    end
    running(worker) do
      eventually(message: "progress 40") do
        progress = client.get_job(id).progress
        !progress.empty? && JSON.parse(progress) == { "percent" => 40 }
      end
      assert_equal :JOB_STATE_ACTIVE, client.get_job(id).state
      release << true
      wait_for_state(id, :JOB_STATE_COMPLETED)
    end
  end

  # A checkpoint as another language's helper writes it: StepCheckpoint, UTF-8 JSON results.
  def foreign_checkpoint
    V1::StepCheckpoint.encode(V1::StepCheckpoint.new(steps: [
      V1::CompletedStep.new(name: "fetch",
                            result: JSON.generate({ "by" => "python", "n" => 1.5 }).b)
    ]))
  end

  # Leases the job as another worker would, saves `checkpoint` and fails the attempt, so the
  # next attempt (ours) starts with it.
  def start_elsewhere(queue, checkpoint)
    leased = client.broker.lease(V1::LeaseRequest.new(queue: queue, worker_id: "other",
                                                      wait: Jobbroker.duration(5))).jobs.first
    refute_nil leased, "nothing to lease"
    client.broker.heartbeat(V1::HeartbeatRequest.new(job_id: leased.job_id,
                                                     lease_id: leased.lease_id,
                                                     checkpoint: checkpoint))
    client.broker.fail(V1::FailRequest.new(job_id: leased.job_id, lease_id: leased.lease_id,
                                           error: "worker died"))
  end

  def test_steps_resume_a_checkpoint_written_by_another_language
    queue = unique_queue
    id = client.enqueue(queue, "pipeline").job_id
    start_elsewhere(queue, foreign_checkpoint)
    ran = []
    worker = new_worker
    worker.handle(queue) do |job|
      fetched = job.step("fetch") { ran << "fetch" && { "by" => "ruby" } }
      stored = job.step("store") do
        ran << "store"
        { "by" => "ruby", "unicode" => "h\u00e9llo \u2713", "list" => [1, nil, true] }
      end
      { "fetch" => fetched, "store" => stored }
    end
    running(worker) { wait_for_state(id, :JOB_STATE_COMPLETED) }
    job = client.get_job(id)
    assert_equal ["store"], ran
    assert_equal({ "fetch" => { "by" => "python", "n" => 1.5 },
                   "store" => { "by" => "ruby", "unicode" => "h\u00e9llo \u2713",
                                "list" => [1, nil, true] } }, JSON.parse(job.result))
    saved = V1::StepCheckpoint.decode(job.checkpoint)
    assert_equal %w[fetch store], saved.steps.map(&:name)
    assert_equal({ "by" => "ruby", "unicode" => "h\u00e9llo \u2713", "list" => [1, nil, true] },
                 JSON.parse(saved.steps[1].result.dup.force_encoding(Encoding::UTF_8)))
  end

  def test_a_step_is_saved_before_it_returns
    queue = unique_queue
    id = client.enqueue(queue, "x").job_id
    checkpoint_after_step = Queue.new
    worker = new_worker
    worker.handle(queue) do |job|
      job.step("one") { 1 }
      checkpoint_after_step << client.get_job(job.job_id).checkpoint
      nil
    end
    running(worker) { wait_for_state(id, :JOB_STATE_COMPLETED) }
    saved = V1::StepCheckpoint.decode(checkpoint_after_step.pop)
    assert_equal [["one", "1"]], saved.steps.map { |s| [s.name, s.result] }
  end

  def test_a_checkpoint_durable_steps_did_not_write_fails_the_attempt
    queue = unique_queue
    id = client.enqueue(queue, "x", max_attempts: 2).job_id
    start_elsewhere(queue, "not a step checkpoint".b)
    ran = false
    worker = new_worker
    worker.handle(queue) { |job| job.step("a") { ran = true } }
    running(worker) { wait_for_state(id, :JOB_STATE_FAILED) }
    refute ran
    assert_match(/not a jobbroker.v1.StepCheckpoint/, client.get_job(id).last_error)
  end

  def test_a_repeated_step_name_is_an_error_of_the_handler
    queue = unique_queue
    id = client.enqueue(queue, "x", max_attempts: 1).job_id
    worker = new_worker
    worker.handle(queue) do |job|
      job.step("same") { 1 }
      job.step("same") { 2 }
    end
    running(worker) { wait_for_state(id, :JOB_STATE_FAILED) }
    assert_match(/used twice/, client.get_job(id).last_error)
  end

  def test_timeout_cancels_the_handler_and_the_broker_ends_the_attempt
    queue = unique_queue
    req = Jobbroker::Client.enqueue_request(queue, "slow", max_attempts: 1)
    req.timeout = Jobbroker.duration(0.5)
    id = client.broker.enqueue(req).job_id
    reasons = Queue.new
    timeouts = Queue.new
    worker = new_worker
    worker.handle(queue) do |job|
      timeouts << job.timeout_at
      job.sleep(60)
    rescue Jobbroker::Cancelled => e
      reasons << e.reason
      raise
    end
    running(worker) { wait_for_state(id, :JOB_STATE_FAILED) }
    assert_equal :timed_out, reasons.pop
    assert_kind_of Time, timeouts.pop
    assert_equal [:ATTEMPT_OUTCOME_TIMED_OUT], client.get_job(id).attempts.map(&:outcome)
  end

  def test_operator_cancel_raises_at_the_next_sleep
    queue = unique_queue
    id = client.enqueue(queue, "long").job_id
    reasons = Queue.new
    worker = new_worker
    worker.handle(queue) do |job|
      job.sleep(60)
    rescue Jobbroker::Cancelled => e
      reasons << [e.reason, job.cancelled?]
      raise
    end
    running(worker) do
      wait_for_state(id, :JOB_STATE_ACTIVE)
      client.admin.cancel_job(V1::CancelJobRequest.new(job_id: id))
      wait_for_state(id, :JOB_STATE_CANCELLED)
      assert_equal [:cancel_requested, true], reasons.pop
    end
  end

  def test_a_handler_still_running_at_the_end_of_grace_is_cancelled_and_released
    queue = unique_queue
    id = client.enqueue(queue, "stubborn").job_id
    reasons = Queue.new
    worker = new_worker(grace: 0.3)
    worker.handle(queue) do |job|
      job.sleep(60)
    rescue Jobbroker::Cancelled => e
      reasons << e.reason
      raise
    end
    thread = Thread.new { worker.run }
    wait_for_state(id, :JOB_STATE_ACTIVE)
    worker.stop
    thread.join(30) or flunk("worker did not stop")
    assert_equal :shutdown, reasons.pop
    job = client.get_job(id)
    assert_equal :JOB_STATE_READY, job.state
    assert_equal 1, worker.stats.released
    assert_equal 0, worker.stats.failed
  end

  def test_a_failure_of_any_kind_never_kills_the_worker
    queue = unique_queue
    ids = Array.new(3) { |i| client.enqueue(queue, i.to_s, max_attempts: 1).job_id }
    worker = new_worker
    worker.handle(queue) do |job|
      case job.text
      when "0" then raise NotImplementedError, "a ScriptError"
      when "1" then raise "a RuntimeError"
      else "fine"
      end
    end
    running(worker) do
      wait_for_state(ids[0], :JOB_STATE_FAILED)
      wait_for_state(ids[1], :JOB_STATE_FAILED)
      wait_for_state(ids[2], :JOB_STATE_COMPLETED)
    end
    assert_equal "a ScriptError", client.get_job(ids[0]).last_error
  end

  # The broker dies while handlers run; their acks wait, go out on the next stream with the
  # same lease ids, coalesced into one ack_batch, and the jobs complete with one attempt.
  def test_acks_unsent_at_a_reconnect_go_out_together_on_the_next_stream
    listen = free_addresses(1).first
    own = BrokerProcess.new(config: TEST_CONFIG, listen: listen)
    queue = unique_queue
    own_client = Jobbroker.connect(own.address)
    ids = Array.new(3) { |i| own_client.enqueue(queue, i.to_s, lease_duration: 30).job_id }
    started = Queue.new
    go = Queue.new
    finished = Queue.new
    worker = new_worker(own.address, concurrency: 3, lease_duration: 30)
    worker.handle(queue) do |job|
      started << job.job_id
      go.pop
      finished << job.job_id
      "ok #{job.text}"
    end
    thread = Thread.new { worker.run }
    3.times { started.pop }
    acks_before = worker.stats.ack_messages
    own.kill!
    # The handlers end only once the worker saw its stream end, so no ack goes to the dead one.
    eventually(message: "the worker noticed the broker died") { worker.stats.reconnects >= 1 }
    3.times { go << true }
    3.times { finished.pop }
    own = BrokerProcess.new(config: TEST_CONFIG, listen: listen, dir: own.dir)
    ids.each do |id|
      eventually(message: "#{id} completed after the restart") do
        own_client.get_job(id).state == :JOB_STATE_COMPLETED
      rescue GRPC::Unavailable
        false
      end
    end
    worker.stop
    thread.join(30) or flunk("worker did not stop")
    ids.each_with_index do |id, i|
      job = own_client.get_job(id)
      assert_equal 1, job.attempt
      assert_equal "ok #{i}", job.result
    end
    assert_equal 3, worker.stats.acked
    assert_equal acks_before + 1, worker.stats.ack_messages
    assert_operator worker.stats.reconnects, :>=, 1
  ensure
    own_client&.close
    own&.stop
  end

  # The worker as the broker at `address` lists it: its streams and their max_in_flight once it
  # is subscribed (nil while it is not, or while the broker is down).
  def listed(own_client, queue, worker_id)
    own_client.list_workers(queue: queue).find { |w| w.worker_id == worker_id && w.streams >= 1 }
  rescue GRPC::Unavailable, GRPC::DeadlineExceeded
    nil
  end

  # §6: a stream that ends during a graceful stop's grace is reopened (flow 0 at once), so the
  # ack of the handler that finishes after it reaches the broker; the stop then returns at
  # once, well before the grace is over. The broker is killed with kill -9 and started again
  # on the same port and data directory while the handler runs.
  def test_a_stream_ended_during_the_grace_is_reopened_for_the_answers
    listen = free_addresses(1).first
    own = BrokerProcess.new(config: TEST_CONFIG, listen: listen)
    queue = unique_queue
    own_client = Jobbroker.connect(own.address)
    id = own_client.enqueue(queue, "slow", lease_duration: 30).job_id
    started = Queue.new
    go = Queue.new
    grace = 30
    worker = new_worker(own.address, worker_id: "ruby-reopen-in-grace", grace: grace,
                                     lease_duration: 30, reconnect_max: 0.5)
    worker.handle(queue) do |job|
      started << job.job_id
      go.pop
      "done #{job.text}"
    end
    thread = Thread.new { worker.run }
    assert_equal id, started.pop
    stop_at = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    worker.stop
    # Step 1 reached the broker: the worker's stream takes nothing more.
    eventually(message: "flow 0 before the kill") do
      listed(own_client, queue, "ruby-reopen-in-grace")&.max_in_flight&.zero?
    end
    own.kill!
    eventually(message: "the worker noticed the broker died") { worker.stats.reconnects >= 1 }
    own = BrokerProcess.new(config: TEST_CONFIG, listen: listen, dir: own.dir)
    # Reopened while stopping: subscribed again, and flow 0 at once.
    eventually(message: "the stream reopened during the grace, with flow 0") do
      listed(own_client, queue, "ruby-reopen-in-grace")&.max_in_flight&.zero?
    end
    # A job enqueued now is not started: the reopened stream takes nothing (or releases it).
    other = own_client.enqueue(queue, "not during a stop").job_id
    go << true
    thread.join(15) or flunk("the stop did not return once the handler was done")
    stopped_in = Process.clock_gettime(Process::CLOCK_MONOTONIC) - stop_at
    assert_operator stopped_in, :<, grace, "the stop returned once the ack was answered"
    job = own_client.get_job(id)
    assert_equal :JOB_STATE_COMPLETED, job.state, "the ack reached the broker on the new stream"
    assert_equal 1, job.attempt
    assert_equal "done slow", job.result
    assert_equal 1, worker.stats.acked
    assert_equal 0, worker.stats.failed
    assert_operator worker.stats.reconnects, :>=, 1
    assert started.empty?, "no job started during the stop"
    assert_equal :JOB_STATE_READY, own_client.get_job(other).state
  ensure
    go&.close
    own_client&.close
    own&.stop
  end

  # The same with no broker to reopen a stream on: the stop still ends within its bounds (the
  # grace, 1 s for the answers, the close), dropping the answer it could not send.
  def test_a_stop_ends_within_its_bounds_when_no_stream_can_be_reopened
    own = BrokerProcess.new(config: TEST_CONFIG)
    queue = unique_queue
    own_client = Jobbroker.connect(own.address)
    own_client.enqueue(queue, "slow", lease_duration: 30)
    started = Queue.new
    go = Queue.new
    grace = 1
    worker = new_worker(own.address, grace: grace, lease_duration: 30, reconnect_max: 0.2)
    worker.handle(queue) do |job|
      started << job.job_id
      go.pop
      "done"
    end
    thread = Thread.new { worker.run }
    started.pop
    own.kill!
    eventually(message: "the worker noticed the broker died") { worker.stats.reconnects >= 1 }
    stop_at = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    worker.stop
    go << true
    thread.join(grace + 10) or flunk("the stop did not end without a broker")
    stopped_in = Process.clock_gettime(Process::CLOCK_MONOTONIC) - stop_at
    # Grace, step 5's second, the close (half-close, cancel after 2 s) and slack for CI.
    assert_operator stopped_in, :<, grace + 1 + 4
    assert_equal 0, worker.stats.acked
  ensure
    go&.close
    own_client&.close
    own&.stop # a no-op once killed: then only its directory is left
    FileUtils.remove_entry(own.dir) if own&.dir && File.exist?(own.dir)
  end
end
