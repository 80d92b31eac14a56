import NIOCore
import NIOSSL

/// What one run of the load generator does, fixed before any connection opens.
///
/// A value, so every worker on every event loop gets its own copy.
struct LoadPlan: Sendable {
    /// How each worker uses its connections.
    enum Mode: String, Sendable, Codable {
        /// One connection per worker, requests back to back on it (HTTP/1.1 keep-alive).
        case keepAlive = "keep-alive"
        /// A new connection for every request (`Connection: close`); latency includes connect.
        case newConnectionPerRequest = "new-connection-per-request"
        /// One request whose body is counted as it streams by, never kept.
        case stream
        /// Each worker makes its requests, then holds its connection open and idle.
        case holdIdle = "hold-idle"
    }

    var mode: Mode
    /// Where to connect: a TCP address or a Unix socket.
    var address: SocketAddress
    /// The request target as sent: `/path` (origin-form) or `http://host:port/path` (absolute-form).
    var requestTarget: String
    /// The `Host` header (the URL's authority).
    var hostHeader: String
    /// TLS to the server itself (direct HTTPS), with the name sent as SNI and checked.
    var tls: NIOSSLContext?
    var serverHostname: String?
    /// `host:port` to send `CONNECT` for before TLS (`--tunnel`); nil: TLS (or HTTP) at once.
    var tunnelAuthority: String?
    var connections: Int
    /// Requests per worker in count mode; `nil` runs for `measureEnd`.
    var requestsPerWorker: Int?
    /// Requests started before this instant are warm-up: not counted, not timed.
    var measureStart: NIODeadline
    /// No request starts at or after this instant (duration mode).
    var measureEnd: NIODeadline
    /// The whole run is cut off here, whatever is in flight.
    var hardDeadline: NIODeadline
    var expectedStatus: UInt
    /// Expected body length; `nil` learns it from the worker's first response.
    var expectedLength: Int?
    /// A worker gives up after this many errors.
    var maxErrorsPerWorker: Int
}
