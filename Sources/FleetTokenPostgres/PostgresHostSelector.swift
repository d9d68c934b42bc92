// FleetTokenPostgres: which of the URL's hosts the store uses, as libpq's target_session_attrs
// decides it. The rule (order and fit) is a value; PostgresHostSelector does the connecting: one
// direct connection per host tried, asking a server whether it takes writes. PostgresAvailability
// consults it when the database seems gone, so a promoted standby is found without a restart.
import FleetTokenStore
import Logging
import PostgresNIO

/// The rule of choosing a host; no I/O.
struct PostgresHostChoice: Sendable, Equatable {
    /// How many hosts the URL names.
    let count: Int
    /// What a host must be.
    let wanted: PostgresStoreLocation.TargetSessionAttributes

    /// The hosts to try, by index: the one in use first (a host that works stays: no flapping
    /// back to the first while it serves), then the others in the URL's order, as libpq tries them.
    func order(current: Int?) -> [Int] {
        let all = Array(0..<count)
        guard let current, all.contains(current) else { return all }
        return [current] + all.filter { $0 != current }
    }

    /// Whether a server answering so fits.
    func fits(readOnly: Bool, inRecovery: Bool) -> Bool {
        switch wanted {
        case .any: true
        case .readWrite: !readOnly
        case .primary: !inRecovery
        }
    }

    /// Whether a server must be asked what it is (with `any` a connection is enough).
    var asksServer: Bool { wanted != .any }
}

/// Finds the first host that fits, over direct connections.
struct PostgresHostSelector: Sendable {
    /// What a search found.
    enum Outcome: Sendable {
        /// The host at this index fits.
        case found(Int)
        /// Every host refused or does not fit: the database is down for us.
        case refused(TokenStoreError)
        /// No host fits, and at least one was too slow to tell (a loaded machine, not a
        /// missing database).
        case undecided
    }

    let choice: PostgresHostChoice
    /// One direct connection configuration per host, in the URL's order.
    let directs: [PostgresConnection.Configuration]
    /// `name:port` per host, for messages.
    let names: [String]
    let store: String
    let statementTimeout: Duration
    let logger: Logger

    /// Tries the hosts in ``PostgresHostChoice/order(current:)``. Each attempt's TCP connect is
    /// bounded by the connect timeout (a dropped SYN is a refusal); the rest by the statement
    /// timeout, and running out of that decides nothing for that host.
    func find(current: Int?) async -> Outcome {
        var reasons: [String] = []
        var undecided = false
        var lastError: TokenStoreError?
        for index in choice.order(current: current) {
            // A caller cancelled (its call ended meanwhile) learned nothing about the hosts.
            guard !Task.isCancelled else { return .undecided }
            switch await check(index) {
            case .fits: return .found(index)
            case .doesNotFit(let what): reasons.append("\(names[index]) \(what)")
            case .slow:
                undecided = true
                reasons.append("\(names[index]) did not answer in time")
            case .failed(let error):
                lastError = error
                reasons.append("\(names[index]): \(error.reason ?? error.description)")
            }
        }
        if undecided { return .undecided }
        // One host, any server: its own error, as before there were host lists.
        if choice.count == 1, !choice.asksServer, let lastError { return .refused(lastError) }
        let wanted = choice.wanted == .any ? "answers" : "accepts writes"
        return .refused(.databaseUnavailable(path: store, reason: "no host \(wanted): " + reasons.joined(separator: "; ")))
    }

    private enum Check: Sendable { case fits, doesNotFit(String), slow, failed(TokenStoreError) }

    private func check(_ index: Int) async -> Check {
        let direct = directs[index], choice = self.choice, logger = self.logger.withLevelAtLeast(.error)
        do {
            return try await PostgresFailure.withDeadline(statementTimeout) {
                let connection = try await PostgresConnection.connect(configuration: direct, id: index, logger: logger)
                guard choice.asksServer else {
                    try? await connection.close()
                    return Check.fits
                }
                let answer: (String, Bool)?
                do {
                    let rows = try await connection.query("SELECT current_setting('transaction_read_only'), pg_is_in_recovery()",
                                                          logger: logger).collect()
                    answer = try rows.first?.decode((String, Bool).self)
                } catch {
                    try? await connection.close()
                    throw error
                }
                try? await connection.close()
                guard let (readOnly, inRecovery) = answer else { return Check.doesNotFit("gave no answer to what it is") }
                if choice.fits(readOnly: readOnly == "on", inRecovery: inRecovery) { return Check.fits }
                return Check.doesNotFit(inRecovery ? "is a standby (read-only)" : "is read-only")
            }
        } catch is PostgresFailure.DeadlinePassed {
            return .slow
        } catch where Task.isCancelled {
            return .slow
        } catch {
            return .failed(PostgresFailure.storeError(error, store: store, statementTimeout: statementTimeout))
        }
    }
}
