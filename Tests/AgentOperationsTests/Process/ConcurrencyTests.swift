// Concurrency of the real processes (issue 7, part 2): tokenctl loops beside a live agent, and a
// foreign sqlite3 process holding the write lock while the agent must persist a refresh.
//
// Soak knob (environment variable):
//   FTS_SOAK_SECONDS=60   how long the tokenctl loops run (default 15, the CI run)

import FleetTokenStoreTesting
import FleetTokenStore
import Foundation
import Testing
import TestSupportKit
#if canImport(Glibc)
import Glibc
#endif

@Suite("Concurrency: token-agent beside tokenctl and sqlite3 processes", .paced, .serialized, .exclusive)
struct ConcurrencyTests {
    static let lifetime = 6

    /// Words that would mean a process hit SQLite's lock instead of waiting for it.
    static let lockWords = ["locked", "busy"]

    @Test("four tokenctl loops beside a refreshing agent: no locked/busy error, every exit 0, the agent keeps refreshing")
    func tokenctlLoops() async throws {
        let seconds = environmentInt("FTS_SOAK_SECONDS", default: 15)
        let scratch = Scratch()
        let issuer = try await IssuerProcess(scratch: scratch, lifetime: Self.lifetime)
        let db = scratch.file("tokens.sqlite")
        let subjects = Subjects(vehicles: 15, trips: 15)
        let agent = try AgentFixture.launch(["--db", db, "--provider-url", issuer.template, "--log-level", "trace"]
                                       + subjects.arguments, in: scratch)
        let stored = await eventually(within: 30) { (try? storeSnapshot(db).count) == subjects.keys.count }
        try #require(stored, "\(agent.stderr.suffix(2000))")
        let secrets = SecretScanner()
        var outputs: LabelledOutputs = []

        let commands: [[String]] = [["list", "--json"], ["purge", "--expired", "--json"], ["stats", "--json"], ["check", "--json"]]
        let started = Date()
        let deadline = started.addingTimeInterval(Double(seconds))
        async let runs: [(command: [String], status: Int32, stdout: String, stderr: String)] = withTaskGroup(
            of: [(command: [String], status: Int32, stdout: String, stderr: String)].self
        ) { group in
            for command in commands {
                group.addTask {
                    var results: [(command: [String], status: Int32, stdout: String, stderr: String)] = []
                    while Date() < deadline {
                        do {
                            let result = try await tokenctl(["--db", db] + command, scratch)
                            results.append((command, result.status, result.stdout, result.stderr))
                        } catch {
                            results.append((command, -1, "", "\(error)"))
                        }
                    }
                    return results
                }
            }
            return await group.reduce(into: []) { $0 += $1 }
        }
        // Meanwhile, collect the tokens the agent stores (for the secrets check).
        while Date() < deadline {
            secrets.remember(tokensOf: (try? storeSnapshot(db)) ?? [:])
            try await Task.sleep(for: .seconds(1))
        }
        let results = await runs
        let ended = Date()

        for command in commands {
            let count = results.filter { $0.command == command }.count
            #expect(count >= 3, "tokenctl \(command.joined(separator: " ")) ran only \(count) times in \(seconds) s")
        }
        for result in results {
            let label = "tokenctl \(result.command.joined(separator: " "))"
            #expect(result.status == 0, "\(label) exited \(result.status): \(result.stdout.suffix(500)) \(result.stderr.suffix(500))")
            for word in Self.lockWords {
                #expect(!result.stdout.lowercased().contains(word) && !result.stderr.lowercased().contains(word), "\(label): \(result.stderr.suffix(500))")
            }
            outputs.append(("\(label) stdout", result.stdout))
            outputs.append(("\(label) stderr", result.stderr))
        }

        // The agent kept refreshing every subject through the loops, and never hit the lock.
        #expect(agent.isRunning)
        let during = committedLines(agent.stdout).filter { $0.source == "provider" && $0.stamp >= started.addingTimeInterval(-1) }
        let refreshedKeys = Set(during.map(\.key))
        #expect(refreshedKeys == Set(subjects.keys), "not refreshed during the loops: \(Set(subjects.keys).subtracting(refreshedKeys).sorted())")
        #expect(during.count >= subjects.keys.count * max(1, seconds / (Self.lifetime * 2)), "only \(during.count) refreshes in \(seconds) s")
        let agentOutput = (agent.stdout + agent.stderr).lowercased()
        for word in Self.lockWords + ["store-degraded"] {
            #expect(!agentOutput.contains(word), "the agent printed \(word)")
        }
        let lines = committedLines(agent.stdout)
        let snapshot = try storeSnapshot(db)
        secrets.remember(tokensOf: snapshot)
        expectCommittedTokensStored(lastCommitted(lines), snapshot, context: "after the loops")
        for row in snapshot.values { #expect(row.expiresAt > ended, "\(row.key) expired in the store of a live agent") }
        expectStoreModes(db)

        agent.signal(SIGTERM)
        #expect(await agent.wait(upTo: 5) == 0, "\(agent.stderr.suffix(2000))")
        outputs += agent.outputs(labelled: "agent")
        secrets.expectNoLeaks(in: outputs, minimumTokens: subjects.keys.count * 2)
        print("concurrency: \(results.count) tokenctl runs (\(commands.map { c in "\(c[0]) \(results.filter { $0.command == c }.count)" }.joined(separator: ", "))), \(during.count) refreshes in \(seconds) s")
    }

    @Test("a sqlite3 process holds the write lock for 3 s while the agent must persist a refresh: the agent waits, survives and stores it")
    func foreignWriteLock() async throws {
        let scratch = Scratch()
        let issuer = try await IssuerProcess(scratch: scratch, lifetime: Self.lifetime)
        let db = scratch.file("tokens.sqlite")
        let subjects = Subjects(vehicles: 5, trips: 5)
        let agent = try AgentFixture.launch(["--db", db, "--provider-url", issuer.template, "--log-level", "trace"]
                                       + subjects.arguments, in: scratch)
        let stored = await eventually(within: 30) { (try? storeSnapshot(db).count) == subjects.keys.count }
        try #require(stored, "\(agent.stderr.suffix(2000))")
        let secrets = SecretScanner()
        var outputs: LabelledOutputs = []
        secrets.remember(tokensOf: try storeSnapshot(db))

        // The shell deletes vehicle/v03 (the agent must refetch and store it), then takes the
        // write lock and holds it for 3 s. Markers are files: the shell's stdout is buffered.
        let locked = scratch.file("locked"), released = scratch.file("released")
        let shell = try RunningProcess(sqlite3Path, [
            db, ".timeout 5000",
            "DELETE FROM tokens WHERE kind = 'vehicle' AND subject_id = 'v03';",
            "BEGIN IMMEDIATE;", ".shell touch \(locked)", ".shell sleep 3", "COMMIT;", ".shell touch \(released)",
        ], in: scratch)
        #expect(await eventually(within: 30) { FileManager.default.fileExists(atPath: locked) })
        let lockedAt = Date()
        #expect(await eventually(within: 30) { FileManager.default.fileExists(atPath: released) })
        let releasedAt = Date()
        #expect(await shell.wait(upTo: 5) == 0, "sqlite3: \(shell.stderr)")
        #expect(releasedAt.timeIntervalSince(lockedAt) >= 2.5, "the lock was held only \(releasedAt.timeIntervalSince(lockedAt)) s")

        // The agent saw the removal while the lock was held, so its refetch had to wait for it...
        let removal = completeLines(agent.stdout).first { $0.contains("removed   vehicle/v03") }
        let removedAt = removal.flatMap { $0.split(separator: " ").first }.flatMap(parseISO)
        #expect(removedAt.map { $0 < releasedAt } == true, "removal not seen during the lock: \(removal ?? "none")")
        // ...and the refetched token is in the store once the lock is gone.
        let refetched = await eventually(within: 30) { (try? storeSnapshot(db))?["vehicle/v03"] != nil }
        #expect(refetched, "\(agent.stderr.suffix(3000))")
        #expect(agent.isRunning)
        #expect(await agent.waitForOutput("refreshed vehicle/v03", within: 5))

        let lines = committedLines(agent.stdout)
        let snapshot = try storeSnapshot(db)
        secrets.remember(tokensOf: snapshot)
        expectCommittedTokensStored(lastCommitted(lines), snapshot, context: "after the lock")
        #expect(lines.contains { $0.key == "vehicle/v03" && $0.source == "provider" && $0.stamp >= lockedAt.addingTimeInterval(-1) })
        let agentOutput = (agent.stdout + agent.stderr).lowercased()
        for word in Self.lockWords + ["store-degraded"] {
            #expect(!agentOutput.contains(word), "the agent printed \(word)")
        }
        #expect(try await sqlite3(db, "PRAGMA integrity_check", readOnly: true) == "ok")
        expectStoreModes(db)

        agent.signal(SIGTERM)
        #expect(await agent.wait(upTo: 5) == 0, "\(agent.stderr.suffix(2000))")
        outputs += agent.outputs(labelled: "agent")
        outputs += shell.outputs(labelled: "sqlite3")
        secrets.expectNoLeaks(in: outputs, minimumTokens: subjects.keys.count)
    }
}
