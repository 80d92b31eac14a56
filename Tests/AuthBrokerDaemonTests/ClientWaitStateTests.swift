import AuthBrokerDaemon
import Testing

/// When a client connection's timers run: only between requests, idle until a byte comes, then
/// the head deadline.
@Suite("Client wait state")
struct ClientWaitStateTests {
    @Test("a fresh connection idles; a byte starts the head deadline; a head stops the timers")
    func freshConnection() {
        var state = ClientWaitState()
        #expect(state.deadline == .idle)
        let started1 = state.bytesArrived()
        #expect(started1)
        #expect(state.deadline == .head)
        let started2 = state.bytesArrived()
        #expect(!started2, "more bytes do not restart the head deadline")
        state.headArrived()
        #expect(state.deadline == .none)
    }

    @Test("no timer while the request body or the response is still under way")
    func inProgress() {
        var state = ClientWaitState()
        state.headArrived()
        state.responseEnded()  // answered before the body ended (an early 401)
        #expect(state.deadline == .none)
        let started3 = state.bytesArrived()
        #expect(!started3, "body bytes are not the next request")
        state.requestEnded()
        #expect(state.deadline == .idle)

        state.headArrived()
        state.requestEnded()
        #expect(state.deadline == .none, "a long download or an event stream is progress")
        state.responseEnded()
        #expect(state.deadline == .idle)
    }

    @Test("pipelined heads: the timers wait for the last response")
    func pipelined() {
        var state = ClientWaitState()
        state.headArrived()
        state.requestEnded()
        state.headArrived()
        state.requestEnded()
        state.responseEnded()
        #expect(state.deadline == .none)
        state.responseEnded()
        #expect(state.deadline == .idle)
    }
}
