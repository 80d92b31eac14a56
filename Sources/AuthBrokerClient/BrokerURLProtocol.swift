import Foundation
import NIOConcurrencyHelpers

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// Routes a URLSession's http and https requests through `authbrokerd`.
///
/// Put it first in `URLSessionConfiguration.protocolClasses`. Each request is sent with a
/// `BrokerClient`; the response head, then the body, then the finish reach the session in the
/// order URLProtocol requires (or one `didFailWithError`, a `BrokerError` or
/// `BrokerClientError`, for a failure). Redirects are delivered as responses, not followed.
///
/// - Warning: this protocol never raises a `URLAuthenticationChallenge`. On Linux,
///   FoundationNetworking cannot hand a credential back to a custom protocol: after the
///   delegate answers `.useCredential` it replaces the protocol by its built-in HTTP loader
///   and sends the request again directly, bypassing the daemon (its trust decisions, its
///   client certificates). So a Basic/Digest 401 the daemon passes through is answered by
///   `BrokerURLProtocol.challengeHandler` when one is set, and otherwise delivered as the
///   response; the session delegate's challenge method is never called for it.
///
/// - Warning: on Linux, FoundationNetworking keeps only the *last* `didLoad` chunk for tasks
///   with a completion handler (and so for `data(from:)`/`data(for:)`): it stores each chunk
///   over the previous one. `bodyDelivery` is therefore `.collected` by default there (one
///   `didLoad` with the whole body, up to a bound); choose `.streaming` for sessions whose data
///   tasks report to a `URLSessionDataDelegate`, which does see every chunk as it arrives.
public final class BrokerURLProtocol: URLProtocol {
    /// How the body reaches the session.
    public enum BodyDelivery: Sendable, Hashable {
        /// One `didLoad` per chunk as it arrives: bounded memory, for delegate-based sessions.
        case streaming
        /// One `didLoad` with the whole body; a larger body fails the task with
        /// `BrokerClientError.responseTooLarge`.
        case collected(maxBytes: Int)
    }

    private struct Settings {
        var socketPath: String?
        var handler: BrokerChallengeHandler?
        #if canImport(FoundationNetworking)
        var bodyDelivery = BodyDelivery.collected(maxBytes: 256 * 1024 * 1024)
        #else
        var bodyDelivery = BodyDelivery.streaming
        #endif
    }

    private static let settings = NIOLockedValueBox(Settings())

    /// `.collected(maxBytes: 256 MiB)` on Linux (see the warning above), `.streaming` elsewhere.
    public static var bodyDelivery: BodyDelivery {
        get { settings.withLockedValue { $0.bodyDelivery } }
        set { settings.withLockedValue { $0.bodyDelivery = newValue } }
    }

    /// Answers Basic/Digest challenges for every request this protocol loads (see the warning
    /// above for why the session delegate cannot).
    public static var challengeHandler: BrokerChallengeHandler? {
        get { settings.withLockedValue { $0.handler } }
        set { settings.withLockedValue { $0.handler = newValue } }
    }

    /// The daemon's socket; nil: `BrokerClient.defaultSocketPath()`.
    public static var socketPath: String? {
        get { settings.withLockedValue { $0.socketPath } }
        set { settings.withLockedValue { $0.socketPath = newValue } }
    }

    /// Largest `httpBodyStream` read into memory to be sent (a body must be known in full to
    /// be sent again after a 401).
    public static let maxStreamedRequestBodyBytes = 64 * 1024 * 1024

    private let loading = NIOLockedValueBox<Task<Void, Never>?>(nil)

    public override class func canInit(with request: URLRequest) -> Bool {
        guard let scheme = request.url?.scheme?.lowercased() else { return false }
        return scheme == "http" || scheme == "https"
    }

    public override class func canonicalRequest(for request: URLRequest) -> URLRequest {
        request
    }

    public override func startLoading() {
        let request = self.request
        let brokerClient = BrokerClient(socketPath: Self.socketPath, challengeHandler: Self.challengeHandler)
        let context = LoadingContext(urlProtocol: self, client: self.client, delivery: Self.bodyDelivery)
        let task = Task {
            await context.load(request, with: brokerClient)
        }
        loading.withLockedValue { $0 = task }
    }

    public override func stopLoading() {
        loading.withLockedValue { task in
            task?.cancel()
            task = nil
        }
    }

}

/// The protocol and its client, carried into the loading task.
private struct LoadingContext: @unchecked Sendable {  // URLProtocol(Client) are not Sendable on Linux; after startLoading only this task calls them
    let urlProtocol: BrokerURLProtocol
    let client: (any URLProtocolClient)?
    let delivery: BrokerURLProtocol.BodyDelivery

    func load(_ urlRequest: URLRequest, with brokerClient: BrokerClient) async {
        do {
            guard let url = urlRequest.url else { throw BrokerClientError.invalidRequest(reason: "the request has no URL") }
            var headers = BrokerHeaders()
            for (name, value) in urlRequest.allHTTPHeaderFields ?? [:] { headers.add(name, value) }
            let body: BrokerRequestBody
            if let data = urlRequest.httpBody {
                body = .data(data)
            } else if let stream = urlRequest.httpBodyStream {
                body = .bytes(try Self.readAll(stream))
            } else {
                body = .empty
            }
            let request = BrokerRequest(url: url, method: urlRequest.httpMethod ?? "GET", headers: headers, body: body)
            let response = try await brokerClient.send(request)
            var fields: [String: String] = [:]
            for (name, value) in response.headers {
                fields[name] = fields[name].map { $0 + ", " + value } ?? value
            }
            guard let httpResponse = HTTPURLResponse(url: url, statusCode: response.status, httpVersion: "HTTP/1.1", headerFields: fields) else {
                throw BrokerClientError.protocolError(reason: "status \(response.status) cannot be represented")
            }
            try Task.checkCancellation()
            client?.urlProtocol(urlProtocol, didReceive: httpResponse, cacheStoragePolicy: .notAllowed)
            switch delivery {
            case .streaming:
                for try await chunk in response.body {
                    try Task.checkCancellation()
                    client?.urlProtocol(urlProtocol, didLoad: Data(chunk))
                }
            case .collected(let maxBytes):
                let data = try await response.body.collect(maxBytes: maxBytes)
                try Task.checkCancellation()
                if !data.isEmpty { client?.urlProtocol(urlProtocol, didLoad: data) }
            }
            try Task.checkCancellation()
            client?.urlProtocolDidFinishLoading(urlProtocol)
        } catch is CancellationError {
            // stopLoading: the session no longer listens.
        } catch {
            client?.urlProtocol(urlProtocol, didFailWithError: error)
        }
    }

    private static func readAll(_ stream: InputStream) throws -> [UInt8] {
        stream.open()
        defer { stream.close() }
        var bytes: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 64 * 1024)
        while true {
            let count = stream.read(&buffer, maxLength: buffer.count)
            if count < 0 { throw BrokerClientError.invalidRequest(reason: "the request body stream failed: \(stream.streamError.map { "\($0)" } ?? "unknown error")") }
            if count == 0 { return bytes }
            bytes.append(contentsOf: buffer[0..<count])
            if bytes.count > BrokerURLProtocol.maxStreamedRequestBodyBytes {
                throw BrokerClientError.invalidRequest(reason: "the request body stream is larger than \(BrokerURLProtocol.maxStreamedRequestBodyBytes) bytes")
            }
        }
    }
}
