import Synchronization

/// A counter that any task may bump without a lock.
package final class BrokerCounter: Sendable {
    private let value = Atomic<Int>(0)
    package init() {}
    package func add(_ amount: Int) { self.value.add(amount, ordering: .relaxed) }
    package func subtract(_ amount: Int) { self.value.subtract(amount, ordering: .relaxed) }
    package var current: Int { self.value.load(ordering: .relaxed) }
}

/// The daemon's counters, reported by `GET /v1/status`.
package final class BrokerCounters: Sendable {
    package let clientConnectionsAccepted = BrokerCounter()
    package let clientConnectionsRefused = BrokerCounter()
    package let clientConnectionsOpen = BrokerCounter()
    /// Of `clientConnectionsOpen`, those whose full path has a task running: the others' requests
    /// have all been the direct relay's, and they hold no task (`DirectRelayHandler`).
    package let clientConnectionsOnFullPath = BrokerCounter()
    /// Closed by the request-head or idle timeout.
    package let clientConnectionsTimedOut = BrokerCounter()
    package let requestsTotal = BrokerCounter()
    package let requestsInFlight = BrokerCounter()
    /// Of `requestsTotal`, those the client connection's direct relay answered by itself.
    package let requestsRelayedDirectly = BrokerCounter()
    package let brokerErrors = BrokerCounter()
    package let upstreamConnectionsOpen = BrokerCounter()
    package let bytesFromUpstream = BrokerCounter()
    package let bytesToUpstream = BrokerCounter()
    /// Blind tunnels opened for CONNECT (their bytes count in the two above).
    package let tunnelsOpened = BrokerCounter()
    package let connectsIntercepted = BrokerCounter()

    package init() {}

    package var snapshot: [String: Int] {
        [
            "client_connections_accepted": self.clientConnectionsAccepted.current,
            "client_connections_refused": self.clientConnectionsRefused.current,
            "client_connections_open": self.clientConnectionsOpen.current,
            "client_connections_on_full_path": self.clientConnectionsOnFullPath.current,
            "client_connections_timed_out": self.clientConnectionsTimedOut.current,
            "requests_total": self.requestsTotal.current,
            "requests_in_flight": self.requestsInFlight.current,
            "requests_relayed_directly": self.requestsRelayedDirectly.current,
            "broker_errors_total": self.brokerErrors.current,
            "upstream_connections_open": self.upstreamConnectionsOpen.current,
            "bytes_from_upstream": self.bytesFromUpstream.current,
            "bytes_to_upstream": self.bytesToUpstream.current,
            "tunnels_opened": self.tunnelsOpened.current,
            "connects_intercepted": self.connectsIntercepted.current,
        ]
    }
}
