import Foundation
import Testing
import TestSupport

/// `authbrokerctl`'s password prompt on a real terminal (a pseudo-terminal Python's `pty` opens,
/// as a shell's would be): echo is off while it waits, and back on however it ends.
@Suite("Password prompt")
struct PasswordPromptTests {
    /// Starts `authbrokerctl passwords add` on a new pty, waits for its prompt, types `keys`,
    /// and reports what the terminal and the process came to.
    static let driver = """
        import os, pty, select, sys, termios, time
        pid, fd = pty.fork()
        if pid == 0:
            os.execv(sys.argv[1], [sys.argv[1], "passwords", "add", "https://prompt.test", "--user", "alice",
                                   "--socket", sys.argv[2]])
        seen = b""
        deadline = time.time() + 20
        while b"Password: " not in seen and time.time() < deadline:
            ready, _, _ = select.select([fd], [], [], 0.5)
            if ready:
                try:
                    seen += os.read(fd, 1024)
                except OSError:
                    break
        during = termios.tcgetattr(fd)[3] & termios.ECHO
        core = [line.split() for line in open("/proc/%d/limits" % pid) if line.startswith("Max core file size")]
        print("core files: " + (" ".join(core[0][4:6]) if core else "unknown"))
        keys = sys.argv[3].encode().decode("unicode_escape").encode("latin-1")
        if keys.startswith(b"\\x1a"):
            # Ctrl-Z first. This child leads its own session, so its process group is orphaned
            # and the kernel does not stop it: the prompt must carry on, echo off again.
            os.write(fd, b"\\x1a")
            time.sleep(0.5)
            print("echo after Ctrl-Z: " + ("on" if termios.tcgetattr(fd)[3] & termios.ECHO else "off"))
            keys = keys[1:]
        os.write(fd, keys)
        _, status = os.waitpid(pid, 0)
        after = termios.tcgetattr(fd)[3] & termios.ECHO
        print("prompted" if b"Password: " in seen else "no prompt: %r" % seen)
        print("echo while prompting: " + ("on" if during else "off"))
        print("echo after: " + ("on" if after else "off"))
        print("signal: %d" % (os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0))
        """

    static func prompt(typing keys: String) throws -> String {
        let directory = try DaemonProcess.makeTemporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let run = try CLIAndClientsTests.run(
            "/usr/bin/python3", ["-c", Self.driver, DaemonProcess.binDirectory + "/authbrokerctl", directory + "/no-daemon.sock", keys]
        )
        #expect(run.status == 0, "\(run.stderr)")
        return run.stdout
    }

    @Test("Ctrl-C at the prompt ends authbrokerctl by SIGINT and leaves the terminal echoing")
    func interruptRestoresEcho() throws {
        let report = try Self.prompt(typing: "\\x03")
        #expect(report.contains("prompted"), "\(report)")
        #expect(report.contains("echo while prompting: off"), "\(report)")
        #expect(report.contains("echo after: on"), "\(report)")
        #expect(report.contains("signal: 2"), "\(report)")
        // It holds the password typed: no core file of it, soft or hard limit.
        #expect(report.contains("core files: 0 0"), "\(report)")
    }

    @Test("Ctrl-Z that does not stop the prompt: echo off again, the password still read, echo back on at the end")
    func suspendKeepsThePrompt() throws {
        let report = try Self.prompt(typing: "\\x1asecret\\n")
        #expect(report.contains("echo after Ctrl-Z: off"), "\(report)")
        #expect(report.contains("echo after: on") && report.contains("signal: 0"), "\(report)")
    }

    @Test("a password typed and Enter: echo back on (the command then fails: no daemon)")
    func enterRestoresEcho() throws {
        let report = try Self.prompt(typing: "secret\\n")
        #expect(report.contains("prompted") && report.contains("echo after: on") && report.contains("signal: 0"), "\(report)")
    }
}
