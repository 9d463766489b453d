# frozen_string_literal: true

require "securerandom"
require "jobbroker"

module Jobbroker
  # W3C trace context across the broker: a producer middleware starts a PRODUCER span
  # "<queue> publish" and writes its `traceparent` (and `tracestate`) into the job's headers; a
  # worker middleware reads them back and runs the handler inside a CONSUMER span
  # "<queue> process" whose parent is that producer span, so one trace shows the request that
  # enqueued a job and the work it caused, whichever language worked it.
  #
  #   require "jobbroker/tracing"
  #   tracer = Jobbroker::Tracing::OpenTelemetryTracer.new(OpenTelemetry.tracer_provider.tracer("app"))
  #   client.use(Jobbroker::Tracing::ProducerMiddleware.new(tracer))
  #   worker.use(Jobbroker::Tracing::ConsumerMiddleware.new(tracer))
  #
  # The middlewares speak to a small tracer interface, not to OpenTelemetry itself, because
  # OpenTelemetry's Ruby gems come only from RubyGems.org, which this project's machines cannot
  # reach: the library must load and be tested without them. A tracer is any object with
  #
  #   start_span(name, kind:, parent:, attributes:) -> span
  #       kind :producer or :consumer; parent a Tracing::SpanContext read from the headers, or
  #       nil: the tracer's current span (the producer's caller), if any
  #   with_span(span) { ... }  -> the block's value, with `span` current while it runs (spans
  #       the handler starts become its children)
  #
  # and a span is any object with #context (a Tracing::SpanContext), #error!(exception) (status
  # error, the exception recorded) and #finish. MemoryTracer implements it in memory (tests,
  # and seeing what would be sent); OpenTelemetryTracer adapts an OpenTelemetry tracer.
  module Tracing
    # The part of a span that crosses processes. Ids are lowercase hex (32 and 16 digits).
    SpanContext = Struct.new(:trace_id, :span_id, :trace_flags, :trace_state, keyword_init: true) do
      def sampled?
        (trace_flags.to_i & 1) == 1
      end
    end

    TRACEPARENT = "traceparent"
    TRACESTATE = "tracestate"

    TRACEPARENT_FORMAT = /\A([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?\z/

    # The traceparent header of `context`: "00-<trace id>-<span id>-<flags>".
    def self.traceparent(context)
      format("00-%<trace>s-%<span>s-%<flags>02x", trace: context.trace_id, span: context.span_id,
                                                  flags: context.trace_flags.to_i)
    end

    # The SpanContext a traceparent (and tracestate) header names, or nil when it is missing or
    # malformed (a job from a producer that does not trace starts a new trace). Versions after
    # 00 are read by their first four fields, as the W3C recommendation asks; version ff, all-zero
    # ids and anything else malformed are ignored.
    def self.parse(traceparent, tracestate = nil)
      match = TRACEPARENT_FORMAT.match(traceparent.to_s.strip)
      return nil unless match

      version, trace_id, span_id, flags, rest = match.captures
      return nil if version == "ff" || (version == "00" && rest)
      return nil if trace_id.delete("0").empty? || span_id.delete("0").empty?

      state = tracestate.to_s.strip
      SpanContext.new(trace_id: trace_id, span_id: span_id, trace_flags: flags.to_i(16),
                      trace_state: state.empty? ? nil : state)
    end

    # Writes `context` into `headers` (a Hash or a protobuf map of String to String).
    def self.inject(context, headers)
      headers[TRACEPARENT] = traceparent(context)
      headers[TRACESTATE] = context.trace_state if context.trace_state
      headers
    end

    # The messaging attributes of OpenTelemetry's semantic conventions that both sides set.
    def self.attributes(queue, operation)
      { "messaging.system" => "jobbroker", "messaging.destination.name" => queue.to_s,
        "messaging.operation" => operation }
    end

    # Around Client#enqueue and #enqueue_batch: one PRODUCER span "<queue> publish" per job,
    # its context written into that job's headers (a traceparent already there is replaced:
    # the job's parent is this span). The span ends when the broker answered; a refused enqueue
    # ends it with an error status.
    class ProducerMiddleware
      def initialize(tracer)
        @tracer = tracer
      end

      def call(jobs, next_call)
        spans = jobs.map do |job|
          span = @tracer.start_span("#{job.queue} publish", kind: :producer, parent: nil,
                                                            attributes: Tracing.attributes(job.queue, "publish"))
          Tracing.inject(span.context, job.headers)
          span
        end
        next_call.call
      rescue Exception => e # rubocop:disable Lint/RescueException -- recorded, then re-raised
        spans&.each { |span| span.error!(e) }
        raise
      ensure
        spans&.each(&:finish)
      end
    end

    # Around every handler call: a CONSUMER span "<queue> process", child of the producer span
    # the job's headers name (a new trace when they name none), current while the handler
    # runs. A handler that raises ends it with an error status; a snooze is not an error (the
    # job was given back, nothing failed).
    class ConsumerMiddleware
      def initialize(tracer)
        @tracer = tracer
      end

      def call(job, next_call)
        parent = Tracing.parse(job.headers[TRACEPARENT], job.headers[TRACESTATE])
        attributes = Tracing.attributes(job.queue, "process").merge(
          "messaging.message.id" => job.job_id, "jobbroker.attempt" => job.attempt
        )
        span = @tracer.start_span("#{job.queue} process", kind: :consumer, parent: parent,
                                                          attributes: attributes)
        begin
          @tracer.with_span(span) { next_call.call }
        rescue Snooze
          raise
        rescue Exception => e # rubocop:disable Lint/RescueException -- recorded, then re-raised
          span.error!(e)
          raise
        ensure
          span.finish
        end
      end
    end

    # A tracer that keeps its finished spans in memory (#spans), with a current span per
    # thread: for tests, and to see what a traced program would export. Thread-safe.
    class MemoryTracer
      # What one span recorded. status: :unset or :error (with status_message).
      class Span
        attr_reader :name, :kind, :context, :parent_span_id, :attributes, :status,
                    :status_message, :exception

        def initialize(tracer, name, kind, context, parent_span_id, attributes)
          @tracer = tracer
          @name = name
          @kind = kind
          @context = context
          @parent_span_id = parent_span_id
          @attributes = attributes.dup
          @status = :unset
          @finished = false
        end

        def trace_id
          @context.trace_id
        end

        def span_id
          @context.span_id
        end

        def error!(exception)
          @status = :error
          @status_message = exception.message
          @exception = exception
        end

        def finish
          return if @finished

          @finished = true
          @tracer.record(self)
        end
      end

      def initialize
        @mu = Mutex.new
        @spans = []
      end

      # The finished spans, oldest first.
      def spans
        @mu.synchronize { @spans.dup }
      end

      def start_span(name, kind:, parent: nil, attributes: {})
        parent ||= current&.context
        context = SpanContext.new(trace_id: parent&.trace_id || SecureRandom.hex(16),
                                  span_id: SecureRandom.hex(8),
                                  trace_flags: parent ? parent.trace_flags : 1,
                                  trace_state: parent&.trace_state)
        Span.new(self, name, kind, context, parent&.span_id, attributes)
      end

      def with_span(span)
        stack = (Thread.current[stack_key] ||= [])
        stack.push(span)
        yield
      ensure
        stack.pop
      end

      # The span current on this thread (innermost #with_span), or nil.
      def current
        Thread.current[stack_key]&.last
      end

      # Runs the block with a new span current: what application code does around an enqueue.
      def in_span(name, kind: :internal, attributes: {})
        span = start_span(name, kind: kind, attributes: attributes)
        with_span(span) { yield span }
      ensure
        span&.finish
      end

      # Internal (Span#finish).
      def record(span)
        @mu.synchronize { @spans << span }
      end

      private

      def stack_key
        @stack_key ||= :"jobbroker_tracing_#{object_id}"
      end
    end
  end
end
