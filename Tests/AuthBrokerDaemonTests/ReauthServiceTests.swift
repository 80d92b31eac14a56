import AuthBrokerCore
import AuthBrokerPAM
import Foundation
import Logging
import Testing

@testable import AuthBrokerDaemon

/// The re-authentication dialogue over real PAM (pam_unix for the user the tests run as): one
/// attempt per user at a time, and an attempt its client left still ends.
@Suite("Re-authentication dialogue")
struct ReauthServiceTests {
    /// A service whose PAM prompt times out after `promptTimeout`, with a private configuration.
    static func service(promptTimeout: Duration) throws -> (ReauthService, cleanUp: () -> Void) {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("abreauth-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        try "auth required pam_unix.so\naccount required pam_unix.so\n".write(toFile: directory + "/authbroker", atomically: true, encoding: .utf8)
        let service = ReauthService(
            authenticator: PAMAuthenticator(
                configuration: .init(service: "authbroker", configDirectory: directory, promptTimeout: promptTimeout),
                logger: Logger(label: "test.reauth")
            ),
            policy: ReauthPolicy(),
            logger: Logger(label: "test.reauth")
        )
        return (service, { try? FileManager.default.removeItem(atPath: directory) })
    }

    static let first = PeerIdentity(uid: getuid(), pid: 4001, startTime: 1, executable: "/usr/bin/authbrokerctl")
    static let second = PeerIdentity(uid: getuid(), pid: 4002, startTime: 2, executable: "/usr/bin/authbrokerctl")

    @Test("a dialogue whose client left ends at the prompt timeout: the next process may begin one")
    func abandonedDialogueEnds() async throws {
        let (service, cleanUp) = try Self.service(promptTimeout: .milliseconds(300))
        defer { cleanUp() }
        guard case .prompt = await service.begin(for: Self.first) else {
            Issue.record("no PAM prompt for the first process")
            return
        }
        // The first process never answers (Ctrl-C at the prompt, or a program that hung up).
        guard case .refused(let code, _, _) = await service.begin(for: Self.second) else {
            Issue.record("a second dialogue began while the first was in progress")
            return
        }
        #expect(code == .attemptInProgress)
        // After the first prompt's timeout the attempt is over, though nobody read its end.
        var began = false
        for _ in 0..<50 where !began {
            try await Task.sleep(for: .milliseconds(200))
            if case .prompt = await service.begin(for: Self.second) { began = true }
        }
        #expect(began, "the abandoned attempt still blocks every other one")
    }

    @Test("a cancelled dialogue ends at once, and only the process that began it may answer it")
    func cancelledDialogueEnds() async throws {
        let (service, cleanUp) = try Self.service(promptTimeout: .seconds(30))
        defer { cleanUp() }
        guard case .prompt(let transaction, _, _) = await service.begin(for: Self.first) else {
            Issue.record("no PAM prompt for the first process")
            return
        }
        #expect(await service.answer(transaction: transaction, from: Self.second, .cancel) == nil)
        guard case .refused? = await service.answer(transaction: transaction, from: Self.first, .cancel) else {
            Issue.record("a cancelled dialogue did not end refused")
            return
        }
        guard case .prompt = await service.begin(for: Self.second) else {
            Issue.record("a cancelled dialogue still blocks the next")
            return
        }
    }
}
