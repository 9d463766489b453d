# frozen_string_literal: true

require_relative "test_helper"

# What the cluster tests share: a routed client that records where each call goes, queue
# names by partition, and waiting through a failover. The including class defines PARTITIONS
# and gets a cluster of that many partitions of its own, started once for the class and stopped
# after the run.
module ClusterTestHelpers
  include BrokerTestHelpers

  # A give-up bound for the cluster's recovery, not a speed assertion.
  RECOVERY = 60

  def self.included(test_class)
    test_class.extend(ClassMethods)
  end

  module ClassMethods
    def cluster
      @cluster ||= ClusterProcess.new(partitions: self::PARTITIONS).tap do |c|
        Minitest.after_run { c.stop }
      end
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
      return queue if Jobbroker::Partition.of_queue(queue, self.class::PARTITIONS) == partition
    end
  end

  def leader_of(info, partition)
    ClusterProcess.leader_address(info, partition)
  end

  # Retries `block` after transient errors (a partition between leaders) for up to RECOVERY
  # seconds.
  def through_failover(what)
    give_up_at = Time.now + self.class::RECOVERY
    begin
      yield
    rescue GRPC::Unavailable, GRPC::DeadlineExceeded => e
      if Time.now > give_up_at
        flunk("#{what}: still #{e.class} after #{self.class::RECOVERY}s: #{e.message}")
      end
      sleep 0.2
      retry
    end
  end

  # The leaders of the partitions once they are different nodes (the controller balances them
  # after the start).
  def balanced_leaders
    recovery = self.class::RECOVERY
    partitions = self.class::PARTITIONS
    eventually(timeout: recovery, message: "the #{partitions} partitions led by different nodes") do
      info = cluster.wait_for_live_leaders(timeout: recovery)
      leaders = (0...partitions).map { |p| leader_of(info, p) }
      leaders if leaders.uniq.size == partitions
    end
  end

  # Until the job is COMPLETED, asked of the cluster through routed_client.
  def wait_until_completed(id, what)
    eventually(timeout: self.class::RECOVERY, message: "job #{id} (#{what}) completed") do
      job = through_failover("get_job #{id}") { routed_client.get_job(id) }
      job.state == :JOB_STATE_COMPLETED
    end
  end
end

# The client and the worker against a real 3-node cluster of 4 partitions: every call goes
# straight to its partition's leader, and both follow a leader killed with kill -9. The
# cluster is started once for the class and stopped after the run.
class ClusterRoutingTest < Minitest::Test
  include ClusterTestHelpers

  PARTITIONS = 4

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

# A worker over queues led by different nodes, against a real 3-node cluster of 2 partitions
# (docs/worker-contract.md §5, "One stream per leading node"): it opens one stream on each
# leader, so no node relays its stream, and after a kill -9 of one leader it regroups onto
# the new one. Its own cluster: the other class kills one of its nodes.
class ClusterStreamPerLeaderTest < Minitest::Test
  include ClusterTestHelpers

  PARTITIONS = 2
  RELAYING = "jobbroker_work_streams_relaying"
  OPEN = "jobbroker_work_streams_open"

  def metrics(name, nodes)
    nodes.map { |address| cluster.metric(cluster.addresses.index(address), name) }
  end

  def enqueue_each(queues, label)
    queues.flat_map do |queue|
      (1..10).map do |i|
        through_failover("enqueue #{label} #{i}") do
          routed_client.enqueue(queue, "#{label} #{i}", dedup_key: "#{label}-#{i}").job_id
        end
      end
    end
  end

  def test_one_stream_per_leader_none_relayed_and_regrouped_after_kill_9
    la, lb = balanced_leaders
    neither = (cluster.addresses - [la, lb]).first
    queues = [queue_in(0), queue_in(1)]
    first = enqueue_each(queues, "first")
    # The node that leads neither queue first: the worker must not hold its streams there.
    worker = Jobbroker::Worker.new(
      options: Jobbroker::Options.new(addresses: [neither, la, lb]), concurrency: 4,
      reconnect_max: 1.0, logger: quiet_logger
    )
    queues.each { |queue| worker.handle(queue) { |job| "done #{job.payload}" } }
    running(worker) do
      first.each { |id| wait_until_completed(id, "enqueued first") }
      assert_equal [0, 0, 0], metrics(RELAYING, cluster.addresses),
                   "no node relays the worker's streams"
      open_la, open_lb, open_neither = metrics(OPEN, [la, lb, neither])
      assert_operator open_la, :>=, 1, "a stream on the leader of partition 0"
      assert_operator open_lb, :>=, 1, "a stream on the leader of partition 1"
      assert_equal 0, open_neither, "no stream on the node that leads neither queue"

      cluster.kill9(la)
      later = enqueue_each(queues, "later")
      later.each { |id| wait_until_completed(id, "enqueued after the kill") }
      live = cluster.addresses - [la]
      eventually(timeout: 30, message: "no live node relays the worker's streams") do
        metrics(RELAYING, live).all?(&:zero?)
      end
    end
  end
end

# A graceful stop in a cluster (docs/worker-contract.md §6, last paragraph): a worker with a
# stream per leader stops while a handler runs, and the leader of that job's partition is
# killed with kill -9 during the grace. The worker regroups as usual while it stops: the queue
# that lost its stream is subscribed again (with flow 0), the handler's ack reaches the new
# leader, and the stop returns as soon as it is answered. Its own cluster: it kills a node.
class ClusterStopTest < Minitest::Test
  include ClusterTestHelpers

  PARTITIONS = 2

  # The worker as the cluster lists it (every partition's leader asked), nil while unreachable.
  def listed(worker_id)
    routed_client.list_workers.find { |w| w.worker_id == worker_id }
  rescue GRPC::Unavailable, GRPC::DeadlineExceeded
    nil
  end

  def test_a_leader_killed_during_the_grace_is_followed_and_the_ack_arrives
    la, lb = balanced_leaders
    neither = (cluster.addresses - [la, lb]).first
    q0 = queue_in(0)
    q1 = queue_in(1)
    id = through_failover("enqueue") do
      routed_client.enqueue(q0, "slow", lease_duration: 120).job_id
    end
    worker_id = "ruby-cluster-stop-#{SecureRandom.hex(3)}"
    grace = 90
    started = Queue.new
    go = Queue.new
    worker = Jobbroker::Worker.new(
      options: Jobbroker::Options.new(addresses: [neither, la, lb]), worker_id: worker_id,
      grace: grace, lease_duration: 120, reconnect_max: 1.0, logger: quiet_logger
    )
    [q0, q1].each do |queue|
      worker.handle(queue) do |job|
        started << job.job_id
        go.pop
        "done #{job.text}"
      end
    end
    thread = Thread.new { worker.run }
    assert_equal id, started.pop
    worker.stop
    eventually(message: "flow 0 on both streams before the kill") do
      w = listed(worker_id)
      w && w.queues.sort == [q0, q1].sort && w.max_in_flight.zero?
    end
    stop_at = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    cluster.kill9(la)
    # Regrouped while stopping: q0 is subscribed again (on its new leader), still with flow 0.
    eventually(timeout: RECOVERY, message: "q0 subscribed again during the grace") do
      w = listed(worker_id)
      w && w.queues.include?(q0) && w.max_in_flight.zero? && worker.stats.reconnects >= 1
    end
    go << true
    thread.join(30) or flunk("the stop did not return once the handler was done")
    stopped_in = Process.clock_gettime(Process::CLOCK_MONOTONIC) - stop_at
    assert_operator stopped_in, :<, grace, "the stop returned once the ack was answered"
    wait_until_completed(id, "acked during the stop")
    job = through_failover("get_job") { routed_client.get_job(id) }
    assert_equal 1, job.attempt
    assert_equal "done slow", job.result
    assert_equal 1, worker.stats.acked
    assert started.empty?, "no job started during the stop"
  ensure
    go&.close
  end
end
