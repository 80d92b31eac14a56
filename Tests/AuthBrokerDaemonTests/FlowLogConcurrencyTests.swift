import AuthBrokerCore
import AuthBrokerDaemon
import Foundation
import NIOHTTP1
import Testing

/// The daemon's flow log under concurrent use (it runs under the thread sanitizer in `make test`):
/// event loops record while live views follow and the control API reads.
@Suite("Flow log")
struct FlowLogConcurrencyTests {
    static func flow(_ index: Int) -> FlowRecord {
        var flow = FlowRecord(
            requestID: "req\(index)", started: Date(), method: "GET", url: "http://x.test/\(index)", httpVersion: "HTTP/1.1",
            requestHeaders: HTTPHeaders([("Host", "x.test"), ("Cookie", "n=\(index)")])
        )
        flow.status = 200
        return flow
    }

    @Test("records from several threads reach the ring and every follower, in order")
    func concurrentRecording() async {
        var settings = BrokerSettings.Flows()
        settings.keep = 100
        settings.record = .always
        let log = FlowLog(settings: settings)
        #expect(log.isRecording)
        let (follower, live) = log.follow()
        let writers = 4, perWriter = 200
        async let received: [UInt64] = {
            var sequences: [UInt64] = []
            for await flow in live {
                sequences.append(flow.sequence)
                if sequences.count == writers * perWriter { break }
            }
            return sequences
        }()
        await withTaskGroup(of: Void.self) { group in
            for writer in 0..<writers {
                group.addTask {
                    for index in 0..<perWriter { log.record(Self.flow(writer * perWriter + index)) }
                }
            }
            group.addTask {
                for _ in 0..<50 { _ = log.recent(10) }
            }
        }
        let sequences = await received
        log.unfollow(follower)
        #expect(sequences == Array(1...UInt64(writers * perWriter)))
        let kept = log.recent()
        #expect(kept.count == 100)
        #expect(kept.map(\.sequence) == Array(UInt64(writers * perWriter - 99)...UInt64(writers * perWriter)))
    }

    @Test("on demand, nothing is recorded until asked; off, never")
    func recordingStartsWhenAsked() {
        let onDemand = FlowLog(settings: BrokerSettings.Flows())
        #expect(!onDemand.isRecording)
        #expect(onDemand.startRecording() == false)
        #expect(onDemand.isRecording)
        #expect(onDemand.startRecording() == true)

        var off = BrokerSettings.Flows()
        off.keep = 0
        off.record = .always
        let none = FlowLog(settings: off)
        #expect(!none.isEnabled && !none.isRecording)
        none.startRecording()
        #expect(!none.isRecording)
        none.record(Self.flow(1))
        #expect(none.recent().isEmpty)
    }
}
