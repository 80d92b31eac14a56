import AuthBrokerTrust
import Foundation
import Logging

/// Once a second, off the event loops: picks up a trust store file changed by hand (so an
/// anchor deleted in an editor stops being trusted, and is not written back by the next change
/// through the API), removes exceptions whose time is up, and reads the system's CA bundle again
/// when a distribution update replaced it (a root it removed stops being trusted). Each bumps
/// the store's generation, so pooled TLS connections verified before are closed rather than reused.
enum TrustStoreWatch {
    static let interval: Duration = .seconds(1)

    static func run(_ store: TrustStore, evaluator: TrustEvaluator, logger: Logger) async {
        var lastProblem: String?
        while !Task.isCancelled {
            do {
                try await Task.sleep(for: interval)
            } catch {
                return
            }
            if evaluator.reloadSystemAnchorsIfChanged() {
                logger.notice("system CA bundle changed; read it again", metadata: ["roots": "\(evaluator.systemAnchorCount)"])
            }
            do throws(TrustStoreError) {
                if try store.refreshFromDisk() {
                    logger.notice("trust store changed on disk; now using what it holds", metadata: ["path": "\(store.path)"])
                }
                lastProblem = nil
                for expired in try store.removeExpiredExceptions() {
                    logger.notice(
                        "exception expired and removed",
                        metadata: ["host": "\(expired.hostDescription)", "leaf_sha256": "\(expired.sha256)"]
                    )
                }
            } catch {
                // Said once per problem, not once a second.
                if lastProblem != error.message {
                    logger.error("\(error.message)")
                    lastProblem = error.message
                }
            }
        }
    }
}
