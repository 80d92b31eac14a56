import AuthBrokerCore
import AuthBrokerTrust
import Foundation
import Logging
import NIOHTTP1
import NIOPosix
import NIOSSL
import X509

#if canImport(Glibc)
import Glibc
#endif

/// The user's local CA as the daemon keeps it: made on first need, its key in the secret store
/// (beside client identity keys, never written anywhere else), its certificate and the CA
/// bundle programs are pointed at (`authbrokerctl env`) in the state directory; and the TLS
/// contexts of the leaves it mints for intercepted hosts, kept in memory until they near expiry.
package actor LocalCA {
    /// Where its public files are.
    package struct Files: Sendable {
        /// The CA certificate alone (PEM): `NODE_EXTRA_CA_CERTS`, `ca export`.
        package var certificate: String
        /// The system anchors and the CA (PEM): `SSL_CERT_FILE`, `REQUESTS_CA_BUNDLE` and the like.
        package var bundle: String
        package var systemAnchors: String

        package init(stateDirectory: String, systemAnchors: String) {
            self.certificate = (stateDirectory as NSString).appendingPathComponent("local-ca.pem")
            self.bundle = (stateDirectory as NSString).appendingPathComponent("ca-bundle.pem")
            self.systemAnchors = systemAnchors
        }
    }

    /// The key's name in the secret store, under the identity schema: `@` is not allowed in an
    /// identity's name, so no identity can take it.
    static let keyName = "@local-ca"
    /// Leaf contexts kept; past this the cache starts over (a user intercepts a few hosts).
    static let maxLeafContexts = 1024

    package let files: Files
    private let keys: any IdentityKeyStore
    private let owner: String
    private let logger: Logger
    private var loading: Task<LocalCertificateAuthority, any Error>?
    private let leafKey = LocalCertificateAuthority.LeafKey()
    private var leafContexts: [String: (context: NIOSSLContext, renewAfter: Date)] = [:]
    /// Leaves minted in this run, and the time they took (signing the leaf and making its TLS
    /// context), for `GET /v1/ca` and the bench.
    package private(set) var leavesMinted = 0
    package private(set) var mintingTime: Duration = .zero

    package init(files: Files, keys: any IdentityKeyStore, owner: String = LocalCA.ownerName(), logger: Logger) {
        self.files = files
        self.keys = keys
        self.owner = owner
        self.logger = logger
    }

    /// `alice@laptop`: whose CA it is, for its name.
    package static func ownerName() -> String {
        var buffer = [UInt8](repeating: 0, count: 256)
        let host = gethostname(&buffer, buffer.count - 1) == 0 ? String(decoding: buffer.prefix { $0 != 0 }, as: UTF8.self) : "localhost"
        let user = getpwuid(getuid()).flatMap { $0.pointee.pw_name.map { String(validatingCString: $0) } } ?? nil
        return "\(user ?? "uid \(getuid())")@\(host)"
    }

    /// The CA, read or made on first need.
    package func authority() async throws(BrokerError) -> LocalCertificateAuthority {
        if self.loading == nil {
            let (files, keys, owner, logger) = (self.files, self.keys, self.owner, self.logger)
            self.loading = Task {
                try await NIOThreadPool.singleton.runIfActive {
                    try Self.readOrMake(files: files, keys: keys, owner: owner, logger: logger)
                }
            }
        }
        do {
            // A non-optional force: set just above when it was nil.
            return try await self.loading!.value
        } catch {
            // Tried again at the next need (the keyring may be unlocked by then).
            self.loading = nil
            throw Self.unavailable(error)
        }
    }

    /// Replaces the CA with a new one: programs must be given the new bundle (the path stays).
    package func rotate() async throws(BrokerError) -> LocalCertificateAuthority {
        let (files, keys, owner, logger) = (self.files, self.keys, self.owner, self.logger)
        let made: LocalCertificateAuthority
        do {
            made = try await NIOThreadPool.singleton.runIfActive {
                try Self.make(files: files, keys: keys, owner: owner, logger: logger, why: "rotated on request")
            }
        } catch {
            throw Self.unavailable(error)
        }
        self.loading = Task { made }
        self.leafContexts.removeAll()
        return made
    }

    /// The server side of an intercepted connection to `host` (canonical): a leaf for it, minted
    /// now or kept from earlier, offering HTTP/1.1 by ALPN.
    package func serverContext(for host: String) async throws(BrokerError) -> NIOSSLContext {
        let now = Date()
        if let kept = self.leafContexts[host], now < kept.renewAfter { return kept.context }
        let ca = try await self.authority()
        let started = ContinuousClock.now
        do {
            let leaf = try ca.mintLeaf(for: host, key: self.leafKey, now: now)
            var configuration = TLSConfiguration.makeServerConfiguration(
                certificateChain: [.certificate(try NIOSSLCertificate(bytes: CertificateDigests.derBytes(leaf), format: .der))],
                privateKey: .privateKey(try NIOSSLPrivateKey(bytes: Array(self.leafKey.pemRepresentation.utf8), format: .pem))
            )
            configuration.applicationProtocols = ["http/1.1"]
            configuration.minimumTLSVersion = .tlsv12
            let context = try NIOSSLContext(configuration: configuration)
            if self.leafContexts.count >= Self.maxLeafContexts { self.leafContexts.removeAll() }
            // Renewed halfway through its life, so a program never meets an expired one.
            let renewAfter = leaf.notValidBefore + (leaf.notValidAfter.timeIntervalSince(leaf.notValidBefore)) / 2
            self.leafContexts[host] = (context, renewAfter)
            self.leavesMinted += 1
            self.mintingTime += ContinuousClock.now - started
            return context
        } catch {
            throw BrokerError.internalError("Minting a certificate for \(host) from the local CA failed: \(error)")
        }
    }

    private static func unavailable(_ error: any Error) -> BrokerError {
        BrokerError(
            code: .localCAUnavailable, status: .serviceUnavailable, proxyErrorType: .proxyInternalError,
            title: "The local CA cannot be used",
            detail: "The local CA (which intercepting https:// for a host you hold something for, and `authbrokerctl ca`, need) cannot be used: \(Self.sentence("\(error)")) Fix that (`authbrokerctl status` shows the secret store) and try again; meanwhile `[proxy] tunnel` lets a host through untouched."
        )
    }

    /// `text` ending with a full stop, once.
    private static func sentence(_ text: String) -> String {
        text.hasSuffix(".") ? text : text + "."
    }

    // MARK: On the blocking pool

    private static func readOrMake(files: Files, keys: any IdentityKeyStore, owner: String, logger: Logger) throws -> LocalCertificateAuthority {
        let certificate = try PrivateFiles.readOwnedFile(files.certificate, what: "the local CA certificate", maxBytes: 64 * 1024)
        let key: [UInt8]?
        do {
            key = try keys.key(name: Self.keyName)
        } catch {
            throw LocalCAError("its key cannot be read from the secret store: \(error)")
        }
        let why: String
        switch (certificate, key) {
        case (nil, nil):
            why = "first need"
        case (let certificate?, let key?):
            do {
                let ca = try LocalCertificateAuthority(certificatePEM: String(decoding: certificate, as: UTF8.self), keyMaterial: key)
                guard Date() < ca.certificate.notValidAfter - 30 * 86_400 else {
                    return try Self.make(files: files, keys: keys, owner: owner, logger: logger, why: "the old one expires within 30 days")
                }
                // The system anchors may have changed since the bundle was written.
                try Self.writeBundle(ca, files: files, logger: logger)
                return ca
            } catch let error as LocalCAError {
                why = error.description
            }
        case (_?, nil):
            why = "its key is gone from the secret store"
        case (nil, _?):
            why = "its certificate file \(files.certificate) is gone"
        }
        return try Self.make(files: files, keys: keys, owner: owner, logger: logger, why: why)
    }

    private static func make(files: Files, keys: any IdentityKeyStore, owner: String, logger: Logger, why: String) throws -> LocalCertificateAuthority {
        let ca = try LocalCertificateAuthority.make(owner: owner)
        do {
            try keys.storeKey(name: Self.keyName, material: ca.keyMaterial)
        } catch {
            throw LocalCAError("its key cannot be stored in the secret store: \(error)")
        }
        do {
            try AtomicFile.write(Array(ca.pem.utf8), to: files.certificate)
        } catch {
            throw LocalCAError("its certificate cannot be written to \(files.certificate): \(error.description)")
        }
        try Self.writeBundle(ca, files: files, logger: logger)
        logger.notice(
            "made a new local CA for interception",
            metadata: ["reason": "\(why)", "sha256": "\(ca.info.sha256)", "bundle": "\(files.bundle)"]
        )
        return ca
    }

    /// The system anchors, then the CA: one file for programs that take a single bundle.
    private static func writeBundle(_ ca: LocalCertificateAuthority, files: Files, logger: Logger) throws {
        var bundle: [UInt8] = []
        if let system = FileManager.default.contents(atPath: files.systemAnchors) {
            bundle = Array(system)
            if bundle.last != UInt8(ascii: "\n") { bundle.append(UInt8(ascii: "\n")) }
        } else {
            logger.warning(
                "the system anchors cannot be read; the CA bundle for programs holds the local CA only",
                metadata: ["path": "\(files.systemAnchors)"]
            )
        }
        bundle += Array("# AuthBroker local CA (authbrokerctl ca show)\n".utf8) + Array(ca.pem.utf8) + [UInt8(ascii: "\n")]
        do {
            try AtomicFile.write(bundle, to: files.bundle)
        } catch {
            throw LocalCAError("the CA bundle cannot be written to \(files.bundle): \(error.description)")
        }
    }
}
