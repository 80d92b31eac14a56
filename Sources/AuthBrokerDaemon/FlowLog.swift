import AuthBrokerCore
import AuthBrokerHTTPAuth
import Foundation
import NIOConcurrencyHelpers
import NIOCore
import NIOHTTP1
import Synchronization

/// The recent flows (`[flows]`), for `authbrokerctl flows`: a bounded ring in memory, and the
/// live views that follow it. Nothing is written to disk; an export is the user's own act.
package final class FlowLog: Sendable {
    private struct State {
        var ring: FlowRing
        var followers: [UInt64: AsyncStream<FlowRecord>.Continuation] = [:]
        var nextFollower: UInt64 = 0
    }

    package let settings: BrokerSettings.Flows
    package let masking: FlowMasking
    private let state: NIOLockedValueBox<State>
    /// Requests are recorded (`[flows] record`): from the start, or since someone asked.
    private let recording: Synchronization.Atomic<Bool>

    /// Flows a live view has not taken yet beyond this are dropped for it (the oldest first),
    /// so a stalled `authbrokerctl flows` costs the daemon a bounded amount.
    static let followerBuffer = 1024

    package init(settings: BrokerSettings.Flows, limits: BrokerSettings.Limits = .init()) {
        self.settings = settings
        self.masking = FlowMasking(extraNames: settings.maskHeaders)
        let ring = FlowRing(
            capacity: settings.keep, maxHeldBytes: BrokerSettings.Flows.maxHeldBytes,
            maxHeadBytes: limits.maxRequestHeadBytes + limits.maxResponseHeadBytes
        )
        self.state = NIOLockedValueBox(State(ring: ring))
        self.recording = Synchronization.Atomic(settings.keep > 0 && settings.record == .always)
    }

    /// Whether the flow log exists at all (`[flows] keep` > 0).
    package var isEnabled: Bool { self.settings.keep > 0 }

    /// Whether requests are recorded now: read once per request, so it is one relaxed load.
    package var isRecording: Bool { self.recording.load(ordering: .relaxed) }

    /// Someone asked for the flows: record from now on (`on_demand`). Returns whether it was
    /// already on.
    @discardableResult
    package func startRecording() -> Bool {
        guard self.isEnabled else { return false }
        return self.recording.exchange(true, ordering: .relaxed)
    }

    /// How much of each body a capture keeps; nil when bodies are not kept.
    var bodyLimit: Int? { self.settings.bodies ? self.settings.maxBodyBytes : nil }

    package func record(_ flow: consuming FlowRecord) {
        guard self.isEnabled else { return }
        // Moved, not copied, into the ring (a copy retains every field).
        var pending = Optional(flow)
        let evicted = self.state.withLockedValue { state -> FlowRecord? in
            guard let flow = pending.take() else { return nil }
            if !state.followers.isEmpty {
                var numbered = flow
                numbered.sequence = state.ring.lastSequence + 1
                // Under the lock, so followers get flows in the order they were numbered
                // (yielding never waits: each follower's buffer drops its oldest when full).
                for follower in state.followers.values { follower.yield(numbered) }
            }
            return state.ring.append(flow)
        }
        _ = consume evicted  // released here, outside the lock
    }

    /// The kept flows, oldest first (the last `limit` when given).
    package func recent(_ limit: Int? = nil) -> [FlowRecord] {
        self.state.withLockedValue { $0.ring.recent(limit) }
    }

    /// Flows as they end, from now on, until `unfollow`.
    package func follow() -> (id: UInt64, flows: AsyncStream<FlowRecord>) {
        let (stream, continuation) = AsyncStream<FlowRecord>.makeStream(bufferingPolicy: .bufferingNewest(Self.followerBuffer))
        let id = self.state.withLockedValue { state in
            state.nextFollower += 1
            state.followers[state.nextFollower] = continuation
            return state.nextFollower
        }
        return (id, stream)
    }

    package func unfollow(_ id: UInt64) {
        let continuation = self.state.withLockedValue { $0.followers.removeValue(forKey: id) }
        continuation?.finish()
    }
}

/// What one request's flow learns while it is served, on either path: the response head the
/// client got and when, the bodies' first bytes, and what the broker applied.
struct FlowObservation {
    /// When the request's head came (the wall clock is read only for requests recorded).
    let started = Date()
    /// How much of each body is kept; nil: none.
    let bodyLimit: Int?
    var responseHead: HTTPResponseHead?
    var responseHeadAt: ContinuousClock.Instant?
    var requestBodyBytes = 0
    var requestBody: CapturedBody?
    var responseBody: CapturedBody?
    var applied = FlowApplied()

    init(bodyLimit: Int?) {
        self.bodyLimit = bodyLimit
        self.requestBody = bodyLimit.map { _ in CapturedBody() }
    }

    /// A final response head went to the client (interim ones are not the flow's).
    mutating func responded(_ head: HTTPResponseHead) {
        guard head.status.code >= 200 else { return }
        self.responseHead = head
        self.responseHeadAt = .now
        self.responseBody = self.bodyLimit.map { _ in CapturedBody() }
    }

    mutating func responseBody(_ buffer: ByteBuffer) {
        guard let limit = self.bodyLimit else { return }
        self.responseBody?.append(buffer.readableBytesView, limit: limit)
    }

    mutating func requestBody(_ buffer: ByteBuffer) {
        self.requestBodyBytes += buffer.readableBytes
        if let limit = self.bodyLimit { self.requestBody?.append(buffer.readableBytesView, limit: limit) }
    }
}

/// The full path's `FlowObservation` of one request, which the data plane reports to through
/// `current`, set for the request's task tree, so no signature along the way carries it.
package final class FlowCapture: Sendable {
    @TaskLocal package static var current: FlowCapture?

    private let observation: NIOLockedValueBox<FlowObservation>

    init(bodyLimit: Int?) {
        self.observation = NIOLockedValueBox(FlowObservation(bodyLimit: bodyLimit))
    }

    var snapshot: FlowObservation { self.observation.withLockedValue { $0 } }

    func responded(_ head: HTTPResponseHead) {
        self.observation.withLockedValue { $0.responded(head) }
    }

    /// The broker's own answer (an error), head and whole body.
    func responded(_ head: HTTPResponseHead, body: ByteBuffer) {
        self.observation.withLockedValue { observation in
            observation.responded(head)
            observation.responseBody(body)
        }
    }

    func responseBody(_ buffer: ByteBuffer) {
        self.observation.withLockedValue { $0.responseBody(buffer) }
    }

    func requestBody(_ buffer: ByteBuffer) {
        self.observation.withLockedValue { $0.requestBody(buffer) }
    }

    func credentialUsed(_ space: ProtectionSpace, user: String) {
        let credential = FlowApplied.Credential(
            user: user, realm: space.realm.isEmpty ? nil : space.realm, scheme: space.authScheme, proxy: space.isProxy
        )
        self.observation.withLockedValue { observation in
            if !observation.applied.credentials.contains(credential) { observation.applied.credentials.append(credential) }
        }
    }

    func apply(_ change: (inout FlowApplied) -> Void) {
        self.observation.withLockedValue { change(&$0.applied) }
    }
}

extension FlowRecord {
    /// The record of a request that has ended, from what was observed while it was served.
    init(
        requestID: String, head: HTTPRequestHead, url: String, startedAt: ContinuousClock.Instant, outcome: RequestOutcome,
        observed: FlowObservation, app: Requester?, intercepted: Bool
    ) {
        self.init(
            requestID: requestID, started: observed.started, method: head.method.rawValue, url: url,
            httpVersion: FlowRecord.versionText(head.version), requestHeaders: head.headers
        )
        self.status = outcome.status
        self.responseHeaders = observed.responseHead?.headers ?? HTTPHeaders()
        self.responseBodyBytes = outcome.bytes
        self.requestBodyBytes = observed.requestBodyBytes
        self.requestBody = observed.requestBody
        self.responseBody = observed.responseBody
        self.brokerError = outcome.brokerError
        self.applied = observed.applied
        if intercepted { self.applied.intercepted = true }
        self.app = app
        self.totalMicroseconds = (ContinuousClock.now - startedAt).microseconds
        self.waitMicroseconds = observed.responseHeadAt.map { ($0 - startedAt).microseconds }
    }
}

extension Duration {
    var microseconds: Int64 {
        self.components.seconds * 1_000_000 + self.components.attoseconds / 1_000_000_000_000
    }
}
