# frozen_string_literal: true

# Plugs an OpenTelemetry tracer (the opentelemetry-api gem, 1.x) into Jobbroker::Tracing:
#
#   require "opentelemetry/sdk"
#   require "jobbroker/tracing/open_telemetry"
#   OpenTelemetry::SDK.configure
#   tracer = Jobbroker::Tracing::OpenTelemetryTracer.new(OpenTelemetry.tracer_provider.tracer("billing"))
#   client.use(Jobbroker::Tracing::ProducerMiddleware.new(tracer))
#   worker.use(Jobbroker::Tracing::ConsumerMiddleware.new(tracer))
#
# OpenTelemetry is an optional dependency: nothing else in the library requires this file, and
# the gemspec does not name the gem. It is written against opentelemetry-api's documented
# interface (Tracer#start_span with_parent:/kind:, Trace.context_with_span,
# Trace.non_recording_span, SpanContext, Status.error) and, because RubyGems.org is out of
# this project's reach, has not run against the real gem here.

require "opentelemetry"
require "jobbroker/tracing"

module Jobbroker
  module Tracing
    # The Jobbroker::Tracing tracer interface over an OpenTelemetry::Trace::Tracer.
    class OpenTelemetryTracer
      # What the middlewares hold: the OpenTelemetry span, seen through Tracing's interface.
      class Span
        attr_reader :otel_span

        def initialize(otel_span)
          @otel_span = otel_span
        end

        def context
          c = @otel_span.context
          state = c.tracestate.to_s
          SpanContext.new(trace_id: c.hex_trace_id, span_id: c.hex_span_id,
                          trace_flags: c.trace_flags.sampled? ? 1 : 0,
                          trace_state: state.empty? ? nil : state)
        end

        def error!(exception)
          @otel_span.record_exception(exception)
          @otel_span.status = OpenTelemetry::Trace::Status.error(exception.message)
        end

        def finish
          @otel_span.finish
        end
      end

      def initialize(otel_tracer)
        @tracer = otel_tracer
      end

      # A parent read from a job's headers becomes a remote, non-recording span in an empty
      # context; no parent means OpenTelemetry's current context (the caller's span).
      def start_span(name, kind:, parent: nil, attributes: {})
        with_parent = parent ? remote_context(parent) : nil
        Span.new(@tracer.start_span(name, with_parent: with_parent, kind: kind,
                                          attributes: attributes))
      end

      def with_span(span, &block)
        OpenTelemetry::Trace.with_span(span.otel_span) { block.call }
      end

      private

      def remote_context(parent)
        span_context = OpenTelemetry::Trace::SpanContext.new(
          trace_id: [parent.trace_id].pack("H*"), span_id: [parent.span_id].pack("H*"),
          trace_flags: OpenTelemetry::Trace::TraceFlags.from_byte(parent.trace_flags.to_i),
          tracestate: OpenTelemetry::Trace::Tracestate.from_string(parent.trace_state.to_s),
          remote: true
        )
        OpenTelemetry::Trace.context_with_span(OpenTelemetry::Trace.non_recording_span(span_context),
                                               parent_context: OpenTelemetry::Context.empty)
      end
    end
  end
end
