// Encryption at rest (issue 17) at process level, SQLite: the real token-agent and tokenctl with
// key files, against a real dev-token-server that records every token it issues
// (`--record-issued-tokens`, GET /stats/tokens), so the raw bytes of the store, its -wal and
// its -shm can be searched for every token value that ever reached the agent.

import FleetTokenStore
import FleetTokenStoreTesting
import Foundation
import Testing
import TestSupportKit
#if canImport(Glibc)
import Glibc
#endif

@Suite("Encryption at rest under a real token-agent and tokenctl", .paced, .serialized, .exclusive)
struct EncryptionProcessTests {
    /// Issuer lifetime of the refreshing tests: soft points 4.5-4.8 s after `iat`, so a live
    /// agent refreshes (and writes) every few hundred milliseconds across its subjects.
    static let shortLifetime = 6

    // MARK: - 1. kill -9 while refreshing: no plaintext on disk

    @Test("kill -9 mid-write, 5 times: the store, -wal and -shm never hold an issued token, its payload or signature; every subject is sealed")
    func killsLeaveNoPlaintext() async throws {
        let seed = reproducibleSeed("FTS_ENCRYPTION_KILL_SEED", test: "encryption kills")
        var random = SeededGenerator(seed: seed)
        let scratch = Scratch()
        let issuer = try await IssuerProcess(scratch: scratch, lifetime: Self.shortLifetime, recordTokens: true)
        let key = try KeyFile("store.key", in: scratch)
        let db = scratch.file("tokens.sqlite")
        let subjects = Subjects(vehicles: 4, trips: 4)
        let arguments = ["--db", db, "--provider-url", issuer.template, "--encryption-key-file", key.path, "--log-level", "debug"]
            + subjects.arguments
        var outputs: LabelledOutputs = []
        var killsWithWALFrames = 0
        var providerRefreshes = 0
        let cycles = 5

        for cycle in 1...cycles {
            let context = "cycle \(cycle)/\(cycles), seed \(seed)"
            let agent = try AgentFixture.launch(arguments, in: scratch)
            // Killed only once it is refreshing: every subject stored in the first cycle, a
            // fresh refresh from the provider in later ones, then at a random moment after.
            let refreshing = await eventually(within: 30) {
                let fetched = committedLines(agent.stdout).filter { $0.source == "provider" }
                return cycle == 1 ? Set(fetched.map(\.key)) == Set(subjects.keys) : !fetched.isEmpty
            }
            try #require(refreshing, "\(context): the agent did not refresh: \(agent.stderr.suffix(3000))")
            #expect(agent.stderr.contains("key_id=\(key.id) "), "\(context): the agent did not say it seals with key id \(key.id)")
            try await Task.sleep(for: .milliseconds(Int.random(in: 0...1500, using: &random)))
            agent.signal(SIGKILL)
            let status = await agent.wait(upTo: 10)
            try #require(status != nil, "\(context): the agent did not die")
            #expect(agent.process.terminationReason == .uncaughtSignal && status == SIGKILL,
                    "\(context): the agent ended before the kill (status \(status ?? -1)): \(agent.stderr.suffix(2000))")
            outputs += agent.outputs(labelled: "\(context) agent")
            providerRefreshes += committedLines(agent.stdout).filter { $0.source == "provider" }.count
            #expect(!agent.stderr.contains("does not open"), "\(context): a value written by the agent did not open: \(agent.stderr.suffix(3000))")
            #expect(!agent.stderr.contains("not sealed"), "\(context): \(agent.stderr.suffix(3000))")

            // The files exactly as the kill left them (read-only sqlite3 keeps the -wal as it is).
            if (fileSize(db + "-wal") ?? 0) > 32 { killsWithWALFrames += 1 }
            let issued = try await issuer.issuedTokens()
            expectNoPlaintext(of: issued, inStoreAt: db, context: context)
            try expectAllSealed(db, with: key, subjects: subjects.keys, issued: issued, context: context)
        }

        // A clean start on what the last kill left: every value opens, nothing is refetched
        // that is fresh, and the store still holds no plaintext.
        let final = try await AgentFixture.run(arguments + ["--once", "--json"], in: scratch, timeout: 60)
        #expect(final.status == 0, "\(final.stderr.suffix(3000))")
        #expect(!final.stderr.contains("does not open"), "\(final.stderr.suffix(3000))")
        #expect(Set(try onceResults(final.stdout).map { "\($0["kind"] ?? "")/\($0["id"] ?? "")" }) == Set(subjects.keys))
        outputs += [("final --once stdout", final.stdout), ("final --once stderr", final.stderr)]
        let issued = try await issuer.issuedTokens()
        expectNoPlaintext(of: issued, inStoreAt: db, context: "after the final run")
        try expectAllSealed(db, with: key, subjects: subjects.keys, issued: issued, context: "after the final run")

        // The scans above covered real refreshing and real -wal content.
        let issuedCount = issued.values.map(\.count).reduce(0, +)
        #expect(issuedCount >= subjects.keys.count * 2, "only \(issuedCount) tokens issued: the kills did not hit refreshing agents")
        #expect(providerRefreshes >= subjects.keys.count + cycles - 1, "only \(providerRefreshes) refreshes committed")
        #expect(killsWithWALFrames >= 1, "no kill left a -wal with frames: the -wal scan tested nothing")
        let secrets = SecretScanner()
        secrets.remember(contentsOf: issued.values.joined())
        secrets.expectNoLeaks(in: outputs, minimumTokens: subjects.keys.count * 2)
        print("encryption kills: \(cycles) kills, \(issuedCount) tokens issued, \(providerRefreshes) refreshes committed, \(killsWithWALFrames) kills left -wal frames")
    }

    // MARK: - 2. Quarantine

    @Test("a corrupt sealed store is moved aside byte for byte; the fresh store is sealed from its first write")
    func quarantineStartsSealed() async throws {
        let scratch = Scratch()
        let issuer = try await IssuerProcess(scratch: scratch, lifetime: Self.shortLifetime, recordTokens: true)
        let key = try KeyFile("store.key", in: scratch)
        let db = scratch.file("tokens.sqlite")
        let subjects = Subjects(vehicles: 3, trips: 3)
        let arguments = ["--db", db, "--provider-url", issuer.template, "--encryption-key-file", key.path, "--log-level", "debug"]
            + subjects.arguments
        let made = try await AgentFixture.run(arguments + ["--once"], in: scratch)
        try #require(made.status == 0, "\(made.stderr)")
        try expectAllSealed(db, with: key, subjects: subjects.keys, issued: try await issuer.issuedTokens(), context: "before the damage")

        // As StoreFaultTests' zeroedHeader: the first 100 bytes zeroed.
        let handle = try #require(FileHandle(forUpdatingAtPath: db))
        try handle.write(contentsOf: Data(count: 100))
        try handle.close()
        let damaged = try Data(contentsOf: URL(fileURLWithPath: db))

        let agent = try AgentFixture.launch(arguments, in: scratch)
        let refreshed = await eventually(within: 30) {
            Set(committedLines(agent.stdout).filter { $0.source == "provider" }.map(\.key)) == Set(subjects.keys)
        }
        #expect(refreshed, "\(agent.stderr.suffix(3000))")
        #expect(agent.stderr.contains("the token store was corrupt; moved it to \(db).corrupt-"), "\(agent.stderr.suffix(3000))")
        // Nothing was ever stored unsealed, so there was nothing to seal afterwards.
        #expect(!agent.stderr.contains("sealing the token values this store kept unencrypted"), "\(agent.stderr.suffix(3000))")

        let moved = quarantineFiles(in: scratch.path)
        let main = try #require(moved.first { !$0.hasSuffix("-wal") && !$0.hasSuffix("-shm") }, "nothing quarantined: \(moved)")
        #expect(try Data(contentsOf: URL(fileURLWithPath: scratch.file(main))) == damaged, "the quarantined file is not the damaged file")

        // Scanned while the agent runs (its -wal and -shm in use) and again after a kill -9.
        let rows = try sealedRows(db)
        var issued = try await issuer.issuedTokens()
        expectNoPlaintext(of: issued, inStoreAt: db, extraFiles: moved.map(scratch.file), context: "fresh store, agent running")
        expectAllSealed(rows, with: key, subjects: subjects.keys, issued: issued, context: "fresh store")
        agent.signal(SIGKILL)
        #expect(await agent.wait(upTo: 10) != nil)
        issued = try await issuer.issuedTokens()
        expectNoPlaintext(of: issued, inStoreAt: db, extraFiles: moved.map(scratch.file), context: "fresh store, agent killed")
        try expectAllSealed(db, with: key, subjects: subjects.keys, issued: issued, context: "fresh store, agent killed")
        #expect(try await sqlite3(db, "PRAGMA integrity_check", readOnly: true) == "ok")
    }

    // MARK: - 3. Refusals

    @Test("a key file readable by others (0644): exit 1 saying chmod 600, the store and key file untouched, nothing fetched")
    func looseKeyFileRefused() async throws {
        let scratch = Scratch()
        let issuer = try await IssuerProcess(scratch: scratch)
        let db = scratch.file("tokens.sqlite")
        let subjects = Subjects(vehicles: 2, trips: 1)
        let plain = try await AgentFixture.run(["--db", db, "--provider-url", issuer.template, "--once"] + subjects.arguments, in: scratch)
        try #require(plain.status == 0, "\(plain.stderr)")
        let key = try KeyFile("loose.key", in: scratch)
        #expect(chmod(key.path, 0o644) == 0)
        let before = try StoreFiles(db)
        let requests = try await issuer.stats().requests

        let result = try await AgentFixture.run(["--db", db, "--provider-url", issuer.template, "--encryption-key-file", key.path,
                                                        "--once"] + subjects.arguments, in: scratch)
        #expect(result.status == 1, "\(result.stdout) \(result.stderr.suffix(2000))")
        #expect(result.stderr.contains("encryption key file \(key.path) has mode 644, so other users can read the key to every stored token: chmod 600 it"),
                "\(result.stderr.suffix(2000))")
        // Refused before the store is opened: not one byte of it changed.
        #expect(try StoreFiles(db) == before, "the store files changed")
        #expect(fileMode(key.path) == 0o644, "the agent changed the key file's mode")
        #expect(try await issuer.stats().requests == requests)
    }

    @Test("a key file owned by another user: refused, the store untouched",
          .enabled(if: geteuid() == 0, "needs root to chown the key file to another user (uid 65534); as a normal user every file one can create is one's own"))
    func foreignKeyFileRefused() async throws {
        let scratch = Scratch()
        let issuer = try await IssuerProcess(scratch: scratch)
        let db = scratch.file("tokens.sqlite")
        let subjects = Subjects(vehicles: 1, trips: 1)
        let key = try KeyFile("foreign.key", in: scratch)
        let made = try await AgentFixture.run(["--db", db, "--provider-url", issuer.template, "--encryption-key-file", key.path,
                                                      "--once"] + subjects.arguments, in: scratch)
        try #require(made.status == 0, "\(made.stderr)")
        #expect(chown(key.path, 65534, 65534) == 0)
        let before = try StoreFiles(db)

        let result = try await AgentFixture.run(["--db", db, "--provider-url", issuer.template, "--encryption-key-file", key.path,
                                                        "--once"] + subjects.arguments, in: scratch)
        #expect(result.status == 1, "\(result.stdout) \(result.stderr.suffix(2000))")
        #expect(result.stderr.contains("encryption key file \(key.path) belongs to uid 65534, not to this user (uid 0)"), "\(result.stderr.suffix(2000))")
        #expect(result.stderr.contains("chown"), "\(result.stderr.suffix(2000))")
        #expect(try StoreFiles(db) == before, "the store files changed")
        // tokenctl refuses it the same way.
        let shown = try await tokenctl(["--db", db, "--encryption-key-file", key.path, "show", "vehicle", "v01", "--reveal"], scratch)
        #expect(shown.status == 1)
        #expect(shown.stderr.contains("belongs to uid 65534"), "\(shown.stderr)")
    }

    @Test("a sealed store and no key, or only another key: exit 1 naming the missing key id and count, the store unchanged, nothing fetched")
    func sealedStoreNeedsItsKey() async throws {
        let scratch = Scratch()
        let issuer = try await IssuerProcess(scratch: scratch)
        let db = scratch.file("tokens.sqlite")
        let subjects = Subjects(vehicles: 2, trips: 2)
        let keyA = try KeyFile("a.key", in: scratch)
        let keyB = try KeyFile("b.key", in: scratch)
        let made = try await AgentFixture.run(["--db", db, "--provider-url", issuer.template, "--encryption-key-file", keyA.path,
                                                      "--once"] + subjects.arguments, in: scratch)
        try #require(made.status == 0, "\(made.stderr)")
        let before = try StoreFiles(db)
        let rowsBefore = try await sqlite3(db, "SELECT kind, subject_id, token FROM tokens ORDER BY 1, 2", readOnly: true)
        let dumpBefore = try await sqlite3(db, ".dump", readOnly: true)
        let requests = try await issuer.stats().requests

        for (keys, message) in [([], "holds 4 token value(s) sealed with encryption key id \(keyA.id), and no encryption key was given"),
                                ([keyB], "holds 4 token value(s) sealed with encryption key id \(keyA.id), and no key given has that id")] {
            let context = keys.isEmpty ? "no key" : "key B only"
            let result = try await AgentFixture.run(["--db", db, "--provider-url", issuer.template, "--once"]
                                            + keys.flatMap { ["--encryption-key-file", $0.path] } + subjects.arguments, in: scratch)
            #expect(result.status == 1, "\(context): \(result.stdout) \(result.stderr.suffix(2000))")
            #expect(result.stderr.contains("token store \(db) \(message)"), "\(context): \(result.stderr.suffix(2000))")
            #expect(try await sqlite3(db, "SELECT kind, subject_id, token FROM tokens ORDER BY 1, 2", readOnly: true) == rowsBefore, "\(context): a value changed")
            try StoreFiles(db).expectSameContent(as: before, dumpBefore, db: db, context: context)
            #expect(try await issuer.stats().requests == requests, "\(context): the refused agent fetched")
        }
    }

    // MARK: - 4. Rotation

    @Test("rotation: rekey B,A re-seals every value from A; stats shows B only; an agent with B alone serves them without fetching; one with A alone is refused")
    func rotation() async throws {
        let scratch = Scratch()
        let issuer = try await IssuerProcess(scratch: scratch, recordTokens: true)
        let db = scratch.file("tokens.sqlite")
        let subjects = Subjects(vehicles: 3, trips: 3)
        let count = subjects.keys.count
        let keyA = try KeyFile("a.key", in: scratch)
        let keyB = try KeyFile("b.key", in: scratch, base64: true)
        let once = ["--db", db, "--provider-url", issuer.template, "--once", "--json"] + subjects.arguments
        let filled = try await AgentFixture.run(once + ["--encryption-key-file", keyA.path], in: scratch)
        try #require(filled.status == 0, "\(filled.stderr)")
        let fingerprints = try fingerprintsByKey(filled.stdout)
        try expectAllSealed(db, with: keyA, subjects: subjects.keys, issued: try await issuer.issuedTokens(), context: "under A")
        let issuedBefore = try await issuer.stats().issued

        // Without the old key, nothing opens: exit 1, counts as unopenable, values left as they are.
        let stuck = try await tokenctl(["--db", db, "rekey", "--encryption-key-file", keyB.path, "--json"], scratch)
        #expect(stuck.status == 1, "\(stuck.stdout) \(stuck.stderr)")
        #expect(stuck.stderr.contains("\(count) token value(s) did not open") && stuck.stderr.contains(keyA.id), "\(stuck.stderr)")
        let stuckReport = try jsonObject(stuck.stdout)
        #expect(stuckReport["unopenable"] as? [String: Int] == [keyA.id: count], "\(stuck.stdout)")
        #expect(try valueKeyCounts(db) == [keyA.id: count])

        let rekey = try await tokenctl(["--db", db, "rekey", "--encryption-key-file", keyB.path, "--encryption-key-file", keyA.path, "--json"], scratch)
        #expect(rekey.status == 0, "\(rekey.stdout) \(rekey.stderr)")
        let report = try jsonObject(rekey.stdout)
        #expect(report["primary_key_id"] as? String == keyB.id)
        #expect(report["resealed"] as? [String: Int] == [keyA.id: count], "\(rekey.stdout)")
        #expect(report["unopenable"] as? [String: Int] == [:], "\(rekey.stdout)")
        #expect(report["changed_meanwhile"] as? Int == 0, "\(rekey.stdout)")
        // "Values already under the primary key, left as they were" (TokenValueResealer.Report):
        // none were, before this rekey.
        #expect(report["already_primary"] as? Int == 0, "already_primary counts the values just re-sealed: \(rekey.stdout)")

        let stats = try await tokenctl(["--db", db, "stats", "--json"], scratch)
        #expect(stats.status == 0, "\(stats.stderr)")
        #expect(try jsonObject(stats.stdout)["values_by_key_id"] as? [String: Int] == [keyB.id: count], "\(stats.stdout)")
        try expectAllSealed(db, with: keyB, subjects: subjects.keys, issued: try await issuer.issuedTokens(), context: "after rekey")

        // A second rekey has nothing to do; the text form says so.
        let again = try await tokenctl(["--db", db, "rekey", "--encryption-key-file", keyB.path, "--encryption-key-file", keyA.path], scratch)
        #expect(again.status == 0, "\(again.stderr)")
        #expect(again.stdout.contains("re-sealed 0 token value(s) in \(db) under key id \(keyB.id)"), "\(again.stdout)")
        #expect(again.stdout.contains("\(count) under key id \(keyB.id) now"), "\(again.stdout)")

        // B alone serves every stored token: same fingerprints, no fetch.
        let served = try await AgentFixture.run(once + ["--encryption-key-file", keyB.path], in: scratch)
        #expect(served.status == 0, "\(served.stderr.suffix(2000))")
        let results = try onceResults(served.stdout)
        #expect(results.allSatisfy { $0["source"] == "store" }, "\(served.stdout)")
        #expect(try fingerprintsByKey(served.stdout) == fingerprints)
        #expect(try await issuer.stats().issued == issuedBefore, "the agent with key B fetched again")
        #expect(!served.stderr.contains("does not open"), "\(served.stderr.suffix(2000))")

        // A alone no longer opens the store.
        let refused = try await AgentFixture.run(once + ["--encryption-key-file", keyA.path], in: scratch)
        #expect(refused.status == 1, "\(refused.stdout) \(refused.stderr.suffix(2000))")
        #expect(refused.stderr.contains("holds \(count) token value(s) sealed with encryption key id \(keyB.id), and no key given has that id"),
                "\(refused.stderr.suffix(2000))")
        #expect(try await issuer.stats().issued == issuedBefore)
        expectNoPlaintext(of: try await issuer.issuedTokens(), inStoreAt: db, context: "after the rotation")
        let secrets = SecretScanner()
        secrets.remember(contentsOf: try await issuer.issuedTokens().values.joined())
        secrets.expectNoLeaks(in: [("rekey", rekey.stdout + rekey.stderr), ("stuck rekey", stuck.stdout + stuck.stderr),
                                   ("agent B", served.stdout + served.stderr), ("agent A", refused.stdout + refused.stderr)],
                              minimumTokens: count)
    }

    // MARK: - 5. Migration of a plaintext store

    @Test("a plaintext store: the agent with a key seals every value in place (no refetch); neither the store nor its -wal holds the old tokens after")
    func plaintextStoreIsSealed() async throws {
        let scratch = Scratch()
        let issuer = try await IssuerProcess(scratch: scratch, recordTokens: true)
        let db = scratch.file("tokens.sqlite")
        let subjects = Subjects(vehicles: 4, trips: 4)
        let count = subjects.keys.count
        let key = try KeyFile("store.key", in: scratch)
        let plain = try await AgentFixture.run(["--db", db, "--provider-url", issuer.template, "--once", "--json"] + subjects.arguments,
                                       in: scratch)
        try #require(plain.status == 0, "\(plain.stderr)")
        let fingerprints = try fingerprintsByKey(plain.stdout)
        let oldTokens = try await issuer.issuedTokens()
        #expect(try valueKeyCounts(db) == [plaintextKeyID: count])
        // The scan's own check: in the plaintext store it finds every token.
        let found = plaintextFindings(of: oldTokens, in: [db, db + "-wal", db + "-shm"])
        #expect(Set(found.compactMap { finding in finding.range(of: "fp=").map { String(finding[$0.upperBound...].prefix(12)) } }).count == count,
                "the scan did not find the plaintext store's tokens: \(found.count) findings")

        // Long-lived, so the store is scanned while the agent holds it open, then after a kill -9.
        let agent = try AgentFixture.launch(["--db", db, "--provider-url", issuer.template, "--encryption-key-file", key.path,
                                                       "--log-level", "debug"] + subjects.arguments, in: scratch)
        #expect(await agent.waitForOutput("sealed the store's unencrypted token values", within: 30), "\(agent.stderr.suffix(3000))")
        #expect(agent.stderr.contains("sealed=\(count)"), "\(agent.stderr.suffix(3000))")
        let served = await eventually(within: 30) { Set(committedLines(agent.stdout).map(\.key)) == Set(subjects.keys) }
        #expect(served, "\(agent.stdout) \(agent.stderr.suffix(3000))")
        for line in committedLines(agent.stdout) {
            #expect(line.source == "store" && line.fingerprint == fingerprints[line.key], "\(line.key) was not served from the sealed store")
        }
        #expect(try await issuer.stats().issued == count, "sealing refetched tokens")
        try expectAllSealed(db, with: key, subjects: subjects.keys, issued: oldTokens, context: "sealed, agent running")
        expectNoPlaintext(of: oldTokens, inStoreAt: db, context: "sealed, agent running")
        agent.signal(SIGKILL)
        #expect(await agent.wait(upTo: 10) != nil)
        expectNoPlaintext(of: try await issuer.issuedTokens(), inStoreAt: db, context: "sealed, agent killed")
        try expectAllSealed(db, with: key, subjects: subjects.keys, issued: try await issuer.issuedTokens(), context: "sealed, agent killed")
        #expect(try await sqlite3(db, "PRAGMA integrity_check", readOnly: true) == "ok")
    }

    // MARK: - 6. Tampering

    @Test("an altered value and a value copied onto another subject: both refetched once, never served; the error names the key; the others come from the store")
    func tamperedValuesAreRefetched() async throws {
        let scratch = Scratch()
        let issuer = try await IssuerProcess(scratch: scratch, recordTokens: true)
        let db = scratch.file("tokens.sqlite")
        let subjects = Subjects(vehicles: 3, trips: 3)
        let key = try KeyFile("store.key", in: scratch)
        let once = ["--db", db, "--provider-url", issuer.template, "--encryption-key-file", key.path, "--once", "--json"] + subjects.arguments
        let filled = try await AgentFixture.run(once, in: scratch)
        try #require(filled.status == 0, "\(filled.stderr)")
        let filledAt = Date()
        let original = try fingerprintsByKey(filled.stdout)
        try #require(original.count == subjects.keys.count)

        // v01's ciphertext altered (one base64 digit of its payload changed); v02's whole value
        // copied onto t01.
        let altered = try await sqlite3(db, "SELECT token FROM tokens WHERE kind = 'vehicle' AND subject_id = 'v01'")
        let payloadStart = try #require(altered.range(of: ":", options: .backwards)).upperBound
        let position = altered.index(payloadStart, offsetBy: 20)
        let flipped = altered[position] == "A" ? "B" : "A"
        let tampered = String(altered[..<position]) + flipped + String(altered[altered.index(after: position)...])
        _ = try await sqlite3(db, "UPDATE tokens SET token = '\(tampered)' WHERE kind = 'vehicle' AND subject_id = 'v01'")
        _ = try await sqlite3(db, "UPDATE tokens SET token = (SELECT token FROM tokens WHERE kind = 'vehicle' AND subject_id = 'v02') WHERE kind = 'trip' AND subject_id = 't01'")
        let moved = try await sqlite3(db, "SELECT token FROM tokens WHERE kind = 'trip' AND subject_id = 't01'")
        #expect(moved.hasPrefix(SealedTokenValue.prefix + key.id))
        // The issuer signs deterministically with whole-second iat: a refetch within the second
        // of the first fetch would return the very same token.
        await nextWholeSecond(after: filledAt)
        let issuedBefore = try await issuer.issuedTimes()

        let run = try await AgentFixture.run(once + ["--log-level", "debug"], in: scratch)
        #expect(run.status == 0, "\(run.stderr.suffix(3000))")
        let results = try onceResults(run.stdout)
        let sources = Dictionary(uniqueKeysWithValues: results.map { ("\($0["kind"] ?? "")/\($0["id"] ?? "")", $0["source"] ?? "") })
        let served = try fingerprintsByKey(run.stdout)
        let issuedAfter = try await issuer.issuedTimes()
        let tamperedKeys: Set = ["vehicle/v01", "trip/t01"]
        for subject in subjects.keys {
            let fetches = (issuedAfter[subject]?.count ?? 0) - (issuedBefore[subject]?.count ?? 0)
            if tamperedKeys.contains(subject) {
                #expect(sources[subject] == "provider", "\(subject) was served from the store: \(run.stdout)")
                #expect(fetches == 1, "\(subject) fetched \(fetches) times")
                #expect(served[subject] != original[subject], "\(subject) served its altered value's token")
                #expect(served[subject] != original["vehicle/v02"], "\(subject) served the value moved from vehicle/v02")
            } else {
                #expect(sources[subject] == "store", "\(subject) was refetched: \(run.stdout)")
                #expect(fetches == 0, "\(subject) fetched \(fetches) times")
                #expect(served[subject] == original[subject])
            }
        }
        for subject in tamperedKeys {
            let logged = run.stderr.split(separator: "\n").contains {
                $0.contains("stored token does not open") && $0.contains("key=\(subject) ") && $0.contains("key_id=\(key.id)") && $0.contains(" error ")
            }
            #expect(logged, "no error naming \(subject) and key id \(key.id): \(run.stderr.suffix(3000))")
        }
        // The refetched tokens replaced the bad values, sealed; vehicle/v02 kept its own.
        let rows = try sealedRows(db)
        for subject in tamperedKeys {
            #expect(rows[subject]?.keyID == key.id && rows[subject]?.fingerprint == served[subject], "\(subject): \(String(describing: rows[subject]?.fingerprint))")
        }
        #expect(rows["vehicle/v02"]?.fingerprint == original["vehicle/v02"])
        #expect(rows["trip/t01"]?.stored != moved && rows["vehicle/v01"]?.stored != tampered)
        let secrets = SecretScanner()
        secrets.remember(contentsOf: try await issuer.issuedTokens().values.joined())
        secrets.expectNoLeaks(in: [("agent stdout", run.stdout), ("agent stderr", run.stderr)], minimumTokens: subjects.keys.count + 2)
    }

    // MARK: - 7. tokenctl

    @Test("tokenctl on a sealed store: show --reveal needs the key and names its id; list and stats need none and count by key id")
    func tokenctlOnSealedStore() async throws {
        let scratch = Scratch()
        let issuer = try await IssuerProcess(scratch: scratch, recordTokens: true)
        let db = scratch.file("tokens.sqlite")
        let subjects = Subjects(vehicles: 2, trips: 2)
        let key = try KeyFile("store.key", in: scratch)
        let other = try KeyFile("other.key", in: scratch)
        let filled = try await AgentFixture.run(["--db", db, "--provider-url", issuer.template, "--encryption-key-file", key.path,
                                                        "--once", "--json"] + subjects.arguments, in: scratch)
        try #require(filled.status == 0, "\(filled.stderr)")
        let fingerprints = try fingerprintsByKey(filled.stdout)
        let issued = try await issuer.issuedTokens()
        let v01 = try #require(issued["vehicle/v01"]?.last)
        var outputs: LabelledOutputs = []

        let hidden = try await tokenctl(["--db", db, "show", "vehicle", "v01", "--reveal"], scratch)
        #expect(hidden.status == 1, "\(hidden.stdout) \(hidden.stderr)")
        #expect(hidden.stderr.contains("sealed with encryption key id \(key.id)") && hidden.stderr.contains("--encryption-key-file"), "\(hidden.stderr)")
        #expect(!hidden.stdout.contains(v01))
        let wrong = try await tokenctl(["--db", db, "--encryption-key-file", other.path, "show", "vehicle", "v01", "--reveal"], scratch)
        #expect(wrong.status == 1)
        #expect(wrong.stderr.contains("sealed with encryption key id \(key.id), and no key given has that id"), "\(wrong.stderr)")
        let revealed = try await tokenctl(["--db", db, "--encryption-key-file", key.path, "show", "vehicle", "v01", "--reveal"], scratch)
        #expect(revealed.status == 0, "\(revealed.stderr)")
        #expect(revealed.stdout.contains(v01), "--reveal with the key did not print the issued token")
        #expect(!revealed.stdout.contains(SealedTokenValue.prefix))

        // show without --reveal: claims decoded only with the key.
        let shown = try await tokenctl(["--db", db, "show", "vehicle", "v01", "--json"], scratch)
        #expect(shown.status == 0, "\(shown.stderr)")
        let claims = try #require(try jsonObject(shown.stdout)["claims"] as? [String: Any])
        #expect(claims["decoded"] as? Bool == false && claims["sealed_with_key_id"] as? String == key.id, "\(shown.stdout)")
        // With a key file, but not the value's key (a rotation's new key only, say): the entry
        // is shown as without one, exit 0, and a note says the given keys do not open it.
        let otherKeyShown = try await tokenctl(["--db", db, "--encryption-key-file", other.path, "show", "vehicle", "v01", "--json"], scratch)
        #expect(otherKeyShown.status == 0, "\(otherKeyShown.stderr)")
        let otherClaims = try #require(try jsonObject(otherKeyShown.stdout)["claims"] as? [String: Any])
        #expect(otherClaims["decoded"] as? Bool == false && otherClaims["sealed_with_key_id"] as? String == key.id, "\(otherKeyShown.stdout)")
        #expect(otherKeyShown.stderr.contains("note: the token of vehicle/v01 is sealed with encryption key id \(key.id), and no key given has that id"),
                "\(otherKeyShown.stderr)")
        #expect(!otherKeyShown.stdout.contains(v01) && !otherKeyShown.stderr.contains(v01))
        let decoded = try await tokenctl(["--db", db, "--encryption-key-file", key.path, "show", "vehicle", "v01"], scratch)
        #expect(decoded.status == 0 && decoded.stdout.contains("vehicleid=v01"), "\(decoded.stdout) \(decoded.stderr)")

        let list = try await tokenctl(["--db", db, "list", "--json"], scratch)
        #expect(list.status == 0, "\(list.stderr)")
        let entries = try #require(try JSONSerialization.jsonObject(with: Data(list.stdout.utf8)) as? [[String: Any]])
        #expect(entries.count == subjects.keys.count)
        for entry in entries {
            let subject = "\(entry["kind"] ?? "")/\(entry["id"] ?? "")"
            #expect(entry["value_key_id"] as? String == key.id, "\(subject)")
            #expect(entry["fingerprint"] as? String == fingerprints[subject], "\(subject): list shows another fingerprint than the agent")
        }
        let stats = try await tokenctl(["--db", db, "stats"], scratch)
        #expect(stats.status == 0, "\(stats.stderr)")
        #expect(stats.stdout.contains("token values    \(subjects.keys.count) sealed with key id \(key.id)\n"), "\(stats.stdout)")

        // One value stored as plaintext (a writer without the key): counted apart.
        _ = try await sqlite3(db, "UPDATE tokens SET token = '\(v01)' WHERE kind = 'vehicle' AND subject_id = 'v01'")
        let mixed = try await tokenctl(["--db", db, "stats"], scratch)
        #expect(mixed.stdout.contains("token values    \(subjects.keys.count - 1) sealed with key id \(key.id), 1 not sealed"), "\(mixed.stdout)")
        let mixedJSON = try await tokenctl(["--db", db, "stats", "--json"], scratch)
        #expect(try jsonObject(mixedJSON.stdout)["values_by_key_id"] as? [String: Int] == [key.id: subjects.keys.count - 1, plaintextKeyID: 1])
        let mixedList = try await tokenctl(["--db", db, "list", "--json", "--id", "v01"], scratch)
        let v01Entry = try #require((try JSONSerialization.jsonObject(with: Data(mixedList.stdout.utf8)) as? [[String: Any]])?.first)
        #expect(v01Entry["value_key_id"] as? String == plaintextKeyID)
        #expect(v01Entry["fingerprint"] as? String == fingerprints["vehicle/v01"])

        for (label, result) in [("show --reveal without key", hidden), ("show --reveal other key", wrong), ("show --json", shown),
                                ("show with key", decoded), ("list", list), ("stats", stats), ("mixed stats", mixed),
                                ("mixed stats json", mixedJSON), ("mixed list", mixedList)] {
            outputs += [("\(label) stdout", result.stdout), ("\(label) stderr", result.stderr)]
        }
        let secrets = SecretScanner()
        secrets.remember(contentsOf: issued.values.joined())
        secrets.expectNoLeaks(in: outputs, minimumTokens: subjects.keys.count)
    }

    // MARK: - 8. systemd's credential

    @Test("no --encryption-key-file: $CREDENTIALS_DIRECTORY/token-store-key seals (its mode and owner left to systemd), for the agent and tokenctl")
    func credentialIsTheDefaultKey() async throws {
        let scratch = Scratch()
        let issuer = try await IssuerProcess(scratch: scratch, recordTokens: true)
        let db = scratch.file("tokens.sqlite")
        let credentials = scratch.file("credentials")
        try FileManager.default.createDirectory(atPath: credentials, withIntermediateDirectories: false)
        let key = try KeyFile("credentials/token-store-key", in: scratch, base64: true)
        // systemd may hand it out group-readable (with an ACL): accepted inside the directory.
        #expect(chmod(key.path, 0o440) == 0)
        let environment = ["CREDENTIALS_DIRECTORY": credentials]
        let subjects = Subjects(vehicles: 1, trips: 1)
        let run = try await AgentFixture.run(["--db", db, "--provider-url", issuer.template, "--once"] + subjects.arguments,
                                     environment: environment, in: scratch)
        #expect(run.status == 0, "\(run.stderr.suffix(2000))")
        let issued = try await issuer.issuedTokens()
        try expectAllSealed(db, with: key, subjects: subjects.keys, issued: issued, context: "credential key")
        expectNoPlaintext(of: issued, inStoreAt: db, context: "credential key")
        let revealed = try await tokenctl(["--db", db, "show", "trip", "t01", "--reveal"], scratch, environment: environment)
        #expect(revealed.status == 0, "\(revealed.stderr)")
        #expect(revealed.stdout.contains(try #require(issued["trip/t01"]?.last)))
        // The same file outside the credentials directory is refused for its mode.
        let loose = try await AgentFixture.run(["--db", db, "--provider-url", issuer.template, "--encryption-key-file", key.path,
                                                       "--once"] + subjects.arguments, in: scratch)
        #expect(loose.status == 1)
        #expect(loose.stderr.contains("has mode 440"), "\(loose.stderr.suffix(2000))")
    }

    // MARK: - 9. A keyless agent beside a sealing one

    @Test("an agent without a key, running while another agent seals the store, never serves a sealed value as a token")
    func keylessAgentNeverServesSealedValue() async throws {
        let scratch = Scratch()
        let issuer = try await IssuerProcess(scratch: scratch, recordTokens: true)
        let db = scratch.file("tokens.sqlite")
        let socket = scratch.file("api.sock")
        let subjects = Subjects(vehicles: 1, trips: 1)
        let key = try KeyFile("store.key", in: scratch)
        let keyless = try AgentFixture.launch(["--db", db, "--provider-url", issuer.template, "--listen", "unix:\(socket)",
                                                         "--log-level", "debug"] + subjects.arguments, in: scratch)
        let started = await eventually(within: 30) { Set(committedLines(keyless.stdout).map(\.key)) == Set(subjects.keys) }
        try #require(started, "\(keyless.stderr.suffix(3000))")
        // The second agent seals the plaintext store in place while the first runs.
        let sealing = try AgentFixture.launch(["--db", db, "--provider-url", issuer.template, "--encryption-key-file", key.path,
                                                         "--log-level", "debug"] + subjects.arguments, in: scratch)
        #expect(await sealing.waitForOutput("sealed the store's unencrypted token values", within: 30), "\(sealing.stderr.suffix(3000))")
        // A purge makes both fetch vehicle/v01 again; the sealing agent's commit reaches the
        // keyless one through the change feed.
        await nextWholeSecond(after: Date())
        let linesBefore = committedLines(keyless.stdout).count
        let purged = try await tokenctl(["--db", db, "purge", "--vehicle", "v01"], scratch)
        #expect(purged.status == 0, "\(purged.stderr)")
        // The keyless agent either refetches (it saw the removal) or, when the sealing agent's
        // new value came first, keeps the token it holds and says it cannot read the stored one:
        // an unreadable value is not a removal, or the two would refetch after each other forever.
        let reacted = await eventually(within: 15) {
            committedLines(keyless.stdout).dropFirst(linesBefore).contains { $0.key == "vehicle/v01" }
                || keyless.stderr.contains("this engine was given no key")
        }
        #expect(reacted, "the keyless agent neither took up vehicle/v01 again nor reported the sealed value: \(keyless.stdout) \(keyless.stderr.suffix(3000))")
        // No fetch loop: the keyless agent refetching what it cannot open and storing it
        // unsealed, the sealing agent refetching what is not sealed, and so on, would hammer
        // the provider.
        try await expectNoFetchLoop(issuer, "vehicle/v01", settling: 2, context: "keyless beside sealing")

        let issued = try await issuer.issuedTokens()
        let issuedFingerprints = Set((issued["vehicle/v01"] ?? []).map { TokenFingerprint(of: $0).description })
        let v01Lines = committedLines(keyless.stdout).filter { $0.key == "vehicle/v01" }
        let foreign = v01Lines.filter { !issuedFingerprints.contains($0.fingerprint) }
        #expect(foreign.isEmpty, """
            the keyless agent took up vehicle/v01 values the issuer never issued (sealed values read as tokens): \
            \(foreign.map { "fp=\($0.fingerprint) source=\($0.source)" }); issued: \(issuedFingerprints.sorted()); \
            sealing agent's lines: \(committedLines(sealing.stdout).filter { $0.key == "vehicle/v01" }.map { "fp=\($0.fingerprint) source=\($0.source)" })
            """)
        if let curl = executable(["/usr/bin/curl", "/usr/local/bin/curl", "/bin/curl"]) {
            let answer = try await runCapturing([curl, "-s", "--unix-socket", socket, "-H", "Fleet-Token-Request: true",
                                           "http://localhost/v1/token/vehicle/v01"])
            let object = (try? jsonObject(answer.stdout)) ?? [:]
            if let token = object["token"] as? String {
                let sealedServed = token.hasPrefix(SealedTokenValue.prefix)
                let issuedServed = issued["vehicle/v01"]?.contains(token) == true
                #expect(!sealedServed, "the keyless agent's API served a sealed value as vehicle/v01's token")
                #expect(issuedServed, "the keyless agent's API served a token the issuer never issued")
            } else {
                // No token at all is acceptable (treated as missing); a sealed one never is.
                #expect(!answer.stdout.contains(SealedTokenValue.prefix), "\(answer.stdout.prefix(300))")
            }
        }
        for agent in [keyless, sealing] {
            agent.signal(SIGTERM)
            _ = await agent.wait(upTo: 5)
        }
        let secrets = SecretScanner()
        secrets.remember(contentsOf: try await issuer.issuedTokens().values.joined())
        secrets.expectNoLeaks(in: keyless.outputs(labelled: "keyless agent") + sealing.outputs(labelled: "sealing agent"), minimumTokens: 2)
    }

    // MARK: - 10. A rolling rotation: an agent with the old key only beside one sealing with the new

    @Test("mid-rotation, an agent holding only the old key sees a value sealed with the new one: an error naming that key id, and it serves only issued tokens")
    func oldKeyAgentBesideNewKeyAgent() async throws {
        let curl = try #require(executable(["/usr/bin/curl", "/usr/local/bin/curl", "/bin/curl"]), "needs curl for the Unix-socket API")
        let scratch = Scratch()
        let issuer = try await IssuerProcess(scratch: scratch, recordTokens: true)
        let db = scratch.file("tokens.sqlite")
        let oldSocket = scratch.file("old.sock"), newSocket = scratch.file("new.sock")
        let subjects = Subjects(vehicles: 1, trips: 1)
        let keyA = try KeyFile("a.key", in: scratch)
        let keyB = try KeyFile("b.key", in: scratch)
        let common = ["--db", db, "--provider-url", issuer.template, "--log-level", "debug"] + subjects.arguments
        let old = try AgentFixture.launch(common + ["--encryption-key-file", keyA.path, "--listen", "unix:\(oldSocket)"], in: scratch)
        #expect(await eventually(within: 30) { Set(committedLines(old.stdout).map(\.key)) == Set(subjects.keys) }, "\(old.stderr.suffix(3000))")
        let new = try AgentFixture.launch(common + ["--encryption-key-file", keyB.path, "--encryption-key-file", keyA.path,
                                                              "--listen", "unix:\(newSocket)"], in: scratch)
        #expect(await eventually(within: 30) { Set(committedLines(new.stdout).map(\.key)) == Set(subjects.keys) }, "\(new.stderr.suffix(3000))")
        #expect(committedLines(new.stdout).allSatisfy { $0.source == "store" }, "the new agent did not open the old key's values")

        // vehicle/v01's value is re-sealed with B in place (rekey: a change of the value, not a
        // removal). An invalidation through the new agent's API would remove the token first,
        // and the old agent, seeing the removal, refetches and may store its own (under A) last.
        let rekeyed = try await tokenctl(["--db", db, "--encryption-key-file", keyB.path, "--encryption-key-file", keyA.path, "rekey"], scratch)
        #expect(rekeyed.status == 0, "\(rekeyed.stdout) \(rekeyed.stderr)")
        let sealedWithB = await eventually(within: 15) { (try? sealedRows(db))?["vehicle/v01"]?.keyID == keyB.id }
        #expect(sealedWithB, "the new agent's token was not stored under B: \(new.stderr.suffix(3000))")
        let noticed = await eventually(within: 15) {
            old.stderr.split(separator: "\n").contains { $0.contains(" error ") && $0.contains("key=vehicle/v01 ") && $0.contains("key_id=\(keyB.id)") }
        }
        #expect(noticed, "the old agent logged no error naming key id \(keyB.id): \(old.stderr.suffix(3000))")
        try await expectNoFetchLoop(issuer, "vehicle/v01", settling: 1, context: "old key beside new key")

        let issued = try await issuer.issuedTokens()
        let issuedFingerprints = Set(issued.values.joined().map { TokenFingerprint(of: $0).description })
        for (label, agent) in [("old", old), ("new", new)] {
            let foreign = committedLines(agent.stdout).filter { !issuedFingerprints.contains($0.fingerprint) }
            #expect(foreign.isEmpty, "the \(label) agent took up values never issued: \(foreign.map { "\($0.key) fp=\($0.fingerprint) source=\($0.source)" })")
        }
        for (label, socket) in [("old", oldSocket), ("new", newSocket)] {
            let answer = try await runCapturing([curl, "-s", "--unix-socket", socket, "-H", "Fleet-Token-Request: true", "http://localhost/v1/token/vehicle/v01"])
            let token = (try? jsonObject(answer.stdout))?["token"] as? String
            let servedIssued = token.map { issued["vehicle/v01"]?.contains($0) == true } ?? false
            #expect(servedIssued, "the \(label) agent's API did not serve an issued token for vehicle/v01: \(answer.stdout.prefix(200))")
        }
        // Every value on disk stays sealed, under A or B.
        let rows = try sealedRows(db)
        #expect(rows.values.allSatisfy { $0.keyID == keyA.id || $0.keyID == keyB.id }, "\(rows.mapValues { $0.keyID ?? "NULL" })")
        expectNoPlaintext(of: issued, inStoreAt: db, context: "mid-rotation")
        for agent in [old, new] {
            agent.signal(SIGTERM)
            #expect(await agent.wait(upTo: 5) == 0, "\(agent.stderr.suffix(2000))")
        }
        let secrets = SecretScanner()
        secrets.remember(contentsOf: issued.values.joined())
        secrets.expectNoLeaks(in: old.outputs(labelled: "old agent") + new.outputs(labelled: "new agent"), minimumTokens: 2)
    }

    // MARK: - 11. Two agents sharing a store and its key

    @Test("two agents sharing a store and its key, refreshing short-lived tokens in single flight: each serves only tokens the issuer issued")
    func twoAgentsOneKey() async throws {
        let scratch = Scratch()
        let issuer = try await IssuerProcess(scratch: scratch, lifetime: Self.shortLifetime, recordTokens: true)
        let db = scratch.file("tokens.sqlite")
        let subjects = Subjects(vehicles: 3, trips: 3)
        let key = try KeyFile("store.key", in: scratch)
        let arguments = ["--db", db, "--provider-url", issuer.template, "--encryption-key-file", key.path, "--log-level", "debug"]
            + subjects.arguments
        let first = try AgentFixture.launch(arguments, in: scratch)
        let second = try AgentFixture.launch(arguments, in: scratch)
        // Two refresh rounds of every subject (soft points about 4.6 s apart), shared between them.
        let shared = await eventually(within: 40) {
            committedLines(first.stdout + second.stdout).filter { $0.source != "store" }.count >= subjects.keys.count * 6
                && !committedLines(first.stdout + second.stdout).filter { $0.source == "other_process" }.isEmpty
        }
        #expect(shared, "the agents did not share refreshes: \(first.stdout.suffix(2000)) \(second.stdout.suffix(2000))")
        for agent in [first, second] {
            agent.signal(SIGTERM)
            #expect(await agent.wait(upTo: 5) == 0, "\(agent.stderr.suffix(2000))")
        }
        let issued = try await issuer.issuedTokens()
        let issuedFingerprints = Set(issued.values.joined().map { TokenFingerprint(of: $0).description })
        for (label, agent) in [("first", first), ("second", second)] {
            let lines = committedLines(agent.stdout)
            let foreign = lines.filter { !issuedFingerprints.contains($0.fingerprint) }
            #expect(foreign.isEmpty, """
                the \(label) agent took up \(foreign.count) of \(lines.count) values the issuer never issued (sealed values read as tokens): \
                \(foreign.prefix(5).map { "\($0.key) fp=\($0.fingerprint) source=\($0.source)" })
                """)
            #expect(!agent.stderr.contains("does not open"), "\(label): \(agent.stderr.suffix(2000))")
        }
        // Sealing does not break single flight: the agents never fetched one subject twice
        // within one lifetime (a sealed value taken for a missing one would refetch it).
        let times = try await issuer.issuedTimes()
        var twice: [String] = []
        for subject in subjects.keys {
            let issuedAt = (times[subject] ?? []).sorted()
            for (_, gap) in IssuerProcess.refetchesTooSoon(issuedAt, lifetime: Double(Self.shortLifetime)) {
                twice.append("\(subject): \(String(format: "%.2f", gap)) s apart")
            }
        }
        #expect(twice.isEmpty, "subjects fetched twice within one lifetime: \(twice)")
        try expectAllSealed(db, with: key, subjects: subjects.keys, issued: issued, context: "two agents")
        expectNoPlaintext(of: issued, inStoreAt: db, context: "two agents")
        let secrets = SecretScanner()
        secrets.remember(contentsOf: issued.values.joined())
        secrets.expectNoLeaks(in: first.outputs(labelled: "first agent") + second.outputs(labelled: "second agent"), minimumTokens: subjects.keys.count)
    }
}

// MARK: - Helpers

/// A key file of 32 random bytes (raw, or their base64 text), mode 0600, and the id of its key.
struct KeyFile {
    let path: String
    let id: String

    init(_ name: String, in scratch: Scratch, base64: Bool = false) throws {
        var generator = SystemRandomNumberGenerator()
        let bytes = Data((0..<32).map { _ in UInt8.random(in: 0...255, using: &generator) })
        path = scratch.file(name)
        let contents = base64 ? Data((bytes.base64EncodedString() + "\n").utf8) : bytes
        guard FileManager.default.createFile(atPath: path, contents: contents, attributes: [.posixPermissions: 0o600]) else {
            throw ProcessFailure(message: "cannot write \(path)")
        }
        chmod(path, 0o600)
        id = try TokenEncryptionKey(bytes: bytes).id
    }
}

/// A stored token as stock sqlite3 reads it: its value's key id, and its fingerprint (carried
/// in a sealed value, computed for a plaintext one).
struct SealedRow {
    let keyID: String?
    let stored: String
    var fingerprint: String { SealedTokenValue.fingerprint(ofStored: stored).description }
}

/// The stored tokens by `kind/id`, read with `sqlite3 -readonly` (a killed agent's -wal stays as it was).
func sealedRows(_ db: String) throws -> [String: SealedRow] {
    let text = try sqlite3(db, "SELECT kind || '/' || subject_id, ifnull(value_key_id, ''), token FROM tokens WHERE token IS NOT NULL",
                           readOnly: true)
    var rows: [String: SealedRow] = [:]
    for line in text.split(separator: "\n") {
        let fields = line.split(separator: "|", maxSplits: 2, omittingEmptySubsequences: false)
        guard fields.count == 3 else { continue }
        rows[String(fields[0])] = SealedRow(keyID: fields[1].isEmpty ? nil : String(fields[1]), stored: String(fields[2]))
    }
    return rows
}

/// After `settling` seconds (a few change-feed polls), `key` is issued no more over the next 3 s:
/// two agents that cannot read each other's values do not refetch after each other.
func expectNoFetchLoop(_ issuer: IssuerProcess, _ key: String, settling: Double, context: String,
                       sourceLocation: SourceLocation = #_sourceLocation) async throws {
    try await Task.sleep(for: .seconds(settling))
    let settled = try await issuer.issuedTimes()[key]?.count ?? 0
    try await Task.sleep(for: .seconds(3))
    let later = try await issuer.issuedTimes()[key]?.count ?? 0
    #expect(later == settled, "\(context): \(key) was fetched \(later - settled) more times in 3 s after the agents settled (\(settled) before): a fetch loop",
            sourceLocation: sourceLocation)
    print("\(context): \(key) issued \(settled) times by the settle point, \(later) after 3 s more")
}

/// How many stored values are under each key id (the V0003 column), read with sqlite3.
func valueKeyCounts(_ db: String) throws -> [String: Int] {
    var counts: [String: Int] = [:]
    for line in try sqlite3(db, "SELECT value_key_id, count(*) FROM tokens WHERE token IS NOT NULL GROUP BY 1", readOnly: true)
        .split(separator: "\n") {
        let fields = line.split(separator: "|")
        if fields.count == 2, let count = Int(fields[1]) { counts[String(fields[0])] = count }
    }
    return counts
}

/// Every subject has a token sealed with `key` (column and value agree), and each is a token
/// the issuer issued for that subject (by fingerprint): the store is neither empty nor garbage.
func expectAllSealed(_ db: String, with key: KeyFile, subjects: [String], issued: [String: [String]], context: String,
                     sourceLocation: SourceLocation = #_sourceLocation) throws {
    expectAllSealed(try sealedRows(db), with: key, subjects: subjects, issued: issued, context: context, sourceLocation: sourceLocation)
}

/// The same check on `rows` read earlier: with the agent running, read the rows before the
/// issuer's list, so a refresh between the two reads lengthens the list instead of failing.
func expectAllSealed(_ rows: [String: SealedRow], with key: KeyFile, subjects: [String], issued: [String: [String]], context: String,
                     sourceLocation: SourceLocation = #_sourceLocation) {
    #expect(Set(rows.keys) == Set(subjects), "\(context): stored subjects \(rows.keys.sorted())", sourceLocation: sourceLocation)
    for (subject, row) in rows.sorted(by: { $0.key < $1.key }) {
        #expect(row.keyID == key.id, "\(context): \(subject) has value_key_id \(row.keyID ?? "NULL"), not \(key.id)", sourceLocation: sourceLocation)
        #expect(row.stored.hasPrefix("\(SealedTokenValue.prefix)\(key.id):"), "\(context): \(subject) is not sealed with \(key.id)",
                sourceLocation: sourceLocation)
        let known = Set((issued[subject] ?? []).map { TokenFingerprint(of: $0).description })
        #expect(known.contains(row.fingerprint), "\(context): \(subject) holds fp=\(row.fingerprint), which the issuer never issued to it",
                sourceLocation: sourceLocation)
    }
}

/// Where any of `tokens` (by `kind/id`), its payload or its signature, appears in the raw
/// bytes of `files`: one line per finding, naming the file, the part and the fingerprint.
func plaintextFindings(of tokens: [String: [String]], in files: [String]) -> [String] {
    var findings: [String] = []
    for file in files {
        guard let bytes = FileManager.default.contents(atPath: file), !bytes.isEmpty else { continue }
        for (subject, values) in tokens.sorted(by: { $0.key < $1.key }) {
            for token in Set(values) {
                let parts = token.split(separator: ".")
                let needles = [("token", Substring(token))] + (parts.count == 3 ? [("payload", parts[1]), ("signature", parts[2])] : [])
                for (part, needle) in needles where bytes.range(of: Data(needle.utf8)) != nil {
                    findings.append("\((file as NSString).lastPathComponent): the \(part) of \(subject)'s token fp=\(TokenFingerprint(of: token))")
                }
            }
        }
    }
    return findings
}

/// None of `tokens` appears in the store at `db`, its -wal or -shm (or `extraFiles`), in part or whole.
func expectNoPlaintext(of tokens: [String: [String]], inStoreAt db: String, extraFiles: [String] = [], context: String,
                       sourceLocation: SourceLocation = #_sourceLocation) {
    let count = tokens.values.map(\.count).reduce(0, +)
    #expect(count > 0, "\(context): no issued tokens to look for", sourceLocation: sourceLocation)
    #expect(tokens.values.joined().allSatisfy { $0.split(separator: ".").count == 3 }, "\(context): an issued token is not a JWT",
            sourceLocation: sourceLocation)
    #expect(FileManager.default.fileExists(atPath: db), "\(context): no store to scan", sourceLocation: sourceLocation)
    for finding in plaintextFindings(of: tokens, in: [db, db + "-wal", db + "-shm"] + extraFiles) {
        Issue.record("\(context): plaintext on disk: \(finding)", sourceLocation: sourceLocation)
    }
}

/// The fingerprints `token-agent --once --json` printed, by `kind/id`.
func fingerprintsByKey(_ stdout: String) throws -> [String: String] {
    Dictionary(try onceResults(stdout).map { ("\($0["kind"] ?? "")/\($0["id"] ?? "")", $0["fingerprint"] ?? "") }) { $1 }
}

func jsonObject(_ text: String) throws -> [String: Any] {
    guard let object = try JSONSerialization.jsonObject(with: Data(text.utf8)) as? [String: Any] else {
        throw ProcessFailure(message: "not a JSON object: \(text)")
    }
    return object
}

func fileSize(_ path: String) -> Int? {
    (try? FileManager.default.attributesOfItem(atPath: path))?[.size] as? Int
}

/// Waits (at most about two seconds) until the wall clock is in a later whole second than `date`.
func nextWholeSecond(after date: Date) async {
    let target = date.timeIntervalSince1970.rounded(.down) + 1
    _ = await eventually(within: 3) { Date().timeIntervalSince1970 >= target }
}

/// A store's files as bytes (the -wal and -shm when present).
struct StoreFiles: Equatable {
    let main: Data
    let wal: Data?
    let shm: Data?

    init(_ db: String) throws {
        main = try Data(contentsOf: URL(fileURLWithPath: db))
        wal = FileManager.default.contents(atPath: db + "-wal")
        shm = FileManager.default.contents(atPath: db + "-shm")
    }

    /// Whether the store holds what it held when `before` was taken: the same `.dump` (every
    /// table, row and schema entry), and no -wal content left. Not the same bytes: opening a
    /// store read-write with an empty or missing -wal makes GRDB's DatabasePool create and drop
    /// a table (`grdb_issue_102`, Database.setUpWALMode), which bumps the header's change
    /// counter and schema cookie and can leave a page on the free list, encryption or not.
    /// Every page after the first (the schema page GRDB's create-and-drop rewrites) is still
    /// byte for byte what it was.
    func expectSameContent(as before: StoreFiles, _ dumpBefore: String, db: String, context: String,
                           sourceLocation: SourceLocation = #_sourceLocation) throws {
        #expect(try sqlite3(db, ".dump", readOnly: true) == dumpBefore, "\(context): the store's content changed", sourceLocation: sourceLocation)
        // The header's page size (big-endian at offset 16; 1 stands for 65536).
        let declared = Int(before.main[16]) << 8 | Int(before.main[17])
        let pageSize = declared == 1 ? 65536 : max(declared, 512)
        #expect(main.count >= before.main.count, "\(context): the store shrank", sourceLocation: sourceLocation)
        let rewritten = stride(from: pageSize, to: min(main.count, before.main.count), by: pageSize).filter {
            main[$0..<($0 + pageSize)] != before.main[$0..<($0 + pageSize)]
        }.map { $0 / pageSize + 1 }
        #expect(rewritten.isEmpty, "\(context): the refused agent rewrote pages \(rewritten)", sourceLocation: sourceLocation)
        #expect((wal ?? Data()).isEmpty, "\(context): the refused agent left \(wal?.count ?? 0) bytes of -wal", sourceLocation: sourceLocation)
    }
}
