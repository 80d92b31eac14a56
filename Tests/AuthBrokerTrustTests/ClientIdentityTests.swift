import AuthBrokerCore
import AuthBrokerTrust
import Foundation
import Testing
import TestSupport

@Suite("Client identities")
struct ClientIdentityTests {
    static let ca: TestIdentity? = try? TestPKI.makeCA(commonName: "Client CA")

    func identity(
        _ name: String, hosts: [String], addedAt: Date = .now, notBefore: Date = .now - 3600, notAfter: Date = .now + 86400
    ) throws -> ClientIdentity {
        let ca = try #require(Self.ca)
        let client = try TestPKI.makeClient(commonName: name, issuer: ca, notBefore: notBefore, notAfter: notAfter)
        return try ClientIdentity(
            name: name, chainDER: [client.der, ca.der], hosts: hosts.map { try pattern($0) }, addedAt: addedAt
        )
    }

    @Test(
        "names: plain ones are accepted, others refused with what to write",
        arguments: [
            ("work-laptop", true), ("a", true), ("A.b_c-9", true), ("", false), ("has space", false),
            ("semi;colon", false), ("ünïcode", false), (String(repeating: "x", count: 65), false),
            (String(repeating: "x", count: 64), true), ("../etc", false),
        ]
    )
    func names(name: String, valid: Bool) {
        if valid {
            #expect(throws: Never.self) { try ClientIdentity.validate(name: name) }
        } else {
            #expect(throws: TrustStoreError.self) { try ClientIdentity.validate(name: name) }
        }
    }

    @Test("without a requested name: the most specific unexpired match, newest on a tie, none when none matches")
    func automaticChoice() throws {
        let broad = try identity("broad", hosts: ["*.corp.test"], addedAt: .now - 100)
        let narrow = try identity("narrow", hosts: ["*.api.corp.test"], addedAt: .now - 200)
        let exact = try identity("exact", hosts: ["db.api.corp.test"], addedAt: .now - 300)
        let expired = try identity("expired", hosts: ["x.corp.test"], notAfter: .now - 10)
        let older = try identity("older", hosts: ["*.corp.test"], addedAt: .now - 1000)
        let onlyNamed = try identity("only-named", hosts: [])
        let all = [broad, narrow, exact, expired, older, onlyNamed]
        #expect(try ClientIdentity.choose(from: all, host: "db.api.corp.test", requested: nil, now: .now)?.name == "exact")
        #expect(try ClientIdentity.choose(from: all, host: "web.api.corp.test", requested: nil, now: .now)?.name == "narrow")
        #expect(try ClientIdentity.choose(from: all, host: "www.corp.test", requested: nil, now: .now)?.name == "broad")
        #expect(try ClientIdentity.choose(from: all, host: "x.corp.test", requested: nil, now: .now)?.name == "broad")
        #expect(try ClientIdentity.choose(from: all, host: "elsewhere.test", requested: nil, now: .now) == nil)
        #expect(try ClientIdentity.choose(from: [], host: "x.corp.test", requested: nil, now: .now) == nil)
    }

    @Test("a requested name must exist, fit the host and be valid now; it fails closed otherwise")
    func requestedChoice() throws {
        let scoped = try identity("scoped", hosts: ["*.corp.test"])
        let anywhere = try identity("anywhere", hosts: [])
        let expired = try identity("expired", hosts: [], notAfter: .now - 10)
        let all = [scoped, anywhere, expired]
        #expect(try ClientIdentity.choose(from: all, host: "a.corp.test", requested: "scoped", now: .now)?.name == "scoped")
        #expect(try ClientIdentity.choose(from: all, host: "other.test", requested: "anywhere", now: .now)?.name == "anywhere")
        expectCode("identity_not_for_host") {
            _ = try ClientIdentity.choose(from: all, host: "other.test", requested: "scoped", now: .now)
        }
        expectCode("unknown_identity") {
            _ = try ClientIdentity.choose(from: all, host: "a.corp.test", requested: "nope", now: .now)
        }
        expectCode("identity_expired") {
            _ = try ClientIdentity.choose(from: all, host: "a.corp.test", requested: "expired", now: .now)
        }
    }

    @Test("the store keeps identities across reopening; duplicates need replace; removal names what is missing")
    func persistence() throws {
        let directory = try TemporaryDirectory()
        defer { directory.cleanUp() }
        let path = directory.file("state/trust.json")
        let store = try TrustStore(path: path)
        let first = try identity("laptop", hosts: ["*.corp.test"])
        let generation = store.generation
        try store.addIdentity(first, replace: false)
        #expect(store.generation != generation)
        expectCode("identity_exists") { try store.addIdentity(first, replace: false) }
        let renewed = try identity("laptop", hosts: ["*.corp.test", "vpn.test"])
        try store.addIdentity(renewed, replace: true)

        let reopened = try TrustStore(path: path)
        #expect(reopened.identities() == store.identities())
        #expect(reopened.identities().map(\.name) == ["laptop"])
        #expect(reopened.identities().first?.chainDER == renewed.chainDER)
        #expect(reopened.identities().first?.hosts == renewed.hosts)
        #expect(try reopened.removeIdentity(name: "laptop").name == "laptop")
        #expect(reopened.identities().isEmpty)
        expectCode("unknown_identity") { _ = try reopened.removeIdentity(name: "laptop") }
    }

    @Test("an automatic choice holds until the identities change or one's validity starts or ends")
    func automaticChoiceHolds() throws {
        let directory = try TemporaryDirectory()
        defer { directory.cleanUp() }
        let store = try TrustStore(path: directory.file("state/trust.json"))
        let none = store.automaticClientIdentity(for: "db.corp.test")
        #expect(none.identity == nil)
        #expect(none.validUntil == .distantFuture)
        #expect(none.holds(in: store))

        let now = Date.now
        let later = try identity("later", hosts: ["*.corp.test"], notBefore: now + 600, notAfter: now + 7200)
        try store.addIdentity(later, replace: false)
        #expect(!none.holds(in: store), "a change to the identities ends it")

        let waiting = store.automaticClientIdentity(for: "db.corp.test", now: now)
        #expect(waiting.identity == nil, "not valid yet")
        // The certificate's own times (X.509 keeps whole seconds).
        let validFrom = later.certificate.notBefore, validTo = later.certificate.notAfter
        #expect(waiting.validUntil == validFrom)
        #expect(waiting.holds(in: store, at: validFrom - 1))
        #expect(!waiting.holds(in: store, at: validFrom))

        let active = store.automaticClientIdentity(for: "db.corp.test", now: validFrom)
        #expect(active.identity?.name == "later")
        #expect(active.validUntil == validTo, "it holds until the identity expires")
        #expect(store.automaticClientIdentity(for: "elsewhere.test", now: validFrom).identity == nil)
        #expect(ClientIdentity.nextValidityChange(in: [later], after: validTo) == nil, "nothing changes after the last boundary")
    }

    @Test("a store file written before identities existed still opens")
    func olderFile() throws {
        let directory = try TemporaryDirectory()
        defer { directory.cleanUp() }
        let path = directory.file("trust.json")
        try #"{"version":1,"anchors":[],"pins":[]}"#.write(toFile: path, atomically: true, encoding: .utf8)
        #expect(try TrustStore(path: path).identities().isEmpty)
    }
}

/// Runs `body`, which must throw a `TrustStoreError` with `code` and a non-empty message.
func expectCode(_ code: String, sourceLocation: SourceLocation = #_sourceLocation, _ body: () throws -> Void) {
    do {
        try body()
        Issue.record("expected the error \(code), got success", sourceLocation: sourceLocation)
    } catch let error as TrustStoreError {
        #expect(error.code == code, sourceLocation: sourceLocation)
        #expect(!error.message.isEmpty, sourceLocation: sourceLocation)
    } catch {
        Issue.record("expected a TrustStoreError, got \(error)", sourceLocation: sourceLocation)
    }
}
