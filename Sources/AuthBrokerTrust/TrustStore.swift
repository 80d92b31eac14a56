import AuthBrokerCore
import Foundation
import SwiftASN1
import NIOConcurrencyHelpers
import Synchronization
import X509

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// The user's own anchors, pins, exact-certificate exceptions and client identities (their
/// public part), persisted as JSON at `path`; plus exceptions for this run only ("trust once"),
/// kept in memory.
///
/// Every change is written before it is visible: a temporary file in the same directory
/// (mode 0600), `fsync`, then `rename` over the old file, so a crash leaves either the old or
/// the new store, never half of one. The parent directory is created 0700 when missing.
/// `generation` bumps on every change so that cached trust decisions can key on it.
///
/// Changes are made one at a time, under a lock only changes take, held across reading the
/// file, saving it and publishing the result; the lock readers take (every TLS evaluation, on
/// an event loop) is held only to copy the state in and to publish it, never across file I/O.
///
/// The file is the user's too: a hand edit (an anchor deleted with an editor) is picked up, not
/// undone. The store remembers the `FileStamp` of the file as it last read or wrote it; every
/// change first reads the file again when it is no longer that file, and applies the change to
/// what is there now; evaluations and listings pick up the new file too (`refreshFromDisk`),
/// and the daemon calls that once a second (`TrustStoreWatch`) so pooled connections notice. A file changed into
/// something unreadable is never written over: changes fail with `changed_on_disk`, and the
/// last good contents stay in force until the file is fixed.
package final class TrustStore: Sendable {
    /// Largest PEM input `addAnchors` reads; a CA bundle of a few hundred certificates fits.
    package static let maxPEMInputBytes = 1 << 20
    /// Largest store file read at start-up.
    package static let maxFileBytes = 32 << 20

    package let path: String

    struct State {
        var anchors: [TrustAnchor]
        var certificates: [String: Certificate]
        var pins: [SPKIPin]
        var identities: [ClientIdentity]
        var exceptions: [CertificateException]
        /// "Trust once" answers: never saved, gone when the daemon stops.
        var sessionExceptions: [CertificateException] = []
        var generation: UInt64
        /// The file as last read or written (nil: there was none).
        var fileStamp: FileStamp?
        /// A version of the file that could not be read, and why: not read again until it
        /// changes, and never written over.
        var unreadable: (stamp: FileStamp?, error: TrustStoreError)?
    }

    /// What readers see: taken briefly, never across file I/O.
    private let state: NIOLockedValueBox<State>
    /// Held by one change at a time across its read, save and publication (`modify`), so that
    /// changes are serialized and none is lost, while readers go on with the published state.
    private let changing = NIOLock()
    /// Called by a change just before it saves, for tests (to hold a save while readers run).
    private let willSave: (@Sendable () -> Void)?
    /// `state.generation`, stored after each change under the lock: every relayed HTTPS request
    /// reads it (is its pooled connection still trusted?), and both event loops taking the
    /// store's lock for it was a point of contention.
    private let publishedGeneration = Synchronization.Atomic<UInt64>(0)

    /// Opens the store at `path`: a missing file is an empty store; an unreadable or corrupt
    /// one is an error naming the file and what to do.
    ///
    /// - Parameter willSave: for tests: called by every change just before it saves the file.
    package init(path: String, willSave: (@Sendable () -> Void)? = nil) throws(TrustStoreError) {
        self.path = path
        self.state = NIOLockedValueBox(try Self.read(path: path))
        self.willSave = willSave
    }

    /// The file's contents as a state (generation 0, no session exceptions), stamped before
    /// it is read: a change made while it is read shows as a changed stamp next time.
    private static func read(path: String) throws(TrustStoreError) -> State {
        let stamp = FileStamp.of(path: path)
        let file = try Self.load(path: path)
        var certificates: [String: Certificate] = [:]
        for anchor in file.anchors {
            do {
                certificates[anchor.id] = try Certificate(derEncoded: anchor.der)
            } catch {
                throw Self.corrupt(path, "anchor \(anchor.id) is not a valid certificate (\(error))")
            }
        }
        return State(
            anchors: file.anchors, certificates: certificates, pins: file.pins, identities: file.identities ?? [],
            exceptions: file.exceptions ?? [], generation: 0, fileStamp: stamp
        )
    }

    /// Reads the file again when it is no longer the one last read or written (a hand edit,
    /// another tool), and makes its contents current: returns whether it did. A file that
    /// cannot be read leaves the current contents in force and throws (it is read again only
    /// once it changes).
    @discardableResult
    package func refreshFromDisk() throws(TrustStoreError) -> Bool {
        let stamp = FileStamp.of(path: self.path)
        let known = self.state.withLockedValue { state -> (current: Bool, unreadable: TrustStoreError?, installed: FileStamp?) in
            if stamp == state.fileStamp { return (true, nil, state.fileStamp) }
            if let unreadable = state.unreadable, unreadable.stamp == stamp { return (true, unreadable.error, state.fileStamp) }
            return (false, nil, state.fileStamp)
        }
        if let unreadable = known.unreadable { throw unreadable }
        if known.current { return false }
        let read: State
        do {
            read = try Self.read(path: self.path)
        } catch {
            let changed = Self.changedOnDisk(self.path, error)
            self.state.withLockedValue { $0.unreadable = (stamp, changed) }
            throw changed
        }
        return self.state.withLockedValue { state in
            // A change (or another refresh) published meanwhile is at least as new as this
            // read, which may have begun before that change saved: it is kept.
            guard state.fileStamp == known.installed else { return false }
            Self.install(read, into: &state)
            self.bumpGeneration(&state)
            return true
        }
    }

    /// `refreshFromDisk` for readers, which go on with the current contents when the file
    /// cannot be read (changes say why).
    private func refreshQuietly() {
        _ = try? self.refreshFromDisk()
    }

    /// `read`'s contents replace `state`'s saved ones; the session ("once") exceptions stay.
    private static func install(_ read: State, into state: inout State) {
        state.anchors = read.anchors
        state.certificates = read.certificates
        state.pins = read.pins
        state.identities = read.identities
        state.exceptions = read.exceptions
        state.fileStamp = read.fileStamp
        state.unreadable = nil
    }

    private static func changedOnDisk(_ path: String, _ error: TrustStoreError) -> TrustStoreError {
        TrustStoreError(
            .changedOnDisk,
            "The trust store \(path) was changed outside the broker and cannot be read now: \(error.message) "
                + "The broker keeps using what it read before and will not write over the file: fix the file (or move it aside) and try again."
        )
    }

    /// Bumps on every change to the anchors, pins, exceptions (saved or not) or identities.
    package var generation: UInt64 {
        self.publishedGeneration.load(ordering: .acquiring)
    }

    /// A change to `state`, under the lock: the generation bumps and is published.
    private func bumpGeneration(_ state: inout State) {
        state.generation &+= 1
        self.publishedGeneration.store(state.generation, ordering: .releasing)
    }

    package func anchors() -> [TrustAnchor] {
        self.refreshQuietly()
        return self.state.withLockedValue { $0.anchors }
    }

    package func pins() -> [SPKIPin] {
        self.refreshQuietly()
        return self.state.withLockedValue { $0.pins }
    }

    /// Anchors with their parsed certificates, pins and generation, read together.
    struct Snapshot: Sendable {
        var generation: UInt64
        var anchors: [(anchor: TrustAnchor, certificate: Certificate)]
        var pins: [SPKIPin]
        /// Saved and session exceptions together.
        var exceptions: [CertificateException]
    }

    /// The store at `now`: exceptions that have expired by then are left out.
    func snapshot(now: Date = Date()) -> Snapshot {
        self.refreshQuietly()
        return self.state.withLockedValue { state in
            Snapshot(
                generation: state.generation,
                anchors: state.anchors.compactMap { anchor in
                    state.certificates[anchor.id].map { (anchor, $0) }
                },
                pins: state.pins,
                exceptions: (state.exceptions + state.sessionExceptions).filter { !$0.isExpired(at: now) }
            )
        }
    }

    /// Something the store's decisions rest on changed outside it (the system's roots): the
    /// generation bumps, so cached decisions and pooled connections verified before are dropped.
    package func invalidate() {
        // Under `changing` too: a change in progress publishes after this, from its own copy.
        self.changing.withLock {
            self.state.withLockedValue { self.bumpGeneration(&$0) }
        }
    }

    /// Removes the saved exceptions that have expired by `now`, from the file too, and returns
    /// them. The daemon calls it once a second, so that the generation moves when one expires
    /// and no cached decision or pooled connection outlives it.
    @discardableResult
    package func removeExpiredExceptions(now: Date = Date()) throws(TrustStoreError) -> [CertificateException] {
        guard self.state.withLockedValue({ $0.exceptions.contains { $0.isExpired(at: now) } }) else { return [] }
        return try self.modify { state throws(TrustStoreError) in
            let expired = state.exceptions.filter { $0.isExpired(at: now) }
            state.exceptions.removeAll { $0.isExpired(at: now) }
            return expired
        }
    }

    /// Adds every `CERTIFICATE` block in `pem` as an anchor limited to `hosts` (empty: any host).
    ///
    /// A certificate already present keeps its id and date and gets `hosts` as its new host
    /// list (`widening`: `hosts` are added to its list, and one for any host stays so); it is
    /// returned too. Other PEM blocks (a private key in a combined file) are ignored, but input
    /// with no certificate at all is an error.
    ///
    /// - Parameter widening: for a certificate the user did not pick themselves (an agent's
    ///   "always (anchor)" takes the top of what a server sent, which a hostile server can make
    ///   an anchor the user already holds for other hosts: replacing its hosts would take those
    ///   from it).
    @discardableResult
    package func addAnchors(
        pem: String,
        hosts: [HostPattern],
        widening: Bool = false,
        now: Date = Date()
    ) throws(TrustStoreError) -> [TrustAnchor] {
        let certificates = try Self.parseCertificates(pem: pem)
        let hosts = Self.unique(hosts)
        let addedAt = Self.wholeSeconds(now)
        return try self.modify { state throws(TrustStoreError) in
            var result: [TrustAnchor] = []
            for (certificate, der) in certificates {
                let id = CertificateDigests.id(der: der)
                if let index = state.anchors.firstIndex(where: { $0.id == id }) {
                    if !widening {
                        state.anchors[index].hosts = hosts
                    } else if !state.anchors[index].hosts.isEmpty {
                        state.anchors[index].hosts = Self.unique(state.anchors[index].hosts + hosts)
                    }
                    if !result.contains(where: { $0.id == id }) { result.append(state.anchors[index]) }
                } else {
                    let anchor = TrustAnchor(certificate: certificate, der: der, hosts: hosts, addedAt: addedAt)
                    state.anchors.append(anchor)
                    state.certificates[id] = certificate
                    result.append(anchor)
                }
            }
            return result
        }
    }

    /// Removes the anchor whose id starts with `idPrefix` (at least 8 hex digits; colons and
    /// case ignored, so a colon-separated fingerprint works too).
    @discardableResult
    package func removeAnchor(idPrefix: String) throws(TrustStoreError) -> TrustAnchor {
        let prefix = String(idPrefix.filter { $0 != ":" && !$0.isWhitespace }).lowercased()
        guard prefix.count >= 8, prefix.count <= 64, prefix.allSatisfy({ $0.isHexDigit && $0.isASCII }) else {
            throw TrustStoreError(
                .invalidPrefix,
                "'\(idPrefix.prefix(100))' is not an anchor id prefix. Give at least 8 hex digits of the anchor's id (its SHA-256 fingerprint); list the anchors to see the ids."
            )
        }
        return try self.modify { state throws(TrustStoreError) in
            let matches = state.anchors.indices.filter { state.anchors[$0].id.hasPrefix(prefix) }
            guard let index = matches.first else {
                throw TrustStoreError(
                    .notFound,
                    "No trust anchor has an id starting with \(prefix). List the anchors to see their ids."
                )
            }
            guard matches.count == 1 else {
                let candidates = matches.map { "\(state.anchors[$0].id) (\(state.anchors[$0].certificate.subject))" }
                throw TrustStoreError(
                    .ambiguous,
                    "Several trust anchors have ids starting with \(prefix): \(candidates.joined(separator: "; ")). Give more digits of the id."
                )
            }
            let removed = state.anchors.remove(at: index)
            state.certificates[removed.id] = nil
            return removed
        }
    }

    /// Pins `host` to a public key. Adding a pin that exists already returns it unchanged.
    @discardableResult
    package func addPin(host: HostPattern, spkiSHA256: String, now: Date = Date()) throws(TrustStoreError) -> SPKIPin {
        let pin = try SPKIPin(host: host, spkiSHA256: spkiSHA256, addedAt: Self.wholeSeconds(now))
        if let existing = self.state.withLockedValue({ state in
            state.pins.first { $0.host == pin.host && $0.spkiSHA256 == pin.spkiSHA256 }
        }) {
            return existing
        }
        return try self.modify { state throws(TrustStoreError) in
            if let existing = state.pins.first(where: { $0.host == pin.host && $0.spkiSHA256 == pin.spkiSHA256 }) {
                return existing
            }
            state.pins.append(pin)
            return pin
        }
    }

    /// Removes the pin of `host` to `spkiSHA256`.
    @discardableResult
    package func removePin(host: HostPattern, spkiSHA256: String) throws(TrustStoreError) -> SPKIPin {
        let digest = try SPKIPin.canonicalDigest(spkiSHA256)
        return try self.modify { state throws(TrustStoreError) in
            guard let index = state.pins.firstIndex(where: { $0.host == host && $0.spkiSHA256 == digest }) else {
                throw TrustStoreError(
                    .notFound,
                    "\(host) is not pinned to \(digest). List the pins to see which exist."
                )
            }
            return state.pins.remove(at: index)
        }
    }

    // MARK: - Exact-certificate exceptions

    /// The saved exceptions and the session ("trust once") ones.
    package func exceptions() -> (saved: [CertificateException], session: [CertificateException]) {
        self.refreshQuietly()
        return self.state.withLockedValue { ($0.exceptions, $0.sessionExceptions) }
    }

    /// Trusts the leaf `sha256` from `host` (on `port`, or any port when nil): saved in the file
    /// when `persistent`, else kept in memory until the daemon stops; until `expiresAt` when set.
    /// One that exists already is returned unchanged, unless its expiry differs: then the new
    /// expiry replaces it (adding it again with `--expires` shortens or extends it).
    @discardableResult
    package func addException(
        host: HostPattern, port: Int?, sha256: String, persistent: Bool, expiresAt: Date? = nil, now: Date = Date()
    ) throws(TrustStoreError) -> CertificateException {
        let exception = CertificateException(
            host: host, port: port, sha256: try CertificateException.canonicalFingerprint(sha256),
            addedAt: Self.wholeSeconds(now), expiresAt: expiresAt.map(Self.wholeSeconds)
        )
        if persistent {
            self.refreshQuietly()
            if let existing = self.state.withLockedValue({ $0.exceptions.first { $0.sameTarget(as: exception) } }),
                existing.expiresAt == exception.expiresAt
            {
                return existing
            }
            return try self.modify { state throws(TrustStoreError) in
                if let index = state.exceptions.firstIndex(where: { $0.sameTarget(as: exception) }) {
                    guard state.exceptions[index].expiresAt != exception.expiresAt else { return state.exceptions[index] }
                    state.exceptions[index].expiresAt = exception.expiresAt
                    return state.exceptions[index]
                }
                state.exceptions.append(exception)
                return exception
            }
        }
        return self.state.withLockedValue { state in
            if let existing = state.sessionExceptions.first(where: { $0.sameTarget(as: exception) }) { return existing }
            state.sessionExceptions.append(exception)
            self.bumpGeneration(&state)
            return exception
        }
    }

    /// Removes the exception for exactly this host pattern, port and certificate, saved or
    /// session (both, when both exist); returns it and whether it was saved.
    @discardableResult
    package func removeException(
        host: HostPattern, port: Int?, sha256: String
    ) throws(TrustStoreError) -> (exception: CertificateException, persistent: Bool) {
        let target = CertificateException(
            host: host, port: port, sha256: try CertificateException.canonicalFingerprint(sha256), addedAt: Date()
        )
        self.refreshQuietly()
        let removedSession = self.state.withLockedValue { state -> CertificateException? in
            guard let index = state.sessionExceptions.firstIndex(where: { $0.sameTarget(as: target) }) else { return nil }
            self.bumpGeneration(&state)
            return state.sessionExceptions.remove(at: index)
        }
        guard self.state.withLockedValue({ $0.exceptions.contains { $0.sameTarget(as: target) } }) else {
            if let removedSession { return (removedSession, false) }
            throw TrustStoreError(
                .notFound,
                "There is no exception for \(target.hostDescription) and the certificate \(target.sha256). List the exceptions to see which exist."
            )
        }
        return try self.modify { state throws(TrustStoreError) in
            guard let index = state.exceptions.firstIndex(where: { $0.sameTarget(as: target) }) else {
                if let removedSession { return (removedSession, false) }
                throw TrustStoreError(.notFound, "The exception for \(target.hostDescription) was removed meanwhile.")
            }
            return (state.exceptions.remove(at: index), true)
        }
    }

    // MARK: - Client identities

    package func identities() -> [ClientIdentity] {
        self.refreshQuietly()
        return self.state.withLockedValue { $0.identities }
    }

    /// The identity to present to `host` now (see `ClientIdentity.choose`), or nil for none.
    package func clientIdentity(for host: String, requested: String?, now: Date = Date()) throws(TrustStoreError) -> ClientIdentity? {
        try ClientIdentity.choose(from: self.identities(), host: host, requested: requested, now: now)
    }

    /// The identity chosen for `host` when the request names none, with how long that choice
    /// holds: while the store stays at `generation` and the time is before `validUntil`.
    package struct AutomaticIdentity: Sendable {
        package let identity: ClientIdentity?
        package let generation: UInt64
        package let validUntil: Date

        /// Whether the choice still holds in `store` at `now`.
        package func holds(in store: TrustStore, at now: Date = Date()) -> Bool {
            store.generation == self.generation && now < self.validUntil
        }
    }

    /// `clientIdentity(for: host, requested: nil, now:)`, with how long its answer holds (the
    /// direct relay keeps it per client connection rather than choose again for every request).
    package func automaticClientIdentity(for host: String, now: Date = Date()) -> AutomaticIdentity {
        // Read together, so the generation is the one the identities belong to.
        let (identities, generation) = self.state.withLockedValue { ($0.identities, $0.generation) }
        return AutomaticIdentity(
            identity: ClientIdentity.chooseAutomatically(from: identities, host: host, now: now), generation: generation,
            validUntil: ClientIdentity.nextValidityChange(in: identities, after: now) ?? .distantFuture
        )
    }

    /// Adds a client identity; one with the same name is an error unless `replace` is set.
    package func addIdentity(_ identity: ClientIdentity, replace: Bool) throws(TrustStoreError) {
        var identity = identity
        identity.addedAt = Self.wholeSeconds(identity.addedAt)  // as the file keeps it
        try self.modify { state throws(TrustStoreError) in
            if let index = state.identities.firstIndex(where: { $0.name == identity.name }) {
                guard replace else {
                    throw TrustStoreError(
                        .identityExists,
                        "A client identity named '\(identity.name)' exists already. Choose another --name, or remove it first with `authbrokerctl identities remove \(identity.name)`."
                    )
                }
                state.identities[index] = identity
            } else {
                state.identities.append(identity)
            }
        }
    }

    /// Removes the client identity `name` and returns it.
    @discardableResult
    package func removeIdentity(name: String) throws(TrustStoreError) -> ClientIdentity {
        try self.modify { state throws(TrustStoreError) in
            guard let index = state.identities.firstIndex(where: { $0.name == name }) else {
                throw TrustStoreError(
                    .unknownIdentity,
                    "There is no client identity named '\(name.prefix(80))'. `authbrokerctl identities list` shows the ones there are."
                )
            }
            return state.identities.remove(at: index)
        }
    }

    // MARK: - Changing and saving

    /// Applies `change` to a copy of the state, saves it, and only then publishes it. When the
    /// file is no longer the one last read or written, the change applies to what the file
    /// holds now (a hand edit is kept, not undone); a file that cannot be read is not written over.
    ///
    /// One change at a time (`changing`); readers' lock (`state`) is taken only to copy the
    /// state and to publish it, so evaluations go on while the file is read and saved.
    private func modify<Result: Sendable>(
        _ change: (inout State) throws(TrustStoreError) -> Result
    ) throws(TrustStoreError) -> Result {
        self.changing.lock()
        defer { self.changing.unlock() }
        // What the last change published, or a refresh installed since: no other change can
        // publish before this one does.
        var copy = self.state.withLockedValue { $0 }
        let stamp = FileStamp.of(path: self.path)
        if stamp != copy.fileStamp {
            do throws(TrustStoreError) {
                Self.install(try Self.read(path: self.path), into: &copy)
            } catch {
                let changed = Self.changedOnDisk(self.path, error)
                self.state.withLockedValue { $0.unreadable = (stamp, changed) }
                throw changed
            }
        }
        let result = try change(&copy)
        self.willSave?()
        try Self.save(
            StoreFile(anchors: copy.anchors, pins: copy.pins, identities: copy.identities, exceptions: copy.exceptions),
            path: self.path
        )
        copy.fileStamp = FileStamp.of(path: self.path)
        // The saved contents only: session exceptions may have changed meanwhile, and stay.
        self.state.withLockedValue { state in
            Self.install(copy, into: &state)
            self.bumpGeneration(&state)
        }
        return result
    }

    struct StoreFile: Codable {
        static let currentVersion = 1
        var version: Int = StoreFile.currentVersion
        var anchors: [TrustAnchor]
        var pins: [SPKIPin]
        /// Absent in files written before identities existed.
        var identities: [ClientIdentity]?
        /// Absent in files written before exceptions existed.
        var exceptions: [CertificateException]?
    }

    private static func load(path: String) throws(TrustStoreError) -> StoreFile {
        // O_NOFOLLOW and an owner check: under the /tmp fallback another user could plant a
        // trust.json whose anchor would then be trusted for every host.
        let bytes: [UInt8]
        do {
            guard let read = try PrivateFiles.readOwnedFile(path, what: "the trust store", maxBytes: Self.maxFileBytes) else {
                return StoreFile(anchors: [], pins: [])
            }
            bytes = read
        } catch {
            switch error.kind {
            case .tooLarge:
                throw corrupt(path, "it is larger than a trust store can be (\(Self.maxFileBytes) bytes)")
            case .untrusted:
                throw TrustStoreError(.ioError, "\(error.description) The trust store was not loaded.")
            case .io:
                throw TrustStoreError(.ioError, error.description)
            }
        }
        let data = Data(bytes)
        let file: StoreFile
        do {
            file = try BrokerJSON.decoder().decode(StoreFile.self, from: data)
        } catch {
            throw corrupt(path, "it is not a trust store the broker can read (\(describe(error)))")
        }
        guard file.version == StoreFile.currentVersion else {
            throw corrupt(
                path,
                "it has format version \(file.version), and this broker reads version \(StoreFile.currentVersion) (was it written by a newer version?)"
            )
        }
        return file
    }

    private static func corrupt(_ path: String, _ what: String) -> TrustStoreError {
        TrustStoreError(
            .corruptFile,
            "The trust store \(path) cannot be used: \(what). Move it aside (mv '\(path)' '\(path).bad') to start with an empty store, then add your anchors and pins again."
        )
    }

    private static func describe(_ error: any Error) -> String {
        switch error {
        case DecodingError.dataCorrupted(let context), DecodingError.keyNotFound(_, let context),
            DecodingError.typeMismatch(_, let context), DecodingError.valueNotFound(_, let context):
            let where_ = context.codingPath.map(\.stringValue).joined(separator: ".")
            return where_.isEmpty ? context.debugDescription : "\(where_): \(context.debugDescription)"
        default:
            return "\(error)"
        }
    }

    /// Writes `file` atomically: temp file (0600) + fsync + rename + fsync of the directory.
    private static func save(_ file: StoreFile, path: String) throws(TrustStoreError) {
        let encoder = BrokerJSON.encoder()
        encoder.outputFormatting.insert(.prettyPrinted)
        let data: Data
        do {
            data = try encoder.encode(file)
        } catch {
            throw TrustStoreError(.ioError, "Cannot encode the trust store: \(error).")
        }
        let dirPath = AtomicFile.directory(of: path)
        if !FileManager.default.fileExists(atPath: dirPath) {
            do {
                try FileManager.default.createDirectory(
                    atPath: dirPath,
                    withIntermediateDirectories: true,
                    attributes: [.posixPermissions: 0o700]
                )
            } catch {
                throw TrustStoreError(
                    .ioError,
                    "Cannot create the directory \(dirPath) for the trust store: \(error.localizedDescription). Check its parent's permissions."
                )
            }
        }
        do {
            try AtomicFile.write([UInt8](data), to: path)
        } catch {
            throw TrustStoreError(
                .ioError,
                "Cannot save the trust store \(path) (\(error.description)). Check the permissions and free space of \(dirPath); the store was not changed."
            )
        }
    }

    // MARK: - Input

    /// The certificates of every `CERTIFICATE` block in `pem`, with their DER.
    static func parseCertificates(pem: String) throws(TrustStoreError) -> [(Certificate, [UInt8])] {
        guard pem.utf8.count <= Self.maxPEMInputBytes else {
            throw TrustStoreError(
                .inputTooLarge,
                "The input is \(pem.utf8.count) bytes; at most \(Self.maxPEMInputBytes) are read. Give the CA certificate itself rather than a whole bundle."
            )
        }
        let documents: [PEMDocument]
        do {
            documents = try PEMDocument.parseMultiple(pemString: pem)
        } catch {
            throw TrustStoreError(
                .invalidCertificate,
                "The input is not valid PEM (\(error)). Give the certificate in PEM form: a block from -----BEGIN CERTIFICATE----- to -----END CERTIFICATE-----."
            )
        }
        var result: [(Certificate, [UInt8])] = []
        for (index, document) in documents.enumerated() where document.discriminator == "CERTIFICATE" {
            do {
                result.append((try Certificate(derEncoded: document.derBytes), document.derBytes))
            } catch {
                throw TrustStoreError(
                    .invalidCertificate,
                    "PEM block \(index + 1) is marked CERTIFICATE but is not a valid X.509 certificate (\(error)). Check that the file is complete and not corrupted."
                )
            }
        }
        guard !result.isEmpty else {
            let found = documents.map(\.discriminator)
            let what =
                found.isEmpty ? "no PEM block at all" : "only \(found.map { "a \($0) block" }.joined(separator: ", "))"
            throw TrustStoreError(
                .notACertificate,
                "The input holds \(what), not a certificate. Give the certificate in PEM form, starting with -----BEGIN CERTIFICATE-----."
            )
        }
        return result
    }

    private static func unique(_ hosts: [HostPattern]) -> [HostPattern] {
        var seen: Set<HostPattern> = []
        return hosts.filter { seen.insert($0).inserted }
    }

    /// Dates are stored in ISO 8601 to the second; round now so that what is returned equals
    /// what is read back.
    private static func wholeSeconds(_ date: Date) -> Date {
        Date(timeIntervalSince1970: date.timeIntervalSince1970.rounded(.down))
    }
}
