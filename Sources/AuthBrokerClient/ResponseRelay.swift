import NIOConcurrencyHelpers
import NIOCore
import NIOHTTP1

/// A bounded hand-over of response parts from the connection task to the app's task.
///
/// The connection task `yield`s each part; when `capacity` parts wait unread it is suspended,
/// stops pulling from the channel, and `NIOAsyncChannel`'s watermarks then stop reading the
/// socket: so a body of any size passes in bounded memory, at the reader's pace. One consumer.
final class ResponseRelay: Sendable {
    private struct State {
        var parts = CircularBuffer<HTTPClientResponsePart>()
        /// Set once: nil while the producer may still yield.
        var finished: (any Error)?? = .none
        var consumer: CheckedContinuation<HTTPClientResponsePart?, any Error>?
        var producer: CheckedContinuation<Void, any Error>?
        /// The consumer gave up: every later yield throws.
        var cancelled = false
    }

    private let state = NIOLockedValueBox(State())
    let capacity: Int

    init(capacity: Int = 4) {
        self.capacity = capacity
    }

    /// Producer: hands one part over, waiting while the buffer is full.
    /// - Throws: `CancellationError` once the consumer has cancelled.
    func yield(_ part: HTTPClientResponsePart) async throws {
        enum Step {
            case resume(CheckedContinuation<HTTPClientResponsePart?, any Error>)
            case done
            case wait
            case cancelled
        }
        let step: Step = state.withLockedValue { state in
            if state.cancelled { return .cancelled }
            if let consumer = state.consumer {
                state.consumer = nil
                return .resume(consumer)
            }
            state.parts.append(part)
            return state.parts.count >= capacity ? .wait : .done
        }
        switch step {
        case .resume(let consumer): consumer.resume(returning: part)
        case .done: return
        case .cancelled: throw CancellationError()
        case .wait:
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
                let resumeNow: Result<Void, any Error>? = state.withLockedValue { state in
                    if state.cancelled { return .failure(CancellationError()) }
                    if state.parts.count < capacity { return .success(()) }
                    state.producer = continuation
                    return nil
                }
                if let resumeNow { continuation.resume(with: resumeNow) }
            }
        }
    }

    /// Producer: no more parts; `error` fails the consumer's next read after the buffered parts.
    func finish(error: (any Error)? = nil) {
        let consumer: CheckedContinuation<HTTPClientResponsePart?, any Error>? = state.withLockedValue { state in
            guard case .none = state.finished else { return nil }
            state.finished = .some(error)
            defer { state.consumer = nil }
            return state.consumer
        }
        if let error { consumer?.resume(throwing: error) } else { consumer?.resume(returning: nil) }
    }

    /// Consumer: the next part, nil after the producer finished cleanly.
    func next() async throws -> HTTPClientResponsePart? {
        try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<HTTPClientResponsePart?, any Error>) in
            enum Outcome {
                case part(HTTPClientResponsePart, CheckedContinuation<Void, any Error>?)
                case end((any Error)?)
                case waiting
            }
            let outcome: Outcome = state.withLockedValue { state in
                if state.cancelled { return .end(CancellationError()) }
                if let part = state.parts.popFirst() {
                    let producer = state.parts.count < capacity ? state.producer : nil
                    if producer != nil { state.producer = nil }
                    return .part(part, producer)
                }
                if case .some(let error) = state.finished { return .end(error) }
                if state.consumer != nil {
                    return .end(BrokerClientError.protocolError(reason: "a response body was iterated by two tasks at once"))
                }
                state.consumer = continuation
                return .waiting
            }
            switch outcome {
            case .part(let part, let producer):
                producer?.resume()
                continuation.resume(returning: part)
            case .end(let error?): continuation.resume(throwing: error)
            case .end(nil): continuation.resume(returning: nil)
            case .waiting: break
            }
        }
    }

    /// Consumer: gives up. A waiting read throws `CancellationError`, the producer's next
    /// `yield` throws, buffered parts are dropped.
    func cancel() {
        let (consumer, producer) = state.withLockedValue { state in
            state.cancelled = true
            state.parts.removeAll()
            defer {
                state.consumer = nil
                state.producer = nil
            }
            return (state.consumer, state.producer)
        }
        consumer?.resume(throwing: CancellationError())
        producer?.resume(throwing: CancellationError())
    }
}
