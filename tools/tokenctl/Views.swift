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
            "expires_at": iso(entry.token?.expiresAt), "fingerprint": fingerprint ?? NSNull(),
            "value_key_id": entry.token.map { SealedTokenValue.keyID(ofStored: $0.value) ?? plaintextKeyID } ?? NSNull(),
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
                fingerprint ?? "-", failures]
    }

    /// The token's fingerprint, sealed or not (a sealed value carries it).
    private var fingerprint: String? {
        entry.token.map { SealedTokenValue.fingerprint(ofStored: $0.value).description }
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

/// What `check` found, as `check` prints it: the library's report (``StoreCheckReport``),
/// formatted and nothing more.
struct CheckView {
    let report: StoreCheckReport

    var json: [String: Any] {
        var object: [String: Any] = [
            "store": report.storePath, "build_schema_version": report.buildSchemaVersion,
            "modes": modes, "problems": report.problems, "ok": report.isHealthy,
        ]
        if let version = report.schemaVersion { object["schema_version"] = version }
        if let integrity = report.integrityProblems {
            object["integrity"] = integrity.isEmpty ? "ok" : integrity
        }
        return object
    }

    var lines: [String] {
        var lines: [String] = []
        if let integrity = report.integrityProblems, let version = report.schemaVersion {
            lines.append("integrity       \(integrity.isEmpty ? "ok" : "FAILED")")
            lines.append("schema version  \(version) (this build: \(report.buildSchemaVersion))")
        }
        lines.append("file modes      " + modes.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: " "))
        lines += report.problems.map { "problem: \($0)" }
        lines.append(report.isHealthy ? "ok" : "NOT OK")
        return lines
    }

    /// File name to octal mode, e.g. `tokens.sqlite` to `600`.
    private var modes: [String: String] {
        Dictionary((report.files?.files ?? []).map { (($0.path as NSString).lastPathComponent, String($0.mode, radix: 8)) },
                   uniquingKeysWith: { first, _ in first })
    }
}
