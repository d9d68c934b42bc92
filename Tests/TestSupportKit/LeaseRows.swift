// The refresh leases of a SQLite store as a third process sees them: stock sqlite3, read-only,
// on the store file. Tests that wait for a lease to be taken, renewed or released read them here.

import FleetTokenStore
import Foundation

/// The rows of a SQLite store's `refresh_leases` table, read once by stock sqlite3.
public struct LeaseRows: Sendable {
    /// One key's lease: who holds it and until when.
    public struct Lease: Sendable, Equatable {
        /// The holder's name (`<host>/pid-<pid>-<random>@<machine>`).
        public let holder: String
        /// When the lease ends unless it is renewed.
        public let until: Date
    }

    /// The leases by key (`vehicle/truck-7`).
    public let leases: [String: Lease]

    /// Reads the leases of the store at `path` (read-only, waiting up to 5 s for a lock).
    /// - Throws: ``ProcessFailure`` when sqlite3 fails (no such file or table, say).
    public init(_ path: String) async throws {
        var leases: [String: Lease] = [:]
        let output = try await sqlite3(path, "SELECT kind || '/' || subject_id, holder, expires_at FROM refresh_leases", readOnly: true)
        for line in output.split(separator: "\n") {
            let fields = line.split(separator: "|", omittingEmptySubsequences: false).map(String.init)
            guard fields.count == 3, let until = Double(fields[2]) else { continue }
            leases[fields[0]] = Lease(holder: fields[1], until: Date(timeIntervalSince1970: until))
        }
        self.leases = leases
    }

    /// How many leases are held.
    public var count: Int { leases.count }

    /// The distinct holders.
    public var holders: Set<String> { Set(leases.values.map(\.holder)) }

    /// Whether `holder` holds `key`'s lease until after `time`.
    public func holds(_ key: TokenKey, _ holder: String, past time: Date) -> Bool {
        guard let lease = leases[key.description] else { return false }
        return lease.holder == holder && lease.until > time
    }
}
