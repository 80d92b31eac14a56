import AuthBrokerCore
import AuthBrokerDaemon
import AuthBrokerPAM
import AuthBrokerSecrets
import AuthBrokerTrust
import Foundation
import NIOCore
import NIOHTTP1
import Testing

/// The codes of other modules' errors keep the wire form they had before `BrokerErrorCode`.
@Suite("Broker error codes of other modules' errors")
struct BrokerErrorCodeMappingTests {
    @Test("each request-target, trust-store and PAM code is sent as it is")
    func codesSentAsTheyAre() {
        for code in RequestTargetError.Code.allCases {
            #expect(BrokerErrorCode(code).rawValue == code.rawValue)
        }
        for code in TrustStoreError.Code.allCases {
            #expect(BrokerErrorCode(code).rawValue == code.rawValue)
        }
        for code in PAMError.Code.allCases {
            #expect(BrokerErrorCode(code).rawValue == code.rawValue)
        }
    }

    @Test("each secret-store code is sent as secret_store_<code>")
    func secretStoreCodesPrefixed() {
        for code in SecretStoreError.Code.allCases {
            #expect(BrokerErrorCode(code).rawValue == "secret_store_" + code.rawValue)
        }
    }

    @Test(
        "a secret-store failure renders its status, its Authbroker-Error and its problem code",
        arguments: [
            (SecretStoreError.locked, HTTPResponseStatus.serviceUnavailable, "secret_store_locked"),
            (.invalidInput, .badRequest, "secret_store_invalid_input"),
            (.corrupt, .internalServerError, "secret_store_corrupt"),
        ]
    )
    func secretStoreRendering(error: SecretStoreError, status: HTTPResponseStatus, code: String) throws {
        let (head, body) = BrokerError.secretStore(error).response(requestID: nil)
        #expect(head.status == status)
        #expect(head.headers.first(name: "Authbroker-Error") == code)
        let problem = try BrokerJSON.decoder().decode(ProblemDetails.self, from: Data(body.readableBytesView))
        #expect(problem.code == code)
        #expect(problem.type == "urn:authbroker:problem:" + code)
    }
}
