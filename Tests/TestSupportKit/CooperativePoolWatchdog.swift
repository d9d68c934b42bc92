// Reports when Swift's cooperative pool stops running tasks. On a 2-core machine the pool has two
// threads: two tests blocking one each (a process waited for, a sleep, a synchronous pg_ctl)
// stall every other test in the process, and a timing bound somewhere else fails with nothing
// to say why. The watchdog turns that into a line in the test output, and, with
// FTS_STALL_DUMP=DIR and gdb installed, a dump of every thread's stack taken during the stall.

import Foundation
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// Measures, from a thread of its own, how long a task just enqueued waits before it runs.
public enum CooperativePoolWatchdog {
    /// A stall at least this long is reported.
    public static let threshold: Duration = .seconds(2)

    /// Stalls seen so far in this process: when each began and how long it lasted.
    public static var stalls: [(began: Date, seconds: Double)] { state.withLock { $0.stalls } }

    private struct State {
        var started = false
        var stalls: [(began: Date, seconds: Double)] = []
    }

    private static let state = Mutex(State())

    /// Starts the watchdog once per process; later calls do nothing.
    public static func start() {
        let first = state.withLock { state -> Bool in
            defer { state.started = true }
            return !state.started
        }
        guard first else { return }
        let thread = Thread { watch() }
        thread.name = "cooperative-pool-watchdog"
        thread.start()
    }

    private static func watch() {
        let clock = ContinuousClock()
        while true {
            let ran = Atomic<Bool>(false)
            let sent = clock.now
            let began = Date()
            Task.detached { ran.store(true, ordering: .releasing) }
            var dumped = false
            while !ran.load(ordering: .acquiring) {
                usleep(20_000)
                if !dumped, clock.now - sent >= threshold {
                    dumped = true
                    report("cooperative pool stalled: a task enqueued at \(stamp(began)) has not run after \(threshold)")
                    dumpStacks()
                }
            }
            let waited = clock.now - sent
            if waited >= threshold {
                let seconds = Double(waited.components.seconds) + Double(waited.components.attoseconds) / 1e18
                state.withLock { $0.stalls.append((began, seconds)) }
                report("cooperative pool stalled for \(String(format: "%.1f", seconds)) s from \(stamp(began))")
            }
            usleep(100_000)
        }
    }

    private static func report(_ line: String) {
        FileHandle.standardError.write(Data("[watchdog] \(line)\n".utf8))
    }

    private static func stamp(_ date: Date) -> String {
        let formatter = DateFormatter()
        formatter.dateFormat = "HH:mm:ss.SSS"
        formatter.timeZone = TimeZone(identifier: "UTC")
        return formatter.string(from: date)
    }

    /// With FTS_STALL_DUMP=DIR, gdb attaches to this process and writes every thread's stack.
    private static func dumpStacks() {
        guard let directory = ProcessInfo.processInfo.environment["FTS_STALL_DUMP"], !directory.isEmpty,
              FileManager.default.isExecutableFile(atPath: "/usr/bin/gdb") else { return }
        let file = "\(directory)/stall-\(getpid())-\(Int(Date().timeIntervalSince1970)).txt"
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/gdb")
        process.arguments = ["-p", String(getpid()), "-batch", "-ex", "thread apply all bt 25"]
        guard FileManager.default.createFile(atPath: file, contents: nil), let output = FileHandle(forWritingAtPath: file) else { return }
        process.standardOutput = output
        process.standardError = output
        do {
            try process.run()
            process.waitUntilExit()
            report("thread stacks during the stall: \(file)")
        } catch {
            report("gdb failed: \(error)")
        }
        try? output.close()
    }
}
