// Issue 26, item 8: a running token-agent refuses a reload from a file others could have
// written. The measured defect: a config file another user could write was edited to add
// `allow: ["vehicle:*"]`, and seconds later another vehicle's token went from 403 to 200 with no
// warning. Real agent, real dev-token-server, the local API on a Unix socket.

import FleetTokenService
import TokenAgentRuntime
import Foundation
import TestSupportKit
import Testing
#if canImport(Glibc)
import Glibc
#endif

@Suite("token-agent refuses reloads from files others could have written", .paced, .exclusive)
struct SteeringFileReloadTests {
    /// Rewrites `path` in place, as another user with write access would: same inode, owner and mode.
    static func rewrite(_ path: String, _ text: String) throws {
        let handle = try #require(FileHandle(forWritingAtPath: path))
        try handle.truncate(atOffset: 0)
        try handle.write(contentsOf: Data(text.utf8))
        try handle.close()
    }

    static func failures(_ process: RunningProcess) -> [[String: String]] {
        SubjectReloadTests.events(process).filter { $0["event"] == "reload_failed" }
    }

    @Test("a config file made writable by others, or given to another user, then edited to allow every vehicle: the reload is refused and reported, the other vehicle stays 403; once fixed, SIGHUP applies the edit")
    func configFile() async throws {
        let scratch = Scratch()
        let issuer = try await IssuerProcess(scratch: scratch)
        let config = scratch.file("token-agent.yaml")
        let start = "vehicle: [mine]\njson: true\nlog-level: notice\n"
        try start.write(toFile: config, atomically: true, encoding: .utf8)
        #expect(chmod(config, 0o644) == 0)
        let agent = try await APIAgent.start(scratch, provider: issuer.template, ["--config", config], logLevel: nil)
        defer { agent.process.signal(SIGKILL) }
        #expect(await eventually(within: 30) { SubjectReloadTests.refreshed(agent.process) == ["vehicle/mine"] }, "\(agent.process.stdout)")

        try await withAPIClient { http in
            let api = APIClient.unix(agent.socket, http)
            #expect(try await api.send("/v1/token/vehicle/mine").status == 200)
            #expect(try await api.send("/v1/token/vehicle/other").status == 403)

            // Writable by everyone, then edited: the file watch notices, and refuses.
            #expect(chmod(config, 0o666) == 0)
            try Self.rewrite(config, start + "allow: [\"vehicle:*\"]\n")
            #expect(await eventually(within: 30) { Self.failures(agent.process).count == 1 }, "\(agent.process.stdout)\n\(agent.process.stderr)")
            var failed = try #require(Self.failures(agent.process).last)
            #expect(failed["path"] == config)
            #expect(failed["error"]?.contains("chmod go-w \(config)") == true, "\(failed)")
            #expect(agent.process.stderr.contains("reload refused"), "\(agent.process.stderr)")
            #expect(try await api.send("/v1/token/vehicle/other").status == 403, "the edit is not applied")

            // SIGHUP reads it again, and refuses again.
            agent.process.signal(SIGHUP)
            #expect(await eventually(within: 30) { Self.failures(agent.process).count == 2 }, "\(agent.process.stdout)")
            #expect(try await api.send("/v1/token/vehicle/other").status == 403)

            var expected = 2
            if geteuid() == 0 {
                // Owned by another user, whatever its mode.
                #expect(chmod(config, 0o644) == 0)
                #expect(chown(config, 65534, 65534) == 0)
                try Self.rewrite(config, start + "allow: [\"vehicle:*\"]\n# theirs\n")
                expected += 1
                #expect(await eventually(within: 30) { Self.failures(agent.process).count == expected }, "\(agent.process.stdout)")
                failed = try #require(Self.failures(agent.process).last)
                #expect(failed["error"]?.contains("belongs to uid 65534") == true, "\(failed)")
                #expect(failed["error"]?.contains("chown \(geteuid()) \(config)") == true, "\(failed)")
                #expect(try await api.send("/v1/token/vehicle/other").status == 403)
                #expect(chown(config, geteuid(), getegid()) == 0)
            }

            // Fixed: SIGHUP applies what the file says now.
            #expect(chmod(config, 0o644) == 0)
            agent.process.signal(SIGHUP)
            #expect(await eventually(within: 30) { ConfigReloadTests.reloads(agent.process).contains { $0["changed"] == "allow" } },
                    "\(agent.process.stdout)\n\(agent.process.stderr)")
            #expect(Self.failures(agent.process).count == expected)
            #expect(try await api.send("/v1/token/vehicle/other").status == 200)
        }
        #expect(await agent.stop() == 0, "\(agent.process.stderr)")
    }

    @Test("a subjects file or a header file made writable by others: SIGHUP is refused naming the file, the subjects in force stay; fixed, SIGHUP applies")
    func subjectsAndHeaderFiles() async throws {
        let scratch = Scratch()
        let issuer = try await IssuerProcess(scratch: scratch)
        let subjects = scratch.file("subjects.txt")
        let header = scratch.file("credential")
        try "vehicle:mine\n".write(toFile: subjects, atomically: true, encoding: .utf8)
        try "Bearer agent-credential\n".write(toFile: header, atomically: true, encoding: .utf8)
        #expect(chmod(subjects, 0o644) == 0 && chmod(header, 0o600) == 0)
        let agent = try await APIAgent.start(scratch, provider: issuer.template,
                                             ["--subjects-file", subjects, "--header-file", "X-Agent-Credential:\(header)", "--json"])
        defer { agent.process.signal(SIGKILL) }
        #expect(await eventually(within: 30) { SubjectReloadTests.refreshed(agent.process) == ["vehicle/mine"] }, "\(agent.process.stdout)")

        try await withAPIClient { http in
            let api = APIClient.unix(agent.socket, http)
            #expect(chmod(subjects, 0o646) == 0)
            try Self.rewrite(subjects, "vehicle:mine\nvehicle:theirs\n")
            agent.process.signal(SIGHUP)
            #expect(await eventually(within: 30) { Self.failures(agent.process).count == 1 }, "\(agent.process.stdout)")
            var failed = try #require(Self.failures(agent.process).last)
            #expect(failed["path"] == subjects)
            #expect(failed["error"]?.contains("chmod go-w \(subjects)") == true, "\(failed)")
            #expect(agent.process.stderr.contains("the previous subject list stays in force"), "\(agent.process.stderr)")
            #expect(try await api.send("/v1/token/vehicle/theirs").status == 403)

            #expect(chmod(subjects, 0o644) == 0 && chmod(header, 0o660) == 0)
            agent.process.signal(SIGHUP)
            #expect(await eventually(within: 30) { Self.failures(agent.process).count == 2 }, "\(agent.process.stdout)")
            failed = try #require(Self.failures(agent.process).last)
            #expect(failed["path"] == header)
            #expect(failed["error"]?.contains("chmod go-w \(header)") == true, "\(failed)")
            #expect(try await api.send("/v1/token/vehicle/theirs").status == 403)

            #expect(chmod(header, 0o600) == 0)
            agent.process.signal(SIGHUP)
            #expect(await agent.process.waitForOutput(#""event":"subjects_reloaded""#, within: 30), "\(agent.process.stdout)")
            #expect(SubjectReloadTests.events(agent.process).contains(["event": "tracked", "kind": "vehicle", "id": "theirs"]))
            #expect(await eventually(within: 30) { (try? await api.send("/v1/token/vehicle/theirs").status) == 200 })
        }
        #expect(!(agent.process.stdout + agent.process.stderr).contains("agent-credential"))
        #expect(await agent.stop() == 0, "\(agent.process.stderr)")
    }
}

@Suite("SubjectListFile reads only a file no other user could have written", .paced)
struct SubjectListFileSteeringTests {
    @Test("what SubjectListFile(contentsOfFile:) reads is judged as it is read: writable by group or others, or in such a directory, it is refused naming the file and the fix")
    func judgedWhereRead() throws {
        let scratch = Scratch()
        let path = scratch.file("subjects.txt")
        try "vehicle:a\n".write(toFile: path, atomically: true, encoding: .utf8)
        #expect(chmod(path, 0o644) == 0)
        #expect(try SubjectListFile(contentsOfFile: path).subjects.map(\.description) == ["vehicle/a"])
        #expect(chmod(path, 0o666) == 0)
        let loose = #expect(throws: SubjectListFileError.self) { try SubjectListFile(contentsOfFile: path) }
        #expect(loose?.path == path)
        #expect(loose?.description.contains("is writable by group or others (mode 0666)") == true, "\(String(describing: loose))")
        #expect(loose?.description.contains("chmod go-w \(path)") == true, "\(String(describing: loose))")

        let shared = scratch.file("shared")
        #expect(mkdir(shared, 0o777) == 0 && chmod(shared, 0o777) == 0)
        let inShared = shared + "/subjects.txt"
        try "vehicle:a\n".write(toFile: inShared, atomically: true, encoding: .utf8)
        #expect(chmod(inShared, 0o644) == 0)
        let directory = #expect(throws: SubjectListFileError.self) { try SubjectListFile(contentsOfFile: inShared) }
        #expect(directory?.description.contains("chmod go-w \(shared)") == true, "\(String(describing: directory))")
    }
}
