# frozen_string_literal: true

module Jobbroker
  # One Broker.Work stream, transport only: a queue of WorkRequests feeding gRPC and a reader
  # thread handing every WorkResponse to its owner (the Worker), which keeps all state that
  # must outlive a stream (held jobs, unanswered requests). When the stream ends the owner's
  # #on_session_end gets the final status once.
  #
  # Thread-safe: #push may be called from any thread, also after the stream ended (it returns
  # false then).
  class WorkSession
    attr_reader :end_code, :end_message

    # `metadata`: sent with the call (the jobbroker-client name, the token).
    # `owner` gets on_job(leased, session), on_result(result), on_lease_lost(job_id, outcome),
    # on_cancel(job_id) on the reader thread and on_session_end(session, code, message) once.
    def initialize(stub, metadata, owner)
      @stub = stub
      @metadata = metadata
      @owner = owner
      @out = Queue.new
      @ended = false
      @end_code = nil
      @end_message = nil
      @forced_end = nil
    end

    # Opens the stream with `first` (the subscribe) as its first message. Never raises: a call
    # that cannot start ends the session with UNAVAILABLE.
    def start(first)
      @out << first
      out = @out
      requests = Enumerator.new do |y|
        while (req = out.pop)
          y << req
        end
      end
      @op = @stub.work(requests, metadata: @metadata, return_op: true)
      responses = @op.execute
      @reader = Thread.new { read_loop(responses) }
    rescue StandardError => e
      @out.close
      finish(GRPC::Core::StatusCodes::UNAVAILABLE, "#{e.class}: #{e.message}")
    end

    # Queues one request; false once the stream has ended.
    def push(request)
      @out << request
      true
    rescue ClosedQueueError
      false
    end

    def ended?
      @ended
    end

    # Half-closes the stream, gives the broker `wait` seconds to end it, then cancels it.
    # `code`/`message`: the end to report instead of the one the stream will have (a
    # subscription refused while the stream stays open counts as a stream that ended with the
    # refusal's code).
    def close(wait = 2.0, code: nil, message: nil)
      if code
        @forced_end = [code, message]
        @end_code = code
        @end_message = message
      end
      @out.close
      return unless @reader

      @op.cancel unless @reader.join(wait)
      @reader.join(wait)
    end

    private

    def read_loop(responses)
      code = GRPC::Core::StatusCodes::OK
      message = "the broker ended the stream"
      responses.each { |resp| dispatch(resp) }
    rescue GRPC::BadStatus => e
      code = e.code
      message = e.details
    rescue StandardError => e
      code = GRPC::Core::StatusCodes::UNKNOWN
      message = "#{e.class}: #{e.message}"
    ensure
      @out.close
      finish(code, message)
    end

    def dispatch(resp)
      case resp.response
      when :job then @owner.on_job(resp.job, self)
      when :job_batch then resp.job_batch.jobs.each { |job| @owner.on_job(job, self) }
      when :result then @owner.on_result(resp.result)
      when :lease_lost then @owner.on_lease_lost(resp.lease_lost.job_id, resp.lease_lost.outcome)
      when :cancel_requested then @owner.on_cancel(resp.cancel_requested.job_id)
      end
    end

    def finish(code, message)
      code, message = @forced_end if @forced_end
      @end_code = code
      @end_message = message
      @ended = true
      @owner.on_session_end(self, code, message)
    end
  end
end
