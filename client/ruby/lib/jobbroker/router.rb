# frozen_string_literal: true

require "jobbroker/routing_table"
require "jobbroker/stream_groups"

module Jobbroker
  # What the Client and the Worker share to reach a cluster's nodes: the Connection (the given
  # addresses and one channel per address, dialled on first use and kept, with the options'
  # TLS, token and metadata) and the RoutingTable from the latest Admin.GetCluster answer.
  # Internal to the gem.
  #
  # The table is fetched before the first call, and again before the next call after
  # #call_failed (UNAVAILABLE, DEADLINE_EXCEEDED, a Work stream's end: a leader moved, a node
  # died), from whichever address answers first: the nodes of the last table, then the given
  # addresses from the one calls go to now, those whose channel failed its last connect last.
  # In a cluster each call
  # then goes to the leader of its partition (Route). Outside a cluster (a single broker, whose
  # ClusterInfo has no cluster_name) and when a broker answers GetCluster with an error
  # (UNIMPLEMENTED from a broker older than cluster mode, PERMISSION_DENIED for a token without
  # the admin role), the given addresses are used as without routing: calls go to one of them
  # and move to the next after UNAVAILABLE; any node forwards a call to its partition's leader.
  # While no address has answered, every call asks again. A single broker at the one address
  # given is asked once.
  #
  # Thread-safe. One refresh runs at a time; calls that find the table stale meanwhile wait for
  # it and use its answer.
  class Router
    # Which node a call is for: any node, or the leader of a queue's or a job's partition.
    Route = Struct.new(:kind, :key) do
      def self.queue(queue)
        new(:queue, queue.to_s)
      end

      def self.job(job_id)
        new(:job, job_id.to_s)
      end
    end
    Route::ANY = Route.new(:any, nil).freeze

    # Where one call goes. `given_index`: the position in the given addresses when no cluster
    # routes the call (for Connection#advance after UNAVAILABLE); nil when the cluster's table
    # chose the address.
    Target = Struct.new(:address, :given_index)

    TRANSIENT_FAILURE = GRPC::Core::ConnectivityStates::TRANSIENT_FAILURE

    # Called with (method, address) before each call the client or worker sends through #stub
    # with a method name: to see where routing sends calls (tests, debugging).
    attr_accessor :observer

    def initialize(connection)
      @connection = connection
      @refresh_mu = Mutex.new # held while GetCluster is under way
      @mu = Mutex.new
      @state = :unknown # :unknown (no answer yet), :fresh, :stale
      @table = nil
    end

    # Where to send a call for `route` (a Route), after fetching the table if it is stale.
    def target(route)
      refresh_if_needed
      table = @mu.synchronize { @table }
      return given_target unless table&.cluster?

      case route.kind
      when :queue then Target.new(table.address_of_queue(route.key), nil)
      when :job then Target.new(table.address_of_job(route.key), nil)
      else Target.new(table.any_address, nil)
      end
    end

    # The Work streams of a worker over `queues` (docs/worker-contract.md §5): in a cluster one
    # per StreamGroups group, each on its leader (the ANY group on the node that answered, which
    # relays it or answers UNAVAILABLE), as [group, Target] pairs. Without a cluster's table
    # one stream of every queue with the whole `max_in_flight`, at the given address calls go
    # to now (the next one after an UNAVAILABLE end: #call_failed).
    def work_streams(queues, max_in_flight)
      refresh_if_needed
      table = @mu.synchronize { @table }
      unless table&.cluster?
        target = given_target
        return [[StreamGroups::Group.new(target.address, queues, max_in_flight), target]]
      end

      StreamGroups.of(table, queues, max_in_flight).map do |group|
        address = group.address == StreamGroups::ANY ? table.any_address : group.address
        [group, Target.new(address, nil)]
      end
    end

    # The generated stub of `service` at the target's address; `method` (a Symbol) names the
    # call about to be made, for the #observer.
    def stub(service, target, method = nil)
      @observer&.call(method, target.address) if method
      @connection.stub_at(service, target.address)
    end

    # After a call to `target` failed UNAVAILABLE (`unavailable`) or DEADLINE_EXCEEDED, or a
    # Work stream to it ended: it may have gone to a node that no longer leads, or is gone. The
    # next call fetches the table first; without routing, an UNAVAILABLE address is also left
    # for the next given one.
    def call_failed(target, unavailable:)
      @connection.advance(target.given_index) if unavailable && target.given_index
      @mu.synchronize { @state = :stale if @state == :fresh }
    end

    # The next call (or the worker's next grouping) fetches the table first: a worker whose
    # table left some of its queues without a leader asks again after each backoff delay.
    def mark_stale
      @mu.synchronize { @state = :stale if @state == :fresh }
    end

    # The address of calls any node serves, as known now (no GetCluster is made): the node
    # that answered in a cluster, else the given address calls go to.
    def any_address
      table = @mu.synchronize { @table }
      table&.cluster? ? table.any_address : @connection.address
    end

    # The table from the latest answer (after fetching it if it is stale); nil while no
    # address has answered.
    def table
      refresh_if_needed
      @mu.synchronize { @table }
    end

    # The table from the latest answer as held now, without asking for one; nil while no
    # address has answered. (The enqueue coalescer keys jobs by it on the caller's path.)
    def current_table
      @mu.synchronize { @table }
    end

    def close
      @connection.close
    end

    private

    def given_target
      index = @connection.current_index
      Target.new(@connection.address_at(index), index)
    end

    def refresh_needed_locked
      case @state
      when :unknown then true
      when :fresh then false
      # One broker outside a cluster at the one address given: asking again could only tell
      # the same.
      else @table.cluster? || @connection.addresses.size > 1
      end
    end

    def refresh_if_needed
      return unless @mu.synchronize { refresh_needed_locked }

      @refresh_mu.synchronize do
        candidates = @mu.synchronize do
          # Another thread's refresh ran while this one waited.
          return unless refresh_needed_locked

          candidates_locked
        end
        table = fetch(candidates)
        # None answered: the old table (or none) stays, and stays stale.
        return if table.nil?

        @mu.synchronize do
          @table = table
          @state = :fresh
        end
      end
    end

    # [address, given index or nil] pairs in the order to ask them.
    def candidates_locked
      from_table = @table&.cluster? ? @table.node_addresses.map { |address| [address, nil] } : []
      given = @connection.addresses
      start = @connection.current_index
      from_given = Array.new(given.size) do |i|
        index = start + i
        [@connection.address_at(index), index]
      end
      candidates = (from_table + from_given).uniq(&:first)
      # A channel that failed its last connect is asked last.
      failing, others = candidates.partition do |address, _|
        @connection.channel_state(address) == TRANSIENT_FAILURE
      end
      others + failing
    end

    # The table from the first candidate that answers GetCluster, or nil if none did.
    def fetch(candidates)
      candidates.each do |address, given_index|
        info = @connection.routing_stub(address).get_cluster(V1::GetClusterRequest.new,
                                                             deadline: Time.now + fetch_timeout)
        table = RoutingTable.from_cluster_info(info, address)
        @connection.move_to(given_index) if given_index && !table.cluster?
        return table
      rescue GRPC::Unavailable, GRPC::DeadlineExceeded
        next
      rescue GRPC::BadStatus
        # It answered but will not say: it serves every call, forwarding what it does not lead.
        @connection.move_to(given_index) if given_index
        return RoutingTable.single_broker(address)
      end
      nil
    end

    def fetch_timeout
      @connection.options.deadline || Options::DEFAULT_DEADLINE
    end
  end
end
