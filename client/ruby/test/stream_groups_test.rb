# frozen_string_literal: true

require_relative "test_helper"

# Jobbroker::StreamGroups from hand-made ClusterInfo answers: which Work streams a worker opens
# (docs/worker-contract.md §5, "One stream per leading node"). No broker.
class StreamGroupsTest < Minitest::Test
  V1 = Jobbroker::V1
  Group = Jobbroker::StreamGroups::Group
  ANY = Jobbroker::StreamGroups::ANY
  ANSWERED_BY = "10.0.0.9:7070"

  # Three nodes, four partitions; `leaders`: node id by partition, nil for none.
  def table(leaders, alive: %w[n0 n1 n2])
    info = V1::ClusterInfo.new(
      cluster_name: "jobbroker", partition_count: 4, node_id: "n2",
      nodes: %w[n0 n1 n2].map do |id|
        V1::NodeInfo.new(node_id: id, address: address(id), alive: alive.include?(id))
      end,
      partitions: leaders.each_with_index.map do |leader, partition|
        V1::PartitionInfo.new(partition: partition, leader_node_id: leader.to_s)
      end
    )
    Jobbroker::RoutingTable.from_cluster_info(info, ANSWERED_BY)
  end

  def address(node_id)
    "10.0.0.#{node_id.delete('n')}:7070"
  end

  # The `n`-th queue name (by a counter) that lives in `partition` of 4.
  def queue_of_partition(partition, n = 0)
    (0..).lazy.map { |i| "q#{i}" }
         .select { |q| Jobbroker::Partition.of_queue(q, 4) == partition }.first(n + 1).last
  end

  def groups(leaders, queues, max_in_flight, **opts)
    Jobbroker::StreamGroups.of(table(leaders, **opts), queues, max_in_flight)
  end

  def test_one_group_per_leader_sorted_by_address_with_sorted_queues
    # Partition 0 and 3 on n2, 1 on n0, 2 on n1; queues given out of order.
    q0 = queue_of_partition(0)
    q0b = queue_of_partition(0, 1)
    q1 = queue_of_partition(1)
    q2 = queue_of_partition(2)
    q3 = queue_of_partition(3)
    got = groups(%w[n2 n0 n1 n2], [q3, q2, q0b, q1, q0], 6)
    assert_equal [Group.new(address("n0"), [q1], 2), Group.new(address("n1"), [q2], 2),
                  Group.new(address("n2"), [q0, q0b, q3].sort, 2)], got
  end

  def test_queues_of_a_leaderless_partition_form_one_more_group_for_any_node
    q0 = queue_of_partition(0)
    q1 = queue_of_partition(1)
    q2 = queue_of_partition(2)
    q3 = queue_of_partition(3)
    # Partition 1 has no leader; partition 3's leader is listed as not alive.
    got = groups(["n0", nil, "n1", "n2"], [q0, q1, q2, q3], 5, alive: %w[n0 n1])
    # The group for any node sorts last, so it gets the smallest share.
    assert_equal [Group.new(address("n0"), [q0], 2), Group.new(address("n1"), [q2], 2),
                  Group.new(ANY, [q1, q3].sort, 1)], got
    assert Jobbroker::StreamGroups.any_node?(got)
  end

  def test_the_group_for_any_node_is_last_whatever_the_addresses
    q0 = queue_of_partition(0)
    q1 = queue_of_partition(1)
    # Only n0 leads, and the any-node group comes after it; 4 over k = 2 is 2 and 2, 3 is 2
    # and 1 (the extra one to n0's group, the first).
    assert_equal [address("n0"), ANY], groups(["n0", nil, nil, nil], [q1, q0], 4).map(&:address)
    assert_equal [2, 1], groups(["n0", nil, nil, nil], [q1, q0], 3).map(&:share)
    # No leader at all: the one group is for any node, with the whole max_in_flight.
    assert_equal [Group.new(ANY, [q0, q1].sort, 3)], groups([nil, nil, nil, nil], [q0, q1], 3)
  end

  # The decision behind the periodic refresh (§5): a grouping with a group for any node makes
  # the worker fetch the table again after each backoff delay; one without it does not.
  def test_any_node_is_true_only_with_a_group_for_any_node
    q0 = queue_of_partition(0)
    q1 = queue_of_partition(1)
    assert Jobbroker::StreamGroups.any_node?(groups(["n0", nil, "n1", "n2"], [q0, q1], 4))
    refute Jobbroker::StreamGroups.any_node?(groups(%w[n0 n1 n1 n2], [q0, q1], 4))
    # A queue whose partition has no leader, but that the worker does not handle, makes none.
    refute Jobbroker::StreamGroups.any_node?(groups(["n0", "n1", nil, nil], [q0, q1], 4))
    refute Jobbroker::StreamGroups.any_node?([])
  end

  def test_one_leader_is_one_group_with_the_whole_max_in_flight
    queues = [queue_of_partition(2), queue_of_partition(0), queue_of_partition(0, 1)]
    assert_equal [Group.new(address("n1"), queues.sort, 7)], groups(%w[n1 n0 n1 n0], queues, 7)
    assert_equal [Group.new(address("n1"), queues.sort, 1)], groups(%w[n1 n0 n1 n0], queues, 1)
  end

  def test_shares_below_equal_to_and_above_the_number_of_groups
    queues = (0..2).map { |p| queue_of_partition(p) }
    shares = ->(max) { groups(%w[n0 n1 n2 n0], queues, max).map(&:share) }
    # Smaller than k = 3: every group still gets 1, so the worker may hold k jobs.
    assert_equal [1, 1, 1], shares.call(1)
    assert_equal [1, 1, 1], shares.call(2)
    assert_equal [1, 1, 1], shares.call(3)
    # Larger: max / k each, the first max % k groups one more.
    assert_equal [2, 1, 1], shares.call(4)
    assert_equal [3, 3, 2], shares.call(8)
    assert_equal [34, 33, 33], shares.call(100)
    assert_equal [0, 0, 0], shares.call(0)
  end

  def test_share_follows_the_brokers_rule
    (0..20).each do |max|
      (1..5).each do |k|
        want = (0...k).map { |i| max.zero? ? 0 : [(max / k) + (i < max % k ? 1 : 0), 1].max }
        assert_equal want, (0...k).map { |i| Jobbroker::StreamGroups.share(max, k, i) }
        assert_equal max, want.sum if max >= k
      end
    end
  end

  def test_a_queue_handled_once_is_in_one_group
    q0 = queue_of_partition(0)
    assert_equal [Group.new(address("n0"), [q0], 3)], groups(%w[n0 n1 n2 n0], [q0, q0.to_sym], 3)
  end
end
