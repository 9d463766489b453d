# frozen_string_literal: true

require_relative "test_helper"

# The client and the worker against a real 3-node cluster of 4 partitions: every call goes
# straight to its partition's leader, and both follow a leader killed with kill -9. The
# cluster is started once for the class and stopped after the run.
class ClusterRoutingTest < Minitest::Test
  include BrokerTestHelpers

  PARTITIONS = 4
  # A give-up bound for the cluster's recovery, not a speed assertion.
  RECOVERY = 60

  def self.cluster
    @cluster ||= ClusterProcess.new(partitions: PARTITIONS).tap do |c|
      Minitest.after_run { c.stop }
    end
  end

  def cluster
    self.class.cluster
  end

  def setup
    @calls = []
    @calls_mu = Mutex.new
  end

  def teardown
    @routed&.close
  end

  # A client of the cluster's addresses whose every call's method and target address are
  # recorded in @calls.
  def routed_client
    @routed ||= Jobbroker::Client.new(addresses: cluster.addresses).tap do |c|
      c.router.observer = lambda do |method, address|
        @calls_mu.synchronize { @calls << [method, address] }
      end
    end
  end

  def calls_of(method)
    @calls_mu.synchronize { @calls.select { |m, _| m == method }.map(&:last) }
  end

  # A fresh queue name that lives in partition `partition`.
  def queue_in(partition)
    loop do
      queue = unique_queue("cl")
      return queue if Jobbroker::Partition.of_queue(queue, PARTITIONS) == partition
    end
  end

  def leader_of(info, partition)
    ClusterProcess.leader_address(info, partition)
  end

  # Retries `block` after transient errors (a partition between leaders) for up to RECOVERY
  # seconds.
  def through_failover(what)
    give_up_at = Time.now + RECOVERY
    begin
      yield
    rescue GRPC::Unavailable, GRPC::DeadlineExceeded => e
      flunk("#{what}: still #{e.class} after #{RECOVERY}s: #{e.message}") if Time.now > give_up_at
      sleep 0.2
      retry
    end
  end

  # Until the job is COMPLETED, asked of the cluster through routed_client.
  def wait_until_completed(id, what)
    eventually(timeout: RECOVERY, message: "job #{id} (#{what}) completed") do
      job = through_failover("get_job #{id}") { routed_client.get_job(id) }
      job.state == :JOB_STATE_COMPLETED
    end
  end

  def test_each_call_goes_to_the_leader_of_its_partition
    info = cluster.wait_for_live_leaders
    assert_equal PARTITIONS, info.partition_count
    (0...PARTITIONS).each do |partition|
      leader = leader_of(info, partition)
      assert_includes cluster.addresses, leader
      queue = queue_in(partition)
      id = routed_client.enqueue(queue, "p#{partition}", dedup_key: "routed").job_id
      assert_equal partition, Jobbroker::Partition.of_job_id(id, PARTITIONS),
                   "the broker named the job's id after its queue's partition"
      assert_equal :JOB_STATE_READY, routed_client.get_job(id).state
      assert_equal queue, routed_client.pause_queue(queue).name
      assert_equal [leader], calls_of(:enqueue).last(1), "enqueue into partition #{partition}"
      assert_equal [leader], calls_of(:get_job).last(1), "get_job of partition #{partition}"
      assert_equal [leader], calls_of(:pause_queue).last(1), "pause of partition #{partition}"
    end
    # Calls any node serves go to the node that answered GetCluster.
    routed_client.list_queues
    assert_equal [routed_client.router.table.any_address], calls_of(:list_queues)
  end

  def test_after_kill_9_of_a_leader_calls_and_the_worker_follow_the_new_leader
    info = cluster.wait_for_live_leaders
    partition = 1
    queue = queue_in(partition)
    old_leader = leader_of(info, partition)
    acked = (1..3).map do |i|
      routed_client.enqueue(queue, "before #{i}", dedup_key: "before-#{i}").job_id
    end
    worker = Jobbroker::Worker.new(options: Jobbroker::Options.new(addresses: cluster.addresses),
                                   reconnect_max: 1.0, logger: quiet_logger)
    streams = []
    worker.router.observer = ->(_method, address) { @calls_mu.synchronize { streams << address } }
    worker.handle(queue) { |job| "done #{job.payload}" }
    running(worker) do
      acked.each { |id| wait_until_completed(id, "acked before the kill") }
      assert_equal old_leader, @calls_mu.synchronize { streams.first },
                   "the worker's one queue: its stream goes straight to that queue's leader"

      cluster.kill9(old_leader)
      after = through_failover("an enqueue with a dedup key after the kill") do
        routed_client.enqueue(queue, "after", dedup_key: "after-kill").job_id
      end
      new_info = cluster.wait_for_live_leaders(timeout: RECOVERY)
      new_leader = leader_of(new_info, partition)
      refute_equal old_leader, new_leader
      assert_equal new_leader, calls_of(:enqueue).last,
                   "the enqueue that succeeded went to the new leader"

      acked.each do |id|
        job = through_failover("get_job #{id}") { routed_client.get_job(id) }
        assert_equal :JOB_STATE_COMPLETED, job.state, "job #{id}, acked before the kill"
      end
      wait_until_completed(after, "enqueued after the kill")
      assert_equal new_leader, @calls_mu.synchronize { streams.last },
                   "the worker's stream follows the queue's new leader"
    end
  end
end
