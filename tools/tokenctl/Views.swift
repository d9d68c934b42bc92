import FleetTokenStore
import Foundation

/// One entry as `list` and `show` present it. Never includes the token value.
struct EntryView {
    let entry: TokenEntry
    let now: Date

    init(_ entry: TokenEntry, now: Date) {
        self.entry = entry
        self.now = now
    }

    var status: TokenStatus { entry.status(at: now) }

    var json: [String: Any] {
        var object: [String: Any] = [
            "kind": entry.key.kind.rawValue, "id": entry.key.subjectID, "status": status.rawValue,
            "expires_at": iso(entry.token?.expiresAt), "fingerprint": entry.token.map { $0.fingerprint.description } ?? NSNull(),
            "failures": entry.failure?.consecutiveFailures ?? 0,
        ]
        object["next_attempt_at"] = iso(entry.failure?.nextAttemptAt)
        object["last_error_kind"] = entry.failure?.lastErrorKind ?? NSNull()
        return object
    }

    var row: [String] {
        let expires = entry.token.map { "\($0.expiresAt.formatted(.iso8601)) (\(relative($0.expiresAt, now: now)))" } ?? "-"
        var failures = String(entry.failure?.consecutiveFailures ?? 0)
        if let failure = entry.failure, failure.nextAttemptAt > now {
            failures += " (retry \(relative(failure.nextAttemptAt, now: now)), \(failure.lastErrorKind))"
        }
        return [entry.key.kind.rawValue, entry.key.subjectID, status.rawValue, expires,
                entry.token?.fingerprint.description ?? "-", failures]
    }
}

/// The decoded header and payload of a stored JWT; the signature is never shown.
struct ClaimsView {
    let json: [String: Any]

    init(_ token: String) {
        guard let claims = try? JWTClaims.decode(token) else {
            json = ["decoded": false]
            return
        }
        json = [
            "alg": claims.algorithm ?? NSNull(), "kid": claims.keyID ?? NSNull(), "iss": claims.issuer ?? NSNull(),
            "sub": claims.subject ?? NSNull(), "aud": claims.audience ?? NSNull(), "iat": iso(claims.issuedAt),
            "exp": iso(claims.expiresAt), "authorization": claims.authorization ?? [:],
        ]
    }
}

/// Aligned columns for terminals and `column`-free scripts.
enum Table {
    static func render(header: [String], rows: [[String]]) -> String {
        let all = [header] + rows
        let widths = header.indices.map { column in all.map { $0[column].count }.max() ?? 0 }
        return all.map { row in
            row.enumerated().map { index, cell in
                index == row.count - 1 ? cell : cell.padding(toLength: widths[index], withPad: " ", startingAt: 0)
            }.joined(separator: "  ")
        }.joined(separator: "\n")
    }
}

/// What `check` found.
struct StoreCheck {
    var ok = true
    var lines: [String] = []
    var json: [String: Any] = [:]

    static func run(path: String, options: StoreOptions) async -> StoreCheck {
        var report = StoreCheck()
        var problems: [String] = []
        report.json["store"] = path
        report.json["build_schema_version"] = SQLiteTokenRepository.buildSchemaVersion
        // The files judged by the rules every open applies (links, owner, modes), so check and
        // the library never disagree; a refusal among them is also what opening reports.
        let files = SQLiteTokenRepository.inspectFiles(at: path)
        let fileProblems = files.problems.map(\.description)
        problems += fileProblems
        do {
            let repository = try options.open(.readOnly)
            defer { repository.close() }
            let version = try await repository.schemaVersion()
            report.json["schema_version"] = version
            let integrity = try await repository.integrityProblems()
            report.json["integrity"] = integrity.isEmpty ? "ok" : integrity
            if !integrity.isEmpty {
                problems.append("integrity_check failed: \(integrity.prefix(3).joined(separator: "; ")); stop the agent and move the file aside (the agent starts a fresh store and refetches)")
            }
            report.lines.append("integrity       \(integrity.isEmpty ? "ok" : "FAILED")")
            report.lines.append("schema version  \(version) (this build: \(SQLiteTokenRepository.buildSchemaVersion))")
        } catch let failure as Failure {
            if !fileProblems.contains(failure.description) { problems.append(failure.description) }
        } catch {
            problems.append(String(describing: error))
        }
        let modes = Dictionary(files.files.map { (($0.path as NSString).lastPathComponent, String($0.mode, radix: 8)) },
                               uniquingKeysWith: { first, _ in first })
        report.json["modes"] = modes
        report.lines.append("file modes      " + modes.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: " "))
        report.json["problems"] = problems
        report.ok = problems.isEmpty
        report.json["ok"] = report.ok
        report.lines += problems.map { "problem: \($0)" }
        report.lines.append(report.ok ? "ok" : "NOT OK")
        return report
    }
}
