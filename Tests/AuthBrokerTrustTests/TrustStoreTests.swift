import AuthBrokerCore
import AuthBrokerTrust
import Foundation
import TestSupport
import Testing

@Suite("TrustStore")
struct TrustStoreTests {
    @Test("anchors are added, listed, replaced and removed by id prefix")
    func addListRemove() throws {
        let directory = try TemporaryDirectory()
        defer { directory.cleanUp() }
        let store = try TrustStore(path: directory.file("trust.json"))
        #expect(store.anchors().isEmpty)
        let generation0 = store.generation

        let ca = try TestPKI.makeCA(commonName: "A CA")
        let added = try store.addAnchors(pem: ca.pem, hosts: [pattern("*.a.test")])
        #expect(added.count == 1)
        let anchor = try #require(added.first)
        #expect(anchor.id == ca.sha256Fingerprint.replacingOccurrences(of: ":", with: "").lowercased())
        #expect(anchor.der == ca.der)
        #expect(anchor.certificate.isCA)
        #expect(anchor.certificate.subject.contains("CN=A CA"))
        #expect(anchor.pem.hasPrefix("-----BEGIN CERTIFICATE-----"))
        #expect(store.anchors() == [anchor])
        #expect(store.generation > generation0)

        // Adding it again replaces the host list and returns it.
        let again = try store.addAnchors(pem: ca.pem, hosts: [])
        #expect(again.map(\.id) == [anchor.id])
        #expect(again.first?.hosts == [])
        #expect(store.anchors().count == 1)

        // Removing by a colon-separated, upper-case prefix of the fingerprint.
        let removed = try store.removeAnchor(idPrefix: String(ca.sha256Fingerprint.prefix(11)))
        #expect(removed.id == anchor.id)
        #expect(store.anchors().isEmpty)
    }

    @Test("several certificates in one PEM are all added")
    func bundle() throws {
        let directory = try TemporaryDirectory()
        defer { directory.cleanUp() }
        let store = try TrustStore(path: directory.file("trust.json"))
        let a = try TestPKI.makeCA(commonName: "A")
        let b = try TestPKI.makeCA(commonName: "B")
        let added = try store.addAnchors(pem: "leading text\n" + a.pem + "\n" + b.pem + a.pem, hosts: [])
        #expect(added.map(\.der) == [a.der, b.der])
        #expect(store.anchors().count == 2)
    }

    @Test("removing: unknown prefix, ambiguous prefix, bad prefix")
    func removeErrors() throws {
        let directory = try TemporaryDirectory()
        defer { directory.cleanUp() }
        let store = try TrustStore(path: directory.file("trust.json"))
        // Fewer than 8 hex digits, or not hex at all, is refused before any lookup.
        #expect(throws: TrustStoreError.self) { try store.removeAnchor(idPrefix: "abc") }
        do {
            _ = try store.removeAnchor(idPrefix: "abc")
        } catch {
            #expect(error.code == "invalid_prefix")
        }
        do {
            _ = try store.removeAnchor(idPrefix: "zzzzzzzzzz")
        } catch {
            #expect(error.code == "invalid_prefix")
        }
        do {
            _ = try store.removeAnchor(idPrefix: "0123456789abcdef")
            Issue.record("removing an absent anchor succeeded")
        } catch {
            #expect(error.code == "not_found")
            #expect(error.message.contains("0123456789abcdef"))
        }
    }

    @Test("an ambiguous prefix lists the candidates")
    func ambiguous() throws {
        let directory = try TemporaryDirectory()
        defer { directory.cleanUp() }
        let path = directory.file("trust.json")
        let a = try TestPKI.makeCA(commonName: "A")
        let b = try TestPKI.makeCA(commonName: "B")
        // Ids that share 8 digits cannot be made on purpose (they are SHA-256 values), so the
        // test uses the longest prefix the two real ids share: ambiguous if that reaches 8 digits,
        // otherwise 8 digits must pick exactly one anchor.
        let store = try TrustStore(path: path)
        let added = try store.addAnchors(pem: a.pem + b.pem, hosts: [])
        let ids = added.map(\.id)
        let shared = zip(ids[0], ids[1]).prefix { $0 == $1 }.count
        if shared >= 8 {
            do {
                _ = try store.removeAnchor(idPrefix: String(ids[0].prefix(shared)))
                Issue.record("ambiguous prefix removed an anchor")
            } catch {
                #expect(error.code == "ambiguous")
                #expect(error.message.contains(ids[0]) && error.message.contains(ids[1]))
            }
        } else {
            // Distinct 8-digit prefixes each remove exactly their own anchor.
            #expect(try store.removeAnchor(idPrefix: String(ids[1].prefix(8))).id == ids[1])
            #expect(store.anchors().map(\.id) == [ids[0]])
        }
    }

    @Test("anchors and pins persist across instances, with mode 0600 and a 0700 directory")
    func persistence() throws {
        let directory = try TemporaryDirectory()
        defer { directory.cleanUp() }
        let path = directory.file("state/authbroker/trust.json")
        let ca = try TestPKI.makeCA(commonName: "Persisted CA")
        let first = try TrustStore(path: path)
        let anchors = try first.addAnchors(pem: ca.pem, hosts: [pattern("*.p.test"), pattern("192.0.2.1")])
        let pin = try first.addPin(host: pattern("p.test"), spkiSHA256: ca.spkiSHA256)

        let second = try TrustStore(path: path)
        #expect(second.anchors() == anchors)
        #expect(second.pins() == [pin])
        #expect(second.path == path)

        let fileMode = try #require(FileManager.default.attributesOfItem(atPath: path)[.posixPermissions] as? NSNumber)
        #expect(fileMode.intValue & 0o777 == 0o600)
        let dirMode = try #require(
            FileManager.default.attributesOfItem(atPath: directory.file("state/authbroker"))[.posixPermissions]
                as? NSNumber
        )
        #expect(dirMode.intValue & 0o777 == 0o700)
        // No temporary files left behind.
        let files = try FileManager.default.contentsOfDirectory(atPath: directory.file("state/authbroker"))
        #expect(files == ["trust.json"])
    }

    @Test(
        "a corrupt store file is an error naming the file and the fix",
        arguments: [
            "not json",
            "{}",
            #"{"version": 99, "anchors": [], "pins": []}"#,
            #"{"version": 1, "anchors": [{"id": "00", "pem": "x", "hosts": [], "added_at": "2024-01-01T00:00:00Z"}], "pins": []}"#,
            #"{"version": 1, "anchors": [], "pins": [{"host": "http://x", "spki_sha256": "AAAA", "added_at": "2024-01-01T00:00:00Z"}]}"#,
        ]
    )
    func corruptFile(contents: String) throws {
        let directory = try TemporaryDirectory()
        defer { directory.cleanUp() }
        let path = directory.file("trust.json")
        try contents.write(toFile: path, atomically: true, encoding: .utf8)
        do {
            _ = try TrustStore(path: path)
            Issue.record("a corrupt store opened")
        } catch {
            #expect(error.code == "corrupt_file")
            #expect(error.message.contains(path))
            #expect(error.message.contains("Move it aside"))
        }
    }

    @Test("a missing file is an empty store")
    func missingFile() throws {
        let directory = try TemporaryDirectory()
        defer { directory.cleanUp() }
        let store = try TrustStore(path: directory.file("none/trust.json"))
        #expect(store.anchors().isEmpty && store.pins().isEmpty)
    }

    @Test(
        "hostile PEM inputs are refused with a clear error",
        arguments: [
            ("", "not_a_certificate"),
            ("garbage that is not PEM at all", "not_a_certificate"),
            ("-----BEGIN CERTIFICATE-----\nMIIB\n", "invalid_certificate"),
            ("-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n", "invalid_certificate"),
            ("-----BEGIN CERTIFICATE-----\nMAMCAQE=\n-----END CERTIFICATE-----\n", "invalid_certificate"),
            ("-----BEGIN PRIVATE KEY-----\nMAMCAQE=\n-----END PRIVATE KEY-----\n", "not_a_certificate"),
            (String(repeating: "A", count: (1 << 20) + 1), "input_too_large"),
        ]
    )
    func hostilePEM(input: String, code: String) throws {
        let directory = try TemporaryDirectory()
        defer { directory.cleanUp() }
        let store = try TrustStore(path: directory.file("trust.json"))
        do {
            _ = try store.addAnchors(pem: input, hosts: [])
            Issue.record("hostile input was accepted")
        } catch {
            #expect(error.code == code, "\(error.message)")
        }
        #expect(store.anchors().isEmpty)
        #expect(store.generation == 0)
        #expect(!FileManager.default.fileExists(atPath: directory.file("trust.json")))
    }

    @Test("a truncated certificate and a private key alone are refused")
    func truncatedAndKeyOnly() throws {
        let directory = try TemporaryDirectory()
        defer { directory.cleanUp() }
        let store = try TrustStore(path: directory.file("trust.json"))
        let ca = try TestPKI.makeCA(commonName: "T")
        let truncated = String(ca.pem.prefix(ca.pem.count / 2))
        #expect(throws: TrustStoreError.self) { try store.addAnchors(pem: truncated, hosts: []) }

        let body = ca.pem.split(separator: "\n").dropFirst().dropLast()
        let shortBody =
            "-----BEGIN CERTIFICATE-----\n" + body.dropLast().joined(separator: "\n") + "\n-----END CERTIFICATE-----\n"
        do {
            _ = try store.addAnchors(pem: shortBody, hosts: [])
            Issue.record("a truncated certificate was accepted")
        } catch {
            #expect(error.code == "invalid_certificate")
        }
        do {
            _ = try store.addAnchors(pem: ca.privateKeyPEM, hosts: [])
            Issue.record("a private key was accepted as an anchor")
        } catch {
            #expect(error.code == "not_a_certificate")
            #expect(error.message.contains("PRIVATE KEY"))
        }
        // A combined file (key + certificate) yields the certificate only.
        let added = try store.addAnchors(pem: ca.privateKeyPEM + ca.pem, hosts: [])
        #expect(added.map(\.der) == [ca.der])
    }

    @Test("pins: add (idempotent), curl form, remove, bad values")
    func pinsLifecycle() throws {
        let directory = try TemporaryDirectory()
        defer { directory.cleanUp() }
        let store = try TrustStore(path: directory.file("trust.json"))
        let ca = try TestPKI.makeCA(commonName: "P")
        let host = try pattern("*.pin.test")
        let pin = try store.addPin(host: host, spkiSHA256: "sha256//" + ca.spkiSHA256)
        #expect(pin.spkiSHA256 == ca.spkiSHA256)
        let generation = store.generation
        #expect(try store.addPin(host: host, spkiSHA256: ca.spkiSHA256) == pin)
        #expect(store.generation == generation)
        #expect(store.pins() == [pin])

        for bad in ["", "abc", "AAAA", String(repeating: "A", count: 1000), ca.sha256Fingerprint] {
            do {
                _ = try store.addPin(host: host, spkiSHA256: bad)
                Issue.record("pin \(bad) accepted")
            } catch {
                #expect(error.code == "invalid_pin")
            }
        }
        let otherHost = try pattern("other.test")
        do {
            _ = try store.removePin(host: otherHost, spkiSHA256: ca.spkiSHA256)
            Issue.record("removed an absent pin")
        } catch {
            #expect(error.code == "not_found")
        }
        #expect(try store.removePin(host: host, spkiSHA256: ca.spkiSHA256) == pin)
        #expect(store.pins().isEmpty)
    }

    @Test("anchors encode to JSON with PEM and decode back")
    func anchorJSON() throws {
        let ca = try TestPKI.makeCA(commonName: "J")
        let anchor = try TrustAnchor(
            der: ca.der,
            hosts: [pattern("j.test")],
            addedAt: Date(timeIntervalSince1970: 1_700_000_000)
        )
        let data = try BrokerJSON.encoder().encode(anchor)
        let text = try #require(String(data: data, encoding: .utf8))
        #expect(text.contains("BEGIN CERTIFICATE"))
        #expect(text.contains(#""hosts":["j.test"]"#))
        #expect(try BrokerJSON.decoder().decode(TrustAnchor.self, from: data) == anchor)
    }
}
