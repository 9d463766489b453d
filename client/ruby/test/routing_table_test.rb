# frozen_string_literal: true

require_relative "test_helper"

# Jobbroker::RoutingTable from hand-made ClusterInfo answers: which address each lookup gives.
class RoutingTableTest < Minitest::Test
  V1 = Jobbroker::V1
  ANSWERED_BY = "10.0.0.9:7070"

  # Three nodes, four partitions; `alive` and `leaders` (node id by partition, nil: none) vary.
  def cluster(alive: { "n0" => true, "n1" => true, "n2" => true },
              leaders: %w[n0 n1 n2 n0], leader_addresses: {})
    V1::ClusterInfo.new(
      cluster_name: "jobbroker", partition_count: 4, node_id: "n2",
      nodes: alive.map { |id, up| V1::NodeInfo.new(node_id: id, address: address(id), alive: up) },
      partitions: leaders.each_with_index.map do |leader, partition|
        V1::PartitionInfo.new(partition: partition, leader_node_id: leader.to_s,
                              leader_address: leader_addresses.fetch(partition, ""))
      end
    )
  end

  def address(node_id)
    "10.0.0.#{node_id.delete('n')}:7070"
  end

  def table(info)
    Jobbroker::RoutingTable.from_cluster_info(info, ANSWERED_BY)
  end

  # A queue name of each partition of 4, found by the partition function.
  def queue_of_partition(partition)
    (0..).lazy.map { |i| "q#{i}" }.find { |q| Jobbroker::Partition.of_queue(q, 4) == partition }
  end

  # A job id of the broker's form whose partition field is `field`.
  def job_id_of_field(field)
    digits = Jobbroker::Partition::JOB_ID_DIGITS
    partition_digits = [field >> 10, (field >> 5) & 31, field & 31].map { |v| digits[v] }.join
    "01HZZZZZZZ#{partition_digits}0000000000000"
  end

  def test_each_partition_goes_to_its_live_leader
    t = table(cluster)
    assert t.cluster?
    assert_equal 4, t.partition_count
    assert_equal %w[10.0.0.0:7070 10.0.0.1:7070 10.0.0.2:7070 10.0.0.0:7070],
                 (0..3).map { |p| t.address_of_partition(p) }
    (0..3).each do |p|
      assert_equal t.address_of_partition(p), t.address_of_queue(queue_of_partition(p))
      assert_equal t.address_of_partition(p), t.address_of_job(job_id_of_field(p + 8))
    end
    assert_equal ANSWERED_BY, t.any_address
  end

  def test_the_leader_address_of_the_partition_wins_over_the_node_list
    t = table(cluster(leader_addresses: { 1 => "leader-1.example:7070" }))
    assert_equal "leader-1.example:7070", t.address_of_partition(1)
    assert_equal "10.0.0.0:7070", t.address_of_partition(0)
  end

  def test_a_leader_not_alive_sends_its_partition_to_any_node
    t = table(cluster(alive: { "n0" => true, "n1" => false, "n2" => true }))
    assert_equal ANSWERED_BY, t.address_of_partition(1)
    assert_equal ANSWERED_BY, t.address_of_queue(queue_of_partition(1))
    assert_equal "10.0.0.2:7070", t.address_of_partition(2)
    # Live nodes first: those are asked first for the next table.
    assert_equal %w[10.0.0.0:7070 10.0.0.2:7070 10.0.0.1:7070], t.node_addresses
  end

  def test_a_partition_without_a_leader_goes_to_any_node
    t = table(cluster(leaders: ["n0", nil, "n2", "n0"]))
    assert_equal ANSWERED_BY, t.address_of_partition(1)
    assert_equal ANSWERED_BY, t.address_of_partition(7) # out of range
    assert_equal "10.0.0.0:7070", t.address_of_partition(3)
  end

  def test_a_job_id_of_no_known_form_goes_to_any_node
    t = table(cluster)
    ["", "no-such-job", "91HZZZZZZZ0000000000000000", "01hzzzzzzz0000000000000000"].each do |id|
      assert_equal ANSWERED_BY, t.address_of_job(id), id
    end
  end

  def test_a_broker_outside_a_cluster_is_reached_where_it_answered
    info = V1::ClusterInfo.new(
      cluster_name: "", partition_count: 1, node_id: "solo",
      nodes: [V1::NodeInfo.new(node_id: "solo", address: "0.0.0.0:7070", alive: true)],
      partitions: [V1::PartitionInfo.new(partition: 0, leader_node_id: "solo",
                                         leader_address: "0.0.0.0:7070")]
    )
    t = table(info)
    refute t.cluster?
    assert_equal ANSWERED_BY, t.address_of_partition(0)
    assert_equal ANSWERED_BY, t.address_of_queue("emails")
    assert_equal ANSWERED_BY, t.address_of_job(job_id_of_field(0))
    assert_equal [ANSWERED_BY], t.node_addresses
  end

  def test_a_single_broker_table_sends_everything_to_its_address
    t = Jobbroker::RoutingTable.single_broker(ANSWERED_BY)
    refute t.cluster?
    assert_equal ANSWERED_BY, t.address_of_queue("emails")
    assert_equal ANSWERED_BY, t.any_address
  end
end
