// Store faults at the agent level (issue 7, part 3): a damaged, misplaced, read-only or full
// store under the real token-agent process. What the storage layer defines (StoreOpener,
// StoreFiles, TokenStoreError): corruption is quarantined to `<name>.corrupt-<time>` and a fresh
// store started; a path that is not a file or cannot be written is a clear error (exit 1);
// failing writes while running leave the agent serving from memory (`store-degraded`) until
// they work again (`store-recovered`).

import FleetTokenStoreTesting
import FleetTokenStore
import Foundation
import Testing
import TestSupportKit
#if canImport(Glibc)
import Glibc
#endif

/// The ways a store file can be damaged before the agent starts.
enum StoreDamage: String, CaseIterable, Sendable, CustomTestStringConvertible {
    case truncated, randomBytes, zeroedHeader, foreignWAL
    var testDescription: String { rawValue }
}

@Suite("Store faults under a real token-agent", .paced, .serialized, .exclusive)
struct StoreFaultTests {
    static let lifetime = 6
    static let subjects = Subjects(vehicles: 3, trips: 3)

    /// A sound store holding every subject's token, written and closed cleanly by the agent.
    private func soundStore(_ db: String, issuer: IssuerProcess, subjects: Subjects = Self.subjects,
                            in scratch: Scratch) async throws -> [String: StoredRow] {
        let made = try await AgentFixture.run(["--db", db, "--provider-url", issuer.template, "--once"] + subjects.arguments, in: scratch)
        try #require(made.status == 0, "\(made.stderr)")
        let rows = try storeSnapshot(db)
        try #require(rows.count == subjects.keys.count)
        return rows
    }

    @Test("a damaged store is quarantined with its evidence intact, and the agent starts fresh and refreshes", arguments: StoreDamage.allCases)
    func damagedStore(damage: StoreDamage) async throws {
        let scratch = Scratch()
        let issuer = try await IssuerProcess(scratch: scratch, lifetime: Self.lifetime)
        let db = scratch.file("tokens.sqlite")
        let secrets = SecretScanner()
        var outputs: LabelledOutputs = []
        secrets.remember(tokensOf: try await soundStore(db, issuer: issuer, in: scratch))

        var expectedWAL: Data?
        switch damage {
        case .truncated:
            // Cut inside the tables: the header still promises pages that are gone.
            let size = try FileManager.default.attributesOfItem(atPath: db)[.size] as? Int ?? 0
            try #require(size >= 4 * 4096, "store too small to truncate meaningfully: \(size)")
            #expect(truncate(db, off_t(size / 2 + 123)) == 0)
        case .randomBytes:
            var random = SeededGenerator(seed: reproducibleSeed("FTS_FAULT_SEED", test: "store fault \(damage)"))
            let bytes = (0..<65536).map { _ in UInt8.random(in: 0...255, using: &random) }
            try Data(bytes).write(to: URL(fileURLWithPath: db))
        case .zeroedHeader:
            let handle = try #require(FileHandle(forUpdatingAtPath: db))
            try handle.write(contentsOf: Data(count: 100))
            try handle.close()
        case .foreignWAL:
            // The -wal of another token store (other subjects), taken while it held commits.
            let other = scratch.file("other.sqlite")
            secrets.remember(tokensOf: try await soundStore(other, issuer: issuer, subjects: Subjects(vehicles: 4, trips: 1), in: scratch))
            let copy = try await runCapturing([sqlite3Path, other, "PRAGMA wal_autocheckpoint = 0;",
                                         "UPDATE tokens SET last_used_at = 1; INSERT INTO refresh_leases VALUES ('vehicle', 'x', 'h', 1, 2);",
                                         ".shell cp '\(other)-wal' '\(db)-wal'"])
            #expect(copy.status == 0, "\(copy.stderr)")
            expectedWAL = try Data(contentsOf: URL(fileURLWithPath: db + "-wal"))
            try #require((expectedWAL?.count ?? 0) > 32, "no foreign WAL frames to test with")
            // Judged on a copy (sqlite3 replays and removes a WAL): this pairing is corrupt.
            let probe = scratch.file("probe.sqlite")
            try FileManager.default.copyItem(atPath: db, toPath: probe)
            try FileManager.default.copyItem(atPath: db + "-wal", toPath: probe + "-wal")
            #expect((try? await sqlite3(probe, "PRAGMA integrity_check")) != "ok", "the foreign WAL happened to fit; the case tests nothing")
        }
        let damaged = try Data(contentsOf: URL(fileURLWithPath: db))

        let agent = try AgentFixture.launch(["--db", db, "--provider-url", issuer.template, "--log-level", "trace"]
                                       + Self.subjects.arguments, in: scratch)
        let refreshed = await eventually(within: 30) { Set(committedLines(agent.stdout).filter { $0.source == "provider" }.map(\.key)) == Set(Self.subjects.keys) }
        #expect(refreshed, "\(damage): \(agent.stderr.suffix(3000))")
        #expect(agent.stderr.contains("the token store was corrupt; moved it to \(db).corrupt-"), "\(damage): \(agent.stderr.suffix(3000))")

        // The evidence, as it was, beside a fresh sound store.
        let moved = quarantineFiles(in: scratch.path)
        let main = try #require(moved.first { !$0.hasSuffix("-wal") && !$0.hasSuffix("-shm") }, "\(damage): nothing quarantined: \(moved)")
        #expect(try Data(contentsOf: URL(fileURLWithPath: scratch.file(main))) == damaged, "\(damage): the quarantined file was changed")
        if let expectedWAL {
            let keptWAL = try? Data(contentsOf: URL(fileURLWithPath: scratch.file(main + "-wal")))
            #expect(keptWAL == expectedWAL, "\(damage): the foreign -wal was not kept with it")
        }
        #expect(try await sqlite3(db, "PRAGMA integrity_check", readOnly: true) == "ok")
        // What the agent reported, then the store: a commit between the two reads then shows as a
        // newer row, not as a reported token the store lacks (the agent goes on refreshing).
        let reported = lastCommitted(committedLines(agent.stdout))
        let rows = try storeSnapshot(db)
        secrets.remember(tokensOf: rows)
        expectCommittedTokensStored(reported, rows, context: "\(damage)")
        expectStoreModes(db)
        for file in moved { #expect(fileMode(scratch.file(file)).map { $0 & 0o077 } == 0, "\(file) is readable by others") }

        agent.signal(SIGTERM)
        #expect(await agent.wait(upTo: 5) == 0, "\(agent.stderr.suffix(2000))")
        outputs += agent.outputs(labelled: "agent")
        secrets.expectNoLeaks(in: outputs, minimumTokens: Self.subjects.keys.count)
    }

    @Test("a directory at the store path: exit 1 with a clear message, nothing moved or created")
    func directoryAtStorePath() async throws {
        let scratch = Scratch()
        let issuer = try await IssuerProcess(scratch: scratch, lifetime: Self.lifetime)
        let db = scratch.file("tokens.sqlite")
        try FileManager.default.createDirectory(atPath: db, withIntermediateDirectories: false)
        try #require(FileManager.default.createFile(atPath: db + "/keep", contents: Data("x".utf8)))
        let result = try await AgentFixture.run(["--db", db, "--provider-url", issuer.template, "--log-level", "trace"]
                                        + Self.subjects.arguments, in: scratch, timeout: 30)
        #expect(result.status == 1)
        #expect(result.stderr.contains("\(db) is a directory or special file, not a token store"), "\(result.stderr.suffix(2000))")
        #expect(FileManager.default.fileExists(atPath: db + "/keep"))
        #expect(quarantineFiles(in: scratch.path).isEmpty)
        #expect(!FileManager.default.fileExists(atPath: db + "-wal") && !FileManager.default.fileExists(atPath: db + "-shm"))
        #expect(try await issuer.stats().requests == 0, "fetched without a store")
        let secrets = SecretScanner()
        var outputs: LabelledOutputs = []
        outputs.append(("agent stdout", result.stdout))
        outputs.append(("agent stderr", result.stderr))
        secrets.expectNoLeaks(in: outputs, minimumTokens: 0)
    }

    /// How to run the agent so that a 0400 file really is read-only to it: directly when the
    /// tests are not root; as `nobody` through setpriv when they are (root writes 0400 files).
    static let readOnlyRunner: (prefix: [String], uid: uid_t?)? = {
        guard geteuid() == 0 else { return ([], nil) }
        guard let setpriv = executable(["/usr/bin/setpriv", "/bin/setpriv"]) else { return nil }
        let prefix = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups"]
        // nobody must be able to run the built agent (a checkout under /root is not reachable).
        let agent = AgentFixture.path
        guard let probe = try? runCapturing(prefix + [agent, "--help"], timeout: 30), probe.status == 0 else { return nil }
        return (prefix, 65534)
    }()

    @Test("a read-only store file (0400): exit 1 saying so, the file untouched",
          .enabled(if: readOnlyRunner != nil,
                   "running as root, and the agent cannot be run as nobody (no setpriv, or the build is not reachable): chmod 0400 would not stop root's writes"))
    func readOnlyStore() async throws {
        let runner = try #require(Self.readOnlyRunner)
        let scratch = Scratch()
        let issuer = try await IssuerProcess(scratch: scratch, lifetime: Self.lifetime)
        let directory = scratch.file("store")
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: false)
        let db = directory + "/tokens.sqlite"
        let secrets = SecretScanner()
        var outputs: LabelledOutputs = []
        secrets.remember(tokensOf: try await soundStore(db, issuer: issuer, in: scratch))
        if let uid = runner.uid {
            for file in [directory, db, db + "-wal", db + "-shm"] where FileManager.default.fileExists(atPath: file) {
                #expect(chown(file, uid, gid_t(uid)) == 0)
            }
        }
        #expect(chmod(db, 0o400) == 0)
        let before = try Data(contentsOf: URL(fileURLWithPath: db))
        let requests = try await issuer.stats().requests

        let arguments = ["--db", db, "--provider-url", issuer.template, "--log-level", "trace"] + Self.subjects.arguments
        let result = try await AgentFixture.run(arguments, wrapper: runner.prefix, in: scratch, timeout: 30)
        #expect(result.status == 1, "\(result.stdout) \(result.stderr.suffix(2000))")
        #expect(result.stderr.contains("token store \(db) is read-only for this user"), "\(result.stderr.suffix(2000))")
        #expect(try Data(contentsOf: URL(fileURLWithPath: db)) == before)
        #expect(fileMode(db) == 0o400)
        #expect(quarantineFiles(in: directory).isEmpty)
        #expect(try await issuer.stats().requests == requests)
        outputs.append(("agent stdout", result.stdout))
        outputs.append(("agent stderr", result.stderr))
        secrets.expectNoLeaks(in: outputs, minimumTokens: Self.subjects.keys.count)
    }

    // MARK: - Disk full

    /// A real full disk for the agent only: a 1 MiB tmpfs mounted over the store's directory in
    /// a private mount namespace (`unshare --mount`; a user namespace too when not root), so
    /// nothing outside the agent sees the mount and it vanishes with the agent. The test fills
    /// it through `/proc/<pid>/root` and reads the store through `nsenter`. `PRAGMA
    /// max_page_count`, which the in-process tests use, lasts one connection only and cannot
    /// be set on another process's connection.
    static let namespaceWrapper: (unshare: [String], nsenter: [String])? = {
        guard let unshare = executable(["/usr/bin/unshare", "/bin/unshare"]),
              let nsenter = executable(["/usr/bin/nsenter", "/bin/nsenter"]),
              FileManager.default.isExecutableFile(atPath: "/bin/sh") else { return nil }
        let root = geteuid() == 0
        let unshareArguments = [unshare] + (root ? [] : ["--user", "--map-root-user"]) + ["--mount", "--propagation", "private"]
        let nsenterArguments = [nsenter] + (root ? ["--mount"] : ["--user", "--mount", "--preserve-credentials"])
        // Probe: can this machine mount a small tmpfs in a fresh namespace?
        let probe = FileManager.default.temporaryDirectory.appendingPathComponent("fts-tmpfs-probe-\(UUID().uuidString.prefix(8))").path
        guard (try? FileManager.default.createDirectory(atPath: probe, withIntermediateDirectories: false)) != nil else { return nil }
        defer { try? FileManager.default.removeItem(atPath: probe) }
        guard let result = try? runCapturing(unshareArguments + ["/bin/sh", "-c", "mount -t tmpfs -o size=64k fts-probe \"$0\"", probe], timeout: 10),
              result.status == 0 else { return nil }
        return (unshareArguments, nsenterArguments)
    }()

    @Test("disk full while running: store-degraded, refreshes go on in memory, store-recovered once space is back, nothing half-written",
          .enabled(if: namespaceWrapper != nil, "no way to mount a small tmpfs for the agent here (needs unshare and mount namespaces)"))
    func diskFull() async throws {
        let wrapper = try #require(Self.namespaceWrapper)
        let scratch = Scratch()
        let issuer = try await IssuerProcess(scratch: scratch, lifetime: Self.lifetime)
        let directory = scratch.file("small-disk")
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: false)
        let db = directory + "/tokens.sqlite"
        let agent = try AgentFixture.launch(["--db", db, "--provider-url", issuer.template, "--log-level", "trace"] + Self.subjects.arguments,
                                            wrapper: wrapper.unshare + ["/bin/sh", "-c", "mount -t tmpfs -o size=1m,mode=0700 fts-small-disk \"$0\" && exec \"$@\"", directory],
                                            in: scratch)
        // The agent's view of the store (the test's own view of `directory` is the empty mount point).
        let root = "/proc/\(agent.pid)/root"
        let nsenter = wrapper.nsenter + ["--target", "\(agent.pid)"]
        let secrets = SecretScanner()
        var outputs: LabelledOutputs = []

        let started = await eventually(within: 30) { Set(committedLines(agent.stdout).map(\.key)) == Set(Self.subjects.keys) }
        try #require(started, "\(agent.stdout) \(agent.stderr.suffix(3000))")
        #expect(FileManager.default.fileExists(atPath: root + db), "the store is not on the agent's small disk")
        #expect(!FileManager.default.fileExists(atPath: db), "the store leaked out of the agent's mount namespace")
        secrets.remember(tokensOf: try storeSnapshot(db, via: nsenter))

        // Fill the small disk.
        let filler = root + directory + "/filler"
        let fd = open(filler, O_CREAT | O_WRONLY | O_CLOEXEC, 0o600)
        try #require(fd >= 0, "cannot create \(filler): \(String(cString: strerror(errno)))")
        let chunk = [UInt8](repeating: 0x55, count: 16384)
        var filled = 0, full = false
        for _ in 0..<1024 { // at most 16 MiB, far more than the 1 MiB disk
            let written = chunk.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
            if written < 0 { full = errno == ENOSPC; break }
            filled += written
        }
        close(fd)
        try #require(full, "the small disk did not fill up after \(filled) bytes")

        // The next refresh cannot be stored: degraded, and refreshes continue in memory.
        #expect(await agent.waitForOutput("store-degraded", within: 20), "\(agent.stderr.suffix(3000))")
        #expect(agent.stdout.contains("is full"), "\(agent.stdout)")
        let degradedLogs = agent.stderr.components(separatedBy: "token refreshed").count
        #expect(await eventually(within: 30) { agent.stderr.components(separatedBy: "token refreshed").count > degradedLogs },
                "no refresh in memory while the disk is full")
        #expect(agent.isRunning)

        // Space comes back: writes work again and are reported.
        #expect(unlink(filler) == 0)
        #expect(await agent.waitForOutput("store-recovered", within: 20), "\(agent.stderr.suffix(3000))")
        let afterRecovery = await eventually(within: 15) {
            let lines = completeLines(agent.stdout)
            guard let recovered = lines.firstIndex(where: { $0.contains("store-recovered") }) else { return false }
            return lines[recovered...].contains { $0.contains(" refreshed ") }
        }
        #expect(afterRecovery, "nothing stored after recovery")

        // Nothing was reported as committed while degraded, and everything reported is stored.
        let lines = completeLines(agent.stdout)
        if let degraded = lines.firstIndex(where: { $0.contains("store-degraded") }),
           let recovered = lines.firstIndex(where: { $0.contains("store-recovered") }) {
            #expect(degraded < recovered)
            #expect(!lines[degraded..<recovered].contains { $0.contains(" refreshed ") }, "a refresh was reported as committed while the disk was full")
        }
        let check = try await runCapturing(nsenter + [sqlite3Path, "-readonly", db, "PRAGMA integrity_check"])
        #expect(check.stdout.trimmingCharacters(in: .whitespacesAndNewlines) == "ok", "\(check.stdout) \(check.stderr)")
        let reported = lastCommitted(committedLines(agent.stdout)) // before the store, as above
        let rows = try storeSnapshot(db, via: nsenter)
        secrets.remember(tokensOf: rows)
        expectCommittedTokensStored(reported, rows, context: "after the disk was full")
        expectStoreModes(db, root: root)

        agent.signal(SIGTERM)
        #expect(await agent.wait(upTo: 5) == 0, "\(agent.stderr.suffix(2000))")
        outputs += agent.outputs(labelled: "agent")
        secrets.expectNoLeaks(in: outputs, minimumTokens: Self.subjects.keys.count * 2)
    }
}
