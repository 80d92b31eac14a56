import Foundation
import NIOHTTP1

/// HTTP header fields in order, names compared case-insensitively (RFC 9110 §5.1).
public struct BrokerHeaders: Sendable, Sequence, ExpressibleByDictionaryLiteral, CustomStringConvertible {
    var storage: HTTPHeaders

    public init() { self.storage = HTTPHeaders() }

    public init(_ fields: [(name: String, value: String)]) {
        self.storage = HTTPHeaders(fields.map { ($0.name, $0.value) })
    }

    public init(dictionaryLiteral elements: (String, String)...) {
        self.storage = HTTPHeaders(elements)
    }

    init(_ headers: HTTPHeaders) { self.storage = headers }

    /// The first value of `name`, or nil.
    public subscript(name: String) -> String? { storage.first(name: name) }

    /// Every value of `name`, in order.
    public func values(_ name: String) -> [String] { storage[name] }

    public func contains(_ name: String) -> Bool { storage.contains(name: name) }

    /// Adds a field. A name or value that cannot go in a request is not refused here but when the
    /// request is sent (`BrokerClientError.invalidRequest`): SwiftNIO's own `add` would stop the
    /// process on a non-ASCII name.
    public mutating func add(_ name: String, _ value: String) { storage.add(contentsOf: HTTPHeaders([(name, value)])) }

    /// Replaces every field named `name` with one.
    public mutating func set(_ name: String, _ value: String) {
        storage.remove(name: name)
        self.add(name, value)
    }

    public mutating func remove(_ name: String) { storage.remove(name: name) }

    public func makeIterator() -> IndexingIterator<[(name: String, value: String)]> {
        storage.map { (name: $0.name, value: $0.value) }.makeIterator()
    }

    public var description: String { storage.description }
}

/// How long the daemon should keep a credential the app supplied, as URLCredential.Persistence.
public enum CredentialPersistence: String, Sendable, Hashable, CaseIterable {
    /// This request only: the daemon is not asked to keep it.
    case none
    /// Until the daemon stops (`Authbroker-Persist: session`).
    case forSession
    /// In the daemon's secret store (`Authbroker-Persist: permanent`).
    case permanent

    /// The `Authbroker-Persist` value, nil for `.none`.
    var directive: String? {
        switch self {
        case .none: nil
        case .forSession: "session"
        case .permanent: "permanent"
        }
    }

    /// The control API's `persistence` member.
    var controlValue: String {
        switch self {
        case .none: "none"
        case .forSession: "session"
        case .permanent: "permanent"
        }
    }
}

/// The body of a request to send through the daemon.
public struct BrokerRequestBody: Sendable {
    enum Storage: Sendable {
        case empty
        case bytes([UInt8])
        case stream(ChunkSource, length: Int?)
    }

    let storage: Storage

    /// No body.
    public static let empty = BrokerRequestBody(storage: .empty)

    /// A body held in memory; it can be sent again after a 401 (so challenges can be answered).
    public static func data(_ data: Data) -> BrokerRequestBody { BrokerRequestBody(storage: .bytes(Array(data))) }

    /// A body held in memory; it can be sent again after a 401 (so challenges can be answered).
    public static func bytes(_ bytes: [UInt8]) -> BrokerRequestBody { BrokerRequestBody(storage: .bytes(bytes)) }

    /// A body streamed from `chunks` as they come: with `length`, exactly that many bytes with
    /// `Content-Length`, otherwise `Transfer-Encoding: chunked` (RFC 9112 §7.1).
    ///
    /// A streamed body is read once: a 401 answering it is returned as the response, and the
    /// challenge handler is not called, since the request could not be sent again.
    public static func stream<Chunks: AsyncSequence & Sendable>(_ chunks: Chunks, length: Int? = nil) -> BrokerRequestBody
    where Chunks.Element: DataProtocol {
        BrokerRequestBody(storage: .stream(ChunkSource(chunks), length: length))
    }

    /// Whether the body can be sent a second time.
    var isReplayable: Bool {
        if case .stream = storage { return false }
        return true
    }
}

/// A type-erased, Sendable source of request body chunks; each `makeIterator()` starts it anew.
struct ChunkSource: Sendable {
    let makeNext: @Sendable () -> () async throws -> [UInt8]?

    init<Chunks: AsyncSequence & Sendable>(_ chunks: Chunks) where Chunks.Element: DataProtocol {
        self.makeNext = {
            var iterator = chunks.makeAsyncIterator()
            return {
                guard let chunk = try await iterator.next() else { return nil }
                return Array(chunk)
            }
        }
    }
}

/// One request to fetch through the daemon.
public struct BrokerRequest: Sendable {
    /// An absolute `http` or `https` URL; a fragment is not sent.
    public var url: URL
    public var method: String
    public var headers: BrokerHeaders
    public var body: BrokerRequestBody
    /// The client identity (certificate name) the daemon presents if the server asks for one
    /// (`Authbroker-Identity`); nil lets the daemon choose by its rules.
    public var identity: String?

    public init(
        url: URL, method: String = "GET", headers: BrokerHeaders = BrokerHeaders(), body: BrokerRequestBody = .empty,
        identity: String? = nil
    ) {
        self.url = url
        self.method = method
        self.headers = headers
        self.body = body
        self.identity = identity
    }

    /// The parts the wire needs: absolute-form target (RFC 9112 §3.2.2), origin-form target
    /// (what the origin sees, which Digest's `uri` must equal, RFC 7616 §3.4.6), host.
    struct Target: Sendable {
        var absolute: String
        var originForm: String
        var host: String
        var port: Int
        var scheme: String
        var hostHeader: String
    }

    func target() throws(BrokerClientError) -> Target {
        guard var components = URLComponents(url: url, resolvingAgainstBaseURL: true),
            let scheme = components.scheme?.lowercased(), scheme == "http" || scheme == "https",
            let host = components.host, !host.isEmpty
        else {
            throw .invalidRequest(reason: "\(url.absoluteString.prefix(200)) is not an absolute http or https URL")
        }
        components.fragment = nil
        let defaultPort = scheme == "https" ? 443 : 80
        let port = components.port ?? defaultPort
        var path = components.percentEncodedPath
        if path.isEmpty {
            path = "/"
            components.percentEncodedPath = "/"
        }
        let originForm = path + (components.percentEncodedQuery.map { "?" + $0 } ?? "")
        guard let absolute = components.string else {
            throw .invalidRequest(reason: "\(url.absoluteString.prefix(200)) cannot be written as a request target")
        }
        let bracketed = host.contains(":") && !host.hasPrefix("[") ? "[\(host)]" : host
        let hostHeader = components.port.map { "\(bracketed):\($0)" } ?? bracketed
        return Target(absolute: absolute, originForm: originForm, host: host, port: port, scheme: scheme, hostHeader: hostHeader)
    }
}
