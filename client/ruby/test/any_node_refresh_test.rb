# frozen_string_literal: true

require_relative "test_helper"
require_relative "stand_in_broker"

# docs/worker-contract.md §5, "One stream per leading node": while the worker has a group for
# any node it fetches the table again after each backoff delay and regroups. After a leader
# dies the worker's table may show a partition without a leader; a node that already knows the
# new leader relays that group's stream instead of refusing it, and no leader change would end
# that relay. A real cluster cannot be held in that state on demand (the table and the relaying
# node's knowledge race), so two StandInBrokers play the two nodes and their GetCluster answers
# first name no leader, then node b. The real-process tests of the grouping are in
# test/cluster_routing_test.rb.
class AnyNodeRefreshTest < Minitest::Test
  include BrokerTestHelpers

  V1 = Jobbroker::V1

  def setup
    @mu = Mutex.new
    @leader = "" # partition 0's leader_node_id in every GetCluster answer
    layout = -> { cluster_info }
    # Subscribes OK (node a relays the stream); node b pushes one job on its stream.
    script = lambda do |s|
      while (r = s.recv)
        case r.request
        when :subscribe
          s.answer(r)
          s.push(job) if s.broker.equal?(@b)
        when :flow then nil
        else s.answer(r)
        end
      end
    end
    @a = StandInBroker.new(cluster: layout, &script)
    @b = StandInBroker.new(cluster: layout, &script)
  end

  def teardown
    @a&.stop
    @b&.stop
  end

  def cluster_info
    leader = @mu.synchronize { @leader }
    V1::ClusterInfo.new(
      cluster_name: "stand-in", partition_count: 1, node_id: "a",
      nodes: [V1::NodeInfo.new(node_id: "a", address: @a.address, alive: true),
              V1::NodeInfo.new(node_id: "b", address: @b.address, alive: true)],
      partitions: [V1::PartitionInfo.new(partition: 0, leader_node_id: leader)]
    )
  end

  def job
    V1::LeasedJob.new(job_id: "job-1", lease_id: "lease-1", queue: "q", attempt: 1,
                      max_attempts: 3, payload: "{}",
                      lease_deadline: Google::Protobuf::Timestamp.new(seconds: Time.now.to_i + 60))
  end

  # The subscribes `broker` received, as [stream index, queues, max_in_flight].
  def subscribes(broker)
    broker.requests.filter_map do |index, r|
      [index, r.subscribe.queues.to_a, r.subscribe.max_in_flight] if r.request == :subscribe
    end
  end

  def test_queues_sent_to_any_node_move_to_their_leader_once_the_table_names_it
    worker = Jobbroker::Worker.new(options: Jobbroker::Options.new(addresses: [@a.address]),
                                   worker_id: "ruby-any-node-refresh-test", concurrency: 2,
                                   grace: 5, reconnect_initial: 0.05, reconnect_max: 0.2,
                                   logger: quiet_logger)
    worker.handle("q") { |_job| "done" }
    running(worker) do
      # No leader in the table: one stream for any node, on the node that answered (a relays).
      eventually(timeout: 20, message: "the any-node stream subscribed at a") do
        subscribes(@a) == [[0, ["q"], 2]]
      end
      # No stream ends, yet the worker keeps asking where the queue is led; regrouping keeps
      # the unchanged stream.
      asked = @a.get_cluster_calls + @b.get_cluster_calls
      eventually(timeout: 20, message: "the table fetched again while relayed") do
        @a.get_cluster_calls + @b.get_cluster_calls >= asked + 3
      end
      assert_equal 1, @a.stream_count, "the any-node stream was kept while its group stayed"
      assert_equal 0, @b.stream_count

      # The table now names b: the queue moves to b's own stream and a's is ended.
      @mu.synchronize { @leader = "b" }
      eventually(timeout: 20, message: "the queue subscribed on its leader's stream") do
        subscribes(@b) == [[0, ["q"], 2]]
      end
      eventually(timeout: 20, message: "the relayed stream ended by the worker") do
        @a.stream(0).requests_ended?
      end
      eventually(timeout: 20, message: "b's job acked on b's stream") { worker.stats.acked == 1 }
      assert_equal [[0, "lease-1"]], acks(@b)

      # No group for any node now: no more refreshes, nothing reopened. (A bound on nothing
      # happening, not a speed assertion: 1 s is five times the longest backoff delay.)
      asked = @a.get_cluster_calls + @b.get_cluster_calls
      sleep 1.0
      assert_equal asked, @a.get_cluster_calls + @b.get_cluster_calls,
                   "the table not fetched again without a group for any node"
      assert_equal 1, @a.stream_count
      assert_equal 1, @b.stream_count
      assert_equal 0, worker.stats.reconnects, "no stream ended on its own"
    end
  end

  def acks(broker)
    broker.requests.filter_map do |index, r|
      case r.request
      when :ack then [index, r.ack.lease_id]
      when :ack_batch then [index, r.ack_batch.acks.first.lease_id]
      end
    end
  end
end
