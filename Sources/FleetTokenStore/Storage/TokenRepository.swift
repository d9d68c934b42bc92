public import Foundation

/// Persistent storage of tokens and their refresh state, keyed by ``TokenKey``.
///
/// ``SQLiteTokenRepository`` is the implementation; the protocol lets the sync engine and tests
/// depend on behaviour, not on SQLite. Every method is safe to call concurrently.
public protocol TokenRepository: Sendable {
    /// The entry for `key`, or nil when the store holds nothing for it.
    /// - Throws: ``TokenStoreError``.
    func entry(for key: TokenKey) async throws(TokenStoreError) -> TokenEntry?

    /// The entries for `keys` (missing keys are absent from the result), in one read.
    /// - Throws: ``TokenStoreError``.
    func entries(for keys: [TokenKey]) async throws(TokenStoreError) -> [TokenKey: TokenEntry]

    /// Takes the cross-process refresh lease of `key` for `holder` unless another holder has
    /// an unexpired one, in one `BEGIN IMMEDIATE` transaction that also reads the key's entry.
    /// - Throws: ``TokenStoreError``.
    func acquireRefreshLease(for key: TokenKey, holder: String, now: Date,
                             duration: TimeInterval) async throws(TokenStoreError) -> RefreshLease

    /// Gives up `holder`'s leases on `keys` (others' leases are left alone).
    /// - Throws: ``TokenStoreError``.
    func releaseRefreshLeases(for keys: [TokenKey], holder: String) async throws(TokenStoreError)

    /// Removes the token of `key` (one Fleet Engine rejected) but keeps its failure state, so
    /// the backoff still holds; the entry goes when it has no failure state either.
    /// - Throws: ``TokenStoreError``.
    func removeToken(for key: TokenKey) async throws(TokenStoreError)

    /// Stores `token` in one transaction, replacing the key's previous token unless that one
    /// expires later (a newer token another process wrote wins over a slow writer's older one).
    /// Clears the key's failure state when `clearFailure` is true (a successful refresh).
    /// - Throws: ``TokenStoreError``; on failure nothing was written.
    func upsert(_ token: StoredToken, clearFailure: Bool) async throws(TokenStoreError)

    /// Stores many tokens in one transaction (group commit for refresh bursts): all or nothing.
    /// - Throws: ``TokenStoreError``; on failure nothing was written.
    func upsert(_ tokens: [StoredToken], clearFailure: Bool) async throws(TokenStoreError)

    /// Entries matching `filter`, ordered by kind then subject id, one page at a time.
    /// - Throws: ``TokenStoreError``.
    func list(_ filter: TokenFilter, page: TokenPage) async throws(TokenStoreError) -> [TokenEntry]

    /// Removes what `scope` names from every entry matching `filter`, in one transaction, and
    /// returns how many entries lost a token (with ``PurgeScope/tokens``) or went entirely
    /// (with ``PurgeScope/tokensAndFailureState``).
    /// - Throws: ``TokenStoreError``; on failure nothing was deleted.
    func purge(_ filter: TokenFilter, scope: PurgeScope) async throws(TokenStoreError) -> Int

    /// Keys whose entries have been dead since before `cutoff` (a token that expired before
    /// it, or none, and no failure after it), in (kind, subject id) order after `after`, at
    /// most `limit`. The retention sweep's candidates.
    /// - Throws: ``TokenStoreError``.
    func retiredKeys(before cutoff: Date, after: TokenKey?, limit: Int) async throws(TokenStoreError) -> [TokenKey]

    /// Deletes the entries of `keys` that are still dead since before `cutoff`, in one
    /// transaction; returns how many went.
    /// - Throws: ``TokenStoreError``; on failure nothing was deleted.
    func deleteRetired(_ keys: [TokenKey], before cutoff: Date) async throws(TokenStoreError) -> Int

    /// Deletes tokens that expired before `date`, keeping entries that only hold failure state
    /// younger than that. Returns how many entries went.
    /// - Throws: ``TokenStoreError``.
    func deleteExpired(before date: Date) async throws(TokenStoreError) -> Int

    /// Records a failed refresh of `key` (an entry is created if the key has no token yet).
    /// - Throws: ``TokenStoreError``.
    func recordFailure(_ failure: RefreshFailureState, for key: TokenKey) async throws(TokenStoreError)

    /// Forgets the failure state of `key`; removes the entry when it holds no token.
    /// - Throws: ``TokenStoreError``.
    func clearFailure(for key: TokenKey) async throws(TokenStoreError)

    /// Counts by kind and status at `now`, schema version, file size and expiry range.
    /// - Throws: ``TokenStoreError``.
    func stats(at now: Date, policy: RefreshPolicy) async throws(TokenStoreError) -> TokenStoreStats

    /// Changes to tokens made by any process, including other processes sharing the store
    /// file, delivered within about a second of their commit. The stream ends when the
    /// repository closes.
    func changes() -> AsyncStream<TokenStoreChange>
}

extension TokenRepository {
    /// No candidates: a repository without this has no retention sweep.
    public func retiredKeys(before cutoff: Date, after: TokenKey?, limit: Int) async throws(TokenStoreError) -> [TokenKey] { [] }

    /// Deletes nothing: a repository without this has no retention sweep.
    public func deleteRetired(_ keys: [TokenKey], before cutoff: Date) async throws(TokenStoreError) -> Int { 0 }

    /// Removes the tokens of every entry matching `filter`, keeping failure state (see
    /// ``PurgeScope/tokens``); returns how many entries lost a token.
    /// - Throws: ``TokenStoreError``; on failure nothing was deleted.
    public func purge(_ filter: TokenFilter) async throws(TokenStoreError) -> Int {
        try await purge(filter, scope: .tokens)
    }
}

/// What a purge removes from the entries it matches.
public enum PurgeScope: Sendable, Equatable {
    /// Tokens only. An entry's refresh-failure state (its backoff) survives, so a purge during
    /// a provider outage does not make every failing key retry at once; an entry without
    /// failure state goes entirely. The default.
    case tokens
    /// Tokens and failure state: matching entries go entirely, and their backoff with them.
    case tokensAndFailureState
}

/// Which entries a list or purge applies to. Conditions combine with AND; the empty filter
/// (``all``) matches everything.
public struct TokenFilter: Sendable, Equatable {
    /// Validity of the token at a point in time.
    public enum Validity: Sendable, Equatable {
        /// Tokens that expire at or before this time (entries without a token do not match).
        case expired(asOf: Date)
        /// Tokens that are still valid at this time (entries without a token do not match).
        case valid(asOf: Date)
    }

    /// Only this kind.
    public var kind: TokenKind?
    /// Only this subject id.
    public var subjectID: String?
    /// Only expired, or only valid, tokens.
    public var validity: Validity?

    /// Creates a filter.
    public init(kind: TokenKind? = nil, subjectID: String? = nil, validity: Validity? = nil) {
        self.kind = kind
        self.subjectID = subjectID
        self.validity = validity
    }

    /// Matches every entry.
    public static let all = TokenFilter()

    /// Matches exactly `key`.
    public static func key(_ key: TokenKey) -> TokenFilter {
        TokenFilter(kind: key.kind, subjectID: key.subjectID)
    }
}

/// Keyset paging: entries after `after` in (kind, subject id) order, at most `limit` of them.
public struct TokenPage: Sendable, Equatable {
    /// Start after this key (exclusive); nil starts at the beginning.
    public var after: TokenKey?
    /// Most entries returned.
    public var limit: Int

    /// Creates a page request.
    public init(after: TokenKey? = nil, limit: Int = 1000) {
        self.after = after
        self.limit = limit
    }

    /// Everything, in one page.
    public static let everything = TokenPage(limit: Int.max)
}

/// Counts and facts about a store.
public struct TokenStoreStats: Sendable, Equatable {
    /// Number of entries.
    public var total: Int
    /// Entries per kind and status.
    public var counts: [TokenKind: [TokenStatus: Int]]
    /// The store's schema version.
    public var schemaVersion: Int
    /// Size of the store file plus its write-ahead log, in bytes.
    public var fileSizeBytes: Int64
    /// The earliest token expiry, if any token is stored.
    public var oldestExpiry: Date?
    /// The latest token expiry, if any token is stored.
    public var newestExpiry: Date?

    /// Creates stats.
    public init(total: Int, counts: [TokenKind: [TokenStatus: Int]], schemaVersion: Int,
                fileSizeBytes: Int64, oldestExpiry: Date?, newestExpiry: Date?) {
        self.total = total
        self.counts = counts
        self.schemaVersion = schemaVersion
        self.fileSizeBytes = fileSizeBytes
        self.oldestExpiry = oldestExpiry
        self.newestExpiry = newestExpiry
    }

    /// Entries of `kind` with `status`.
    public func count(_ kind: TokenKind, _ status: TokenStatus) -> Int {
        counts[kind]?[status] ?? 0
    }
}

/// The outcome of asking for a key's refresh lease.
public enum RefreshLease: Sendable, Equatable {
    /// The caller holds the lease; `current` is the key's entry read in the same transaction.
    case acquired(current: TokenEntry?)
    /// Another holder is refreshing the key until `until`; wait for its result.
    case heldElsewhere(holder: String, until: Date, current: TokenEntry?)
}

/// A change to the stored tokens, as seen by ``TokenRepository/changes()``.
public enum TokenStoreChange: Sendable, Equatable {
    /// The key's token was written (a refresh here or elsewhere).
    case upserted(TokenKey)
    /// The key's token was removed (a purge, an expiry clean-up).
    case removed(TokenKey)
    /// Changes were made that cannot be itemized (too many, or older than the change log):
    /// re-read whatever you hold.
    case unknown
}
