import AuthBrokerSecrets
import Foundation
import Testing

/// The behaviour every SecretStore backend must have, run against each of them.
@Suite("SecretStore contract")
struct SecretStoreContractTests {
    @Test(arguments: Backend.contract)
    func storeLookupDelete(backend: Backend) throws {
        let fixture = try StoreFixture(backend)
        let store = fixture.store
        let attributes = ["server": fixture.host, "user": "alice", "protocol": "https"]
        #expect(try store.lookup(kind: .password, attributes: attributes) == nil)
        try store.store(kind: .password, attributes: attributes, label: "alice at \(fixture.host)", secret: SecretValue("hunter2"))
        #expect(try store.lookup(kind: .password, attributes: attributes)?.stringValue() == "hunter2")
        #expect(try store.delete(kind: .password, attributes: attributes) == 1)
        #expect(try store.lookup(kind: .password, attributes: attributes) == nil)
        #expect(try store.delete(kind: .password, attributes: attributes) == 0)
    }

    @Test(arguments: Backend.contract)
    func storeReplacesTheItemWithTheSameAttributes(backend: Backend) throws {
        let fixture = try StoreFixture(backend)
        let store = fixture.store
        let attributes = ["server": fixture.host, "user": "alice"]
        try store.store(kind: .password, attributes: attributes, label: "first", secret: SecretValue("one"))
        try store.store(kind: .password, attributes: attributes, label: "second", secret: SecretValue("two"))
        #expect(try store.lookup(kind: .password, attributes: attributes)?.stringValue() == "two")
        let listed = try store.list(kind: .password, matching: ["server": fixture.host])
        #expect(listed == [SecretItemMetadata(kind: .password, attributes: attributes, label: "second")])
    }

    @Test(arguments: Backend.contract)
    func lookupMatchesCarriedAttributesAndPrefersTheExactItem(backend: Backend) throws {
        let fixture = try StoreFixture(backend)
        let store = fixture.store
        let short = ["server": fixture.host, "user": "alice"]
        let long = ["server": fixture.host, "user": "alice", "protocol": "https"]
        try store.store(kind: .password, attributes: short, label: "short", secret: SecretValue("short"))
        try store.store(kind: .password, attributes: long, label: "long", secret: SecretValue("long"))
        #expect(try store.lookup(kind: .password, attributes: short)?.stringValue() == "short")
        #expect(try store.lookup(kind: .password, attributes: long)?.stringValue() == "long")
        #expect(try store.lookup(kind: .password, attributes: ["server": fixture.host, "user": "bob"]) == nil)
        #expect(try store.lookup(kind: .password, attributes: ["server": fixture.host, "protocol": "https"])?.stringValue() == "long")
        #expect(try store.list(kind: .password, matching: ["server": fixture.host]).count == 2)
        #expect(try store.delete(kind: .password, attributes: ["server": fixture.host]) == 2)
        #expect(try store.list(kind: .password, matching: ["server": fixture.host]).isEmpty)
    }

    @Test("an attribute named absent excludes the items that carry it, in lookup and delete", arguments: Backend.contract)
    func absentAttributesExclude(backend: Backend) throws {
        let fixture = try StoreFixture(backend)
        let store = fixture.store
        let anyRealm = ["server": fixture.host, "user": "alice", "authtype": "http"]
        let payroll = anyRealm.merging(["domain": "Payroll"]) { $1 }
        try store.store(kind: .password, attributes: anyRealm, label: "any realm", secret: SecretValue("pw-any"))
        // Without `absent`, a search by the shared attributes may take either (the most recently changed).
        try store.store(kind: .password, attributes: payroll, label: "payroll", secret: SecretValue("pw-payroll"))
        let query = ["server": fixture.host, "user": "alice"]
        #expect(try store.lookup(kind: .password, attributes: query, absent: ["domain"])?.stringValue() == "pw-any")
        #expect(try store.delete(kind: .password, attributes: query, absent: ["domain"]) == 1)
        #expect(try store.lookup(kind: .password, attributes: query, absent: ["domain"]) == nil)
        #expect(try store.lookup(kind: .password, attributes: query)?.stringValue() == "pw-payroll", "the realm's item stays")
    }

    @Test("items that differ in a value stay apart whatever order they are stored in (the passwords' empty domain)", arguments: Backend.contract)
    func storeKeepsItemsThatDiffer(backend: Backend) throws {
        let fixture = try StoreFixture(backend)
        let store = fixture.store
        let payroll = ["server": fixture.host, "user": "alice", "authtype": "http", "domain": "Payroll"]
        let anyRealm = ["server": fixture.host, "user": "alice", "authtype": "http", "domain": ""]
        try store.store(kind: .password, attributes: payroll, label: "payroll", secret: SecretValue("pw-payroll"))
        try store.store(kind: .password, attributes: anyRealm, label: "any realm", secret: SecretValue("pw-any"))
        try store.store(kind: .password, attributes: payroll, label: "payroll", secret: SecretValue("pw-payroll-2"))
        #expect(try store.lookup(kind: .password, attributes: payroll)?.stringValue() == "pw-payroll-2")
        #expect(try store.lookup(kind: .password, attributes: anyRealm)?.stringValue() == "pw-any")
        #expect(try store.list(kind: .password, matching: ["server": fixture.host]).count == 2)
    }

    @Test(arguments: Backend.contract)
    func everyNetworkPasswordAttributeRoundTrips(backend: Backend) throws {
        let fixture = try StoreFixture(backend)
        let attributes = [
            "server": fixture.host, "user": "ålice", "domain": "CORP", "object": "/private/",
            "protocol": "https", "authtype": "digest", "port": "8443",
        ]
        try fixture.store.store(kind: .password, attributes: attributes, label: "all seven", secret: SecretValue("x"))
        let listed = try fixture.store.list(kind: .password, matching: ["server": fixture.host])
        #expect(listed == [SecretItemMetadata(kind: .password, attributes: attributes, label: "all seven")])
        #expect(try fixture.store.lookup(kind: .password, attributes: ["server": fixture.host, "port": "8443"])?.stringValue() == "x")
    }

    @Test(arguments: Backend.contract)
    func unicodeSecretLabelAndAttributes(backend: Backend) throws {
        let fixture = try StoreFixture(backend)
        let secret = "pässwörd 🔑 密码 \u{0301}"
        let attributes = ["server": fixture.host, "user": "José Ñúñez 山田"]
        try fixture.store.store(kind: .password, attributes: attributes, label: "Ключ 🗝", secret: SecretValue(secret))
        #expect(try fixture.store.lookup(kind: .password, attributes: attributes)?.stringValue() == secret)
        #expect(try fixture.store.list(kind: .password, matching: attributes).map(\.label) == ["Ключ 🗝"])
    }

    @Test(arguments: Backend.contract)
    func emptySecret(backend: Backend) throws {
        let fixture = try StoreFixture(backend)
        let attributes = ["name": fixture.name]
        try fixture.store.store(kind: .identityKey, attributes: attributes, label: "empty", secret: SecretValue(bytes: []))
        let found = try fixture.store.lookup(kind: .identityKey, attributes: attributes)
        #expect(found != nil)
        #expect(found?.count == 0)
    }

    @Test(arguments: Backend.contract)
    func largeBinarySecret(backend: Backend) throws {
        let fixture = try StoreFixture(backend)
        var secret = randomBytes(64 * 1024)
        secret[0] = 0
        secret[100] = 0  // NULs inside must survive
        let attributes = ["name": fixture.name]
        try fixture.store.store(kind: .identityKey, attributes: attributes, label: "big key", secret: SecretValue(bytes: secret))
        #expect(bytes(of: try fixture.store.lookup(kind: .identityKey, attributes: attributes)) == secret)
    }

    @Test(arguments: Backend.contract)
    func kindsAreSeparate(backend: Backend) throws {
        let fixture = try StoreFixture(backend)
        try fixture.store.store(kind: .identityKey, attributes: ["name": fixture.name], label: "key", secret: SecretValue("k"))
        try fixture.store.store(kind: .password, attributes: ["server": fixture.host], label: "pw", secret: SecretValue("p"))
        let passwords = try fixture.store.list(kind: .password, matching: [:])
        #expect(passwords.allSatisfy { $0.kind == .password && $0.attributes["name"] == nil })
        #expect(passwords.contains { $0.attributes["server"] == fixture.host })
        let identities = try fixture.store.list(kind: .identityKey, matching: [:])
        #expect(identities.contains(SecretItemMetadata(kind: .identityKey, attributes: ["name": fixture.name], label: "key")))
        #expect(identities.allSatisfy { $0.attributes["server"] == nil })
    }

    @Test(arguments: Backend.contract)
    func listNeverReturnsSecrets(backend: Backend) throws {
        let fixture = try StoreFixture(backend)
        let secret = "list-must-not-show-this-\(UUID())"
        try fixture.store.store(kind: .password, attributes: ["server": fixture.host, "user": "u"], label: "label", secret: SecretValue(secret))
        let listed = try fixture.store.list(kind: .password, matching: ["server": fixture.host])
        #expect(listed.count == 1)
        var dumped = ""
        dump(listed, to: &dumped)
        #expect(!"\(listed)".contains(secret))
        #expect(!dumped.contains(secret))
    }

    @Test(arguments: Backend.contract)
    func invalidInputIsRejectedAndErrorsNeverContainTheSecret(backend: Backend) throws {
        let fixture = try StoreFixture(backend)
        let secretText = "error-must-not-show-this-\(UUID())"
        let secret = SecretValue(secretText)
        let attempts: [(String, () throws(SecretStoreError) -> Void)] = [
            ("no attributes", { () throws(SecretStoreError) in try fixture.store.store(kind: .password, attributes: [:], label: "x", secret: secret) }),
            ("unknown attribute", { () throws(SecretStoreError) in
                try fixture.store.store(kind: .password, attributes: ["server": fixture.host, "username": "v"], label: "x", secret: secret)
            }),
            ("identity attribute on a password", { () throws(SecretStoreError) in
                try fixture.store.store(kind: .password, attributes: ["name": fixture.name], label: "x", secret: secret)
            }),
            ("port not a number", { () throws(SecretStoreError) in
                try fixture.store.store(kind: .password, attributes: ["server": fixture.host, "port": "https"], label: "x", secret: secret)
            }),
            ("port not canonical", { () throws(SecretStoreError) in
                try fixture.store.store(kind: .password, attributes: ["server": fixture.host, "port": "0443"], label: "x", secret: secret)
            }),
            ("NUL in the label", { () throws(SecretStoreError) in
                try fixture.store.store(kind: .password, attributes: ["server": fixture.host], label: "a\u{0}b", secret: secret)
            }),
            ("secret too large", { () throws(SecretStoreError) in
                try fixture.store.store(
                    kind: .identityKey, attributes: ["name": fixture.name], label: "x",
                    secret: SecretValue(bytes: [UInt8](repeating: 0x41, count: SecretStoreLimits.maxSecretBytes + 1))
                )
            }),
            ("delete everything", { () throws(SecretStoreError) in _ = try fixture.store.delete(kind: .password, attributes: [:]) }),
        ]
        for (what, attempt) in attempts {
            do throws(SecretStoreError) {
                try attempt()
                Issue.record("\(what): expected invalid_input, but it succeeded")
            } catch {
                #expect(error == .invalidInput, "\(what)")
                #expect(!error.message.contains(secretText), "\(what)")
                #expect(!"\(error)".contains(secretText), "\(what)")
                #expect(!error.message.isEmpty)
            }
        }
        #expect(try fixture.store.list(kind: .password, matching: ["server": fixture.host]).isEmpty)
    }
}

@Suite("SecretValue")
struct SecretValueTests {
    @Test func descriptionsAndMirrorAreRedacted() {
        let value = SecretValue("correct horse battery staple")
        #expect("\(value)" == "<redacted 28 bytes>")
        #expect(String(reflecting: value).contains("redacted"))
        #expect(!String(reflecting: value).contains("horse"))
        var dumped = ""
        dump(value, to: &dumped)
        #expect(!dumped.contains("horse"))
        #expect(Mirror(reflecting: value).children.allSatisfy { !"\($0.value)".contains("horse") })
        struct Holder { var password: SecretValue }
        #expect(!"\(Holder(password: value))".contains("horse"))
    }

    @Test func bytesAndComparison() {
        let value = SecretValue(bytes: [0, 1, 2, 255])
        #expect(bytes(of: value) == [0, 1, 2, 255])
        #expect(value.count == 4)
        #expect(value.stringValue() == nil)  // 0xff is not UTF-8
        #expect(value.isEqual(to: SecretValue(bytes: [0, 1, 2, 255])))
        #expect(!value.isEqual(to: SecretValue(bytes: [0, 1, 2, 254])))
        #expect(!value.isEqual(to: SecretValue(bytes: [0, 1, 2])))
        #expect(SecretValue(bytes: []).isEmpty)
        #expect(SecretValue(bytes: [0xff, 0xfe]).stringValue() == nil)
    }

    @Test func wipeZeroesBytes() {
        var buffer: [UInt8] = [1, 2, 3, 4]
        SecretValue.wipe(&buffer)
        #expect(buffer == [0, 0, 0, 0])
    }
}
