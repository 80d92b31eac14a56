import AuthBrokerCore
import AuthBrokerDaemon
import AuthBrokerTrust
import Foundation
import NIOCore
import NIOHTTP1
import Testing
import TestSupport

/// The control API's routing, validation and error bodies, against a real trust store on disk
/// (no socket: the router is a function of the request).
@Suite("Control API")
struct ControlAPITests {
    let directory: String
    let api: ControlAPI

    init() throws {
        self.directory = try DaemonProcess.makeTemporaryDirectory()
        let store = try TrustStore(path: self.directory + "/trust.json")
        self.api = ControlAPI(
            store: store, vault: PasswordVault(),
            status: {
                StatusReport(
                    version: "0.1.0", pid: 1, startedAt: Date(timeIntervalSince1970: 0), uptimeSeconds: 1,
                    socket: "/s", configFile: "/c", configLoaded: false, stateDirectory: "/d",
                    systemAnchors: .init(path: "/etc/ssl/certs/ca-certificates.crt", count: 0),
                    userAnchors: store.anchors().count, pins: store.pins().count, counters: ["requests_total": 3]
                )
            },
            inspect: { origin in
                throw BrokerError.connectionRefused(origin: origin)
            }
        )
    }

    func call(_ method: HTTPMethod, _ path: String, query: String? = nil, json: [String: Any]? = nil) async -> (ControlResponse, [String: Any]) {
        let body = json.map { ByteBuffer(bytes: (try? JSONSerialization.data(withJSONObject: $0)) ?? Data()) } ?? ByteBuffer()
        let response = await self.api.handle(method: method, path: path, query: query, body: body, requestID: "r1")
        let object = (try? JSONSerialization.jsonObject(with: Data(response.body.readableBytesView))) as? [String: Any] ?? [:]
        return (response, object)
    }

    @Test("status reports version, pid and counters")
    func status() async {
        let (response, object) = await self.call(.GET, "/v1/status")
        #expect(response.status == .ok)
        #expect(object["version"] as? String == "0.1.0")
        #expect((object["counters"] as? [String: Int])?["requests_total"] == 3)
    }

    @Test("anchors: add with hosts, list, remove by prefix; errors for bad input")
    func anchors() async throws {
        let ca = try TestPKI.makeCA(commonName: "Control CA")
        let (added, addedBody) = await self.call(.POST, "/v1/anchors", json: ["pem": ca.pem, "hosts": ["*.corp.test"]])
        #expect(added.status == .created)
        let anchor = try #require((addedBody["anchors"] as? [[String: Any]])?.first)
        #expect(anchor["hosts"] as? [String] == ["*.corp.test"])
        let id = try #require(anchor["id"] as? String)
        #expect((anchor["certificate"] as? [String: Any])?["sha256"] as? String == ca.sha256Fingerprint)

        let (_, listed) = await self.call(.GET, "/v1/anchors")
        #expect((listed["anchors"] as? [[String: Any]])?.count == 1)

        let (removed, _) = await self.call(.DELETE, "/v1/anchors/" + String(id.prefix(12)))
        #expect(removed.status == .ok)
        let (missing, missingBody) = await self.call(.DELETE, "/v1/anchors/" + String(id.prefix(12)))
        #expect(missing.status == .notFound)
        #expect(missingBody["code"] as? String == "not_found")
    }

    @Test(
        "bad requests are problem+json with a code",
        arguments: [
            ("POST", "/v1/anchors", #"{"pem": "not a certificate"}"#, 400),
            ("POST", "/v1/anchors", #"{"hosts": ["x"]}"#, 400),
            ("POST", "/v1/anchors", #"{"pem": "x", "hosts": ["https://bad/"]}"#, 400),
            ("POST", "/v1/pins", #"{"host": "a.test", "spki_sha256": "short"}"#, 400),
            ("POST", "/v1/inspect", #"{"url": "http://plain.test/"}"#, 400),
            ("POST", "/v1/inspect", #"{"url": "https://x.test/"}"#, 502),
            ("PUT", "/v1/status", "{}", 405),
            ("GET", "/v1/nothing", "", 404),
        ]
    )
    func badRequests(method: String, path: String, json: String, status: Int) async {
        let response = await self.api.handle(
            method: HTTPMethod(rawValue: method), path: path, query: nil, body: ByteBuffer(string: json), requestID: "r"
        )
        let object = (try? JSONSerialization.jsonObject(with: Data(response.body.readableBytesView))) as? [String: Any] ?? [:]
        #expect(Int(response.status.code) == status)
        #expect(response.headers.first(name: "Content-Type") == "application/problem+json")
        #expect((object["code"] as? String)?.isEmpty == false)
        #expect((object["detail"] as? String)?.isEmpty == false)
    }
    @Test("invalid JSON is refused with a message, not a crash")
    func invalidJSON() async {
        let response = await self.api.handle(
            method: .POST, path: "/v1/anchors", query: nil, body: ByteBuffer(string: "{not json"), requestID: "r"
        )
        #expect(response.status == .badRequest)
    }
}
