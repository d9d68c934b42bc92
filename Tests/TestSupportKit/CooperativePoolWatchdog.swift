// Reports when Swift's cooperative pool, or one of NIO's shared event loops, stops running
// work. On a 2-core machine the pool has two threads: two tests blocking one each (a process
// waited for, a sleep, a synchronous pg_ctl) stall every other test in the process, and a timing
// bound somewhere else fails with nothing to say why. An event loop blocked or kept busy stalls
// every connection it carries (postgres-nio's, AsyncHTTPClient's, the tests' servers') the same
// way. The watchdog turns either into a line in the test output, and, with FTS_STALL_DUMP=DIR and
// gdb installed, a dump of every thread's stack taken during the stall.

import Foundation
import NIOCore
import NIOPosix
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// Measures, from a thread of its own, how long work just handed to the cooperative pool and to
/// each of NIO's shared event loops waits before it runs.
public enum CooperativePoolWatchdog {
    /// A stall at least this long is reported.
    public static let threshold: Duration = .seconds(2)

    private static let started = Mutex(false)

    /// Starts the watchdog once per process; later calls do nothing.
    public static func start() {
        let first = started.withLock { started -> Bool in
            defer { started = true }
            return !started
        }
        guard first else { return }
        let thread = Thread { watch() }
        thread.name = "cooperative-pool-watchdog"
        thread.start()
    }

    /// Something the watchdog hands work to: the cooperative pool, or one event loop.
    private struct Executor: Sendable {
        let name: String
        let submit: @Sendable (@escaping @Sendable () -> Void) -> Void
    }

    private static let executors: [Executor] = {
        var executors = [Executor(name: "cooperative pool") { job in Task.detached { job() } }]
        for (index, loop) in MultiThreadedEventLoopGroup.singleton.makeIterator().enumerated() {
            executors.append(Executor(name: "NIO's shared event loop \(index)") { job in loop.execute(job) })
        }
        return executors
    }()

    private final class Probe: Sendable {
        let ran = Atomic<Bool>(false)
    }

    private static func watch() {
        let clock = ContinuousClock()
        while true {
            let sent = clock.now
            let began = Date()
            let probes = executors.map { executor in
                let probe = Probe()
                executor.submit { probe.ran.store(true, ordering: .releasing) }
                return probe
            }
            var waited: [Duration?] = probes.map { _ in nil }
            var dumped = false
            while waited.contains(where: { $0 == nil }) {
                usleep(20_000)
                for (index, probe) in probes.enumerated() where waited[index] == nil && probe.ran.load(ordering: .acquiring) {
                    waited[index] = clock.now - sent
                }
                let late = executors.indices.filter { waited[$0] == nil }
                if !dumped, !late.isEmpty, clock.now - sent >= threshold {
                    dumped = true
                    for index in late {
                        report("\(executors[index].name) stalled: work handed to it at \(stamp(began)) has not run after \(threshold)")
                    }
                    dumpStacks()
                }
            }
            for (index, time) in waited.enumerated() {
                guard let time, time >= threshold else { continue }
                let seconds = Double(time.components.seconds) + Double(time.components.attoseconds) / 1e18
                report("\(executors[index].name) stalled for \(String(format: "%.1f", seconds)) s from \(stamp(began))")
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
