# frozen_string_literal: true

module Jobbroker
  # How a worker in a cluster splits its queues over Work streams (docs/worker-contract.md §5,
  # "One stream per leading node"): one group per leader address, so that no node has to relay
  # the worker's stream to another. Pure: it reads a RoutingTable and asks nothing.
  module StreamGroups
    # One Work stream's subscription: the node it goes to (ANY: any node, which relays the
    # queues or answers UNAVAILABLE while they have no leader), its sorted queues and its share
    # of max_in_flight. Two equal groups are the same stream: the worker keeps a stream whose
    # group is still wanted after the table changed.
    Group = Struct.new(:address, :queues, :share)

    # The address of the group of queues whose partition has no leader in the table.
    ANY = ""

    # The groups of `queues` in `table` (a cluster's RoutingTable), sorted by address with the
    # ANY group last, with `max_in_flight` shared out over them as the broker shares a relayed
    # stream's: the i-th gets max / k, plus 1 when i < max % k, and at least 1 (so k leaders
    # may hold max(max_in_flight, k) jobs); 0 stays 0 for every group.
    def self.of(table, queues, max_in_flight)
      by_address = queues.map(&:to_s).uniq.group_by { |queue| table.leader_of_queue(queue) || ANY }
      addresses = by_address.keys.sort_by { |address| [address == ANY ? 1 : 0, address] }
      k = addresses.size
      addresses.each_with_index.map do |address, i|
        Group.new(address, by_address[address].sort, share(max_in_flight, k, i))
      end
    end

    # Whether `groups` (Groups) hold one for any node: queues whose partition had no leader in
    # the table. While they do, the worker fetches the table again after each backoff delay and
    # regroups (docs/worker-contract.md §5): a node that knows the new leader relays such a
    # stream, and no leader change would end that relay.
    def self.any_node?(groups)
      groups.any? { |group| group.address == ANY }
    end

    # The i-th of k groups' share of `max_in_flight`.
    def self.share(max_in_flight, k, i)
      return 0 if max_in_flight.zero?

      [(max_in_flight / k) + (i < max_in_flight % k ? 1 : 0), 1].max
    end
  end
end
