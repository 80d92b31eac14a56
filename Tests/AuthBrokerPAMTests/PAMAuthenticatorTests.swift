import Foundation
import Logging
import Testing

@testable import AuthBrokerPAM

/// Real PAM (pam_unix against /etc/shadow), through a private configuration directory.
@Suite("PAM authenticator", .serialized)
struct PAMAuthenticatorTests {
    private func answering(_ password: String, log: PromptLog? = nil) -> PAMClosureResponder {
        PAMClosureResponder { prompt in
            log?.append(prompt)
            return prompt.expectsAnswer ? .answer(PAMSecret(password)) : .acknowledged
        }
    }

    @Test("the right password succeeds, after one no-echo prompt", .enabled(if: PAMFixture.userReady, PAMFixture.skipReason))
    func correctPassword() async {
        let prompts = PromptLog()
        let outcome = await PAMFixture.authenticator().authenticate(
            user: PAMFixture.user, responder: self.answering(PAMFixture.password, log: prompts)
        )
        #expect(outcome == .success)
        #expect(prompts.all.map(\.style) == [.secret])
    }

    @Test("an information message reaches the responder, is acknowledged, and the prompt after it is answered", .enabled(if: PAMFixture.userReady, PAMFixture.skipReason))
    func informationMessage() async {
        let prompts = PromptLog()
        let outcome = await PAMFixture.authenticator(service: "authbroker-info").authenticate(
            user: PAMFixture.user, responder: self.answering(PAMFixture.password, log: prompts)
        )
        #expect(outcome == .success)
        #expect(prompts.all == [PAMPrompt(style: .info, text: "Welcome to the test"), PAMPrompt(style: .secret, text: "Password: ")])
    }

    @Test("transactions run side by side, each on its own thread", .enabled(if: PAMFixture.userReady, PAMFixture.skipReason))
    func concurrentTransactions() async {
        let authenticator = PAMFixture.authenticator()
        let responder = self.answering(PAMFixture.password)
        async let first = authenticator.authenticate(user: PAMFixture.user, responder: responder)
        async let second = authenticator.authenticate(user: PAMFixture.user, responder: responder)
        async let third = authenticator.authenticate(user: PAMFixture.user, responder: PAMPasswordResponder(password: PAMSecret(PAMFixture.password)))
        let outcomes = await [first, second, third]
        #expect(outcomes == [.success, .success, .success])
    }

    @Test("a wrong password is 'authentication failed' with a message that says what to do", .enabled(if: PAMFixture.userReady, PAMFixture.skipReason))
    func wrongPassword() async throws {
        let logs = LogCapture()
        let outcome = await PAMFixture.authenticator(logger: logs.logger).authenticate(
            user: PAMFixture.user, responder: self.answering(PAMFixture.wrongPassword)
        )
        let error = try #require(outcome.error)
        #expect(error == .authenticationFailed)
        #expect(error.code == "authentication_failed")
        #expect(error.message.contains("password was not accepted"))
        #expect(error.message.contains("try again"))
        #expect(logs.text.contains("authentication_failed"))
        #expect(!logs.text.contains(PAMFixture.wrongPassword))
    }

    @Test("an unknown user fails without success (user unknown, or auth failed as pam_unix may hide it)", .enabled(if: getuid() == 0, PAMFixture.skipReason))
    func unknownUser() async throws {
        let outcome = await PAMFixture.authenticator().authenticate(
            user: "abtest-no-such-user", responder: self.answering(PAMFixture.password)
        )
        let error = try #require(outcome.error)
        #expect(error == .userUnknown || error == .authenticationFailed)
        #expect(error.message.contains("abtest-no-such-user"))
    }

    @Test("a refused account check is 'account unavailable'", .enabled(if: PAMFixture.userReady, PAMFixture.skipReason))
    func accountRefused() async throws {
        let outcome = await PAMFixture.authenticator(service: "authbroker-deny-account").authenticate(
            user: PAMFixture.user, responder: self.answering(PAMFixture.password)
        )
        let error = try #require(outcome.error)
        #expect(error == .accountUnavailable)
        #expect(error.message.contains("may not be used now"))
    }

    @Test("a responder that never answers ends the transaction as timed out, within the deadline", .enabled(if: PAMFixture.userReady, PAMFixture.skipReason))
    func timeout() async throws {
        let started = ContinuousClock.now
        let outcome = await PAMFixture.authenticator(promptTimeout: .milliseconds(300)).authenticate(
            user: PAMFixture.user,
            responder: PAMClosureResponder { _ in
                try? await Task.sleep(for: .seconds(3600))
                return .cancel
            }
        )
        let elapsed = started.duration(to: .now)
        let error = try #require(outcome.error)
        #expect(error == .timedOut)
        #expect(error.message.contains("answer the prompt sooner"))
        #expect(elapsed >= .milliseconds(300))
        #expect(elapsed < .seconds(5))
    }

    @Test("a responder that ignores cancellation still cannot hold the transaction past the deadline", .enabled(if: PAMFixture.userReady, PAMFixture.skipReason))
    func stubbornResponder() async throws {
        let started = ContinuousClock.now
        let outcome = await PAMFixture.authenticator(promptTimeout: .milliseconds(300)).authenticate(
            user: PAMFixture.user,
            responder: PAMClosureResponder { _ in
                // Waits 3 s whatever happens (cancellation included), then answers correctly:
                // too late to count.
                await withCheckedContinuation { continuation in
                    DispatchQueue.global().asyncAfter(deadline: .now() + 3) { continuation.resume() }
                }
                return .answer(PAMSecret(PAMFixture.password))
            }
        )
        #expect(outcome.error == .timedOut)
        #expect(started.duration(to: .now) < .seconds(2))
    }

    @Test("a responder that cancels ends the transaction as cancelled", .enabled(if: PAMFixture.userReady, PAMFixture.skipReason))
    func responderCancels() async throws {
        let outcome = await PAMFixture.authenticator().authenticate(
            user: PAMFixture.user, responder: PAMClosureResponder { _ in .cancel }
        )
        let error = try #require(outcome.error)
        #expect(error == .cancelled)
        #expect(error.message.contains("cancelled"))
    }

    @Test("cancelling the caller's task while a prompt waits ends the transaction as cancelled, promptly", .enabled(if: PAMFixture.userReady, PAMFixture.skipReason))
    func callerCancelled() async throws {
        let (asked, askedContinuation) = AsyncStream<Void>.makeStream()
        let authenticator = PAMFixture.authenticator(promptTimeout: .seconds(60))
        let task = Task {
            await authenticator.authenticate(
                user: PAMFixture.user,
                responder: PAMClosureResponder { _ in
                    askedContinuation.yield()
                    try? await Task.sleep(for: .seconds(3600))
                    return .answer(PAMSecret(PAMFixture.password))
                }
            )
        }
        for await _ in asked { break }
        let started = ContinuousClock.now
        task.cancel()
        let outcome = await task.value
        #expect(outcome.error == .cancelled)
        #expect(started.duration(to: .now) < .seconds(5))
    }

    @Test("a task cancelled before it starts never reaches PAM")
    func cancelledBeforeStart() async {
        let prompts = PromptLog()
        let task = Task {
            while !Task.isCancelled { await Task.yield() }
            return await PAMFixture.authenticator().authenticate(user: "nobody", responder: self.answering("x", log: prompts))
        }
        task.cancel()
        #expect(await task.value.error == .cancelled)
        #expect(prompts.all.isEmpty)
    }

    @Test("acknowledging a password prompt instead of answering it is a conversation failure", .enabled(if: PAMFixture.userReady, PAMFixture.skipReason))
    func acknowledgedPrompt() async {
        let outcome = await PAMFixture.authenticator().authenticate(
            user: PAMFixture.user, responder: PAMClosureResponder { _ in .acknowledged }
        )
        #expect(outcome.error == .conversationFailed)
    }

    @Test("an answer holding a NUL byte is refused, not truncated", .enabled(if: PAMFixture.userReady, PAMFixture.skipReason))
    func answerWithNUL() async {
        let outcome = await PAMFixture.authenticator().authenticate(
            user: PAMFixture.user,
            responder: PAMClosureResponder { _ in .answer(PAMSecret(PAMFixture.password + "\u{0}trailing")) }
        )
        #expect(outcome.error == .conversationFailed)
    }

    @Test("a service with no configuration is a system error naming the service")
    func missingService() async throws {
        let outcome = await PAMFixture.authenticator(service: "authbroker-no-such-service").authenticate(
            user: "nobody", responder: self.answering("x")
        )
        let error = try #require(outcome.error)
        #expect(error == .systemError)
        #expect(error.message.contains(PAMFixture.configDirectory + "/authbroker-no-such-service"))
    }

    @Test("the password appears in no outcome, error description or log line", .enabled(if: PAMFixture.userReady, PAMFixture.skipReason))
    func passwordNeverShown() async {
        let logs = LogCapture()
        let secretWords = [PAMFixture.password, PAMFixture.wrongPassword]
        var texts: [String] = []
        for (password, service) in [
            (PAMFixture.password, "authbroker"), (PAMFixture.wrongPassword, "authbroker"),
            (PAMFixture.password, "authbroker-deny-account"),
        ] {
            let outcome = await PAMFixture.authenticator(service: service, logger: logs.logger).authenticate(
                user: PAMFixture.user, responder: self.answering(password)
            )
            texts.append(outcome.description)
            texts.append(String(reflecting: outcome))
            texts.append(String(describing: outcome.error as Any))
            texts.append(outcome.error?.message ?? "")
        }
        let secret = PAMSecret(PAMFixture.password)
        texts.append(String(describing: secret))
        texts.append(String(reflecting: secret))
        texts.append("\(PAMResponse.answer(secret))")
        var dumped = ""
        dump(secret, to: &dumped)
        texts.append(dumped)
        texts.append(logs.text)
        #expect(!logs.text.isEmpty)
        for text in texts {
            for word in secretWords {
                #expect(!text.contains(word), "found a password in: \(text.prefix(200))")
            }
        }
    }

    @Test("PAMSecret(wiping:) zeroes the caller's buffer and keeps its own copy")
    func secretWipesSource() {
        var bytes = Array("hunter2".utf8)
        let secret = PAMSecret(wiping: &bytes)
        #expect(bytes.isEmpty)
        #expect(secret.count == 7)
        #expect(secret.withUnsafeBytes { Array($0) } == Array("hunter2".utf8))
        var copy = secret
        copy.wipe()
        #expect(copy.count == 0)
        #expect(secret.count == 7)
    }
}
