// Service layer: when a token API connection counts as idle, decided with plain values. Kept by
// the held-token handler, which sees every request and answer (Hummingbird's connection state
// handler no longer sees the requests answered from memory, so its timer is off).

import NIOCore

/// Hummingbird's idle rule for one HTTP/1 connection: idle once no request has been in
/// progress, and nothing has been read, for the timeout; a request read whole and waiting for
/// its answer is never idle, a request still being read is idle once its parts stop coming.
struct ConnectionIdleRule: Equatable {
    /// What to do when the idle check's time comes.
    enum Check: Equatable {
        /// Idle for the whole timeout: close the connection.
        case close
        /// Not yet: check again at this time.
        case checkAgain(at: NIODeadline)
        /// An answer is being made: check again once it has gone (``answered(now:)``).
        case waitForAnswer
    }

    let timeout: TimeAmount
    /// When a part of a request was last read or the last answer ended.
    private(set) var lastActive: NIODeadline
    /// A request's head has come and its end not yet.
    private(set) var beingRead = false
    /// Requests whose head has come and whose answer has not ended.
    private(set) var inProgress = 0

    /// A rule for a connection active since `now`.
    init(timeout: TimeAmount, now: NIODeadline) {
        self.timeout = timeout
        self.lastActive = now
    }

    /// When to check first, for a connection active since `now`.
    func firstCheck() -> NIODeadline { lastActive + timeout }

    /// A part of a request came at `now`.
    mutating func read(head: Bool = false, end: Bool = false, now: NIODeadline) {
        lastActive = now
        if head {
            beingRead = true
            inProgress += 1
        }
        if end { beingRead = false }
    }

    /// A request's answer ended at `now`: when to check next, or nil while every request in
    /// progress has been read whole and waits for its answer (the answer's end checks again).
    mutating func answered(now: NIODeadline) -> NIODeadline? {
        inProgress = max(0, inProgress - 1)
        if inProgress == 0 {
            lastActive = now
            return now + timeout
        }
        // A request still being read behind the one answered: idle once its parts stop coming,
        // even though an earlier check waited for this answer and stopped.
        return beingRead ? lastActive + timeout : nil
    }

    /// The decision at `now`, when a check's time came.
    func check(now: NIODeadline) -> Check {
        if !beingRead, inProgress > 0 { return .waitForAnswer }
        let due = lastActive + timeout
        return now >= due ? .close : .checkAgain(at: due)
    }
}
