//! Starts the real jobbroker binary for a test: fresh data dir, ports chosen by the OS.
#![allow(dead_code)]

use std::hash::BuildHasher;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use jobbroker::v1::JobState;
use jobbroker::{Client, ClientOptions, RunError, ShutdownHandle, Worker};
use tokio::task::JoinHandle;

/// The retries queue: 3 attempts, 50 ms backoff without jitter, 1 s lease.
pub const FAST_RETRIES: &str = r#"{"queues": {"retries": {"retry": {"maxAttempts": 3, "initialBackoff": "0.05s", "jitter": "JITTER_NONE"}, "leaseDuration": "1s"}}}"#;

/// Generous "give up" bound for waiting on the broker; never an assertion about speed.
pub const GIVE_UP: Duration = Duration::from_secs(30);

/// The repository root, from this crate's location (client/rust).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A fresh empty directory under the system temp dir, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> Self {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        let dir = std::env::temp_dir().join(format!(
            "jobbroker-rust-{tag}-{}-{}-{nanos}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A running broker; killed (SIGKILL) on drop unless stopped before.
pub struct Broker {
    child: Child,
    pub addr: String,
    /// Where it serves `/metrics`.
    pub http_addr: String,
    pub dir: TempDir,
    config: Option<String>,
    extra_args: Vec<String>,
}

impl Broker {
    pub fn start() -> Self {
        Self::start_with_config(None)
    }

    pub fn start_with_config(config: Option<&str>) -> Self {
        Self::start_with_args(config, &[])
    }

    /// Like [`Broker::start_with_config`], with more flags for the broker.
    pub fn start_with_args(config: Option<&str>, extra_args: &[&str]) -> Self {
        let dir = TempDir::new("broker");
        let extra_args: Vec<String> = extra_args.iter().map(|a| a.to_string()).collect();
        let (child, (addr, http_addr)) = launch(&dir.0, "127.0.0.1:0", config, &extra_args);
        Broker {
            child,
            addr,
            http_addr,
            dir,
            config: config.map(str::to_string),
            extra_args,
        }
    }

    /// SIGKILLs the broker and starts it again on the same address and data dir (what a crash
    /// and a supervisor's restart look like to a worker).
    pub fn kill_and_restart(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let (child, (addr, http_addr)) = launch(
            &self.dir.0,
            &self.addr,
            self.config.as_deref(),
            &self.extra_args,
        );
        assert_eq!(addr, self.addr, "the broker came back on another address");
        self.child = child;
        self.http_addr = http_addr;
    }
    /// How many unary calls of `method` (e.g. `/jobbroker.v1.Broker/Enqueue`) it has
    /// answered, with status `code` (e.g. `INVALID_ARGUMENT`) or with any.
    pub fn rpc_count(&self, method: &str, code: Option<&str>) -> u64 {
        let text = http_get(&self.http_addr, "/metrics");
        let method = format!("method=\"{method}\"");
        let code = code.map(|c| format!("code=\"{c}\""));
        text.lines()
            .filter(|line| line.starts_with("jobbroker_rpc_duration_seconds_count{"))
            .filter(|line| line.contains(&method))
            .filter(|line| code.as_ref().is_none_or(|c| line.contains(c)))
            .map(|line| {
                let value = line.rsplit(' ').next().unwrap_or_default();
                value
                    .parse::<f64>()
                    .unwrap_or_else(|_| panic!("unparsable metric line {line:?}"))
                    as u64
            })
            .sum()
    }

    pub async fn client(&self) -> Client {
        Client::connect(&self.addr)
            .await
            .expect("connect to broker")
    }

    /// SIGSTOPs the broker until the guard is dropped (SIGCONT then). To its clients it is a
    /// broker that hung, lost power or sits behind a firewall that drops packets: the kernel
    /// still accepts and acknowledges what they send, their connections stay ESTABLISHED, and
    /// nothing comes back.
    pub fn freeze(&self) -> Frozen {
        let pid = self.child.id() as i32;
        assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0, "SIGSTOP");
        Frozen(pid)
    }

    /// SIGTERM and wait; returns the exit code.
    pub fn stop(mut self) -> Option<i32> {
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        self.child.wait().ok().and_then(|s| s.code())
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A broker stopped by [`Broker::freeze`]: dropped (at the end of a test, or when it panics),
/// it sends the broker SIGCONT.
pub struct Frozen(i32);

impl Drop for Frozen {
    fn drop(&mut self) {
        unsafe { libc::kill(self.0, libc::SIGCONT) };
    }
}

/// The port of `ipv4:127.0.0.1:PORT` (a `peer` in `ListWorkers`) or `127.0.0.1:PORT`.
pub fn port_of(address: &str) -> u16 {
    address
        .rsplit(':')
        .next()
        .and_then(|port| port.parse().ok())
        .unwrap_or_else(|| panic!("no port in {address:?}"))
}

/// Whether a TCP connection of this host from local port `from` to remote port `to` is
/// ESTABLISHED, by `/proc/net/tcp` and `tcp6` (local and remote `ADDR:PORT` in hex, then the
/// state: `01`).
pub fn tcp_established(from: u16, to: u16) -> bool {
    let port = |address: &str| {
        address
            .rsplit(':')
            .next()
            .and_then(|hex| u16::from_str_radix(hex, 16).ok())
    };
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|file| {
        std::fs::read_to_string(file).is_ok_and(|table| {
            table.lines().skip(1).any(|line| {
                let fields: Vec<&str> = line.split_whitespace().collect();
                fields.len() > 3
                    && port(fields[1]) == Some(from)
                    && port(fields[2]) == Some(to)
                    && fields[3] == "01"
            })
        })
    })
}

/// A real cluster: etcd and three broker nodes (every partition replicated on all three) on
/// loopback, as `tests/lib/cluster.sh` runs them. Started once per test file; on drop the
/// nodes still running are killed, then etcd, each by its own PID.
pub struct Cluster {
    /// The nodes' addresses, node-0 first: what a client of the cluster is given.
    pub addresses: Vec<String>,
    /// Where each node serves `/metrics`, in the same order.
    pub http_addresses: Vec<String>,
    /// `None` once [`Cluster::kill9`] killed it.
    nodes: Vec<Option<Child>>,
    etcd: Child,
    _dir: TempDir,
}

impl Cluster {
    /// Starts the cluster with `partitions` partitions and returns once every partition has
    /// a leader and all three nodes in sync (panics after 60 s).
    pub async fn start(partitions: u32) -> Self {
        let dir = TempDir::new("cluster");
        // All of the cluster's ports at once, so that no two are the same.
        let ports = free_addresses(8);
        let etcd_url = format!("http://{}", ports[0]);
        let etcd_log = std::fs::File::create(dir.0.join("etcd.log")).unwrap();
        let etcd = Command::new("etcd")
            .arg("--data-dir")
            .arg(dir.0.join("etcd"))
            .args(["--listen-client-urls", &etcd_url])
            .args(["--advertise-client-urls", &etcd_url])
            .arg("--listen-peer-urls")
            .arg(format!("http://{}", ports[1]))
            .stdin(Stdio::null())
            .stdout(etcd_log.try_clone().unwrap())
            .stderr(etcd_log)
            .spawn()
            .expect("start etcd (Debian's etcd-server, on PATH)");
        let addresses: Vec<String> = ports[2..5].to_vec();
        let http_addresses: Vec<String> = ports[5..8].to_vec();
        let mut cluster = Cluster {
            addresses: addresses.clone(),
            http_addresses: http_addresses.clone(),
            nodes: Vec::new(),
            etcd,
            _dir: dir,
        };
        // All three at once: a node may wait for the others before it serves.
        let mut serving = Vec::new();
        for (n, address) in addresses.iter().enumerate() {
            let node_dir = cluster._dir.0.join(format!("node-{n}"));
            std::fs::create_dir_all(&node_dir).unwrap();
            let args: Vec<String> = [
                "--partitions",
                &partitions.to_string(),
                "--cluster-etcd",
                &etcd_url,
                "--node-id",
                &format!("node-{n}"),
                "--cluster-initial-nodes",
                "3",
            ]
            .iter()
            .map(|a| a.to_string())
            .collect();
            let (child, printed) =
                spawn_broker(&node_dir, address, &http_addresses[n], None, &args);
            cluster.nodes.push(Some(child));
            serving.push(printed);
        }
        for (n, printed) in serving.into_iter().enumerate() {
            let child = cluster.nodes[n].as_mut().unwrap();
            assert_eq!(
                await_serving(child, printed).0,
                addresses[n],
                "node-{n} serves elsewhere"
            );
        }
        cluster.wait_until_settled().await;
        cluster
    }

    /// Until every partition has a leader, all three nodes in sync, and a call for each is
    /// served.
    async fn wait_until_settled(&self) {
        let client = Client::new(ClientOptions::new().addresses(self.addresses.clone())).unwrap();
        let give_up = tokio::time::Instant::now() + CLUSTER_GIVE_UP;
        loop {
            let answer = client.get_cluster().await;
            if let Ok(info) = &answer
                && !info.partitions.is_empty()
                && info
                    .partitions
                    .iter()
                    .all(|p| !p.leader_node_id.is_empty() && p.in_sync.len() == 3)
                && every_partition_serves(&client, info.partitions.len() as u32).await
            {
                return;
            }
            assert!(
                tokio::time::Instant::now() < give_up,
                "the cluster did not settle within {CLUSTER_GIVE_UP:?}: {answer:?}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The value of gauge `name` in the `/metrics` of the node at `address` (lines look like
    /// `jobbroker_work_streams_open 1`); panics if the node does not answer or has no such line.
    pub fn metric(&self, address: &str, name: &str) -> f64 {
        let at = self
            .addresses
            .iter()
            .position(|a| a == address)
            .unwrap_or_else(|| panic!("no node at {address}"));
        let text = http_get(&self.http_addresses[at], "/metrics");
        text.lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
            .and_then(|value| value.trim().parse().ok())
            .unwrap_or_else(|| panic!("node {address} has no {name} in its /metrics"))
    }

    /// kill -9 of the node at `address`: a dead machine.
    pub fn kill9(&mut self, address: &str) {
        let at = self
            .addresses
            .iter()
            .position(|a| a == address)
            .unwrap_or_else(|| panic!("no node at {address}"));
        if let Some(mut child) = self.nodes[at].take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for child in self.nodes.iter_mut().flatten() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = self.etcd.kill();
        let _ = self.etcd.wait();
    }
}

/// How long a cluster may take to settle, or to elect a new leader after a kill.
pub const CLUSTER_GIVE_UP: Duration = Duration::from_secs(60);

/// Polls Admin.GetJob until the job is in `state`; panics after GIVE_UP.
pub async fn wait_for_state(client: &Client, job_id: &str, state: JobState) -> jobbroker::v1::Job {
    let give_up = tokio::time::Instant::now() + GIVE_UP;
    loop {
        let job = client.get_job(job_id).await.expect("get job");
        if job.state == state as i32 {
            return job;
        }
        assert!(
            tokio::time::Instant::now() < give_up,
            "job {job_id} never reached {state:?}; it is {:?}",
            JobState::try_from(job.state)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Starts the broker binary on `listen` with its data under `dir`; returns it and the
/// addresses it printed (gRPC, HTTP).
fn launch(
    dir: &Path,
    listen: &str,
    config: Option<&str>,
    extra_args: &[String],
) -> (Child, (String, String)) {
    let (mut child, serving) = spawn_broker(dir, listen, "127.0.0.1:0", config, extra_args);
    let addr = await_serving(&mut child, serving);
    (child, addr)
}

/// Starts the broker binary; the receiver gets the addresses it prints once it serves
/// (gRPC, HTTP).
fn spawn_broker(
    dir: &Path,
    listen: &str,
    http_listen: &str,
    config: Option<&str>,
    extra_args: &[String],
) -> (Child, mpsc::Receiver<(String, String)>) {
    let bin = std::env::var_os("JOBBROKER_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("build/server/jobbroker"));
    assert!(
        bin.exists(),
        "broker binary not found at {} (set JOBBROKER_BIN)",
        bin.display()
    );
    let data = dir.join("data");
    let mut command = Command::new(&bin);
    command
        .arg("--listen")
        .arg(listen)
        .arg("--http-listen")
        .arg(http_listen)
        .arg("--data-dir")
        .arg(&data)
        .arg("--log-level")
        .arg("warn");
    if let Some(config) = config {
        let path = dir.join("config.json");
        std::fs::write(&path, config).unwrap();
        command.arg("--config").arg(path);
    }
    command.args(extra_args);
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", bin.display()));

    // Read stdout until the ready line, then keep draining both pipes so they never fill.
    let (ready_tx, ready_rx) = mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(stdout).lines();
        for line in lines.by_ref() {
            let Ok(line) = line else { break };
            if let Some(rest) = line.strip_prefix("jobbroker: serving grpc=") {
                let mut words = rest.split_whitespace();
                let addr = words.next().unwrap_or_default().to_string();
                let http = words
                    .find_map(|w| w.strip_prefix("http="))
                    .unwrap_or_default()
                    .to_string();
                let _ = ready_tx.send((addr, http));
                break;
            }
        }
        for _ in lines {}
    });
    let mut stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        let mut sink = Vec::new();
        let _ = stderr.read_to_end(&mut sink);
        if !sink.is_empty() {
            eprint!("[broker] {}", String::from_utf8_lossy(&sink));
        }
    });
    (child, ready_rx)
}

/// The addresses the broker printed once it served (gRPC, HTTP); kills it and panics if it
/// printed none in time.
fn await_serving(
    child: &mut Child,
    ready_rx: mpsc::Receiver<(String, String)>,
) -> (String, String) {
    match ready_rx.recv_timeout(GIVE_UP) {
        Ok(addr) => addr,
        Err(_) => {
            let _ = child.kill();
            let _ = child.wait();
            panic!("broker did not print its serving line");
        }
    }
}

/// The body of a plain HTTP/1.1 GET of `path` on `address`.
fn http_get(address: &str, path: &str) -> String {
    use std::io::Write;
    let mut socket = std::net::TcpStream::connect(address)
        .unwrap_or_else(|e| panic!("cannot reach {address}: {e}"));
    socket.set_read_timeout(Some(GIVE_UP)).unwrap();
    write!(
        socket,
        "GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut reader = BufReader::new(socket);
    let mut length = None;
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':')
            && name.eq_ignore_ascii_case("content-length")
        {
            length = value.trim().parse::<usize>().ok();
        }
    }
    let mut body = Vec::new();
    match length {
        Some(length) => {
            body.resize(length, 0);
            reader.read_exact(&mut body).unwrap();
        }
        None => {
            reader.read_to_end(&mut body).unwrap();
        }
    }
    String::from_utf8_lossy(&body).into_owned()
}

/// `count` distinct loopback addresses whose ports are free right now, below the kernel's
/// ephemeral range (as the C++ harnesses pick theirs, tests/testing/process_util.h), for
/// processes that must be given their port before they start. A port that binding port 0
/// handed out is released at once, so it can be handed out again (two processes of one cluster
/// were once given the same port, and a node exited "cannot listen") or become an outgoing
/// connection's local port before the process given it binds.
pub fn free_addresses(count: usize) -> Vec<String> {
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32768);
    let hi = low.min(32768) - 1;
    let lo = hi.saturating_sub(12000).max(1024);
    let random = std::collections::hash_map::RandomState::new();
    let mut picked: Vec<String> = Vec::new();
    for i in 0..100 * count {
        if picked.len() == count {
            break;
        }
        let port = lo + (random.hash_one(i) % u64::from(hi - lo + 1)) as u32;
        let address = format!("127.0.0.1:{port}");
        if !picked.contains(&address) && std::net::TcpListener::bind(&address).is_ok() {
            picked.push(address);
        }
    }
    assert_eq!(picked.len(), count, "no {count} free ports in {lo}..{hi}");
    picked
}

/// An address nothing listens on: a broker that is stopped.
pub fn stopped_address() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().to_string()
}

/// A fake node that answers every gRPC call `UNAVAILABLE` (as a draining broker or a
/// partition without a leader does) and records the method of each call it got.
pub struct UnavailableNode {
    pub addr: String,
    calls: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl UnavailableNode {
    pub async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let calls = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let recorded = calls.clone();
        tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                let recorded = recorded.clone();
                tokio::spawn(async move {
                    let Ok(mut connection) = h2::server::handshake(socket).await else {
                        return;
                    };
                    while let Some(Ok((request, mut respond))) = connection.accept().await {
                        recorded
                            .lock()
                            .unwrap()
                            .push(request.uri().path().to_string());
                        // Trailers-only: the status in the headers, no body.
                        let response = http::Response::builder()
                            .status(200)
                            .header("content-type", "application/grpc")
                            .header("grpc-status", "14")
                            .header("grpc-message", "draining")
                            .body(())
                            .unwrap();
                        let _ = respond.send_response(response, true);
                    }
                });
            }
        });
        UnavailableNode { addr, calls }
    }

    /// How many calls of `method` (e.g. "/jobbroker.v1.Broker/Enqueue") it got.
    pub fn calls_of(&self, method: &str) -> usize {
        self.calls
            .lock()
            .unwrap()
            .iter()
            .filter(|m| *m == method)
            .count()
    }
}

/// A throwaway CA, a broker certificate for 127.0.0.1 and a client certificate, made by the
/// openssl command (PEM files in a temp dir).
pub struct Certificates {
    pub dir: TempDir,
}

impl Certificates {
    pub fn make() -> Self {
        let dir = TempDir::new("certs");
        let d = &dir.0;
        let openssl = |args: &[&str]| {
            let out = Command::new("openssl")
                .args(args)
                .current_dir(d)
                .output()
                .expect("run openssl (is it installed?)");
            assert!(
                out.status.success(),
                "openssl {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"];
        openssl(
            &[
                &[
                    "req",
                    "-x509",
                    "-nodes",
                    "-days",
                    "2",
                    "-subj",
                    "/CN=jobbroker test CA",
                ][..],
                &ec,
                &["-keyout", "ca.key", "-out", "ca.pem"],
                &["-addext", "basicConstraints=critical,CA:TRUE"],
                &["-addext", "keyUsage=critical,keyCertSign,cRLSign"],
            ]
            .concat(),
        );
        for (name, usage) in [("server", "serverAuth"), ("client", "clientAuth")] {
            let ext = format!("{name}.ext");
            std::fs::write(
                d.join(&ext),
                format!(
                    "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage={usage}\n"
                ),
            )
            .unwrap();
            let (key, csr, pem) = (
                format!("{name}.key"),
                format!("{name}.csr"),
                format!("{name}.pem"),
            );
            let subject = format!("/CN=jobbroker test {name}");
            openssl(
                &[
                    &["req", "-nodes", "-subj", &subject][..],
                    &ec,
                    &["-keyout", &key, "-out", &csr],
                ]
                .concat(),
            );
            openssl(&[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-days",
                "2",
                "-extfile",
                &ext,
                "-out",
                &pem,
            ]);
        }
        Certificates { dir }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.0.join(name)
    }

    /// The broker flags for TLS with required client certificates.
    pub fn broker_args(&self) -> Vec<String> {
        let p = |n: &str| self.path(n).display().to_string();
        vec![
            "--tls-cert".into(),
            p("server.pem"),
            "--tls-key".into(),
            p("server.key"),
            "--tls-client-ca".into(),
            p("ca.pem"),
        ]
    }
}

/// A worker running in a task of this test.
pub struct Running {
    pub stop: ShutdownHandle,
    pub task: JoinHandle<Result<(), RunError>>,
}

impl Running {
    pub fn start(worker: Worker) -> Self {
        let stop = worker.shutdown_handle();
        Self {
            stop,
            task: tokio::spawn(worker.run()),
        }
    }

    /// Starts the graceful stop and waits for `run` to return.
    pub async fn stop(self) -> Result<(), RunError> {
        self.stop.shutdown();
        self.finished().await
    }

    pub async fn finished(self) -> Result<(), RunError> {
        tokio::time::timeout(GIVE_UP, self.task)
            .await
            .expect("the worker did not stop")
            .expect("the worker task panicked")
    }
}

/// What a [`FakeWorkNode`] saw, in order.
#[derive(Debug, Clone)]
pub enum Seen {
    /// A `Work` stream opened (streams are numbered from 0 in the order they opened).
    Opened(usize),
    /// A request on that stream, when it arrived.
    Request(usize, jobbroker::v1::WorkRequest, std::time::Instant),
    /// The worker ended that stream (half-closed it, or cancelled it).
    Ended(usize, std::time::Instant),
}

/// What a [`FakeWorkNode`] answers to one request: each message sent after its delay.
pub type Answers = Vec<(Duration, jobbroker::v1::work_response::Response)>;

/// The script of a [`FakeWorkNode`]: (stream number, request) -> what to send back.
pub type Script =
    std::sync::Arc<dyn Fn(usize, &jobbroker::v1::WorkRequest) -> Answers + Send + Sync>;

/// What a [`FakeWorkNode`] answers to `Admin.GetCluster`, asked each time it is called.
pub type ClusterScript = std::sync::Arc<dyn Fn() -> jobbroker::v1::ClusterInfo + Send + Sync>;

/// A stand-in broker that serves `Broker/Work` streams from a script, over plaintext HTTP/2
/// (h2 and hand-made gRPC frames): it can answer what the real broker answers only in a
/// cluster between leaders (`UNAVAILABLE` results on an open stream). It ends a stream
/// (status OK) when the worker half-closes it, and records everything in `seen`. Made with
/// [`FakeWorkNode::start_in_cluster`], it answers `Admin.GetCluster` from a script too. Any
/// other method is answered `UNIMPLEMENTED`.
pub struct FakeWorkNode {
    pub addr: String,
    pub seen: std::sync::Arc<std::sync::Mutex<Vec<Seen>>>,
}

/// A `WorkResult` answering `request_id` with `code` (0: OK).
pub fn work_result(
    request_id: u64,
    code: i32,
    message: &str,
) -> jobbroker::v1::work_response::Response {
    jobbroker::v1::work_response::Response::Result(jobbroker::v1::WorkResult {
        request_id,
        code,
        message: message.into(),
        ..Default::default()
    })
}

fn grpc_frame(message: &impl prost::Message) -> prost::bytes::Bytes {
    let body = message.encode_to_vec();
    let mut frame = Vec::with_capacity(5 + body.len());
    frame.push(0);
    frame.extend_from_slice(&u32::try_from(body.len()).unwrap().to_be_bytes());
    frame.extend_from_slice(&body);
    frame.into()
}

impl FakeWorkNode {
    pub async fn start(script: Script) -> Self {
        Self::serve(script, None).await
    }

    /// Like [`FakeWorkNode::start`], answering `Admin.GetCluster` with what `cluster` says at
    /// the time of each call.
    pub async fn start_in_cluster(script: Script, cluster: ClusterScript) -> Self {
        Self::serve(script, Some(cluster)).await
    }

    async fn serve(script: Script, cluster: Option<ClusterScript>) -> Self {
        use prost::Message;
        use std::sync::{Arc, Mutex};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::new(Mutex::new(Vec::new()));
        let streams = Arc::new(AtomicU32::new(0));
        let recorded = seen.clone();
        tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                let (seen, script, streams) = (recorded.clone(), script.clone(), streams.clone());
                let cluster = cluster.clone();
                tokio::spawn(async move {
                    let Ok(mut connection) = h2::server::handshake(socket).await else {
                        return;
                    };
                    while let Some(Ok((request, mut respond))) = connection.accept().await {
                        if let Some(cluster) = &cluster
                            && request.uri().path() == "/jobbroker.v1.Admin/GetCluster"
                        {
                            let response = http::Response::builder()
                                .status(200)
                                .header("content-type", "application/grpc")
                                .body(())
                                .unwrap();
                            let Ok(mut send) = respond.send_response(response, false) else {
                                continue;
                            };
                            let _ = send.send_data(grpc_frame(&cluster()), false);
                            let mut trailers = http::HeaderMap::new();
                            trailers.insert("grpc-status", "0".parse().unwrap());
                            let _ = send.send_trailers(trailers);
                            continue;
                        }
                        if request.uri().path() != "/jobbroker.v1.Broker/Work" {
                            let response = http::Response::builder()
                                .status(200)
                                .header("content-type", "application/grpc")
                                .header("grpc-status", "12")
                                .body(())
                                .unwrap();
                            let _ = respond.send_response(response, true);
                            continue;
                        }
                        let n = streams.fetch_add(1, Ordering::SeqCst) as usize;
                        seen.lock().unwrap().push(Seen::Opened(n));
                        let response = http::Response::builder()
                            .status(200)
                            .header("content-type", "application/grpc")
                            .body(())
                            .unwrap();
                        let Ok(send) = respond.send_response(response, false) else {
                            continue;
                        };
                        // One writer per stream, so delayed answers keep their own order.
                        let (out_tx, mut out_rx) = tokio::sync::mpsc::unbounded_channel::<
                            Option<jobbroker::v1::work_response::Response>,
                        >();
                        tokio::spawn(async move {
                            let mut send = send;
                            while let Some(message) = out_rx.recv().await {
                                match message {
                                    Some(response) => {
                                        let frame = grpc_frame(&jobbroker::v1::WorkResponse {
                                            response: Some(response),
                                        });
                                        if send.send_data(frame, false).is_err() {
                                            return;
                                        }
                                    }
                                    None => {
                                        let mut trailers = http::HeaderMap::new();
                                        trailers.insert("grpc-status", "0".parse().unwrap());
                                        let _ = send.send_trailers(trailers);
                                        return;
                                    }
                                }
                            }
                        });
                        let (seen, script) = (seen.clone(), script.clone());
                        tokio::spawn(async move {
                            let mut body = request.into_body();
                            let mut buffer: Vec<u8> = Vec::new();
                            while let Some(Ok(data)) = body.data().await {
                                let _ = body.flow_control().release_capacity(data.len());
                                buffer.extend_from_slice(&data);
                                while buffer.len() >= 5 {
                                    let len = u32::from_be_bytes(buffer[1..5].try_into().unwrap())
                                        as usize;
                                    if buffer.len() < 5 + len {
                                        break;
                                    }
                                    let message: Vec<u8> =
                                        buffer.drain(..5 + len).skip(5).collect();
                                    let request =
                                        jobbroker::v1::WorkRequest::decode(&message[..]).unwrap();
                                    seen.lock().unwrap().push(Seen::Request(
                                        n,
                                        request.clone(),
                                        std::time::Instant::now(),
                                    ));
                                    for (delay, answer) in script(n, &request) {
                                        if delay.is_zero() {
                                            let _ = out_tx.send(Some(answer));
                                        } else {
                                            let out_tx = out_tx.clone();
                                            tokio::spawn(async move {
                                                tokio::time::sleep(delay).await;
                                                let _ = out_tx.send(Some(answer));
                                            });
                                        }
                                    }
                                }
                            }
                            seen.lock()
                                .unwrap()
                                .push(Seen::Ended(n, std::time::Instant::now()));
                            let _ = out_tx.send(None);
                        });
                    }
                });
            }
        });
        FakeWorkNode { addr, seen }
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// Waits (up to GIVE_UP) until `what` holds for what the node saw.
    pub async fn wait_until(&self, what: &str, test: impl Fn(&[Seen]) -> bool) {
        let give_up = std::time::Instant::now() + GIVE_UP;
        while !test(&self.seen()) {
            assert!(
                std::time::Instant::now() < give_up,
                "the fake node never saw {what}; it saw {:#?}",
                self.seen()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Whether a call for each of `partitions` gets past "its leader does not serve it at this
/// moment": a leader named in etcd may still be starting its partition (UNAVAILABLE until it
/// serves). GetQueue of a queue there answers NOT_FOUND or the queue once it does.
async fn every_partition_serves(client: &Client, partitions: u32) -> bool {
    for partition in 0..partitions {
        let queue = (0..)
            .map(|i| format!("ready.{i}"))
            .find(|q| jobbroker::partition_of_queue(q, partitions) == partition)
            .expect("some name lands in every partition");
        if let Err(status) = client.get_queue(&queue).await
            && matches!(
                status.code(),
                jobbroker::Code::Unavailable | jobbroker::Code::DeadlineExceeded
            )
        {
            return false;
        }
    }
    true
}
