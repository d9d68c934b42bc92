// What the agent tells systemd (through FleetTokenService.SystemdNotifier): READY=1 once every
// configured subject has a usable token or has failed its first attempt, STATUS= with counts
// as they change, WATCHDOG=1 from the engine's scheduler loop, STOPPING=1 on shutdown.

import FleetTokenService
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

    init(_ statuses: [SubjectStatus]) {
        total = statuses.count
        for status in statuses {
            counts[status.state, default: 0] += 1
            if status.isUsable || status.failure != nil { settled += 1 }
        }
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

/// Sends READY=1 when the configured subjects have settled, keeps STATUS= current, and
/// STOPPING=1 when the service group shuts down. Listed after the engine, so it stops first.
struct ServiceManagerReports: Service {
    let engine: TokenSyncEngine
    let notifier: SystemdNotifier
    let subjects: ConfiguredSubjects
    let logger: Logger
    /// How often STATUS= is brought up to date between events.
    var statusInterval: Duration = .seconds(5)

    func run() async {
        // A service that returns early ends the whole group: without systemd, wait for the end.
        guard notifier.isEnabled else {
            try? await gracefulShutdown()
            return
        }
        if let interval = notifier.watchdogInterval {
            let notifier = self.notifier
            await engine.setHeartbeat(every: interval) { notifier.watchdog() }
        }
        await withTaskGroup(of: Void.self) { group in
            group.addTask { await report() }
            try? await gracefulShutdown()
            notifier.stopping()
            group.cancelAll()
        }
    }

    /// READY=1 as soon as the subjects settle (checked every 200 ms until then), then STATUS=
    /// whenever the counts change (checked every ``statusInterval``).
    private func report() async {
        var ready = false
        var lastStatus = ""
        while !Task.isCancelled {
            let counts = SubjectCounts(subjects.current.map { engine.status(of: $0) })
            let status = counts.description
            if !ready && counts.isSettled {
                ready = true
                lastStatus = status
                notifier.ready(status: status)
                logger.info("told the service manager the agent is ready", metadata: ["status": "\(status)"])
            } else if ready && status != lastStatus {
                lastStatus = status
                notifier.status(status)
            }
            do { try await Task.sleep(for: ready ? statusInterval : .milliseconds(200)) } catch { return }
        }
    }
}

extension ServiceManagerReports: CustomStringConvertible {
    /// ServiceLifecycle's log lines name services by their description.
    var description: String { "ServiceManagerReports(notify: \(notifier.isEnabled))" }
}
