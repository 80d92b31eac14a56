import AuthBrokerCore
import AuthBrokerDaemon
import AuthBrokerTrust
import FuzzDaemonSupport
import FuzzSupport
import NIOHTTP1

/// Fuzzes the client identity import (`ClientIdentities.importIdentity`): PKCS#12 and PEM
/// (certificate chain and private key, encrypted or not) through NIOSSL/BoringSSL, the check
/// that the key belongs to the leaf, the X.509 parsing of the chain and the store written after.
///
/// Input: the first byte chooses the form (bit 0: PKCS#12 or PEM) and the passphrase (bit 1:
/// `test` or none); the rest is the file. In PEM form it is given as both the chain and the key,
/// as a combined `cert+key.pem` file would be. Each input gets a fresh trust store and key store.
///
/// Invariants: an accepted identity is in the store, reads back from its file, and its key is
/// in the key store; every refusal is a 4xx problem (bad input), never an internal error.
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzIdentityImport(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let bytes = UnsafeRawBufferPointer(start: data, count: size)
    guard let mode = bytes.first else { return 0 }
    let file = Array(bytes.dropFirst())
    let passphrase: [UInt8]? = mode & 2 != 0 ? Array("test".utf8) : nil
    let input: IdentityImport =
        mode & 1 == 0
        ? .pkcs12(data: file, passphrase: passphrase ?? [])
        : .pem(chain: file, key: file, passphrase: passphrase)

    scratch.reset()
    let path = scratch.file("trust.json")
    guard let store = try? TrustStore(path: path) else {
        Fuzz.check(false, "an empty trust store did not open")
        return 0
    }
    let keys = MemoryKeyStore()
    let identities = ClientIdentities(store: store, keys: keys)
    let outcome: Result<ClientIdentity, BrokerError> = Fuzz.runBlocking {
        do {
            return .success(try await identities.importIdentity(name: "fuzz", hosts: [], replace: false, from: input))
        } catch let error as BrokerError {
            return .failure(error)
        } catch {
            return .failure(BrokerError.internalError("not a BrokerError: \(error)"))
        }
    }
    switch outcome {
    case .success(let identity):
        Fuzz.check(store.identities().map(\.name) == [identity.name], "the imported identity is not in the store")
        Fuzz.check((try? keys.key(name: identity.name)) != nil, "the imported identity's key is not in the key store")
        let reopened = try? TrustStore(path: path)
        Fuzz.check(reopened?.identities() == store.identities(), "the identity read back differs from the one imported")
    case .failure(let error):
        Fuzz.check((400..<500).contains(error.status.code), "import refused with \(error.status.code) \(error.code)")
    }
    return 0
}

private let scratch = ScratchDirectory(label: "fuzz-identity-import")
