/// The version of authbrokerd and authbrokerctl, reported by `--version` and `GET /v1/status`.
package enum AuthBrokerVersion {
    package static let current = "0.1.0"
}
