# frozen_string_literal: true

require "jobbroker/partition"

module Jobbroker
  # Which broker address a call goes to, from one Admin.GetCluster answer: the leader of the
  # call's partition, found by the queue's name or the job id (Partition). Immutable: the
  # Router builds a new one when leadership moves.
  #
  # Every lookup answers an address, never nil: a partition without a leader, a leader listed
  # as not alive, or a job id of no known form go to #any_address, the live node that answered,
  # which forwards the call or answers UNAVAILABLE naming the partition. A broker that is not
  # part of a cluster (empty cluster_name) is reached only at the address it answered on: its
  # own idea of its address may be a listen address such as 0.0.0.0:7070.
  class RoutingTable
    attr_reader :partition_count, :answered_by

    # From `info` (a V1::ClusterInfo), answered by the broker reached at `answered_by`.
    def self.from_cluster_info(info, answered_by)
      if info.cluster_name.empty?
        # A single broker may still have several partitions, and refuses a batch that spans
        # them: the enqueue coalescer keys its batches by this count.
        return single_broker(answered_by, partition_count: [info.partition_count, 1].max)
      end

      nodes = info.nodes.to_h { |node| [node.node_id, node] }
      listed = info.nodes.reject { |node| node.address.empty? }
      count = [info.partition_count, 1].max
      leaders = Array.new(count)
      info.partitions.each do |p|
        next if p.partition >= count || p.leader_node_id.empty?

        leader = nodes[p.leader_node_id]
        # A leader listed as not alive is about to lose its partition: any node knows better.
        next if leader && !leader.alive

        address = p.leader_address.empty? && leader ? leader.address : p.leader_address
        leaders[p.partition] = address unless address.empty?
      end
      new(answered_by, cluster: true, partition_count: count, leaders: leaders,
                       alive_nodes: listed.select(&:alive).map(&:address),
                       other_nodes: listed.reject(&:alive).map(&:address))
    end

    # A broker that is not a cluster, or one that will not say (GetCluster answered an error):
    # every call goes to `address`. `partition_count`: its partitions, nil when it did not say.
    def self.single_broker(address, partition_count: nil)
      new(address, cluster: false, partition_count: partition_count, leaders: [], alive_nodes: [],
                   other_nodes: [])
    end

    # `partition_count` nil: not known (1 for the lookups, none for #partition_of_queue).
    def initialize(answered_by, cluster:, partition_count:, leaders:, alive_nodes:, other_nodes:)
      @answered_by = answered_by
      @cluster = cluster
      @partitions_known = !partition_count.nil?
      @partition_count = partition_count || 1
      @leaders = leaders.freeze
      @alive_nodes = alive_nodes.freeze
      @other_nodes = other_nodes.freeze
      freeze
    end

    # False for a broker outside a cluster (empty cluster_name) and for .single_broker.
    def cluster?
      @cluster
    end

    # A live node, for calls any node serves: the one that answered, which was reachable.
    def any_address
      @answered_by
    end

    # The address of partition `partition`'s leader; #any_address if it has none.
    def address_of_partition(partition)
      (@cluster && @leaders[partition]) || any_address
    end

    # The partition `queue` lives in; nil when the broker did not say how many it has (it
    # answered GetCluster with an error).
    def partition_of_queue(queue)
      @partitions_known ? Partition.of_queue(queue, @partition_count) : nil
    end

    # The leader of the partition `queue` lives in.
    def address_of_queue(queue)
      return any_address unless @cluster

      address_of_partition(Partition.of_queue(queue, @partition_count))
    end

    # The address of the leader of `queue`'s partition; nil when the table names none (no
    # leader, or one listed as not alive) and outside a cluster.
    def leader_of_queue(queue)
      return nil unless @cluster

      @leaders[Partition.of_queue(queue, @partition_count)]
    end

    # The leader of the partition job `job_id` lives in; #any_address for an id of another form
    # (the broker answers NOT_FOUND or INVALID_ARGUMENT for it).
    def address_of_job(job_id)
      return any_address unless @cluster

      partition = Partition.of_job_id(job_id, @partition_count)
      partition.nil? ? any_address : address_of_partition(partition)
    end

    # Every node listed alive, in GetCluster's order, then those not alive: where to ask for a
    # new table when the one that answered is gone. Only #answered_by outside a cluster.
    def node_addresses
      @cluster ? @alive_nodes + @other_nodes : [@answered_by]
    end
  end
end
