# frozen_string_literal: true

# Ruby client of jobbroker: the generated gRPC stubs (Jobbroker::V1), the connection options
# shared by both sides (Jobbroker::Options), the producer and admin client (Jobbroker::Client)
# and a streaming worker (Jobbroker::Worker).
#
#   client = Jobbroker.connect("127.0.0.1:7070")
#   client.enqueue("emails", { to: "a@example.com" }, dedup_key: "welcome:a")

require "json"
require "grpc"

begin
  require "jobbroker/v1/job_pb"
  require "jobbroker/v1/policy_pb"
  require "jobbroker/v1/steps_pb"
  require "jobbroker/v1/broker_services_pb"
  require "jobbroker/v1/admin_services_pb"
rescue LoadError => e
  raise LoadError, "jobbroker: generated code missing (#{e.message}); run " \
                   "client/ruby/test.sh or the grpc_tools_ruby_protoc command in README.md"
end

require "jobbroker/version"

module Jobbroker
  # The address used when none is given: $JOBBROKER_ADDRESS, else 127.0.0.1:7070.
  def self.default_address
    Options.new.address
  end

  # Returns a Client for the broker at `address`; `opts` are Options' keywords (tls:, token:,
  # deadline:, ...) or `options:` a ready Options.
  def self.connect(address = nil, **opts)
    Client.new(address, **opts)
  end

  # Seconds (Numeric) or a Duration -> Google::Protobuf::Duration; nil stays nil.
  def self.duration(value)
    return nil if value.nil?
    return value if value.is_a?(Google::Protobuf::Duration)

    nanos_total = (value.to_r * 1_000_000_000).round
    Google::Protobuf::Duration.new(seconds: nanos_total.div(1_000_000_000),
                                   nanos: nanos_total % 1_000_000_000)
  end

  # Time or a Timestamp -> Google::Protobuf::Timestamp; nil stays nil.
  def self.timestamp(value)
    return nil if value.nil?
    return value if value.is_a?(Google::Protobuf::Timestamp)

    Google::Protobuf::Timestamp.new(seconds: value.to_i, nanos: value.nsec)
  end

  # A JobState from :ready, "failed", :JOB_STATE_READY or its number; nil is UNSPECIFIED.
  def self.job_state(state)
    return :JOB_STATE_UNSPECIFIED if state.nil?

    enum_value("JOB_STATE", state)
  end

  # An enum value named with or without its prefix (:one or :SCHEDULE_CATCH_UP_ONE); numbers
  # pass through.
  def self.enum_value(prefix, value)
    return value if value.is_a?(Integer)

    name = value.to_s.upcase
    name.start_with?("#{prefix}_") ? name.to_sym : :"#{prefix}_#{name}"
  end

  # A message of `klass` from a Hash of its fields, with seconds (Numeric) for Durations,
  # Times for Timestamps and Hashes for nested messages; a ready message passes through.
  def self.message(klass, fields)
    return fields if fields.is_a?(klass)

    converted = fields.to_h.to_h do |name, value|
      field = klass.descriptor.lookup(name.to_s)
      raise ArgumentError, "#{klass.descriptor.name} has no field #{name}" unless field

      [name.to_sym, message_field(field, value)]
    end
    klass.new(**converted)
  end

  def self.message_field(field, value)
    return value unless field.type == :message && !value.nil?

    case field.subtype.name
    when "google.protobuf.Duration" then duration(value)
    when "google.protobuf.Timestamp" then timestamp(value)
    else value.is_a?(Hash) ? message(field.subtype.msgclass, value) : value
    end
  end
  private_class_method :message_field

  # Timestamp -> Time (nil for an unset one).
  def self.to_time(ts)
    return nil if ts.nil?

    Time.at(ts.seconds, ts.nanos, :nsec)
  end

  # What every call tells the broker about its caller (Admin.ListWorkers shows it).
  def self.client_name
    "jobbroker-ruby/#{VERSION}"
  end

  # Channel arguments of every client: the channel retries a broker that went away after
  # 0.1 s (gRPC's default is 1 s doubling to 120 s), so the worker's own reconnect backoff of
  # 0.1 s to 5 s is what decides how fast it comes back.
  CHANNEL_ARGS = {
    "grpc.initial_reconnect_backoff_ms" => 100,
    "grpc.min_reconnect_backoff_ms" => 100,
    "grpc.max_reconnect_backoff_ms" => 5000
  }.freeze

  # The metadata every call carries: the jobbroker-client name, the bearer token if any.
  def self.call_metadata(token: nil)
    metadata = { "jobbroker-client" => client_name }
    metadata["authorization"] = "Bearer #{token}" if token
    metadata
  end

  # Adds Jobbroker.call_metadata to every call. (A bidi call opened with return_op: true takes
  # its metadata before interceptors run: pass call_metadata to it yourself, as the worker does.)
  class CallMetadata < GRPC::ClientInterceptor
    def initialize(token: nil)
      super()
      @metadata = Jobbroker.call_metadata(token: token)
    end

    def request_response(metadata:, **)
      metadata.merge!(@metadata)
      yield
    end

    def client_streamer(metadata:, **)
      metadata.merge!(@metadata)
      yield
    end

    def server_streamer(metadata:, **)
      metadata.merge!(@metadata)
      yield
    end

    def bidi_streamer(metadata:, **)
      metadata.merge!(@metadata)
      yield
    end
  end

  # A payload as bytes: a String is sent as is, anything else as JSON.
  def self.payload_bytes(payload)
    case payload
    when nil then "".b
    when String then payload.b
    else JSON.generate(payload).b
    end
  end
end

require "jobbroker/options"
require "jobbroker/client"
require "jobbroker/worker"

module Jobbroker
  # Runs ActiveJob jobs from jobbroker queues (jobbroker/active_job; needs ActiveJob).
  autoload :ActiveJobWorker, "jobbroker/active_job"
end

# ActiveJob: `config.active_job.queue_adapter = :jobbroker` looks up
# ActiveJob::QueueAdapters::JobbrokerAdapter. In a Rails app ActiveJob is loaded before the
# Gemfile's gems, so it is defined here; in a program that loads ActiveJob later, it is defined
# when ActiveJob::Base loads (or `require "jobbroker/active_job"` yourself).
if defined?(::ActiveJob)
  require "active_job/queue_adapters/jobbroker_adapter"
elsif defined?(::ActiveSupport) && ::ActiveSupport.respond_to?(:on_load)
  ::ActiveSupport.on_load(:active_job) { require "active_job/queue_adapters/jobbroker_adapter" }
end
