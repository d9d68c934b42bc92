import Foundation
import Synchronization

/// Starts child processes one at a time across the whole test process.
///
/// Foundation's `Process.run()` on Linux crashed once in `memcpy` (inside `run()`) while
/// four tokenctl loops spawned processes from several threads at once in a full run. Spawning
/// takes about a millisecond, so serialising it costs nothing and leaves the processes
/// themselves running in parallel.
public enum ProcessLaunch {
    private static let lock = Mutex(())

    /// Runs `process` (`Process.run()`) while no other test thread is starting one.
    /// - Throws: what `Process.run()` throws.
    public static func run(_ process: Process) throws {
        try lock.withLock { _ in try process.run() }
    }
}
