# frozen_string_literal: true

# Ruby client of jobbroker: the generated gRPC stubs (Jobbroker::V1) plus a small producer
# helper (Jobbroker::Client) and a streaming worker (Jobbroker::Worker).
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
    ENV.fetch("JOBBROKER_ADDRESS", "127.0.0.1:7070")
  end

  # Returns a Client for the broker at `address` (plaintext).
  def self.connect(address = default_address, **opts)
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

  # A channel to `address` with CHANNEL_ARGS (plus `channel_args`).
  def self.channel(address, credentials: :this_channel_is_insecure, channel_args: {})
    GRPC::Core::Channel.new(address, CHANNEL_ARGS.merge(channel_args), credentials)
  end

  # The Broker stub the worker uses: its own channel, the client metadata on every call.
  def self.broker_stub(address, credentials: :this_channel_is_insecure, token: nil)
    V1::Broker::Stub.new(address, credentials,
                         channel_override: channel(address, credentials: credentials),
                         interceptors: [CallMetadata.new(token: token)])
  end

  # A payload as bytes: a String is sent as is, anything else as JSON.
  def self.payload_bytes(payload)
    case payload
    when nil then "".b
    when String then payload.b
    else JSON.generate(payload).b
    end
  end

  # Producer and admin calls on one channel. Errors are the gRPC status exceptions
  # (GRPC::InvalidArgument, GRPC::AlreadyExists, GRPC::NotFound, ...), each with #code.
  # Thread-safe: the stubs may be shared by threads.
  class Client
    # The raw generated stubs, for every call not wrapped here.
    attr_reader :broker, :admin, :address

    # `timeout`: per-call deadline in seconds (nil = none). `token`: a bearer token sent with
    # every call, if the broker wants one.
    def initialize(address = Jobbroker.default_address, timeout: 30,
                   credentials: :this_channel_is_insecure, channel_args: {}, token: nil)
      @address = address
      @timeout = timeout
      @channel = Jobbroker.channel(address, credentials: credentials, channel_args: channel_args)
      interceptors = [CallMetadata.new(token: token)]
      @broker = V1::Broker::Stub.new(address, credentials, channel_override: @channel,
                                                           interceptors: interceptors)
      @admin = V1::Admin::Stub.new(address, credentials, channel_override: @channel,
                                                         interceptors: interceptors)
    end

    # Adds one job; returns the EnqueueResponse (#job_id, #deduplicated).
    # `payload`: a String (bytes) or any JSON-able value. Durations in seconds, run_at a Time.
    def enqueue(queue, payload = nil, **options)
      @broker.enqueue(self.class.enqueue_request(queue, payload, **options), deadline: deadline)
    end

    # Adds several jobs, all or nothing. `jobs`: hashes with :queue, :payload and the options
    # of #enqueue. Returns the EnqueueResponses in order.
    def enqueue_batch(jobs)
      reqs = jobs.map do |j|
        j = j.dup
        self.class.enqueue_request(j.delete(:queue), j.delete(:payload), **j)
      end
      @broker.enqueue_batch(V1::EnqueueBatchRequest.new(jobs: reqs), deadline: deadline).results.to_a
    end

    # The job as the Admin service shows it (Jobbroker::V1::Job). GRPC::NotFound if unknown.
    def get_job(job_id)
      @admin.get_job(V1::GetJobRequest.new(job_id: job_id), deadline: deadline)
    end

    # Closes the channel; the client is unusable afterwards.
    def close
      @channel.close
    end

    # Builds an EnqueueRequest from keyword options (see #enqueue).
    def self.enqueue_request(queue, payload = nil, headers: {}, priority: 0, delay: nil,
                             run_at: nil, dedup_key: "", dedup_ttl: nil, max_attempts: 0,
                             lease_duration: nil, concurrency_key: "")
      V1::EnqueueRequest.new(
        queue: queue.to_s, payload: Jobbroker.payload_bytes(payload),
        headers: headers.to_h { |k, v| [k.to_s, v.to_s] }, priority: priority,
        delay: Jobbroker.duration(delay), run_at: Jobbroker.timestamp(run_at),
        dedup_key: dedup_key.to_s, dedup_ttl: Jobbroker.duration(dedup_ttl),
        max_attempts: max_attempts, lease_duration: Jobbroker.duration(lease_duration),
        concurrency_key: concurrency_key.to_s
      )
    end

    private

    def deadline
      @timeout && Time.now + @timeout
    end
  end
end

require "jobbroker/worker"
