import AuthBrokerCore
import AuthBrokerTrust
import Foundation
import NIOConcurrencyHelpers
import NIOCore
import NIOHTTP1
import NIOPosix
import NIOSSL

/// Where identities' private keys live: the secret store (see `SecretStoreIdentityKeys`).
/// Calls may block on a keyring; `ClientIdentities` makes them on the blocking thread pool.
package protocol IdentityKeyStore: Sendable {
    func storeKey(name: String, material: [UInt8]) throws
    func key(name: String) throws -> [UInt8]?
    func removeKey(name: String) throws
}

/// The private part of an identity as imported: the PKCS#12 file, or the PEM key, with the
/// passphrase it was protected by. Kept whole in the secret store (which is what protects it);
/// the daemon never re-encodes a key.
struct IdentityKeyMaterial: Codable {
    enum Format: String, Codable {
        case pkcs12
        case pem
    }
    var format: Format
    var data: [UInt8]
    var passphrase: [UInt8]?

    /// The private key, for a TLS handshake.
    func privateKey() throws -> NIOSSLPrivateKey {
        switch self.format {
        case .pkcs12:
            return try NIOSSLPKCS12Bundle(buffer: self.data, passphrase: self.passphrase ?? []).privateKey
        case .pem:
            guard let passphrase = self.passphrase else { return try NIOSSLPrivateKey(bytes: self.data, format: .pem) }
            return try NIOSSLPrivateKey(bytes: self.data, format: .pem) { setter in setter(passphrase) }
        }
    }
}

/// What `POST /v1/identities` imports.
package enum IdentityImport: Sendable {
    case pkcs12(data: [UInt8], passphrase: [UInt8])
    /// A PEM chain (leaf first) and a PEM private key, encrypted when `passphrase` is given.
    case pem(chain: [UInt8], key: [UInt8], passphrase: [UInt8]?)
}

/// The user's client identities: public part in the trust store, private key in the secret
/// store; presents them in TLS handshakes as `ClientIdentitySource`.
package final class ClientIdentities: ClientIdentitySource {
    private let store: TrustStore
    private let keys: any IdentityKeyStore
    private let pool: NIOThreadPool

    package init(store: TrustStore, keys: any IdentityKeyStore, pool: NIOThreadPool = .singleton) {
        self.store = store
        self.keys = keys
        self.pool = pool
    }

    /// Largest PKCS#12 or PEM input read.
    package static let maxImportBytes = 1 << 20

    /// Imports an identity: checks that the key opens and matches the leaf certificate, stores
    /// the key, then the public part.
    package func importIdentity(
        name: String, hosts: [HostPattern], replace: Bool, from input: IdentityImport
    ) async throws -> ClientIdentity {
        let (chain, material) = try Self.parse(input)
        let chainDER = try chain.map { try $0.toDERBytes() }
        let identity: ClientIdentity
        do {
            identity = try ClientIdentity(name: name, chainDER: chainDER, hosts: hosts, addedAt: Date())
        } catch {
            throw BrokerError.badRequest(code: BrokerErrorCode(error.kind), detail: error.message)
        }
        if !replace, self.store.identities().contains(where: { $0.name == name }) {
            throw BrokerError(
                code: .identityExists, status: .conflict, title: "Identity exists",
                detail: "A client identity named '\(name)' exists already. Choose another --name, or remove it first with `authbrokerctl identities remove \(name)`."
            )
        }
        let encoded = try JSONEncoder().encode(material)
        try await self.blocking { try self.keys.storeKey(name: name, material: Array(encoded)) }
        do {
            try self.store.addIdentity(identity, replace: replace)
        } catch {
            try? await self.blocking { try self.keys.removeKey(name: name) }
            throw BrokerError.badRequest(code: BrokerErrorCode(error.kind), detail: error.message)
        }
        return identity
    }

    package func remove(name: String) async throws -> ClientIdentity {
        let removed: ClientIdentity
        do {
            removed = try self.store.removeIdentity(name: name)
        } catch {
            throw BrokerError(code: BrokerErrorCode(error.kind), status: .notFound, title: "No such identity", detail: error.message)
        }
        try await self.blocking { try self.keys.removeKey(name: name) }
        return removed
    }

    /// What was imported, for `identities export` (behind the PAM gate): the PKCS#12 file as it
    /// was, or the PEM chain followed by the PEM key as imported (encrypted if it was).
    package func export(name: String) async throws -> (format: String, data: [UInt8], passphrase: [UInt8]?) {
        guard let identity = self.store.identities().first(where: { $0.name == name }) else {
            throw BrokerError(
                code: .unknownIdentity, status: .notFound, title: "No such identity",
                detail: "There is no client identity named '\(name.prefix(80))'. `authbrokerctl identities list` shows the ones there are."
            )
        }
        let material = try await self.material(name: name)
        switch material.format {
        case .pkcs12: return (material.format.rawValue, material.data, material.passphrase)
        case .pem: return (material.format.rawValue, Array(identity.chainPEM.utf8) + material.data, material.passphrase)
        }
    }

    // MARK: - ClientIdentitySource

    package func material(named name: String) async throws -> ClientIdentityMaterial {
        guard let identity = self.store.identities().first(where: { $0.name == name }) else {
            throw BrokerError.internalError("The client identity '\(name)' was removed while a request was using it.")
        }
        let material = try await self.material(name: name)
        let chain = try identity.chainDER.map { try NIOSSLCertificate(bytes: $0, format: .der) }
        return ClientIdentityMaterial(chain: chain, privateKey: try material.privateKey(), version: identity.certificate.sha256)
    }

    private func material(name: String) async throws -> IdentityKeyMaterial {
        guard let bytes = try await self.blocking({ try self.keys.key(name: name) }) else {
            throw BrokerError(
                code: .identityKeyMissing, status: .badGateway, proxyErrorType: .proxyInternalError,
                title: "The identity's key is missing",
                detail: "The private key of the client identity '\(name)' is not in the secret store (was it deleted there?). Import the identity again."
            )
        }
        do {
            return try JSONDecoder().decode(IdentityKeyMaterial.self, from: Data(bytes))
        } catch {
            throw BrokerError.internalError("The stored key of the client identity '\(name)' cannot be read; import the identity again.")
        }
    }

    // MARK: - Parsing

    /// Whether BoringSSL refused a key or PKCS#12 file for its passphrase. Its error text (codes,
    /// source paths of the build) is never shown: it says nothing a user can act on.
    static func wrongPassphrase(_ error: any Error) -> Bool {
        let text = "\(error)"
        return text.contains("INCORRECT_PASSWORD") || text.contains("BAD_DECRYPT") || text.contains("bad decrypt")
    }

    /// The chain (leaf first) and the key material; the pair must make a TLS identity.
    static func parse(_ input: IdentityImport) throws -> ([NIOSSLCertificate], IdentityKeyMaterial) {
        let chain: [NIOSSLCertificate]
        let material: IdentityKeyMaterial
        switch input {
        case .pkcs12(let data, let passphrase):
            guard data.count <= Self.maxImportBytes else { throw Self.invalid("The PKCS#12 file is larger than \(Self.maxImportBytes) bytes.") }
            do {
                chain = try NIOSSLPKCS12Bundle(buffer: data, passphrase: passphrase).certificateChain
            } catch {
                throw Self.invalid(
                    Self.wrongPassphrase(error)
                        ? "The PKCS#12 file's passphrase is not the one given. Give the right one (--passphrase-stdin), or check it with `openssl pkcs12 -in FILE -noout`."
                        : "The file could not be read as PKCS#12 (it is not one, or uses a form BoringSSL does not read). Convert it: `openssl pkcs12 -in FILE -nodes` shows what it holds."
                )
            }
            material = IdentityKeyMaterial(format: .pkcs12, data: data, passphrase: passphrase)
        case .pem(let chainPEM, let keyPEM, let passphrase):
            guard chainPEM.count <= Self.maxImportBytes, keyPEM.count <= Self.maxImportBytes else {
                throw Self.invalid("The PEM input is larger than \(Self.maxImportBytes) bytes.")
            }
            do {
                chain = try NIOSSLCertificate.fromPEMBytes(chainPEM)
            } catch {
                throw Self.invalid("The certificate file holds no PEM certificate (-----BEGIN CERTIFICATE-----): \(error).")
            }
            material = IdentityKeyMaterial(format: .pem, data: keyPEM, passphrase: passphrase)
        }
        guard let leaf = chain.first else { throw Self.invalid("The input holds no certificate.") }
        let key: NIOSSLPrivateKey
        do {
            key = try material.privateKey()
        } catch {
            throw Self.invalid(
                Self.wrongPassphrase(error)
                    ? "The private key's passphrase is not the one given; give the right one (--passphrase-stdin)."
                    : "The private key could not be read. If it is encrypted, give its passphrase; a PEM key starts with -----BEGIN PRIVATE KEY----- (or an older RSA/EC form)."
            )
        }
        // BoringSSL checks that the key belongs to the leaf when a context is made with both.
        var configuration = TLSConfiguration.makeClientConfiguration()
        configuration.certificateChain = chain.map { .certificate($0) }
        configuration.privateKey = .privateKey(key)
        guard (try? NIOSSLContext(configuration: configuration)) != nil, (try? leaf.extractPublicKey()) != nil else {
            throw Self.invalid("The private key does not belong to the certificate (the first certificate must be yours, not a CA's).")
        }
        return (chain, material)
    }

    private static func invalid(_ detail: String) -> BrokerError {
        BrokerError.badRequest(code: .invalidIdentity, detail: detail)
    }

    /// Runs a call that may block (a keyring look-up) on the blocking pool, never on an event
    /// loop or the cooperative pool.
    private func blocking<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
        try await self.pool.runIfActive(body)
    }
}
