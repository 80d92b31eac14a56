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
    /// What `status` shows about the user's Kerberos credential.
    package struct CredentialReport: Sendable, Equatable {
        package var principal: String?
        package var expires: Date?
        /// "valid", "expired" or "missing".
        package var state: String
        package var detail: String?
    }

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
    /// The credential's principal, for the audit log, and when it was read: SPNEGO does not say
    /// whose a context is until it is established, and reading the cache for every token would
    /// cost a file read each.
    private let principal = NIOLockedValueBox<(name: String?, readAt: ContinuousClock.Instant)?>(nil)
    /// The user's credential, acquired once and shared by every context until one fails with it.
    private let credential = NIOLockedValueBox<GSSCredential?>(nil)
    static let principalRefresh: Duration = .seconds(60)
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
        /// The user's principal the token speaks for.
        package var principal: String?
    }

    /// A new context for `challenger` and its first token.
    package func start(for challenger: CanonicalOrigin, delegate: Bool) async -> Result<Started, KerberosFailure> {
        let lookUp = self.cnameLookup
        let principals = self.principal
        let credentials = self.credential
        let result = await self.run { () -> Result<Started, KerberosFailure> in
            let host = ServiceHost.canonical(challenger.host, lookUp: lookUp)
            // With the shared credential first; a failure may only mean it went stale (a new
            // ticket, an expired one), so the context is tried once more with a fresh one.
            var lastFailure: KerberosFailure?
            var usedShared = false
            for fresh in [false, true] where !fresh || usedShared {
                do throws(KerberosFailure) {
                    let (credential, shared) = try Self.credential(credentials, fresh: fresh)
                    usedShared = shared
                    let context = try NegotiateContext(serviceHost: host, delegate: delegate, credential: credential)
                    let step = try context.step(serverToken: nil)
                    guard let token = step.token else {
                        return .failure(KerberosFailure(.other, detail: "GSS-API made no initial token"))
                    }
                    return .success(
                        Started(context: context, authorization: NegotiatePolicy.authorization(token: token), principal: Self.principal(principals))
                    )
                } catch {
                    lastFailure = error
                }
            }
            credentials.withLockedValue { $0 = nil }
            return .failure(Self.explained(lastFailure ?? KerberosFailure(.other, detail: "no context")))
        }
        self.counts.withLockedValue { counts in
            if case .success = result { counts.contextsStarted += 1 } else { counts.failures += 1 }
        }
        self.note(result.map { _ in () }, challenger: challenger)
        return result
    }

    /// The next token of `context`, from the server's token in a 401/407; nil when the context
    /// needs no more (the server is then refusing what was sent).
    package func `continue`(_ context: NegotiateContext, serverToken: [UInt8], challenger: CanonicalOrigin) async -> Result<String?, KerberosFailure> {
        let result = await self.run { () -> Result<String?, KerberosFailure> in
            do throws(KerberosFailure) {
                let step = try context.step(serverToken: serverToken)
                return .success(step.token.map(NegotiatePolicy.authorization(token:)))
            } catch {
                return .failure(error)
            }
        }
        if case .failure = result { self.counts.withLockedValue { $0.failures += 1 } }
        self.note(result.map { _ in () }, challenger: challenger)
        return result
    }

    /// Checks a server's final token (mutual authentication) once it accepted the context.
    package func verify(_ context: NegotiateContext, serverToken: [UInt8], challenger: CanonicalOrigin) async -> Result<Void, KerberosFailure> {
        let result = await self.run { () -> Result<Void, KerberosFailure> in
            do throws(KerberosFailure) {
                _ = try context.step(serverToken: serverToken)
                return .success(())
            } catch {
                return .failure(error.kind == .other ? KerberosFailure(.mutualAuthenticationFailed, detail: error.detail) : error)
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
    package func credential() async -> CredentialReport {
        let now = Date()
        let status: KerberosCredential.Status
        do {
            status = try await NIOThreadPool.singleton.runIfActive { KerberosCredential.current() }
        } catch {
            return CredentialReport(state: "missing", detail: "the daemon is stopping")
        }
        switch status {
        case .valid(let principal, let remaining):
            return CredentialReport(principal: principal, expires: now.addingTimeInterval(TimeInterval(remaining)), state: "valid")
        case .expired(let principal):
            return CredentialReport(principal: principal, state: "expired")
        case .missing(let detail):
            return CredentialReport(state: "missing", detail: detail)
        }
    }

    // MARK: - Running off the event loops

    /// Runs `work` on the Kerberos threads; gives up waiting after `timeout`.
    private func run<T: Sendable>(_ work: @escaping @Sendable () -> Result<T, KerberosFailure>) async -> Result<T, KerberosFailure> {
        let pool = self.pool.withLockedValue { pool in
            if let pool { return pool }
            let started = NIOThreadPool(numberOfThreads: Self.threads)
            started.start()
            pool = started
            return started
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
                guard case .active = state else {
                    finish(.failure(KerberosFailure(.other, detail: "the daemon is stopping")))
                    return
                }
                finish(work())
                timer.cancel()
            }
        }
    }

    // MARK: - Helpers

    /// The shared credential, acquired when there is none or `fresh` asks for a new one. Runs on
    /// the Kerberos threads.
    private static func credential(
        _ box: NIOLockedValueBox<GSSCredential?>, fresh: Bool
    ) throws(KerberosFailure) -> (credential: GSSCredential, shared: Bool) {
        if !fresh, let shared = box.withLockedValue({ $0 }) { return (shared, true) }
        let acquired = try GSSCredential()
        box.withLockedValue { $0 = acquired }
        return (acquired, false)
    }

    /// The principal of the credential, read again when older than `principalRefresh`. Runs on
    /// the Kerberos threads.
    private static func principal(_ box: NIOLockedValueBox<(name: String?, readAt: ContinuousClock.Instant)?>) -> String? {
        let now = ContinuousClock.now
        if let cached = box.withLockedValue({ $0 }), cached.readAt.duration(to: now) < Self.principalRefresh { return cached.name }
        let name: String? =
            switch KerberosCredential.current() {
            case .valid(let principal, _): principal
            case .expired(let principal): principal
            case .missing: nil
            }
        box.withLockedValue { $0 = (name, now) }
        return name
    }

    /// A first step that failed without saying why in Kerberos terms (SPNEGO hides the
    /// mechanism's reason) is explained by the credential: none, or expired.
    private static func explained(_ failure: KerberosFailure) -> KerberosFailure {
        guard failure.kind == .other else { return failure }
        switch KerberosCredential.current() {
        case .missing(let detail): return KerberosFailure(.noTicket, detail: detail)
        case .expired(let principal): return KerberosFailure(.ticketExpired, detail: "the ticket of \(principal ?? "the default principal") has expired")
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
