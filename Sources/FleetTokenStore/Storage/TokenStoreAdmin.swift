// Storage layer: the operations an administrator runs on a store (tokenctl's list, show,
// purge, stats, check), and the filter, page and statistics types they take and return.
public import Foundation

/// What an administration tool does with a store: list, show, count and purge entries, read
/// statistics and check the store's health. `tokenctl` is a view over this protocol.
///
/// ``SQLiteTokenRepository`` implements it (and ``TokenRepository`` and ``RefreshLeaseStore``);
/// none of it is on the engine's path. Every method is safe to call concurrently with an
/// engine using the same store.
public protocol TokenStoreAdmin: Sendable {
    /// Entries matching `filter`, ordered by kind then subject id (``TokenKey``'s order), one
    /// page at a time.
    /// - Throws: ``TokenStoreError`` when the store cannot be read.
    func list(_ filter: TokenFilter, page: TokenPage) async throws(TokenStoreError) -> [TokenEntry]

    /// The entry for `key` with every stored field, or nil when the store holds nothing for it.
    /// - Throws: ``TokenStoreError`` when the store cannot be read.
    func entry(for key: TokenKey) async throws(TokenStoreError) -> TokenEntry?

    /// How many entries a ``purge(_:scope:)`` of `filter` with `scope` would remove, removing
    /// nothing (a dry run).
    /// - Throws: ``TokenStoreError`` when the store cannot be read.
    func count(_ filter: TokenFilter, scope: PurgeScope) async throws(TokenStoreError) -> Int

    /// Removes what `scope` names from every entry matching `filter`, in one transaction, and
    /// returns how many entries lost a token (with ``PurgeScope/tokens``) or went entirely
    /// (with ``PurgeScope/tokensAndFailureState``).
    /// - Throws: ``TokenStoreError``; on failure nothing was deleted.
    func purge(_ filter: TokenFilter, scope: PurgeScope) async throws(TokenStoreError) -> Int

    /// Counts by kind and status at `now` (as ``TokenEntry/status(at:policy:)`` judges each
    /// entry under `policy`), the schema version, the store's size and its expiry range.
    /// - Throws: ``TokenStoreError`` when the store cannot be read.
    func stats(at now: Date, policy: RefreshPolicy) async throws(TokenStoreError) -> TokenStoreStats

    /// Deletes the entries whose token expired before `date`, failure state and all; entries
    /// holding only failure state stay. Returns how many entries went.
    /// - Throws: ``TokenStoreError``; on failure nothing was deleted.
    func deleteExpired(before date: Date) async throws(TokenStoreError) -> Int

    /// Forgets the failure state (the backoff) of `key`; removes the entry when it holds no
    /// token.
    /// - Throws: ``TokenStoreError``; on failure nothing was changed.
    func clearFailure(for key: TokenKey) async throws(TokenStoreError)

    /// The schema version recorded in the store.
    /// - Throws: ``TokenStoreError`` when the store cannot be read.
    func schemaVersion() async throws(TokenStoreError) -> Int

    /// Checks the store's health: its integrity, a finding of a background check, its files'
    /// owners and modes, its schema version. Never throws: what stops a check (an unreadable
    /// store, say) is a problem in the report.
    func check() async -> StoreCheckReport
}

extension TokenStoreAdmin {
    /// The first page (``TokenPage/init(after:limit:)``'s default size) of entries matching
    /// `filter`; see ``list(_:page:)``.
    /// - Throws: ``TokenStoreError`` when the store cannot be read.
    public func list(_ filter: TokenFilter) async throws(TokenStoreError) -> [TokenEntry] {
        try await list(filter, page: TokenPage())
    }

    /// How many entries match `filter`, with or without a token.
    /// - Throws: ``TokenStoreError`` when the store cannot be read.
    public func count(_ filter: TokenFilter) async throws(TokenStoreError) -> Int {
        try await count(filter, scope: .tokensAndFailureState)
    }

    /// Removes the tokens of every entry matching `filter`, keeping failure state (see
    /// ``PurgeScope/tokens``); returns how many entries lost a token.
    /// - Throws: ``TokenStoreError``; on failure nothing was deleted.
    public func purge(_ filter: TokenFilter) async throws(TokenStoreError) -> Int {
        try await purge(filter, scope: .tokens)
    }

    /// Statistics at `now` under the default ``RefreshPolicy``; see ``stats(at:policy:)``.
    /// - Throws: ``TokenStoreError`` when the store cannot be read.
    public func stats(at now: Date) async throws(TokenStoreError) -> TokenStoreStats {
        try await stats(at: now, policy: RefreshPolicy())
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

    /// Whether `entry` matches, as a store applies the filter.
    public func matches(_ entry: TokenEntry) -> Bool {
        if let kind, entry.key.kind != kind { return false }
        if let subjectID, entry.key.subjectID != subjectID { return false }
        switch validity {
        case .expired(let now): return entry.token.map { $0.expiresAt <= now } ?? false
        case .valid(let now): return entry.token.map { $0.expiresAt > now } ?? false
        case nil: return true
        }
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
    /// Size of the store file plus its write-ahead log, in bytes (0 for a store without files).
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
