# frozen_string_literal: true

require "minitest/autorun"
require "json"
require "securerandom"
require "tmpdir"
require "timeout"
require "jobbroker"

# A real jobbroker process on ephemeral ports with a fresh data directory.
class BrokerProcess
  READY = /\Ajobbroker: serving grpc=(\S+) http=(\S+)/

  attr_reader :address, :http_address, :dir

  def self.binary
    ENV.fetch("JOBBROKER_BIN") do
      File.expand_path("../../../build/server/jobbroker", __dir__)
    end
  end

  # `config`: a Hash written as the --config JSON file (proto3 JSON of ServerConfig).
  # `listen` and `dir`: to start a broker again where a killed one was (same port, same data).
  def initialize(config: nil, listen: "127.0.0.1:0", dir: nil)
    @dir = dir || Dir.mktmpdir("jobbroker-ruby-")
    args = [self.class.binary, "--listen", listen, "--http-listen", "127.0.0.1:0",
            "--data-dir", File.join(@dir, "data"), "--log-level", "warn"]
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
