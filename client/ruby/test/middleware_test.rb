# frozen_string_literal: true

require_relative "test_helper"
require "jobbroker/tracing"

# Middleware on both sides (worker-contract.md §9) and the W3C trace context they carry,
# against the real broker.
class MiddlewareTest < Minitest::Test
  include BrokerTestHelpers

  def worker_on(queue, &handler)
    worker = Jobbroker::Worker.new(address: broker.address, logger: quiet_logger,
                                   worker_id: "ruby-middleware-test")
    worker.handle(queue, &handler)
  end

  def test_worker_middleware_runs_first_registered_outermost
    queue = unique_queue
    order = Queue.new
    worker = worker_on(queue) do |job|
      order << "handler"
      job.text
    end
    worker.use do |job, next_call|
      order << "outer in #{job.queue == queue}"
      result = next_call.call
      order << "outer out"
      "#{result}+outer"
    end
    worker.use(->(_job, next_call) { order << "inner"; "#{next_call.call}+inner" })
    id = client.enqueue(queue, "r").job_id
    running(worker) { wait_for_state(id, :JOB_STATE_COMPLETED) }
    assert_equal ["outer in true", "inner", "handler", "outer out"], Array.new(4) { order.pop }
    assert_equal "r+inner+outer", client.get_job(id).result
  end

  def test_worker_middleware_may_answer_without_calling_the_handler
    queue = unique_queue
    worker = worker_on(queue) { flunk("the handler must not run") }
    worker.use { |_job, _next_call| raise Jobbroker::PermanentError, "refused by middleware" }
    id = client.enqueue(queue, "x").job_id
    running(worker) do
      job = wait_for_state(id, :JOB_STATE_FAILED)
      assert_equal "refused by middleware", job.last_error
    end
  end

  def test_producer_middleware_wraps_enqueue_and_may_add_headers
    queue = unique_queue
    seen = []
    traced = Jobbroker::Client.new(address: broker.address)
    traced.use do |jobs, next_call|
      jobs.each { |job| job.headers["tenant"] = "acme" }
      seen << :before
      responses = next_call.call
      seen << responses.map(&:job_id)
      responses
    end
    traced.use { |jobs, next_call| seen << jobs.size; next_call.call }
    id = traced.enqueue(queue, "x").job_id
    assert_equal [:before, 1, [id]], seen
    assert_equal({ "tenant" => "acme" }, client.get_job(id).headers.to_h)
    seen.clear
    batch_ids = traced.enqueue_batch([{ queue: queue, payload: "a" },
                                      { queue: queue, payload: "b" }]).map(&:job_id)
    assert_equal [:before, 2, batch_ids], seen
    assert_equal(["acme"] * 2, batch_ids.map { |job_id| client.get_job(job_id).headers["tenant"] })
  ensure
    traced&.close
  end

  # The end-to-end check of tracing: the producer's span and the consumer's span are one
  # trace, the consumer the producer's child, across the real broker.
  def test_traced_producer_and_worker_share_one_trace
    tracer = Jobbroker::Tracing::MemoryTracer.new
    queue = unique_queue
    traced = Jobbroker::Client.new(address: broker.address)
    traced.use(Jobbroker::Tracing::ProducerMiddleware.new(tracer))
    inner_parent = Queue.new
    worker = worker_on(queue) do |job|
      inner_parent << tracer.current&.span_id
      raise "first attempt fails" if job.attempt == 1

      "ok"
    end
    worker.use(Jobbroker::Tracing::ConsumerMiddleware.new(tracer))
    id = tracer.in_span("signup request") { traced.enqueue(queue, { "user" => 7 }).job_id }
    headers = client.get_job(id).headers.to_h
    running(worker) { wait_for_state(id, :JOB_STATE_COMPLETED) }

    request = tracer.spans.find { |s| s.name == "signup request" }
    producer = tracer.spans.find { |s| s.kind == :producer }
    consumers = tracer.spans.select { |s| s.kind == :consumer }
    assert_equal "#{queue} publish", producer.name
    assert_equal request.span_id, producer.parent_span_id
    assert_equal Jobbroker::Tracing.traceparent(producer.context), headers["traceparent"]
    assert_equal ["#{queue} process"] * 2, consumers.map(&:name)
    consumers.each do |consumer|
      assert_equal producer.trace_id, consumer.trace_id
      assert_equal producer.span_id, consumer.parent_span_id
      assert_equal id, consumer.attributes["messaging.message.id"]
    end
    assert_equal %i[error unset], consumers.map(&:status)
    assert_equal "first attempt fails", consumers.first.status_message
    assert_equal consumers.map(&:span_id), [inner_parent.pop, inner_parent.pop],
                 "the consumer span is current while the handler runs"
  ensure
    traced&.close
  end

  def test_a_traced_batch_gets_one_publish_span_per_job
    tracer = Jobbroker::Tracing::MemoryTracer.new
    traced = Jobbroker::Client.new(address: broker.address)
    traced.use(Jobbroker::Tracing::ProducerMiddleware.new(tracer))
    queues = [unique_queue("a"), unique_queue("b")]
    ids = traced.enqueue_batch(queues.map { |q| { queue: q, payload: "x" } }).map(&:job_id)
    spans = tracer.spans
    assert_equal queues.map { |q| "#{q} publish" }, spans.map(&:name)
    ids.zip(spans).each do |id, span|
      assert_equal Jobbroker::Tracing.traceparent(span.context), client.get_job(id).headers["traceparent"]
    end
  ensure
    traced&.close
  end

  def test_traceparent_round_trip_and_malformed_headers
    context = Jobbroker::Tracing::SpanContext.new(trace_id: "4bf92f3577b34da6a3ce929d0e0e4736",
                                                  span_id: "00f067aa0ba902b7", trace_flags: 1,
                                                  trace_state: "vendor=x")
    header = Jobbroker::Tracing.traceparent(context)
    assert_equal "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", header
    assert_equal context, Jobbroker::Tracing.parse(header, "vendor=x")
    assert_equal "4bf92f3577b34da6a3ce929d0e0e4736",
                 Jobbroker::Tracing.parse("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00-more")
                                   .trace_id
    [nil, "", "garbage", "00-#{'0' * 32}-00f067aa0ba902b7-01",
     "00-4bf92f3577b34da6a3ce929d0e0e4736-#{'0' * 16}-01",
     "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
     "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
     "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra"].each do |bad|
      assert_nil Jobbroker::Tracing.parse(bad), "#{bad.inspect} is not a traceparent"
    end
  end
end
