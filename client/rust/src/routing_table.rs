//! Which broker address a call goes to, from one answer of `Admin.GetCluster`.

use std::collections::{BTreeMap, HashMap};

use crate::partition::{partition_of_job_id, partition_of_queue};
use crate::v1;

/// The leader of each partition, as one `Admin.GetCluster` answer names them. A value: the
/// router builds a new one when leadership moves.
///
/// Every lookup answers an address: a partition without a leader, a leader listed as not
/// alive, or a job id of no known form go to [`RoutingTable::any_address`], a live node that
/// forwards the call (or answers `UNAVAILABLE` naming the partition). A broker outside a
/// cluster (empty `cluster_name`) is reached only at the address it answered on: its own
/// idea of its address may be a listen address such as `0.0.0.0:7070`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct RoutingTable {
    is_cluster: bool,
    partition_count: u32,
    /// True when `partition_count` is what a broker answered (in a cluster or not), not a
    /// guess for a broker that would not say.
    knows_partitions: bool,
    answered_by: String,
    /// By partition number; empty where the partition has no live leader with an address.
    leaders: Vec<String>,
    alive_nodes: Vec<String>,
    other_nodes: Vec<String>,
}

impl RoutingTable {
    /// From `info`, answered by the broker the client reached at `answered_by`.
    pub fn from_cluster_info(info: &v1::ClusterInfo, answered_by: &str) -> Self {
        let mut table = Self::single_broker(answered_by);
        // A single broker has partitions too (`--partitions`): the enqueue coalescer keeps a
        // batch within one.
        if info.partition_count > 0 {
            table.partition_count = info.partition_count;
            table.knows_partitions = true;
        }
        if info.cluster_name.is_empty() {
            return table;
        }
        table.is_cluster = true;
        table.partition_count = info.partition_count.max(1);
        let nodes: HashMap<&str, &v1::NodeInfo> = info
            .nodes
            .iter()
            .map(|node| (node.node_id.as_str(), node))
            .collect();
        for node in info.nodes.iter().filter(|n| !n.address.is_empty()) {
            let list = if node.alive {
                &mut table.alive_nodes
            } else {
                &mut table.other_nodes
            };
            list.push(node.address.clone());
        }
        table.leaders = vec![String::new(); table.partition_count as usize];
        for partition in &info.partitions {
            if partition.partition >= table.partition_count || partition.leader_node_id.is_empty() {
                continue;
            }
            let leader = nodes.get(partition.leader_node_id.as_str());
            // A leader listed as not alive is about to lose its partition: any node knows
            // better where the calls go.
            if leader.is_some_and(|node| !node.alive) {
                continue;
            }
            let mut address = partition.leader_address.clone();
            if address.is_empty() {
                address = leader.map(|node| node.address.clone()).unwrap_or_default();
            }
            table.leaders[partition.partition as usize] = address;
        }
        table
    }

    /// For a broker that answered but does not say what the cluster is (an error from
    /// `GetCluster`): every call goes to `address`, which forwards what it does not lead.
    pub fn single_broker(address: &str) -> Self {
        Self {
            partition_count: 1,
            answered_by: address.to_string(),
            ..Self::default()
        }
    }

    /// False for a broker outside a cluster.
    pub fn is_cluster(&self) -> bool {
        self.is_cluster
    }

    /// How many partitions the broker that answered has; `None` before one answered, or when
    /// it would not say.
    pub fn partition_count(&self) -> Option<u32> {
        self.knows_partitions.then_some(self.partition_count)
    }

    /// True before any broker answered.
    pub fn is_empty(&self) -> bool {
        self.answered_by.is_empty()
    }

    /// A live node, for calls any node serves: the one that answered, which was reachable.
    pub fn any_address(&self) -> &str {
        &self.answered_by
    }

    /// The leader of `partition`; [`Self::any_address`] if it has none.
    pub fn address_of_partition(&self, partition: u32) -> &str {
        match self.leaders.get(partition as usize) {
            Some(leader) if self.is_cluster && !leader.is_empty() => leader,
            _ => self.any_address(),
        }
    }

    /// The leader of the partition `queue` lives in.
    pub fn address_of_queue(&self, queue: &str) -> &str {
        if !self.is_cluster {
            return self.any_address();
        }
        self.address_of_partition(partition_of_queue(queue, self.partition_count))
    }

    /// The live leader of the partition `queue` lives in, as the table names it; `None` when it
    /// has none (or outside a cluster, where any node serves).
    fn leader_of_queue(&self, queue: &str) -> Option<&str> {
        if !self.is_cluster {
            return None;
        }
        let partition = partition_of_queue(queue, self.partition_count);
        self.leaders
            .get(partition as usize)
            .map(String::as_str)
            .filter(|leader| !leader.is_empty())
    }

    /// How a worker over `queues` with `max_in_flight` splits into `Work` streams
    /// (`docs/worker-contract.md` §5, "One stream per leading node"): one group per leader
    /// address, sorted by address, then one group sent to any node for the queues whose
    /// partition has no leader here. The i-th of k groups gets `max_in_flight / k`, plus 1 when
    /// `i < max_in_flight % k`, and at least 1 (0 for all when `max_in_flight` is 0), as the
    /// broker shares out a relayed stream's. Outside a cluster, or before any broker answered,
    /// it is one group to any node with every queue: one stream, as a single broker wants.
    pub fn stream_groups(&self, queues: &[String], max_in_flight: i32) -> Vec<StreamGroup> {
        let mut led: BTreeMap<&str, Vec<String>> = BTreeMap::new();
        let mut leaderless = Vec::new();
        for queue in queues {
            match self.leader_of_queue(queue) {
                Some(leader) => led.entry(leader).or_default().push(queue.clone()),
                None => leaderless.push(queue.clone()),
            }
        }
        let mut groups: Vec<StreamGroup> = led
            .into_iter()
            .map(|(address, queues)| StreamGroup {
                address: Some(address.to_string()),
                queues,
                max_in_flight: 0,
            })
            .collect();
        if !leaderless.is_empty() || groups.is_empty() {
            groups.push(StreamGroup {
                address: None,
                queues: leaderless,
                max_in_flight: 0,
            });
        }
        // k is at most the number of queues, far below i32::MAX.
        let k = groups.len() as i32;
        for (i, group) in groups.iter_mut().enumerate() {
            group.queues.sort();
            group.queues.dedup();
            let extra = i32::from((i as i32) < max_in_flight.max(0) % k);
            group.max_in_flight = if max_in_flight <= 0 {
                0
            } else {
                (max_in_flight / k + extra).max(1)
            };
        }
        groups
    }

    /// The leader of the partition job `job_id` lives in; [`Self::any_address`] for an id of
    /// another form (the broker answers `NOT_FOUND` or `INVALID_ARGUMENT` for it).
    pub fn address_of_job(&self, job_id: &str) -> &str {
        if !self.is_cluster {
            return self.any_address();
        }
        match partition_of_job_id(job_id, self.partition_count) {
            Some(partition) => self.address_of_partition(partition),
            None => self.any_address(),
        }
    }

    /// Where to ask `GetCluster` again: every node listed alive, in the order listed, then
    /// those not alive; only [`Self::any_address`] outside a cluster.
    pub fn node_addresses(&self) -> Vec<String> {
        if !self.is_cluster {
            return if self.is_empty() {
                Vec::new()
            } else {
                vec![self.answered_by.clone()]
            };
        }
        self.alive_nodes
            .iter()
            .chain(&self.other_nodes)
            .cloned()
            .collect()
    }
}

/// One `Work` stream of a worker: where it goes, what it subscribes to and how many jobs it
/// may hold. Two equal groups are the same stream: a regrouping keeps it open.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct StreamGroup {
    /// The node that leads these queues' partitions; `None`: any node (a partition without a
    /// leader, a broker outside a cluster, or no table at all), which relays or serves them.
    pub address: Option<String>,
    /// Sorted.
    pub queues: Vec<String>,
    /// This stream's share of the worker's `max_in_flight`.
    pub max_in_flight: i32,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(id: &str, address: &str, alive: bool) -> v1::NodeInfo {
        v1::NodeInfo {
            node_id: id.into(),
            address: address.into(),
            alive,
        }
    }

    fn led_by(partition: u32, leader: &str, address: &str) -> v1::PartitionInfo {
        v1::PartitionInfo {
            partition,
            leader_node_id: leader.into(),
            leader_address: address.into(),
            ..Default::default()
        }
    }

    /// Three nodes (n2 not alive), four partitions: 0 led by n0, 1 by n1 (its address only in
    /// the node list), 2 by n2, 3 by nobody.
    fn three_nodes() -> v1::ClusterInfo {
        v1::ClusterInfo {
            cluster_name: "jobbroker".into(),
            partition_count: 4,
            nodes: vec![
                node("n0", "10.0.0.1:7070", true),
                node("n1", "10.0.0.2:7070", true),
                node("n2", "10.0.0.3:7070", false),
            ],
            partitions: vec![
                led_by(0, "n0", "10.0.0.1:7070"),
                led_by(1, "n1", ""),
                led_by(2, "n2", "10.0.0.3:7070"),
                led_by(3, "", ""),
            ],
            node_id: "n1".into(),
            ..Default::default()
        }
    }

    /// A queue whose partition among `count` is `partition`.
    fn queue_in(partition: u32, count: u32) -> String {
        (0..)
            .map(|i| format!("q{i}"))
            .find(|q| partition_of_queue(q, count) == partition)
            .unwrap()
    }

    #[test]
    fn a_live_leader_gets_its_partitions_calls() {
        let table = RoutingTable::from_cluster_info(&three_nodes(), "10.0.0.2:7070");
        assert!(table.is_cluster());
        assert_eq!(table.address_of_partition(0), "10.0.0.1:7070");
        assert_eq!(table.address_of_queue(&queue_in(0, 4)), "10.0.0.1:7070");
        // No leader_address: the node list tells it.
        assert_eq!(table.address_of_queue(&queue_in(1, 4)), "10.0.0.2:7070");
        // A job id's partition field is characters 10..13: "001" is 1.
        let job_in_partition_1 = "01ARZ3NDEK001XYZ0123456789";
        assert_eq!(table.address_of_job(job_in_partition_1), "10.0.0.2:7070");
    }

    #[test]
    fn a_leader_not_alive_or_no_leader_sends_the_call_to_the_node_that_answered() {
        let table = RoutingTable::from_cluster_info(&three_nodes(), "10.0.0.2:7070");
        assert_eq!(table.address_of_partition(2), "10.0.0.2:7070");
        assert_eq!(table.address_of_queue(&queue_in(3, 4)), "10.0.0.2:7070");
        assert_eq!(table.address_of_partition(9), "10.0.0.2:7070");
        assert_eq!(table.address_of_job("not-a-job-id"), "10.0.0.2:7070");
        // The dead node is asked last when the table is fetched again.
        assert_eq!(
            table.node_addresses(),
            ["10.0.0.1:7070", "10.0.0.2:7070", "10.0.0.3:7070"]
        );
    }

    #[test]
    fn a_broker_outside_a_cluster_gets_every_call_at_the_address_it_answered_on() {
        let single = v1::ClusterInfo {
            cluster_name: String::new(),
            partition_count: 1,
            nodes: vec![node("solo", "0.0.0.0:7070", true)],
            partitions: vec![led_by(0, "solo", "0.0.0.0:7070")],
            ..Default::default()
        };
        let table = RoutingTable::from_cluster_info(&single, "broker.example:7070");
        assert!(!table.is_cluster());
        assert_eq!(table.address_of_queue("emails"), "broker.example:7070");
        assert_eq!(
            table.address_of_job("01ARZ3NDEK001XYZ0123456789"),
            "broker.example:7070"
        );
        assert_eq!(table.node_addresses(), ["broker.example:7070"]);
        assert_eq!(table.partition_count(), Some(1));
        let four = v1::ClusterInfo {
            partition_count: 4,
            ..single.clone()
        };
        let table = RoutingTable::from_cluster_info(&four, "broker.example:7070");
        assert_eq!(table.partition_count(), Some(4));
        assert_eq!(table.address_of_queue("emails"), "broker.example:7070");
        assert_eq!(RoutingTable::single_broker("b:1").partition_count(), None);
        assert_eq!(
            RoutingTable::single_broker("b:1"),
            RoutingTable::from_cluster_info(&v1::ClusterInfo::default(), "b:1")
        );
    }

    fn group(address: Option<&str>, queues: &[&str], max_in_flight: i32) -> StreamGroup {
        StreamGroup {
            address: address.map(str::to_string),
            queues: queues.iter().map(|q| q.to_string()).collect(),
            max_in_flight,
        }
    }

    /// Four partitions: 0 led by 10.0.0.2, 1 and 2 by 10.0.0.1, 3 by nobody.
    fn two_leaders_and_a_leaderless_partition() -> RoutingTable {
        let info = v1::ClusterInfo {
            cluster_name: "jobbroker".into(),
            partition_count: 4,
            nodes: vec![
                node("n0", "10.0.0.1:7070", true),
                node("n1", "10.0.0.2:7070", true),
            ],
            partitions: vec![
                led_by(0, "n1", "10.0.0.2:7070"),
                led_by(1, "n0", "10.0.0.1:7070"),
                led_by(2, "n0", ""),
                led_by(3, "", ""),
            ],
            ..Default::default()
        };
        RoutingTable::from_cluster_info(&info, "10.0.0.2:7070")
    }

    #[test]
    fn a_workers_queues_are_grouped_by_leader_sorted_with_the_leaderless_ones_last() {
        let table = two_leaders_and_a_leaderless_partition();
        let (p0, p1, p2, p3) = (
            queue_in(0, 4),
            queue_in(1, 4),
            queue_in(2, 4),
            queue_in(3, 4),
        );
        // Handed over in no particular order: each group's queues come out sorted.
        let mut in_two = [p2.clone(), p1.clone()];
        in_two.sort();
        let queues = [p3.clone(), p2.clone(), p0.clone(), p1.clone()];
        let at = |max| table.stream_groups(&queues, max);
        let want = |shares: [i32; 3]| {
            vec![
                group(Some("10.0.0.1:7070"), &[&in_two[0], &in_two[1]], shares[0]),
                group(Some("10.0.0.2:7070"), &[&p0], shares[1]),
                group(None, &[&p3], shares[2]),
            ]
        };
        // k = 3 groups: fewer, as many and more jobs than groups.
        assert_eq!(at(2), want([1, 1, 1]), "max 2 < k: at least 1 each");
        assert_eq!(at(3), want([1, 1, 1]));
        assert_eq!(at(8), want([3, 3, 2]), "the first max % k get one more");
        assert_eq!(at(10), want([4, 3, 3]));
        assert_eq!(at(0), want([0, 0, 0]), "draining: nothing for anyone");
    }

    #[test]
    fn one_leader_or_none_is_one_stream_with_every_queue() {
        let table = two_leaders_and_a_leaderless_partition();
        let (a, b) = (queue_in(1, 4), queue_in(2, 4));
        let mut both = [a.clone(), b.clone()];
        both.sort();
        assert_eq!(
            table.stream_groups(&[b.clone(), a.clone()], 5),
            [group(Some("10.0.0.1:7070"), &[&both[0], &both[1]], 5)]
        );
        // Outside a cluster, or without any table: one stream to any node.
        for table in [RoutingTable::single_broker("b:1"), RoutingTable::default()] {
            assert_eq!(
                table.stream_groups(&[b.clone(), a.clone()], 5),
                [group(None, &[&both[0], &both[1]], 5)]
            );
        }
    }

    #[test]
    fn an_empty_table_knows_no_address() {
        let table = RoutingTable::default();
        assert!(table.is_empty());
        assert!(table.node_addresses().is_empty());
    }
}
