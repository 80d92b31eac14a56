/// Every error code the broker can send: a problem body's `code` (and the last part of its
/// `type`, `urn:authbroker:problem:<code>`), and the value of the `Authbroker-Error` header.
///
/// A closed set, and a stable API: scripts branch on these strings, so a raw value is never
/// renamed. docs/api/openapi.yaml lists the same set (schema `BrokerErrorCode`), and
/// `BrokerErrorCodeTests` compares the two. The codes of other modules' errors (request
/// targets, the trust store, the secret store, PAM) reach this set through exhaustive mappings
/// in the daemon, so a new code there does not compile until it has a case here.
///
/// `ProblemDetails.code` stays a `String`: a client may talk to a newer daemon with codes this
/// version does not know.
package enum BrokerErrorCode: String, CaseIterable, Sendable, Codable, CustomStringConvertible {
    // MARK: Data plane: the client's request

    /// The request could not be parsed as HTTP/1.1.
    case malformedRequest = "malformed_request"
    /// The request line and headers exceed `[limits] max_request_head_bytes`.
    case requestHeadTooLarge = "request_head_too_large"
    /// The request head did not all arrive within `[limits] request_head_timeout_ms` of its first byte.
    case requestHeadTimeout = "request_head_timeout"
    /// Every connection slot for requests is taken; this connection serves control requests only.
    case clientConnectionsFull = "client_connections_full"
    /// `OPTIONS *`, which asks about the broker itself.
    case asteriskNotSupported = "asterisk_not_supported"
    /// The request target is empty.
    case emptyTarget = "empty_target"
    /// The request target is neither an absolute URL nor a control path under `/v1/`.
    case notAbsolute = "not_absolute"
    /// The target's scheme is not `http` or `https`.
    case unsupportedScheme = "unsupported_scheme"
    /// The target URL names no host.
    case missingHost = "missing_host"
    /// A host (in a request target, a URL or an exception's `host`) is not a valid name or address.
    case invalidHost = "invalid_host"
    /// The target's port is not a number from 1 to 65535.
    case invalidPort = "invalid_port"
    /// The target URL carries `user:password@`.
    case userinfoNotAllowed = "userinfo_not_allowed"
    /// The target URL carries a `#fragment`.
    case fragmentNotAllowed = "fragment_not_allowed"
    /// The request target holds a byte that cannot appear in one.
    case invalidCharacter = "invalid_character"
    /// The request target is longer than the broker reads.
    case tooLong = "too_long"
    /// The daemon is stopping and takes no new requests.
    case shuttingDown = "shutting_down"

    // MARK: Data plane: the upstream fetch

    /// The server's certificate chain failed the broker's trust evaluation.
    case untrustedServer = "untrusted_server"
    /// The TLS handshake with the server failed.
    case tlsHandshakeFailed = "tls_handshake_failed"
    /// The server did not complete the TLS handshake within `[upstream] tls_handshake_timeout_ms`.
    case tlsHandshakeTimeout = "tls_handshake_timeout"
    /// The server requires a client certificate: the broker had none for the host, or the server did not take the one sent.
    case clientCertificateRequired = "client_certificate_required"
    /// The server refused the client certificate the broker presented.
    case clientCertificateRejected = "client_certificate_rejected"
    /// The client identity chosen for the request could not be loaded.
    case clientIdentityUnavailable = "client_identity_unavailable"
    /// A client identity's private key is not in the secret store.
    case identityKeyMissing = "identity_key_missing"
    /// `POST /v1/reload`: the config file has an error (its file:line is in the detail); nothing changed.
    case invalidConfig = "invalid_config"
    /// A CONNECT the proxy port would intercept, or `authbrokerctl ca`, needs the local CA, which
    /// cannot be made or read (its key is in the secret store).
    case localCAUnavailable = "local_ca_unavailable"
    /// The `Authbroker-Identity` named a client identity whose hosts do not include the target's.
    case identityNotForHost = "identity_not_for_host"
    /// The `Authbroker-Identity` named a client identity whose certificate is not valid now.
    case identityExpired = "identity_expired"
    /// The server's host name did not resolve.
    case dnsError = "dns_error"
    /// The server refused the TCP connection.
    case connectionRefused = "connection_refused"
    /// No TCP connection to the server within `[upstream] connect_timeout_ms`.
    case connectionTimeout = "connection_timeout"
    /// Connecting to the server failed otherwise.
    case destinationUnavailable = "destination_unavailable"
    /// The server sent no response head within `[upstream] response_head_timeout_ms`.
    case httpResponseTimeout = "http_response_timeout"
    /// No bytes moved to or from the server for `[upstream] idle_timeout_ms`.
    case idleTimeout = "idle_timeout"
    /// The server's response could not be parsed as HTTP/1.1.
    case httpProtocolError = "http_protocol_error"
    /// The server's response head exceeds `[limits] max_response_head_bytes`.
    case responseHeadTooLarge = "response_head_too_large"
    /// The server closed the connection inside the response head.
    case httpResponseIncomplete = "http_response_incomplete"
    /// The server closed the connection before any response byte.
    case connectionTerminated = "connection_terminated"
    /// Too many requests already wait for a connection to this server.
    case connectionLimitReached = "connection_limit_reached"

    // MARK: Data plane: the cache

    /// The request may be answered only from the cache (`only-if-cached`, `Authbroker-Cache:
    /// only-if-cached`, or offline mode), and nothing usable is stored for it.
    case notCached = "not_cached"
    /// Offline mode (`authbrokerctl offline on`) and a request the cache cannot answer (a POST).
    case offline = "offline"

    // MARK: Data plane: Kerberos (Negotiate)

    /// The server (or the upstream proxy) asks for Kerberos and the user has no valid ticket.
    case kerberosTicketNeeded = "kerberos_ticket_needed"
    /// A service ticket could not be had: the KDC did not answer, does not know the server, or
    /// the clocks differ.
    case kerberosFailed = "kerberos_failed"
    /// The server's Negotiate token did not prove it holds the service key.
    case kerberosMutualAuthFailed = "kerberos_mutual_auth_failed"

    // MARK: Data plane: the upstream proxy

    /// The upstream proxy answered `CONNECT` with a status other than 2xx (or an answerable 407).
    case proxyTunnelRefused = "proxy_tunnel_refused"
    /// The upstream proxy did not answer `CONNECT` with an HTTP response, or closed first.
    case proxyTunnelFailed = "proxy_tunnel_failed"
    /// The upstream proxy wants credentials for a tunnel and no stored password answers it.
    case proxyAuthenticationRequired = "proxy_authentication_required"

    // MARK: Control API: requests

    /// No control endpoint has this path, or the trust-store entry named does not exist.
    case notFound = "not_found"
    /// The control endpoint does not take this method.
    case methodNotAllowed = "method_not_allowed"
    /// The control request's body is not the JSON the endpoint takes.
    case invalidJSON = "invalid_json"
    /// The control request's body is over 1 MiB.
    case bodyTooLarge = "body_too_large"
    /// A `DELETE` lacks a query parameter it needs.
    case missingParameter = "missing_parameter"
    /// A query parameter has a value the endpoint does not take (`GET /v1/flows?last=x`).
    case invalidParameter = "invalid_parameter"
    /// `GET /v1/flows`: the flow log is off (`[flows] keep = 0`).
    case flowLogOff = "flow_log_off"
    /// `/v1/cache/...`: the HTTP cache is off (`[cache] enabled = false`).
    case cacheOff = "cache_off"
    /// A URL in a control request is not a usable http(s) URL (or not https where certificates are asked for).
    case invalidURL = "invalid_url"
    /// A host pattern in a control request does not parse.
    case invalidHostPattern = "invalid_host_pattern"
    /// A host pattern would cover a public suffix (Public Suffix List).
    case publicSuffixPattern = "public_suffix_pattern"
    /// An exception's `expires` is not a lifetime such as `30d`.
    case invalidLifetime = "invalid_lifetime"
    /// A Basic user name contains `:`.
    case invalidUser = "invalid_user"
    /// `persistence` is not one of the values the endpoint takes.
    case invalidPersistence = "invalid_persistence"
    /// No stored password matches the origin, realm and user.
    case passwordNotFound = "password_not_found"

    // MARK: Control API: agents

    /// The agent id in the path is not a number.
    case invalidAgent = "invalid_agent"
    /// The challenge id in an agent's answer is not a number.
    case invalidChallenge = "invalid_challenge"
    /// An answer (an agent's or a re-authentication's) has none of the fields that answer.
    case missingAnswer = "missing_answer"
    /// An agent's `trust` is not `once`, `always` or `reject`.
    case invalidTrust = "invalid_trust"
    /// An agent's `scope` is not `exception` or `anchor` (for `always`).
    case invalidScope = "invalid_scope"
    /// The challenge is not pending for this agent (answered, withdrawn, timed out, or another agent's).
    case challengeNotFound = "challenge_not_found"
    /// The agent answered a challenge with an answer of another kind.
    case wrongAnswerKind = "wrong_answer_kind"

    // MARK: Control API: the trust store

    /// An anchor id prefix matches several anchors.
    case ambiguous
    /// An anchor id prefix is not at least 8 hex digits.
    case invalidPrefix = "invalid_prefix"
    /// The input is not a valid X.509 certificate or PEM.
    case invalidCertificate = "invalid_certificate"
    /// The PEM input holds something other than a certificate.
    case notACertificate = "not_a_certificate"
    /// The PEM input is larger than the trust store reads.
    case inputTooLarge = "input_too_large"
    /// A pin is not a base64 SHA-256 public-key hash.
    case invalidPin = "invalid_pin"
    /// A certificate fingerprint is not a SHA-256 (64 hex digits).
    case invalidFingerprint = "invalid_fingerprint"
    /// `trust.json` cannot be used as it is.
    case corruptFile = "corrupt_file"
    /// `trust.json` was changed outside the broker and cannot be read now; nothing is written over it.
    case changedOnDisk = "changed_on_disk"
    /// Reading or writing `trust.json` (or its directory) failed.
    case ioError = "io_error"

    // MARK: Control API: client identities

    /// A client identity name is not 1 to 64 letters, digits, `.`, `_` or `-`.
    case invalidIdentityName = "invalid_identity_name"
    /// The identity to import is unusable: too large, unreadable, no certificate, or a key that does not open or match.
    case invalidIdentity = "invalid_identity"
    /// An import gives neither `pkcs12_base64` nor `cert_pem` and `key_pem`.
    case missingIdentity = "missing_identity"
    /// A client identity of that name exists already (and `replace` was not asked for).
    case identityExists = "identity_exists"
    /// No client identity has that name (in a control request or `Authbroker-Identity`).
    case unknownIdentity = "unknown_identity"

    // MARK: Control API: re-authentication (PAM)

    /// Revealing a secret needs a recent re-authentication of this process.
    case reauthenticationRequired = "reauthentication_required"
    /// The daemon cannot run PAM, so it reveals no secrets.
    case reauthenticationUnavailable = "reauthentication_unavailable"
    /// The daemon could not identify the process on the connection.
    case peerUnknown = "peer_unknown"
    /// The transaction id in the path is not a number.
    case invalidTransaction = "invalid_transaction"
    /// The re-authentication does not exist, has ended, or belongs to another process.
    case transactionNotFound = "transaction_not_found"
    /// Another re-authentication for the user is under way.
    case attemptInProgress = "attempt_in_progress"
    /// Re-authentication failed several times; retry after `Retry-After`.
    case tooManyAttempts = "too_many_attempts"
    /// PAM did not accept the answer (a wrong password).
    case authenticationFailed = "authentication_failed"
    /// PAM refused the account now (expired, locked, password change required).
    case accountUnavailable = "account_unavailable"
    /// PAM does not know the user.
    case userUnknown = "user_unknown"
    /// A PAM prompt was not answered in time.
    case timedOut = "timed_out"
    /// The client cancelled the re-authentication.
    case cancelled
    /// An answer was one PAM cannot use.
    case conversationFailed = "conversation_failed"
    /// PAM itself could not run, or the daemon does not know its own user's name.
    case systemError = "system_error"

    // MARK: The secret store

    /// The daemon has no secret store at all.
    case secretStoreUnavailable = "secret_store_unavailable"
    /// The Secret Service keyring (or the item) is locked.
    case secretStoreLocked = "secret_store_locked"
    /// No Secret Service answers (no session bus, no keyring daemon, a timeout).
    case secretStoreServiceUnavailable = "secret_store_service_unavailable"
    /// The encrypted secrets file is damaged, truncated or not the broker's.
    case secretStoreCorrupt = "secret_store_corrupt"
    /// The key that encrypts the secrets file is missing.
    case secretStoreKeyMissing = "secret_store_key_missing"
    /// The secrets file's key is not usable, or does not open the file.
    case secretStoreKeyInvalid = "secret_store_key_invalid"
    /// A secrets file or directory has permissions or an owner that would expose secrets.
    case secretStorePermission = "secret_store_permission"
    /// Reading or writing a secrets file failed.
    case secretStoreIO = "secret_store_io"
    /// Another writer held the secrets file's lock for longer than the store waits.
    case secretStoreBusy = "secret_store_busy"
    /// The secret store refused the attributes, label or secret it was given.
    case secretStoreInvalidInput = "secret_store_invalid_input"
    /// The Secret Service answered with an error the broker does not know.
    case secretStoreServiceFailed = "secret_store_service_failed"

    // MARK: The broker itself

    /// A bug in the daemon.
    case internalError = "internal_error"

    /// The wire form, so that string interpolation (log lines, messages) shows the code as sent.
    package var description: String { self.rawValue }
}
