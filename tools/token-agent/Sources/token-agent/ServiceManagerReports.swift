// What the agent tells systemd (through TokenAgentRuntime's SystemdNotifier): READY=1 once every
// configured subject has a usable token or has failed its first attempt, STATUS= with counts
// as they change, WATCHDOG=1 from the engine's scheduler loop, STOPPING=1 on shutdown.

import FleetTokenService
import TokenAgentRuntime
import FleetTokenStore
import Logging
import ServiceLifecycle
import Synchronization

/// The subjects the agent is configured for, as the latest reload left them.
final class ConfiguredSubjects: Sendable {
    private let keys: Mutex<[TokenKey]>

    init(_ keys: [TokenKey]) { self.keys = Mutex(keys) }

    var current: [TokenKey] {
        get { keys.withLock { $0 } }
        set { keys.withLock { $0 = newValue } }
    }
}

/// Counts of configured subjects by state, as systemd's STATUS= shows them: `12 valid, 1 backoff`.
struct SubjectCounts: Equatable, CustomStringConvertible {
    var counts: [SubjectStatus.State: Int] = [:]
    /// Subjects with a usable token or a failed attempt: READY=1 waits for all of them.
    var settled = 0
    var total = 0

    /// Counts of `standings`.
    init(_ standings: [SubjectStanding]) {
        for standing in standings { add(standing) }
    }

    /// Counts of `keys` as `engine` holds them now (one pass over its memory, no I/O).
    init(of keys: [TokenKey], in engine: TokenSyncEngine) {
        engine.forEachStanding(among: keys) { _, standing in add(standing) }
    }

    /// Counts one more subject.
    mutating func add(_ standing: SubjectStanding) {
        total += 1
        counts[standing.state, default: 0] += 1
        if standing.isUsable || standing.failure != nil { settled += 1 }
    }

    var isSettled: Bool { settled == total }

    var description: String {
        let order: [SubjectStatus.State] = [.valid, .refreshDue, .backoff, .unavailable]
        let parts = order.compactMap { state in counts[state].map { "\($0) \(Self.word(state))" } }
        return parts.isEmpty ? "no subjects" : parts.joined(separator: ", ")
    }

    private static func word(_ state: SubjectStatus.State) -> String {
        switch state {
        case .valid: "valid"
        case .refreshDue: "refresh due"
        case .backoff: "backoff"
        case .unavailable: "unavailable"
        }
    }
}

/// How long the service manager's reporter pauses between two counts of the subjects: 200 ms
/// until READY=1, then the status interval; but never less than a multiple of what the last
/// count took, so that counting stays a bounded share of a core whatever the number of subjects.
/// A count reads every configured subject's standing (33 to 46 ms at 100,000 on a 2-core VM):
/// every 5 s, that alone was about 1% of a core in an agent with nothing due. The pauses are
/// capped: a count stretched by a stalled machine (a paused VM, a preempted thread) must not
/// leave `STATUS=` stale for many minutes, or hold `READY=1` back.
struct StatusPacing: Equatable {
    /// The pause once READY=1 went out (the reporter's ``ServiceManagerReports/statusInterval``).
    var statusInterval: Duration
    /// The pause while waiting for the subjects to settle.
    var settlingInterval: Duration = .milliseconds(200)
    /// The shortest pause after a count, in counts' durations, once ready: at most 0.2% of a core.
    static let readyShare = 500
    /// The same while waiting for READY=1, when the sooner matters more: at most 5% of a core.
    static let settlingShare = 20
    /// The longest pause once ready (unless the status interval is longer).
    static let longestReadyPause: Duration = .seconds(60)
    /// The longest pause while waiting for READY=1.
    static let longestSettlingPause: Duration = .seconds(2)

    /// The pause after a count that took `counting`.
    func pause(afterCountingFor counting: Duration, ready: Bool) -> Duration {
        ready ? max(statusInterval, min(counting * Self.readyShare, Self.longestReadyPause))
            : max(settlingInterval, min(counting * Self.settlingShare, Self.longestSettlingPause))
    }
}

/// What systemd has been told, shared by the reporter and the reloader: READY=1 goes out once
/// (after that a reload is framed by RELOADING=1 and READY=1), and STATUS= is re-sent whenever
/// what was last sent differs from the counts.
final class ServiceManagerState: Sendable {
    let notifier: SystemdNotifier
    private let state = Mutex<(ready: Bool, lastStatus: String)>((false, ""))

    init(notifier: SystemdNotifier) { self.notifier = notifier }

    /// The reporter's turn: READY=1 with the counts once they settle, then STATUS= on change.
    /// Returns true when this call sent READY=1.
    func update(_ counts: SubjectCounts) -> Bool {
        let status = counts.description
        let (ready, changed) = state.withLock { state -> (Bool, Bool) in
            if !state.ready && counts.isSettled {
                state = (true, status)
                return (true, false)
            }
            guard state.ready && state.lastStatus != status else { return (false, false) }
            state.lastStatus = status
            return (false, true)
        }
        if ready { notifier.ready(status: status) }
        if changed { notifier.status(status) }
        return ready
    }

    /// RELOADING=1, when READY=1 went out already (a reload during start-up says nothing: the
    /// first READY=1 still waits for the subjects). Returns whether it was sent.
    func reloading() -> Bool {
        guard state.withLock({ $0.ready }) else { return false }
        state.withLock { $0.lastStatus = "reloading" }
        notifier.reloading(status: "reloading")
        return true
    }

    /// READY=1 with `status` after a reload announced by ``reloading()``.
    func reloaded(status: String) {
        state.withLock { $0.lastStatus = status }
        notifier.ready(status: status)
    }
}

/// Sends READY=1 when the configured subjects have settled, keeps STATUS= current, and
/// STOPPING=1 when the service group shuts down. Listed after the engine, so it stops first.
struct ServiceManagerReports: Service {
    let engine: TokenSyncEngine
    let state: ServiceManagerState
    let subjects: ConfiguredSubjects
    let logger: Logger
    /// How often STATUS= is brought up to date between events.
    var statusInterval: Duration = .seconds(5)

    var notifier: SystemdNotifier { state.notifier }
    /// The shortest heartbeat: a tiny WATCHDOG_USEC must not make the scheduler loop spin.
    static let shortestHeartbeat: Duration = .milliseconds(20)

    func run() async {
        // A service that returns early ends the whole group: without systemd, wait for the end.
        guard notifier.isEnabled else {
            try? await gracefulShutdown()
            return
        }
        if let interval = notifier.watchdogInterval {
            let notifier = self.notifier
            await engine.setHeartbeat(every: max(interval, Self.shortestHeartbeat)) { notifier.watchdog() }
        }
        await withTaskGroup(of: Void.self) { group in
            group.addTask { await report() }
            try? await gracefulShutdown()
            notifier.stopping()
            group.cancelAll()
        }
    }

    /// READY=1 as soon as the subjects settle (checked every 200 ms until then), then STATUS=
    /// whenever the counts change (checked every ``statusInterval``), each pause lengthened as
    /// ``StatusPacing`` says when counting takes long.
    private func report() async {
        var ready = false
        let clock = ContinuousClock()
        let pacing = StatusPacing(statusInterval: statusInterval)
        while !Task.isCancelled {
            let started = clock.now
            if state.update(SubjectCounts(of: subjects.current, in: engine)) {
                ready = true
                logger.info("told the service manager the agent is ready")
            }
            do { try await Task.sleep(for: pacing.pause(afterCountingFor: clock.now - started, ready: ready)) } catch { return }
        }
    }
}

extension ServiceManagerReports: CustomStringConvertible {
    /// ServiceLifecycle's log lines name services by their description.
    var description: String { "ServiceManagerReports(notify: \(notifier.isEnabled))" }
}
