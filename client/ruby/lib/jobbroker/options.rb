# frozen_string_literal: true

module Jobbroker
  # How a Client or a Worker reaches the broker: one object shared by both, so a program that
  # produces and works jobs configures its connection once.
  #
  #   options = Jobbroker::Options.new(address: "broker:7070", tls: "/etc/jobbroker/ca.pem",
  #                                    cert: "client.pem", key: "client-key.pem",
  #                                    token: ENV["BILLING_TOKEN"])
  #   client = Jobbroker::Client.new(options: options)
  #   worker = Jobbroker::Worker.new(options: options, concurrency: 4)
  #
  # Immutable; #with returns a changed copy.
  class Options
    DEFAULT_ADDRESS = "127.0.0.1:7070"
    # Seconds a unary call may take unless the call names its own deadline. Streams (Work,
    # WatchJob) have none: they live as long as their reader wants.
    DEFAULT_DEADLINE = 10
    # Keepalive (seconds): a connection that carried nothing from the broker for
    # DEFAULT_KEEPALIVE_TIME is pinged, and given up when the ping has no answer within
    # DEFAULT_KEEPALIVE_TIMEOUT (its calls, a Worker's Work stream above all, end UNAVAILABLE and
    # the worker reconnects). TCP alone does not notice a broker that froze, lost power or sits
    # behind a firewall that drops packets: a stream on such a connection would wait forever.
    DEFAULT_KEEPALIVE_TIME = 10
    DEFAULT_KEEPALIVE_TIMEOUT = 5
    # gRPC's channel arguments are C ints of milliseconds.
    MAX_KEEPALIVE_SECONDS = (2**31 - 1) / 1000
    # Enqueue coalescing (docs/worker-contract.md §10): the defaults of the batch_* options.
    DEFAULT_BATCH_MAX_JOBS = 100
    DEFAULT_BATCH_MAX_BYTES = 1024 * 1024
    DEFAULT_BATCH_LINGER = 0
    DEFAULT_BATCH_MAX_IN_FLIGHT = 4
    # The broker refuses an EnqueueBatch of more jobs than this.
    BATCH_MAX_JOBS_LIMIT = 1000

    # addresses:    "host:port" strings: a cluster's nodes, asked for its leaders (Router);
    #               outside a cluster tried in order, after UNAVAILABLE the next one.
    # tls:          nil/false = plaintext; true = TLS trusting the system roots; a String = TLS
    #               trusting that CA (a file path, or the PEM itself).
    # cert, key:    the client certificate chain and its key for mutual TLS (paths or PEM);
    #               both or neither, and only with tls.
    # server_name:  the name the broker's certificate must carry, when the address does not.
    # token:        the bearer token sent as `authorization: Bearer T` on every call.
    # deadline:     seconds for each unary call (nil = none).
    # keepalive_time:    seconds without a frame from the broker after which the channel pings
    #                    it, with or without a call open, as often as that (no cap on pings
    #                    without data between); nil = no pings (gRPC's default). The broker
    #                    closes a connection that pings more often than once a second.
    # keepalive_timeout: seconds a ping waits for its answer; then the connection is closed
    #                    and its calls end UNAVAILABLE (the Worker reconnects with its backoff).
    # channel_args: extra gRPC channel arguments, over Jobbroker::CHANNEL_ARGS and the
    #               keepalive's (grpc.keepalive_time_ms, grpc.keepalive_timeout_ms,
    #               grpc.http2.ping_timeout_ms, grpc.keepalive_permit_without_calls,
    #               grpc.http2.max_pings_without_data): a key given here wins.
    # interceptors: extra GRPC::ClientInterceptors, after the one that adds the metadata.
    # credentials:  a ready GRPC::Core::ChannelCredentials (or :this_channel_is_insecure),
    #               instead of tls/cert/key: the escape hatch for what they cannot say.
    # Enqueue coalescing (the Client's; a Worker ignores them; README "Enqueue coalescing"):
    # batching:            true: concurrent Client#enqueue calls share EnqueueBatch calls;
    #                      false: every enqueue is one unary Enqueue.
    # batch_max_jobs:      a batch is sent once it holds this many jobs (1 to 1000).
    # batch_max_bytes:     ... or once its jobs' payload and header bytes reach this.
    # batch_linger:        seconds a batch that could be sent waits for more jobs (0: none).
    # batch_max_in_flight: batches of one partition in flight at once; later jobs wait.
    attr_reader :addresses, :tls, :cert, :key, :server_name, :token, :deadline, :channel_args,
                :interceptors, :batching, :batch_max_jobs, :batch_max_bytes, :batch_linger,
                :batch_max_in_flight, :keepalive_time, :keepalive_timeout

    # `address` and `token` default to $JOBBROKER_ADDRESS (several may be given, comma
    # separated) and $JOBBROKER_TOKEN, then to 127.0.0.1:7070 and no token.
    def initialize(address: nil, addresses: nil, tls: nil, cert: nil, key: nil, server_name: nil,
                   token: nil, deadline: DEFAULT_DEADLINE, channel_args: {}, interceptors: [],
                   credentials: nil, batching: true, batch_max_jobs: DEFAULT_BATCH_MAX_JOBS,
                   batch_max_bytes: DEFAULT_BATCH_MAX_BYTES, batch_linger: DEFAULT_BATCH_LINGER,
                   batch_max_in_flight: DEFAULT_BATCH_MAX_IN_FLIGHT,
                   keepalive_time: DEFAULT_KEEPALIVE_TIME,
                   keepalive_timeout: DEFAULT_KEEPALIVE_TIMEOUT)
      @addresses = resolve_addresses(address, addresses).freeze
      raise ArgumentError, "cert and key go together (mutual TLS)" if cert.nil? != key.nil?
      raise ArgumentError, "a client certificate needs tls (the CA to trust)" if cert && !tls
      raise ArgumentError, "credentials replace tls/cert/key: give one or the other" if
        credentials && (tls || cert)

      @tls = tls
      @cert = cert
      @key = key
      @server_name = server_name
      env_token = ENV.fetch("JOBBROKER_TOKEN", "")
      @token = token || (env_token.empty? ? nil : env_token)
      @deadline = deadline
      @channel_args = channel_args.dup.freeze
      @interceptors = interceptors.dup.freeze
      @credentials = credentials
      @batching = batching
      @batch_max_jobs = batch_max_jobs
      @batch_max_bytes = batch_max_bytes
      @batch_linger = batch_linger
      @batch_max_in_flight = batch_max_in_flight
      @keepalive_time = keepalive_time
      @keepalive_timeout = keepalive_timeout
      validate_batching
      validate_keepalive
      freeze
    end

    # A copy with the given fields changed (keyword arguments as for #initialize).
    def with(**changes)
      fields = { addresses: @addresses, tls: @tls, cert: @cert, key: @key,
                 server_name: @server_name, token: @token, deadline: @deadline,
                 channel_args: @channel_args, interceptors: @interceptors,
                 credentials: @credentials, batching: @batching, batch_max_jobs: @batch_max_jobs,
                 batch_max_bytes: @batch_max_bytes, batch_linger: @batch_linger,
                 batch_max_in_flight: @batch_max_in_flight, keepalive_time: @keepalive_time,
                 keepalive_timeout: @keepalive_timeout }
      fields.delete(:addresses) if changes.key?(:address)
      self.class.new(**fields, **changes)
    end

    # The first address.
    def address
      @addresses.first
    end

    # The channel credentials: plaintext, TLS or mutual TLS. Files are read here, so a missing
    # one raises Errno::ENOENT when the first channel is made.
    def credentials
      return @credentials if @credentials
      return :this_channel_is_insecure unless @tls

      roots = @tls == true ? nil : self.class.pem(@tls)
      return GRPC::Core::ChannelCredentials.new(roots) unless @cert

      GRPC::Core::ChannelCredentials.new(roots, self.class.pem(@key), self.class.pem(@cert))
    end

    # The channel arguments of every channel these options make: Jobbroker::CHANNEL_ARGS, the
    # keepalive's, then `channel_args` (which win).
    def all_channel_args
      args = Jobbroker::CHANNEL_ARGS.merge(keepalive_args, @channel_args)
      args = args.merge("grpc.ssl_target_name_override" => @server_name) if @server_name
      args
    end

    # The channel arguments of the keepalive; none when keepalive_time is nil.
    def keepalive_args
      return {} if @keepalive_time.nil?

      timeout = millis(@keepalive_timeout)
      {
        "grpc.keepalive_time_ms" => millis(@keepalive_time),
        "grpc.keepalive_timeout_ms" => timeout,
        # Newer gRPC cores (grpcio 1.85's, for one) wait this long for any ping's answer
        # (default 60 s), and a keepalive ping that falls due while another ping is out rides on
        # that one, with its timeout. grpc 1.51 does not know it (its keepalive_timeout is
        # enough there); set so that a newer grpc gem still gives up after keepalive_timeout.
        "grpc.http2.ping_timeout_ms" => timeout,
        # Pings on a channel without a call too (a producer between calls): a dead connection
        # is dropped before the next call would find it.
        "grpc.keepalive_permit_without_calls" => 1,
        # gRPC stops pinging after two pings with no data sent between (its default): an idle
        # Work stream would be checked twice, then never again.
        "grpc.http2.max_pings_without_data" => 0
      }
    end

    # The metadata of every call: jobbroker-client and, with a token, authorization.
    def metadata
      Jobbroker.call_metadata(token: @token)
    end

    # PEM text: the String itself when it holds PEM, else the file it names.
    def self.pem(path_or_pem)
      text = path_or_pem.to_s
      text.include?("-----BEGIN") ? text : File.read(text)
    end

    def inspect
      "#<Jobbroker::Options addresses=#{@addresses} tls=#{!!@tls} mtls=#{!@cert.nil?} " \
        "token=#{@token ? '[set]' : 'none'} deadline=#{@deadline.inspect} " \
        "keepalive=#{@keepalive_time.inspect}/#{@keepalive_timeout.inspect} " \
        "batching=#{@batching}>"
    end

    private

    # A wrong value is refused here, where it was written, rather than on the first enqueue.
    def validate_batching
      refuse(:batching, @batching, "true or false") unless [true, false].include?(@batching)
      unless @batch_max_jobs.is_a?(Integer) && @batch_max_jobs.between?(1, BATCH_MAX_JOBS_LIMIT)
        refuse(:batch_max_jobs, @batch_max_jobs, "an Integer from 1 to #{BATCH_MAX_JOBS_LIMIT}")
      end
      refuse(:batch_max_bytes, @batch_max_bytes, "a positive Integer (bytes)") unless
        @batch_max_bytes.is_a?(Integer) && @batch_max_bytes.positive?
      refuse(:batch_linger, @batch_linger, "seconds >= 0 (a finite Numeric)") unless
        @batch_linger.is_a?(Numeric) && @batch_linger.real? && @batch_linger.finite? &&
        !@batch_linger.negative?
      refuse(:batch_max_in_flight, @batch_max_in_flight, "a positive Integer") unless
        @batch_max_in_flight.is_a?(Integer) && @batch_max_in_flight.positive?
    end

    def validate_keepalive
      expected = "seconds > 0 and at most #{MAX_KEEPALIVE_SECONDS.floor} (a finite Numeric)"
      refuse(:keepalive_time, @keepalive_time, "nil (no pings) or #{expected}") unless
        @keepalive_time.nil? || keepalive_seconds?(@keepalive_time)
      refuse(:keepalive_timeout, @keepalive_timeout, expected) unless
        keepalive_seconds?(@keepalive_timeout)
    end

    def keepalive_seconds?(value)
      value.is_a?(Numeric) && value.real? && value.positive? && value <= MAX_KEEPALIVE_SECONDS
    end

    # Seconds as a channel argument's milliseconds (at least 1).
    def millis(seconds)
      [(seconds * 1000).round, 1].max
    end

    def refuse(option, value, expected)
      raise ArgumentError, "#{option} must be #{expected}, not #{value.inspect}"
    end

    def resolve_addresses(address, addresses)
      raise ArgumentError, "give address or addresses, not both" if address && addresses

      list = addresses ? Array(addresses) : [address].compact
      list = ENV.fetch("JOBBROKER_ADDRESS", "").split(",") if list.empty?
      list = list.map { |a| a.to_s.strip }.reject(&:empty?)
      list.empty? ? [DEFAULT_ADDRESS] : list
    end
  end

  # Grpc 1.51 refuses any call in a child once the parent process used gRPC; this says what to
  # do about it instead of gRPC's one-line message.
  class ForkError < StandardError; end

  # The channels and stubs of one Options, one per address, made on first use and kept; and
  # which of the given addresses calls go to when no cluster routes them (Router). Shared by
  # the Client and the Worker. Thread-safe.
  #
  # Fork safety: nothing is connected until the first call, and a process that finds the
  # channels were made by another process (its parent, before a fork: Puma's preload_app)
  # drops them and connects anew. gRPC's channels are not fork-safe, so they are never reused
  # across a fork. grpc-ruby before 1.57 goes further and refuses every call in a child whose
  # parent had used gRPC: that is raised as ForkError (make no call in the parent before
  # forking, e.g. create clients in Puma's on_worker_boot, or only use them in workers).
  class Connection
    attr_reader :options

    def initialize(options)
      @options = options
      @mu = Mutex.new
      @pid = nil
      @channels = {}
      @stubs = {}
      @current = 0
    end

    # The given addresses.
    def addresses
      @options.addresses
    end

    # The given address calls go to now.
    def address
      address_at(@current)
    end

    # The index of the current address, for #advance.
    def current_index
      @current
    end

    # The given address at `index`, counted round.
    def address_at(index)
      addresses[index % addresses.size]
    end

    # After UNAVAILABLE from the address at `from`: calls go to the next one. A no-op when
    # another thread already moved on.
    def advance(from)
      @mu.synchronize { @current = from + 1 if @current == from }
    end

    # Calls go to the given address at `index` (the one that answered the Router).
    def move_to(index)
      @mu.synchronize { @current = index }
    end

    # The generated stub `service` (V1::Broker or V1::Admin) for `address`, with the options'
    # interceptors.
    def stub_at(service, address)
      @mu.synchronize do
        reset_after_fork_locked
        @stubs[[service, address]] ||= new_stub(service, address, interceptors)
      end
    end

    # An Admin stub for `address` that adds only the metadata (token, client name): the
    # Router's own GetCluster is not a call of the program, so the options' interceptors
    # (tracing, counting the program's calls) do not see it.
    def routing_stub(address)
      @mu.synchronize do
        reset_after_fork_locked
        @stubs[[:routing, address]] ||= new_stub(V1::Admin, address, [call_metadata])
      end
    end

    # The connectivity state of `address`'s channel (GRPC::Core::ConnectivityStates), without
    # making it connect.
    def channel_state(address)
      @mu.synchronize { channel_locked(address) }.connectivity_state(false)
    end

    # Closes every channel; calls made afterwards connect again.
    def close
      @mu.synchronize do
        @channels.each_value(&:close) if @pid == Process.pid
        @channels = {}
        @stubs = {}
      end
    end

    private

    def new_channel(address)
      GRPC::Core::Channel.new(address, @options.all_channel_args, @options.credentials)
    rescue RuntimeError => e
      raise unless e.message.include?("fork")

      raise ForkError, "gRPC #{GRPC::VERSION} cannot be used in a process forked after its " \
                       "parent used gRPC: make the first jobbroker call after the fork (Puma: " \
                       "in on_worker_boot or lazily in the workers, never in the master)"
    end

    def new_stub(service, address, interceptors)
      # The channel carries the credentials; the stub's own argument is then unused.
      service::Stub.new(address, :this_channel_is_insecure,
                        channel_override: channel_locked(address), interceptors: interceptors)
    end

    def channel_locked(address)
      reset_after_fork_locked
      @channels[address] ||= new_channel(address)
    end

    # Channels made by another process belong to it: forget them without closing them (that
    # would touch state the parent still uses).
    def reset_after_fork_locked
      return if @pid == Process.pid

      @channels = {}
      @stubs = {}
      @pid = Process.pid
    end

    def call_metadata
      CallMetadata.new(token: @options.token)
    end

    def interceptors
      [call_metadata, *@options.interceptors]
    end
  end
end
