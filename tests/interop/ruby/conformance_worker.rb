# frozen_string_literal: true

# The Ruby conformance worker: the shortest program on Jobbroker::Worker that reaches every
# behaviour tests/interop/conformance.py checks. Its CLI, events and payload actions are
# defined in ../CONFORMANCE.md. Run it through run.sh.

require "json"
require "logger"
require "optparse"
require "set"
require "jobbroker"

# Appends one JSON object per line with one write each, so the harness can read the file
# while the worker runs and after it SIGKILLed itself.
class EventLog
  def initialize(path)
    @file = File.open(path, "a")
    @file.sync = true
    @mu = Mutex.new
  end

  def write(event, job = nil, **fields)
    record = { "event" => event }
    record.update("job" => job.job_id, "attempt" => job.attempt) if job
    record.update(fields.transform_keys(&:to_s))
    @mu.synchronize { @file.write("#{JSON.generate(record)}\n") }
  end
end

# What the payload's "action" makes the handler of one queue do.
class ConformanceHandler
  def initialize(options, events)
    @options = options
    @events = events
    @snoozed = Set.new
    @snoozed_mu = Mutex.new
  end

  def call(job, handler_queue)
    @events.write("start", job, queue: job.queue, handler: handler_queue)
    payload = job.json
    result = { "queue" => handler_queue, "echo" => payload["echo"] }
    case payload["action"]
    when "ok" then nil
    when "sleep" then until_cancelled(job) { job.sleep(payload.fetch("ms") / 1000.0) }
    when "wait_cancel" then wait_cancel(job, payload)
    when "ignore_cancel"
      # A handler stuck in a blocking call: Kernel#sleep does not look at the cancellation.
      sleep(payload.fetch("ms") / 1000.0) if before_ok?(job, payload)
    when "fail" then raise payload["message"].to_s if before_ok?(job, payload)
    when "permanent" then raise Jobbroker::PermanentError, payload["message"].to_s
    when "retry_after"
      raise Jobbroker::RetryAfter.new(payload.fetch("ms") / 1000.0, payload["message"]) if
        job.attempt == 1
    when "snooze" then snooze_first_time(job, payload)
    when "progress" then progress(job, payload)
    when "steps" then result = steps(job, payload)
    when "signup" then signup(job, payload)
    else raise Jobbroker::PermanentError, "unknown action #{payload['action'].inspect}"
    end
    @events.write("done", job)
    JSON.generate(result)
  end

  private

  def before_ok?(job, payload)
    from = payload["ok_from_attempt"]
    from.nil? || job.attempt < from
  end

  # Writes `cancelled` when the block ends by the job's cancellation, and lets it end so.
  def until_cancelled(job)
    yield
  rescue Jobbroker::Cancelled
    @events.write("cancelled", job)
    raise
  end

  # Waits for the cancellation; ends cancelled, or with "after_cancel": "return" returns
  # normally (the work was done), which the library acks.
  def wait_cancel(job, payload)
    until_cancelled(job) { job.sleep(3600) while before_ok?(job, payload) }
  rescue Jobbroker::Cancelled
    raise unless payload["after_cancel"] == "return"
  end

  def snooze_first_time(job, payload)
    first = @snoozed_mu.synchronize { @snoozed.add?(job.job_id) }
    raise Jobbroker::Snooze, payload.fetch("ms") / 1000.0 if first
  end

  def progress(job, payload)
    job.progress({ "percent" => payload["percent"] })
    until_cancelled(job) { job.sleep(0.02) until File.exist?(payload.fetch("gate")) }
  end

  def steps(job, payload)
    payload.fetch("steps").to_h do |name|
      saved = until_cancelled(job) do
        job.step(name) do
          @events.write("step", job, step: name)
          Process.kill("KILL", Process.pid) if name == @options[:die_at_step]
          { "by" => @options[:lang_name], "step" => name }
        end
      end
      [name, saved]
    end
  end

  # The sign-up example's fake email provider: one line per email in --outbox.
  def signup(job, payload)
    user = payload["user"]
    key = @options[:idempotent] ? job.idempotency_key : "#{job.job_id}/#{job.attempt}"
    File.open(@options.fetch(:outbox), File::RDWR | File::CREAT | File::APPEND) do |f|
      f.flock(File::LOCK_EX)
      sent = @options[:idempotent] && f.each_line.any? { |l| JSON.parse(l)["key"] == key }
      f.write("#{JSON.generate('user' => user, 'key' => key)}\n") unless sent
    end
    Process.kill("KILL", Process.pid) if user == @options[:die_after_user]
  end
end

options = { concurrency: 1, prefetch: 0, lease_ms: 0, grace_ms: 10_000, lang_name: "ruby" }
OptionParser.new do |o|
  o.on("--address HOST:PORT[,HOST:PORT...]") { |v| options[:address] = v }
  o.on("--queues LIST") { |v| options[:queues] = v.split(",") }
  o.on("--events FILE") { |v| options[:events] = v }
  o.on("--concurrency N", Integer) { |v| options[:concurrency] = v }
  o.on("--prefetch N", Integer) { |v| options[:prefetch] = v }
  o.on("--lease-ms N", Integer) { |v| options[:lease_ms] = v }
  o.on("--grace-ms N", Integer) { |v| options[:grace_ms] = v }
  o.on("--die-at-step NAME") { |v| options[:die_at_step] = v }
  o.on("--die-after-user USER") { |v| options[:die_after_user] = v }
  o.on("--outbox FILE") { |v| options[:outbox] = v }
  o.on("--idempotent") { options[:idempotent] = true }
  o.on("--lang-name NAME") { |v| options[:lang_name] = v }
  o.on("--ca FILE") { |v| options[:ca] = v }
  o.on("--cert FILE") { |v| options[:cert] = v }
  o.on("--key FILE") { |v| options[:key] = v }
  o.on("--token TOKEN") { |v| options[:token] = v }
end.parse!
%i[address queues events].each do |required|
  abort("conformance_worker: --#{required} is required") unless options[required]
end

events = EventLog.new(options[:events])
handler = ConformanceHandler.new(options, events)
# The TLS and token flags go to the library's client options, as a user would set them.
client_options = Jobbroker::Options.new(addresses: options[:address].split(","),
                                        tls: options[:ca],
                                        cert: options[:cert], key: options[:key],
                                        token: options[:token])
worker = Jobbroker::Worker.new(
  options: client_options, concurrency: options[:concurrency],
  prefetch: options[:prefetch], grace: options[:grace_ms] / 1000.0,
  lease_duration: options[:lease_ms].positive? ? options[:lease_ms] / 1000.0 : nil,
  logger: Logger.new($stderr, progname: "ruby-conformance", level: :info)
)
options[:queues].each do |queue|
  worker.handle(queue) { |job| handler.call(job, queue) }
end
worker.trap_signals("TERM", "INT")
events.write("ready")
begin
  worker.run
rescue StandardError => e
  warn("conformance_worker: #{e.class}: #{e.message}")
  exit 1
end
events.write("stopped")
exit 0
