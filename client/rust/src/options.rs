//! How to reach the broker: one [`ClientOptions`] for the [`Client`](crate::Client) and the
//! [`Worker`](crate::Worker) alike.
//!
//! ```
//! use std::time::Duration;
//! use jobbroker::ClientOptions;
//!
//! let options = ClientOptions::new()
//!     .addresses(["10.0.0.1:7070", "10.0.0.2:7070"]) // a cluster's nodes, or brokers in turn
//!     .tls_ca_file("/etc/jobbroker/ca.pem")          // TLS, trusting this CA
//!     .client_cert_files("/etc/jobbroker/client.pem", "/etc/jobbroker/client.key") // mutual TLS
//!     .token("s3cret")                               // authorization: Bearer s3cret
//!     .deadline(Duration::from_secs(5))              // unary calls; default 10 s
//!     .keepalive_time(Duration::from_secs(20))       // ping after 20 s without a frame; default 10 s
//!     .batch_linger(Duration::from_millis(2));       // enqueue coalescing: wait 2 ms for more
//! # let _ = options;
//! ```
//!
//! What is left unset comes from the environment when a client is made: the address from
//! `$JOBBROKER_ADDRESS` (a comma-separated list works too; neither: [`DEFAULT_ADDRESS`]), the
//! token from `$JOBBROKER_TOKEN`.

use std::path::PathBuf;
use std::time::Duration;

use tonic::metadata::AsciiMetadataValue;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

/// Unary calls that name no deadline of their own get this one.
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(10);

/// Read when [`ClientOptions::address`] was not set: one address, or several separated by
/// commas.
pub const ADDRESS_ENV: &str = "JOBBROKER_ADDRESS";
/// The broker when neither the options nor `$JOBBROKER_ADDRESS` name one.
pub const DEFAULT_ADDRESS: &str = "127.0.0.1:7070";
/// Read when [`ClientOptions::token`] was not set.
pub const TOKEN_ENV: &str = "JOBBROKER_TOKEN";

/// [`ClientOptions::keepalive_time`] when not set: a ping after 10 s without a frame from the
/// broker (the broker's own `--keepalive-time`).
pub const DEFAULT_KEEPALIVE_TIME: Duration = Duration::from_secs(10);
/// [`ClientOptions::keepalive_timeout`] when not set: 5 s for the ping's answer (the broker's
/// own `--keepalive-timeout`).
pub const DEFAULT_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(5);
/// The shortest [`ClientOptions::keepalive_time`]: the broker accepts a client's pings at most
/// once a second, and closes the connection of one that pings more often ("too_many_pings").
const MIN_KEEPALIVE_TIME: Duration = Duration::from_secs(1);
/// The longest [`ClientOptions::keepalive_time`] (as the broker's `--keepalive-time`).
const MAX_KEEPALIVE_TIME: Duration = Duration::from_secs(3600);
/// The bounds of [`ClientOptions::keepalive_timeout`] (as the broker's `--keepalive-timeout`).
const MIN_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(1);
const MAX_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(600);

/// [`ClientOptions::batch_max_jobs`] when not set: the jobs of one coalesced batch.
pub const DEFAULT_BATCH_MAX_JOBS: usize = 100;
/// The most jobs one `EnqueueBatch` may hold (the broker refuses more).
pub const MAX_BATCH_JOBS: usize = 1000;
/// [`ClientOptions::batch_max_bytes`] when not set: 1 MiB of payload and header bytes.
pub const DEFAULT_BATCH_MAX_BYTES: usize = 1 << 20;
/// [`ClientOptions::batch_max_in_flight`] when not set: batches of one key in flight at once.
pub const DEFAULT_BATCH_MAX_IN_FLIGHT: usize = 4;
/// The largest [`ClientOptions::batch_max_bytes`]: a batch must fit in one message the broker
/// takes (64 MiB).
const MAX_BATCH_BYTES: usize = 64 << 20;

/// How [`Client::enqueue`](crate::Client::enqueue) merges concurrent calls into
/// `EnqueueBatch` calls (`docs/worker-contract.md` §10); the five `batch` options of
/// [`ClientOptions`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct BatchOptions {
    pub enabled: bool,
    pub max_jobs: usize,
    pub max_bytes: usize,
    pub linger: Duration,
    pub max_in_flight: usize,
}

impl Default for BatchOptions {
    fn default() -> Self {
        Self {
            enabled: true,
            max_jobs: DEFAULT_BATCH_MAX_JOBS,
            max_bytes: DEFAULT_BATCH_MAX_BYTES,
            linger: Duration::ZERO,
            max_in_flight: DEFAULT_BATCH_MAX_IN_FLIGHT,
        }
    }
}

impl BatchOptions {
    /// Refuses a value no batch can work with, naming the option.
    fn check(&self) -> Result<(), ConnectError> {
        let invalid = |option: &'static str, reason: String| {
            Err(ConnectError::InvalidOption { option, reason })
        };
        if !(1..=MAX_BATCH_JOBS).contains(&self.max_jobs) {
            return invalid(
                "batch_max_jobs",
                format!("{} is not between 1 and {MAX_BATCH_JOBS}", self.max_jobs),
            );
        }
        if !(1..=MAX_BATCH_BYTES).contains(&self.max_bytes) {
            return invalid(
                "batch_max_bytes",
                format!("{} is not between 1 and {MAX_BATCH_BYTES}", self.max_bytes),
            );
        }
        if self.max_in_flight == 0 {
            return invalid("batch_max_in_flight", "must be at least 1".into());
        }
        Ok(())
    }
}

/// HTTP/2 keepalive pings on every channel a client dials: the three `keepalive` options of
/// [`ClientOptions`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Keepalive {
    pub enabled: bool,
    pub time: Duration,
    pub timeout: Duration,
}

impl Default for Keepalive {
    fn default() -> Self {
        Self {
            enabled: true,
            time: DEFAULT_KEEPALIVE_TIME,
            timeout: DEFAULT_KEEPALIVE_TIMEOUT,
        }
    }
}

impl Keepalive {
    /// Refuses a value out of range, naming the option (with keepalive off too: the options
    /// are wrong either way).
    fn check(&self) -> Result<(), ConnectError> {
        let invalid = |option: &'static str, reason: String| {
            Err(ConnectError::InvalidOption { option, reason })
        };
        if !self.time.is_zero() && !(MIN_KEEPALIVE_TIME..=MAX_KEEPALIVE_TIME).contains(&self.time) {
            return invalid(
                "keepalive_time",
                format!(
                    "{:?} is neither 0 nor between {MIN_KEEPALIVE_TIME:?} and {MAX_KEEPALIVE_TIME:?}",
                    self.time
                ),
            );
        }
        if !(MIN_KEEPALIVE_TIMEOUT..=MAX_KEEPALIVE_TIMEOUT).contains(&self.timeout) {
            return invalid(
                "keepalive_timeout",
                format!(
                    "{:?} is not between {MIN_KEEPALIVE_TIMEOUT:?} and {MAX_KEEPALIVE_TIMEOUT:?}",
                    self.timeout
                ),
            );
        }
        Ok(())
    }

    /// `endpoint` pinging as configured: after `time` without a frame, also with no call open
    /// (hyper's `keep_alive_while_idle`), and closing the connection when a ping goes
    /// unanswered for `timeout`. hyper has no cap on pings without data (grpc core's
    /// `grpc.http2.max_pings_without_data`): a quiet `Work` stream is pinged as long as it is
    /// open. Off (or a time of zero): hyper's default, no pings.
    fn apply(&self, endpoint: Endpoint) -> Endpoint {
        if !self.enabled || self.time.is_zero() {
            return endpoint;
        }
        endpoint
            .http2_keep_alive_interval(self.time)
            .keep_alive_timeout(self.timeout)
            .keep_alive_while_idle(true)
    }
}

/// PEM data given inline or as a file read when the client is made.
#[derive(Clone)]
enum Pem {
    File(PathBuf),
    Inline(Vec<u8>),
}

impl Pem {
    fn read(&self, what: &'static str) -> Result<Vec<u8>, ConnectError> {
        match self {
            Self::Inline(pem) => Ok(pem.clone()),
            Self::File(path) => std::fs::read(path).map_err(|source| ConnectError::ReadFile {
                what,
                path: path.clone(),
                source,
            }),
        }
    }
}

impl std::fmt::Debug for Pem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::File(path) => write!(f, "{}", path.display()),
            Self::Inline(_) => f.write_str("<inline PEM>"),
        }
    }
}

/// Which certificates the client trusts when it speaks TLS.
#[derive(Clone, Debug)]
enum Trust {
    /// The operating system's roots (a broker behind a public certificate).
    SystemRoots,
    /// Only this CA (a private one, as most deployments have).
    Ca(Pem),
}

/// How to reach the broker, shared by [`Client`](crate::Client) and
/// [`Worker`](crate::Worker): the addresses, TLS and mutual TLS, the bearer token, the
/// deadline of unary calls, keepalive pings (the `keepalive` options), and how the client
/// coalesces enqueues (the `batch` options). Every call also carries `jobbroker-client: jobbroker-rust/<version>`
/// ([`CLIENT_NAME`](crate::CLIENT_NAME)).
///
/// A plain address converts into options, so `Client::new("127.0.0.1:7070")` and
/// `Worker::builder("127.0.0.1:7070")` work as they are. Nothing is read or connected until a
/// client is made from the options.
#[derive(Clone)]
pub struct ClientOptions {
    addresses: Vec<String>,
    trust: Option<Trust>,
    identity: Option<(Pem, Pem)>,
    server_name: Option<String>,
    token: Option<String>,
    deadline: Duration,
    keepalive: Keepalive,
    batch: BatchOptions,
}

impl Default for ClientOptions {
    fn default() -> Self {
        Self {
            addresses: Vec::new(),
            trust: None,
            identity: None,
            server_name: None,
            token: None,
            deadline: DEFAULT_DEADLINE,
            keepalive: Keepalive::default(),
            batch: BatchOptions::default(),
        }
    }
}

impl std::fmt::Debug for ClientOptions {
    // The token is left out: options end up in logs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientOptions")
            .field("addresses", &self.addresses)
            .field("trust", &self.trust)
            .field("identity", &self.identity)
            .field("server_name", &self.server_name)
            .field("token", &self.token.as_ref().map(|_| "<set>"))
            .field("deadline", &self.deadline)
            .field("keepalive", &self.keepalive)
            .field("batch", &self.batch)
            .finish()
    }
}

impl From<&str> for ClientOptions {
    fn from(address: &str) -> Self {
        Self::new().address(address)
    }
}

impl From<String> for ClientOptions {
    fn from(address: String) -> Self {
        Self::new().address(address)
    }
}

impl From<&String> for ClientOptions {
    fn from(address: &String) -> Self {
        Self::new().address(address.as_str())
    }
}

impl ClientOptions {
    /// No address yet (`$JOBBROKER_ADDRESS` then, else [`DEFAULT_ADDRESS`]), plaintext, no
    /// token (`$JOBBROKER_TOKEN` then), a 10 s deadline, keepalive pings after 10 s without a
    /// frame (5 s for the answer).
    pub fn new() -> Self {
        Self::default()
    }

    /// The broker: `host:port`, or a URI (`http://host:port`, `https://host:port`); a
    /// comma-separated list is taken as [`Self::addresses`]. Replaces any address set before.
    pub fn address(mut self, address: impl Into<String>) -> Self {
        self.addresses = split_list(&address.into());
        self
    }

    /// Several brokers (the nodes of a cluster). In a cluster they are where the client asks
    /// which node leads each partition, and each call goes to its leader. Outside one they
    /// are tried in order: a call answered `UNAVAILABLE` moves the client to the next one,
    /// for its retry (if the call is safe to repeat) and for later calls. Replaces any
    /// address set before.
    pub fn addresses<I, S>(mut self, addresses: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.addresses = addresses.into_iter().map(Into::into).collect();
        self
    }

    /// TLS, trusting only the CA certificate(s) in this PEM file (read when the client is
    /// made). The broker's certificate must name the host of the address (an IP address
    /// works when the certificate has it as an IP SAN), or [`Self::tls_server_name`].
    pub fn tls_ca_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.trust = Some(Trust::Ca(Pem::File(path.into())));
        self
    }

    /// Like [`Self::tls_ca_file`], with the PEM itself.
    pub fn tls_ca_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.trust = Some(Trust::Ca(Pem::Inline(pem.into())));
        self
    }

    /// TLS, trusting the operating system's root certificates.
    pub fn tls_system_roots(mut self) -> Self {
        self.trust = Some(Trust::SystemRoots);
        self
    }

    /// The name to check the broker's certificate against, when it is not the address's host.
    pub fn tls_server_name(mut self, name: impl Into<String>) -> Self {
        self.server_name = Some(name.into());
        self
    }

    /// Mutual TLS: present this certificate chain and its private key (PEM files, read when
    /// the client is made), for a broker started with `--tls-client-ca`. Needs TLS
    /// ([`Self::tls_ca_file`] or another `tls_` option).
    pub fn client_cert_files(mut self, cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Self {
        self.identity = Some((Pem::File(cert.into()), Pem::File(key.into())));
        self
    }

    /// Like [`Self::client_cert_files`], with the PEMs themselves.
    pub fn client_cert_pem(mut self, cert: impl Into<Vec<u8>>, key: impl Into<Vec<u8>>) -> Self {
        self.identity = Some((Pem::Inline(cert.into()), Pem::Inline(key.into())));
        self
    }

    /// Sends `authorization: Bearer <token>` on every call (a broker started with
    /// `--auth-tokens`). Unset: `$JOBBROKER_TOKEN`, if set. Send tokens over TLS only.
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// How long a unary call may take, its retries included; default 10 s; `Duration::MAX`:
    /// no deadline. Streams (`Work`, `WatchJob`) have none. [`Client::with_deadline`](crate::Client::with_deadline) changes
    /// it for some calls.
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }

    /// Whether every channel the client dials (a [`Worker`](crate::Worker)'s too) sends HTTP/2
    /// keepalive pings; default on. A broker that froze, lost power or sits behind a firewall
    /// that drops packets is noticed by no TCP error, and a worker's `Work` stream would wait on
    /// it forever: with pings, after [`Self::keepalive_time`] without a frame the client pings,
    /// and a ping unanswered for [`Self::keepalive_timeout`] closes the connection. Its calls
    /// then fail and its streams end (`UNAVAILABLE`), and a worker reconnects after its backoff
    /// (to another node in a cluster). Pings go out with no call open too, so an idle
    /// producer's dead connection is found before its next call. Off (or a
    /// [`Self::keepalive_time`] of zero): no pings (the broker still pings its clients,
    /// `--keepalive-time`). A channel given to
    /// [`Client::from_channel`](crate::Client::from_channel) keeps its own settings.
    pub fn keepalive(mut self, on: bool) -> Self {
        self.keepalive.enabled = on;
        self
    }

    /// How long a connection may go without a frame from the broker before the client pings
    /// it (tonic's `http2_keep_alive_interval`); 1 s (the broker accepts a client's pings at
    /// most once a second) to 1 h, or zero for no pings; default 10 s.
    pub fn keepalive_time(mut self, time: Duration) -> Self {
        self.keepalive.time = time;
        self
    }

    /// How long a ping may go unanswered before the connection is closed (tonic's
    /// `keep_alive_timeout`); 1 s to 10 min, default 5 s.
    pub fn keepalive_timeout(mut self, timeout: Duration) -> Self {
        self.keepalive.timeout = timeout;
        self
    }

    /// Whether [`Client::enqueue`](crate::Client::enqueue) merges concurrent calls into
    /// `EnqueueBatch` calls (`docs/worker-contract.md` §10); default on. Off: every enqueue is
    /// one unary `Enqueue`. [`Client::with_batching`](crate::Client::with_batching) turns it
    /// off (or on) for some calls.
    pub fn batching(mut self, on: bool) -> Self {
        self.batch.enabled = on;
        self
    }

    /// A coalesced batch is sent once it holds this many jobs; 1 to 1000, default 100.
    pub fn batch_max_jobs(mut self, jobs: usize) -> Self {
        self.batch.max_jobs = jobs;
        self
    }

    /// ... or once its jobs' payload and header (name and value) bytes reach this; a job that
    /// would take a batch past it starts the next one. 1 byte to 64 MiB, default 1 MiB.
    pub fn batch_max_bytes(mut self, bytes: usize) -> Self {
        self.batch.max_bytes = bytes;
        self
    }

    /// How long a batch that could be sent waits for more jobs; default 0: it is sent at once,
    /// and jobs gather only while [`Self::batch_max_in_flight`] batches are in flight.
    pub fn batch_linger(mut self, linger: Duration) -> Self {
        self.batch.linger = linger;
        self
    }

    /// Batches of one key (partition, and whether the jobs have a dedup key) in flight at
    /// once; later jobs wait in the open batch. At least 1, default 4.
    pub fn batch_max_in_flight(mut self, batches: usize) -> Self {
        self.batch.max_in_flight = batches;
        self
    }

    /// The options made concrete, with `env` standing for the process environment (an
    /// argument so that tests need not change the real one).
    pub(crate) fn resolve(
        &self,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Resolved, ConnectError> {
        let mut addresses = self.addresses.clone();
        if addresses.is_empty() {
            addresses = env(ADDRESS_ENV)
                .map(|list| split_list(&list))
                .unwrap_or_default();
        }
        if addresses.is_empty() {
            addresses = vec![DEFAULT_ADDRESS.to_string()];
        }
        self.batch.check()?;
        self.keepalive.check()?;
        let tls = self.tls_config()?;
        let mut endpoints = Vec::with_capacity(addresses.len());
        for address in addresses {
            let endpoint = endpoint(&address, tls.as_ref(), &self.keepalive).map_err(|source| {
                ConnectError::InvalidAddress {
                    address: address.clone(),
                    source,
                }
            })?;
            endpoints.push((address, endpoint));
        }
        let token = self
            .token
            .clone()
            .or_else(|| env(TOKEN_ENV).filter(|t| !t.is_empty()));
        let authorization = token
            .map(|t| bearer(&t).ok_or(ConnectError::BadToken))
            .transpose()?;
        Ok(Resolved {
            endpoints,
            tls,
            keepalive: self.keepalive,
            authorization,
            deadline: self.deadline,
            batch: self.batch.clone(),
        })
    }

    fn tls_config(&self) -> Result<Option<ClientTlsConfig>, ConnectError> {
        let Some(trust) = &self.trust else {
            if self.identity.is_some() {
                return Err(ConnectError::CertificateWithoutTls);
            }
            return Ok(None);
        };
        let mut config = ClientTlsConfig::new();
        config = match trust {
            Trust::SystemRoots => config.with_native_roots(),
            Trust::Ca(pem) => config.ca_certificate(Certificate::from_pem(pem.read("CA file")?)),
        };
        if let Some((cert, key)) = &self.identity {
            let identity =
                Identity::from_pem(cert.read("client certificate")?, key.read("client key")?);
            config = config.identity(identity);
        }
        if let Some(name) = &self.server_name {
            config = config.domain_name(name.clone());
        }
        Ok(Some(config))
    }
}

/// The options as a client uses them.
pub(crate) struct Resolved {
    /// Each address as given, and its endpoint.
    pub endpoints: Vec<(String, Endpoint)>,
    /// For the endpoints of the nodes a cluster names.
    pub tls: Option<ClientTlsConfig>,
    /// The same.
    pub keepalive: Keepalive,
    pub authorization: Option<AsciiMetadataValue>,
    pub deadline: Duration,
    pub batch: BatchOptions,
}

/// The addresses of a comma-separated list, blanks dropped.
fn split_list(list: &str) -> Vec<String> {
    list.split(',')
        .map(str::trim)
        .filter(|a| !a.is_empty())
        .map(str::to_string)
        .collect()
}

/// `Bearer <token>` as metadata; `None` if the token is not visible ASCII.
pub(crate) fn bearer(token: &str) -> Option<AsciiMetadataValue> {
    if token.is_empty() || !token.bytes().all(|b| b.is_ascii_graphic()) {
        return None;
    }
    format!("Bearer {token}").parse().ok()
}

/// The endpoint of `address`: `host:port` becomes `http://host:port`, or `https://` with TLS;
/// an address with a scheme keeps it. It pings as `keepalive` says.
pub(crate) fn endpoint(
    address: &str,
    tls: Option<&ClientTlsConfig>,
    keepalive: &Keepalive,
) -> Result<Endpoint, tonic::transport::Error> {
    let uri = if address.contains("://") {
        address.to_string()
    } else if tls.is_some() {
        format!("https://{address}")
    } else {
        format!("http://{address}")
    };
    let endpoint = keepalive.apply(Endpoint::from_shared(uri)?);
    match tls {
        Some(tls) => endpoint.tls_config(tls.clone()),
        None => Ok(endpoint),
    }
}

/// Why a [`Client`](crate::Client) could not be made from its [`ClientOptions`].
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// An address does not parse as a URI.
    #[error("invalid broker address {address:?}: {source}")]
    InvalidAddress {
        /// As given.
        address: String,
        /// Why it does not parse.
        #[source]
        source: tonic::transport::Error,
    },
    /// A certificate or key file could not be read.
    #[error("cannot read the {what} {}: {source}", path.display())]
    ReadFile {
        /// Which file: "CA file", "client certificate", "client key".
        what: &'static str,
        /// As given.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A client certificate was given without TLS.
    #[error("a client certificate needs TLS: set tls_ca_file (or another tls_ option) too")]
    CertificateWithoutTls,
    /// The token cannot be sent as metadata (empty, or not visible ASCII).
    #[error("the token is empty or not visible ASCII")]
    BadToken,
    /// An option has a value no client can work with (a `batch_` or `keepalive_` option out
    /// of range).
    #[error("invalid option {option}: {reason}")]
    InvalidOption {
        /// The option, as its [`ClientOptions`] method is named.
        option: &'static str,
        /// What is wrong with its value.
        reason: String,
    },
    /// [`Client::connect`](crate::Client::connect) reached none of the addresses.
    #[error("cannot connect to {address}: {source}")]
    Unreachable {
        /// The last address tried.
        address: String,
        /// Why that one failed.
        #[source]
        source: tonic::transport::Error,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_of(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |name| {
            pairs
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.to_string())
        }
    }

    fn addresses(resolved: &Resolved) -> Vec<String> {
        resolved.endpoints.iter().map(|(a, _)| a.clone()).collect()
    }

    fn uris(resolved: &Resolved) -> Vec<String> {
        resolved
            .endpoints
            .iter()
            .map(|(_, e)| e.uri().to_string())
            .collect()
    }

    #[test]
    fn the_environment_fills_in_what_was_not_set() {
        let env = env_of(&[
            (ADDRESS_ENV, "10.0.0.1:7070, 10.0.0.2:7070"),
            (TOKEN_ENV, "from-env"),
        ]);
        let resolved = ClientOptions::new().resolve(&env).unwrap();
        assert_eq!(addresses(&resolved), ["10.0.0.1:7070", "10.0.0.2:7070"]);
        assert_eq!(
            resolved.authorization.unwrap().to_str().unwrap(),
            "Bearer from-env"
        );
        assert_eq!(resolved.deadline, DEFAULT_DEADLINE);

        let resolved = ClientOptions::new()
            .address("broker:1")
            .token("set")
            .resolve(&env)
            .unwrap();
        assert_eq!(addresses(&resolved), ["broker:1"]);
        assert_eq!(
            resolved.authorization.unwrap().to_str().unwrap(),
            "Bearer set"
        );
    }

    #[test]
    fn with_no_address_anywhere_the_default_one_is_used() {
        let resolved = ClientOptions::new().resolve(env_of(&[])).unwrap();
        assert_eq!(addresses(&resolved), [DEFAULT_ADDRESS]);
        assert!(resolved.authorization.is_none());
    }

    #[test]
    fn a_comma_separated_address_is_a_list() {
        let resolved = ClientOptions::from("a:1, b:2,")
            .resolve(env_of(&[]))
            .unwrap();
        assert_eq!(addresses(&resolved), ["a:1", "b:2"]);
    }

    #[test]
    fn tls_turns_plain_addresses_into_https() {
        let plain = ClientOptions::from("127.0.0.1:7070")
            .resolve(env_of(&[]))
            .unwrap();
        assert_eq!(uris(&plain), ["http://127.0.0.1:7070/"]);
        let tls = ClientOptions::new()
            .addresses(["127.0.0.1:7070", "http://127.0.0.1:7071"])
            .tls_ca_pem("not checked until a connection is made")
            .resolve(env_of(&[]))
            .unwrap();
        assert_eq!(
            uris(&tls),
            ["https://127.0.0.1:7070/", "http://127.0.0.1:7071/"]
        );
    }

    #[test]
    fn bad_options_are_refused_before_any_connection() {
        let refused = |options: ClientOptions| options.resolve(env_of(&[])).err().unwrap();
        assert!(matches!(
            refused(ClientOptions::from("b:1").token("two words")),
            ConnectError::BadToken
        ));
        assert!(matches!(
            refused(ClientOptions::from("b:1").client_cert_pem("c", "k")),
            ConnectError::CertificateWithoutTls
        ));
        assert!(matches!(
            refused(ClientOptions::from("b:1").tls_ca_file("/nonexistent/ca.pem")),
            ConnectError::ReadFile {
                what: "CA file",
                ..
            }
        ));
        assert!(matches!(
            refused(ClientOptions::from("not a uri")),
            ConnectError::InvalidAddress { .. }
        ));
    }

    #[test]
    fn batching_is_on_by_default_with_the_contracts_limits() {
        let resolved = ClientOptions::from("b:1").resolve(env_of(&[])).unwrap();
        assert_eq!(
            resolved.batch,
            BatchOptions {
                enabled: true,
                max_jobs: 100,
                max_bytes: 1 << 20,
                linger: Duration::ZERO,
                max_in_flight: 4,
            }
        );
        let resolved = ClientOptions::from("b:1")
            .batching(false)
            .batch_max_jobs(1000)
            .batch_max_bytes(1)
            .batch_linger(Duration::from_millis(50))
            .batch_max_in_flight(1)
            .resolve(env_of(&[]))
            .unwrap();
        assert!(!resolved.batch.enabled);
        assert_eq!(resolved.batch.max_jobs, 1000);
        assert_eq!(resolved.batch.linger, Duration::from_millis(50));
    }

    #[test]
    fn a_batch_option_out_of_range_is_refused_naming_it() {
        let refused = |options: ClientOptions| {
            let error = options.resolve(env_of(&[])).err().unwrap();
            let ConnectError::InvalidOption { option, .. } = &error else {
                panic!("{error:?}");
            };
            assert!(error.to_string().contains(option), "{error}");
            *option
        };
        let options = || ClientOptions::from("b:1");
        assert_eq!(refused(options().batch_max_jobs(0)), "batch_max_jobs");
        assert_eq!(refused(options().batch_max_jobs(1001)), "batch_max_jobs");
        assert_eq!(refused(options().batch_max_bytes(0)), "batch_max_bytes");
        assert_eq!(
            refused(options().batch_max_bytes((64 << 20) + 1)),
            "batch_max_bytes"
        );
        assert_eq!(
            refused(options().batch_max_in_flight(0)),
            "batch_max_in_flight"
        );
        // Refused even with batching off: the options are wrong either way.
        assert_eq!(
            refused(options().batching(false).batch_max_jobs(0)),
            "batch_max_jobs"
        );
    }

    #[test]
    fn keepalive_is_on_by_default_with_the_brokers_times() {
        let resolved = ClientOptions::from("b:1").resolve(env_of(&[])).unwrap();
        assert_eq!(
            resolved.keepalive,
            Keepalive {
                enabled: true,
                time: Duration::from_secs(10),
                timeout: Duration::from_secs(5),
            }
        );
        let resolved = ClientOptions::from("b:1")
            .keepalive_time(Duration::from_secs(1))
            .keepalive_timeout(Duration::from_millis(1500))
            .resolve(env_of(&[]))
            .unwrap();
        assert_eq!(
            resolved.keepalive,
            Keepalive {
                enabled: true,
                time: Duration::from_secs(1),
                timeout: Duration::from_millis(1500),
            }
        );
        let resolved = ClientOptions::from("b:1")
            .keepalive(false)
            .resolve(env_of(&[]))
            .unwrap();
        assert!(!resolved.keepalive.enabled);
        // A time of zero is off too (docs/worker-contract.md §5).
        let resolved = ClientOptions::from("b:1")
            .keepalive_time(Duration::ZERO)
            .resolve(env_of(&[]))
            .unwrap();
        assert!(resolved.keepalive.time.is_zero());
    }

    #[test]
    fn a_keepalive_option_out_of_range_is_refused_naming_it() {
        let refused = |options: ClientOptions| {
            let error = options.resolve(env_of(&[])).err().unwrap();
            let ConnectError::InvalidOption { option, .. } = &error else {
                panic!("{error:?}");
            };
            assert!(error.to_string().contains(option), "{error}");
            *option
        };
        let options = || ClientOptions::from("b:1");
        let ms = Duration::from_millis;
        assert_eq!(refused(options().keepalive_time(ms(999))), "keepalive_time");
        assert_eq!(refused(options().keepalive_time(ms(1))), "keepalive_time");
        assert_eq!(
            refused(options().keepalive_time(Duration::from_secs(3601))),
            "keepalive_time"
        );
        assert_eq!(
            refused(options().keepalive_time(Duration::MAX)),
            "keepalive_time"
        );
        assert_eq!(
            refused(options().keepalive_timeout(Duration::ZERO)),
            "keepalive_timeout"
        );
        assert_eq!(
            refused(options().keepalive_timeout(Duration::from_secs(601))),
            "keepalive_timeout"
        );
        // Refused even with keepalive off: the options are wrong either way.
        assert_eq!(
            refused(options().keepalive(false).keepalive_timeout(ms(10))),
            "keepalive_timeout"
        );
        // The bounds themselves are fine.
        for options in [
            options()
                .keepalive_time(Duration::from_secs(1))
                .keepalive_timeout(Duration::from_secs(1)),
            options()
                .keepalive_time(Duration::from_secs(3600))
                .keepalive_timeout(Duration::from_secs(600)),
        ] {
            options.resolve(env_of(&[])).unwrap();
        }
    }

    #[test]
    fn the_token_stays_out_of_debug_output() {
        let shown = format!("{:?}", ClientOptions::from("b:1").token("s3cret"));
        assert!(!shown.contains("s3cret"), "{shown}");
    }
}
