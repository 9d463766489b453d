# frozen_string_literal: true

require_relative "test_helper"
require "jobbroker/testing"

# Jobbroker::Testing: fake! and inline! with no broker (the client points at a dead address,
# so any call that reached the network would fail), and disable! going to the real broker.
class TestingTest < Minitest::Test
  T = Jobbroker::Testing

  def setup
    T.reset!
    @client = Jobbroker::Client.new(dead_address, deadline: 1)
  end

  def teardown
    T.reset!
  end

  def new_worker
    Jobbroker::Worker.new(address: dead_address, logger: Logger.new(nil))
  end

  def test_fake_records_enqueues_after_the_producer_middleware
    T.fake!
    @client.use do |jobs, next_call|
      jobs.each { |job| job.headers["tenant"] = "t7" }
      next_call.call
    end
    first = @client.enqueue("emails", { "to" => "a@example.com" }, priority: 5, delay: 60)
    @client.enqueue("sms", "hello")
    batch = @client.enqueue_batch([{ queue: "emails", payload: { "to" => "b@example.com" } }])

    emails = T.jobs("emails")
    assert_equal [first.job_id, batch.first.job_id], emails.map(&:job_id)
    assert_equal "a@example.com", emails.first.json["to"]
    assert_equal({ "tenant" => "t7" }, emails.first.headers)
    assert_equal 5, emails.first.priority
    assert_in_delta Time.now + 60, emails.first.run_at, 2
    assert_equal "hello", T.jobs("sms").first.text
    assert_equal 3, T.jobs.size
    assert_equal %w[emails sms], T.queues.keys.sort

    T.clear!("sms")
    assert_empty T.jobs("sms")
    T.clear!
    assert_empty T.jobs
  end

  def test_a_dedup_key_seen_before_returns_the_first_job
    T.fake!
    first = @client.enqueue("emails", "x", dedup_key: "welcome:1")
    again = @client.enqueue("emails", "x", dedup_key: "welcome:1")
    assert_equal first.job_id, again.job_id
    assert again.deduplicated
    refute first.deduplicated
    assert_equal 1, T.jobs("emails").size
  end

  def test_drain_runs_through_the_workers_handlers_and_middleware
    T.fake!
    seen = []
    worker = new_worker
    worker.use do |job, next_call|
      seen << "before #{job.queue}"
      next_call.call.tap { seen << "after #{job.queue}" }
    end
    worker.handle("emails") do |job|
      id = job.step("send") { "msg-#{job.json['n']}" }
      job.progress({ "percent" => 100 })
      @client.enqueue("audit", { "sent" => id }) # enqueued while draining: drained too
      { "message_id" => id, "attempt" => job.attempt, "key" => job.idempotency_key }
    end
    T.handle("audit") { |job| seen << "audit #{job.json['sent']}" }

    low = @client.enqueue("emails", { "n" => 1 })
    high = @client.enqueue("emails", { "n" => 2 }, priority: 9, dedup_key: "k2")
    assert_equal 4, T.drain
    assert_empty T.jobs
    assert_equal ["before emails", "after emails", "before emails", "after emails",
                  "audit msg-2", "audit msg-1"], seen # higher priority first

    done = T.find(high.job_id)
    assert_equal :completed, done.state
    assert_equal({ "message_id" => "msg-2", "attempt" => 1, "key" => "k2" }, JSON.parse(done.result))
    assert_equal ['{"percent":100}'], done.progress
    assert_equal low.job_id, JSON.parse(T.find(low.job_id).result)["key"]
    steps = Jobbroker::V1::StepCheckpoint.decode(done.checkpoint).steps
    assert_equal [["send", '"msg-2"']], steps.map { |s| [s.name, s.result] }
  end

  def test_drain_of_one_queue_leaves_the_others
    T.fake!
    T.handle("a") { nil }
    T.handle("b") { nil }
    @client.enqueue("a", "1")
    @client.enqueue("b", "2")
    assert_equal 1, T.drain("a")
    assert_equal ["b"], T.jobs.map(&:queue)
  end

  def test_a_handlers_exception_propagates_out_of_drain
    T.fake!
    T.handle("emails") { |job| raise Jobbroker::PermanentError, "bad address #{job.text}" }
    id = @client.enqueue("emails", "nobody").job_id
    @client.enqueue("emails", "second")
    error = assert_raises(Jobbroker::PermanentError) { T.drain("emails") }
    assert_equal "bad address nobody", error.message
    assert_equal :failed, T.find(id).state
    assert_equal ["second"], T.jobs("emails").map(&:text), "the others stay pending"
  end

  def test_a_job_without_a_handler_says_so
    T.fake!
    @client.enqueue("nobody-handles-this", "x")
    error = assert_raises(T::NoHandler) { T.drain }
    assert_match(/nobody-handles-this/, error.message)
  end

  def test_inline_runs_the_handler_before_enqueue_returns
    results = []
    new_worker.handle("emails") { |job| results << job.json["to"] }
    T.inline! do
      @client.enqueue("emails", { "to" => "a@example.com" })
      assert_equal ["a@example.com"], results
      @client.enqueue_batch([{ queue: "emails", payload: { "to" => "b@example.com" } },
                             { queue: "emails", payload: { "to" => "c@example.com" } }])
      assert_equal %w[a@example.com b@example.com c@example.com], results
      assert_empty T.jobs
    end
    assert_equal :disabled, T.mode, "the block restored the mode"
  end

  def test_inline_raises_the_handlers_exception_from_enqueue
    T.handle("emails") { raise ArgumentError, "boom" }
    T.inline!
    assert_raises(ArgumentError) { @client.enqueue("emails", "x") }
  end

  def test_modes_and_blocks
    assert_equal :disabled, T.mode
    refute T.enabled?
    T.fake! do
      assert T.fake?
      T.inline! { assert T.inline? }
      assert T.fake?, "the inner block restored fake"
    end
    refute T.enabled?
  end
end

# disable! (the default): enqueues reach the real broker even with the file loaded.
class TestingDisabledTest < Minitest::Test
  include BrokerTestHelpers

  def test_disabled_sends_to_the_broker
    Jobbroker::Testing.reset!
    queue = unique_queue
    id = Jobbroker::Testing.fake! { Jobbroker::Testing.disable! { client.enqueue(queue, "real").job_id } }
    assert_equal "real", client.get_job(id).payload
    assert_empty Jobbroker::Testing.jobs
  end
end
