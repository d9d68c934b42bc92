// FleetTokenPostgres: the `tokens` and `refresh_leases` tables' SQL for PostgreSQL: row
// mapping, filters and the prepared upserts. Every value is a bound parameter; the schema is
// the connection's search_path, so the text names no schema.
import FleetTokenStore
import Foundation
import PostgresNIO

enum PostgresTokenSQL {
    /// The columns ``entry(from:)`` reads, in its order.
    static let entryColumns = """
        kind, subject_id, token, expires_at, issued_at, fetched_at, last_used_at, failure_count,
        next_attempt_at, last_error_kind, last_error_message, last_failure_at, failure_config_digest
        """

    typealias EntryRow = (String, String, String?, Double?, Double?, Double?, Double?, Int32, Double?, String?, String?, Double?, String?)

    static func entry(from row: PostgresRow) throws -> TokenEntry? {
        let (kindName, subjectID, value, expires, issued, fetched, lastUsed, failures, nextAttempt, errorKind, errorMessage, lastFailure, digest)
            = try row.decode(EntryRow.self)
        guard let kind = TokenKind(rawValue: kindName) else { return nil }
        let key = TokenKey(uncheckedKind: kind, subjectID: subjectID)
        var token: StoredToken?
        if let value, let expires {
            token = StoredToken(key: key, value: value, expiresAt: Date(timeIntervalSince1970: expires),
                                issuedAt: issued.map(Date.init(timeIntervalSince1970:)),
                                fetchedAt: Date(timeIntervalSince1970: fetched ?? expires),
                                lastUsedAt: lastUsed.map(Date.init(timeIntervalSince1970:)))
        }
        var failure: RefreshFailureState?
        if failures > 0 {
            failure = RefreshFailureState(
                consecutiveFailures: Int(failures),
                nextAttemptAt: nextAttempt.map(Date.init(timeIntervalSince1970:)) ?? .distantPast,
                lastErrorKind: errorKind ?? "unknown", lastErrorMessage: errorMessage,
                lastFailureAt: lastFailure.map(Date.init(timeIntervalSince1970:)) ?? .distantPast,
                configurationDigest: digest)
        }
        return TokenEntry(key: key, token: token, failure: failure)
    }

    /// A WHERE clause under construction, numbering its parameters.
    struct Condition {
        private(set) var clauses: [String] = []
        private(set) var bindings = PostgresBindings()

        /// The shared clauses (`?` placeholders, values in order), numbered.
        init(_ shared: TokenConditions = TokenConditions()) {
            var values = shared.values[...]
            for clause in shared.clauses {
                let count = clause.filter { $0 == "?" }.count
                append(clause, values.prefix(count).map { value -> any PostgresNonThrowingEncodable & Sendable in
                    switch value {
                    case .text(let text): text
                    case .real(let number): number
                    }
                })
                values = values.dropFirst(count)
            }
        }

        /// `clause` with `?` for each of `values`, in order.
        mutating func append(_ clause: String, _ values: [any PostgresNonThrowingEncodable & Sendable]) {
            var text = ""
            var remaining = values[...]
            for character in clause {
                if character == "?", let value = remaining.popFirst() {
                    bindings.append(value)
                    text += "$\(bindings.count)"
                } else {
                    text.append(character)
                }
            }
            clauses.append(text)
        }

        /// The next parameter's placeholder, after binding `value`.
        mutating func bind(_ value: some PostgresNonThrowingEncodable & Sendable) -> String {
            bindings.append(value)
            return "$\(bindings.count)"
        }

        var whereClause: String { clauses.isEmpty ? "WHERE true" : "WHERE " + clauses.joined(separator: " AND ") }
    }

    /// `$1` the key's kind, `$2` its subject id.
    static func keyBindings(_ key: TokenKey) -> PostgresBindings {
        var bindings = PostgresBindings()
        bindings.append(key.kind.rawValue)
        bindings.append(key.subjectID)
        return bindings
    }

    /// The kinds and subject ids of `keys`, as two arrays to unnest into rows.
    static func keyArrays(_ keys: some Sequence<TokenKey>) -> (kinds: [String], subjects: [String]) {
        var kinds: [String] = [], subjects: [String] = []
        for key in keys {
            kinds.append(key.kind.rawValue)
            subjects.append(key.subjectID)
        }
        return (kinds, subjects)
    }

    static func condition(for filter: TokenFilter) -> Condition {
        Condition(.matching(filter))
    }

    /// Entries dead since before `cutoff` (the rule the SQLite store shares).
    static func retiredCondition(before cutoff: Date) -> Condition {
        Condition(.retired(before: cutoff))
    }

    /// The status rule of `TokenStatus` in SQL (`TokenConditions.status`, the SQLite store's
    /// too) in PostgreSQL's dialect. Parameters: $1 now, $2 soft-point fraction.
    static let statusSQL = TokenConditions.status(greatest: "greatest", now: "$1", softPointFraction: "$2")

    /// The upsert's conflict clause: an older token never replaces a newer one.
    static func onConflict(clearingFailure: Bool) -> String {
        let resetFailure = clearingFailure
            ? ", failure_count = 0, next_attempt_at = NULL, last_error_kind = NULL, last_error_message = NULL, last_failure_at = NULL, failure_config_digest = NULL"
            : ""
        return """
            ON CONFLICT (kind, subject_id) DO UPDATE SET
              token = excluded.token, expires_at = excluded.expires_at, issued_at = excluded.issued_at,
              fetched_at = excluded.fetched_at,
              last_used_at = coalesce(excluded.last_used_at, tokens.last_used_at)\(resetFailure)
            WHERE tokens.token IS NULL OR excluded.expires_at >= tokens.expires_at
            """
    }

    /// One token's upsert (``UpsertClearingFailure``, ``UpsertKeepingFailure``).
    static func upsertSQL(clearingFailure: Bool) -> String {
        """
        INSERT INTO tokens (kind, subject_id, token, expires_at, issued_at, fetched_at, last_used_at)
        VALUES ($1, $2, $3, $4, $5, $6, $7)
        \(onConflict(clearingFailure: clearingFailure))
        """
    }

    static let upsertBindingTypes: [PostgresDataType] = [.text, .text, .text, .float8, .float8, .float8, .float8]

    /// Many tokens in one statement (group commit): arrays unnested into rows. NaN stands for
    /// a missing time, since postgres-nio binds no arrays with NULL elements.
    static func batchUpsertSQL(clearingFailure: Bool) -> String {
        """
        INSERT INTO tokens (kind, subject_id, token, expires_at, issued_at, fetched_at, last_used_at)
        SELECT k, s, t, e, nullif(i, 'NaN'::float8), f, nullif(u, 'NaN'::float8)
        FROM unnest($1::text[], $2::text[], $3::text[], $4::float8[], $5::float8[], $6::float8[], $7::float8[])
             AS batch(k, s, t, e, i, f, u)
        \(onConflict(clearingFailure: clearingFailure))
        """
    }
}

/// One refreshed token's upsert, prepared once per connection: the engine's most frequent
/// write. The two statements differ only in whether the key's failure state is cleared.
protocol TokenUpsertStatement: PostgresPreparedStatement where Row == Void {
    var token: StoredToken { get }
}

extension TokenUpsertStatement {
    static var bindingDataTypes: [PostgresDataType] { PostgresTokenSQL.upsertBindingTypes }

    func makeBindings() throws -> PostgresBindings {
        var bindings = PostgresBindings(capacity: 7)
        bindings.append(token.key.kind.rawValue)
        bindings.append(token.key.subjectID)
        bindings.append(token.value)
        bindings.append(token.expiresAt.timeIntervalSince1970)
        bindings.append(token.issuedAt?.timeIntervalSince1970)
        bindings.append(token.fetchedAt.timeIntervalSince1970)
        bindings.append(token.lastUsedAt?.timeIntervalSince1970)
        return bindings
    }

    func decodeRow(_ row: PostgresRow) throws {}
}

/// A refreshed token: the key's failure state is cleared.
struct UpsertClearingFailure: TokenUpsertStatement {
    static let name = "fleet_token_upsert_clearing_failure"
    // Stored, not computed: postgres-nio reads it on every execution.
    static let sql = PostgresTokenSQL.upsertSQL(clearingFailure: true)
    let token: StoredToken
}

/// A token stored while the key's failure state stays.
struct UpsertKeepingFailure: TokenUpsertStatement {
    static let name = "fleet_token_upsert_keeping_failure"
    static let sql = PostgresTokenSQL.upsertSQL(clearingFailure: false)
    let token: StoredToken
}
