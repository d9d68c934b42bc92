// `--once`: what is printed for a subject left without a token, and in particular for one whose
// backoff, persisted by an earlier run, still runs: that earlier attempt's failure, when it was,
// when the next attempt is, and how to retry now.

import FleetTokenStore
import Foundation

/// A subject `--once` could not serve, as text (stderr) and as an object of the `--json` array.
struct OnceFailureReport: Equatable {
    let key: TokenKey
    /// What failed, with the agent's hint.
    let message: String
    /// The whole error as the agent words it (what is printed when this run made the attempt).
    let described: String
    /// The provider error's kind (`tlsCertificate`, `httpStatus`, ...), when the provider failed.
    let errorKind: String?
    /// Failures in a row, when known.
    let failures: Int?
    /// When the failure reported happened.
    let failedAt: Date?
    /// When the next attempt is due, if one is.
    let nextAttemptAt: Date?
    /// No attempt was made by this run: the failure is an earlier attempt's (an earlier run's,
    /// or another process's) whose backoff still runs.
    let earlierAttempt: Bool
    /// The command that clears the backoff, so the next run tries at once (earlier attempts only).
    let retryNow: String?

    /// The report of `error` for a run that began at `started` (the engine's wall clock), given
    /// what memory holds for the subject (`failure`) and the store as tokenctl is to be pointed
    /// at it (`storeArgument`, already quoted for a shell).
    init(_ error: TokenUnavailable, failure: RefreshFailureState?, started: Date, storeArgument: String) {
        key = error.key
        let reason = error.reason
        // A failure recorded before this run began was not this run's attempt.
        earlierAttempt = reason.code == .provider && (failure.map { $0.lastFailureAt < started } ?? false)
        if earlierAttempt, let failure {
            // As the attempt that failed recorded it (the engine knows it only from the store).
            let text = failure.lastErrorMessage ?? failure.lastErrorKind
            message = OperatorHints.hint(forKind: failure.lastErrorKind).map { "\(text) (\($0))" } ?? text
        } else {
            message = reason.providerError.map { OperatorHints.describe($0) }
                ?? reason.storeError.map { OperatorHints.describe($0) } ?? reason.description
        }
        described = OperatorHints.describe(error)
        errorKind = reason.code == .provider ? failure?.lastErrorKind ?? reason.providerError?.kind : nil
        failures = failure?.consecutiveFailures
        failedAt = failure?.lastFailureAt
        nextAttemptAt = error.nextAttemptAt ?? failure?.nextAttemptAt
        retryNow = earlierAttempt
            ? "tokenctl --db \(storeArgument) purge \(Self.selector(for: error.key)) --include-failures" : nil
    }

    /// One line for stderr.
    func text(now: Date) -> String {
        guard earlierAttempt, let failedAt, let retryNow else { return described }
        let next = nextAttemptAt.map { "; next attempt at \($0.formatted(.iso8601)) (\(RelativeTime.describe($0, now: now)))" } ?? ""
        let ago = failedAt > now.addingTimeInterval(-0.5) ? "just now" : RelativeTime.describe(failedAt, now: now)
        return "no usable token for \(key): not tried now, an earlier attempt still backs off: it failed at "
            + "\(failedAt.formatted(.iso8601)) (\(ago)): \(message)\(next). "
            + "A changed provider configuration is tried at once; to retry now with this one, clear the backoff: \(retryNow)"
    }

    /// The object of the `--json` array (string values, as the served subjects' objects).
    var object: [String: String] {
        var object = ["kind": key.kind.rawValue, "id": key.subjectID, "error": message,
                      "attempt": earlierAttempt ? "earlier" : "now"]
        object["error_kind"] = errorKind
        object["failures"] = failures.map(String.init)
        object["failed_at"] = failedAt.map { $0.formatted(.iso8601) }
        object["next_attempt_at"] = nextAttemptAt.map { $0.formatted(.iso8601) }
        object["retry_now"] = retryNow
        return object
    }

    /// tokenctl's selector for `key`, the id quoted for a shell.
    static func selector(for key: TokenKey) -> String {
        let flag = switch key.kind {
        case .vehicle: "--vehicle"
        case .trip: "--trip"
        case .deliveryVehicle: "--delivery-vehicle"
        case .task: "--task"
        }
        return "\(flag) \(shellQuoted(key.subjectID))"
    }

    /// `text` as one shell word: as is when it is plainly safe, else in single quotes.
    static func shellQuoted(_ text: String) -> String {
        let plain = text.unicodeScalars.allSatisfy { $0.isASCII && (CharacterSet.alphanumerics.contains($0) || "-_./:@%+=,".unicodeScalars.contains($0)) }
        return plain && !text.isEmpty ? text : "'" + text.replacingOccurrences(of: "'", with: #"'\''"#) + "'"
    }
}
