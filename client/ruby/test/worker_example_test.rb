# frozen_string_literal: true

require_relative "test_helper"

# Runs examples/worker.rb as a child process against the real broker.
class WorkerExampleTest < Minitest::Test
  include BrokerTestHelpers

  EXAMPLE = File.expand_path("../examples/worker.rb", __dir__)
  LIB = File.expand_path("../lib", __dir__)

  def start_worker(queue, concurrency, prefetch = 0)
    @log = File.join(broker.dir, "worker-#{SecureRandom.hex(4)}.log")
    @pid = Process.spawn({ "JOBBROKER_ADDRESS" => broker.address },
                         RbConfig.ruby, "-I", LIB, EXAMPLE, queue, concurrency.to_s, prefetch.to_s,
                         out: [@log, "w"], err: [:child, :out])
  end

  def worker_output
    File.exist?(@log) ? File.read(@log) : ""
  end

  # SIGTERM, then the exit status (a give-up bound of 60 s, then SIGKILL).
  def terminate_worker
    Process.kill("TERM", @pid)
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 60
    loop do
      _, status = Process.wait2(@pid, Process::WNOHANG)
      if status
        @pid = nil
        return status
      end
      if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
        Process.kill("KILL", @pid)
        Process.wait(@pid)
        @pid = nil
        flunk("worker ignored SIGTERM:\n#{worker_output}")
      end
      sleep 0.05
    end
  end

  def teardown
    return unless @pid

    Process.kill("KILL", @pid)
    Process.wait(@pid)
  end

  def test_jobs_complete_and_sigterm_exits_zero
    queue = unique_queue
    ids = [
      client.enqueue(queue, { "to" => "a@example.com" }).job_id,
      client.enqueue(queue, { "to" => "b@example.com", "fail_attempts" => 1 }).job_id,
      client.enqueue(queue, { "to" => "c@example.com", "work_seconds" => 0.3 }).job_id
    ]
    start_worker(queue, 2)
    ids.each { |id| wait_for_state(id, :JOB_STATE_COMPLETED, timeout: 60) }

    status = terminate_worker
    assert status.success?, "worker exited with #{status.inspect}:\n#{worker_output}"
    out = worker_output
    ids.each { |id| assert_includes out, "sent #{id}" }
    assert_equal [1, 2, 1], ids.map { |id| client.get_job(id).attempt }
    assert_equal "sent", client.get_job(ids[0]).result
  end

  def test_sigterm_finishes_the_running_job_and_releases_the_prefetched_ones
    queue = unique_queue
    # The test config's lease is 1 s: the 4 s job and the prefetched jobs waiting behind it
    # need the worker's heartbeats.
    slow = client.enqueue(queue, { "to" => "slow@example.com", "work_seconds" => 4 },
                          priority: 10).job_id
    rest = Array.new(3) { |i| client.enqueue(queue, { "to" => "u#{i}@example.com" }).job_id }
    # One handler, two prefetched: the slow job runs while two more wait, leased.
    start_worker(queue, 1, 2)
    # ACTIVE at the broker says a job was pushed, not that its handler started: a job still on
    # its way at SIGTERM is released unstarted. So the worker's own line says the slow one runs.
    eventually(timeout: 60, message: "the slow job's handler started") do
      worker_output.include?("working on #{slow}")
    end
    eventually(timeout: 60, message: "two jobs prefetched") do
      rest.count { |id| client.get_job(id).state == :JOB_STATE_ACTIVE } == 2
    end

    status = terminate_worker
    out = worker_output
    assert status.success?, "worker exited with #{status.inspect}:\n#{out}"
    done = client.get_job(slow)
    assert_equal :JOB_STATE_COMPLETED, done.state, out
    assert_equal 1, done.attempt
    # The prefetched jobs went back unstarted: READY, no attempt counted, nothing lost.
    rest.each do |id|
      job = client.get_job(id)
      assert_equal :JOB_STATE_READY, job.state, out
      assert_equal 0, job.attempt
      refute_includes out, "sent #{id}"
    end
    assert_match(/released.?=>2\b|:released=>2\b/, out)
  end
end
