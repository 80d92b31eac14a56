import Foundation
import TestSupport

/// A config file whose `[upstream] resolve` sends test host names to local origins.
func configText(resolving names: [(String, TestOrigin)], extra: String = "") -> String {
    let entries = names.map { "\"\($0.0):\($0.1.port):127.0.0.1\"" }.joined(separator: ", ")
    return """
        [upstream]
        resolve = [\(entries)]
        \(extra)
        """
}

/// Runs `body` with a started daemon, and always stops it and removes its directory.
func withDaemon<T>(
    config: String = "", directory: String? = nil, keepDirectory: Bool = false, extraEnvironment: [String: String] = [:],
    _ body: (DaemonProcess) async throws -> T
) async throws -> T {
    let daemon = try await DaemonProcess.start(config: config, directory: directory, extraEnvironment: extraEnvironment)
    do {
        let result = try await body(daemon)
        await daemon.stop()
        if !keepDirectory { daemon.cleanUp() }
        return result
    } catch {
        await daemon.stop()
        print("authbrokerd log for the failed test:\n\(daemon.log)")
        if !keepDirectory { daemon.cleanUp() }
        throw error
    }
}

/// JSON for a control request body.
func jsonBody(_ object: [String: Any]) -> [UInt8] {
    Array((try? JSONSerialization.data(withJSONObject: object)) ?? Data())
}

/// Adds an anchor through the control API.
@discardableResult
func addAnchor(_ daemon: DaemonProcess, pem: String, hosts: [String]) throws -> TestResponse {
    let connection = try UnixSocketConnection(path: daemon.socketPath)
    return try connection.request(
        "POST", "/v1/anchors", headers: [("Content-Type", "application/json")],
        body: jsonBody(["pem": pem, "hosts": hosts])
    )
}

/// One GET through the daemon on a fresh connection.
func fetch(_ daemon: DaemonProcess, _ url: String, headers: [(String, String)] = []) throws -> TestResponse {
    let connection = try UnixSocketConnection(path: daemon.socketPath)
    return try connection.request("GET", url, headers: headers)
}
