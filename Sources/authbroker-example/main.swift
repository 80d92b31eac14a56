// authbroker-example URL: fetches URL through authbrokerd with each API of AuthBrokerClient
// and prints the status and the byte count. The README's "From Swift" section shows this code.
import AuthBrokerClient
import Foundation

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

guard CommandLine.arguments.count == 2, let url = URL(string: CommandLine.arguments[1]) else {
    FileHandle.standardError.write(Data("usage: authbroker-example URL\n".utf8))
    exit(2)
}

/// Asks on the terminal for Basic/Digest credentials the daemon does not hold.
let askOnTerminal: BrokerChallengeHandler = { challenge in
    guard challenge.previousFailureCount < 3 else { return .cancel }
    let space = challenge.protectionSpace
    FileHandle.standardError.write(Data("\(space.host):\(space.port) asks for \(space.authenticationScheme.rawValue) credentials (realm \"\(space.realm)\")\nuser: ".utf8))
    guard let user = readLine(), !user.isEmpty else { return .performDefaultHandling }
    let password = String(cString: getpass("password: "))
    return .useCredential(user: user, password: password, persistence: .forSession)
}

do {
    // 1. BrokerClient: the body streams in chunks.
    let client = BrokerClient(challengeHandler: askOnTerminal)
    let response = try await client.send(BrokerRequest(url: url))
    var bytes = 0
    for try await chunk in response.body { bytes += chunk.count }
    print("BrokerClient:      \(response.status), \(bytes) bytes (request id \(response.head.requestID ?? "-"))")

    // 2. URLSession with BrokerURLProtocol first in its protocol classes.
    BrokerURLProtocol.challengeHandler = askOnTerminal
    let configuration = URLSessionConfiguration.ephemeral
    configuration.protocolClasses = [BrokerURLProtocol.self] + (configuration.protocolClasses ?? [])
    let session = URLSession(configuration: configuration)
    let (data, urlResponse) = try await session.data(from: url)
    let status = (urlResponse as? HTTPURLResponse)?.statusCode ?? 0
    print("URLSession:        \(status), \(data.count) bytes")
} catch let error as BrokerError {
    print("authbrokerd refused: \(error.title) [\(error.code), \(error.proxyStatus ?? "-")]")
    print(error.detail)
    for certificate in error.chain { print("  \(certificate.subject)  SHA-256 \(certificate.sha256)") }
    for command in error.fix { print("  fix: \(command)") }
    exit(4)
} catch {
    print("error: \(error)")
    exit(1)
}
