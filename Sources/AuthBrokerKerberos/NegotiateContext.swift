import CGSSAPI
import NIOConcurrencyHelpers

/// One initiator's SPNEGO security context (RFC 4178 over Kerberos V5) for one request to one
/// server: the token for `Authorization: Negotiate` (RFC 4559 §4), and then, when the server
/// answers with a token of its own, the check that it holds the service key (mutual
/// authentication).
///
/// Every call may block: reading the credential cache, and asking the KDC for a service ticket.
/// Callers run them off the event loops (`KerberosNegotiator`).
package final class NegotiateContext: @unchecked Sendable {  // @unchecked: the GSS handles are touched only under `lock`.
    /// What one step gave.
    package struct Step: Sendable, Equatable {
        /// The token to send (base64 in `Negotiate <token>`); nil when there is nothing to send.
        package var token: [UInt8]?
        /// The context is established: no more tokens are expected.
        package var complete: Bool
    }

    /// `HTTP@host`: the host-based service name the ticket is for (RFC 4559 §4).
    package let serviceName: String
    /// The credential the context speaks for; nil: the default one, looked up at each step.
    private let credential: GSSCredential?
    private let flags: OM_uint32
    private let lock = NIOLock()
    private var context: gss_ctx_id_t?
    private var target: gss_name_t?
    private var established = false

    /// - Parameters:
    ///   - serviceHost: the server's host name, already canonicalised.
    ///   - delegate: whether the server may act as the user (a forwardable ticket goes with it).
    ///   - credential: the user's credential, acquired before; nil: the default, looked up now.
    /// - Throws: when GSS-API cannot read the name.
    package init(serviceHost: String, delegate: Bool, credential: GSSCredential? = nil) throws(KerberosFailure) {
        self.serviceName = "HTTP@" + serviceHost
        self.credential = credential
        var flags = OM_uint32(GSS_C_MUTUAL_FLAG) | OM_uint32(GSS_C_SEQUENCE_FLAG)
        if delegate { flags |= OM_uint32(GSS_C_DELEG_FLAG) }
        self.flags = flags
        var minor: OM_uint32 = 0
        var name: gss_name_t?
        let major = cgss_import_service_name(&minor, self.serviceName, &name)
        guard cgss_is_error(major) == 0 else { throw KerberosFailure.from(major: major, minor: minor) }
        self.target = name
    }

    deinit {
        var minor: OM_uint32 = 0
        if self.context != nil { gss_delete_sec_context(&minor, &self.context, nil) }
        if self.target != nil { gss_release_name(&minor, &self.target) }
    }

    /// One step: the first (`serverToken` nil) makes the initial token; later ones take the
    /// server's token. A step after the context is established checks a server's final token
    /// and makes none.
    /// - Throws: `KerberosFailure`, classified; a failed check of the server's token is
    ///   `.mutualAuthenticationFailed`.
    package func step(serverToken: [UInt8]?) throws(KerberosFailure) -> Step {
        let result = self.lock.withLock { () -> Result<Step, KerberosFailure> in
            if self.established {
                // A token after the context is complete has nothing left to prove.
                return .success(Step(token: nil, complete: true))
            }
            var minor: OM_uint32 = 0
            var output = gss_buffer_desc()
            var returnedFlags: OM_uint32 = 0
            let major: OM_uint32
            if let serverToken {
                major = serverToken.withUnsafeBytes { bytes in
                    cgss_init_step(
                        &minor, self.credential?.handle, &self.context, self.target, self.flags, bytes.baseAddress, bytes.count,
                        &output, &returnedFlags
                    )
                }
            } else {
                major = cgss_init_step(
                    &minor, self.credential?.handle, &self.context, self.target, self.flags, nil, 0, &output, &returnedFlags
                )
            }
            defer {
                var ignored: OM_uint32 = 0
                gss_release_buffer(&ignored, &output)
            }
            if cgss_is_error(major) != 0 {
                // What a failure on a server's token means (a refusal, or a failed proof) is the
                // caller's to say: it knows whether the token came with a 401 or a 200.
                return .failure(KerberosFailure.from(major: major, minor: minor))
            }
            let token: [UInt8]? =
                if let bytes = output.value, output.length > 0 {
                    Array(UnsafeRawBufferPointer(start: bytes, count: output.length))
                } else { nil }
            let complete = cgss_continue_needed(major) == 0
            self.established = complete
            return .success(Step(token: token, complete: complete))
        }
        return try result.get()
    }
}

/// A handle on the user's default credential, acquired once and shared by contexts: MIT's
/// library reads the cache behind it at each use, so a `kinit` that replaces the ticket is seen;
/// an acquisition whose ticket has since expired fails its contexts, and the caller acquires
/// again. MIT holds the credential's lock across a first step's KDC exchange, so first steps
/// that need a new service ticket run one at a time; cached tickets need no KDC.
package final class GSSCredential: @unchecked Sendable {  // @unchecked: immutable after init; MIT locks the credential per use.
    let handle: gss_cred_id_t?
    /// Whose credential it is (`alice@REALM`), and for how long it was valid when acquired.
    package let principal: String
    package let remainingSeconds: UInt32

    /// Acquires the default credential (the cache `klist` shows) and reads whose it is.
    /// - Throws: as a context step would (no ticket, expired).
    package init() throws(KerberosFailure) {
        var minor: OM_uint32 = 0
        var handle: gss_cred_id_t?
        var major = cgss_acquire_default(&minor, &handle)
        guard cgss_is_error(major) == 0 else { throw KerberosFailure.from(major: major, minor: minor) }
        self.handle = handle
        var name = gss_buffer_desc()
        var lifetime: OM_uint32 = 0
        major = cgss_inquire_credential(&minor, handle, &name, &lifetime)
        defer {
            var ignored: OM_uint32 = 0
            gss_release_buffer(&ignored, &name)
        }
        guard cgss_is_error(major) == 0 else { throw KerberosFailure.from(major: major, minor: minor) }
        guard let bytes = name.value, name.length > 0 else {
            throw KerberosFailure(.other, detail: "the credential has no principal name")
        }
        self.principal = String(decoding: UnsafeRawBufferPointer(start: bytes, count: name.length), as: UTF8.self)
        self.remainingSeconds = lifetime
    }

    deinit {
        var minor: OM_uint32 = 0
        var handle = self.handle
        if handle != nil { gss_release_cred(&minor, &handle) }
    }
}

/// The user's Kerberos credential as GSS-API finds it (the cache `klist` shows): whose it is
/// and how long it lasts.
package enum KerberosCredential {
    package enum Status: Sendable, Equatable {
        /// A ticket-granting ticket for `principal`, valid for `remainingSeconds` more.
        case valid(principal: String, remainingSeconds: UInt32)
        /// A credential cache for `principal` whose ticket-granting ticket has expired.
        case expired(principal: String?)
        /// No usable credential cache (`detail` says what GSS-API found).
        case missing(detail: String)
    }

    /// The default credential now. Blocks briefly (it reads the credential cache).
    package static func current() -> Status {
        do throws(KerberosFailure) {
            let credential = try GSSCredential()
            guard credential.remainingSeconds > 0 else { return .expired(principal: credential.principal) }
            return .valid(principal: credential.principal, remainingSeconds: credential.remainingSeconds)
        } catch {
            return error.kind == .ticketExpired ? .expired(principal: nil) : .missing(detail: error.detail)
        }
    }
}
