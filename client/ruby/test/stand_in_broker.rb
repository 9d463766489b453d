# frozen_string_literal: true

require_relative "test_helper"

# A stand-in Broker service (Work only) on an ephemeral port, for answers the real broker gives
# only at moments a test cannot bring about on demand (a cluster handing a partition over to a
# new leader): these tests script the broker's side.
#
# Each Work stream is given to the test's block, on a thread of its own, as a StandInStream:
# #recv is the next request (nil once the worker half-closed or cancelled the stream), #push
# and #answer send. When the block returns the stream stays open until the worker ends it
# (as the broker does with a refused subscription), unless the block called #finish.
#
# With `cluster:` (a callable returning a V1::ClusterInfo) it also serves Admin.GetCluster,
# answering each call with what the callable returns then: a stand-in cluster whose layout the
# test changes (a partition without a leader, then with one).
class StandInBroker
  attr_reader :address

  def initialize(cluster: nil, &script)
    @script = script
    @cluster = cluster
    @mu = Mutex.new
    @streams = []
    @requests = []
    @get_cluster_calls = 0
    @server = GRPC::RpcServer.new(pool_size: 8)
    port = @server.add_http2_port("127.0.0.1:0", :this_port_is_insecure)
    @address = "127.0.0.1:#{port}"
    broker = self
    service = Class.new(Jobbroker::V1::Broker::Service) do
      define_method(:work) { |requests| broker.open_stream(requests) }
    end
    @server.handle(service.new)
    if cluster
      admin = Class.new(Jobbroker::V1::Admin::Service) do
        define_method(:get_cluster) { |_request, _call| broker.get_cluster }
      end
      @server.handle(admin.new)
    end
    @thread = Thread.new { @server.run_till_terminated }
    @server.wait_till_running(10) or raise "the stand-in broker did not start"
  end

  # Every request received, as [stream index, WorkRequest], in arrival order.
  def requests
    @mu.synchronize { @requests.dup }
  end

  def stream_count
    @mu.synchronize { @streams.size }
  end

  # The StandInStream of the `index`-th Work stream (from 0).
  def stream(index)
    @mu.synchronize { @streams[index] }
  end

  # How many Admin.GetCluster calls were answered.
  def get_cluster_calls
    @mu.synchronize { @get_cluster_calls }
  end

  # Called by gRPC for each Admin.GetCluster (only with `cluster:`).
  def get_cluster
    @mu.synchronize { @get_cluster_calls += 1 }
    @cluster.call
  end

  def stop
    @mu.synchronize { @streams.each(&:finish) }
    @server.stop
    @thread.join(10)
  end

  # Called by gRPC for each Work stream: the responses the stream sends, as an Enumerator.
  def open_stream(requests)
    stream = @mu.synchronize do
      s = StandInStream.new(@streams.size, self)
      @streams << s
      s
    end
    reader = Thread.new do
      requests.each do |request|
        @mu.synchronize { @requests << [stream.index, request] }
        stream.inbox << request
      end
    rescue StandardError
      nil # the worker cancelled the stream
    ensure
      stream.requests_ended!
      stream.inbox << nil
    end
    Thread.new do
      @script.call(stream)
    ensure
      # Open until the worker ends it (or #finish was called).
      reader.join
      stream.finish
    end
    stream.responses
  end

  class StandInStream
    attr_reader :index, :inbox, :broker

    def initialize(index, broker)
      @index = index
      @broker = broker
      @inbox = Queue.new
      @outbox = Queue.new
      @requests_ended = false
    end

    # Whether the requests ended: the worker half-closed or cancelled the stream (or #finish
    # ended it).
    def requests_ended?
      @requests_ended
    end

    def requests_ended!
      @requests_ended = true
    end

    def recv
      @inbox.pop
    end

    def push(job)
      @outbox << Jobbroker::V1::WorkResponse.new(job: job)
    end

    def answer(request, code = 0, message = "")
      @outbox << Jobbroker::V1::WorkResponse.new(
        result: Jobbroker::V1::WorkResult.new(request_id: request.request_id, code: code,
                                              message: message)
      )
    end

    # Ends the stream: OK, or with `code` (a GRPC::Core::StatusCodes value).
    def finish(code = nil)
      @outbox << [:end, code]
    end

    def responses
      out = @outbox
      Enumerator.new do |y|
        loop do
          item = out.pop
          if item.is_a?(Array)
            raise GRPC::BadStatus.new_status_exception(item[1], "stand-in ended it") if item[1]

            break
          end
          y << item
        end
      end
    end
  end
end
