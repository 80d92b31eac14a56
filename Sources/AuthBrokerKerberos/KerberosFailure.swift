import CGSSAPI

/// Why a Kerberos step failed, in the terms the user acts on: a ticket to get (`kinit`), a KDC
/// that cannot be reached, a server the KDC does not know, a clock to set.
package struct KerberosFailure: Error, Sendable, Equatable, CustomStringConvertible {
    package enum Kind: String, Sendable, Equatable {
        /// No credential cache, or no ticket-granting ticket in it.
        case noTicket
        /// The ticket-granting ticket has expired.
        case ticketExpired
        /// No KDC of the realm answered (or none could be found).
        case kdcUnreachable
        /// The KDC knows no service principal for the server (`HTTP/host`).
        case serverUnknown
        /// The clocks of this machine and the KDC or server differ too much.
        case clockSkew
        /// The server's token did not prove it holds the service key (mutual authentication).
        case mutualAuthenticationFailed
        /// The server refused the ticket (a plain refusal, or an error token: a replay, a key
        /// it does not have).
        case refusedByServer
        /// Anything else GSS-API reported.
        case other
    }

    package var kind: Kind
    /// GSS-API's own text for the failure (major and minor status); never holds a secret.
    package var detail: String
    /// The service the ticket was for (`HTTP@host`, the canonical host), when known.
    package var service: String?

    package init(_ kind: Kind, detail: String, service: String? = nil) {
        self.kind = kind
        self.detail = detail
        self.service = service
    }

    package var description: String { "\(kind): \(detail)" }

    /// The failure a GSS-API status pair means.
    static func from(major: OM_uint32, minor: OM_uint32) -> KerberosFailure {
        let detail = Self.statusText(major: major, minor: minor)
        let routine = cgss_routine_error(major)
        let kind: Kind
        switch Int32(bitPattern: minor) {
        case Int32(CGSS_KRB5_FCC_NOFILE), Int32(CGSS_KRB5_CC_NOTFOUND): kind = .noTicket
        case Int32(CGSS_KRB5_TKT_EXPIRED): kind = .ticketExpired
        case Int32(CGSS_KRB5_KDC_UNREACH), Int32(CGSS_KRB5_REALM_CANT_RESOLVE): kind = .kdcUnreachable
        case Int32(CGSS_KRB5_S_PRINCIPAL_UNKNOWN): kind = .serverUnknown
        case Int32(CGSS_KRB5_SKEW): kind = .clockSkew
        default:
            if routine == OM_uint32(CGSS_S_CREDENTIALS_EXPIRED) {
                kind = .ticketExpired
            } else if routine == OM_uint32(CGSS_S_NO_CRED) {
                kind = .noTicket
            } else {
                kind = .other
            }
        }
        return KerberosFailure(kind, detail: detail)
    }

    /// "major text; minor text", as gss_display_status words them.
    static func statusText(major: OM_uint32, minor: OM_uint32) -> String {
        var parts: [String] = []
        for (code, isGSSCode) in [(major, Int32(1)), (minor, Int32(0))] where code != 0 {
            var context: OM_uint32 = 0
            // gss_display_status returns one message per call while `context` says more follow;
            // the bound keeps a misbehaving mechanism from looping.
            for _ in 0..<8 {
                var text = gss_buffer_desc()
                guard cgss_is_error(cgss_status_text(code, isGSSCode, &context, &text)) == 0 else { break }
                if let bytes = text.value, text.length > 0 {
                    parts.append(String(decoding: UnsafeRawBufferPointer(start: bytes, count: text.length), as: UTF8.self))
                }
                var ignored: OM_uint32 = 0
                gss_release_buffer(&ignored, &text)
                if context == 0 { break }
            }
        }
        return parts.isEmpty ? "GSS-API status \(major)/\(Int32(bitPattern: minor))" : parts.joined(separator: "; ")
    }
}
