package dev.jobbroker.client;

import dev.jobbroker.v1.AdminGrpc;
import dev.jobbroker.v1.ClusterInfo;
import dev.jobbroker.v1.GetClusterRequest;
import io.grpc.CallOptions;
import io.grpc.Channel;
import io.grpc.ClientCall;
import io.grpc.ClientInterceptor;
import io.grpc.ClientInterceptors;
import io.grpc.ConnectivityState;
import io.grpc.ManagedChannel;
import io.grpc.MethodDescriptor;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import java.time.Duration;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.TimeUnit;
import java.util.function.BiConsumer;
import java.util.function.Function;

/**
 * The channel every call of a {@link JobBrokerClient} and its {@link Worker} goes through: it
 * sends each call to the node its {@link Route} names, from the {@link RoutingTable} of the
 * latest Admin.GetCluster answer, over one channel per node address (made on first use and
 * kept).
 *
 * <p>The table is fetched before the first call, and again before the next call after {@link
 * #markStale()} (a call that failed UNAVAILABLE or DEADLINE_EXCEEDED: a leader moved, a node
 * died), from whichever address answers first: the nodes of the last table, then the given
 * addresses, those whose channel failed its last connect at the end. A broker that answers
 * GetCluster with an error (UNIMPLEMENTED from a broker older than cluster mode,
 * PERMISSION_DENIED for a token without the admin role) gets every call: any node forwards a
 * call to its partition's leader. While no address has answered, calls go to the first given
 * address and each asks again. A single broker outside a cluster, given as the only address, is
 * asked once.
 *
 * <p>With a channel the caller built ({@link JobBrokerClient#wrap}) there is no routing.
 *
 * <p>Thread-safe. One refresh runs at a time; calls that find the table stale meanwhile wait
 * for it and use its answer.
 */
final class Router extends Channel {
  /** Which node a call is for; set on a stub with {@code withOption(Router.ROUTE, ...)}. */
  record Route(Kind kind, String key) {
    enum Kind {
      ANY, // any node serves it
      QUEUE, // the leader of the queue `key`'s partition
      JOB, // the leader of the partition job `key` lives in
      ADDRESS // the node at `key`, chosen by the caller from table()
    }

    static final Route ANY = new Route(Kind.ANY, "");

    static Route queue(String queue) {
      return new Route(Kind.QUEUE, queue);
    }

    static Route job(String jobId) {
      return new Route(Kind.JOB, jobId);
    }

    static Route address(String address) {
      return new Route(Kind.ADDRESS, address);
    }
  }

  static final CallOptions.Key<Route> ROUTE =
      CallOptions.Key.createWithDefault("jobbroker-route", Route.ANY);

  private enum State {
    UNKNOWN,
    FRESH,
    STALE
  }

  // Constant after construction.
  private final List<String> addresses;
  private final Function<String, ManagedChannel> dial; // a node's channel; null with fixedChannel
  private final ManagedChannel fixedChannel; // wrap()'s: no routing; null otherwise
  private final ClientInterceptor callMetadata; // the client's token and name, for GetCluster
  private final Duration fetchTimeout;

  private final Object refreshLock = new Object(); // held while GetCluster is under way

  // State below is guarded by this.
  private final Map<String, ManagedChannel> channels = new LinkedHashMap<>();
  private State state = State.UNKNOWN;
  private RoutingTable table = RoutingTable.NONE;

  // Test hook: told the method and node address of every call as it is sent.
  private volatile BiConsumer<String, String> sentTo = (method, address) -> {};

  Router(
      List<String> addresses,
      Function<String, ManagedChannel> dial,
      ManagedChannel fixedChannel,
      ClientInterceptor callMetadata,
      Duration fetchTimeout) {
    this.addresses = List.copyOf(new LinkedHashSet<>(addresses));
    this.dial = dial;
    this.fixedChannel = fixedChannel;
    this.callMetadata = callMetadata;
    this.fetchTimeout = fetchTimeout;
  }

  @Override
  public <ReqT, RespT> ClientCall<ReqT, RespT> newCall(
      MethodDescriptor<ReqT, RespT> method, CallOptions options) {
    Route route = options.getOption(ROUTE);
    String address = route.kind() == Route.Kind.ADDRESS ? route.key() : addressFor(route);
    ManagedChannel channel = channelAt(address);
    sentTo.accept(method.getFullMethodName(), address);
    return channel.newCall(method, options);
  }

  @Override
  public String authority() {
    return first().authority();
  }

  /** The first given address's channel (or the caller's own). */
  ManagedChannel first() {
    return channelAt(addresses.get(0));
  }

  /** The address to send a call for {@code route} to, after fetching the table if stale. */
  String addressFor(Route route) {
    RoutingTable current = table();
    if (current.isEmpty()) {
      return addresses.get(0);
    }
    return switch (route.kind()) {
      case ANY -> current.anyAddress();
      case QUEUE -> current.addressOfQueue(route.key());
      case JOB -> current.addressOfJob(route.key());
      case ADDRESS -> route.key();
    };
  }

  /** The table as it is now, after fetching it if it is stale; NONE with a fixed channel. */
  RoutingTable table() {
    refreshIfNeeded();
    synchronized (this) {
      return table;
    }
  }

  /**
   * A call failed in a way that may mean it went to the wrong node (UNAVAILABLE,
   * DEADLINE_EXCEEDED): the next call fetches the table first.
   */
  synchronized void markStale() {
    if (state == State.FRESH) {
      state = State.STALE;
    }
  }

  /** Lets every channel reconnect now (the caller keeps its own backoff, not gRPC's). */
  synchronized void resetConnectBackoff() {
    channels.values().forEach(ManagedChannel::resetConnectBackoff);
  }

  void onCallSentForTest(BiConsumer<String, String> methodAndAddress) {
    sentTo = methodAndAddress;
  }

  private synchronized ManagedChannel channelAt(String address) {
    if (fixedChannel != null) {
      return fixedChannel;
    }
    return channels.computeIfAbsent(address, dial);
  }

  private synchronized boolean needsRefresh() {
    return switch (state) {
      case FRESH -> false;
      case UNKNOWN -> fixedChannel == null;
      // One broker outside a cluster, the only address given: asking again tells the same.
      case STALE -> table.isCluster() || addresses.size() > 1;
    };
  }

  private void refreshIfNeeded() {
    if (!needsRefresh()) {
      return;
    }
    synchronized (refreshLock) {
      if (!needsRefresh()) {
        return; // another thread's refresh ran while this one waited
      }
      List<String> candidates = new ArrayList<>();
      List<String> failing = new ArrayList<>();
      Set<String> all = new LinkedHashSet<>();
      synchronized (this) {
        all.addAll(table.nodeAddresses());
      }
      all.addAll(addresses);
      for (String address : all) {
        // A channel that failed its last connect is asked last.
        boolean lastConnectFailed =
            channelAt(address).getState(false) == ConnectivityState.TRANSIENT_FAILURE;
        (lastConnectFailed ? failing : candidates).add(address);
      }
      candidates.addAll(failing);
      RoutingTable fetched = fetch(candidates);
      if (fetched == null) {
        return; // the old table (or none) stays, and stays stale
      }
      synchronized (this) {
        table = fetched;
        state = State.FRESH;
      }
    }
  }

  /** GetCluster from the first candidate that answers; null if none did. */
  private RoutingTable fetch(List<String> candidates) {
    for (String address : candidates) {
      AdminGrpc.AdminBlockingStub admin =
          AdminGrpc.newBlockingStub(ClientInterceptors.intercept(channelAt(address), callMetadata))
              .withDeadlineAfter(fetchTimeout.toNanos(), TimeUnit.NANOSECONDS);
      try {
        ClusterInfo info = admin.getCluster(GetClusterRequest.getDefaultInstance());
        return RoutingTable.fromClusterInfo(info, address);
      } catch (StatusRuntimeException e) {
        if (Thread.currentThread().isInterrupted()) {
          // Our own thread was interrupted (a Worker's stop), not the broker's answer: no table.
          return null;
        }
        Status.Code code = e.getStatus().getCode();
        if (code == Status.Code.UNAVAILABLE || code == Status.Code.DEADLINE_EXCEEDED) {
          continue;
        }
        // It answered but will not say: it serves every call, forwarding what it does not lead.
        return RoutingTable.singleBroker(address);
      }
    }
    return null;
  }

  /** Closes the channels this router made, waiting up to 5 s for calls to finish. */
  void shutdown() {
    List<ManagedChannel> made;
    synchronized (this) {
      made = List.copyOf(channels.values());
    }
    made.forEach(ManagedChannel::shutdown);
    try {
      for (ManagedChannel c : made) {
        if (!c.awaitTermination(5, TimeUnit.SECONDS)) {
          c.shutdownNow();
        }
      }
    } catch (InterruptedException e) {
      made.forEach(ManagedChannel::shutdownNow);
      Thread.currentThread().interrupt();
    }
  }
}
