# frozen_string_literal: true

require_relative "test_helper"
require "socket"

# Jobbroker::Options as the Client and the Worker use them: TLS, mutual TLS and tokens against
# a broker that demands them, the retry rule, several addresses, the environment, and a
# client created before a fork.
class ClientOptionsTest < Minitest::Test
  include BrokerTestHelpers

  TOKEN = "ruby-test-token-#{SecureRandom.hex(8)}".freeze

  # One broker with TLS, required client certificates and tokens for the whole class.
  def self.secure_broker
    @secure_broker ||= begin
      dir = Dir.mktmpdir("jobbroker-ruby-tls-")
      certs = TestCertificates.new(dir)
      tokens = File.join(dir, "tokens.json")
      File.write(tokens, JSON.generate("tokens" => [
                                         { "name" => "ruby-test", "token" => TOKEN,
                                           "roles" => %w[producer worker admin], "queues" => ["*"] }
                                       ]))
      broker = BrokerProcess.new(extra_args: [
                                   "--tls-cert", certs.path("server.pem"),
                                   "--tls-key", certs.path("server-key.pem"),
                                   "--tls-client-ca", certs.path("ca.pem"),
                                   "--auth-tokens", tokens
                                 ])
      Minitest.after_run do
        broker.stop
        FileUtils.remove_entry(dir)
      end
      [broker, certs]
    end
  end

  def secure_options(**changes)
    broker, certs = self.class.secure_broker
    Jobbroker::Options.new(address: broker.address, tls: certs.path("ca.pem"),
                           cert: certs.path("client.pem"), key: certs.path("client-key.pem"),
                           token: TOKEN, **changes)
  end

  def test_mutual_tls_and_token_reach_a_broker_that_demands_both
    client = Jobbroker::Client.new(options: secure_options)
    queue = unique_queue
    worker = Jobbroker::Worker.new(options: secure_options, worker_id: "ruby-tls-worker",
                                   logger: quiet_logger)
    worker.handle(queue) { |job| "done #{job.text}" }
    running(worker) do
      job = client.enqueue_and_wait(queue, "over tls", wait_timeout: 30)
      assert_equal "done over tls", job.result
      listed = client.list_workers(queue: queue).find { |w| w.worker_id == "ruby-tls-worker" }
      refute_nil listed, "ListWorkers shows the worker"
      assert_equal Jobbroker.client_name, listed.client
    end
  ensure
    client&.close
  end

  def test_the_ca_may_be_given_as_pem_text
    _, certs = self.class.secure_broker
    client = Jobbroker::Client.new(options: secure_options(tls: File.read(certs.path("ca.pem")),
                                                           cert: File.read(certs.path("client.pem")),
                                                           key: File.read(certs.path("client-key.pem"))))
    assert_kind_of Array, client.list_queues
  ensure
    client&.close
  end

  def test_a_wrong_token_is_unauthenticated_and_not_retried
    counter = CallCounter.new
    client = Jobbroker::Client.new(options: secure_options(token: "wrong",
                                                           interceptors: [counter]))
    assert_raises(GRPC::Unauthenticated) { client.get_job("01HZZZZZZZZZZZZZZZZZZZZZZZ") }
    assert_equal 1, counter.calls["GetJob"]
  ensure
    client&.close
  end

  def test_a_worker_with_a_wrong_token_ends_its_run_with_unauthenticated
    worker = Jobbroker::Worker.new(options: secure_options(token: "wrong"), logger: quiet_logger)
    ran = false
    worker.handle(unique_queue) { ran = true }
    err = assert_raises(Jobbroker::SubscriptionRefused) { worker.run }
    assert_equal GRPC::Core::StatusCodes::UNAUTHENTICATED, err.code
    refute ran
  end

  def test_without_a_client_certificate_the_broker_refuses_the_connection
    client = Jobbroker::Client.new(options: secure_options(cert: nil, key: nil, deadline: 5))
    assert_raises(GRPC::Unavailable) { client.list_queues }
  ensure
    client&.close
  end

  # The retry rule: a call is repeated after UNAVAILABLE only when a repeat cannot enqueue
  # a second copy of a job.
  def test_an_enqueue_without_a_dedup_key_is_attempted_once
    counter = CallCounter.new
    client = Jobbroker::Client.new(address: dead_address, interceptors: [counter])
    assert_raises(GRPC::Unavailable) { client.enqueue("emails", "x") }
    assert_equal 1, counter.calls["Enqueue"]
    assert_raises(GRPC::Unavailable) do
      client.enqueue_batch([{ queue: "emails", payload: "a", dedup_key: "a" },
                            { queue: "emails", payload: "b" }])
    end
    assert_equal 1, counter.calls["EnqueueBatch"]
  ensure
    client&.close
  end

  def test_enqueues_with_dedup_keys_reads_and_acks_are_retried
    counter = CallCounter.new
    client = Jobbroker::Client.new(address: dead_address, interceptors: [counter])
    assert_raises(GRPC::Unavailable) { client.enqueue("emails", "x", dedup_key: "welcome:1") }
    assert_raises(GRPC::Unavailable) do
      client.enqueue_batch([{ queue: "emails", payload: "a", dedup_key: "a" }])
    end
    assert_raises(GRPC::Unavailable) { client.get_job("01HZZZZZZZZZZZZZZZZZZZZZZZ") }
    assert_raises(GRPC::Unavailable) { client.ack("job", "lease") }
    assert_raises(GRPC::Unavailable) { client.cancel_job("job") }
    assert_equal({ "Enqueue" => 3, "EnqueueBatch" => 3, "GetJob" => 3, "Ack" => 3,
                   "CancelJob" => 1 }, counter.calls)
  ensure
    client&.close
  end

  def test_after_unavailable_calls_go_to_the_next_address
    client = Jobbroker::Client.new(addresses: [dead_address, broker.address])
    id = client.enqueue(unique_queue, "x", dedup_key: "first-node-down").job_id
    assert_equal broker.address, client.address
    assert_equal :JOB_STATE_READY, client.get_job(id).state
  ensure
    client&.close
  end

  def test_a_worker_reconnects_to_the_next_address
    queue = unique_queue
    id = client.enqueue(queue, "x").job_id
    worker = Jobbroker::Worker.new(**addresses_options_for(dead_address, broker.address),
                                   logger: quiet_logger)
    worker.handle(queue) { "ok" }
    running(worker) { wait_for_state(id, :JOB_STATE_COMPLETED) }
  end

  def addresses_options_for(*addresses)
    { options: Jobbroker::Options.new(addresses: addresses), reconnect_initial: 0.01 }
  end

  def test_address_and_token_come_from_the_environment_when_unset
    with_env("JOBBROKER_ADDRESS" => "10.0.0.1:7070,10.0.0.2:7070", "JOBBROKER_TOKEN" => "t0k") do
      options = Jobbroker::Options.new
      assert_equal %w[10.0.0.1:7070 10.0.0.2:7070], options.addresses
      assert_equal "t0k", options.token
      assert_equal "Bearer t0k", options.metadata["authorization"]
      assert_equal "explicit", Jobbroker::Options.new(token: "explicit").token
    end
    with_env("JOBBROKER_ADDRESS" => nil, "JOBBROKER_TOKEN" => nil) do
      options = Jobbroker::Options.new
      assert_equal ["127.0.0.1:7070"], options.addresses
      assert_nil options.token
      assert_equal({ "jobbroker-client" => Jobbroker.client_name }, options.metadata)
      assert_equal 10, options.deadline
    end
  end

  def test_a_call_past_its_own_deadline_is_deadline_exceeded
    queue = unique_queue
    assert_raises(GRPC::DeadlineExceeded) do
      client.lease(queue, worker_id: "ruby-deadline", wait: 5, deadline: 0.2)
    end
  end

  def test_bad_combinations_are_refused_at_construction
    assert_raises(ArgumentError) { Jobbroker::Options.new(cert: "c.pem") }
    assert_raises(ArgumentError) { Jobbroker::Options.new(tls: true, cert: "c.pem") }
    assert_raises(ArgumentError) { Jobbroker::Options.new(address: "a:1", addresses: ["b:1"]) }
  end

  # A client created before a fork (Puma's preload_app) connects anew in the child. Run in a
  # fresh process: this one has used gRPC, and grpc 1.51 refuses any call in a child then.
  def test_a_client_created_before_fork_works_in_the_child
    queue = unique_queue
    script = <<~RUBY
      require "jobbroker"
      client = Jobbroker::Client.new(address: ARGV[0])
      child = fork { puts client.enqueue(ARGV[1], "from the child").job_id; $stdout.flush; exit!(0) }
      Process.wait(child)
      exit($?.exitstatus)
    RUBY
    lib = File.expand_path("../lib", __dir__)
    out = IO.popen(["ruby", "-I", lib, "-e", script, broker.address, queue], &:read)
    assert $?.success?, "the child's enqueue failed: #{out}"
    assert_equal "from the child", client.get_job(out.strip).payload
  end

  # grpc before 1.57 refuses every call in a child once the parent used gRPC; the client says
  # what to do instead of failing with gRPC's one line.
  def test_a_child_of_a_parent_that_used_grpc_gets_a_fork_error_that_says_what_to_do
    skip "this gRPC supports fork" if GRPC.respond_to?(:postfork_child)
    script = <<~RUBY
      require "jobbroker"
      client = Jobbroker::Client.new(address: ARGV[0])
      client.list_queues
      child = fork do
        client.list_queues
      rescue Jobbroker::ForkError => e
        puts e.message
      ensure
        $stdout.flush
        exit!(0)
      end
      Process.wait(child)
    RUBY
    lib = File.expand_path("../lib", __dir__)
    out = IO.popen(["ruby", "-I", lib, "-e", script, broker.address], &:read)
    assert_match(/on_worker_boot/, out)
  end

  def with_env(vars)
    saved = vars.keys.to_h { |k| [k, ENV.fetch(k, nil)] }
    vars.each { |k, v| v.nil? ? ENV.delete(k) : ENV.store(k, v) }
    yield
  ensure
    saved.each { |k, v| v.nil? ? ENV.delete(k) : ENV.store(k, v) }
  end
end
