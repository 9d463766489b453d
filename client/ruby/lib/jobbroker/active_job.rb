# frozen_string_literal: true

require "json"
require "jobbroker"
require "active_job"
require "active_job/queue_adapters/jobbroker_adapter"

module Jobbroker
  # Runs ActiveJob jobs from jobbroker queues: one Jobbroker::Worker whose handler of every
  # queue given calls ActiveJob::Base.execute with the job's serialized data (the payload the
  # :jobbroker adapter sent). `jobbroker-activejob` is this class from the command line.
  #
  #   worker = Jobbroker::ActiveJobWorker.new(queues: %w[default mailers], concurrency: 5)
  #   worker.trap_signals
  #   worker.run
  #
  # The connection: `options:` if given, else the options of the adapter's client
  # (ActiveJob::Base.queue_adapter when it is a JobbrokerAdapter, else
  # JobbrokerAdapter.client), so producer and worker are configured once.
  # Other keywords are Jobbroker::Worker's (concurrency:, prefetch:, grace:, worker_id:,
  # logger:, ...). A job's perform that raises fails the attempt (the broker retries it by the
  # queue's policy); its return value is not kept as the job's result.
  class ActiveJobWorker
    attr_reader :worker, :queues

    def initialize(queues: ["default"], options: nil, **worker_options)
      @queues = Array(queues).map(&:to_s)
      raise ArgumentError, "ActiveJobWorker needs at least one queue" if @queues.empty?

      @worker = Jobbroker::Worker.new(options: options || self.class.adapter_options,
                                      **worker_options)
      @queues.each { |queue| @worker.handle(queue) { |job| self.class.perform(job) } }
    end

    # Runs one leased job as ActiveJob: deserializes and performs it, nil as the result.
    def self.perform(job)
      data = JSON.parse(job.payload)
      raise Jobbroker::PermanentError, "not an ActiveJob payload (no job_class)" unless
        data.is_a?(Hash) && data["job_class"]

      data["provider_job_id"] ||= job.job_id
      ::ActiveJob::Base.execute(data)
      nil
    end

    # The options of the client the :jobbroker adapter enqueues with.
    def self.adapter_options
      adapter = ::ActiveJob::Base.queue_adapter
      client = adapter.is_a?(::ActiveJob::QueueAdapters::JobbrokerAdapter) ? adapter.client : nil
      (client || ::ActiveJob::QueueAdapters::JobbrokerAdapter.client).options
    end

    def use(middleware = nil, &block)
      @worker.use(middleware, &block)
      self
    end

    def trap_signals(*signals)
      @worker.trap_signals(*signals)
      self
    end

    def run
      @worker.run
    end

    def stop
      @worker.stop
    end

    def stats
      @worker.stats
    end
  end
end
