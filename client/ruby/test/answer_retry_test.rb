# frozen_string_literal: true

require_relative "test_helper"
require_relative "stand_in_broker"

# Answers the real broker gives only while a cluster hands a partition over to a new leader
# (tests/interop/conformance.py's cluster_leader_kill), scripted by a StandInBroker
# (test/stand_in_broker.rb): an ack, fail, release or checkpoint save answered UNAVAILABLE
# ("retry"), and a subscription answered UNAVAILABLE on a stream the broker leaves open.
class AnswerRetryTest < Minitest::Test
  include BrokerTestHelpers

  V1 = Jobbroker::V1
  Codes = GRPC::Core::StatusCodes
  Worker = Jobbroker::Worker
  HANDOVER = "partition 0: node-2 leads it but does not serve it at this moment; retry"

  def teardown
    @brokers&.each(&:stop)
  end

  def stand_in(&script)
    (@brokers ||= []) << StandInBroker.new(&script)
    @brokers.last
  end

  def job(id = "job-1", lease = "lease-1")
    V1::LeasedJob.new(job_id: id, lease_id: lease, queue: "q", attempt: 1, max_attempts: 3,
                      payload: "{}",
                      lease_deadline: Google::Protobuf::Timestamp.new(seconds: Time.now.to_i + 60))
  end

  def new_worker(addresses, &handler)
    worker = Jobbroker::Worker.new(options: Jobbroker::Options.new(addresses: Array(addresses)),
                                   worker_id: "ruby-answer-retry-test", grace: 5,
                                   reconnect_initial: 0.05, reconnect_max: 0.2,
                                   logger: Logger.new($stderr, level: :error))
    worker.handle("q", &handler)
  end

  # The requests of `kind` (:ack, :fail, :release, :checkpoint) `broker` received, as
  # [stream index, lease id] in arrival order.
  def answers(broker, kind)
    broker.requests.filter_map do |index, r|
      case r.request
      when :ack then [index, r.ack.lease_id] if kind == :ack
      when :ack_batch then r.ack_batch.acks.map { |a| [index, a.lease_id] }.first if kind == :ack
      when :fail then [index, r.fail.lease_id] if kind == :fail
      when :release then [index, r.release.lease_id] if kind == :release
      when :heartbeat
        [index, r.heartbeat.lease_id] if kind == :checkpoint && !r.heartbeat.checkpoint.empty?
      end
    end
  end

  # Subscribes OK and pushes job-1; then answers the first request of `kind` with UNAVAILABLE
  # and every other one OK; `times` gets the arrival time of each (a heartbeat's kind is
  # :heartbeat, and only checkpoint saves count).
  def refuse_first(kind, times)
    lambda do |s|
      while (r = s.recv)
        case r.request
        when :subscribe
          s.answer(r)
          s.push(job)
        when kind
          if kind == :heartbeat && r.heartbeat.checkpoint.empty?
            s.answer(r) # a plain heartbeat
            next
          end
          times << Worker.monotonic
          times.size == 1 ? s.answer(r, Codes::UNAVAILABLE, HANDOVER) : s.answer(r)
        else
          s.answer(r) unless r.request == :flow
        end
      end
    end
  end

  # §4: an ack answered UNAVAILABLE is sent again (same lease id) after 250 ms.
  def test_an_ack_refused_unavailable_is_sent_again
    times = []
    broker = stand_in(&refuse_first(:ack, times))
    worker = new_worker(broker.address) { |_job| "done" }
    running(worker) do
      eventually(timeout: 10, message: "the refused ack sent again") { times.size >= 2 }
      eventually(timeout: 5, message: "the second ack counted") { worker.stats.acked == 1 }
    end
    assert_equal [[0, "lease-1"], [0, "lease-1"]], answers(broker, :ack)
    assert_operator times[1] - times[0], :>=, 0.2, "sent again after the 250 ms delay, not at once"
    assert_equal 2, worker.stats.ack_messages, "the resend is a second ack message"
  end

  # §4: a fail answered UNAVAILABLE is sent again too (and a release: the same path).
  def test_a_fail_refused_unavailable_is_sent_again
    times = []
    broker = stand_in(&refuse_first(:fail, times))
    worker = new_worker(broker.address) { |_job| raise "boom" }
    running(worker) do
      eventually(timeout: 10, message: "the refused fail sent again") { times.size >= 2 }
      eventually(timeout: 5, message: "the second fail counted") { worker.stats.failed == 1 }
    end
    assert_equal [[0, "lease-1"], [0, "lease-1"]], answers(broker, :fail)
    assert_operator times[1] - times[0], :>=, 0.2
  end

  def test_a_release_refused_unavailable_is_sent_again
    times = []
    broker = stand_in(&refuse_first(:release, times))
    worker = new_worker(broker.address) { |_job| raise Jobbroker::Snooze, 10 }
    running(worker) do
      eventually(timeout: 10, message: "the refused release sent again") { times.size >= 2 }
      eventually(timeout: 5, message: "the second release counted") { worker.stats.released == 1 }
    end
    assert_equal [[0, "lease-1"], [0, "lease-1"]], answers(broker, :release)
  end

  # A durable step's checkpoint save answered UNAVAILABLE is sent again, and the step returns
  # once it is saved: the attempt neither fails nor is the save dropped.
  def test_a_checkpoint_save_refused_unavailable_is_sent_again
    times = []
    broker = stand_in(&refuse_first(:heartbeat, times))
    worker = new_worker(broker.address) { |job| job.step("charge") { 42 } + 1 }
    running(worker) do
      eventually(timeout: 10, message: "the job acked after its step") { worker.stats.acked == 1 }
    end
    assert_equal [[0, "lease-1"], [0, "lease-1"]], answers(broker, :checkpoint)
    assert_operator times[1] - times[0], :>=, 0.2
    assert_equal [], answers(broker, :fail), "the step did not fail the attempt"
    ack = broker.requests.map(&:last).find { |r| r.request == :ack }
    assert_equal "43", ack.ack.result
  end

  # §4: refused UNAVAILABLE and the stream ends before the 250 ms: the ack goes out on the next
  # stream, same lease id.
  def test_an_ack_refused_unavailable_goes_out_on_the_next_stream
    broker = stand_in do |s|
      while (r = s.recv)
        case r.request
        when :subscribe
          s.answer(r)
          s.push(job) if s.index.zero?
        when :ack
          if s.index.zero?
            s.answer(r, Codes::UNAVAILABLE, HANDOVER)
            s.finish(Codes::UNAVAILABLE) # the relay's leader changed: the stream ends
          else
            s.answer(r)
          end
        else
          s.answer(r) unless r.request == :flow
        end
      end
    end
    worker = new_worker(broker.address) { |_job| "done" }
    running(worker) do
      eventually(timeout: 10, message: "the ack on the second stream") do
        worker.stats.acked == 1
      end
    end
    assert_equal [[0, "lease-1"], [1, "lease-1"]], answers(broker, :ack)
  end

  # A subscription answered UNAVAILABLE on a stream the broker leaves open (a queue's partition
  # has no leader yet): the worker ends that stream itself and subscribes again on a new one
  # after its backoff, instead of waiting on a stream that will never push.
  def test_a_subscription_refused_unavailable_on_an_open_stream_is_a_reconnect
    broker = stand_in do |s|
      while (r = s.recv)
        case r.request
        when :subscribe
          if s.index.zero?
            s.answer(r, Codes::UNAVAILABLE, "partition 1 of q has no leader yet")
          else
            s.answer(r)
            s.push(job)
          end
        when :flow then nil
        else s.answer(r)
        end
      end
    end
    worker = new_worker(broker.address) { |_job| "done" }
    running(worker) do
      eventually(timeout: 10, message: "the job acked on a second stream") do
        worker.stats.acked == 1
      end
    end
    assert_equal [[1, "lease-1"]], answers(broker, :ack)
    assert_equal 1, worker.stats.reconnects
  end

  # The same with a cluster's addresses: the refusal counts as a stream that ended UNAVAILABLE,
  # so the worker moves to the next address (§5 "Several addresses").
  def test_a_subscription_refused_unavailable_moves_to_the_next_address
    leaderless = stand_in do |s|
      while (r = s.recv)
        s.answer(r, Codes::UNAVAILABLE, "partition 1 of q has no leader yet") if
          r.request == :subscribe
      end
    end
    serving = stand_in do |s|
      while (r = s.recv)
        case r.request
        when :subscribe
          s.answer(r)
          s.push(job)
        when :flow then nil
        else s.answer(r)
        end
      end
    end
    worker = new_worker([leaderless.address, serving.address]) { |_job| "done" }
    running(worker) do
      eventually(timeout: 10, message: "the job acked by way of the second address") do
        worker.stats.acked == 1
      end
    end
    assert_equal 1, leaderless.stream_count
    assert_equal [[0, "lease-1"]], answers(serving, :ack)
  end

  # Any other code on an open stream ends the run call with that error, as before.
  def test_a_subscription_refused_invalid_argument_on_an_open_stream_ends_run
    broker = stand_in do |s|
      while (r = s.recv)
        s.answer(r, Codes::INVALID_ARGUMENT, "bad queue name") if r.request == :subscribe
      end
    end
    worker = new_worker(broker.address) { |_job| "done" }
    error = Timeout.timeout(20) { assert_raises(Jobbroker::SubscriptionRefused) { worker.run } }
    assert_equal Codes::INVALID_ARGUMENT, error.code
    assert_includes error.message, "bad queue name"
    assert_equal 1, broker.stream_count
  end
end
