// Issue 31, item 2: `--version` of token-agent, tokenctl and dev-token-server, each run as a real
// process: one line with the program's name, the version, the git revision the binary was built
// from (stamped by Plugins/BuildStampPlugin) and the Swift version. The same version and
// revision in /metrics' fleet_tokens_build_info are checked by PrometheusConformanceTests.

import BuildStamp
import Foundation
import TestSupportKit
import Testing

@Suite("--version of the three executables: version, the revision built from, Swift version", .paced)
struct VersionOutputTests {
    @Test("each prints one line, exits 0: its name, the version, the stamped revision, the Swift version",
          arguments: ["token-agent", "tokenctl", "dev-token-server"])
    func versionLine(_ program: String) async throws {
        let scratch = Scratch()
        let result = try await runToEnd(program, ["--version"], in: scratch)
        #expect(result.status == 0, "\(result.stderr)")
        #expect(result.stderr.isEmpty, "\(result.stderr)")
        let line = try #require(VersionLine(result.stdout), "not one version line: \(result.stdout)")
        #expect(line.program == program)
        #expect(line.version == BuildStamp.version)
        #expect(line.revision == BuildStamp.revision)
        #expect(line.swift == BuildStamp.swiftVersion)
        #expect(result.stdout == BuildStamp.versionLine(program: program) + "\n")
    }

    @Test("token-agent: --version answers before anything is read (no store, no provider, other flags ignored)")
    func agentVersionFirst() async throws {
        let scratch = Scratch()
        // A config file that does not exist and a flag the agent refuses: --version still answers.
        let result = try await AgentFixture.run(["--config", scratch.file("missing.yaml"), "--bogus", "--version"],
                                        environment: ["TOKEN_AGENT_DB": scratch.file("store.sqlite")], in: scratch)
        #expect(result.status == 0, "\(result.stderr)")
        #expect(result.stdout == BuildStamp.versionLine(program: "token-agent") + "\n")
        #expect(scratch.contents.allSatisfy { !$0.hasPrefix("store.sqlite") }, "\(scratch.contents)")
        // --help names it.
        let help = try await AgentFixture.run(["--help"], in: scratch)
        #expect(help.stdout.contains("  --version "), "\(help.stdout)")
    }

    @Test("the version is MAJOR.MINOR.PATCH, the revision 12 or more hex digits (optionally -dirty) or unknown")
    func stampShape() {
        #expect(BuildStamp.version.wholeMatch(of: #/\d+\.\d+\.\d+/#) != nil, "\(BuildStamp.version)")
        #expect(BuildStamp.revision.wholeMatch(of: #/[0-9a-f]{12,40}(-dirty)?|unknown/#) != nil, "\(BuildStamp.revision)")
    }

    @Test("built from a git checkout: the revision is HEAD's", .enabled(if: Checkout.gitPath != nil, "needs .git and git"))
    func revisionIsHead() async throws {
        let scratch = Scratch()
        let head = try await runToEnd(try #require(Checkout.gitPath), ["-C", Checkout.root.path, "rev-parse", "--short=12", "HEAD"], in: scratch)
        #expect(head.status == 0, "\(head.stderr)")
        let revision = head.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        #expect(revision.wholeMatch(of: #/[0-9a-f]{12}/#) != nil, "\(head.stdout)")
        // A tree edited since the commit adds -dirty (whether it is, depends on when this runs).
        #expect(BuildStamp.revision == revision || BuildStamp.revision == revision + "-dirty", "stamped \(BuildStamp.revision), HEAD \(revision)")
    }

    @Test("the Swift version is the toolchain's (swift --version), when swift is on PATH", .enabled(if: Checkout.onPath("swift") != nil))
    func swiftVersionIsToolchains() async throws {
        let scratch = Scratch()
        let result = try await runToEnd(try #require(Checkout.onPath("swift")), ["--version"], in: scratch)
        let match = try #require((result.stdout + result.stderr).firstMatch(of: #/Swift version (\d+)\.(\d+)/#), "\(result.stdout)")
        #expect(BuildStamp.swiftVersion == "\(match.1).\(match.2)")
    }
}

/// `NAME VERSION (revision REVISION, Swift X.Y)` and a newline, taken apart.
struct VersionLine {
    let program: String
    let version: String
    let revision: String
    let swift: String

    init?(_ output: String) {
        guard let match = output.wholeMatch(of: #/(\S+) (\S+) \(revision (\S+), Swift (\S+)\)\n/#) else { return nil }
        (program, version, revision, swift) = (String(match.1), String(match.2), String(match.3), String(match.4))
    }
}

/// The repository these tests were built from, and tools on PATH.
enum Checkout {
    /// The package root: this file is Tests/AgentOperationsTests/TokenAPI/VersionOutputTests.swift.
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().deletingLastPathComponent()

    /// git, when the repository is a checkout (.git present) and git is installed.
    static var gitPath: String? {
        FileManager.default.fileExists(atPath: root.appendingPathComponent(".git").path) ? onPath("git") : nil
    }

    /// The first `name` on PATH that is executable.
    static func onPath(_ name: String) -> String? {
        let directories = (ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin").split(separator: ":")
        return executable(directories.map { "\($0)/\(name)" })
    }
}
