// Sync layer: the scheduler's liveness signal. A supervisor (systemd's watchdog) wants proof
// that the engine's loop still turns; the loop calls `beat` at least every `interval`, so an
// engine wedged in its actor stops calling it and the supervisor notices.

/// When the scheduler loop owes its next heartbeat. Plain value arithmetic on elapsed time.
struct SchedulerHeartbeat: Sendable {
    let interval: Duration
    let beat: @Sendable () -> Void
    /// Elapsed time of the last beat; nil before the first.
    private(set) var last: Duration?

    init(interval: Duration, beat: @escaping @Sendable () -> Void) {
        self.interval = interval
        self.beat = beat
    }

    /// Beats when due at `now` (elapsed time); returns how long the loop may sleep before the
    /// next one is due.
    mutating func beatIfDue(at now: Duration) -> Duration {
        if let last, now - last < interval { return interval - (now - last) }
        beat()
        last = now
        return interval
    }
}
