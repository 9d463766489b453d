# frozen_string_literal: true

require_relative "test_helper"

# When the Router asks GetCluster, and what it does with the answer, against a stand-in Admin
# service on an ephemeral port: its answers (a cluster naming it the leader of every
# partition, a refusal, an UNAVAILABLE call) are scripted, and it counts the GetCluster calls.
class RouterTest < Minitest::Test
  V1 = Jobbroker::V1
  Codes = GRPC::Core::StatusCodes

  # Admin.GetCluster answered by `cluster_answer` (a lambda of the stand-in's address: a
  # ClusterInfo, or a GRPC::BadStatus to raise) after `delay` seconds; ListQueues raises
  # the next of `list_queues_errors`, then answers.
  class StandInAdmin
    attr_reader :address

    def initialize(cluster_answer:, delay: 0, list_queues_errors: [])
      @mu = Mutex.new
      @get_cluster_calls = 0
      @list_queues_errors = list_queues_errors.dup
      @server = GRPC::RpcServer.new(pool_size: 16)
      port = @server.add_http2_port("127.0.0.1:0", :this_port_is_insecure)
      @address = "127.0.0.1:#{port}"
      admin = self
      service = Class.new(V1::Admin::Service) do
        define_method(:get_cluster) do |_request, _call|
          admin.count_get_cluster
          sleep delay
          answer = cluster_answer.call(admin.address)
          raise answer if answer.is_a?(Exception)

          answer
        end
        define_method(:list_queues) { |_request, _call| admin.list_queues }
      end
      @server.handle(service.new)
      @thread = Thread.new { @server.run_till_terminated }
      @server.wait_till_running(10) or raise "the stand-in Admin service did not start"
    end

    def count_get_cluster
      @mu.synchronize { @get_cluster_calls += 1 }
    end

    def get_cluster_calls
      @mu.synchronize { @get_cluster_calls }
    end

    def list_queues
      error = @mu.synchronize { @list_queues_errors.shift }
      raise error if error

      V1::ListQueuesResponse.new
    end

    def stop
      @server.stop
      @thread.join(10)
    end
  end

  def teardown
    @client&.close
    @admins&.each(&:stop)
  end

  def stand_in(**script)
    (@admins ||= []) << StandInAdmin.new(**script)
    @admins.last
  end

  def cluster_led_by(address)
    V1::ClusterInfo.new(
      cluster_name: "stand-in", partition_count: 2, node_id: "n0",
      nodes: [V1::NodeInfo.new(node_id: "n0", address: address, alive: true)],
      partitions: (0..1).map { |p| V1::PartitionInfo.new(partition: p, leader_node_id: "n0") }
    )
  end

  def client_of(*addresses)
    @client = Jobbroker::Client.new(addresses: addresses, deadline: 5)
    @targets = []
    @client.router.observer = ->(method, address) { @targets << [method, address] }
    @client
  end

  def test_concurrent_first_calls_share_one_get_cluster
    admin = stand_in(cluster_answer: ->(address) { cluster_led_by(address) }, delay: 0.3)
    client = client_of(admin.address)
    Array.new(8) { Thread.new { client.list_queues } }.each(&:join)
    assert_equal 1, admin.get_cluster_calls
    assert_equal [[:list_queues, admin.address]] * 8, @targets
  end

  def test_a_call_that_failed_unavailable_makes_the_next_one_ask_again
    admin = stand_in(cluster_answer: ->(address) { cluster_led_by(address) },
                     list_queues_errors: [GRPC::Unavailable.new("draining")])
    client = client_of(admin.address)
    client.list_queues # UNAVAILABLE, then retried after a new GetCluster
    assert_equal 2, admin.get_cluster_calls
    client.list_queues
    assert_equal 2, admin.get_cluster_calls, "a fresh table is not asked for again"
  end

  def test_a_get_cluster_refused_uses_the_given_addresses_as_they_are
    [Codes::PERMISSION_DENIED, Codes::UNIMPLEMENTED].each do |code|
      refusal = ->(_) { GRPC::BadStatus.new_status_exception(code, "not for this token") }
      admin = stand_in(cluster_answer: refusal)
      client = client_of(dead_address, admin.address)
      client.list_queues
      assert_equal admin.address, client.address
      # Straight to the address that answered, not first to the dead one.
      assert_equal [[:list_queues, admin.address]], @targets
      client.close
    end
  end

  def test_no_answer_leaves_calls_on_the_given_addresses_and_asks_again
    client = client_of(dead_address)
    assert_raises(GRPC::Unavailable) { client.list_queues }
    assert_nil client.router.table
  end
end
