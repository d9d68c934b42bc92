// Shared by the process-level reliability suites (CrashConsistencyTests, ConcurrencyTests,
// StoreFaultTests): seeds, soak knobs, parsing of the agent's event lines, store snapshots
// through stock sqlite3, store file modes, and the secret scan over every process output (the
// test kit's SecretScanner).

import FleetTokenStore
import FleetTokenStoreTesting
import Foundation
import TestSupportKit
import Testing

// MARK: - Soak knobs

/// Reads a positive integer from the environment (soak runs raise the CI defaults).
func environmentInt(_ name: String, default value: Int) -> Int {
    guard let text = ProcessInfo.processInfo.environment[name], let parsed = Int(text), parsed > 0 else { return value }
    return parsed
}

// MARK: - Seeds

/// The seed named by `variable`, else a fresh one; printed either way so a failure can be replayed.
func reproducibleSeed(_ variable: String, test: String) -> UInt64 {
    let seed = ProcessInfo.processInfo.environment[variable].flatMap(UInt64.init) ?? UInt64.random(in: 1...UInt64(UInt32.max))
    print("\(test): seed \(seed) (replay with \(variable)=\(seed))")
    return seed
}

// MARK: - Subjects

/// `count` subjects, half vehicles and half trips, as agent arguments and as "kind/id" keys.
struct Subjects {
    let keys: [String]
    let arguments: [String]

    init(vehicles: Int, trips: Int) {
        let vehicleIDs = (0..<vehicles).map { String(format: "v%02d", $0 + 1) }
        let tripIDs = (0..<trips).map { String(format: "t%02d", $0 + 1) }
        keys = vehicleIDs.map { "vehicle/\($0)" } + tripIDs.map { "trip/\($0)" }
        arguments = vehicleIDs.flatMap { ["--vehicle", $0] } + tripIDs.flatMap { ["--trip", $0] }
    }
}

// MARK: - The agent's event lines

/// One complete `refreshed`/`reused` line of the agent's stdout: the agent's word that this
/// token is committed to the store (the engine emits the event after the group commit).
struct CommittedLine {
    let stamp: Date
    let word: String
    let key: String
    let fingerprint: String
    let expiresAt: Date
    let source: String
}

func parseISO(_ text: some StringProtocol) -> Date? {
    try? Date.ISO8601FormatStyle().parse(String(text))
}

/// The complete lines of `stdout` (a line cut by kill -9 has no newline and is left out).
func completeLines(_ stdout: String) -> [Substring] {
    guard let lastNewline = stdout.lastIndex(of: "\n") else { return [] }
    return stdout[..<lastNewline].split(separator: "\n")
}

/// Parses the agent's `refreshed`/`reused` lines:
/// `<stamp> refreshed <kind/id> fp=<fp> expires=<time> (<relative>) source=<source>`.
func committedLines(_ stdout: String) -> [CommittedLine] {
    completeLines(stdout).compactMap { line in
        let words = line.split(separator: " ", omittingEmptySubsequences: true)
        guard words.count >= 5, words[1] == "refreshed" || words[1] == "reused",
              let stamp = parseISO(words[0]),
              let fp = words.first(where: { $0.hasPrefix("fp=") })?.dropFirst(3),
              let expires = words.first(where: { $0.hasPrefix("expires=") }).flatMap({ parseISO($0.dropFirst(8)) }),
              let source = words.first(where: { $0.hasPrefix("source=") })?.dropFirst(7) else { return nil }
        return CommittedLine(stamp: stamp, word: String(words[1]), key: String(words[2]), fingerprint: String(fp),
                             expiresAt: expires, source: String(source))
    }
}

/// The last committed line per key.
func lastCommitted(_ lines: [CommittedLine]) -> [String: CommittedLine] {
    var last: [String: CommittedLine] = [:]
    for line in lines { last[line.key] = line }
    return last
}

// MARK: - Store snapshots

/// One stored token as stock sqlite3 reads it.
struct StoredRow {
    let key: String
    let token: String
    let expiresAt: Date
    let issuedAt: Date?
    var fingerprint: String { TokenFingerprint(of: token).description }
}

/// The tokens in the store at `path`, read with `sqlite3 -readonly` (which leaves a crashed
/// writer's WAL exactly as it was, for the next agent to recover). `prefix` runs sqlite3 through
/// another command (nsenter into the agent's mount namespace).
func storeSnapshot(_ path: String, via prefix: [String] = []) throws -> [String: StoredRow] {
    if prefix.isEmpty && !FileManager.default.fileExists(atPath: path) { return [:] }
    let sql = "SELECT kind || '/' || subject_id, token, expires_at, ifnull(issued_at, '') FROM tokens WHERE token IS NOT NULL"
    let text = prefix.isEmpty ? try sqlite3(path, sql, readOnly: true) : try runCapturing(prefix + [sqlite3Path, "-readonly", path, sql]).stdout
    var rows: [String: StoredRow] = [:]
    for line in text.split(separator: "\n") {
        let fields = line.split(separator: "|", omittingEmptySubsequences: false)
        guard fields.count == 4, let expires = Double(fields[2]) else { continue }
        rows[String(fields[0])] = StoredRow(key: String(fields[0]), token: String(fields[1]),
                                            expiresAt: Date(timeIntervalSince1970: expires),
                                            issuedAt: Double(fields[3]).map(Date.init(timeIntervalSince1970:)))
    }
    return rows
}

/// Checks that every token the agent logged as committed is still in the store, or was
/// replaced there by a newer one (a later commit whose line the kill cut off).
func expectCommittedTokensStored(_ logged: [String: CommittedLine], _ stored: [String: StoredRow], context: String,
                                 sourceLocation: SourceLocation = #_sourceLocation) {
    for (key, line) in logged.sorted(by: { $0.key < $1.key }) {
        guard let row = stored[key] else {
            Issue.record("\(context): \(key) fp=\(line.fingerprint) was logged as committed but the store has no token for it",
                         sourceLocation: sourceLocation)
            continue
        }
        let sameToken = row.fingerprint == line.fingerprint
        let newer = row.expiresAt.timeIntervalSince(line.expiresAt) >= 1
        #expect(sameToken || newer,
                "\(context): \(key) logged fp=\(line.fingerprint) expires \(line.expiresAt); store has fp=\(row.fingerprint) expires \(row.expiresAt)",
                sourceLocation: sourceLocation)
    }
}

// MARK: - Files

/// The store and its side files that exist must be mode 0600 (tokens are secrets). `root`
/// prefixes the paths (`/proc/<pid>/root` for a store inside another mount namespace).
func expectStoreModes(_ path: String, root: String = "", requireSideFiles: Bool = true, sourceLocation: SourceLocation = #_sourceLocation) {
    for file in [path, path + "-wal", path + "-shm"] {
        guard let mode = fileMode(root + file) else {
            if file == path || requireSideFiles {
                Issue.record("\(file) is missing", sourceLocation: sourceLocation)
            }
            continue
        }
        #expect(mode == 0o600, "\(file) has mode \(String(mode, radix: 8)), not 600", sourceLocation: sourceLocation)
    }
}

/// Files named like a quarantined store (`<name>.corrupt-<time>`) in `directory`.
func quarantineFiles(in directory: String) -> [String] {
    ((try? FileManager.default.contentsOfDirectory(atPath: directory)) ?? []).filter { $0.contains(".corrupt-") }.sorted()
}

// MARK: - Secrets

/// Where each process output goes to be scanned for tokens at the end: a label and the text.
typealias LabelledOutputs = [(label: String, text: String)]

extension SecretScanner {
    /// Remembers every token of a store snapshot. Each must be a JWT, or the scan for its
    /// signature would test nothing.
    func remember(tokensOf rows: [String: StoredRow], sourceLocation: SourceLocation = #_sourceLocation) {
        for row in rows.values {
            #expect(row.token.split(separator: ".").count == 3, "a stored token is not a JWT (fp=\(row.fingerprint))",
                    sourceLocation: sourceLocation)
            remember(row.token)
        }
    }

    /// No output contains a remembered token, or its payload or signature: tokens are secrets at
    /// every log level. Failures name the fingerprint, never the token.
    func expectNoLeaks(in outputs: LabelledOutputs, minimumTokens: Int = 1, sourceLocation: SourceLocation = #_sourceLocation) {
        #expect(count >= minimumTokens, "only \(count) tokens collected", sourceLocation: sourceLocation)
        #expect(outputs.contains { !$0.text.isEmpty }, sourceLocation: sourceLocation)
        for leak in leaks(in: outputs) { Issue.record(Comment(rawValue: leak.description), sourceLocation: sourceLocation) }
    }
}

@Suite("Reliability suite helpers", .paced)
struct ReliabilitySupportTests {
    @Test("the secrets check finds a token or its signature anywhere in an output, and names only the fingerprint")
    func scanFindsLeaks() throws {
        let token = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ4In0.c2lnbmF0dXJlLW9mLXRoZS10b2tlbi0xMjM0NTY3ODkw"
        let secrets = SecretScanner()
        secrets.remember(tokensOf: ["vehicle/x": StoredRow(key: "vehicle/x", token: token, expiresAt: Date(), issuedAt: nil)])
        let clean: LabelledOutputs = [("clean", String(repeating: "refreshed vehicle/x fp=0123456789ab ", count: 1000))]
        #expect(secrets.leaks(in: clean).isEmpty)
        let fingerprint = TokenFingerprint(of: token).description
        for (leak, expected) in [("debug: token=\(token) end", ["token", "signature"]),
                                 ("... signature c2lnbmF0dXJlLW9mLXRoZS10b2tlbi0xMjM0NTY3ODkw", ["signature"])] {
            let found = secrets.leaks(in: clean + [("leaky", leak)]).map(\.description)
            #expect(found == expected.map { "the \($0) of token fp=\(fingerprint) appears in leaky" })
            #expect(!found.contains { $0.contains(token) })
        }
    }

    @Test("event lines: complete ones parsed, a line cut by the kill ignored")
    func parsesLines() {
        let stdout = """
            2026-11-21T09:00:01Z refreshed vehicle/v01 fp=3f2a9c0d11be expires=2026-11-21T09:02:01Z (in 2m) source=provider
            2026-11-21T09:00:02Z reused    trip/t01 fp=b7e01c4a9d20 expires=2026-11-21T09:03:34Z (in 3m) source=store
            2026-11-21T09:00:03Z store-degraded serving from memory: disk full
            2026-11-21T09:00:04Z refreshed vehicle/v01 fp=aaaaaaaaaaaa expi
            """
        let lines = committedLines(stdout)
        #expect(lines.map(\.key) == ["vehicle/v01", "trip/t01"])
        #expect(lastCommitted(lines)["vehicle/v01"]?.fingerprint == "3f2a9c0d11be")
        #expect(lines.first?.expiresAt == parseISO("2026-11-21T09:02:01Z"))
    }
}
