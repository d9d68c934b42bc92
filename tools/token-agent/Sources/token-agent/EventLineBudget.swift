// token-agent: how many event lines stdout gets. journald keeps 10,000 messages of a unit in
// 30 s by default (RateLimitBurst=, RateLimitIntervalSec=; times 1 to 6 by its free disk space)
// and drops the rest until the interval ends, stderr's warnings included; a 100,000-subject start
// printed a `reused` line per subject, and a first start a `refreshed` line per subject.

import Foundation
import ServiceLifecycle
import Synchronization

/// At most ``limit`` event lines in a window of ``window`` seconds (a limit of 0: no limit).
/// Past it, lines are counted by event instead, and the window's count is reported once it
/// ends. Pure: every time is given.
struct EventLineBudget: Sendable, Equatable {
    /// Most lines in one window; 0 lets every line through.
    let limit: Int
    /// The window's length, in seconds: it starts with the first line after the last one ended.
    let window: TimeInterval
    /// When the current window started; nil before the first line and after a report.
    private(set) var windowStart: Date?
    /// Lines printed in the current window.
    private(set) var printed = 0
    /// Lines withheld in the current window, by event (`reused`, `refreshed`, `failed`, …).
    private(set) var withheld: [String: Int] = [:]

    /// A budget of `limit` lines (0: no limit) per `window` seconds.
    init(limit: Int, window: TimeInterval) {
        self.limit = limit
        self.window = window
    }

    /// What a window withheld: how many lines of each event, from when until when.
    struct Withheld: Sendable, Equatable {
        let counts: [String: Int]
        let since: Date
        let until: Date
        var total: Int { counts.values.reduce(0, +) }
    }

    /// What happens to lines offered at once.
    struct Admission: Sendable, Equatable {
        /// The report of a window that ended with lines withheld, to print before anything else.
        var ended: Withheld?
        /// How many of the lines may be printed (the first ones); the rest are counted.
        var allowed: Int
        /// Set when these lines are the window's first withheld ones: the end of the window,
        /// to say after the allowed lines that more are counted until then.
        var withholdingUntil: Date?
    }

    /// `count` lines of event `name` at `now`.
    mutating func admit(_ count: Int, of name: String, at now: Date) -> Admission {
        guard limit > 0, count > 0 else { return Admission(ended: nil, allowed: count, withholdingUntil: nil) }
        var admission = Admission(ended: nil, allowed: 0, withholdingUntil: nil)
        if windowStart.map({ now >= $0 + window }) ?? true {
            admission.ended = report(endingAt: now)
            reset(startingAt: now)
        }
        let start = windowStart ?? now
        admission.allowed = min(count, limit - printed)
        printed += admission.allowed
        if count > admission.allowed {
            if withheld.isEmpty { admission.withholdingUntil = start + window }
            withheld[name, default: 0] += count - admission.allowed
        }
        return admission
    }

    /// The report of the window that has ended by `now` with lines withheld (the next line
    /// starts a new window); nil while it lasts or when it withheld nothing.
    mutating func due(at now: Date) -> Withheld? {
        guard let start = windowStart, now >= start + window else { return nil }
        defer { reset(startingAt: nil) }
        return report(endingAt: now)
    }

    /// The report of what the current window has withheld so far, at `now` (the agent stops):
    /// nil when nothing was.
    mutating func remaining(at now: Date) -> Withheld? {
        defer { reset(startingAt: nil) }
        return report(endingAt: now)
    }

    /// A new window from `start` (nil: from the next line), nothing printed or withheld in it.
    private mutating func reset(startingAt start: Date?) {
        (windowStart, printed, withheld) = (start, 0, [:])
    }

    /// What the current window withheld, reported at `end` or at the window's end if earlier.
    private func report(endingAt end: Date) -> Withheld? {
        guard let start = windowStart, !withheld.isEmpty else { return nil }
        return Withheld(counts: withheld, since: start, until: min(end, start + window))
    }
}

/// The event lines' budget, shared by every writer of the running agent's stdout (the event
/// printer, the `reused` blocks of start-up and reloads, reload summaries and
/// ``EventLineReports``). Every line is written under its lock, so a window's report is never
/// written among the next window's lines, and no line lands inside another writer's block.
final class EventLineGate: Sendable {
    private let budget: Mutex<EventLineBudget>

    /// A gate of `limit` lines (0: no limit) per `window` seconds.
    init(limit: Int, window: TimeInterval) {
        budget = Mutex(EventLineBudget(limit: limit, window: window))
    }

    /// The limit and window in force.
    var settings: (limit: Int, window: TimeInterval) {
        budget.withLock { ($0.limit, $0.window) }
    }

    /// Runs `body` with the budget, under the lock (`body` writes the lines it admits).
    func withBudget<R>(_ body: (inout EventLineBudget) -> R) -> R {
        budget.withLock { body(&$0) }
    }
}

/// Reports a window's withheld event lines when it ends, also when no later event would
/// (``EventLineBudget/due(at:)``), and what the last window withheld when the agent stops.
struct EventLineReports: Service {
    let output: AgentOutput
    /// How often a window's end is looked for: a report comes at most this late.
    var interval: Duration = .seconds(1)

    func run() async {
        await withTaskGroup(of: Void.self) { group in
            group.addTask {
                while !Task.isCancelled {
                    do { try await Task.sleep(for: interval) } catch { return }
                    output.reportWithheldLines(at: Date(), stopping: false)
                }
            }
            try? await gracefulShutdown()
            group.cancelAll()
        }
    }
}
