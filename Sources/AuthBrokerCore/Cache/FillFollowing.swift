import Foundation
import NIOHTTP1

extension CachePolicy {
    /// An app's own conditional or range request: the app validates, the origin answers.
    package static let appValidationFields = ["if-none-match", "if-modified-since", "if-match", "if-unmodified-since", "if-range", "range"]

    /// Whether a request that found its URL being fetched by another one (a collapsed miss) may
    /// be answered from that response while it is being stored, as a hit on it would be: a plain
    /// GET (no conditional or range fields, no broker cache directive), the variant the response
    /// is stored as (`Vary`; never `*`), and fresh for this request (§4: no `no-cache`, nor a
    /// `max-age` it exceeds). Otherwise the request goes to the origin itself.
    package static func mayFollowFill(
        method: String, requestHeaders: HTTPHeaders, status: Int, responseHeaders: HTTPHeaders, variantKey: String, timing: Timing,
        now: Date
    ) -> Bool {
        guard method == "GET", BrokerDirectives(headers: requestHeaders).cache == nil else { return false }
        guard !Self.appValidationFields.contains(where: { requestHeaders.contains(name: $0) }) else { return false }
        guard let vary = Self.varyFields(responseHeaders), Self.variantKey(varyingOn: vary, request: requestHeaders) == variantKey else {
            return false
        }
        guard case .fresh = Self.reuse(requestHeaders: requestHeaders, status: status, storedHeaders: responseHeaders, timing: timing, now: now)
        else { return false }
        return true
    }
}
