// Shared by the test targets: the repository contract. The behaviour every store must have
// (TokenRepository, RefreshLeaseStore, TokenStoreAdmin, TokenSealingStore), written once as checks that run
// against any implementation: SQLite and the in-memory one today, PostgreSQL next.

import FleetTokenStore
import Foundation
import Testing

/// A store as the contract sees it: everything the engine, the encryption layer and the admin
/// tool use.
public typealias ContractRepository = TokenRepository & RefreshLeaseStore & TokenStoreAdmin & TokenSealingStore

/// The behaviour every token store must have, as checks runnable against any implementation.
///
/// Give it a ``Subject`` (how to make a fresh, empty store) and run each ``Check`` from a
/// parameterized test:
///
/// ```swift
/// @Test(arguments: [sqliteSubject, inMemorySubject], RepositoryContract.Check.allCases)
/// func contract(subject: RepositoryContract.Subject, check: RepositoryContract.Check) async throws {
///     try await RepositoryContract(subject).run(check)
/// }
/// ```
///
/// Times are explicit (a fixed reference time, leases given `now`): no check sleeps, except
/// that the change-feed check waits (up to 10 s) for another view's writes to arrive.
public struct RepositoryContract: Sendable {
    /// One store under test, and how to end it.
    public struct Fixture: Sendable {
        /// A fresh, empty store.
        public let store: any ContractRepository
        /// A second view of the same store, as another process would have (a second
        /// connection, say), where the implementation has one: the change-feed check needs it,
        /// the lease checks use it when present.
        public let otherProcess: (any ContractRepository)?
        /// Closes both and removes what they left (files).
        public let tearDown: @Sendable () -> Void

        /// A fixture of `store`, its second view `otherProcess` (nil without one) and what ends them.
        public init(store: any ContractRepository, otherProcess: (any ContractRepository)?, tearDown: @escaping @Sendable () -> Void) {
            self.store = store
            self.otherProcess = otherProcess
            self.tearDown = tearDown
        }
    }

    /// An implementation under test.
    public struct Subject: Sendable, CustomTestStringConvertible {
        /// Its name in test output.
        public let name: String
        /// Runs one check's body with a fresh, empty store (and its second view), then ends
        /// them: a scope, for stores that live inside one (PostgreSQL's connection pool).
        public let withFixture: @Sendable ((Fixture) async throws -> Void) async throws -> Void
        /// A key whose subject id the store's constraints refuse (empty, or longer than
        /// `TokenKey.maximumSubjectIDLength` bytes): built without validation, through
        /// `@testable` access, since `TokenKey` never builds one.
        public let refusedKey: TokenKey

        /// An implementation called `name`, whose constraints refuse `refusedKey`, made fresh by `makeFixture`.
        public init(name: String, refusedKey: TokenKey, makeFixture: @escaping @Sendable () throws -> Fixture) {
            self.init(name: name, refusedKey: refusedKey) { body in
                let fixture = try makeFixture()
                defer { fixture.tearDown() }
                try await body(fixture)
            }
        }

        /// An implementation called `name`, whose constraints refuse `refusedKey`, whose fresh
        /// stores live for the length of `withFixture`'s body.
        public init(name: String, refusedKey: TokenKey,
                    withFixture: @escaping @Sendable ((Fixture) async throws -> Void) async throws -> Void) {
            self.name = name
            self.refusedKey = refusedKey
            self.withFixture = withFixture
        }

        /// The name, for test output.
        public var testDescription: String { name }
    }

    /// The contract's checks, one behaviour each.
    public enum Check: String, CaseIterable, Sendable, CustomTestStringConvertible {
        case entryRoundTrip = "upsert, entry and entries: the token round-trips exactly"
        case laterExpiringTokenWins = "an older token never replaces a newer one (a slow writer loses)"
        case groupUpsertAllOrNothing = "a batch upsert is all of it or none of it"
        case failureState = "recordFailure creates an entry; upsert's clearFailure and clearFailure keep or clear it"
        case removeTokenKeepsFailureState = "removeToken keeps the failure state; without one the entry goes"
        case removeTokenIfValue = "removeToken(ifValue:) removes only the value read; one written since by another view stays"
        case listFiltersAndPaging = "list filters by kind, subject, expired and valid, and pages by key in order"
        case purgeScopesAndCounts = "purge applies the filters, keeps failure state unless named, and counts"
        case retiredKeys = "retired keys are paged in key order; deletion re-checks them"
        case deleteExpired = "deleteExpired removes entries with a token expired before the date, only those"
        case stats = "stats count by kind and status exactly as TokenStatus judges each entry"
        case leaseHeldElsewhere = "a lease is taken, renewed by its holder and refused to others while it runs"
        case leaseRelease = "a holder releases only its own leases"
        case leaseExpiry = "a lease past its time is free for anyone"
        case leaseTakeOver = "a take-over succeeds only from the named holder (or on a free lease)"
        case expiredLeaseSweep = "leases expired before a cutoff are deleted, at most the limit at a time; the others stay"
        case changeFeed = "the change feed reports another view's upserts and removals, never its own writes"
        case healthCheck = "check reports a fresh store healthy, with its schema version"
        case failureConfigurationDigest = "a failure keeps the digest of the configuration that failed; a success clears it"
        case earliestDeath = "earliestDeath says when the earliest entry died at or after a time, as the retention cutoff judges it"

        /// What the check shows, for test output.
        public var testDescription: String { rawValue }
    }

    /// The implementation under test.
    public let subject: Subject

    /// A contract run against `subject`.
    public init(_ subject: Subject) {
        self.subject = subject
    }

    /// Runs `check` on a fresh store, then tears it down.
    public func run(_ check: Check) async throws {
        try await subject.withFixture { fixture in try await run(check, on: fixture) }
    }

    private func run(_ check: Check, on fixture: Fixture) async throws {
        let store = fixture.store
        switch check {
        case .entryRoundTrip: try await entryRoundTrip(store)
        case .laterExpiringTokenWins: try await laterExpiringTokenWins(store)
        case .groupUpsertAllOrNothing: try await groupUpsertAllOrNothing(store)
        case .failureState: try await failureState(store)
        case .removeTokenKeepsFailureState: try await removeTokenKeepsFailureState(store)
        case .removeTokenIfValue: try await removeTokenIfValue(store, fixture.otherProcess ?? store)
        case .listFiltersAndPaging: try await listFiltersAndPaging(store)
        case .purgeScopesAndCounts: try await purgeScopesAndCounts(store)
        case .retiredKeys: try await retiredKeys(store)
        case .deleteExpired: try await deleteExpired(store)
        case .stats: try await stats(store)
        case .leaseHeldElsewhere: try await leaseHeldElsewhere(store, fixture.otherProcess ?? store)
        case .leaseRelease: try await leaseRelease(store, fixture.otherProcess ?? store)
        case .leaseExpiry: try await leaseExpiry(store, fixture.otherProcess ?? store)
        case .leaseTakeOver: try await leaseTakeOver(store, fixture.otherProcess ?? store)
        case .expiredLeaseSweep: try await expiredLeaseSweep(store, fixture.otherProcess ?? store)
        case .changeFeed:
            guard let other = fixture.otherProcess else { return }
            try await changeFeed(store, other)
        case .healthCheck: await healthCheck(store)
        case .failureConfigurationDigest: try await failureConfigurationDigest(store)
        case .earliestDeath: try await earliestDeath(store)
        }
    }

    // MARK: - Shared data

    /// The time the checks' tokens and leases are relative to.
    static var now: Date { referenceNow }

    /// A failure state recorded at `now + at`, retrying `retryIn` seconds after ``now``.
    static func failure(_ count: Int, retryIn: TimeInterval, kind: String = "timeout", message: String? = nil,
                        at: TimeInterval = 0) -> RefreshFailureState {
        RefreshFailureState(consecutiveFailures: count, nextAttemptAt: now + retryIn, lastErrorKind: kind,
                            lastErrorMessage: message, lastFailureAt: now + at)
    }

    /// Fills `store` with 3 valid vehicles, 2 expired vehicles, 2 valid trips, 1 expired trip
    /// and 1 trip with only failure state, relative to `referenceNow`.
    public static func seed(_ store: any ContractRepository) async throws {
        var tokens: [StoredToken] = []
        for i in 0..<3 { tokens.append(token(try .vehicle("v-valid-\(i)"), expiresIn: 1800)) }
        for i in 0..<2 { tokens.append(token(try .vehicle("v-expired-\(i)"), expiresIn: -60)) }
        for i in 0..<2 { tokens.append(token(try .trip("t-valid-\(i)"), expiresIn: 1800)) }
        tokens.append(token(try .trip("t-expired-0"), expiresIn: -1))
        try await store.upsert(tokens)
        try await store.recordFailure(failure(2, retryIn: 30), for: try .trip("t-failing"))
    }
}
