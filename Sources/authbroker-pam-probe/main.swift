// authbroker-pam-probe: a TEST TOOL, not installed with AuthBroker.
//
// Authenticates the user it runs as through PAM, the way authbrokerd does, so that tests can
// run PAM as an ordinary (non-root) user:
//
//     authbroker-pam-probe CONFIG_DIR [SERVICE] < password
//
// It reads the password from stdin (up to the first newline), uses the PAM service files in
// CONFIG_DIR (pam_start_confdir), and prints one line: the outcome code ("success",
// "authentication_failed", …), then the message on failure. It never prints the password.
// Exit status: 0 success, 1 authentication refused (wrong password, account, unknown user),
// 2 anything else (usage, timeout, system error).
import AuthBrokerPAM
import Foundation

let arguments = CommandLine.arguments
guard arguments.count == 2 || arguments.count == 3 else {
    FileHandle.standardError.write(Data("usage: authbroker-pam-probe CONFIG_DIR [SERVICE] < password\n".utf8))
    exit(2)
}
guard let user = PAMAuthenticator.currentUserName() else {
    print("system_error")
    print("no password database entry for uid \(getuid())")
    exit(2)
}

// Reserved up front so that appending never reallocates and leaves a partial copy behind.
var bytes: [UInt8] = []
bytes.reserveCapacity(4096)
while bytes.count < 4096 {
    var byte: UInt8 = 0
    let count = read(STDIN_FILENO, &byte, 1)
    if count <= 0 || byte == UInt8(ascii: "\n") { break }
    bytes.append(byte)
}
if bytes.last == UInt8(ascii: "\r") { bytes.removeLast() }
let password = PAMSecret(wiping: &bytes)

let authenticator = PAMAuthenticator(
    configuration: .init(
        service: arguments.count == 3 ? arguments[2] : "authbroker",
        configDirectory: arguments[1],
        promptTimeout: .seconds(10)
    )
)
let outcome = await authenticator.authenticate(user: user, responder: PAMPasswordResponder(password: password))
print(outcome.code)
switch outcome {
case .success:
    exit(0)
case .failure(let error):
    print(error.message)
    switch error {
    case .authenticationFailed, .accountUnavailable, .userUnknown: exit(1)
    default: exit(2)
    }
}
