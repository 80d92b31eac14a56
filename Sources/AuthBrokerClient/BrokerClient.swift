import AuthBrokerCore
import Foundation
import NIOCore
import NIOHTTP1
import NIOPosix

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// A client of `authbrokerd`, the per-user authentication broker: fetches http(s) URLs through
/// the daemon's Unix socket, and manages its trust anchors and passwords.
///
/// The daemon decides server trust, presents client certificates and answers Basic/Digest
/// challenges from stored passwords; the app sees the origin's response, or a `BrokerError`
/// that says what failed and how to fix it. Each request uses a connection of its own.
public struct BrokerClient: Sendable {
    /// The daemon's socket.
    public let socketPath: String
    /// Answers the Basic/Digest 401s the daemon passes through; nil returns them as responses.
    public var challengeHandler: BrokerChallengeHandler?
    /// Sent as `User-Agent` with control requests, and with fetches whose headers set none
    /// (`myapp/1.2`); nil sends none of its own.
    public var userAgent: String?
    private let group: any EventLoopGroup

    /// A client of the daemon at `socketPath`, by default where `authbrokerctl` finds it:
    /// `$AUTHBROKER_SOCKET`, the configured `socket_path`, then
    /// `$XDG_RUNTIME_DIR/authbroker/authbroker.sock` (`/tmp/authbroker-<uid>/` without it).
    public init(socketPath: String? = nil, challengeHandler: BrokerChallengeHandler? = nil) {
        self.socketPath = socketPath ?? Self.defaultSocketPath()
        self.challengeHandler = challengeHandler
        self.group = MultiThreadedEventLoopGroup.singleton
    }

    /// Where the daemon listens for this user, as the daemon and `authbrokerctl` decide it.
    public static func defaultSocketPath(environment: [String: String] = ProcessInfo.processInfo.environment) -> String {
        let configFile = BrokerPaths.configFile(explicit: nil, environment: environment)
        let configured = (try? BrokerSettings.load(path: configFile))?.daemon.socketPath
        return BrokerPaths.socketPath(explicit: nil, configured: configured, environment: environment, uid: getuid())
    }

    // MARK: Data plane

    /// Fetches `request` through the daemon and returns as soon as the response head arrives;
    /// the body streams from `response.body`.
    ///
    /// A 401 with Basic/Digest challenges goes to `challengeHandler` (when the body can be
    /// sent again); its answer decides whether the request is sent again with a credential.
    /// Cancelling the calling task closes the connection, and the daemon drops the upstream
    /// request.
    ///
    /// - Throws: `BrokerError` when the daemon itself failed the request (untrusted server,
    ///   unreachable host, ...); `BrokerClientError` when the daemon cannot be reached
    ///   (`.daemonNotRunning`) or the handler cancelled.
    public func send(_ request: BrokerRequest) async throws -> BrokerResponse {
        let target = try request.target()
        var dialogue = ChallengeDialogue()
        var authorization: String?
        var persist: String?
        while true {
            let head = try Self.requestHead(
                request, target: target, authorization: authorization, persist: persist, userAgent: userAgent
            )
            let response = try await exchange(head, body: request.body.storage)
            guard response.status == 401, let handler = challengeHandler, request.body.isReplayable,
                !response.headers.values("WWW-Authenticate").isEmpty
            else { return response }
            let decision: ChallengeDialogue.Decision
            do {
                decision = try await dialogue.decide(after: HTTPResponseHead(response.head), request: request, target: target, handler: handler)
            } catch {
                response.body.cancel()
                throw error
            }
            switch decision {
            case .returnResponse:
                return response
            case .cancel:
                response.body.cancel()
                throw BrokerClientError.challengeCancelled
            case .resend(let value, let directive):
                response.body.cancel()
                try Task.checkCancellation()
                authorization = value
                persist = directive
            }
        }
    }

    /// Fetches `request` and collects its body, for small bodies.
    /// - Throws: `BrokerClientError.responseTooLarge` when the body exceeds `maxBytes`; as `send`.
    public func data(for request: BrokerRequest, maxBytes: Int = 16 * 1024 * 1024) async throws -> (Data, BrokerResponseHead) {
        let response = try await send(request)
        return (try await response.body.collect(maxBytes: maxBytes), response.head)
    }

    /// One exchange: the response head, or the daemon's own error thrown as `BrokerError`.
    func exchange(_ head: HTTPRequestHead, body: BrokerRequestBody.Storage) async throws -> BrokerResponse {
        try Task.checkCancellation()
        let exchange = try await BrokerExchange.start(socketPath: socketPath, group: group, head: head, body: body)
        let first: HTTPClientResponsePart?
        do {
            first = try await exchange.next()
        } catch {
            exchange.cancel()
            throw error
        }
        guard case .head(let responseHead) = first else {
            exchange.cancel()
            throw first == nil ? BrokerClientError.connectionClosed : BrokerClientError.protocolError(reason: "body data before a response head")
        }
        let requestID = responseHead.headers.first(name: "Authbroker-Request-Id")
        let mark = responseHead.headers.first(name: AuthBrokerCore.BrokerHeaders.error)
        switch BrokerErrorDetection.classify(responseHead) {
        case .origin:
            return BrokerResponse(head: BrokerResponseHead(responseHead), body: BrokerResponseBody(exchange: exchange))
        case .brokerError(let proxyStatus, let details):
            let (chunks, _) = try await Self.read(exchange, upTo: BrokerErrorDetection.maxProblemBytes)
            exchange.cancel()
            if let problem = BrokerErrorDetection.brokerProblem(in: Array(chunks.joined())) {
                throw BrokerError(problem: problem, proxyStatus: proxyStatus, requestID: requestID)
            }
            throw BrokerError(
                status: Int(responseHead.status.code), code: mark, proxyStatus: proxyStatus, details: details, requestID: requestID
            )
        case .brokerProblem:
            let (chunks, _) = try await Self.read(exchange, upTo: BrokerErrorDetection.maxProblemBytes)
            exchange.cancel()
            if let problem = BrokerErrorDetection.brokerProblem(in: Array(chunks.joined())) {
                throw BrokerError(problem: problem, proxyStatus: nil, requestID: requestID)
            }
            throw BrokerError(status: Int(responseHead.status.code), code: mark, proxyStatus: nil, details: nil, requestID: requestID)
        }
    }

    /// Reads body chunks until at least `limit` bytes or the end.
    private static func read(_ exchange: BrokerExchange, upTo limit: Int) async throws -> (chunks: [[UInt8]], complete: Bool) {
        var chunks: [[UInt8]] = []
        var total = 0
        while total < limit {
            switch try await exchange.next() {
            case .body(var buffer):
                let bytes = buffer.readBytes(length: buffer.readableBytes) ?? []
                total += bytes.count
                chunks.append(bytes)
            case .end, nil:
                return (chunks, true)
            case .head:
                throw BrokerClientError.protocolError(reason: "a second response head arrived inside a body")
            }
        }
        return (chunks, false)
    }

    static func requestHead(
        _ request: BrokerRequest, target: BrokerRequest.Target, authorization: String?, persist: String?, userAgent: String? = nil
    ) throws(BrokerClientError) -> HTTPRequestHead {
        try Self.checkMethod(request.method)
        for (name, value) in request.headers.storage { try Self.checkField(name: name, value: value) }
        if let identity = request.identity { try Self.checkField(name: "Authbroker-Identity", value: identity) }
        if let userAgent { try Self.checkField(name: "User-Agent", value: userAgent) }
        var headers = HTTPHeaders()
        headers.add(name: "Host", value: target.hostHeader)
        for (name, value) in request.headers.storage {
            let lower = name.lowercased()
            // Framing is this library's; `Connection` would be read as the daemon's hop.
            if ["host", "content-length", "transfer-encoding", "connection"].contains(lower) { continue }
            if authorization != nil, lower == "authorization" { continue }
            headers.add(name: name, value: value)
        }
        if let identity = request.identity { headers.replaceOrAdd(name: "Authbroker-Identity", value: identity) }
        if let authorization { headers.add(name: "Authorization", value: authorization) }
        if let persist { headers.replaceOrAdd(name: "Authbroker-Persist", value: persist) }
        if let userAgent, !headers.contains(name: "User-Agent") { headers.add(name: "User-Agent", value: userAgent) }
        switch request.body.storage {
        case .empty:
            if ["POST", "PUT", "PATCH"].contains(request.method.uppercased()) { headers.add(name: "Content-Length", value: "0") }
        case .bytes(let bytes):
            headers.add(name: "Content-Length", value: String(bytes.count))
        case .stream(_, let length?):
            headers.add(name: "Content-Length", value: String(length))
        case .stream(_, nil):
            headers.add(name: "Transfer-Encoding", value: "chunked")
        }
        headers.add(name: "Connection", value: "close")
        return HTTPRequestHead(version: .http1_1, method: HTTPMethod(rawValue: request.method), uri: target.absolute, headers: headers)
    }

    /// A method is a token (RFC 9110 §9.1); anything else would break the request line or be
    /// refused by the daemon as a malformed request.
    static func checkMethod(_ method: String) throws(BrokerClientError) {
        guard !method.isEmpty, method.utf8.allSatisfy(HTTPSyntax.isTChar) else {
            throw .invalidRequest(reason: "'\(method.prefix(40))' is not an HTTP method (a token: letters, digits and !#$%&'*+-.^_`|~)")
        }
    }

    /// A field fit for a request head (RFC 9110 §5.1, §5.5): its name a token, its value free of
    /// control characters other than tab (CR and LF would end the head early). The value is never
    /// quoted in the error: it may be a credential.
    static func checkField(name: String, value: String) throws(BrokerClientError) {
        guard !name.isEmpty, name.utf8.allSatisfy(HTTPSyntax.isTChar) else {
            let shown = String(decoding: name.utf8.prefix(40).map { HTTPSyntax.isTChar($0) ? $0 : UInt8(ascii: "?") }, as: UTF8.self)
            throw .invalidRequest(
                reason: "the header name '\(shown)' is not a token (letters, digits and !#$%&'*+-.^_`|~ only, no spaces or non-ASCII)"
            )
        }
        guard value.utf8.allSatisfy(HTTPSyntax.isFieldValueByte) else {
            throw .invalidRequest(reason: "the value of header '\(name)' holds a control character (CR, LF, NUL or another): remove it")
        }
    }
}

extension HTTPResponseHead {
    init(_ head: BrokerResponseHead) {
        self.init(
            version: .http1_1, status: HTTPResponseStatus(statusCode: head.status, reasonPhrase: head.reasonPhrase),
            headers: head.headers.storage
        )
    }
}
