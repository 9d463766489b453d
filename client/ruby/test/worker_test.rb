# frozen_string_literal: true

require_relative "test_helper"

# Jobbroker::Worker in this process against the real broker.
class WorkerTest < Minitest::Test
  include BrokerTestHelpers

  # Runs a worker with `handler` on `queue` in a thread while the block runs; returns it.
  def with_worker(queue, handler, **opts)
    worker = Jobbroker::Worker.new(queues: [queue], address: broker.address,
                                   worker_id: "ruby-worker-test",
                                   logger: Logger.new($stderr, level: :warn), **opts, &handler)
    thread = Thread.new { worker.run }
    begin
      yield worker
    ensure
      worker.stop
      thread.join(60) or flunk("worker did not stop")
    end
    worker
  end

  def test_returned_value_acks_with_result
    queue = unique_queue
    id = client.enqueue(queue, { "n" => 21 }).job_id
    double = ->(job) { (job.json["n"] * 2).to_s }
    with_worker(queue, double, concurrency: 2) { wait_for_state(id, :JOB_STATE_COMPLETED) }
    job = client.get_job(id)
    assert_equal "42", job.result
    assert_equal 1, job.attempt
  end

  def test_raised_error_is_retried_then_acked
    queue = unique_queue
    id = client.enqueue(queue, "flaky").job_id
    flaky = ->(job) { raise "provider timeout" if job.attempt == 1 }
    worker = with_worker(queue, flaky) { wait_for_state(id, :JOB_STATE_COMPLETED) }
    job = client.get_job(id)
    assert_equal 2, job.attempt
    assert_equal "provider timeout", job.attempts.first.error
    assert_equal %i[ATTEMPT_OUTCOME_ERROR ATTEMPT_OUTCOME_COMPLETED], job.attempts.map(&:outcome)
    assert_equal 1, worker.stats.failed
    assert_equal 1, worker.stats.acked
  end

  def test_permanent_error_fails_without_retry
    queue = unique_queue
    id = client.enqueue(queue, "bad").job_id
    permanent = ->(_job) { raise Jobbroker::PermanentError, "bad address" }
    with_worker(queue, permanent) { wait_for_state(id, :JOB_STATE_FAILED) }
    job = client.get_job(id)
    assert_equal :FAIL_REASON_PERMANENT, job.fail_reason
    assert_equal 1, job.attempt
    assert_equal "bad address", job.last_error
    assert_equal [:ATTEMPT_OUTCOME_PERMANENT_ERROR], job.attempts.map(&:outcome)
  end

  def test_retry_after_sets_the_next_attempt_time
    queue = unique_queue
    id = client.enqueue(queue, "rate limited").job_id
    limited = ->(_job) { raise Jobbroker::RetryAfter.new(3600, "429 from provider") }
    with_worker(queue, limited) { wait_for_state(id, :JOB_STATE_SCHEDULED) }
    job = client.get_job(id)
    assert_equal "429 from provider", job.last_error
    # The queue's backoff is 0.05 s; only retry_after puts the next attempt an hour away.
    assert_operator Jobbroker.to_time(job.run_at), :>, Time.now + 1800
  end

  def test_heartbeats_keep_a_short_lease_over_a_long_job
    queue = unique_queue
    # The test config's lease is 1 s; the job takes 3 s.
    id = client.enqueue(queue, "slow").job_id
    slow = lambda do |job|
      sleep 3
      raise "lease lost" if job.cancelled?
    end
    with_worker(queue, slow) { wait_for_state(id, :JOB_STATE_COMPLETED) }
    job = client.get_job(id)
    assert_equal 1, job.attempt
    assert_equal [:ATTEMPT_OUTCOME_COMPLETED], job.attempts.map(&:outcome)
  end

  def test_operator_cancel_reaches_the_handler
    queue = unique_queue
    id = client.enqueue(queue, "long").job_id
    reasons = Queue.new
    until_cancelled = lambda do |job|
      sleep 0.05 until job.cancelled?
      reasons << job.cancel_reason
      raise "stopped: #{job.cancel_reason}"
    end
    with_worker(queue, until_cancelled) do
      wait_for_state(id, :JOB_STATE_ACTIVE)
      client.admin.cancel_job(V1::CancelJobRequest.new(job_id: id))
      wait_for_state(id, :JOB_STATE_CANCELLED)
    end
    assert_equal :cancel_requested, reasons.pop
  end

  def test_refused_subscription_raises
    worker = Jobbroker::Worker.new(queues: ["bad queue!"], address: broker.address,
                                   logger: Logger.new(File::NULL)) { |_| nil }
    err = assert_raises(Jobbroker::SubscriptionRefused) { worker.run }
    assert_equal GRPC::Core::StatusCodes::INVALID_ARGUMENT, err.code
  end
end
