# frozen_string_literal: true

require_relative "test_helper"

# Jobbroker::Client's Admin calls, enqueue options and enqueue_and_wait against the real broker.
class AdminClientTest < Minitest::Test
  include BrokerTestHelpers

  def worker_for(queue, worker_id: "ruby-admin-test", &handler)
    worker = Jobbroker::Worker.new(address: broker.address, worker_id: worker_id,
                                   logger: quiet_logger)
    worker.handle(queue, &handler)
  end

  def test_enqueue_and_wait_returns_the_completed_job_with_its_result
    queue = unique_queue
    running(worker_for(queue) { |job| { "doubled" => job.json["n"] * 2 } }) do
      job = client.enqueue_and_wait(queue, { "n" => 21 }, wait_timeout: 30)
      assert_equal :JOB_STATE_COMPLETED, job.state
      assert_equal({ "doubled" => 42 }, JSON.parse(job.result))
    end
  end

  def test_enqueue_and_wait_raises_job_failed_naming_the_state
    queue = unique_queue
    running(worker_for(queue) { raise Jobbroker::PermanentError, "no such mailbox" }) do
      err = assert_raises(Jobbroker::JobFailed) do
        client.enqueue_and_wait(queue, "x", wait_timeout: 30)
      end
      assert_equal :JOB_STATE_FAILED, err.state
      assert_equal :FAIL_REASON_PERMANENT, err.job.fail_reason
      assert_match(/JOB_STATE_FAILED.*no such mailbox/, err.message)
    end
  end

  def test_a_job_cancelled_while_waited_for_raises_job_failed_cancelled
    queue = unique_queue
    id = client.enqueue(queue, "x", delay: 3600).job_id
    waiter = Thread.new do
      client.wait_for(id, wait_timeout: 30)
    rescue Jobbroker::JobFailed => e
      e
    end
    eventually { client.get_job(id).state == :JOB_STATE_SCHEDULED }
    client.cancel_job(id)
    err = waiter.value
    assert_kind_of Jobbroker::JobFailed, err
    assert_equal :JOB_STATE_CANCELLED, err.state
  end

  def test_enqueue_and_wait_gives_up_after_its_wait_timeout
    queue = unique_queue
    err = assert_raises(Jobbroker::WaitTimeout) do
      client.enqueue_and_wait(queue, "nobody works this queue", wait_timeout: 0.3)
    end
    assert_equal :JOB_STATE_READY, client.get_job(err.job_id).state
  end

  def test_enqueue_options_cover_every_request_field
    queue = unique_queue
    parent = client.enqueue(queue, "parent").job_id
    expire_at = Time.now + 7200
    id = client.enqueue(queue, { "a" => 1 }, headers: { "h" => "v" }, priority: 3,
                                             max_attempts: 4, lease_duration: 5,
                                             dedup_key: "k-#{queue}", dedup_ttl: 60,
                                             concurrency_key: "tenant", timeout: 2,
                                             expire_at: expire_at, depends_on: [parent]).job_id
    job = client.get_job(id)
    assert_equal :JOB_STATE_WAITING, job.state
    assert_equal [parent], job.depends_on.to_a
    assert_equal({ "h" => "v" }, job.headers.to_h)
    assert_equal [3, 4, "tenant"], [job.priority, job.max_attempts, job.concurrency_key]
    assert_equal 2, job.timeout.seconds
    assert_equal expire_at.to_i, job.expire_at.seconds
    run_at = Time.now + 3600
    later = client.get_job(client.enqueue(queue, "later", run_at: run_at).job_id)
    assert_equal :JOB_STATE_SCHEDULED, later.state
    assert_equal run_at.to_i, later.run_at.seconds
  end

  def test_batch_jobs_may_depend_on_earlier_ones_by_index
    queue = unique_queue
    first, second = client.enqueue_batch([{ queue: queue, payload: "a" },
                                          { queue: queue, payload: "b", depends_on_index: [0] }])
    assert_equal [first.job_id], client.get_job(second.job_id).depends_on.to_a
  end

  def test_job_admin_calls
    queue = unique_queue
    ids = Array.new(3) { |i| client.enqueue(queue, "job #{i}").job_id }
    page = client.list_jobs(queue, state: :ready, page_size: 2)
    assert_equal ids.first(2), page.jobs.map(&:id)
    assert_equal ids, client.each_job(queue).map(&:id)
    assert_equal ids.reverse, client.list_jobs(queue, newest_first: true).jobs.map(&:id)

    assert_equal :JOB_STATE_CANCELLED, client.cancel_job(ids[0]).state
    retried = client.retry_job(ids[0])
    assert_equal :JOB_STATE_READY, retried.job.state
    client.cancel_job(ids[0])
    assert_equal 1, client.retry_job(queue: queue, state: :cancelled, dry_run: true).matched
    client.delete_job(ids[0])
    assert_raises(GRPC::NotFound) { client.get_job(ids[0]) }
    assert_equal [client.get_job(ids[1])], client.watch_job(ids[1]).first(1)
  end

  def test_queue_admin_calls
    queue = unique_queue
    client.enqueue(queue, "x")
    assert_includes client.list_queues.map(&:name), queue
    info = client.update_queue_policy(queue, lease_duration: 42, retry: { max_attempts: 7 })
    assert_equal 42, info.policy.lease_duration.seconds
    assert_equal 7, info.policy.retry.max_attempts
    assert client.pause_queue(queue).policy.paused
    refute client.resume_queue(queue).policy.paused
    assert_equal 1, client.get_queue(queue).counts["JOB_STATE_READY"]
    assert_equal 1, client.purge_queue(queue, states: [:ready])
    assert_equal 0, client.get_queue(queue).counts["JOB_STATE_READY"].to_i
    cluster = client.get_cluster
    assert_operator cluster.partition_count, :>=, 1
  end

  def test_schedule_round_trip
    queue = unique_queue
    id = "ruby-sched-#{SecureRandom.hex(4)}"
    stored = client.put_schedule(id, queue, { "report" => "daily" }, every: 3600, priority: 2)
    assert_equal id, stored.schedule_id
    refute_nil stored.next_run_at
    assert_equal 3600, client.get_schedule(id).every.seconds
    assert_includes client.list_schedules(queue: queue).map(&:schedule_id), id

    run = client.trigger_schedule(id)
    job = client.get_job(run.job_id)
    assert_equal [queue, 2], [job.queue, job.priority]
    assert_equal({ "report" => "daily" }, JSON.parse(job.payload))
    assert_match(/\A#{id}@/, job.dedup_key)

    client.put_schedule(id, queue, "paused now", cron: "0 3 * * *", paused: true)
    assert client.get_schedule(id).paused
    client.delete_schedule(id)
    assert_raises(GRPC::NotFound) { client.get_schedule(id) }
  end

  def test_list_workers_shows_a_running_worker
    queue = unique_queue
    running(worker_for(queue, worker_id: "ruby-listed") { "ok" }) do
      listed = eventually do
        client.list_workers(queue: queue).find { |w| w.worker_id == "ruby-listed" }
      end
      assert_equal [queue], listed.queues.to_a
      assert_equal Jobbroker.client_name, listed.client
      assert_equal 1, listed.streams
    end
  end

  def test_lease_heartbeat_fail_release_and_ack_helpers
    queue = unique_queue
    id = client.enqueue(queue, "x").job_id
    leased = client.lease(queue, worker_id: "ruby-unary", wait: 5).first
    assert_equal id, leased.job_id
    refute client.heartbeat(id, leased.lease_id, progress: { "percent" => 10 }).cancel_requested
    client.release(id, leased.lease_id)
    leased = client.lease(queue, worker_id: "ruby-unary", wait: 5).first
    assert_equal :JOB_STATE_SCHEDULED, client.fail(id, leased.lease_id, "boom").state
    leased = eventually { client.lease(queue, worker_id: "ruby-unary", wait: 1).first }
    client.ack(id, leased.lease_id, { "ok" => true })
    assert_equal({ "ok" => true }, JSON.parse(client.get_job(id).result))
  end
end
