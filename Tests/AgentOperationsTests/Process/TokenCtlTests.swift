import FleetTokenStoreTesting
import FleetTokenStore
import Foundation
import Logging
import Synchronization
import Testing
import TestSupportKit
#if canImport(Glibc)
import Glibc
#endif

/// A store with 2 valid vehicles, 1 expired vehicle, 1 valid trip, 1 trip in backoff without token.
func seededStore(_ scratch: Scratch) async throws -> (path: String, tokens: [String]) {
    let path = scratch.file("tokens.sqlite")
    let store = try SQLiteTokenRepository(path: path, logger: Logger(label: "seed"))
    defer { store.close() }
    let now = Date()
    var tokens: [StoredToken] = []
    for (key, issued) in [(try TokenKey.vehicle("v-1"), now - 600), (try .vehicle("v-2"), now - 60),
                          (try .vehicle("v-old"), now - 7200), (try .trip("t-1"), now - 100)] {
        let value = TestJWT.make(for: key, issuedAt: issued)
        tokens.append(StoredToken(key: key, value: value, expiresAt: issued + 3600, issuedAt: issued, fetchedAt: issued))
    }
    try await store.upsert(tokens)
    try await store.recordFailure(RefreshFailureState(consecutiveFailures: 3, nextAttemptAt: now + 120, lastErrorKind: "httpStatus",
                                                      lastErrorMessage: "token provider answered HTTP 503", lastFailureAt: now),
                                  for: try .trip("t-failing"))
    return (path, tokens.map(\.value))
}

func tokenctl(_ arguments: [String], _ scratch: Scratch, environment: [String: String] = [:]) async throws -> (status: Int32, stdout: String, stderr: String) {
    try await runToEnd("tokenctl", arguments, environment: environment, in: scratch, timeout: 30)
}

@Suite("tokenctl as a real process", .paced, .exclusive)
struct TokenCtlTests {
    @Test("bad arguments get a clear message and exit 64", arguments: [
        (["purge"], "choose what to purge"),
        (["purge", "--vehicle", "a", "--expired"], "exactly one"),
        (["purge", "--kind", "bus"], "bus"),
        (["list", "--expired", "--valid"], "exclude each other"),
        (["show", "vehicle"], "Missing expected argument"),
        (["show", "plane", "x"], "plane"),
        (["frobnicate"], "frobnicate"),
        (["list", "--no-such-flag"], "no-such-flag"),
    ])
    func usage(arguments: [String], message: String) async throws {
        let scratch = Scratch()
        let result = try await tokenctl(["--db", scratch.file("t.sqlite")] + arguments, scratch)
        #expect(result.status == 64, "\(arguments): \(result.stderr)")
        #expect(result.stderr.contains(message), "\(result.stderr)")
    }

    // Issue 12 items 10 and 12: `purge --vehicle/--trip` took any id while `show` validated it,
    // and "." and ".." were ids everywhere. On an existing store, so that a command that skips
    // the check runs (and exits 0 or 1) instead of failing for want of a store.
    @Test("ids the library refuses are usage errors (exit 64) for show and purge alike, on an existing store", arguments: [
        (["show", "vehicle", ".."], "path segment"),
        (["show", "trip", "."], "path segment"),
        (["purge", "--vehicle", ".."], "path segment"),
        (["purge", "--trip", "."], "path segment"),
        (["purge", "--vehicle", "a\tb"], "control characters"),
        (["purge", "--trip", String(repeating: "x", count: 513)], "513 bytes long"),
        (["purge", "--vehicle", "..", "--dry-run"], "path segment"),
    ])
    func invalidIDs(arguments: [String], message: String) async throws {
        let scratch = Scratch()
        let (path, _) = try await seededStore(scratch)
        let before = try await sqlite3(path, "SELECT count(*) FROM tokens")
        let result = try await tokenctl(["--db", path] + arguments, scratch)
        #expect(result.status == 64, "\(arguments): \(result.stdout) \(result.stderr)")
        #expect(result.stderr.contains(message), "\(result.stderr)")
        #expect(try await sqlite3(path, "SELECT count(*) FROM tokens") == before)
    }

    // Issue 12 item 12: `check` judged the link's own mode (777) and failed for that, while the
    // library opened the target. It now says what the library says: a symlinked store is refused.
    @Test("check on a symlinked store reports the link the library refuses, not the link's mode")
    func checkSymlinkedStore() async throws {
        let scratch = Scratch()
        let (target, _) = try await seededStore(scratch)
        let link = scratch.file("link.sqlite")
        #expect(symlink(target, link) == 0)
        let check = try await tokenctl(["--db", link, "check"], scratch)
        #expect(check.status == 1)
        let output = check.stdout + check.stderr
        #expect(output.contains("symbolic link") && output.contains(target), "\(output)")
        #expect(!output.contains("777"), "\(output)")
        let json = try await tokenctl(["--db", link, "check", "--json"], scratch)
        let object = try #require(try JSONSerialization.jsonObject(with: Data(json.stdout.utf8)) as? [String: Any])
        let problems = try #require(object["problems"] as? [String])
        #expect(problems.count == 1 && problems[0].contains("symbolic link (to \(target))"), "\(problems)")
        #expect(object["ok"] as? Bool == false && json.status == 1)
        let list = try await tokenctl(["--db", link, "list"], scratch)
        #expect(list.status == 1 && list.stderr.contains("symbolic link"), "\(list.stdout) \(list.stderr)")
    }

    @Test("read commands on a missing path say so, exit 1 and create nothing", arguments: [
        ["list"], ["show", "vehicle", "v"], ["stats"], ["check"], ["purge", "--expired", "--dry-run"],
    ])
    func missingStore(arguments: [String]) async throws {
        let scratch = Scratch()
        let path = scratch.file("absent/tokens.sqlite")
        let result = try await tokenctl(arguments + ["--db", path], scratch)
        #expect(result.status == 1)
        #expect(result.stderr.contains("no token store at \(path)") || result.stdout.contains("no token store at \(path)"), "\(result.stderr)")
        #expect(!FileManager.default.fileExists(atPath: scratch.file("absent")))
    }

    @Test("a store another user owns: every command refuses it, and check says who owns it and lists its mode",
          .enabled(if: geteuid() == 0, "only root can give a file to another user"))
    func foreignStore() async throws {
        let scratch = Scratch()
        let (path, _) = try await seededStore(scratch)
        #expect(chown(path, 65534, 65534) == 0)
        for arguments in [["list"], ["purge", "--expired"], ["migrate"]] {
            let result = try await tokenctl(["--db", path] + arguments, scratch)
            #expect(result.status == 1 && result.stderr.contains("belongs to uid 65534"), "\(arguments): \(result.stderr)")
        }
        let check = try await tokenctl(["--db", path, "check", "--json"], scratch)
        #expect(check.status == 1)
        let object = try #require(try JSONSerialization.jsonObject(with: Data(check.stdout.utf8)) as? [String: Any])
        let problems = try #require(object["problems"] as? [String])
        #expect(problems.count == 1 && problems[0].contains("belongs to uid 65534"), "\(problems)")
        #expect(object["modes"] as? [String: String] == ["tokens.sqlite": "600"])
    }

    @Test("list: an aligned table by default, and JSON with the contract's fields; filters work")
    func list() async throws {
        let scratch = Scratch()
        let (path, tokens) = try await seededStore(scratch)
        let table = try await tokenctl(["--db", path, "list"], scratch)
        #expect(table.status == 0, "\(table.stderr)")
        let lines = table.stdout.split(separator: "\n").map(String.init)
        #expect(lines.first?.hasPrefix("KIND") == true)
        #expect(lines.count == 6)
        let statusColumn = lines[0].range(of: "STATUS")!.lowerBound.utf16Offset(in: lines[0])
        for line in lines.dropFirst() { #expect(line.count > statusColumn) }
        #expect(table.stdout.contains("in ") && table.stdout.contains("ago"))

        let json = try await tokenctl(["list", "--db", path, "--json"], scratch)
        let entries = try #require(try JSONSerialization.jsonObject(with: Data(json.stdout.utf8)) as? [[String: Any]])
        #expect(entries.count == 5)
        for entry in entries {
            for field in ["kind", "id", "expires_at", "status", "fingerprint", "failures"] { #expect(entry[field] != nil, "\(field)") }
        }
        let statuses = Dictionary(uniqueKeysWithValues: entries.map { ("\($0["kind"]!)/\($0["id"]!)", $0["status"] as? String) })
        #expect(statuses["vehicle/v-1"] == "valid")
        #expect(statuses["vehicle/v-old"] == "expired")
        #expect(statuses["trip/t-failing"] == "backoff")

        let expired = try await tokenctl(["list", "--db", path, "--expired", "--json"], scratch)
        #expect((try JSONSerialization.jsonObject(with: Data(expired.stdout.utf8)) as? [Any])?.count == 1)
        let trips = try await tokenctl(["list", "--db", path, "--kind", "trip", "--valid", "--json"], scratch)
        #expect((try JSONSerialization.jsonObject(with: Data(trips.stdout.utf8)) as? [Any])?.count == 1)
        let one = try await tokenctl(["list", "--db", path, "--id", "v-2"], scratch)
        #expect(one.stdout.split(separator: "\n").count == 2)
        for output in [table.stdout, json.stdout] {
            for token in tokens { #expect(!output.contains(token) && !output.contains(String(token.split(separator: ".")[2]))) }
        }
    }

    @Test("show: every stored field and decoded claims, no signature; --reveal alone prints the token; a missing entry exits 1")
    func show() async throws {
        let scratch = Scratch()
        let (path, tokens) = try await seededStore(scratch)
        let shown = try await tokenctl(["--db", path, "show", "vehicle", "v-1"], scratch)
        #expect(shown.status == 0, "\(shown.stderr)")
        for field in ["expires_at", "issued_at", "fetched_at", "fingerprint", "status", "claims", "vehicleid=v-1", "RS256", "fleetengine.googleapis.com"] {
            #expect(shown.stdout.contains(field), "\(field)")
        }
        #expect(!shown.stdout.contains(tokens[0]))
        #expect(!shown.stdout.contains(String(tokens[0].split(separator: ".")[2])))

        let json = try await tokenctl(["--db", path, "show", "vehicle", "v-1", "--json"], scratch)
        let object = try #require(try JSONSerialization.jsonObject(with: Data(json.stdout.utf8)) as? [String: Any])
        #expect((object["claims"] as? [String: Any])?["kid"] as? String == TestJWT.keyID)
        #expect(object["token"] == nil)

        let revealed = try await tokenctl(["--db", path, "show", "vehicle", "v-1", "--reveal"], scratch)
        #expect(revealed.stdout.contains(tokens[0]))

        let failing = try await tokenctl(["--db", path, "show", "trip", "t-failing"], scratch)
        #expect(failing.stdout.contains("HTTP 503"))

        let missing = try await tokenctl(["--db", path, "show", "trip", "nope"], scratch)
        #expect(missing.status == 1)
        #expect(missing.stderr.contains("no entry for trip/nope"))
    }

    @Test("purge: one selector, counts, --dry-run, --json, and --all only with --yes")
    func purge() async throws {
        let scratch = Scratch()
        let (path, _) = try await seededStore(scratch)
        let dry = try await tokenctl(["--db", path, "purge", "--kind", "vehicle", "--dry-run", "--json"], scratch)
        #expect(dry.status == 0, "\(dry.stderr)")
        #expect(try JSONSerialization.jsonObject(with: Data(dry.stdout.utf8)) as? [String: Int] == ["matched": 3, "purged": 0])

        // v-old's provider is failing: a purge removes its token but keeps its backoff.
        _ = try await sqlite3(path, "UPDATE tokens SET failure_count = 2, next_attempt_at = unixepoch() + 300, last_error_kind = 'timeout', last_failure_at = unixepoch() WHERE subject_id = 'v-old'")
        let expired = try await tokenctl(["--db", path, "purge", "--expired"], scratch)
        #expect(expired.stdout.contains("purged 1 entry"))
        #expect(try await sqlite3(path, "SELECT token IS NULL, failure_count FROM tokens WHERE subject_id = 'v-old'") == "1|2")
        let vehicle = try await tokenctl(["--db", path, "purge", "--vehicle", "v-1", "--json"], scratch)
        #expect(try JSONSerialization.jsonObject(with: Data(vehicle.stdout.utf8)) as? [String: Int] == ["matched": 1, "purged": 1])
        let trip = try await tokenctl(["--db", path, "purge", "--trip", "t-1"], scratch)
        #expect(trip.stdout.contains("purged 1 entry"))

        let refused = try await tokenctl(["--db", path, "purge", "--all"], scratch)
        #expect(refused.status == 1)
        #expect(refused.stderr.contains("--yes"))
        #expect(try await sqlite3(path, "SELECT count(*) FROM tokens") == "3")
        let all = try await tokenctl(["--db", path, "purge", "--all", "--yes"], scratch)
        #expect(all.stdout.contains("purged 1 entry"))
        #expect(try await sqlite3(path, "SELECT subject_id FROM tokens ORDER BY subject_id") == "t-failing\nv-old")
        let dryFailures = try await tokenctl(["--db", path, "purge", "--all", "--include-failures", "--dry-run", "--json"], scratch)
        #expect(try JSONSerialization.jsonObject(with: Data(dryFailures.stdout.utf8)) as? [String: Int] == ["matched": 2, "purged": 0])
        let failures = try await tokenctl(["--db", path, "purge", "--all", "--yes", "--include-failures"], scratch)
        #expect(failures.stdout.contains("purged 2 entries"))
        #expect(try await sqlite3(path, "SELECT count(*) FROM tokens") == "0")
    }

    @Test("Deliveries kinds: list --kind and purge --delivery-vehicle/--task touch only their own kind")
    func deliveryKinds() async throws {
        let scratch = Scratch()
        let path = scratch.file("tokens.sqlite")
        let now = Date()
        do {
            // One id under all four kinds: a selector that ignored the kind would take the others.
            let store = try SQLiteTokenRepository(path: path, logger: Logger(label: "seed"))
            defer { store.close() }
            try await store.upsert(try [TokenKey.vehicle("d-1"), .trip("d-1"), .deliveryVehicle("d-1"), .task("d-1"), .task("t-2")].map { key in
                StoredToken(key: key, value: TestJWT.make(for: key, issuedAt: now - 60), expiresAt: now + 3600, issuedAt: now - 60, fetchedAt: now - 60)
            })
        }
        let listed = try await tokenctl(["--db", path, "list", "--kind", "deliveryVehicle", "--json"], scratch)
        #expect(listed.status == 0, "\(listed.stderr)")
        let rows = try #require(try JSONSerialization.jsonObject(with: Data(listed.stdout.utf8)) as? [[String: Any]])
        #expect(rows.map { "\($0["kind"] ?? "")/\($0["id"] ?? "")" } == ["deliveryVehicle/d-1"])

        let delivery = try await tokenctl(["--db", path, "purge", "--delivery-vehicle", "d-1", "--json"], scratch)
        #expect(try JSONSerialization.jsonObject(with: Data(delivery.stdout.utf8)) as? [String: Int] == ["matched": 1, "purged": 1])
        let task = try await tokenctl(["--db", path, "purge", "--task", "d-1"], scratch)
        #expect(task.stdout.contains("purged 1 entry"), "\(task.stderr)")
        #expect(try await sqlite3(path, "SELECT kind || '/' || subject_id FROM tokens WHERE token IS NOT NULL ORDER BY kind, subject_id")
                == "task/t-2\ntrip/d-1\nvehicle/d-1")

        let both = try await tokenctl(["--db", path, "purge", "--task", "t-2", "--delivery-vehicle", "x"], scratch)
        #expect(both.status == 64)
        #expect(both.stderr.contains("exactly one"))
        let bad = try await tokenctl(["--db", path, "purge", "--delivery-vehicle", ".."], scratch)
        #expect(bad.status == 64)
        #expect(bad.stderr.contains("--delivery-vehicle"), "\(bad.stderr)")
    }

    @Test("stats and check report on a healthy store; check fails on loose modes and newer stores; migrate creates")
    func statsCheckMigrate() async throws {
        let scratch = Scratch()
        let (path, _) = try await seededStore(scratch)
        let stats = try await tokenctl(["--db", path, "stats", "--json"], scratch)
        let object = try #require(try JSONSerialization.jsonObject(with: Data(stats.stdout.utf8)) as? [String: Any])
        #expect(object["total"] as? Int == 5)
        #expect(object["schema_version"] as? Int == SQLiteTokenRepository.buildSchemaVersion)
        #expect((object["by_kind"] as? [String: [String: Int]])?["vehicle"]?["expired"] == 1)
        let readable = try await tokenctl(["--db", path, "stats"], scratch)
        #expect(readable.stdout.contains("REFRESH_DUE") && readable.stdout.contains("schema version"))

        let check = try await tokenctl(["--db", path, "check"], scratch)
        #expect(check.status == 0, "\(check.stdout) \(check.stderr)")
        chmod(path, 0o644)
        let loose = try await tokenctl(["--db", path, "check", "--json"], scratch)
        #expect(loose.status == 1)
        #expect(loose.stdout.contains("chmod 600"))
        chmod(path, 0o600)

        _ = try await sqlite3(path, "INSERT INTO grdb_migrations VALUES ('V0042__future')")
        let newer = try await tokenctl(["--db", path, "check"], scratch)
        #expect(newer.status == 1)
        let text = newer.stdout + newer.stderr
        #expect(text.contains("newer") && text.contains("42") && text.contains("\(SQLiteTokenRepository.buildSchemaVersion)"))

        let fresh = scratch.file("new/tokens.sqlite")
        let migrate = try await tokenctl(["--db", fresh, "migrate"], scratch)
        #expect(migrate.status == 0, "\(migrate.stderr)")
        #expect(migrate.stdout.contains("created") && migrate.stdout.contains("schema version \(SQLiteTokenRepository.buildSchemaVersion)"))
        let again = try await tokenctl(["--db", fresh, "migrate"], scratch)
        #expect(again.stdout.contains("nothing to do"))
        let env = try await tokenctl(["list"], scratch, environment: ["TOKEN_STORE_DB": fresh])
        #expect(env.status == 0 && env.stdout.hasPrefix("KIND"))
    }

    @Test("beside a running agent: list loops and a purge never fail, and the purged subject is refetched within 5 s")
    func besideLiveAgent() async throws {
        let scratch = Scratch()
        let issuer = try await IssuerProcess(scratch: scratch)
        let db = scratch.file("tokens.sqlite")
        let subjects = (1...5).flatMap { ["--vehicle", "v\($0)"] } + ["--trip", "t1"]
        // Debug logs: when the refetch is late, the failure shows what the agent's flight did.
        let agent = try AgentFixture.launch(["--db", db, "--provider-url", issuer.template, "--log-level", "debug"] + subjects,
                                       in: scratch)
        #expect(await eventually(within: 30) { (try? await sqlite3(db, "SELECT count(*) FROM tokens WHERE token IS NOT NULL")) == "6" })
        // Counted from the agent's own report, not by comparing token values: the issuer signs
        // RS256 (deterministic) with whole-second iat/exp, so a token refetched in the second of
        // the first is byte-identical to it (CI once purged within that second).
        let v3Refreshes = { agent.stdout.components(separatedBy: "refreshed vehicle/v3 ").count - 1 }
        #expect(await eventually(within: 30) { v3Refreshes() >= 1 })
        let refreshesBefore = v3Refreshes()

        // The loops run from before the purge (each has listed once) until the refetch is seen.
        let stop = EndFlag()
        let listed = ListCount()
        async let loops: [Int32] = withTaskGroup(of: [Int32].self) { group in
            for _ in 0..<3 {
                group.addTask {
                    var statuses: [Int32] = []
                    while !stop.isSet && !Task.isCancelled {
                        statuses.append((try? await tokenctl(["--db", db, "list", "--json"], scratch).status) ?? -1)
                        listed.add()
                    }
                    return statuses
                }
            }
            return await group.reduce(into: []) { $0 += $1 }
        }
        #expect(await eventually(within: 30) { listed.count >= 3 }, "the list loops did not get going")
        let purged = try await tokenctl(["--db", db, "purge", "--vehicle", "v3"], scratch)
        #expect(purged.status == 0, "\(purged.stderr)")
        #expect(purged.stdout.contains("purged 1 entry"))
        let purgedAt = Date()
        // Typically well under a second; the bound leaves room for a loaded 2-core CI machine
        // (5 s was once missed by 0.07 s there, with every step spawning a sqlite3 process).
        let refetched = await eventually(within: 10) {
            let stored = (try? sqlite3(db, "SELECT token FROM tokens WHERE subject_id = 'v3'")) ?? ""
            return !stored.isEmpty && v3Refreshes() > refreshesBefore
        }
        #expect(refetched, "agent stderr: \(agent.stderr)")
        #expect(Date().timeIntervalSince(purgedAt) < 10)
        stop.set()
        let statuses = await loops
        #expect(!statuses.isEmpty && statuses.allSatisfy { $0 == 0 }, "\(statuses)")
        #expect(!agent.stderr.contains("locked"))
        #expect(agent.stdout.contains("removed   vehicle/v3"))
        agent.signal(SIGTERM)
        #expect(await agent.wait(upTo: 5) == 0)
    }
}

/// How many `tokenctl list` runs have ended, counted from the loops' tasks.
private final class ListCount: Sendable {
    private let value = Mutex(0)
    func add() { value.withLock { $0 += 1 } }
    var count: Int { value.withLock { $0 } }
}
