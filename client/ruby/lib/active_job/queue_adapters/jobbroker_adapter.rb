# frozen_string_literal: true

require "active_job"
require "jobbroker"

module ActiveJob
  module QueueAdapters
    # The ActiveJob adapter of jobbroker:
    #
    #   # config/application.rb (the jobbroker gem in the Gemfile)
    #   config.active_job.queue_adapter = :jobbroker
    #
    #   # config/initializers/jobbroker.rb: how to reach the broker (default: a Client on
    #   # $JOBBROKER_ADDRESS and $JOBBROKER_TOKEN, plaintext)
    #   ActiveJob::QueueAdapters::JobbrokerAdapter.client = Jobbroker::Client.new(
    #     options: Jobbroker::Options.new(address: "broker:7070", tls: "/etc/jobbroker/ca.pem",
    #                                     token: ENV["JOBBROKER_TOKEN"]))
    #
    # Each job is one broker job on the queue named by the job's queue_name (queue_as, set(queue:),
    # with the app's queue_name_prefix): its payload is the job's serialize Hash as JSON, its
    # priority the job's priority (jobbroker runs higher numbers first), and set(wait:) /
    # set(wait_until:) become the job's run_at. The broker's job id is the job's provider_job_id.
    # The dedup key "activejob:<job_id>:<executions>" makes the enqueue safe to retry after
    # UNAVAILABLE and makes a retry_job that a retried attempt repeats enqueue one job, not two.
    #
    # The jobs run in `jobbroker-activejob -q QUEUE` (or Jobbroker::ActiveJobWorker), which calls
    # ActiveJob::Base.execute. A job whose perform raises fails the broker attempt: the broker
    # retries it by the queue's policy (its max_attempts and backoff), unless ActiveJob's
    # retry_on / discard_on handled the exception first (retry_on enqueues a new job, and the
    # attempt that raised is then completed).
    class JobbrokerAdapter
      @mu = Mutex.new
      @client = nil

      class << self
        # The Client adapters made by `queue_adapter = :jobbroker` use (and the worker's
        # options, see ActiveJobWorker): Jobbroker::Client.new until set.
        def client
          @mu.synchronize { @client ||= Jobbroker::Client.new }
        end

        def client=(client)
          @mu.synchronize { @client = client }
        end
      end

      # client:            a Jobbroker::Client; default JobbrokerAdapter.client.
      # enqueue_options:   more Client#enqueue options for every job (max_attempts:, timeout:,
      #                    lease_duration:, headers:, ...).
      def initialize(client: nil, **enqueue_options)
        @client = client
        @enqueue_options = enqueue_options
      end

      def client
        @client || self.class.client
      end

      def enqueue(job)
        submit(job, nil)
      end

      # `timestamp`: seconds since the epoch (a Float), when the job may run.
      def enqueue_at(job, timestamp)
        submit(job, Time.at(timestamp))
      end

      private

      def submit(job, run_at)
        options = @enqueue_options.dup
        headers = (options.delete(:headers) || {}).merge("content-type" => "application/json",
                                                         "activejob-class" => job.class.name)
        options[:priority] = job.priority.to_i if job.priority
        options[:run_at] = run_at if run_at
        options[:dedup_key] ||= "activejob:#{job.job_id}:#{job.executions.to_i}"
        begin
          response = client.enqueue(job.queue_name, job.serialize, headers: headers, **options)
          job.provider_job_id = response.job_id
        rescue GRPC::AlreadyExists
          # Only this adapter makes these keys: the same enqueue happened before (a retried
          # attempt repeating its retry_job), with a payload that differs by its enqueued_at.
          nil
        end
        job
      end
    end
  end
end
