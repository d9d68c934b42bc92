// Issue 26 item 7, through real token-agent and dev-token-server processes: an unsafe sink
// directory (a planted symlink, a 2777 directory of another user) stops the start with exit 1
// naming the path, and nothing is written to or deleted from it; root-owned directories are
// accepted for an agent that is not root.

import Foundation
import TestSupportKit
import Testing
#if canImport(Glibc)
import Glibc
#endif

@Suite("token-agent --sink: directories are checked, then held", .paced, .serialized, .exclusive)
struct SinkDirectoryProcessTests {
    /// The wrapper that runs the built agent as `nobody` (65534), when the tests are root and
    /// setpriv can.
    static let asNobody: [String]? = {
        guard geteuid() == 0, let setpriv = executable(["/usr/bin/setpriv", "/bin/setpriv"]) else { return nil }
        let wrapper = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups"]
        guard let probe = try? runCapturing(wrapper + [AgentFixture.path, "--help"], timeout: 30), probe.status == 0 else { return nil }
        return wrapper
    }()

    /// Runs the agent until it exits (up to 20 s; then it is stopped, and the status is nil).
    static func start(_ arguments: [String], wrapper: [String] = [], in scratch: Scratch) async throws -> (status: Int32?, stderr: String) {
        let agent = try AgentFixture.launch(arguments, wrapper: wrapper, in: scratch)
        let status = await agent.wait(upTo: 20)
        if status == nil {
            agent.signal(SIGTERM)
            _ = await agent.wait(upTo: 10)
        }
        return (status, agent.stderr)
    }

    static func names(_ path: String) -> [String] {
        ((try? FileManager.default.contentsOfDirectory(atPath: path)) ?? []).sorted()
    }

    static func text(_ path: String) -> String? {
        FileManager.default.contents(atPath: path).map { String(decoding: $0, as: UTF8.self) }
    }

    @Test("a kind directory planted as a symlink: exit 1 naming the path and the fix; the target is neither written nor cleaned")
    func symlinkedKindDirectory() async throws {
        let scratch = Scratch()
        let issuer = try await IssuerProcess(scratch: scratch)
        let target = scratch.file("elsewhere")
        try FileManager.default.createDirectory(atPath: target, withIntermediateDirectories: true)
        try #require(FileManager.default.createFile(atPath: target + "/important.jwt", contents: Data("keep me".utf8)))
        try FileManager.default.createDirectory(atPath: scratch.file("sink"), withIntermediateDirectories: true)
        try FileManager.default.createSymbolicLink(atPath: scratch.file("sink/vehicle"), withDestinationPath: target)

        let result = try await Self.start(["--db", scratch.file("tokens.sqlite"), "--provider-url", issuer.template,
                                                          "--sink", scratch.file("sink"), "--vehicle", "truck-7"], in: scratch)
        #expect(result.status == 1, "exit status \(result.status.map(String.init) ?? "none: still running after 20 s"); \(result.stderr.suffix(2000))")
        #expect(result.stderr.contains(scratch.file("sink/vehicle")), "\(result.stderr.suffix(2000))")
        #expect(result.stderr.contains("symbolic link"), "\(result.stderr.suffix(2000))")
        #expect(Self.names(target) == ["important.jwt"], "nothing written to or deleted from the link's target")
        #expect(Self.text(target + "/important.jwt") == "keep me")
    }

    @Test("a 2777 kind directory of another user: exit 1 naming the path and chmod; no token file in it")
    func worldWritableKindDirectory() async throws {
        let scratch = Scratch()
        let issuer = try await IssuerProcess(scratch: scratch)
        let planted = scratch.file("sink/vehicle")
        try FileManager.default.createDirectory(atPath: planted, withIntermediateDirectories: true)
        #expect(chmod(planted, 0o2777) == 0 && chown(planted, 65534, 65534) == 0)

        let result = try await Self.start(["--db", scratch.file("tokens.sqlite"), "--provider-url", issuer.template,
                                                          "--sink", scratch.file("sink"), "--vehicle", "truck-7"], in: scratch)
        #expect(result.status == 1, "exit status \(result.status.map(String.init) ?? "none: still running after 20 s"); \(result.stderr.suffix(2000))")
        #expect(result.stderr.contains(planted) && result.stderr.contains("chmod go-w"), "\(result.stderr.suffix(2000))")
        #expect(Self.names(planted).isEmpty, "no token file where another user can read it")
    }

    @Test("an agent that is not root (umask 077) accepts root-owned directories and its own, creates 0750 ones, and refuses another user's",
          .enabled(if: asNobody != nil, "needs root and setpriv to run the agent as nobody"))
    func ownersForAnUnprivilegedAgent() async throws {
        let prefix = try #require(Self.asNobody)
        let scratch = Scratch()
        let issuer = try await IssuerProcess(scratch: scratch)
        let state = scratch.file("state"), sink = scratch.file("sink")
        for directory in [state, sink, sink + "/trip"] {
            try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
            #expect(chmod(directory, directory == sink + "/trip" ? 0o755 : 0o750) == 0)
        }
        #expect(chown(state, 65534, 65534) == 0 && chown(sink, 65534, 65534) == 0) // sink/trip stays root's
        let arguments = ["--db", state + "/tokens.sqlite", "--provider-url", issuer.template,
                                                     "--sink", sink, "--vehicle", "truck-7", "--json"]
        // Under umask 077: the directories the agent creates are 0750 all the same.
        let agent = try AgentFixture.launch(arguments, wrapper: ["/bin/sh", "-c", #"umask 077 && exec "$0" "$@""#] + prefix, in: scratch)
        #expect(await eventually(within: 15) { FileManager.default.fileExists(atPath: sink + "/vehicle/truck-7.jwt") }, "\(agent.stderr)")
        #expect(fileMode(sink + "/vehicle") == 0o750)
        agent.signal(SIGTERM)
        #expect(await agent.wait(upTo: 10) == 0, "\(agent.stderr)")

        #expect(chown(sink + "/trip", 65533, 65533) == 0)
        let refused = try await Self.start(arguments, wrapper: prefix, in: scratch)
        #expect(refused.status == 1, "exit status \(refused.status.map(String.init) ?? "none: still running after 20 s"); \(refused.stderr.suffix(2000))")
        #expect(refused.stderr.contains(sink + "/trip") && refused.stderr.contains("uid 65533"), "\(refused.stderr.suffix(2000))")
    }

    @Test("--check-config as a user that is not root: a sink it could not create is refused, as a start refuses it; one it can create passes; nothing is created",
          .enabled(if: asNobody != nil, "needs root and setpriv to run the agent as nobody"))
    func checkConfigNeedsACreatableSink() async throws {
        let prefix = try #require(Self.asNobody)
        let scratch = Scratch()
        let rootsOwn = scratch.file("roots-own"), own = scratch.file("own")
        for directory in [rootsOwn, own] { try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true) }
        #expect(chmod(rootsOwn, 0o755) == 0 && chmod(own, 0o750) == 0 && chown(own, 65534, 65534) == 0)
        let base = ["--db", own + "/tokens.sqlite", "--provider-url", "https://127.0.0.1:1/fleet/{kind}/{id}", "--vehicle", "truck-7"]

        let refused = try await AgentFixture.run(base + ["--sink", rootsOwn + "/sink/tokens", "--check-config"], wrapper: prefix, in: scratch)
        #expect(refused.status == 64, "\(refused.stderr)")
        #expect(refused.stderr.contains("cannot create the sink directory \(rootsOwn)/sink/tokens in \(rootsOwn)"), "\(refused.stderr)")
        let started = try await Self.start(base + ["--sink", rootsOwn + "/sink/tokens"], wrapper: prefix, in: scratch)
        #expect(started.status == 1 && started.stderr.contains("cannot create the sink directory"), "\(started.stderr.suffix(2000))")

        let passed = try await AgentFixture.run(base + ["--sink", own + "/sink/tokens", "--check-config"], wrapper: prefix, in: scratch)
        #expect(passed.status == 0 && passed.stdout == "token-agent: configuration OK\n", "\(passed.stderr)")
        #expect(!FileManager.default.fileExists(atPath: own + "/sink") && !FileManager.default.fileExists(atPath: rootsOwn + "/sink"))
    }
}
