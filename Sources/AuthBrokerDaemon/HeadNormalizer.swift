import AuthBrokerCore
import NIOCore
import NIOHTTP1

/// In front of an HTTP decoder (the upstream response decoder, and the client request decoder):
/// holds each head until it is complete and passes it on as `HeadNormalization.normalized` makes it
/// (non-UTF-8 lines read as ISO-8859-1, whitespace after field values dropped) or refuses it (a
/// bare CR: the decoder's error path, 502 upstream, 400 from a client); body bytes pass
/// untouched. `UpstreamExchangeHandler` (or `RequestFramingCheck`), after the decoder, says when
/// a message ended, so that what follows is a head again.
///
/// A read that holds a whole plain head passes on unexamined past it, body and any pipelined
/// request after it included; such a later head reaches the decoder as it came (as before this
/// handler existed), which is why it repairs only what the decoder would refuse or misread.
/// When a message ends inside a read passed on, the decoder reads on in that read: it may
/// decode the next head there (and part of its body), which the handler after it reports
/// (`headDecoded`), so what follows is passed on as body; or it may keep the start of the next
/// head, whose end (`CRLF CRLF`) can straddle that read and the next, so that end is looked for
/// across the boundary too and the head's rest passes on as it came. Held back, either would
/// wait for a `CRLF CRLF` that never comes: a pipelined request until the close, or an origin's
/// bytes sent after its response unseen while the connection waits in the pool.
final class HeadNormalizer: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = ByteBuffer
    typealias InboundOut = ByteBuffer

    /// Which decoder it feeds: a response head may be interim (1xx), followed by another head.
    enum Direction {
        case responses
        case requests
    }

    private enum Mode {
        /// Bytes are part of a head, held until its end.
        case head
        /// Bytes belong to a body (or to a head too large to hold): passed on as they come.
        case passing
        /// A CONNECT ended: the bytes are the tunnel's (or nobody's, when it was refused) and
        /// pass untouched until the handler is removed; no head follows.
        case opaque
        /// A head was refused: nothing more is read from this connection.
        case refused
    }

    private var mode = Mode.head
    private var held: [UInt8] = []
    /// Messages ended so far: one that ends while a read is passed on may leave the rest of that
    /// read in the decoder.
    private var messagesEnded = 0
    /// Upstream: a request is outstanding, so what the origin sends is its response. Bytes that
    /// come in a read of their own while none is (a response nobody asked for, whole or begun;
    /// empty lines aside) make the connection unusable: held as a head, a begun one would have
    /// stayed in the pooled connection and completed as the answer to the next request sent on
    /// it. Starts true where the handler after the decoder does not announce requests (the
    /// upstream proxy's CONNECT), so that nothing is refused there.
    private var responseOutstanding: Bool
    private let announcesRequests: Bool
    /// How many bytes of a `CRLF CRLF` (1 to 3, or 0) the read in which the last message ended
    /// ends with, while the next head's end may straddle that read and what comes next.
    private var straddle = 0
    private let direction: Direction
    /// More than this and the head is passed on unchanged; the decoder refuses it as too large.
    private let limit: Int

    /// - Parameter announcesRequests: upstream, the handler after the decoder calls
    ///   `responseExpected` before each request (`UpstreamExchangeHandler` does), so what comes
    ///   before the first is refused too.
    init(_ direction: Direction, maxHeadBytes: Int, announcesRequests: Bool = false) {
        self.direction = direction
        self.limit = maxHeadBytes + 1024
        self.announcesRequests = direction == .responses && announcesRequests
        self.responseOutstanding = !self.announcesRequests
    }

    /// The connection's last request ended (it asked to switch protocols, which the broker does
    /// not, so the connection closes after its response): what the client sends after it is
    /// dropped unread, never buffered in a decoder that stopped parsing.
    func lastRequestEnded() {
        self.mode = .refused
    }

    /// A CONNECT ended: what follows belongs to the tunnel.
    func tunnelFollows() {
        guard self.mode != .refused else { return }
        self.mode = .opaque
    }

    /// The decoder decoded a final head (a request's, or a response's other than 1xx): what
    /// follows is its body. It is already so unless the head came in a read passed on after a
    /// message that ended inside it.
    func headDecoded() {
        guard case .head = self.mode else { return }
        self.mode = .passing
        self.straddle = 0
    }

    /// The message ended: the next bytes start a head (upstream, of a response to a request
    /// not sent yet).
    func messageEnded() {
        guard self.mode != .refused, self.mode != .opaque else { return }
        self.mode = .head
        self.held.removeAll(keepingCapacity: true)
        self.messagesEnded &+= 1
        if self.announcesRequests { self.responseOutstanding = false }
    }

    /// Upstream: a request is about to be sent; its response may come.
    func responseExpected() {
        self.responseOutstanding = true
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch self.mode {
        case .head: break
        case .passing:
            self.pass(self.unwrapInboundIn(data), context: context)
            return
        case .opaque:
            context.fireChannelRead(data)
            return
        case .refused:
            return
        }
        var buffer = self.unwrapInboundIn(data)
        // (Empty lines after a response are let through: some origins send a CRLF after a body,
        // and the decoder skips it, RFC 9112 §2.2.)
        if !self.responseOutstanding, buffer.readableBytesView.contains(where: { $0 != 0x0D && $0 != 0x0A }) {
            self.mode = .refused
            self.held.removeAll()
            // SwiftNIO's decoder's own error for a whole one: the same failure either way.
            context.fireErrorCaught(NIOHTTPDecoderError.unsolicitedResponse)
            return
        }
        // The usual case costs one scan and no copy: a whole head in this read, all ASCII, not
        // interim. The buffer goes on as it is.
        if self.straddle > 0, self.held.isEmpty, self.straddleEnd(in: buffer.readableBytesView) == .none {
            self.straddle = 0
        }
        if self.held.isEmpty, self.straddle == 0, self.isWholePlainFinalHead(buffer) {
            self.mode = .passing
            self.pass(buffer, context: context)
            return
        }
        self.held.append(contentsOf: buffer.readBytes(length: buffer.readableBytes) ?? [])
        self.releaseHeads(context: context)
    }

    /// Passes `buffer` on; when a message ends inside it and no head follows there, notes how
    /// much of a `CRLF CRLF` it ends with (`straddle`).
    private func pass(_ buffer: ByteBuffer, context: ChannelHandlerContext) {
        let endedBefore = self.messagesEnded
        context.fireChannelRead(self.wrapInboundOut(buffer))
        if self.messagesEnded != endedBefore, case .head = self.mode {
            self.straddle = Self.partialHeadEnd(atEndOf: buffer)
        }
    }

    /// How many bytes of a `CRLF CRLF` `buffer` ends with, when not a whole one (which ends a
    /// head, or a body, and leaves no head begun in the decoder).
    private static func partialHeadEnd(atEndOf buffer: ByteBuffer) -> Int {
        let count = buffer.readableBytes
        func back(_ distance: Int) -> UInt8? {
            distance <= count ? buffer.getInteger(at: buffer.writerIndex - distance, as: UInt8.self) : nil
        }
        let (cr, lf): (UInt8, UInt8) = (0x0D, 0x0A)
        switch (back(1), back(2), back(3)) {
        case (cr, lf, cr): return 3
        case (lf, cr, _): return back(3) == lf && back(4) == cr ? 0 : 2
        case (cr, _, _): return 1
        default: return 0
        }
    }

    private enum StraddleEnd: Equatable {
        case none
        /// The bytes begin with what is missing, but not all of it yet.
        case undecided
        /// The head ends just before this index of the bytes.
        case at(Int)
    }

    /// Whether `bytes` begin with the rest of the `CRLF CRLF` the last read ended with part of.
    private func straddleEnd<Bytes: Collection<UInt8>>(in bytes: Bytes) -> StraddleEnd {
        let missing = Self.headEndBytes.suffix(4 - self.straddle)
        guard bytes.prefix(missing.count).elementsEqual(missing.prefix(min(missing.count, bytes.count))) else { return .none }
        return bytes.count >= missing.count ? .at(missing.count) : .undecided
    }

    private static let headEndBytes: [UInt8] = [0x0D, 0x0A, 0x0D, 0x0A]

    func channelInactive(context: ChannelHandlerContext) {
        // A head cut off by the close: let the decoder see what came and report it.
        if !self.held.isEmpty {
            let bytes = self.held
            self.held.removeAll()
            context.fireChannelRead(self.wrapInboundOut(context.channel.allocator.buffer(bytes: bytes)))
        }
        context.fireChannelInactive()
    }

    private func releaseHeads(context: ChannelHandlerContext) {
        while case .head = self.mode {
            if self.straddle > 0 {
                switch self.straddleEnd(in: self.held) {
                case .undecided:
                    return
                case .none:
                    self.straddle = 0
                case .at(let end):
                    // The head began in the decoder: its rest goes on as it came. If no head came
                    // of it (the CRLFs were an empty line before the next message), what follows
                    // is held as a head as usual.
                    self.straddle = 0
                    self.passHeld(first: end, context: context)
                    continue
                }
            }
            // Empty lines before a start line (RFC 9112 §2.2; some origins send one after a
            // body) go on as they came: the decoder skips them (or they end a head it began), and
            // read here they would look like a head's end, or hide whether the head is interim.
            let blank = Self.emptyLines(atStartOf: self.held)
            if blank > 0 {
                self.passHeld(first: blank, context: context)
                continue
            }
            guard let end = HeadNormalization.headEnd(in: self.held) else {
                if self.held.count > self.limit {
                    self.mode = .passing
                    self.forward(self.held, context: context)
                    self.held.removeAll()
                }
                return
            }
            let head = Array(self.held[..<end])
            let rest = Array(self.held[end...])
            self.held.removeAll(keepingCapacity: true)
            // An interim (1xx) response is followed by another head; anything else by a body.
            let interim = self.direction == .responses && head.count > 9 && head[9] == UInt8(ascii: "1")
            self.mode = interim ? .head : .passing
            let normalized: [UInt8]
            do {
                normalized = try HeadNormalization.normalized(head) ?? head
            } catch {
                // Not HTTP/1.1: the message fails and the connection closes.
                self.mode = .refused
                self.held.removeAll()
                context.fireErrorCaught(error)
                return
            }
            self.forward(normalized, context: context)
            // A message that ended with its head left nothing in the decoder.
            self.straddle = 0
            // After an interim head, or one that ended its message (no body), the rest is a
            // head again; after any other, its body. (The decoder's report decides, not the
            // guess above: `headDecoded` comes for a final head.)
            if case .head = self.mode {
                self.held = rest
            } else if !rest.isEmpty {
                self.forward(rest, context: context)
            }
        }
    }

    /// How many bytes at the start of `bytes` are empty lines (LF or CR LF); a CR followed by
    /// anything else is not one (the head is refused as a bare CR), and a last CR waits.
    private static func emptyLines(atStartOf bytes: [UInt8]) -> Int {
        var index = 0
        while index < bytes.count {
            if bytes[index] == 0x0A {
                index += 1
            } else if bytes[index] == 0x0D, index + 1 < bytes.count, bytes[index + 1] == 0x0A {
                index += 2
            } else {
                break
            }
        }
        return index
    }

    /// Passes the first `count` held bytes on as they came, then the rest: if the decoder is now
    /// inside a message (they ended a head it held the start of), the rest follows as its body;
    /// else it stays held as a head.
    private func passHeld(first count: Int, context: ChannelHandlerContext) {
        var held: [UInt8] = []
        swap(&held, &self.held)
        self.forward(Array(held[..<count]), context: context)
        let rest = held[count...]
        guard !rest.isEmpty else { return }
        if case .head = self.mode {
            self.held = Array(rest)
        } else {
            self.forward(Array(rest), context: context)
        }
    }

    private func isWholePlainFinalHead(_ buffer: ByteBuffer) -> Bool {
        let mayBeInterim = self.direction == .responses
        return buffer.withUnsafeReadableBytes { bytes in
            // (An empty line before the start line is the slow path's.)
            guard bytes.count > 9, bytes[0] != 0x0D, bytes[0] != 0x0A, !mayBeInterim || bytes[9] != UInt8(ascii: "1") else { return false }
            // Plain: no byte above 0x7F, no bare CR, no whitespace before a CR (the slow path
            // transcodes, refuses or trims those).
            var index = 0
            while index + 3 < bytes.count {
                let byte = bytes[index]
                if byte >= 0x80 { return false }
                if byte == 0x0D {
                    guard bytes[index + 1] == 0x0A else { return false }
                    if bytes[index + 2] == 0x0D, bytes[index + 3] == 0x0A { return true }
                } else if byte == 0x20 || byte == 0x09, bytes[index + 1] == 0x0D {
                    return false
                }
                index += 1
            }
            return false
        }
    }

    private func forward(_ bytes: [UInt8], context: ChannelHandlerContext) {
        self.pass(context.channel.allocator.buffer(bytes: bytes), context: context)
    }
}
