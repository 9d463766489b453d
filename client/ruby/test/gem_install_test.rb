# frozen_string_literal: true

require_relative "test_helper"
require "open3"
require "rubygems/package"

# The built gem as a user gets it ($JOBBROKER_GEM: test.sh builds it, this test does not):
# its contents and metadata, then `gem install --local` into a fresh, empty GEM_HOME, and
# examples/worker.rb copied out of the source tree and run from that install against a broker
# with TLS and a token. Nothing of client/ruby is on that run's load path.
class GemInstallTest < Minitest::Test
  include BrokerTestHelpers

  SOURCE = File.expand_path("..", __dir__)
  REPO = File.expand_path("../..", SOURCE)
  TOKEN = "ruby-install-token-#{SecureRandom.hex(8)}".freeze

  def setup
    @gem = ENV.fetch("JOBBROKER_GEM", "")
    skip "JOBBROKER_GEM is not set: client/ruby/test.sh builds the gem and sets it" if @gem.empty?
    @tmp = Dir.mktmpdir("jobbroker-gem-install-")
  end

  def teardown
    if @pid
      Process.kill("KILL", @pid)
      Process.wait(@pid)
    end
    @broker&.stop
    FileUtils.remove_entry(@tmp) if @tmp
  end

  def version
    File.read(File.join(REPO, "VERSION")).strip
  end

  def test_the_gem_holds_the_generated_code_the_license_and_the_one_version
    spec = Gem::Package.new(@gem).spec
    assert_equal "jobbroker", spec.name
    assert_equal version, spec.version.to_s, "gem version = the repository's VERSION"
    assert_equal ["Apache-2.0"], spec.licenses
    generated = Dir.glob("lib/jobbroker/v1/*_pb.rb", base: SOURCE).sort
    assert_equal 7, generated.size
    (generated + %w[LICENSE lib/jobbroker/VERSION lib/jobbroker.rb exe/jobbroker-activejob
                    lib/jobbroker/testing.rb lib/active_job/queue_adapters/jobbroker_adapter.rb])
      .each { |f| assert_includes spec.files, f }
    assert_empty spec.files.grep(%r{\A(test|examples|tmp)/}), "no tests or examples in the gem"

    unpacked = File.join(@tmp, "unpacked")
    Gem::Package.new(@gem).extract_files(unpacked)
    assert_equal File.read(File.join(REPO, "LICENSE")), File.read(File.join(unpacked, "LICENSE"))
    assert_equal version, File.read(File.join(unpacked, "lib/jobbroker/VERSION")).strip
  end

  def test_the_installed_gems_example_worker_completes_a_job_over_tls_with_a_token
    gem_home, app, env = install_gem_with_example

    # Where `require "jobbroker"` comes from in that environment: the fresh GEM_HOME only.
    probe = run!(env, RbConfig.ruby, "-e", <<~RUBY, chdir: app)
      require "jobbroker"
      puts Gem.loaded_specs.fetch("jobbroker").full_gem_path
      puts $LOADED_FEATURES.grep(%r{/jobbroker\\.rb\\z})
      puts Jobbroker.client_name
      puts $LOAD_PATH
    RUBY
    gem_path, feature, client_name, *load_path = probe.lines.map(&:chomp)
    assert gem_path.start_with?(gem_home), gem_path
    assert feature.start_with?(gem_home), feature
    assert_equal "jobbroker-ruby/#{version}", client_name
    assert_empty load_path.select { |p| p.start_with?(SOURCE) }, "client/ruby on the load path"

    certs = TestCertificates.new(@tmp)
    tokens = File.join(@tmp, "tokens.json")
    File.write(tokens, JSON.generate("tokens" => [
                                       { "name" => "install-test", "token" => TOKEN,
                                         "roles" => %w[producer worker admin], "queues" => ["*"] }
                                     ]))
    @broker = BrokerProcess.new(config: TEST_CONFIG, extra_args: [
                                  "--tls-cert", certs.path("server.pem"),
                                  "--tls-key", certs.path("server-key.pem"), "--auth-tokens", tokens
                                ])
    secure = Jobbroker::Client.new(options: Jobbroker::Options.new(
      address: @broker.address, tls: certs.path("ca.pem"), token: TOKEN
    ))
    queue = unique_queue("install")
    id = secure.enqueue(queue, { "to" => "installed@example.com" }).job_id

    log = File.join(@tmp, "worker.log")
    worker_env = env.merge("JOBBROKER_ADDRESS" => @broker.address, "JOBBROKER_TOKEN" => TOKEN,
                           "JOBBROKER_CA" => certs.path("ca.pem"))
    @pid = Process.spawn(worker_env, RbConfig.ruby, "worker.rb", queue, "1",
                         chdir: app, out: [log, "w"], err: %i[child out])
    job = eventually(timeout: 60, message: "the example completes the job") do
      j = secure.get_job(id)
      j if j.state == :JOB_STATE_COMPLETED
    end
    assert_equal "sent", job.result
    listed = secure.list_workers(queue: queue)
    assert_equal ["jobbroker-ruby/#{version}"], listed.map(&:client).uniq

    Process.kill("TERM", @pid)
    _, status = Timeout.timeout(60) { Process.wait2(@pid) }
    @pid = nil
    output = File.read(log)
    assert status.success?, "the example exited #{status.inspect}:\n#{output}"
    assert_includes output, "sent #{id} to installed@example.com"
  ensure
    secure&.close
  end

  # The same example from the same install, given a 3-node cluster's addresses in
  # $JOBBROKER_ADDRESS: tests/lib/cluster_example.sh enqueues 30 emails, kill -9s the leader of
  # the queue's partition once the first is done, enqueues 20 more, and passes when all 50
  # completed and the worker stopped cleanly on SIGTERM.
  def test_the_installed_gems_example_worker_through_a_leader_kill_in_a_cluster
    _, app, env = install_gem_with_example
    broker = ENV.fetch("JOBBROKER_BIN", File.join(REPO, "build", "server", "jobbroker"))
    out, status = Open3.capture2e(
      env, File.join(REPO, "tests", "lib", "cluster_example.sh"), broker, File.join(@tmp, "run"),
      "emails", '{"to": "c{n}@example.com"}', "--", RbConfig.ruby, "worker.rb", "emails", "4",
      chdir: app
    )
    assert status.success?, out
    assert_includes out, "all 50 jobs completed"
  end

  private

  # `gem install --local` of the built gem into a fresh, empty GEM_HOME, and examples/worker.rb
  # copied into an app folder: [gem_home, app, the environment that sees only that install].
  def install_gem_with_example
    gem_home = File.join(@tmp, "gem_home")
    app = File.join(@tmp, "app")
    FileUtils.mkdir_p([gem_home, app])
    assert_empty Dir.children(gem_home)
    env = install_env(gem_home)
    out = run!(env, "gem", "install", "--local", "--no-document", File.expand_path(@gem), chdir: app)
    assert_match(/Successfully installed jobbroker-#{Regexp.escape(version)}/, out)
    FileUtils.cp(File.join(SOURCE, "examples", "worker.rb"), app)
    [gem_home, app, env]
  end

  # A fresh GEM_HOME in front of the system's packaged gems (grpc and google-protobuf from
  # Debian), without the user's and the site's gem directories; no RUBYLIB, RUBYOPT or Bundler.
  def install_env(gem_home)
    packaged = Gem.default_path - [Gem.user_dir, Gem.default_dir]
    packaged.reject! { |p| p.start_with?("/usr/local") }
    packaged.each do |p|
      found = Dir.glob(File.join(p, "specifications", "jobbroker-*"))
      flunk("a jobbroker gem is installed in #{p}: #{found}") unless found.empty?
    end
    { "GEM_HOME" => gem_home, "GEM_PATH" => [gem_home, *packaged].join(File::PATH_SEPARATOR),
      "RUBYLIB" => nil, "RUBYOPT" => nil, "BUNDLE_GEMFILE" => nil, "BUNDLE_BIN_PATH" => nil }
  end

  def run!(env, *cmd, chdir:)
    out = IO.popen(env, cmd, chdir: chdir, err: %i[child out], &:read)
    assert $?.success?, "#{cmd.first(3).join(' ')} failed:\n#{out}"
    out
  end
end
