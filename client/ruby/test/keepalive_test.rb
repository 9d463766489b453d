# frozen_string_literal: true

require_relative "test_helper"
require "stringio"

# Keepalive: the channels ping the broker, so a worker whose broker froze (SIGSTOP here; a
# broker that lost power or sits behind a firewall that drops packets looks the same) gives the
# connection up and reconnects instead of waiting on it forever.
class KeepaliveTest < Minitest::Test
  include BrokerTestHelpers

  ESTABLISHED = "01" # the state column of /proc/net/tcp and /proc/net/tcp6

  def test_the_default_keepalive_pings_every_10_s_with_or_without_calls
    options = Jobbroker::Options.new
    assert_equal [10, 5], [options.keepalive_time, options.keepalive_timeout]
    assert_equal({ "grpc.keepalive_time_ms" => 10_000, "grpc.keepalive_timeout_ms" => 5000,
                   "grpc.http2.ping_timeout_ms" => 5000,
                   "grpc.keepalive_permit_without_calls" => 1,
                   "grpc.http2.max_pings_without_data" => 0 }, options.keepalive_args)
    assert_equal Jobbroker::CHANNEL_ARGS.merge(options.keepalive_args), options.all_channel_args
    short = options.with(keepalive_time: 1.5, keepalive_timeout: 0.25)
    assert_equal [1500, 250, 250], short.all_channel_args.values_at(
      "grpc.keepalive_time_ms", "grpc.keepalive_timeout_ms", "grpc.http2.ping_timeout_ms"
    )
    # nil turns the pings off: gRPC's own default (no keepalive) stays.
    assert_equal Jobbroker::CHANNEL_ARGS,
                 Jobbroker::Options.new(keepalive_time: nil).all_channel_args
  end

  def test_channel_args_win_over_the_keepalive
    options = Jobbroker::Options.new(channel_args: { "grpc.keepalive_time_ms" => 60_000 })
    assert_equal 60_000, options.all_channel_args["grpc.keepalive_time_ms"]
    assert_equal 5000, options.all_channel_args["grpc.keepalive_timeout_ms"]
  end

  def test_a_bad_keepalive_is_refused_at_construction
    [[{ keepalive_time: 0 }, /keepalive_time/], [{ keepalive_time: -1 }, /keepalive_time/],
     [{ keepalive_time: Float::INFINITY }, /keepalive_time/],
     [{ keepalive_time: Float::NAN }, /keepalive_time/],
     [{ keepalive_time: "10" }, /keepalive_time/], [{ keepalive_timeout: 0 }, /keepalive_timeout/],
     [{ keepalive_timeout: nil }, /keepalive_timeout/],
     [{ keepalive_timeout: 10**7 }, /keepalive_timeout/]].each do |option, message|
      error = assert_raises(ArgumentError, option.inspect) { Jobbroker::Options.new(**option) }
      assert_match message, error.message
      assert_raises(ArgumentError, option.inspect) { Jobbroker::Options.new.with(**option) }
    end
  end

  # SIGSTOP: the broker's port still accepts and acknowledges TCP, but nothing answers. With
  # keepalive the worker's stream ends and its connection is closed within a few seconds;
  # without it both would stay open for as long as the broker stays stopped.
  def test_a_worker_gives_up_a_frozen_broker_and_comes_back_on_its_own
    frozen = BrokerProcess.new(config: TEST_CONFIG)
    broker_port = Integer(frozen.address.split(":").last)
    queue = unique_queue
    log = StringIO.new
    options = Jobbroker::Options.new(address: frozen.address, keepalive_time: 1,
                                     keepalive_timeout: 1)
    # 2 s leases: should the job after the thaw go to a connection the worker tried while the
    # broker was frozen, and closed just as the broker answered it, it comes back in seconds.
    worker = Jobbroker::Worker.new(options: options, worker_id: "ruby-keepalive-worker",
                                   lease_duration: 2,
                                   reconnect_initial: 0.05, reconnect_max: 0.5,
                                   logger: Logger.new(log, level: :warn))
    ran = Queue.new
    worker.handle(queue) { |job| ran << job.text }
    producer = Jobbroker::Client.new(frozen.address, deadline: 30)
    stopped = false
    running(worker) do
      begin
        run_job(producer, queue, "before")
        listed = producer.list_workers(queue: queue).find do |w|
          w.worker_id == "ruby-keepalive-worker"
        end
        producer.close # its channel would ping the stopped broker too
        # The worker's end of its connection: "ipv4:127.0.0.1:PORT".
        worker_port = Integer(listed.peer.split(":").last)
        assert established?(worker_port, broker_port), "the worker's connection is open"
        reconnects = worker.stats.reconnects

        Process.kill("STOP", frozen.pid)
        stopped = true
        eventually(timeout: 30, message: "the worker never gave up the frozen broker") do
          worker.stats.reconnects > reconnects && !established?(worker_port, broker_port)
        end
        assert_match(/stream to #{Regexp.escape(frozen.address)} ended \(code 14/, log.string)
      ensure
        Process.kill("CONT", frozen.pid) if stopped
        stopped = false
      end
      # The same worker, not restarted, takes the next job.
      job = run_job(producer, queue, "after")
      assert_equal "ruby-keepalive-worker", job.attempts.last.worker_id
    end
    assert_equal %w[before after], Array.new(ran.size) { ran.pop }
  ensure
    Process.kill("CONT", frozen.pid) if stopped
    producer&.close
    frozen&.stop
  end

  private

  # Enqueues `payload` on `queue` and waits until it completed; the job.
  def run_job(producer, queue, payload)
    id = producer.enqueue(queue, payload).job_id
    eventually(message: "job #{payload} never completed") do
      job = producer.get_job(id)
      job if job.state == :JOB_STATE_COMPLETED
    end
  end

  # Whether a TCP connection from `local_port` to `remote_port` is ESTABLISHED. gRPC may open
  # an IPv6 socket for 127.0.0.1 (as ::ffff:127.0.0.1): /proc/net/tcp6 lists those.
  def established?(local_port, remote_port)
    %w[/proc/net/tcp /proc/net/tcp6].any? do |table|
      File.readlines(table).drop(1).any? do |line|
        _, local, remote, state = line.split
        local.split(":").last.to_i(16) == local_port &&
          remote.split(":").last.to_i(16) == remote_port && state == ESTABLISHED
      end
    end
  end
end
