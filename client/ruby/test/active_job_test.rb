# frozen_string_literal: true

require_relative "test_helper"
require "jobbroker/active_job"
require "jobbroker/testing"
require_relative "fixtures/active_job_jobs"

ActiveJob::Base.logger = Logger.new(nil)

# The ActiveJob adapter against the real broker: jobs enqueued here (queue_adapter =
# :jobbroker, as the railtie sets it) run in `jobbroker-activejob`, a separate process that
# loads a minimal Rails app configured with config.active_job.queue_adapter = :jobbroker.
class ActiveJobTest < Minitest::Test
  include BrokerTestHelpers

  ROOT = File.expand_path("..", __dir__)
  APP = File.join(__dir__, "fixtures", "active_job_app.rb")

  def setup
    ActiveJob::QueueAdapters::JobbrokerAdapter.client = client
    ActiveJob::Base.queue_adapter = :jobbroker
    @dir = Dir.mktmpdir("jobbroker-activejob-")
  end

  def teardown
    ActiveJob::QueueAdapters::JobbrokerAdapter.client = nil
    ActiveJob::Base.queue_adapter = :async
    Jobbroker::Testing.reset!
    if @pid
      Process.kill("KILL", @pid)
      Process.wait(@pid)
    end
    FileUtils.remove_entry(@dir)
  end

  def mark(name)
    path = File.join(@dir, "#{name}.json")
    File.exist?(path) ? JSON.parse(File.read(path)) : nil
  end

  def start_worker(queue)
    @log = File.join(@dir, "worker.log")
    env = { "JOBBROKER_ADDRESS" => broker.address, "RUBYLIB" => nil, "RUBYOPT" => nil }
    @pid = Process.spawn(env, RbConfig.ruby, "-I", File.join(ROOT, "lib"),
                         File.join(ROOT, "exe", "jobbroker-activejob"), "-r", APP, "-q", queue,
                         "-c", "2", out: [@log, "w"], err: %i[child out])
  end

  def stop_worker
    Process.kill("TERM", @pid)
    _, status = Timeout.timeout(60) { Process.wait2(@pid) }
    @pid = nil
    status
  end

  def test_the_adapter_is_found_by_its_symbol
    assert_instance_of ActiveJob::QueueAdapters::JobbrokerAdapter, ActiveJob::Base.queue_adapter
    assert_equal "jobbroker", ActiveJob::Base.queue_adapter_name
  end

  def test_jobs_enqueued_here_run_in_the_rails_worker_process
    queue = unique_queue("aj")
    now = MarkJob.set(queue: queue, priority: 7).perform_later(@dir, "now", "a" => 1)
    scheduled_at = Time.now + 2
    later = MarkJob.set(queue: queue, wait_until: scheduled_at).perform_later(@dir, "later")
    flaky = FlakyThenChainJob.set(queue: queue).perform_later(@dir, queue)

    # What the broker holds: one job per ActiveJob job, its provider_job_id.
    stored = client.get_job(now.provider_job_id)
    assert_equal queue, stored.queue
    assert_equal 7, stored.priority
    assert_equal "MarkJob", stored.headers["activejob-class"]
    data = JSON.parse(stored.payload)
    assert_equal ["MarkJob", now.job_id, queue], data.values_at("job_class", "job_id", "queue_name")
    assert_equal "activejob:#{now.job_id}:0", stored.dedup_key
    waiting = client.get_job(later.provider_job_id)
    assert_equal :JOB_STATE_SCHEDULED, waiting.state
    assert_in_delta scheduled_at.to_f, Jobbroker.to_time(waiting.run_at).to_f, 0.01

    start_worker(queue)
    eventually(timeout: 60, message: "the jobs' side effects") do
      mark("now") && mark("later") && mark("chained")
    end
    ran = mark("now")
    refute_equal Process.pid, ran["pid"], "performed in the worker process"
    assert_equal({ "a" => 1 }, ran["extra"])
    assert_equal [now.provider_job_id, queue, 7], ran.values_at("provider_job_id", "queue", "priority")
    assert_operator mark("later")["at"], :>=, scheduled_at.to_f - 0.01, "not before wait_until"
    # The first attempt raised: the broker retried it, and the second enqueued a job through
    # the Rails app's configured adapter, which ran too.
    done = wait_for_state(flaky.provider_job_id, :JOB_STATE_COMPLETED)
    assert_equal 2, done.attempt
    assert_equal({ "by" => "FlakyThenChainJob" }, mark("chained")["extra"])
    wait_for_state(now.provider_job_id, :JOB_STATE_COMPLETED)

    status = stop_worker
    assert status.success?, "worker exited #{status.inspect}:\n#{File.read(@log)}"
  end

  def test_an_enqueue_repeated_by_a_retried_attempt_makes_no_second_job
    queue = unique_queue("aj")
    job = MarkJob.new(@dir, "once")
    job.queue_name = queue
    first = ActiveJob::Base.queue_adapter.enqueue(job).provider_job_id
    ActiveJob::Base.queue_adapter.enqueue(job) # the same job_id and executions
    assert_equal [first], client.list_jobs(queue, state: :ready).jobs.map(&:id)
  end

  # No broker: Jobbroker::Testing with the ActiveJob worker's handlers.
  def test_inline_and_fake_testing_run_active_jobs_without_a_broker
    ActiveJob::QueueAdapters::JobbrokerAdapter.client =
      Jobbroker::Client.new(dead_address, deadline: 1)
    Jobbroker::ActiveJobWorker.new(queues: ["aj-inline"], logger: quiet_logger,
                                   options: Jobbroker::Options.new(address: dead_address))

    Jobbroker::Testing.inline! do
      MarkJob.set(queue: "aj-inline").perform_later(@dir, "inline")
    end
    refute_nil mark("inline"), "performed before perform_later returned"

    Jobbroker::Testing.fake! do
      job = MarkJob.set(queue: "aj-inline", priority: 3).perform_later(@dir, "faked")
      recorded = Jobbroker::Testing.jobs("aj-inline")
      assert_equal [job.provider_job_id], recorded.map(&:job_id)
      assert_equal "MarkJob", recorded.first.json["job_class"]
      assert_equal 3, recorded.first.priority
      assert_nil mark("faked")
      assert_equal 1, Jobbroker::Testing.drain("aj-inline")
      assert_equal job.provider_job_id, mark("faked")["provider_job_id"]
    end
  end
end
