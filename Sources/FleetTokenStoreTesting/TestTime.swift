// Test kit layer: test time. A `ManualClock` for the engine's scheduling and a wall clock that moves
// with it, plus wall-clock steps, so a test walks through hours of refresh rules without sleeping.

public import Foundation
import Synchronization

/// Scheduling time and wall time for a `TokenSyncEngine` under test, moving together.
///
/// Pass ``clock`` and ``wall`` to the engine
/// (`TokenSyncEngine(repository:fetcher:policy:logger:clock:now:random:)`): the engine sleeps on
/// the clock and judges expiry by the wall. `advance(by:)` moves both, running
/// whatever the engine scheduled up to the new time; ``jumpWallClock(by:)`` moves only the wall
/// clock, as an NTP step or a manual change does.
///
/// ```swift
/// let time = TestTime()
/// let engine = TokenSyncEngine(repository: store, fetcher: fetcher, logger: logger,
///                              clock: time.clock, now: time.wall)
/// await time.advance(by: 2900)  // past the soft point of an hour-long token
/// ```
public final class TestTime: Sendable {
    /// The wall clock's default start, 2027-01-15T08:00:00Z: a fixed moment, so runs repeat.
    public static let defaultStart = Date(timeIntervalSince1970: 1_800_000_000)

    /// The scheduling clock to give the engine (its `clock:`). Moves only when the test
    /// advances it.
    public let clock: ManualClock
    /// The wall-clock time at which the test started.
    public let start: Date
    private let origin: ManualClock.Instant
    private let jumps = Mutex<TimeInterval>(0)

    /// Creates test time whose wall clock reads `start` until the test advances it.
    /// - Parameter start: The first wall-clock reading; a test whose provider signs with the
    ///   real clock starts at `Date()`.
    public init(start: Date = TestTime.defaultStart) {
        let clock = ManualClock()
        self.clock = clock
        self.origin = clock.now
        self.start = start
    }

    /// The wall clock now: ``start``, plus the time the clock advanced, plus every jump.
    public var now: Date {
        let elapsed = origin.duration(to: clock.now)
        let seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
        return start.addingTimeInterval(seconds + jumps.withLock { $0 })
    }

    /// The wall clock as the engine's `now:` closure.
    public var wall: @Sendable () -> Date { { [self] in self.now } }

    /// Moves the scheduling clock and the wall clock forward by `seconds` (rounded to the
    /// nearest millisecond), running every sleep that ends on the way.
    public func advance(by seconds: TimeInterval) async {
        await advance(by: .milliseconds(Int64((seconds * 1000).rounded())))
    }

    /// Moves the scheduling clock and the wall clock forward by `duration`, running every sleep
    /// that ends on the way.
    public func advance(by duration: Duration) async {
        await clock.advance(by: duration)
    }

    /// Moves only the wall clock, by `seconds` (negative: back), as an NTP step or a manual
    /// change does; scheduling time is unaffected.
    public func jumpWallClock(by seconds: TimeInterval) {
        jumps.withLock { $0 += seconds }
    }
}
