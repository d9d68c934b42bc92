// The shipped systemd unit (tools/token-agent/systemd/token-agent.service) checked by systemd's
// own parser, `systemd-analyze verify`, which needs no running systemd.
//
// What verify does in this container (systemd 252, Debian 12, systemd not PID 1): for a good
// unit it prints nothing and exits 0. A missing executable is an error ("Command … is not
// executable"), which is why the copy's ExecStart/ExecReload point at real files here. A
// misspelled key (`WatchdogSecs=`) or an unparsable value (`Type=notfy`) is only a warning
// ("Unknown key 'WatchdogSecs' in section [Service], ignoring."), and with the default
// --recursive-errors=yes verify still exits 0; with --recursive-errors=no, used here, it exits 1.
// The test relies on neither alone: a failed exit and every output line naming the unit count as
// problems. The log level is set explicitly because a SYSTEMD_LOG_LEVEL of `err` in the
// environment would hide the warnings; the broken copies below prove that they are seen.

import Foundation
import TestSupportKit
import Testing

@Suite("token-agent.service passes systemd-analyze verify", .paced)
struct SystemdUnitTests {
    static let analyzer = ["/usr/bin/systemd-analyze", "/bin/systemd-analyze"].first { FileManager.default.isExecutableFile(atPath: $0) }
    static let skipReason: Comment = "systemd-analyze is not installed (package systemd)"

    @Test("CI has systemd-analyze (FLEET_REQUIRE_THIRD_PARTY=1): the unit check never skips there",
          .enabled(if: ProcessInfo.processInfo.environment["FLEET_REQUIRE_THIRD_PARTY"] == "1"))
    func analyzerPresentInCI() {
        #expect(Self.analyzer != nil, "\(Self.skipReason): .ci/run installs it")
    }

    static let shippedUnit = Checkout.root.appendingPathComponent("tools/token-agent/systemd/token-agent.service").path

    static let installedAgent = "ExecStart=/usr/local/bin/token-agent "
    static let installedKill = "ExecReload=/bin/kill "

    /// The shipped unit with its commands pointing at executables that exist here: the built
    /// token-agent beside the test bundle, and kill wherever this system has it.
    static func localCopy() throws -> String {
        let text = try String(contentsOfFile: shippedUnit, encoding: .utf8)
        try #require(text.contains(installedAgent), "the unit starts /usr/local/bin/token-agent")
        try #require(text.contains(installedKill), "the unit reloads with /bin/kill")
        let agent = AgentFixture.path
        try #require(FileManager.default.isExecutableFile(atPath: agent), "token-agent is built at \(agent)")
        let kill = try #require(["/bin/kill", "/usr/bin/kill"].first { FileManager.default.isExecutableFile(atPath: $0) })
        return text.replacingOccurrences(of: installedAgent, with: "ExecStart=\(agent) ")
            .replacingOccurrences(of: installedKill, with: "ExecReload=\(kill) ")
    }

    /// Runs verify on `unit` saved as `token-agent.service` in a fresh directory; returns the
    /// problems: the output lines naming the unit (by path or by name), and a failed exit.
    static func verify(_ unit: String, dropIn: String? = nil) async throws -> (problems: [String], output: String) {
        let scratch = Scratch()
        let path = scratch.file("token-agent.service")
        try unit.write(toFile: path, atomically: true, encoding: .utf8)
        if let dropIn {
            // verify reads drop-ins from <unit>.d/ beside the unit, as systemd does from /etc.
            try FileManager.default.createDirectory(atPath: scratch.file("token-agent.service.d"), withIntermediateDirectories: true)
            try dropIn.write(toFile: scratch.file("token-agent.service.d/postgres.conf"), atomically: true, encoding: .utf8)
        }
        let executable = try #require(Self.analyzer)
        // --recursive-errors=no: the exit status speaks for this unit, not for whatever state
        // the machine's own units (network-online.target, multi-user.target) are in.
        let result = try await runToEnd(executable, ["verify", "--man=no", "--generators=no", "--recursive-errors=no", path],
                                        environment: ["SYSTEMD_LOG_LEVEL": "info", "SYSTEMD_LOG_TARGET": "console", "SYSTEMD_LOG_COLOR": "0"],
                                        in: scratch, timeout: 60)
        let output = result.stdout + result.stderr
        var problems = output.split(separator: "\n").map(String.init)
            .filter { $0.contains(path) || $0.contains("token-agent.service") || $0.contains("postgres.conf") }
        if result.status != 0 { problems.append("exit status \(result.status)") }
        return (problems, output)
    }

    @Test("the shipped unit verifies without a warning", .enabled(if: analyzer != nil, skipReason))
    func shippedUnitVerifies() async throws {
        let (problems, output) = try await Self.verify(try Self.localCopy())
        #expect(problems.isEmpty, "systemd-analyze verify: \(output)")
    }

    /// Ways to break the unit, each a replacement of one line's text, and what verify must say.
    enum Breakage: String, CaseIterable, CustomTestStringConvertible {
        case misspelledKey, badValue, missingExecutable
        var testDescription: String { rawValue }

        var edit: (from: String, to: String, reported: String) {
            switch self {
            case .misspelledKey: ("\nWatchdogSec=", "\nWatchdogSecs=", "WatchdogSecs")
            case .badValue: ("\nType=notify\n", "\nType=notfy\n", "notfy")
            case .missingExecutable: ("\nExecStart=/", "\nExecStart=/nonexistent/", "/nonexistent/")
            }
        }
    }

    @Test("a broken copy of the unit is reported", .enabled(if: analyzer != nil, skipReason), arguments: Breakage.allCases)
    func brokenCopyIsReported(breakage: Breakage) async throws {
        let good = try Self.localCopy()
        let edit = breakage.edit
        try #require(good.contains(edit.from), "the unit has \(edit.from.trimmingCharacters(in: .newlines))")
        let (problems, output) = try await Self.verify(good.replacingOccurrences(of: edit.from, with: edit.to))
        #expect(problems.contains { $0.contains(edit.reported) }, "systemd-analyze verify: \(output)")
    }

    static let shippedPostgresDropIn = URL(fileURLWithPath: shippedUnit).deletingLastPathComponent()
        .appendingPathComponent("token-agent-postgres.conf").path

    @Test("the PostgreSQL drop-in verifies with the unit; a misspelled key in it is reported", .enabled(if: analyzer != nil, skipReason))
    func postgresDropInVerifies() async throws {
        let dropIn = try String(contentsOfFile: Self.shippedPostgresDropIn, encoding: .utf8)
        let (problems, output) = try await Self.verify(try Self.localCopy(), dropIn: dropIn)
        #expect(problems.isEmpty, "systemd-analyze verify: \(output)")
        try #require(dropIn.contains("\nLoadCredential="))
        let broken = try await Self.verify(try Self.localCopy(), dropIn: dropIn.replacingOccurrences(of: "\nLoadCredential=", with: "\nLoadCredentials="))
        #expect(broken.problems.contains { $0.contains("LoadCredentials") }, "systemd-analyze verify: \(broken.output)")
        let lines = Set(dropIn.split(separator: "\n").map(String.init))
        #expect(lines.isSuperset(of: ["LoadCredential=pgpass:/etc/token-agent/pgpass", "Environment=PGPASSFILE=%d/pgpass",
                                      "StartLimitIntervalSec=0"]))
    }

    @Test("the unit states what token-agent relies on")
    func contract() throws {
        let lines = Set(try String(contentsOfFile: Self.shippedUnit, encoding: .utf8).split(separator: "\n").map(String.init))
        let missing = ["Type=notify", "NotifyAccess=main", "ExecReload=/bin/kill -HUP $MAINPID", "Restart=on-failure",
                       "WatchdogSec=30s", "StateDirectory=token-agent",
                       "RuntimeDirectory=token-agent", "RestartPreventExitStatus=64 78",
                       "ExecStart=/usr/local/bin/token-agent --config /etc/token-agent/token-agent.yaml"]
            .filter { !lines.contains($0) }
        #expect(missing.isEmpty, "settings missing from the unit")
    }

    /// systemd fails a unit whose credential *file* (an absolute path) is missing, but skips a
    /// credential named by its id alone when no credential store holds it (systemd.exec(5)).
    @Test("the encryption credential is optional: named by its id alone, so the unit starts without it")
    func encryptionCredentialOptional() throws {
        let lines = try String(contentsOfFile: Self.shippedUnit, encoding: .utf8).split(separator: "\n").map(String.init)
        let credentials = lines.filter { $0.hasPrefix("LoadCredential") || $0.hasPrefix("ImportCredential") }
        #expect(credentials == ["LoadCredentialEncrypted=token-store-key"], "\(credentials)")
    }
}
