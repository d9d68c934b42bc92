// Bounded state (issue 26): memory an agent takes for subjects nobody keeps asking for comes
// back, and a tracked subject's hit stays fast while others flood the API.
//
// A release token-agent with a few configured vehicles, `--allow 'trip:*'`, the cap on subjects
// asked for through patterns raised to 30,000 (`--max-dynamic-subjects`, so every one of the
// load's subjects is held, at once, at the end of the load: the stronger test of memory coming
// back than 503s past the default 10,000), a short idle window (`--idle-window`) and tokens of a
// short lifetime from the development issuer, so an untracked subject is dropped at its first
// soft point (0.75 to 0.8 of the lifetime after its fetch) rather than refreshed for 10 minutes.
//
// 1. Warm-up: the same load, a few hundred of each request, then wait until the agent holds only
//    its configured subjects again; VmRSS then is the baseline (one-time allocations, the
//    connections' buffers, SQLite's page cache, the server's threads are in it).
// 2. Load: 30,000 `POST /v1/invalidate/trip/unknown-N` and 30,000 `GET /v1/token/trip/dyn-N`
//    over a few connections, while another connection GETs a configured vehicle's token every
//    millisecond or so and records each latency (the p99 of those is the figure, goal < 50 ms).
//    Every GET must answer 200 and every invalidate 204. One more new subject right after the
//    load must be refused with 503: all 30,000 were held then.
// 3. Idle: poll `GET /v1/subjects` until only the configured subjects are left (bounded by a
//    deadline), wait 10 s (two of the agent's checks for a large drop, which then frees SQLite's
//    caches and trims malloc's arenas: tools/token-agent/Sources/token-agent/IdleMemoryRelease.swift), read VmRSS:
//    the figure is that over the baseline (goal ≤ 1.10).

import BenchmarkSupport
import DevTokenIssuer
import Foundation
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

struct BoundedStateSettings {
    /// Invalidates of unknown ids, and GETs of distinct pattern-allowed ids.
    var invalidates = 30_000
    var gets = 30_000
    /// Requests of each kind in the warm-up.
    var warmUp = 300
    var getConnections = 4
    var invalidateConnections = 2
    /// Configured (tracked) vehicles.
    var configured = 8
    /// Token lifetime: long enough that the load ends before the first soft point (0.75 of it),
    /// so all subjects are held at once.
    var lifetime: TimeInterval = 120
    /// The agent's --idle-window.
    var idleWindow: TimeInterval = 10
    /// Pause between two probe GETs of the configured vehicle, in microseconds.
    var probePauseMicroseconds: UInt32 = 1000
    /// Seconds to wait after the warm-up's subjects are dropped before reading the baseline.
    var settleSeconds: Double = 3
    /// Seconds to wait after the last dynamic subject is dropped before reading VmRSS: two of
    /// the agent's checks for a large drop (IdleMemoryRelease, every 5 s), which then frees the
    /// store's caches and trims malloc's arenas.
    var idleSettleSeconds: Double = 10
    /// Extra arguments for the agent (an experiment, e.g. a tuning flag).
    var extraAgentArguments: [String] = []
    /// A diagnosis, not part of the figure (`--bounded-diagnose`): gdb attaches to the agent after
    /// the baseline's reading to call malloc_stats() (into the agent's log), and after the last
    /// reading to call malloc_stats() and malloc_trim(0), and VmRSS is read again: how much of
    /// what did not come back is free memory glibc keeps.
    var diagnoseWithGDB = false
    /// A diagnosis, not part of the figure (`--bounded-heaptrack`, with `--keep-scratch`):
    /// heaptrack attaches to the agent after the baseline's reading and records every allocation
    /// from then on; after the last reading the agent is killed (SIGKILL: a graceful shutdown
    /// would free what is to be found), so heaptrack's "leaked" figures are what the load left
    /// allocated: `heaptrack_print --print-leaks 1 bounded-state/heaptrack.*`.
    var heaptrack = false
}

/// The status counts of one kind of request in a load run.
struct LoadOutcome {
    var seconds: Double = 0
    /// When the last GET's and the last invalidate's answers came, seconds from the start.
    var getsDoneSeconds: Double = 0
    var invalidatesDoneSeconds: Double = 0
    var getStatuses: [Int: Int] = [:]
    var invalidateStatuses: [Int: Int] = [:]
}

func invalidateRequest(_ kind: String, _ id: String) -> [UInt8] {
    Array("POST /v1/invalidate/\(kind)/\(id) HTTP/1.1\r\nHost: localhost\r\nFleet-Token-Request: true\r\nContent-Length: 0\r\n\r\n".utf8)
}

/// Sends `gets` GETs of `trip/<getPrefix>N` over `getConnections` connections and `invalidates`
/// invalidates of `trip/<invalidatePrefix>N` over `invalidateConnections`, each connection with
/// one request outstanding and the next sent as soon as its answer is in (one thread, poll).
func driveLoad(_ socket: String, gets: Int, getPrefix: String, getConnections: Int,
               invalidates: Int, invalidatePrefix: String, invalidateConnections: Int) throws -> LoadOutcome {
    var connections: [(connection: Connection, isGet: Bool)] = []
    for index in 0..<(getConnections + invalidateConnections) {
        guard let connection = try Connection(unixPath: socket) else { throw MeasurementError("cannot connect to \(socket)") }
        connections.append((connection, index < getConnections))
    }
    var nextGet = 0
    var nextInvalidate = 0
    func nextRequest(isGet: Bool) -> [UInt8]? {
        if isGet {
            guard nextGet < gets else { return nil }
            defer { nextGet += 1 }
            return tokenRequest("trip", "\(getPrefix)\(nextGet)")
        }
        guard nextInvalidate < invalidates else { return nil }
        defer { nextInvalidate += 1 }
        return invalidateRequest("trip", "\(invalidatePrefix)\(nextInvalidate)")
    }
    var outcome = LoadOutcome()
    var descriptors = connections.map { pollfd(fd: $0.connection.descriptor, events: Int16(POLLIN), revents: 0) }
    var active = [Bool](repeating: false, count: connections.count)
    let start = monotonicNanoseconds()
    for (index, entry) in connections.enumerated() {
        if let request = nextRequest(isGet: entry.isGet) {
            try entry.connection.send(request)
            active[index] = true
        } else {
            descriptors[index].fd = -1
        }
    }
    var outstanding = active.filter { $0 }.count
    while outstanding > 0 {
        let ready = poll(&descriptors, nfds_t(descriptors.count), 30_000)
        guard ready > 0 else { throw MeasurementError("no answer for 30 s during the bounded-state load") }
        for index in descriptors.indices where descriptors[index].revents != 0 {
            descriptors[index].revents = 0
            let (connection, isGet) = connections[index]
            guard try connection.readSome() else { throw MeasurementError("the agent closed a connection during the bounded-state load") }
            while let response = try connection.bufferedResponse() {
                connection.discard(response.total)
                if isGet { outcome.getStatuses[response.status, default: 0] += 1 } else { outcome.invalidateStatuses[response.status, default: 0] += 1 }
                if let request = nextRequest(isGet: isGet) {
                    try connection.send(request)
                } else {
                    let done = Double(monotonicNanoseconds() - start) / 1e9
                    if isGet { outcome.getsDoneSeconds = max(outcome.getsDoneSeconds, done) } else { outcome.invalidatesDoneSeconds = max(outcome.invalidatesDoneSeconds, done) }
                    // Done: out of the poll set, where the server's idle timeout (30 s) would
                    // otherwise end it as an error while the others still run.
                    active[index] = false
                    descriptors[index].fd = -1
                    outstanding -= 1
                }
            }
        }
    }
    outcome.seconds = Double(monotonicNanoseconds() - start) / 1e9
    return outcome
}

/// GETs one token on its own connection and thread, a pause between requests, recording each
/// exchange's latency until stopped.
final class LatencyProbe: @unchecked Sendable {
    private let stopRequested = Atomic<Bool>(false)
    private let finished = DispatchSemaphore(value: 0)
    // Written by the probe's thread only, read after `finished`.
    private var samples: [UInt64] = []
    private var non200 = 0
    private var failure: String?

    /// Starts the probe's thread on a connection of its own.
    init(socket: String, request: [UInt8], pauseMicroseconds: UInt32) {
        samples.reserveCapacity(200_000)
        let thread = Thread { [self] in
            defer { finished.signal() }
            do {
                guard let connection = try Connection(unixPath: socket) else { throw MeasurementError("cannot connect to \(socket)") }
                while !stopRequested.load(ordering: .relaxed) {
                    let start = monotonicNanoseconds()
                    let status = try connection.exchange(request)
                    samples.append(monotonicNanoseconds() - start)
                    if status != 200 { non200 += 1 }
                    if pauseMicroseconds > 0 { usleep(pauseMicroseconds) }
                }
            } catch {
                failure = "\(error)"
            }
        }
        thread.stackSize = 1 << 20
        thread.start()
    }

    /// Stops the probe and returns its latencies (nanoseconds, sorted) and non-200 answers.
    func stop() throws -> (sorted: [UInt64], non200: Int) {
        stopRequested.store(true, ordering: .relaxed)
        finished.wait()
        if let failure { throw MeasurementError("the latency probe failed: \(failure)") }
        return (samples.sorted(), non200)
    }
}

/// The subjects the agent lists (at most `limit`), as (kind/id, tracked).
func listedSubjects(_ connection: Connection, limit: Int) throws -> [(key: String, tracked: Bool)] {
    let request = Array("GET /v1/subjects?limit=\(limit) HTTP/1.1\r\nHost: localhost\r\nFleet-Token-Request: true\r\n\r\n".utf8)
    let answer = try connection.fetch(request)
    guard answer.status == 200, let list = try JSONSerialization.jsonObject(with: Data(answer.body)) as? [[String: Any]] else {
        throw MeasurementError("GET /v1/subjects answered \(answer.status): \(String(decoding: answer.body.prefix(300), as: UTF8.self))")
    }
    return list.map { ("\($0["kind"] ?? "")/\($0["id"] ?? "")", ($0["tracked"] as? Bool) ?? false) }
}

/// Polls `GET /v1/subjects` every second until the agent lists only its `configured` tracked
/// subjects; returns the seconds that took. Fails after `timeout` seconds.
func waitUntilOnlyConfigured(_ connection: Connection, configured: Int, agent: Child, timeout: Double) throws -> Double {
    let start = monotonicNanoseconds()
    let deadline = start + UInt64(timeout * 1e9)
    var listed = 0
    while monotonicNanoseconds() < deadline {
        guard agent.isRunning else { throw MeasurementError("the agent exited:\n\(agent.logTail)") }
        let subjects = try listedSubjects(connection, limit: configured + 1)
        listed = subjects.count
        if subjects.count <= configured && subjects.allSatisfy(\.tracked) {
            return Double(monotonicNanoseconds() - start) / 1e9
        }
        usleep(1_000_000)
    }
    throw MeasurementError("the agent still held more than its \(configured) configured subjects (\(listed) listed) \(timeout) s after the load")
}

/// Runs the bounded-state measurement on a fresh agent; returns its figures (keys prefixed
/// `bounded_state_`).
func measureBoundedState(agentPath: String, scratch: String, settings: BoundedStateSettings) async throws -> [String: Any] {
    var issuerConfiguration = DevTokenIssuer.Configuration()
    issuerConfiguration.lifetime = settings.lifetime
    let issuer = try await DevTokenIssuer.start(issuerConfiguration, logger: quietLogger)
    do {
        let results = try await measureBoundedState(agentPath: agentPath, scratch: scratch, settings: settings, issuer: issuer)
        await issuer.stop()
        return results
    } catch {
        await issuer.stop()
        throw error
    }
}

private func measureBoundedState(agentPath: String, scratch: String, settings: BoundedStateSettings,
                                 issuer: DevTokenIssuer) async throws -> [String: Any] {
    var results: [String: Any] = [:]
    let directory = scratch + "/bounded-state"
    try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
    let socket = directory + "/agent.sock"
    let vehicles = (0..<settings.configured).map { "bs-\($0)" }
    let arguments = ["--db", directory + "/tokens.sqlite", "--listen", "unix:" + socket, "--provider-url", issuer.urlTemplate,
                     "--no-proxy", "--allow", "trip:*", "--log-level", "warning",
                     "--max-dynamic-subjects", String(settings.gets), "--idle-window", String(settings.idleWindow)]
        + vehicles.flatMap { ["--vehicle", $0] } + settings.extraAgentArguments
    let agent = try Child(agentPath, arguments, log: directory + "/agent.log")
    defer { agent.stop() }
    let probeRequest = tokenRequest("vehicle", vehicles[0])
    let warmControl = try waitUntilServing(socket, probeRequest, child: agent)
    for id in vehicles { _ = try warmControl.exchange(tokenRequest("vehicle", id)) }
    // The longest wait for dynamic subjects to go: a soft point is at most 0.8 of the lifetime
    // after the fetch; a minute more for a slow machine.
    let dropTimeout = settings.lifetime * 0.8 + settings.idleWindow + 60

    // 1. Warm-up: every kind of request, then back to only the configured subjects.
    for _ in 0..<settings.warmUp { _ = try warmControl.exchange(probeRequest) }
    let warm = try driveLoad(socket, gets: settings.warmUp, getPrefix: "warm-", getConnections: settings.getConnections,
                             invalidates: settings.warmUp, invalidatePrefix: "warm-unknown-", invalidateConnections: settings.invalidateConnections)
    guard warm.getStatuses.keys.allSatisfy({ $0 == 200 }), warm.invalidateStatuses.keys.allSatisfy({ $0 == 204 }) else {
        throw MeasurementError("unexpected answers in the bounded-state warm-up: GET \(warm.getStatuses), invalidate \(warm.invalidateStatuses)")
    }
    results["bounded_state_warm_up_drop_seconds"] = rounded(
        try waitUntilOnlyConfigured(warmControl, configured: vehicles.count, agent: agent, timeout: dropTimeout), 1)
    try await Task.sleep(for: .seconds(settings.settleSeconds))
    let baseline = agent.residentKiB()
    if settings.diagnoseWithGDB {
        // The baseline's arenas, first in the agent's log (malloc_stats() writes to its stderr).
        _ = try output(of: "/usr/bin/gdb", ["-p", String(agent.pid), "-batch", "-ex", "call (void) malloc_stats()"], scratch: directory)
    }
    var heaptrack: Child?
    if settings.heaptrack {
        heaptrack = try Child("/usr/bin/heaptrack", ["-p", String(agent.pid), "-o", directory + "/heaptrack"], log: directory + "/heaptrack.log")
        // Attaching injects the recorder through gdb: wait until it says it is recording.
        let deadline = monotonicNanoseconds() + 60_000_000_000
        while !((try? String(contentsOfFile: directory + "/heaptrack.log", encoding: .utf8)) ?? "").contains("injection finished"),
              monotonicNanoseconds() < deadline { usleep(100_000) }
        try await Task.sleep(for: .seconds(3))
    }

    // 2. The load, with the probe on a connection of its own.
    let fetchesBefore = issuer.issuedCount
    let probe = LatencyProbe(socket: socket, request: probeRequest, pauseMicroseconds: settings.probePauseMicroseconds)
    let load: LoadOutcome
    do {
        load = try driveLoad(socket, gets: settings.gets, getPrefix: "dyn-", getConnections: settings.getConnections,
                             invalidates: settings.invalidates, invalidatePrefix: "unknown-", invalidateConnections: settings.invalidateConnections)
    } catch {
        _ = try? probe.stop()
        throw error
    }
    let (latencies, probeNon200) = try probe.stop()
    let afterLoad = agent.residentKiB()
    guard load.getStatuses.keys.allSatisfy({ $0 == 200 }), load.invalidateStatuses.keys.allSatisfy({ $0 == 204 }),
          load.getStatuses[200, default: 0] == settings.gets, load.invalidateStatuses[204, default: 0] == settings.invalidates,
          probeNon200 == 0 else {
        throw MeasurementError("unexpected answers in the bounded-state load: GET \(load.getStatuses), invalidate \(load.invalidateStatuses), probe non-200 \(probeNon200)")
    }
    // A new control connection: the first was idle through the load, past the API's idle timeout.
    guard let control = try Connection(unixPath: socket) else { throw MeasurementError("cannot connect to \(socket)") }
    // One subject more than the cap: refused while all 30,000 are held.
    let extra = try control.exchange(tokenRequest("trip", "dyn-extra"))
    results["bounded_state_all_held_after_load"] = extra == 503
    results["bounded_state_extra_subject_status"] = extra
    results["bounded_state_fetches_during_load"] = issuer.issuedCount - fetchesBefore

    // 3. Idle: the dynamic subjects go at their soft points, past the idle window.
    let dropSeconds = try waitUntilOnlyConfigured(control, configured: vehicles.count, agent: agent, timeout: dropTimeout)
    try await Task.sleep(for: .seconds(settings.idleSettleSeconds))
    let afterIdle = agent.residentKiB()
    guard agent.isRunning else { throw MeasurementError("the agent exited:\n\(agent.logTail)") }
    if settings.diagnoseWithGDB {
        let gdb = try output(of: "/usr/bin/gdb", ["-p", String(agent.pid), "-batch", "-ex", "call (void) malloc_stats()",
                                                  "-ex", "call (int) malloc_trim(0)"], scratch: directory)
        let trimmed = agent.residentKiB()
        results["bounded_state_diagnosis_rss_mib_after_malloc_trim"] = rounded(Double(trimmed.current) / 1024, 2)
        results["bounded_state_diagnosis_anonymous_mib_after_malloc_trim"] = rounded(Double(trimmed.anonymous) / 1024, 2)
        note("gdb: \(gdb.split(separator: "\n").suffix(3).joined(separator: " | "))")
        note("malloc_stats() is in \(directory)/agent.log")
    }

    if let heaptrack {
        kill(agent.pid, SIGKILL)
        let deadline = monotonicNanoseconds() + 300_000_000_000
        while heaptrack.isRunning, monotonicNanoseconds() < deadline { usleep(100_000) }
        note("heaptrack: \(directory)/heaptrack.log; heaptrack_print --print-leaks 1 \(directory)/heaptrack.*")
    }

    func percentile(_ p: Double) -> Double {
        guard !latencies.isEmpty else { return .nan }
        let index = min(latencies.count - 1, Int((Double(latencies.count) * p).rounded(.up)) - 1)
        return Double(latencies[max(0, index)]) / 1e6
    }
    func mib(_ kib: Int) -> Double { rounded(Double(kib) / 1024, 2) }
    results["bounded_state_rss_after_idle_vs_baseline"] = rounded(Double(afterIdle.current) / Double(baseline.current))
    results["bounded_state_get_p99_ms_under_load"] = rounded(percentile(0.99))
    results["bounded_state_get_p50_ms_under_load"] = rounded(percentile(0.50))
    results["bounded_state_get_p999_ms_under_load"] = rounded(percentile(0.999))
    results["bounded_state_get_max_ms_under_load"] = rounded(percentile(1.0))
    results["bounded_state_probe_gets"] = latencies.count
    results["bounded_state_rss_mib"] = ["baseline": mib(baseline.current), "after_load": mib(afterLoad.current), "after_idle": mib(afterIdle.current)]
    results["bounded_state_rss_anonymous_mib"] = ["baseline": mib(baseline.anonymous), "after_load": mib(afterLoad.anonymous), "after_idle": mib(afterIdle.anonymous)]
    results["bounded_state_rss_files_mib"] = ["baseline": mib(baseline.files), "after_load": mib(afterLoad.files), "after_idle": mib(afterIdle.files)]
    results["bounded_state_peak_rss_mib"] = mib(afterIdle.peak)
    results["bounded_state_load_seconds"] = rounded(load.seconds, 1)
    results["bounded_state_load_seconds_gets_invalidates"] = [rounded(load.getsDoneSeconds, 1), rounded(load.invalidatesDoneSeconds, 1)]
    results["bounded_state_drop_seconds_after_load"] = rounded(dropSeconds, 1)
    results["bounded_state_setup"] = [
        "invalidates": settings.invalidates, "gets": settings.gets, "get_connections": settings.getConnections,
        "invalidate_connections": settings.invalidateConnections, "configured_vehicles": settings.configured,
        "token_lifetime_seconds": settings.lifetime, "idle_window_seconds": settings.idleWindow,
        "max_dynamic_subjects": settings.gets, "warm_up_requests_each": settings.warmUp,
        "probe_pause_microseconds": Int(settings.probePauseMicroseconds),
    ] as [String: Any]
    return results
}
