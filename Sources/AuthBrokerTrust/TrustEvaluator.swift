import AuthBrokerCore
import Crypto
import Foundation
import Logging
import SwiftASN1
import NIOConcurrencyHelpers
@_spi(FixedExpiryValidationTime) import X509

/// Decides whether a server's certificate chain is trusted for a host.
///
/// The root store for a host is the system roots plus the user's anchors that apply to it.
/// Validation is swift-certificates' `Verifier` with `RFC5280Policy` at `now`, then our stricter
/// server rules (`ServerNamePolicy` instead of swift-certificates' `ServerIdentityPolicy`,
/// `ServerUsagePolicy`, `ExactValidityPolicy`, `StrongSignaturePolicy`); NIOSSL's custom verification callback
/// skips BoringSSL's own checks, so this is the only check the chain gets. Pins then restrict
/// the validated chain further. An exact-certificate exception for the host (and port) trusts the
/// leaf it names despite any failure but a pin's. Decisions are cached per (chain, host, port,
/// store generation).
package final class TrustEvaluator: Sendable {
    /// Most certificates a chain may have; real chains have 2 to 4.
    package static let maxChainLength = 16
    /// Largest DER certificate looked at.
    package static let maxCertificateBytes = 64 << 10

    private let systemAnchorsPath: String
    private let store: TrustStore
    private let logger: Logger
    private let systemRoots: NIOLockedValueBox<SystemRoots>
    /// The system bundle as last loaded (through symlinks: distributions link it), to notice
    /// an update (`reloadSystemAnchorsIfChanged`).
    private let systemBundleStamp: NIOLockedValueBox<FileStamp?>
    /// A wildcard name over one of these (`*.co.uk`) makes a server certificate unfit.
    private let publicSuffixes: PublicSuffixList

    /// The system bundle, indexed once per load rather than once per evaluation.
    struct SystemRoots: Sendable {
        var count: Int
        var store: CertificateStore
        var criticalExtensions: Set<ASN1ObjectIdentifier>

        init(_ certificates: [Certificate]) {
            self.count = certificates.count
            self.store = CertificateStore(certificates)
            self.criticalExtensions = TrustEvaluator.criticalExtensions(of: certificates)
        }
    }
    private let cache: NIOLockedValueBox<DecisionCache>

    /// `systemAnchorsPath`: a PEM bundle such as `/etc/ssl/certs/ca-certificates.crt`. A missing
    /// or unreadable bundle is logged and leaves only the user's anchors (see `systemAnchorCount`).
    package init(
        systemAnchorsPath: String, store: TrustStore, cacheSize: Int, cacheTTL: Duration,
        publicSuffixes: PublicSuffixList = .defaultRuleOnly, logger: Logger
    ) {
        self.systemAnchorsPath = systemAnchorsPath
        self.publicSuffixes = publicSuffixes
        self.store = store
        self.logger = logger
        self.systemBundleStamp = NIOLockedValueBox(Self.stamp(ofBundle: systemAnchorsPath))
        self.systemRoots = NIOLockedValueBox(SystemRoots(Self.loadSystemAnchors(path: systemAnchorsPath, logger: logger)))
        self.cache = NIOLockedValueBox(DecisionCache(capacity: max(0, cacheSize), ttl: cacheTTL))
    }

    /// How many system roots were loaded (0 when the bundle is missing: worth showing in status).
    /// Bumps on every change to the user's anchors or pins. A connection verified under an
    /// older generation must not be reused: its chain might no longer be trusted.
    package var storeGeneration: UInt64 { self.store.generation }

    package var systemAnchorCount: Int {
        self.systemRoots.withLockedValue { $0.count }
    }

    /// Reads the system bundle again (after a distribution update), forgets cached decisions,
    /// and bumps the store's generation: a pooled connection verified under a root the update
    /// removed is not reused.
    package func reloadSystemAnchors() {
        let stamp = Self.stamp(ofBundle: self.systemAnchorsPath)
        let roots = SystemRoots(Self.loadSystemAnchors(path: self.systemAnchorsPath, logger: self.logger))
        self.systemBundleStamp.withLockedValue { $0 = stamp }
        // A bundle found missing or empty (an update caught in the middle, say) keeps the roots
        // there were: dropping every system root would fail every request. The next change of
        // the file is read again (its stamp is remembered, so not once a second meanwhile).
        guard roots.count > 0 || self.systemRoots.withLockedValue({ $0.count == 0 }) else { return }
        self.systemRoots.withLockedValue { $0 = roots }
        self.cache.withLockedValue { $0.removeAll() }
        self.store.invalidate()
    }

    /// `reloadSystemAnchors` when the bundle's file changed since it was last loaded (the daemon
    /// asks once a second); whether it did.
    @discardableResult
    package func reloadSystemAnchorsIfChanged() -> Bool {
        let now = Self.stamp(ofBundle: self.systemAnchorsPath)
        guard self.systemBundleStamp.withLockedValue({ $0 != now }) else { return false }
        self.reloadSystemAnchors()
        return true
    }

    private static func stamp(ofBundle path: String) -> FileStamp? {
        FileStamp.of(path: URL(fileURLWithPath: path).resolvingSymlinksInPath().path)
    }

    /// Evaluates `chainDER` (leaf first, as the server sent it) for `host`.
    ///
    /// `host`: canonical (lower-case DNS name, or IP literal without brackets); `port`: the
    /// server's port (nil: unknown, so only exceptions for any port apply). Fails closed:
    /// anything that cannot be parsed or checked is a failure.
    package func evaluate(chainDER: [[UInt8]], host: String, port: Int? = nil, now: Date = Date()) async -> TrustDecision {
        guard !chainDER.isEmpty else {
            return TrustDecision(
                isTrusted: false,
                failures: [.malformedCertificate("The server presented no certificate.")],
                chain: [],
                fromCache: false
            )
        }
        guard chainDER.count <= Self.maxChainLength else {
            return TrustDecision(
                isTrusted: false,
                failures: [
                    .malformedCertificate(
                        "The server presented \(chainDER.count) certificates; at most \(Self.maxChainLength) are accepted."
                    )
                ],
                chain: [],
                fromCache: false
            )
        }
        var certificates: [Certificate] = []
        var infos: [CertificateInfo] = []
        for (index, der) in chainDER.enumerated() {
            let position = index == 0 ? "The server's certificate" : "Certificate \(index + 1) of the server's chain"
            guard der.count <= Self.maxCertificateBytes else {
                return TrustDecision(
                    isTrusted: false,
                    failures: [
                        .malformedCertificate(
                            "\(position) is \(der.count) bytes, more than the \(Self.maxCertificateBytes) accepted."
                        )
                    ],
                    chain: infos,
                    fromCache: false
                )
            }
            do {
                let certificate = try Certificate(derEncoded: der)
                certificates.append(certificate)
                infos.append(CertificateInfo(certificate, der: der))
            } catch {
                // swift-certificates cannot parse what it cannot verify (MD5, MD2): say why.
                let weak = StrongSignaturePolicy.weakAlgorithmName(derEncoded: der).map {
                    TrustFailure.weakSignature(certificate: position, algorithm: $0)
                }
                return TrustDecision(
                    isTrusted: false,
                    failures: [weak ?? .malformedCertificate("\(position) could not be parsed: \(error).")],
                    chain: infos,
                    fromCache: false
                )
            }
        }

        let snapshot = self.store.snapshot(now: now)
        let key = DecisionCache.Key(
            chainDigest: Self.chainDigest(chainDER),
            host: host,
            port: port,
            generation: snapshot.generation
        )
        let clockNow = ContinuousClock.now
        if var cached = self.cache.withLockedValue({ $0.lookup(key, now: now, clockNow: clockNow) }) {
            cached.fromCache = true
            self.log(cached, host: host)
            return cached
        }

        var failures = await self.decide(certificates: certificates, host: host, now: now, snapshot: snapshot)
        let leafSHA256 = infos[0].sha256
        let excepted =
            !failures.isEmpty
            && snapshot.exceptions.contains { $0.covers(host: host, port: port, leafSHA256: leafSHA256) }
        if excepted {
            // The user trusts exactly this certificate from this server; a pin still restricts
            // it, matched only by certificates that signed their way down to the leaf: nothing
            // else is checked here, and any certificate carrying the pinned key could be appended.
            failures = Self.pinFailures(chain: Self.signedPrefix(certificates), host: host, pins: snapshot.pins)
        }
        var decision = TrustDecision(isTrusted: failures.isEmpty, failures: failures, chain: infos, fromCache: false)
        decision.byException = excepted && failures.isEmpty
        let validFrom = certificates.map(\.notValidBefore).max() ?? now
        let validUntil = certificates.map(\.notValidAfter).min() ?? now
        self.cache.withLockedValue {
            $0.insert(decision, for: key, validFrom: validFrom, validUntil: validUntil, clockNow: clockNow)
        }
        self.log(decision, host: host)
        return decision
    }

    private func log(_ decision: TrustDecision, host: String) {
        self.logger.debug(
            "server trust evaluated",
            metadata: [
                "host": "\(host)",
                "leaf_sha256": "\(decision.chain.first?.sha256 ?? "-")",
                "trusted": "\(decision.isTrusted)",
                "failures": "\(decision.failures.map(\.code).joined(separator: ","))",
                "by_exception": "\(decision.byException)",
                "cached": "\(decision.fromCache)",
            ]
        )
    }

    // MARK: - Deciding

    private func decide(
        certificates: [Certificate],
        host: String,
        now: Date,
        snapshot: TrustStore.Snapshot
    ) async -> [TrustFailure] {
        guard let leaf = certificates.first else {
            return [.malformedCertificate("The server presented no certificate.")]
        }
        let intermediates = CertificateStore(certificates.dropFirst())
        let systemRoots = self.systemRoots.withLockedValue { $0 }
        let inScope = snapshot.anchors.filter { $0.anchor.applies(to: host) }
        // A server's own certificate anchored is trusted as itself (below), never as the issuer
        // of another, though `openssl req -x509` marks it CA:TRUE by default (its key, often
        // shared by every unit of an appliance, would vouch for any host).
        let issuingInScope = inScope.filter { !Self.isServersOwn($0.certificate) }
        let outOfScope = snapshot.anchors.filter {
            !$0.anchor.applies(to: host) && (!Self.isServersOwn($0.certificate) || $0.certificate == leaf)
        }
        let scopedRoots = systemRoots.store.appending(contentsOf: issuingInScope.map(\.certificate))
        let criticalExtensions = Array(
            systemRoots.criticalExtensions.union(
                Self.criticalExtensions(of: certificates + snapshot.anchors.map(\.certificate))
            )
        )

        var failures: [TrustFailure] = []
        if inScope.contains(where: { $0.certificate == leaf }) {
            // The user trusts this exact certificate: RFC5280Policy would refuse it as a root
            // when it is not marked CA (most self-signed server certificates), so check what
            // still matters for it: its validity period and its names.
            // The user trusts the certificate, not any use of it: usage and name rules still hold.
            failures += Self.timeFailures(of: [leaf], now: now)
            failures += ServerUsagePolicy.failures(chain: [leaf], leafIsAnchor: true)
            if let inconsistent = ServerNamePolicy.consistencyFailure(leaf, publicSuffixes: self.publicSuffixes) {
                failures.insert(inconsistent, at: 0)
            } else if ServerNamePolicy.nameFailure(leaf, host: host) != nil {
                failures.insert(Self.hostnameMismatch(leaf, host: host), at: 0)
            }
            if failures.isEmpty {
                failures += Self.pinFailures(chain: [leaf], host: host, pins: snapshot.pins)
            }
            return failures
        }

        // Bounded work before any name-constraint check (see `maxNameConstraintChecks`).
        let constraintWork = CertificateProfilePolicy.nameConstraintWork(leaf: leaf, authorities: Array(certificates.dropFirst()))
        guard constraintWork <= CertificateProfilePolicy.maxNameConstraintChecks else {
            return [
                .malformedCertificate(
                    "The server's chain would need \(constraintWork) name-constraint comparisons (its names times its CAs' constraints), more than the \(CertificateProfilePolicy.maxNameConstraintChecks) the broker does; no real server needs that many."
                )
            ]
        }
        let userRoots = issuingInScope.map(\.certificate)
        var verifier = Verifier(rootCertificates: scopedRoots) {
            RFC5280Policy(fixedExpiryValidationTime: now)
            CertificateProfilePolicy(userRoots: userRoots)
            ExactValidityPolicy(now: now)
            ServerNamePolicy(host: host, publicSuffixes: self.publicSuffixes)
            ServerUsagePolicy()
            StrongSignaturePolicy()
        }
        let result = await verifier.validate(leaf: leaf, intermediates: intermediates)
        let verifierReasons: [String]
        switch result {
        case .validCertificate(let chain):
            return Self.pinFailures(chain: Array(chain), host: host, pins: snapshot.pins)
        case .couldNotValidate(let policyFailures):
            verifierReasons = policyFailures.map(\.policyFailureReason.description)
        }

        // Classify: which of the usual reasons explains the failure?
        var timeChain = certificates
        if let path = await Self.findPath(
            leaf: leaf,
            intermediates: intermediates,
            roots: scopedRoots,
            criticalExtensions: criticalExtensions
        ) {
            timeChain = Array(path)
            let judgeRoot = timeChain.count > 1 && timeChain.last.map { userRoots.contains($0) } == true
            failures += CertificateProfilePolicy.failures(chain: timeChain, judgeRoot: judgeRoot)
            failures += CertificateProfilePolicy.verifierRefusalsInWords(chain: timeChain)
        } else {
            var allPath: [Certificate]? = nil
            if !outOfScope.isEmpty {
                allPath = await Self.findPath(
                    leaf: leaf,
                    intermediates: intermediates,
                    roots: scopedRoots.appending(contentsOf: outOfScope.map(\.certificate)),
                    criticalExtensions: criticalExtensions
                ).map(Array.init)
            }
            if let allPath, let root = allPath.last, let anchor = outOfScope.first(where: { $0.certificate == root }) {
                failures.append(.anchorOutOfScope(anchorID: anchor.anchor.id, hosts: anchor.anchor.hosts))
                timeChain = allPath
            } else if CertificateDigests.isSelfSigned(leaf) {
                failures.append(.selfSigned)
            } else if let serverAnchor = inScope.first(where: { anchor in
                Self.isServersOwn(anchor.certificate)
                    && certificates.contains { anchor.certificate.publicKey.isValidSignature($0.signature, for: $0) }
            }) {
                failures.append(
                    .unfitForServer(
                        certificate: ServerNamePolicy.describe(serverAnchor.certificate),
                        reason: "it is one of your anchors, but a server's own certificate (it names hosts and may not sign certificates), trusted as itself and never as the issuer of another"
                    )
                )
            } else {
                failures.append(.unknownIssuer(issuer: Self.topIssuer(certificates).description))
            }
        }
        // A weak signature comes first: it is the reason, even where the chain would build (SHA-1)
        // or cannot (MD5, which the verifier does not check at all). Below a found path's root;
        // else in what was presented, apart from self-signed certificates (roots).
        let signed = timeChain.count > 1 && timeChain != certificates ? Array(timeChain.dropLast()) : certificates
        failures.insert(
            contentsOf: signed.filter { !CertificateDigests.isSelfSigned($0) || $0 == leaf }.compactMap(StrongSignaturePolicy.failure(of:)),
            at: 0
        )
        // A self-signed server certificate is judged as it would be once anchored, as itself:
        // `openssl req -x509` marks it CA:TRUE by default, which does not matter then, and
        // calling it unfit would say that no anchor could help.
        // (So is one anchored for other hosts: the path found is the leaf as its own root.)
        let selfSignedLeaf = failures.contains { if case .selfSigned = $0 { true } else { false } } || timeChain.last == leaf
        failures += ServerUsagePolicy.failures(chain: timeChain, leafIsAnchor: selfSignedLeaf)
        if let inconsistent = ServerNamePolicy.consistencyFailure(leaf, publicSuffixes: self.publicSuffixes) {
            failures.append(inconsistent)
        } else if ServerNamePolicy.nameFailure(leaf, host: host) != nil {
            failures.append(Self.hostnameMismatch(leaf, host: host))
        }
        failures += Self.timeFailures(of: timeChain, now: now)
        if failures.isEmpty {
            var seen: Set<String> = []
            let unique = verifierReasons.filter { seen.insert($0).inserted }
            failures.append(
                .other(
                    unique.isEmpty
                        ? "no chain to a trusted root could be built (a certificate may carry a critical extension the broker does not understand)"
                        : unique.joined(separator: "; ")
                )
            )
        }
        // Pins say nothing about an untrusted chain, but a mismatch is worth telling too.
        failures += Self.pinFailures(chain: certificates, host: host, pins: snapshot.pins)
        return failures
    }

    /// A chain from `leaf` to one of `roots` by names and signatures alone (no time, names or
    /// constraints), or nil.
    private static func findPath(
        leaf: Certificate,
        intermediates: CertificateStore,
        roots: CertificateStore,
        criticalExtensions: [ASN1ObjectIdentifier]
    ) async -> ValidatedCertificateChain? {
        var verifier = Verifier(rootCertificates: roots) {
            AnyChainPolicy(verifyingCriticalExtensions: criticalExtensions)
        }
        if case .validCertificate(let chain) = await verifier.validate(leaf: leaf, intermediates: intermediates) {
            return chain
        }
        return nil
    }

    private static func hostnameMismatch(_ leaf: Certificate, host: String) -> TrustFailure {
        let info = CertificateInfo(leaf, der: [])
        return .hostnameMismatch(host: host, names: info.dnsNames + info.ipAddresses)
    }

    private static func timeFailures(of chain: [Certificate], now: Date) -> [TrustFailure] {
        var failures: [TrustFailure] = []
        for certificate in chain {
            let failure: TrustFailure
            if now > certificate.notValidAfter {
                failure = .expired(notAfter: certificate.notValidAfter)
            } else if now < certificate.notValidBefore {
                failure = .notYetValid(notBefore: certificate.notValidBefore)
            } else {
                continue
            }
            if !failures.contains(failure) { failures.append(failure) }
        }
        return failures
    }

    private static func pinFailures(chain: [Certificate], host: String, pins: [SPKIPin]) -> [TrustFailure] {
        let pinned = pins.filter { $0.host.matches(host) }.map(\.spkiSHA256)
        guard !pinned.isEmpty else { return [] }
        let presented = chain.map(CertificateDigests.spkiSHA256)
        if presented.contains(where: pinned.contains) { return [] }
        var seen: Set<String> = []
        return [.pinMismatch(host: host, pinned: pinned.filter { seen.insert($0).inserted }, presented: presented)]
    }

    /// Whether `certificate` is a server's own: it names hosts (a subjectAltName DNS name or IP
    /// address) and no keyUsage lets it sign certificates. A CA that names a host too (a
    /// Kubernetes cluster CA names `kubernetes`) says keyCertSign.
    static func isServersOwn(_ certificate: Certificate) -> Bool {
        guard let names = try? ServerNamePolicy.names(of: certificate), !names.dns.isEmpty || !names.ip.isEmpty else { return false }
        guard let usage = try? certificate.extensions.keyUsage else { return true }
        return !usage.keyCertSign
    }

    /// The leaf, then each certificate as long as it signed the one before it (names, dates and
    /// extensions unchecked: an exception stands for those).
    /// The signer is looked for among all that were presented (TLS 1.3 lets a server send extra
    /// certificates, in any order).
    static func signedPrefix(_ certificates: [Certificate]) -> [Certificate] {
        guard var previous = certificates.first else { return [] }
        var linked = [previous]
        var rest = Array(certificates.dropFirst())
        while let index = rest.firstIndex(where: { $0.publicKey.isValidSignature(previous.signature, for: previous) }) {
            previous = rest.remove(at: index)
            linked.append(previous)
        }
        return linked
    }

    /// The issuer name the presented chain stops at: follow issuers through what was sent.
    private static func topIssuer(_ certificates: [Certificate]) -> DistinguishedName {
        guard var current = certificates.first else { return DistinguishedName() }
        var used: Set<Int> = [0]
        while let next = certificates.indices.first(where: {
            !used.contains($0) && certificates[$0].subject == current.issuer
        }) {
            used.insert(next)
            current = certificates[next]
        }
        return current.issuer
    }

    static func criticalExtensions(of certificates: [Certificate]) -> Set<ASN1ObjectIdentifier> {
        var oids: Set<ASN1ObjectIdentifier> = []
        for certificate in certificates {
            for ext in certificate.extensions where ext.critical {
                oids.insert(ext.oid)
            }
        }
        return oids
    }

    /// SHA-256 over the length-prefixed DERs: the cache key's chain part.
    private static func chainDigest(_ chainDER: [[UInt8]]) -> [UInt8] {
        var hasher = SHA256()
        for der in chainDER {
            var length = UInt64(der.count).bigEndian
            withUnsafeBytes(of: &length) { hasher.update(bufferPointer: $0) }
            hasher.update(data: der)
        }
        return Array(hasher.finalize())
    }

    // MARK: - System anchors

    /// The certificates of a PEM bundle; unreadable blocks are skipped and counted in the log.
    static func loadSystemAnchors(path: String, logger: Logger) -> [Certificate] {
        let text: String
        do {
            text = try String(contentsOfFile: path, encoding: .utf8)
        } catch {
            logger.warning(
                "cannot read the system trust anchors; only your own anchors will be trusted",
                metadata: ["path": "\(path)", "error": "\(error.localizedDescription)"]
            )
            return []
        }
        let endMarker = "-----END CERTIFICATE-----"
        var roots: [Certificate] = []
        var skipped = 0
        for chunk in text.components(separatedBy: endMarker) where chunk.contains("-----BEGIN CERTIFICATE-----") {
            do {
                let document = try PEMDocument(pemString: chunk + endMarker)
                roots.append(try Certificate(derEncoded: document.derBytes))
            } catch {
                skipped += 1
            }
        }
        if roots.isEmpty {
            logger.warning(
                "the system trust anchor bundle holds no certificate; only your own anchors will be trusted",
                metadata: ["path": "\(path)"]
            )
        } else if skipped > 0 {
            logger.warning(
                "skipped unreadable certificates in the system trust anchor bundle",
                metadata: ["path": "\(path)", "skipped": "\(skipped)"]
            )
        }
        logger.debug("loaded system trust anchors", metadata: ["path": "\(path)", "count": "\(roots.count)"])
        return roots
    }
}

/// Refuses a chain in which any certificate but the root (trusted as itself, whatever signed it)
/// is signed with SHA-1, MD5, MD4 or MD2: CA/Browser Forum Baseline Requirements §7.1.3.2 allow
/// none of them, and browsers refuse them.
struct StrongSignaturePolicy: VerifierPolicy {
    let verifyingCriticalExtensions: [ASN1ObjectIdentifier] = []

    /// Signature algorithm OIDs refused, with their names for the error.
    static let weakAlgorithms: [ASN1ObjectIdentifier: String] = [
        [1, 2, 840, 113_549, 1, 1, 2]: "MD2 with RSA",
        [1, 2, 840, 113_549, 1, 1, 3]: "MD4 with RSA",
        [1, 2, 840, 113_549, 1, 1, 4]: "MD5 with RSA",
        [1, 2, 840, 113_549, 1, 1, 5]: "SHA-1 with RSA",
        [1, 3, 14, 3, 2, 29]: "SHA-1 with RSA",
        [1, 2, 840, 10045, 4, 1]: "ECDSA with SHA-1",
        [1, 2, 840, 10040, 4, 3]: "DSA with SHA-1",
    ]

    func chainMeetsPolicyRequirements(chain: UnverifiedCertificateChain) -> PolicyEvaluationResult {
        for certificate in chain.dropLast() {
            if case .weakSignature(let name, let algorithm)? = Self.failure(of: certificate) {
                return .failsToMeetPolicy(reason: "\(name) is signed with \(algorithm)")
            }
        }
        return .meetsPolicy
    }

    /// The failure for `certificate` when its signature algorithm is a weak one.
    static func failure(of certificate: Certificate) -> TrustFailure? {
        var serializer = DER.Serializer()
        guard (try? serializer.serialize(certificate)) != nil, let name = Self.weakAlgorithmName(derEncoded: serializer.serializedBytes)
        else { return nil }
        return .weakSignature(certificate: "The certificate '\(certificate.subject)'", algorithm: name)
    }

    /// The name of the certificate's signature algorithm if it is a weak one, read from the
    /// outer `signatureAlgorithm` (RFC 5280 §4.1.1.2) of the DER, since swift-certificates names
    /// (and parses) only the algorithms it can verify.
    static func weakAlgorithmName(derEncoded der: [UInt8]) -> String? {
        Self.signatureAlgorithmOID(derEncoded: der).flatMap { Self.weakAlgorithms[$0] }
    }

    private static func signatureAlgorithmOID(derEncoded der: [UInt8]) -> ASN1ObjectIdentifier? {
        guard let root = try? DER.parse(der), case .constructed(let parts) = root.content else { return nil }
        var iterator = parts.makeIterator()
        _ = iterator.next()  // tbsCertificate
        guard let algorithm = iterator.next(), case .constructed(let fields) = algorithm.content,
            let first = fields.first(where: { _ in true })
        else { return nil }
        return try? ASN1ObjectIdentifier(derEncoded: first)
    }
}

/// A policy that accepts any chain the Verifier can build by names and signatures, declaring
/// `verifyingCriticalExtensions` so that chain building is not stopped by them.
///
/// - Warning: Diagnostic only: it answers "is there a path to these roots at all?" and must
///   never decide trust.
struct AnyChainPolicy: VerifierPolicy {
    let verifyingCriticalExtensions: [ASN1ObjectIdentifier]

    func chainMeetsPolicyRequirements(chain: UnverifiedCertificateChain) -> PolicyEvaluationResult {
        .meetsPolicy
    }
}

/// Trust decisions by (chain, host, store generation), oldest evicted first, each kept for
/// `ttl` and never past the validity window of the chain it was made for.
struct DecisionCache {
    struct Key: Hashable {
        var chainDigest: [UInt8]
        var host: String
        var port: Int?
        var generation: UInt64
    }

    struct Entry {
        var decision: TrustDecision
        var validFrom: Date
        var validUntil: Date
        var expires: ContinuousClock.Instant
    }

    let capacity: Int
    let ttl: Duration
    private var entries: [Key: Entry] = [:]
    private var order: [Key] = []
    private var generation: UInt64 = 0

    init(capacity: Int, ttl: Duration) {
        self.capacity = capacity
        self.ttl = ttl
    }

    mutating func lookup(_ key: Key, now: Date, clockNow: ContinuousClock.Instant) -> TrustDecision? {
        guard let entry = self.entries[key] else { return nil }
        guard clockNow < entry.expires, now >= entry.validFrom, now <= entry.validUntil else {
            self.remove(key)
            return nil
        }
        return entry.decision
    }

    mutating func insert(
        _ decision: TrustDecision,
        for key: Key,
        validFrom: Date,
        validUntil: Date,
        clockNow: ContinuousClock.Instant
    ) {
        guard self.capacity > 0, self.ttl > .zero else { return }
        if key.generation != self.generation {
            // The store changed: every older decision is stale.
            self.removeAll()
            self.generation = key.generation
        }
        if self.entries[key] != nil { self.remove(key) }
        while self.order.count >= self.capacity, let oldest = self.order.first {
            self.remove(oldest)
        }
        self.entries[key] = Entry(
            decision: decision,
            validFrom: validFrom,
            validUntil: validUntil,
            expires: clockNow + self.ttl
        )
        self.order.append(key)
    }

    mutating func removeAll() {
        self.entries.removeAll()
        self.order.removeAll()
    }

    private mutating func remove(_ key: Key) {
        self.entries[key] = nil
        self.order.removeAll { $0 == key }
    }
}
