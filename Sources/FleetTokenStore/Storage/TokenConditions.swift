// Storage layer: the WHERE conditions over the `tokens` table that every SQL store shares
// (SQLite here, PostgreSQL in FleetTokenPostgres): which rows a filter selects and which entries
// are retired. Clauses carry `?` for each value; each store binds them its own way.
package import Foundation

/// A value bound to a parameter of a ``TokenConditions`` clause.
package enum TokenSQLValue: Sendable, Equatable {
    case text(String)
    case real(Double)
}

/// WHERE clauses over the `tokens` table, with `?` for each of ``values`` in order.
package struct TokenConditions: Sendable, Equatable {
    package private(set) var clauses: [String] = []
    package private(set) var values: [TokenSQLValue] = []

    package init() {}

    /// Adds `clause`, whose `?` placeholders take `values` in order.
    package mutating func append(_ clause: String, _ values: [TokenSQLValue]) {
        clauses.append(clause)
        self.values += values
    }

    /// The rows `filter` selects.
    package static func matching(_ filter: TokenFilter) -> Self {
        var conditions = Self()
        if let kind = filter.kind { conditions.append("kind = ?", [.text(kind.rawValue)]) }
        if let subject = filter.subjectID { conditions.append("subject_id = ?", [.text(subject)]) }
        switch filter.validity {
        case .expired(let now): conditions.append("expires_at <= ?", [.real(now.timeIntervalSince1970)])
        case .valid(let now): conditions.append("expires_at > ?", [.real(now.timeIntervalSince1970)])
        case nil: break
        }
        return conditions
    }

    /// Entries dead since before `cutoff`: no token, or one that expired before it, and no
    /// failure or planned retry after it (a key still being retried is someone's, and its
    /// backoff must survive).
    package static func retired(before cutoff: Date) -> Self {
        var conditions = Self()
        let seconds = cutoff.timeIntervalSince1970
        conditions.append("coalesce(expires_at, 0) < ?", [.real(seconds)])
        conditions.append("(failure_count = 0 OR (coalesce(last_failure_at, 0) < ? AND coalesce(next_attempt_at, 0) < ?))",
                          [.real(seconds), .real(seconds)])
        return conditions
    }

    /// When an entry died, in Unix seconds: its token's expiry (0 without one), or its last
    /// failure or planned retry when later. ``retired(before:)`` selects the entries whose time
    /// this is before the cutoff. `greatest` names the store's function for the largest of its
    /// arguments (SQLite `max`, PostgreSQL `greatest`).
    package static func diedAt(greatest: String) -> String {
        "\(greatest)(coalesce(expires_at, 0), CASE WHEN failure_count > 0 "
            + "THEN \(greatest)(coalesce(last_failure_at, 0), coalesce(next_attempt_at, 0)) ELSE 0 END)"
    }

    /// The status rule of ``TokenStatus/init(token:failure:at:policy:)`` in SQL, for counting
    /// without reading tokens (a test keeps the two equal): written once for both stores.
    /// `now` and `softPointFraction` are the store's placeholders for the time (Unix seconds)
    /// and ``RefreshPolicy/softPointFraction``; `greatest` as in ``diedAt(greatest:)``.
    package static func status(greatest: String, now: String, softPointFraction: String) -> String {
        """
        CASE
          WHEN token IS NULL THEN 'backoff'
          WHEN expires_at <= \(now) THEN 'expired'
          WHEN failure_count > 0 AND next_attempt_at > \(now) THEN 'backoff'
          WHEN \(now) >= coalesce(issued_at, fetched_at)
                     + \(softPointFraction) * \(greatest)(0, expires_at - coalesce(issued_at, fetched_at)) THEN 'refresh_due'
          ELSE 'valid'
        END
        """
    }
}
