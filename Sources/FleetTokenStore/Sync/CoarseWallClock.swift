// Sync layer: the engine's default wall clock, the kernel's coarse real-time clock.

public import Foundation
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

extension TokenSyncEngine {
    /// The engine's default wall clock: the kernel's coarse real-time clock where there is one.
    ///
    /// Every token hand-out reads the wall clock, and on Linux a precise read
    /// (`CLOCK_REALTIME`) was a measurable share of a fresh hit. Expiry decisions have margins
    /// of minutes (soft point, floor), so the coarse clock's resolution of a few milliseconds
    /// changes no decision. Elsewhere this is `Date()`.
    public static let coarseWallClock: @Sendable () -> Date = {
        #if os(Linux)
        var spec = timespec()
        if clock_gettime(CLOCK_REALTIME_COARSE, &spec) == 0 {
            // Relative to Date's own reference date, and nanoseconds by multiplication: a
            // division was most of this function's time on the hit path (profiled).
            return Date(timeIntervalSinceReferenceDate: Double(spec.tv_sec - 978_307_200) + Double(spec.tv_nsec) * 1e-9)
        }
        #endif
        return Date()
    }
}
