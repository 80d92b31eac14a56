import AuthBrokerCore
import AuthBrokerHTTPAuth
import AuthBrokerKerberos
import Foundation
import Logging
import NIOConcurrencyHelpers
import NIOPosix

/// The daemon's side of HTTP Negotiate (RFC 4559): which challenger may get the user's
/// Kerberos ticket (`NegotiatePolicy`), SPNEGO contexts made and checked on threads of their
/// own, and what the user's credential looks like for `status`.
///
/// GSS-API calls block (the credential cache, DNS for the service name, the KDC for a service
/// ticket), so none runs on an event loop: each goes to a small pool of its own, where a KDC
/// that does not answer delays only other Kerberos work, never a plain request or the cache.
/// A request waits at most `kdc_timeout_ms` for its step; a step still running then finishes
/// on its thread and is dropped.
package final class KerberosNegotiator: Sendable {
    /// Kerberos counters, for `status`.
    package struct Counts: Sendable, Equatable {
        /// SPNEGO contexts started (one token each, sent up front or in answer to a challenge).
        package var contextsStarted = 0
        /// Contexts the server accepted (a response other than a 401/407 to the token).
        package var contextsAccepted = 0
        /// Tokens from servers that proved their identity (mutual authentication).
        package var mutualVerified = 0
        /// Steps that failed (no ticket, the KDC, a refused server token).
        package var failures = 0
    }

    /// Threads for GSS-API: a stuck KDC holds at most these.
    static let threads = 2
    /// The credential's remaining lifetime under which `status` warns.
    package static let expiryWarning: TimeInterval = 30 * 60

    package let policy: NegotiatePolicy
    private let cnameLookup: Bool
    private let timeout: Duration
    private let pool: NIOLockedValueBox<NIOThreadPool?>
    private let counts = NIOLockedValueBox(Counts())
    /// The user's credential, acquired once and shared by every context until one fails with it.
    private let sharedCredential = NIOLockedValueBox<GSSCredential?>(nil)
    /// Steps queued or running on the Kerberos threads; beyond `maxQueued` a request fails at
    /// once instead of queueing behind a KDC that does not answer.
    private let queued = NIOLockedValueBox(0)
    static let maxQueued = 64
    /// The Kerberos threads (KDC work), and the shared blocking pool for local steps, which
    /// must not wait behind a slow KDC.
    private let localPool: NIOThreadPool = .singleton
    /// The latest failure, for `status`: what it was and when.
    private let lastFailure = NIOLockedValueBox<(failure: KerberosFailure, at: Date)?>(nil)
    private let logger: Logger

    package init(settings: BrokerSettings.Kerberos, logger: Logger) {
        self.policy = NegotiatePolicy(settings)
        self.cnameLookup = settings.cnameLookup
        self.timeout = settings.kdcTimeout
        self.pool = NIOLockedValueBox(nil)
        self.logger = logger
    }

    deinit {
        self.pool.withLockedValue { $0 }?.shutdownGracefully { _ in }
    }

    package var counters: Counts { self.counts.withLockedValue { $0 } }

    /// The latest failure and when it happened, nil when none did (or one succeeded since).
    package var latestFailure: (failure: KerberosFailure, at: Date)? { self.lastFailure.withLockedValue { $0 } }

    /// A context started for one request.
    package struct Started: Sendable {
        package var context: NegotiateContext
        /// `Negotiate <token>`, for `Authorization` (for the proxy, `Proxy-Authorization`).
        package var authorization: String
        /// The user's principal the token speaks for (the shared credential's).
        package var principal: String
        /// Whether the user's forwardable ticket went with it.
        package var delegated: Bool
    }

    /// A new context for `challenger` and its first token. `delegate` is what the policy said
    /// for the URL's host; the canonical name must be allowed (and, to delegate, listed) too.
    package func start(for challenger: CanonicalOrigin, delegate: Bool) async -> Result<Started, KerberosFailure> {
        let (lookUp, policy) = (self.cnameLookup, self.policy)
        let sharedCredential = self.sharedCredential
        let result = await self.run(needsKDC: true) { () -> Result<Started, KerberosFailure> in
            let (host, delegating) = policy.serviceHost(
                urlHost: ServiceHost.canonical(challenger.host, lookUp: false), canonical: ServiceHost.canonical(challenger.host, lookUp: lookUp),
                delegate: delegate
            )
            // With the shared credential first; a failure that may only mean it went stale (a new
            // kinit, an expired ticket, another principal) is tried once more with a fresh one.
            var lastFailure: KerberosFailure?
            for fresh in [false, true] {
                do throws(KerberosFailure) {
                    let credential = try Self.sharedOrFresh(sharedCredential, fresh: fresh)
                    let context = try NegotiateContext(serviceHost: host, delegate: delegating, credential: credential)
                    let step = try context.step(serverToken: nil)
                    guard let token = step.token else {
                        return .failure(KerberosFailure(.other, detail: "GSS-API made no initial token", service: context.serviceName))
                    }
                    return .success(
                        Started(
                            context: context, authorization: NegotiatePolicy.authorization(token: token),
                            principal: credential.principal, delegated: delegating
                        )
                    )
                } catch {
                    var failure = error
                    failure.service = "HTTP@" + host
                    lastFailure = failure
                    guard !fresh, [.noTicket, .ticketExpired, .other].contains(failure.kind) else { break }
                }
            }
            let failure = Self.explained(lastFailure ?? KerberosFailure(.other, detail: "no context"))
            if [.noTicket, .ticketExpired].contains(failure.kind) { sharedCredential.withLockedValue { $0 = nil } }
            return .failure(failure)
        }
        self.counts.withLockedValue { counts in
            if case .success = result { counts.contextsStarted += 1 } else { counts.failures += 1 }
        }
        self.note(result.map { _ in () }, challenger: challenger)
        return result
    }

    /// The next token of `context`, from the server's token in a 401/407; nil when the context
    /// needs no more. A failure here is the server's refusal (an error token: a replay, skew).
    package func step(_ context: NegotiateContext, serverToken: [UInt8], challenger: CanonicalOrigin) async -> Result<String?, KerberosFailure> {
        let result = await self.run(needsKDC: false) { () -> Result<String?, KerberosFailure> in
            do throws(KerberosFailure) {
                let step = try context.step(serverToken: serverToken)
                return .success(step.token.map(NegotiatePolicy.authorization(token:)))
            } catch {
                var refused = KerberosFailure(.refusedByServer, detail: error.detail, service: context.serviceName)
                if error.kind == .clockSkew { refused.kind = .clockSkew }
                return .failure(refused)
            }
        }
        if case .failure = result { self.counts.withLockedValue { $0.failures += 1 } }
        self.note(result.map { _ in () }, challenger: challenger)
        return result
    }

    /// Checks a server's final token (mutual authentication) once it accepted the context: the
    /// token must complete the context, proving the server holds the service key.
    package func verify(_ context: NegotiateContext, serverToken: [UInt8], challenger: CanonicalOrigin) async -> Result<Void, KerberosFailure> {
        let result = await self.run(needsKDC: false) { () -> Result<Void, KerberosFailure> in
            do throws(KerberosFailure) {
                guard try context.step(serverToken: serverToken).complete else {
                    return .failure(
                        KerberosFailure(.mutualAuthenticationFailed, detail: "the server's token did not complete the context", service: context.serviceName)
                    )
                }
                return .success(())
            } catch {
                return .failure(KerberosFailure(.mutualAuthenticationFailed, detail: error.detail, service: context.serviceName))
            }
        }
        self.counts.withLockedValue { counts in
            if case .success = result { counts.mutualVerified += 1 } else { counts.failures += 1 }
        }
        self.note(result, challenger: challenger)
        return result
    }

    /// The server accepted a context (a response other than a 401/407 answered its token).
    package func accepted() {
        self.counts.withLockedValue { $0.contextsAccepted += 1 }
    }

    /// The user's credential now, for `status`. Read on the shared blocking pool, not the
    /// Kerberos threads: it needs only the credential cache, and `status` must answer while a
    /// KDC that does not answer holds those threads.
    package func credentialStatus() async -> KerberosCredential.Status {
        (try? await self.localPool.runIfActive { KerberosCredential.current() }) ?? .missing(detail: "the daemon is stopping")
    }

    // MARK: - Running off the event loops

    /// Runs `work` off the event loops: on the Kerberos threads when it may ask the KDC (a first
    /// step), else on the shared blocking pool (a server's token: local crypto). Gives up
    /// waiting after `timeout`; work whose waiter gave up is skipped, and past `maxQueued`
    /// waiting steps a new one fails at once.
    private func run<T: Sendable>(
        needsKDC: Bool, _ work: @escaping @Sendable () -> Result<T, KerberosFailure>
    ) async -> Result<T, KerberosFailure> {
        let pool: NIOThreadPool
        if needsKDC {
            pool = self.pool.withLockedValue { pool in
                if let pool { return pool }
                let started = NIOThreadPool(numberOfThreads: Self.threads)
                started.start()
                pool = started
                return started
            }
        } else {
            pool = self.localPool
        }
        let queued = self.queued
        let admitted = queued.withLockedValue { count in
            guard count < Self.maxQueued else { return false }
            count += 1
            return true
        }
        guard admitted else {
            return .failure(KerberosFailure(.kdcUnreachable, detail: "\(Self.maxQueued) Kerberos requests are already waiting for the KDC"))
        }
        let timeout = self.timeout
        return await withCheckedContinuation { (continuation: CheckedContinuation<Result<T, KerberosFailure>, Never>) in
            let pending = NIOLockedValueBox<CheckedContinuation<Result<T, KerberosFailure>, Never>?>(continuation)
            let finish: @Sendable (Result<T, KerberosFailure>) -> Void = { result in
                pending.withLockedValue { waiting in
                    waiting?.resume(returning: result)
                    waiting = nil
                }
            }
            let timer = Task {
                // Cancelled: the work finished first.
                guard (try? await Task.sleep(for: timeout)) != nil else { return }
                finish(.failure(KerberosFailure(.kdcUnreachable, detail: "no answer within \(timeout.milliseconds) ms ([kerberos] kdc_timeout_ms)")))
            }
            pool.submit { state in
                defer { queued.withLockedValue { $0 -= 1 } }
                guard case .active = state else {
                    finish(.failure(KerberosFailure(.other, detail: "the daemon is stopping")))
                    return
                }
                // Nobody waits for it any more (timed out): the KDC is not asked for nothing.
                guard pending.withLockedValue({ $0 != nil }) else { return }
                finish(work())
                timer.cancel()
            }
        }
    }

    // MARK: - Helpers

    /// The shared credential, acquired when there is none or `fresh` asks for a new one. Runs on
    /// the Kerberos threads.
    private static func sharedOrFresh(_ box: NIOLockedValueBox<GSSCredential?>, fresh: Bool) throws(KerberosFailure) -> GSSCredential {
        if !fresh, let shared = box.withLockedValue({ $0 }) { return shared }
        let acquired = try GSSCredential()
        box.withLockedValue { $0 = acquired }
        return acquired
    }

    /// A first step that failed without saying why in Kerberos terms (SPNEGO hides the
    /// mechanism's reason) is explained by the credential: none, or expired.
    private static func explained(_ failure: KerberosFailure) -> KerberosFailure {
        guard failure.kind == .other else { return failure }
        switch KerberosCredential.current() {
        case .missing(let detail): return KerberosFailure(.noTicket, detail: detail, service: failure.service)
        case .expired(let principal):
            return KerberosFailure(.ticketExpired, detail: "the ticket of \(principal ?? "the default principal") has expired", service: failure.service)
        case .valid: return failure
        }
    }

    private func note(_ result: Result<Void, KerberosFailure>, challenger: CanonicalOrigin) {
        switch result {
        case .success:
            self.lastFailure.withLockedValue { $0 = nil }
        case .failure(let failure):
            self.lastFailure.withLockedValue { $0 = (failure, Date()) }
            self.logger.notice(
                "no Kerberos token for the server",
                metadata: ["host": "\(challenger.host)", "kind": "\(failure.kind.rawValue)", "detail": "\(failure.detail)"]
            )
        }
    }
}

extension Duration {
    /// Whole milliseconds, for messages.
    fileprivate var milliseconds: Int64 {
        let (seconds, attoseconds) = self.components
        return seconds * 1000 + attoseconds / 1_000_000_000_000_000
    }
}
