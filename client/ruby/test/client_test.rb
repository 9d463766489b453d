# frozen_string_literal: true

require_relative "test_helper"

# The generated stubs and Jobbroker::Client against the real broker: unary calls and the raw
# Work stream protocol.
class ClientTest < Minitest::Test
  include BrokerTestHelpers

  def lease_one(queue, lease_duration: nil)
    resp = client.broker.lease(
      V1::LeaseRequest.new(queue: queue, worker_id: "ruby-test", max_jobs: 1,
                           wait: Jobbroker.duration(10),
                           lease_duration: Jobbroker.duration(lease_duration)),
      deadline: Time.now + 30
    )
    assert_equal 1, resp.jobs.size, "expected one leased job"
    resp.jobs.first
  end

  def test_enqueue_lease_heartbeat_ack
    queue = unique_queue
    enq = client.enqueue(queue, { "to" => "a@example.com" }, headers: { "trace" => "t1" },
                                                             max_attempts: 4)
    refute_empty enq.job_id
    refute enq.deduplicated
    assert_equal :JOB_STATE_READY, client.get_job(enq.job_id).state

    job = lease_one(queue, lease_duration: 1)
    assert_equal enq.job_id, job.job_id
    assert_equal({ "to" => "a@example.com" }, JSON.parse(job.payload))
    assert_equal({ "trace" => "t1" }, job.headers.to_h)
    assert_equal 1, job.attempt
    assert_equal 4, job.max_attempts
    assert_equal enq.job_id, job.idempotency_key
    assert_equal :JOB_STATE_ACTIVE, client.get_job(job.job_id).state

    hb = client.broker.heartbeat(V1::HeartbeatRequest.new(
                                   job_id: job.job_id, lease_id: job.lease_id,
                                   extend_by: Jobbroker.duration(60), checkpoint: "step-1"
                                 ))
    assert_operator Jobbroker.to_time(hb.lease_deadline), :>, Jobbroker.to_time(job.lease_deadline)
    refute hb.cancel_requested
    assert_equal "step-1", client.get_job(job.job_id).checkpoint

    client.broker.ack(V1::AckRequest.new(job_id: job.job_id, lease_id: job.lease_id,
                                         result: "sent"))
    done = client.get_job(job.job_id)
    assert_equal :JOB_STATE_COMPLETED, done.state
    assert_equal 1, done.attempt
    assert_equal "sent", done.result
    assert_equal [:ATTEMPT_OUTCOME_COMPLETED], done.attempts.map(&:outcome)
  end

  def test_fail_is_retried_as_attempt_two
    queue = unique_queue
    id = client.enqueue(queue, "x").job_id
    first = lease_one(queue)
    resp = client.broker.fail(V1::FailRequest.new(job_id: id, lease_id: first.lease_id,
                                                  error: "smtp timeout"))
    assert_equal :JOB_STATE_SCHEDULED, resp.state
    refute_nil resp.next_attempt_at

    second = lease_one(queue)
    assert_equal id, second.job_id
    assert_equal 2, second.attempt
    refute_equal first.lease_id, second.lease_id
    client.broker.ack(V1::AckRequest.new(job_id: id, lease_id: second.lease_id))

    job = client.get_job(id)
    assert_equal :JOB_STATE_COMPLETED, job.state
    assert_equal 2, job.attempt
    assert_equal "smtp timeout", job.attempts.first.error
    assert_equal %i[ATTEMPT_OUTCOME_ERROR ATTEMPT_OUTCOME_COMPLETED], job.attempts.map(&:outcome)
  end

  def test_stale_lease_is_refused_with_failed_precondition
    queue = unique_queue
    id = client.enqueue(queue, "x").job_id
    first = lease_one(queue)
    client.broker.fail(V1::FailRequest.new(job_id: id, lease_id: first.lease_id, error: "boom"))
    second = lease_one(queue)
    err = assert_raises(GRPC::FailedPrecondition) do
      client.broker.ack(V1::AckRequest.new(job_id: id, lease_id: first.lease_id))
    end
    assert_equal GRPC::Core::StatusCodes::FAILED_PRECONDITION, err.code
    client.broker.ack(V1::AckRequest.new(job_id: id, lease_id: second.lease_id))
  end

  def test_permanent_fail_kills_the_job_after_one_attempt
    queue = unique_queue
    id = client.enqueue(queue, "bad address").job_id
    job = lease_one(queue)
    resp = client.broker.fail(V1::FailRequest.new(job_id: id, lease_id: job.lease_id,
                                                  error: "no such mailbox", permanent: true))
    assert_equal :JOB_STATE_FAILED, resp.state

    dead = client.get_job(id)
    assert_equal :JOB_STATE_FAILED, dead.state
    assert_equal :FAIL_REASON_PERMANENT, dead.fail_reason
    assert_equal 1, dead.attempt
    assert_equal "no such mailbox", dead.last_error
  end

  def test_dedup_key_returns_the_same_job
    queue = unique_queue
    first = client.enqueue(queue, "welcome", dedup_key: "welcome:user_7")
    second = client.enqueue(queue, "welcome", dedup_key: "welcome:user_7")
    refute first.deduplicated
    assert second.deduplicated
    assert_equal first.job_id, second.job_id
    assert_equal "welcome:user_7", client.get_job(first.job_id).idempotency_key

    err = assert_raises(GRPC::AlreadyExists) do
      client.enqueue(queue, "another payload", dedup_key: "welcome:user_7")
    end
    assert_equal GRPC::Core::StatusCodes::ALREADY_EXISTS, err.code
  end

  def test_empty_queue_name_is_invalid_argument
    err = assert_raises(GRPC::InvalidArgument) { client.enqueue("", "x") }
    assert_equal GRPC::Core::StatusCodes::INVALID_ARGUMENT, err.code
    assert_match(/queue/, err.details)
    assert_kind_of GRPC::BadStatus, err
  end

  def test_unknown_job_is_not_found
    err = assert_raises(GRPC::NotFound) { client.get_job("01HZZZZZZZZZZZZZZZZZZZZZZZ") }
    assert_equal GRPC::Core::StatusCodes::NOT_FOUND, err.code
  end

  def test_enqueue_batch_and_options
    queue = unique_queue
    results = client.enqueue_batch([
                                     { queue: queue, payload: "a", priority: 1 },
                                     { queue: queue, payload: "b", delay: 3600,
                                       concurrency_key: "tenant-1" }
                                   ])
    assert_equal 2, results.size
    ready = client.get_job(results[0].job_id)
    assert_equal :JOB_STATE_READY, ready.state
    assert_equal 1, ready.priority
    delayed = client.get_job(results[1].job_id)
    assert_equal :JOB_STATE_SCHEDULED, delayed.state
    assert_equal "tenant-1", delayed.concurrency_key

    err = assert_raises(GRPC::InvalidArgument) do
      client.enqueue_batch([{ queue: queue, payload: "ok" }, { queue: "", payload: "bad" }])
    end
    assert_equal GRPC::Core::StatusCodes::INVALID_ARGUMENT, err.code
  end

  # The raw Work stream: subscribe, receive a pushed job, heartbeat, ack, all on one stream.
  def test_work_stream_protocol
    queue = unique_queue
    id = client.enqueue(queue, "streamed").job_id
    requests = Queue.new
    enum = Enumerator.new { |y| while (r = requests.pop) do y << r end }
    responses = client.broker.work(enum, deadline: Time.now + 60)

    requests << V1::WorkRequest.new(
      request_id: 1, subscribe: V1::SubscribeRequest.new(queues: [queue], worker_id: "ruby-raw",
                                                         max_in_flight: 1)
    )
    seen = []
    job = nil
    responses.each do |resp|
      seen << resp
      case resp.response
      when :job
        job = resp.job
        requests << V1::WorkRequest.new(request_id: 2, heartbeat: V1::HeartbeatRequest.new(
          job_id: job.job_id, lease_id: job.lease_id
        ))
      when :result
        assert_equal 0, resp.result.code, resp.result.message
        case resp.result.request_id
        when 2
          refute_nil resp.result.lease_deadline
          requests << V1::WorkRequest.new(request_id: 3, ack: V1::AckRequest.new(
            job_id: job.job_id, lease_id: job.lease_id
          ))
        when 3
          requests.close # half-close: the broker ends the stream
        end
      end
    end
    assert_equal id, job.job_id
    assert_equal [1, 2, 3], seen.select(&:result).map { |r| r.result.request_id }
    assert_equal :JOB_STATE_COMPLETED, client.get_job(id).state
  end

  def test_work_stream_refuses_a_bad_queue_name
    requests = Queue.new
    enum = Enumerator.new { |y| while (r = requests.pop) do y << r end }
    responses = client.broker.work(enum, deadline: Time.now + 30)
    requests << V1::WorkRequest.new(
      request_id: 7, subscribe: V1::SubscribeRequest.new(queues: ["bad queue!"], worker_id: "w")
    )
    code = nil
    begin
      responses.each do |resp|
        next unless resp.result

        code = resp.result.code
        requests.close
      end
    rescue GRPC::BadStatus => e
      code = e.code
    end
    assert_equal GRPC::Core::StatusCodes::INVALID_ARGUMENT, code
  end
end
