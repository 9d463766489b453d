# frozen_string_literal: true

require "minitest/autorun"
require "json"
require "net/http"
require "securerandom"
require "tmpdir"
require "timeout"
require "jobbroker"

# A real jobbroker process on ephemeral ports with a fresh data directory.
class BrokerProcess
  READY = /\Ajobbroker: serving grpc=(\S+) http=(\S+)/

  # pid: the broker process (SIGSTOP/SIGCONT in keepalive_test.rb).
  attr_reader :address, :http_address, :dir, :pid

  def self.binary
    ENV.fetch("JOBBROKER_BIN") do
      File.expand_path("../../../build/server/jobbroker", __dir__)
    end
  end

  # `config`: a Hash written as the --config JSON file (proto3 JSON of ServerConfig).
  # `listen` and `dir`: to start a broker again where a killed one was (same port, same data).
  # `extra_args`: more flags (TLS, --auth-tokens).
  def initialize(config: nil, listen: "127.0.0.1:0", dir: nil, extra_args: [])
    @dir = dir || Dir.mktmpdir("jobbroker-ruby-")
    args = [self.class.binary, "--listen", listen, "--http-listen", "127.0.0.1:0",
            "--data-dir", File.join(@dir, "data"), "--log-level", "warn", *extra_args]
    if config
      path = File.join(@dir, "config.json")
      File.write(path, JSON.generate(config))
      args += ["--config", path]
    end
    out_r, out_w = IO.pipe
    @log_path = File.join(@dir, "broker.log")
    @pid = Process.spawn(*args, out: out_w, err: [@log_path, "a"])
    out_w.close
    ready = Queue.new
    # Keep draining stdout so the pipe never fills.
    @drain = Thread.new do
      out_r.each_line do |line|
        m = READY.match(line)
        ready << [m[1], m[2]] if m
      end
      ready << nil
    ensure
      out_r.close
    end
    got = Timeout.timeout(30) { ready.pop }
    raise "broker exited before it was ready:\n#{File.read(@log_path)}" unless got

    @address, @http_address = got
  end

  # Kills the broker at once (no drain), keeping its data directory for a restart.
  def kill!
    Process.kill("KILL", @pid)
    Process.wait(@pid)
    @pid = nil
    @drain.join(5)
  end

  def stop
    return unless @pid

    Process.kill("TERM", @pid)
    begin
      Timeout.timeout(20) { Process.wait(@pid) }
    rescue Timeout::Error
      Process.kill("KILL", @pid)
      Process.wait(@pid)
    end
    @pid = nil
    @drain.join(5)
    FileUtils.remove_entry(@dir)
  end
end

# Test config: fast retries and a short lease on every queue.
TEST_CONFIG = {
  "defaultPolicy" => {
    "retry" => { "maxAttempts" => 3, "initialBackoff" => "0.05s", "jitter" => "JITTER_NONE" },
    "leaseDuration" => "1s"
  }
}.freeze

# One broker shared by the whole run; stopped after the last test.
module SharedBroker
  def self.instance
    @instance ||= BrokerProcess.new(config: TEST_CONFIG).tap do |b|
      Minitest.after_run { b.stop }
    end
  end
end

module BrokerTestHelpers
  V1 = Jobbroker::V1

  def broker
    SharedBroker.instance
  end

  def client
    @client ||= Jobbroker.connect(broker.address)
  end

  def unique_queue(prefix = "rb")
    "#{prefix}-#{name.gsub(/[^A-Za-z0-9]/, '')[0, 40]}-#{SecureRandom.hex(4)}"
  end

  # Polls until the block returns truthy; fails the test after `timeout` seconds (a give-up
  # bound, not a performance assertion).
  def eventually(timeout: 30, message: "condition not met")
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + timeout
    loop do
      value = yield
      return value if value

      flunk("gave up after #{timeout}s: #{message}") if
        Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
      sleep 0.05
    end
  end

  def wait_for_state(job_id, state, timeout: 30)
    eventually(timeout: timeout, message: "job #{job_id} never reached #{state}") do
      job = client.get_job(job_id)
      job if job.state == state
    end
  end
end

# A throwaway certificate authority made with openssl: a CA, a server certificate for
# 127.0.0.1 and a client certificate, as PEM files in `dir`.
class TestCertificates
  attr_reader :dir

  def initialize(dir)
    @dir = dir
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
            "-subj", "/CN=jobbroker test CA", "-keyout", path("ca-key.pem"), "-out", path("ca.pem"))
    issue("server", "/CN=127.0.0.1", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth")
    issue("client", "/CN=ruby-test-client", "extendedKeyUsage=clientAuth")
  end

  def path(name)
    File.join(@dir, name)
  end

  private

  def issue(name, subject, extensions)
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", subject,
            "-keyout", path("#{name}-key.pem"), "-out", path("#{name}.csr"))
    File.write(path("#{name}.ext"), extensions)
    openssl("x509", "-req", "-in", path("#{name}.csr"), "-CA", path("ca.pem"),
            "-CAkey", path("ca-key.pem"), "-CAcreateserial", "-days", "2",
            "-extfile", path("#{name}.ext"), "-out", path("#{name}.pem"))
  end

  def openssl(*args)
    out = IO.popen(["openssl", *args], err: %i[child out], &:read)
    raise "openssl #{args.first} failed:\n#{out}" unless $?.success?
  end
end

module BrokerTestHelpers
  # Runs `worker` in a thread while the block runs, then stops it gracefully.
  def running(worker)
    thread = Thread.new { worker.run }
    begin
      yield worker
    ensure
      worker.stop
      thread.join(60) or flunk("worker did not stop")
    end
  end

  def quiet_logger
    Logger.new($stderr, level: :error)
  end
end

# Counts the unary calls a client makes, by method: how the tests see its retries.
class CallCounter < GRPC::ClientInterceptor
  attr_reader :calls

  def initialize
    super()
    @calls = Hash.new(0)
    @mu = Mutex.new
  end

  def request_response(method:, **)
    @mu.synchronize { @calls[method.to_s.split("/").last] += 1 }
    yield
  end
end

# An address where nothing listens (a stopped broker): a port the OS gave and took back.
def dead_address
  server = TCPServer.new("127.0.0.1", 0)
  port = server.addr[1]
  server.close
  "127.0.0.1:#{port}"
end

# `count` distinct loopback addresses whose ports are free right now, below the kernel's
# ephemeral range (as the C++ harnesses pick theirs, tests/testing/process_util.h), for processes
# that must be given their port before they start. A port that binding port 0 handed out is
# released at once, so it can be handed out again (two processes of one cluster were once given
# the same port, and a node exited "cannot listen") or become an outgoing connection's local
# port before the process given it binds.
def free_addresses(count)
  low = begin
    Integer(File.read("/proc/sys/net/ipv4/ip_local_port_range").split.first)
  rescue StandardError
    32_768 # not Linux: the default range
  end
  hi = [low, 32_768].min - 1
  lo = [1024, hi - 12_000].max
  picked = []
  (100 * count).times do
    break if picked.size == count

    address = "127.0.0.1:#{rand(lo..hi)}"
    next if picked.include?(address)

    begin
      TCPServer.new("127.0.0.1", Integer(address.split(":").last)).close
      picked << address
    rescue SystemCallError
      next # in use
    end
  end
  raise "no #{count} free ports in #{lo}..#{hi}" if picked.size < count

  picked
end

# A real cluster on loopback, as tests/lib/cluster.sh starts one: Debian's etcd and three
# jobbroker nodes (`partitions` partitions, each replicated on all three), their data and logs
# in a fresh directory. #initialize returns once every partition has a leader and all three
# nodes in sync. Stopped by PID: the nodes, then etcd.
class ClusterProcess
  NODES = 3
  # A job failed by a node's death runs again at once.
  CONFIG = {
    "defaultPolicy" => {
      "retry" => { "maxAttempts" => 5, "initialBackoff" => "0.1s", "maxBackoff" => "0.1s" }
    }
  }.freeze

  # http_addresses[n]: node n's --http-listen, where its /metrics is read.
  attr_reader :addresses, :http_addresses, :dir

  def initialize(partitions: 4)
    @dir = Dir.mktmpdir("jobbroker-ruby-cluster-")
    # All of the cluster's ports at once, so that no two are the same.
    ports = free_addresses(2 * NODES + 2)
    etcd_url = "http://#{ports[0]}"
    @etcd_pid = Process.spawn("etcd", "--data-dir", path("etcd"),
                              "--listen-client-urls", etcd_url, "--advertise-client-urls", etcd_url,
                              "--listen-peer-urls", "http://#{ports[1]}",
                              out: path("etcd.log"), err: %i[child out])
    File.write(path("config.json"), JSON.generate(CONFIG))
    @addresses = ports[2, NODES]
    @http_addresses = ports[2 + NODES, NODES]
    @node_pids = @addresses.each_with_index.map do |address, n|
      Process.spawn(BrokerProcess.binary, "--listen", address, "--http-listen", @http_addresses[n],
                    "--data-dir", path("node-#{n}"), "--partitions", partitions.to_s,
                    "--cluster-etcd", etcd_url, "--node-id", "node-#{n}",
                    "--cluster-initial-nodes", NODES.to_s, "--config", path("config.json"),
                    "--log-level", "warn", out: path("node-#{n}.log"), err: %i[child out])
    end
    wait_until_settled(partitions)
  rescue StandardError
    stop
    raise
  end

  def path(name)
    File.join(@dir, name)
  end

  # The ClusterInfo, asked of every node in turn.
  def info
    @admin ||= Jobbroker::Client.new(addresses: @addresses, deadline: 5)
    @admin.get_cluster
  end

  # The address of partition `partition`'s leader in `cluster_info`; nil while it has none.
  def self.leader_address(cluster_info, partition)
    part = cluster_info.partitions.find { |p| p.partition == partition }
    return nil if part.nil? || part.leader_node_id.empty?
    return part.leader_address unless part.leader_address.empty?

    cluster_info.nodes.find { |node| node.node_id == part.leader_node_id }&.address
  end

  # Until every partition has a leader among the nodes still running, for up to `timeout`
  # seconds; returns that ClusterInfo.
  def wait_for_live_leaders(timeout: 60)
    give_up_at = Time.now + timeout
    loop do
      current = live_leaders_info
      return current if current
      raise "not every partition had a live leader within #{timeout}s; logs in #{@dir}" if
        Time.now > give_up_at

      sleep 0.2
    end
  end

  # The value of the gauge `name` in node n's /metrics (lines like `name 1`); nil if absent.
  def metric(n, name)
    body = Net::HTTP.get(URI("http://#{@http_addresses[n]}/metrics"))
    line = body.lines.find { |l| l.start_with?("#{name} ") }
    line && Float(line.split.last)
  end

  # kill -9 of the node at `address`: a dead machine.
  def kill9(address)
    n = @addresses.index(address) or raise "no node at #{address}"
    Process.kill("KILL", @node_pids[n])
    Process.wait(@node_pids[n])
    @node_pids[n] = nil
  end

  def stop
    @admin&.close
    @node_pids&.compact&.each { |pid| Process.kill("TERM", pid) }
    @node_pids&.compact&.each do |pid|
      Timeout.timeout(30) { Process.wait(pid) }
    rescue Timeout::Error
      Process.kill("KILL", pid)
      Process.wait(pid)
    end
    @node_pids = nil
    if @etcd_pid
      Process.kill("KILL", @etcd_pid)
      Process.wait(@etcd_pid)
      @etcd_pid = nil
    end
    FileUtils.remove_entry(@dir) if @dir && !ENV["KEEP_CLUSTER_LOGS"]
  end

  private

  def wait_until_settled(partitions)
    give_up_at = Time.now + 60
    until settled?(partitions)
      if Time.now > give_up_at
        logs = Dir[path("*.log")].map { |f| "#{f}:\n#{File.read(f).lines.last(5).join}" }
        # What went wrong first, on the message's first line: CI's summary shows that line.
        raise "the cluster did not settle within 60 s: #{unsettled_reason}\n#{logs.join}"
      end
      sleep 0.2
    end
  end

  # Which process exited (reaped here, with its last line), else each partition's leader and
  # in-sync count as the nodes report them.
  def unsettled_reason
    exited = []
    if @etcd_pid && (status = Process.waitpid2(@etcd_pid, Process::WNOHANG)&.last)
      @etcd_pid = nil
      exited << exit_line("etcd", status)
    end
    @node_pids.each_with_index do |pid, n|
      next unless pid && (status = Process.waitpid2(pid, Process::WNOHANG)&.last)

      @node_pids[n] = nil
      exited << exit_line("node-#{n}", status)
    end
    return exited.join("; ") unless exited.empty?

    info.partitions.map do |p|
      leader = p.leader_node_id.empty? ? "none" : p.leader_node_id
      "partition #{p.partition}: leader #{leader}, #{p.in_sync.size} in sync"
    end.join("; ")
  rescue GRPC::BadStatus => e
    "GetCluster failed: #{e.message}"
  end

  def exit_line(name, status)
    "#{name} exited (#{status}): #{File.read(path("#{name}.log")).lines.last&.strip}"
  end

  def live_leaders_info
    current = info
    live = @addresses.each_index.select { |n| @node_pids[n] }.map { |n| @addresses[n] }
    leaders = (0...current.partition_count).map { |p| self.class.leader_address(current, p) }
    current if leaders.all? { |address| live.include?(address) }
  rescue GRPC::BadStatus
    nil
  end

  def settled?(partitions)
    current = info
    current.partitions.size == partitions &&
      current.partitions.all? { |p| !p.leader_node_id.empty? && p.in_sync.size == NODES } &&
      (0...partitions).all? { |p| serves?(p, partitions) }
  rescue GRPC::BadStatus
    false
  end

  # Whether a call for `partition` gets past "its leader does not serve it at this moment": a
  # leader named in etcd may still be starting its partition (UNAVAILABLE until it serves).
  # GetQueue of a queue there answers NOT_FOUND or the queue once it does.
  def serves?(partition, partitions)
    queue = (0..).lazy.map { |i| "ready.#{i}" }
                 .find { |q| Jobbroker::Partition.of_queue(q, partitions) == partition }
    @admin.get_queue(queue)
    true
  rescue GRPC::Unavailable, GRPC::DeadlineExceeded
    false
  rescue GRPC::BadStatus
    true
  end
end
