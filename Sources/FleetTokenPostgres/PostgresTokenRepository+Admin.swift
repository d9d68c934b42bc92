// FleetTokenPostgres: PostgresTokenRepository as a TokenStoreAdmin: listing, counting,
// purging, statistics and the health check that `tokenctl` shows. Nothing here is on the
// engine's path.
public import FleetTokenStore
public import Foundation
import PostgresNIO

extension PostgresTokenRepository: TokenStoreAdmin {
    // MARK: - Reading

    /// The entries matching `filter`, in (kind, subject id) order, one page at a time.
    /// - Throws: `TokenStoreError` when the database cannot be read.
    public func list(_ filter: TokenFilter, page: TokenPage) async throws(TokenStoreError) -> [TokenEntry] {
        var condition = PostgresTokenSQL.condition(for: filter)
        if let after = page.after { condition.append("(kind, subject_id) > (?, ?)", [after.kind.rawValue, after.subjectID]) }
        let limit = condition.bind(Int64(min(max(0, page.limit), Int(Int64.max))))
        return try await runner.rows("""
            SELECT \(PostgresTokenSQL.entryColumns) FROM tokens \(condition.whereClause)
            ORDER BY kind, subject_id LIMIT \(limit)
            """, condition.bindings, PostgresTokenSQL.entry(from:))
    }

    /// How many entries a purge of `filter` with `scope` would remove.
    /// - Throws: `TokenStoreError` when the database cannot be read.
    public func count(_ filter: TokenFilter, scope: PurgeScope) async throws(TokenStoreError) -> Int {
        var condition = PostgresTokenSQL.condition(for: filter)
        if scope == .tokens { condition.append("token IS NOT NULL", []) }
        return try await runner.count("SELECT count(*) FROM tokens \(condition.whereClause)", condition.bindings)
    }

    /// Counts by kind and status at `now`, the schema version and the tables' size on disk.
    /// - Throws: `TokenStoreError` when the database cannot be read.
    public func stats(at now: Date, policy: RefreshPolicy) async throws(TokenStoreError) -> TokenStoreStats {
        var bindings = PostgresBindings()
        bindings.append(now.timeIntervalSince1970)
        bindings.append(policy.softPointFraction)
        let groups = try await runner.rows("""
            SELECT kind, \(PostgresTokenSQL.statusSQL) AS status, count(*) FROM tokens GROUP BY 1, 2
            """, bindings) { try $0.decode((String, String, Int64).self) }
        var counts: [TokenKind: [TokenStatus: Int]] = [:]
        var total = 0
        for (kindName, statusName, n) in groups {
            guard let kind = TokenKind(rawValue: kindName), let status = TokenStatus(rawValue: statusName) else { continue }
            counts[kind, default: [:]][status, default: 0] += Int(n)
            total += Int(n)
        }
        let summary = try await runner.rows("""
            SELECT min(expires_at), max(expires_at),
                   pg_total_relation_size('tokens') + pg_total_relation_size('refresh_leases')
            FROM tokens WHERE expires_at IS NOT NULL
            """) { try $0.decode((Double?, Double?, Int64).self) }.first
        return TokenStoreStats(total: total, counts: counts, schemaVersion: try await schemaVersion(),
                               fileSizeBytes: summary?.2 ?? 0,
                               oldestExpiry: summary?.0.map(Date.init(timeIntervalSince1970:)),
                               newestExpiry: summary?.1.map(Date.init(timeIntervalSince1970:)))
    }

    /// The schema version recorded in the database.
    /// - Throws: `TokenStoreError` when the database cannot be read.
    public func schemaVersion() async throws(TokenStoreError) -> Int {
        let migrator = self.migrator, logger = self.logger
        return try await runner.perform { connection in
            PostgresSchemaMigrator.version(of: try await migrator.applied(connection, logger: logger) ?? [])
        }
    }

    // MARK: - Writing

    /// Removes what `scope` names from the entries matching `filter`, in one statement; every
    /// replica hears of it through the change feed.
    /// - Throws: `TokenStoreError`; on failure nothing was removed.
    public func purge(_ filter: TokenFilter, scope: PurgeScope) async throws(TokenStoreError) -> Int {
        var condition = PostgresTokenSQL.condition(for: filter)
        switch scope {
        case .tokens:
            condition.append("token IS NOT NULL", [])
            // Failing keys keep their failure state (the backoff); the rest go whole.
            return try await runner.count("""
                WITH cleared AS (UPDATE tokens SET token = NULL, expires_at = NULL, issued_at = NULL, fetched_at = NULL
                                 \(condition.whereClause) AND failure_count > 0 RETURNING 1),
                     gone AS (DELETE FROM tokens \(condition.whereClause) AND failure_count = 0 RETURNING 1)
                SELECT (SELECT count(*) FROM cleared) + (SELECT count(*) FROM gone)
                """, condition.bindings)
        case .tokensAndFailureState:
            return try await runner.count("""
                WITH gone AS (DELETE FROM tokens \(condition.whereClause) RETURNING 1) SELECT count(*) FROM gone
                """, condition.bindings)
        }
    }

    /// Deletes every entry whose token expired before `date`; returns how many went.
    /// - Throws: `TokenStoreError`; on failure nothing was deleted.
    public func deleteExpired(before date: Date) async throws(TokenStoreError) -> Int {
        var bindings = PostgresBindings()
        bindings.append(date.timeIntervalSince1970)
        return try await runner.count("WITH gone AS (DELETE FROM tokens WHERE expires_at < $1 RETURNING 1) SELECT count(*) FROM gone",
                                      bindings)
    }

    /// Clears `key`'s failure state (its backoff), removing the entry when it has no token.
    /// - Throws: `TokenStoreError`; on failure nothing was changed.
    public func clearFailure(for key: TokenKey) async throws(TokenStoreError) {
        try await runner.execute("""
            WITH gone AS (DELETE FROM tokens WHERE kind = $1 AND subject_id = $2 AND token IS NULL RETURNING 1)
            UPDATE tokens SET failure_count = 0, next_attempt_at = NULL, last_error_kind = NULL,
                              last_error_message = NULL, last_failure_at = NULL, failure_config_digest = NULL
            WHERE kind = $1 AND subject_id = $2 AND token IS NOT NULL
            """, PostgresTokenSQL.keyBindings(key))
    }

    // MARK: - Health

    /// The schema version and whether the tables answer, worded for the operator. PostgreSQL
    /// keeps its own pages' integrity; there is no file to judge.
    public func check() async -> StoreCheckReport {
        var report = StoreCheckReport(storePath: storeDescription, buildSchemaVersion: Self.buildSchemaVersion,
                                      schemaVersion: nil, integrityProblems: nil, backgroundIntegrityFinding: nil,
                                      files: nil, problems: [])
        do {
            let version = try await schemaVersion()
            report.schemaVersion = version
            _ = try await runner.count("SELECT count(*) FROM tokens")
            _ = try await runner.count("SELECT count(*) FROM refresh_leases")
            report.integrityProblems = []
            if version < Self.buildSchemaVersion {
                report.problems.append(TokenStoreError.storeOlderThanBuild(path: storeDescription, storeVersion: version,
                                                                           buildVersion: Self.buildSchemaVersion).description)
            }
        } catch {
            report.problems.append(error.description)
        }
        return report
    }
}
