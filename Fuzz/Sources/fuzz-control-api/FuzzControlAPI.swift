import AuthBrokerCore
import AuthBrokerDaemon
import AuthBrokerTrust
import Foundation
import FuzzDaemonSupport
import FuzzSupport
import Logging
import NIOCore
import NIOHTTP1

/// Fuzzes the control API's request handling: routing, the JSON decoding of every body
/// (`passwords`, `anchors`, `pins`, `identities`, `inspect`, agent answers, `reauth`
/// answers), and the validation after it, through `ControlAPI.handle`, the function the daemon
/// calls for every origin-form request.
///
/// Input: the first line is `METHOD /v1/path?query`, the rest the body. Each input gets a fresh
/// trust store, password vault and challenge broker, so a crash reproduces from its input alone.
///
/// Invariants: no input is an internal error (500); every answer body is JSON, and every
/// refusal a problem with a `code`.
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzControlAPI(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let bytes = UnsafeRawBufferPointer(start: data, count: size)
    let (requestLine, body) = Fuzz.splitFirstLine(bytes)
    guard body.count <= ControlAPI.maxBodyBytes else { return 0 }  // The connection refuses larger bodies first.
    let parts = requestLine.split(separator: " ", maxSplits: 1)
    guard parts.count == 2 else { return 0 }
    let method = HTTPMethod(rawValue: String(parts[0]))
    // The connection routes only origin-form targets under /v1 here.
    guard case .success(.control(let path, let query)) = RequestTarget.parse(method: method.rawValue, uri: String(parts[1])) else {
        return 0
    }

    scratch.reset()
    guard let store = try? TrustStore(path: scratch.file("trust.json")) else {
        Fuzz.check(false, "an empty trust store did not open")
        return 0
    }
    let vault = PasswordVault()
    let evaluator = TrustEvaluator(
        systemAnchorsPath: scratch.file("no-bundle.pem"), store: store, cacheSize: 8, cacheTTL: .seconds(60), logger: logger
    )
    let api = ControlAPI(
        store: store, vault: vault,
        challenges: AgentChallenges(vault: vault, store: store, evaluator: evaluator, logger: logger),
        identities: ClientIdentities(store: store, keys: MemoryKeyStore()),
        status: {
            StatusReport(
                version: "fuzz", pid: 1, startedAt: Date(timeIntervalSince1970: 0), uptimeSeconds: 0, socket: "/s",
                configFile: "/c", configLoaded: false, stateDirectory: "/d",
                systemAnchors: .init(path: "/etc/ssl/certs/ca-certificates.crt", count: 0),
                userAnchors: 0, pins: 0, counters: [:]
            )
        },
        inspect: { origin in throw BrokerError.connectionRefused(origin: origin) }
    )
    let buffer = ByteBuffer(bytes: body)
    let response = Fuzz.runBlocking {
        await api.handle(method: method, path: path, query: query, body: buffer, requestID: "fuzz")
    }

    let answer = Data(response.body.readableBytesView)
    let object = try? JSONSerialization.jsonObject(with: answer)
    Fuzz.check(object != nil, "the answer to \(method.rawValue) \(path) is not JSON")
    if response.status.code >= 400 {
        let code = (object as? [String: Any])?["code"] as? String
        Fuzz.check(code?.isEmpty == false, "a refusal without a code")
        Fuzz.check(response.status != .internalServerError, "internal error for \(method.rawValue) \(path): \(code ?? "?")")
    }
    return 0
}

private let scratch = ScratchDirectory(label: "fuzz-control-api")
private let logger = Logger(label: "fuzz", factory: { _ in SwiftLogNoOpLogHandler() })
