//! [`Router`]: which node each call of a [`Client`](crate::Client) goes to.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::Duration;

use tonic::transport::{Channel, ClientTlsConfig};

use crate::client::ClientTag;
use crate::options::{Keepalive, endpoint};
use crate::routing_table::{RoutingTable, StreamGroup};
use crate::{Code, v1};

/// Which node a call is for.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Route<'a> {
    /// Any node serves it (listing queues, workers, the cluster...).
    Any,
    /// The leader of this queue's partition.
    Queue(&'a str),
    /// The leader of the partition of the job with this id.
    Job(&'a str),
}

/// Whether a failure may mean that the call went to the wrong node or a dead one: the
/// leader moved, or the node is gone.
pub(crate) fn unreachable(code: Code) -> bool {
    matches!(code, Code::Unavailable | Code::DeadlineExceeded)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Freshness {
    /// No broker answered `GetCluster` yet: every call asks again.
    Unknown,
    Fresh,
    /// A call failed `UNAVAILABLE` or `DEADLINE_EXCEEDED`: the next one asks again first.
    Stale,
}

/// The node a call is sent to: its address (as given, or as `GetCluster` names it) and its
/// channel.
pub(crate) struct Target {
    pub address: String,
    pub channel: Channel,
}

/// What the clones of a [`Client`](crate::Client) and its [`Worker`](crate::Worker) share to
/// reach a cluster's nodes: the addresses given, one channel per node address (made on first
/// use and kept), and the [`RoutingTable`] of the latest `Admin.GetCluster` answer.
///
/// The table is fetched before the first call, and again before the next call after
/// [`Router::unreachable`] or [`Router::mark_stale`], from whichever address answers first:
/// the nodes of the last table, then the given addresses, those that failed last. A broker
/// that answers `GetCluster` with an error (`UNIMPLEMENTED` from a broker older than cluster
/// mode, `PERMISSION_DENIED` for a token without the admin role) is used for every call: any
/// node forwards calls to the partition's leader. While no address has answered, calls go to
/// the current given address (the next one after it failed, as a client without routing
/// does) and every call asks again. A single broker outside a cluster, given as the one
/// address, is asked once.
///
/// A client made over a caller's channel ([`Client::from_channel`](crate::Client)) does not
/// route: every call uses that channel.
///
/// Safe to share between tasks: one refresh runs at a time; calls that find the table stale
/// meanwhile wait for it and then use its result.
pub(crate) struct Router {
    // Constant after construction.
    /// The addresses given, in order, without repeats.
    given: Vec<String>,
    routing: Routing,
    /// How long one `GetCluster` attempt may take.
    fetch_deadline: Duration,
    /// Held while `GetCluster` is under way, so that concurrent calls share one refresh.
    refreshing: tokio::sync::Mutex<()>,
    state: Mutex<State>,
}

/// Whether a [`Router`] routes at all.
enum Routing {
    /// Every call over the one channel the caller made.
    Fixed,
    /// By the table, the channels of the addresses it names made with this TLS (if any) and
    /// these keepalive pings.
    Routed {
        tls: Option<ClientTlsConfig>,
        keepalive: Keepalive,
    },
}

/// Protected by [`Router::state`].
struct State {
    freshness: Freshness,
    table: RoutingTable,
    channels: HashMap<String, Channel>,
    /// Addresses whose last call failed unreachable: asked for the table after the others.
    failed: HashSet<String>,
    /// Index in `given` of where calls go while no broker has answered `GetCluster`.
    current: usize,
}

impl Router {
    /// Over `given` (each address and its channel, at least one), with `tls` and `keepalive`
    /// for the channels of the addresses `GetCluster` names.
    pub fn new(
        given: Vec<(String, Channel)>,
        tls: Option<ClientTlsConfig>,
        keepalive: Keepalive,
        fetch_deadline: Duration,
    ) -> Self {
        Self::with_routing(given, Routing::Routed { tls, keepalive }, fetch_deadline)
    }

    /// Every call over `channel`, never routed.
    pub fn fixed(channel: Channel) -> Self {
        Self::with_routing(
            vec![("<channel>".into(), channel)],
            Routing::Fixed,
            Duration::ZERO,
        )
    }

    fn with_routing(
        given: Vec<(String, Channel)>,
        routing: Routing,
        fetch_deadline: Duration,
    ) -> Self {
        assert!(!given.is_empty(), "a router needs an address");
        let mut addresses = Vec::with_capacity(given.len());
        let mut channels = HashMap::with_capacity(given.len());
        for (address, channel) in given {
            if let std::collections::hash_map::Entry::Vacant(entry) = channels.entry(address) {
                addresses.push(entry.key().clone());
                entry.insert(channel);
            }
        }
        Self {
            given: addresses,
            routing,
            fetch_deadline,
            refreshing: tokio::sync::Mutex::new(()),
            state: Mutex::new(State {
                freshness: Freshness::Unknown,
                table: RoutingTable::default(),
                channels,
                failed: HashSet::new(),
                current: 0,
            }),
        }
    }

    /// The given addresses, in order.
    pub fn given(&self) -> &[String] {
        &self.given
    }

    /// Calls from now on go to the given address at `index` until a broker answers
    /// `GetCluster` (what [`Client::connect`](crate::Client::connect) found reachable).
    pub fn start_at(&self, index: usize) {
        self.state.lock().unwrap().current = index % self.given.len();
    }

    /// Where a call for `route` goes, after fetching the table (with `tag`'s token) if it is
    /// stale.
    pub async fn target(&self, route: Route<'_>, tag: &ClientTag) -> Target {
        self.refresh_if_needed(tag).await;
        let mut state = self.state.lock().unwrap();
        let address = match route {
            _ if state.table.is_empty() => None,
            Route::Any => Some(state.table.any_address()),
            Route::Queue(queue) => Some(state.table.address_of_queue(queue)),
            Route::Job(job_id) => Some(state.table.address_of_job(job_id)),
        }
        .map(str::to_string);
        self.target_locked(&mut state, address)
    }

    /// Where a `Work` stream for `queues` goes: the leader of every queue when their
    /// partitions share one; otherwise any node, which serves the queues of every partition
    /// through one stream.
    pub async fn stream_target(&self, queues: &[String], tag: &ClientTag) -> Target {
        self.refresh_if_needed(tag).await;
        let mut state = self.state.lock().unwrap();
        let table = &state.table;
        let address = if table.is_empty() {
            None
        } else {
            let leaders: HashSet<&str> = queues.iter().map(|q| table.address_of_queue(q)).collect();
            Some(match leaders.into_iter().collect::<Vec<_>>()[..] {
                [only] => only.to_string(),
                _ => table.any_address().to_string(),
            })
        };
        self.target_locked(&mut state, address)
    }

    /// The `Work` streams of a worker over `queues` (see [`RoutingTable::stream_groups`]),
    /// after fetching the table (with `tag`'s token) if it is stale.
    pub async fn stream_groups(
        &self,
        queues: &[String],
        max_in_flight: i32,
        tag: &ClientTag,
    ) -> Vec<StreamGroup> {
        self.refresh_if_needed(tag).await;
        let state = self.state.lock().unwrap();
        state.table.stream_groups(queues, max_in_flight)
    }

    /// The partition count of the latest table; `None` while no broker said it.
    pub fn partition_count(&self) -> Option<u32> {
        self.state.lock().unwrap().table.partition_count()
    }

    /// True when the latest table is a cluster's.
    pub fn is_cluster(&self) -> bool {
        self.state.lock().unwrap().table.is_cluster()
    }

    /// Where the stream of a group goes: its leader at `address`; for `None`, any node (the
    /// one that answered the table, or while none did, the given address in use), without
    /// asking for the table.
    pub fn group_target(&self, address: Option<&str>) -> Target {
        let mut state = self.state.lock().unwrap();
        let address = match address {
            Some(address) => Some(address.to_string()),
            None if state.table.is_empty() => None,
            None => Some(state.table.any_address().to_string()),
        };
        self.target_locked(&mut state, address)
    }

    /// The node calls without a route of their own go to now, without asking for the table:
    /// the one that answered it, or while it is not fresh, the given address in use.
    pub fn current(&self) -> Target {
        let mut state = self.state.lock().unwrap();
        let address =
            (state.freshness == Freshness::Fresh).then(|| state.table.any_address().to_string());
        self.target_locked(&mut state, address)
    }

    /// A call to `address` failed in a way that may mean that the node is gone or no longer
    /// leads (`UNAVAILABLE`, `DEADLINE_EXCEEDED`): the next call asks for the table first, and
    /// while none is known, goes to the next given address.
    pub fn unreachable(&self, address: &str) {
        let mut state = self.state.lock().unwrap();
        if state.freshness == Freshness::Fresh {
            state.freshness = Freshness::Stale;
        }
        state.failed.insert(address.to_string());
        let current = state.current;
        if self.given[current] == address {
            // Two calls failing together move it on by one node, not two.
            state.current = (current + 1) % self.given.len();
        }
    }

    /// A call to `address` was answered: it is asked for the table in its turn again.
    pub fn reached(&self, address: &str) {
        let mut state = self.state.lock().unwrap();
        if !state.failed.is_empty() {
            state.failed.remove(address);
        }
    }

    /// The next call asks for the table first (a `Work` or `WatchJob` stream ended: its node
    /// may have died or stopped leading).
    pub fn mark_stale(&self) {
        let mut state = self.state.lock().unwrap();
        if state.freshness == Freshness::Fresh {
            state.freshness = Freshness::Stale;
        }
    }

    fn needs_refresh(&self) -> bool {
        if let Routing::Fixed = self.routing {
            return false;
        }
        let state = self.state.lock().unwrap();
        match state.freshness {
            Freshness::Fresh => false,
            Freshness::Unknown => true,
            // One broker outside a cluster, at the one address given: asking it again could
            // only tell the same.
            Freshness::Stale => state.table.is_cluster() || self.given.len() > 1,
        }
    }

    async fn refresh_if_needed(&self, tag: &ClientTag) {
        if !self.needs_refresh() {
            return;
        }
        let _refreshing = self.refreshing.lock().await;
        if !self.needs_refresh() {
            return; // the refresh of another call ran while this one waited
        }
        let candidates = {
            let state = self.state.lock().unwrap();
            let mut candidates: Vec<String> = Vec::new();
            for address in state
                .table
                .node_addresses()
                .into_iter()
                .chain(self.given.clone())
            {
                if !candidates.contains(&address) {
                    candidates.push(address);
                }
            }
            // A node that failed its last call is likely down: ask the others first.
            candidates.sort_by_key(|address| state.failed.contains(address));
            candidates
        };
        for address in candidates {
            let Some(channel) = self.channel(&address) else {
                continue;
            };
            let mut admin = v1::admin_client::AdminClient::with_interceptor(channel, tag.clone());
            let mut request = tonic::Request::new(v1::GetClusterRequest {});
            request.set_timeout(self.fetch_deadline);
            let answer =
                tokio::time::timeout(self.fetch_deadline, admin.get_cluster(request)).await;
            let table = match answer {
                Ok(Ok(info)) => RoutingTable::from_cluster_info(info.get_ref(), &address),
                Ok(Err(status)) if !unreachable(status.code()) => {
                    // It answered but will not say: it serves every call, forwarding what
                    // it does not lead.
                    RoutingTable::single_broker(&address)
                }
                Ok(Err(_)) | Err(_) => {
                    self.state.lock().unwrap().failed.insert(address);
                    continue;
                }
            };
            let mut state = self.state.lock().unwrap();
            state.failed.remove(&address);
            state.table = table;
            state.freshness = Freshness::Fresh;
            return;
        }
        // Nobody answered: the old table (or none) stays, and stays stale.
    }

    /// The channel of `address`, made now if new; `None` for an address that does not parse.
    fn channel(&self, address: &str) -> Option<Channel> {
        let mut state = self.state.lock().unwrap();
        self.channel_locked(&mut state, address)
    }

    fn channel_locked(&self, state: &mut State, address: &str) -> Option<Channel> {
        if let Some(channel) = state.channels.get(address) {
            return Some(channel.clone());
        }
        let Routing::Routed { tls, keepalive } = &self.routing else {
            return None;
        };
        let channel = endpoint(address, tls.as_ref(), keepalive)
            .ok()?
            .connect_lazy();
        state.channels.insert(address.to_string(), channel.clone());
        Some(channel)
    }

    /// `address` if it has a channel; else (or with none) the current given address.
    fn target_locked(&self, state: &mut State, address: Option<String>) -> Target {
        if let Some(address) = address
            && let Some(channel) = self.channel_locked(state, &address)
        {
            return Target { address, channel };
        }
        let address = self.given[state.current].clone();
        let channel = state.channels[&address].clone();
        Target { address, channel }
    }
}
