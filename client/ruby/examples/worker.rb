#!/usr/bin/env ruby
# frozen_string_literal: true

# An email worker on the Work stream. Each job's payload is JSON like
#   {"to": "a@example.com", "work_seconds": 0.2, "fail_attempts": 1, "permanent": false}
# work_seconds simulates a slow provider; fail_attempts makes the first N attempts raise (the
# broker retries them after the queue's backoff); permanent makes it fail with no retry.
#
#   gem install jobbroker    # or from the source tree: ruby -I lib examples/worker.rb ...
#   JOBBROKER_ADDRESS=127.0.0.1:7070 ruby examples/worker.rb [queue] [concurrency] [prefetch]
#
# The connection comes from the environment: $JOBBROKER_ADDRESS (comma-separated for a
# cluster), $JOBBROKER_TOKEN (a bearer token) and, for TLS, $JOBBROKER_CA (the CA's PEM file).
#
# SIGTERM or SIGINT stops it gracefully: no new jobs, unstarted ones released, running ones
# finished and acked, exit 0.

require "jobbroker"

queue = ARGV.fetch(0, "emails")
concurrency = Integer(ARGV.fetch(1, "2"))
prefetch = Integer(ARGV.fetch(2, "0"))
$stdout.sync = true

ca = ENV.fetch("JOBBROKER_CA", "")
options = Jobbroker::Options.new(tls: ca.empty? ? nil : ca) # address and token: from the env
worker = Jobbroker::Worker.new(options: options, concurrency: concurrency, prefetch: prefetch,
                               grace: Float(ENV.fetch("WORKER_GRACE", "30")))
worker.handle(queue) do |job|
  email = job.json
  puts "working on #{job.job_id} attempt=#{job.attempt}"
  if job.attempt <= email.fetch("fail_attempts", 0)
    raise "provider timeout (attempt #{job.attempt} of #{job.max_attempts})"
  end
  raise Jobbroker::PermanentError, "bad address #{email['to']}" if email["permanent"]

  job.sleep(email.fetch("work_seconds", 0)) # raises Jobbroker::Cancelled if cancelled meanwhile
  puts "sent #{job.job_id} to #{email['to']} key=#{job.idempotency_key} attempt=#{job.attempt}"
  "sent" # kept as the job's result
end

worker.trap_signals("TERM", "INT")
begin
  worker.run
rescue Jobbroker::SubscriptionRefused => e
  warn e.message
  exit 2
end
puts "worker stopped: #{worker.stats.to_h}"
exit 0
