// Storage layer: SQLiteTokenRepository as a TokenStoreAdmin, forwarding to SQLiteAdminQueries
// (listing, counting, purging, statistics, the health check that `tokenctl` shows), and the
// check of a store by path. Nothing here is on the engine's path.
public import Foundation
public import Logging

extension SQLiteTokenRepository {
    // MARK: - Reading

    /// Entries matching `filter`, ordered by kind then subject id.
    /// - Throws: ``TokenStoreError`` when the store cannot be read.
    public func list(_ filter: TokenFilter, page: TokenPage = TokenPage()) async throws(TokenStoreError) -> [TokenEntry] {
        try await adminQueries.list(filter, page: page)
    }

    /// How many entries a purge of `filter` with `scope` would remove (a dry run).
    /// - Throws: ``TokenStoreError`` when the store cannot be read.
    public func count(_ filter: TokenFilter, scope: PurgeScope) async throws(TokenStoreError) -> Int {
        try await adminQueries.count(filter, scope: scope)
    }

    /// Counts by kind and status, schema version, file size and expiry range.
    /// - Throws: ``TokenStoreError`` when the store cannot be read.
    public func stats(at now: Date = Date(), policy: RefreshPolicy = RefreshPolicy()) async throws(TokenStoreError) -> TokenStoreStats {
        try await adminQueries.stats(at: now, policy: policy)
    }

    /// The schema version this build migrates stores to.
    public static var buildSchemaVersion: Int { SchemaMigrator().latestVersion }

    /// The schema version recorded in the store.
    /// - Throws: ``TokenStoreError`` when the store cannot be read.
    public func schemaVersion() async throws(TokenStoreError) -> Int {
        try await adminQueries.schemaVersion()
    }

    /// `PRAGMA integrity_check`: an empty array when the store is sound, else SQLite's findings.
    /// - Throws: ``TokenStoreError`` when the store cannot be read.
    public func integrityProblems() async throws(TokenStoreError) -> [String] {
        try await adminQueries.integrityProblems()
    }

    // MARK: - Writing

    /// Removes what `scope` names from the entries matching `filter`, in one transaction;
    /// returns how many entries lost a token (``PurgeScope/tokens``) or went entirely
    /// (``PurgeScope/tokensAndFailureState``).
    /// - Throws: ``TokenStoreError``; on failure nothing was deleted.
    public func purge(_ filter: TokenFilter, scope: PurgeScope = .tokens) async throws(TokenStoreError) -> Int {
        try await adminQueries.purge(filter, scope: scope)
    }

    /// Deletes the entries whose token expired before `date` (failure state and all); returns
    /// how many went.
    /// - Throws: ``TokenStoreError``; on failure nothing was deleted.
    public func deleteExpired(before date: Date) async throws(TokenStoreError) -> Int {
        try await adminQueries.deleteExpired(before: date)
    }

    /// Forgets the failure state of `key`; removes the entry when it holds no token.
    /// - Throws: ``TokenStoreError``; on failure nothing was changed.
    public func clearFailure(for key: TokenKey) async throws(TokenStoreError) {
        try await adminQueries.clearFailure(for: key)
    }

    // MARK: - Health

    /// Checks the store: its files (owners, modes; see ``inspectFiles(at:configuration:)``), its
    /// schema version, `PRAGMA integrity_check` over every page (its time grows with the store)
    /// and any damage the background check found. Never throws: what stops the check is a
    /// problem in the report.
    public func check() async -> StoreCheckReport {
        await adminQueries.check(files: files.inspect(), storePath: path, backgroundFinding: { backgroundIntegrityFinding() })
    }

    /// Checks the store at `path` as `tokenctl check` does: judges its files before opening,
    /// opens it read-only (changing nothing), checks it (see ``check()``) and closes it. A store
    /// that cannot be opened (missing, refused, newer than this build, corrupt) is reported,
    /// with the reason as a problem, not thrown.
    ///
    /// - Parameters:
    ///   - path: The store file.
    ///   - configuration: Timeouts and the symbolic-link rule the store is judged by.
    ///   - logger: Receives what opening logs (a mode too open, say). Never a token.
    public static func check(path: String, configuration: StoreConfiguration = StoreConfiguration(),
                             logger: Logger) async -> StoreCheckReport {
        // The files judged by the rules every open applies, before opening creates side files:
        // check and the library never disagree, and a refusal among them is also what opening reports.
        let files = inspectFiles(at: path, configuration: configuration)
        let repository: SQLiteTokenRepository
        do {
            repository = try SQLiteTokenRepository(path: path, mode: .readOnly, configuration: configuration, logger: logger)
        } catch {
            return StoreCheckReport(unopened: path, files: files, buildSchemaVersion: buildSchemaVersion, error: error)
        }
        defer { repository.close() }
        return await repository.adminQueries.check(files: files, storePath: path,
                                                   backgroundFinding: { repository.backgroundIntegrityFinding() })
    }

}
