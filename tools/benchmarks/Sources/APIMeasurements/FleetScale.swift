// A dispatch host's agent (issue 32): 100,000 subjects stored and named in a subjects file.
//
// - Start-up: exec to `GET /readyz` answering 200 (every configured subject holding a usable
//   token), on a store already holding fresh tokens for all of them; the median of a few starts.
// - Memory: VmRSS once the agent has served each subject once and settled for two seconds.
// - Idle CPU: the agent's CPU time over `idleSeconds` with nothing due (every token fresh for an
//   hour), against the wall time, in percent of one core; the agent run as the Debian package's
//   systemd unit runs it (a notify socket: READY=1, STATUS= kept current, the watchdog).
// - A readiness probe: `GET /readyz` (200) on that idle agent, one after another; the median
//   time to its answer, and the agent's CPU time per probe (what a probe every few seconds, as
//   kubelet or a load balancer sends, adds to the idle figure).
// - The status listing: ten pages of `GET /v1/subjects?limit=1000`, each after the one before;
//   the median time to a whole page.
// - A Prometheus scrape: `GET /metrics`, ten in turn; the median time to the whole answer.
// - Memory of the binary the Debian package ships (when given: the gateway's static agent),
//   reported beside the goal's figure: the same store, flags and subjects, each served once.
//
// The same agent flags as the 10,000-subject figures in main.swift; the token provider is the
// development issuer, which must not be asked for anything (counted).

import BenchmarkSupport
import DevTokenIssuer
import FleetTokenStore
import Foundation
#if canImport(Glibc)
import Glibc
#endif

struct FleetScaleSettings {
    var subjects = 100_000
    var startups = 3
    var idleSeconds: Double = 30
}

func readinessRequest() -> [UInt8] {
    Array("GET /readyz HTTP/1.1\r\nHost: localhost\r\n\r\n".utf8)
}

func measureFleetScale(agentPath: String, staticAgentPath: String?, issuer: DevTokenIssuer, scratch: String,
                       settings: FleetScaleSettings) async throws -> [String: Any] {
    var results: [String: Any] = [:]
    let label = settings.subjects == 100_000 ? "100k" : "\(settings.subjects)"
    let directory = scratch + "/fleet-\(settings.subjects)"
    try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
    let keys = vehicleKeys(settings.subjects, prefix: "f")
    let (db, subjects) = try await seededStore(keys, in: directory)
    let socket = directory + "/agent.sock"
    let arguments = ["--db", db, "--listen", "unix:" + socket, "--subjects-file", subjects,
                     "--provider-url", issuer.urlTemplate, "--no-proxy", "--allow", "vehicle:*", "--log-level", "warning"]
    let issuedBefore = issuer.issuedCount

    var startups: [Double] = []
    for _ in 0..<settings.startups {
        unlink(socket)
        let start = monotonicNanoseconds()
        let agent = try Child(agentPath, arguments, log: directory + "/agent-startup.log")
        defer { agent.stop() }
        _ = try waitUntilServing(socket, readinessRequest(), child: agent)
        startups.append(Double(monotonicNanoseconds() - start) / 1e9)
    }
    results["agent_startup_\(label)_seconds"] = rounded(median(startups))
    results["agent_startup_\(label)_seconds_each"] = startups.map { rounded($0) }

    // The rest runs as the Debian package's unit does (Type=notify, WatchdogSec=30s): a notify
    // socket standing for systemd's, so the agent keeps its STATUS= line and watchdog going.
    unlink(socket)
    let notify = try NotifySocket(path: directory + "/notify.sock")
    defer { notify.stop() }
    let agent = try Child(agentPath, arguments, log: directory + "/agent.log",
                          environment: ["NOTIFY_SOCKET": notify.path, "WATCHDOG_USEC": "30000000"])
    defer { agent.stop() }
    let connection = try waitUntilServing(socket, readinessRequest(), child: agent)
    results.merge(try await residentAfterServingEach(keys, of: agent, on: connection, run: "the \(label) memory run",
                                                     suffix: "\(label)_tracked")) { $1 }

    let (cpuBefore, wallBefore) = (agent.cpuSeconds(), monotonicNanoseconds())
    try await Task.sleep(for: .seconds(settings.idleSeconds))
    let cpu = agent.cpuSeconds() - cpuBefore
    let wall = Double(monotonicNanoseconds() - wallBefore) / 1e9
    results["idle_cpu_percent_\(label)_tracked"] = rounded(cpu / wall * 100)
    // The agent told the stand-in service manager it was ready: the figure is of a notify unit.
    guard notify.messages["READY", default: 0] == 1 else {
        throw MeasurementError("the \(label) agent sent READY=1 \(notify.messages["READY", default: 0]) times to the notify socket (expected once)")
    }
    // Every token was fresh: a fetch would mean the figures measured something else.
    let fetches = issuer.issuedCount - issuedBefore
    results["agent_fetches_\(label)_tracked"] = fetches
    guard fetches == 0 else { throw MeasurementError("the \(label) agent fetched \(fetches) tokens although every stored token was fresh") }
    // A connection of its own: the agent closed the first one, idle for longer than its 30 s.
    guard let probes = try Connection(unixPath: socket) else { throw MeasurementError("the \(label) agent's socket refused a connection") }
    results.merge(try readinessProbeFigures(of: agent, on: probes, label: label)) { $1 }
    results.merge(try subjectsPageFigures(on: probes, label: label)) { $1 }
    results.merge(try metricsScrapeFigures(on: probes, label: label)) { $1 }
    agent.stop()

    // The binary a dispatch host installs from the package: linked statically, so no shared
    // Swift libraries are mapped, and by the package's link. Its memory beside the goal's figure.
    if let staticAgentPath {
        unlink(socket)
        let shipped = try Child(staticAgentPath, arguments, log: directory + "/agent-static.log")
        defer { shipped.stop() }
        let connection = try waitUntilServing(socket, readinessRequest(), child: shipped)
        results.merge(try await residentAfterServingEach(keys, of: shipped, on: connection,
                                                         run: "the \(label) memory run of the static agent",
                                                         suffix: "\(label)_tracked_static")) { $1 }
        let fetches = issuer.issuedCount - issuedBefore
        guard fetches == 0 else { throw MeasurementError("the static \(label) agent fetched \(fetches) tokens although every stored token was fresh") }
    }
    return results
}

/// Sends `request` on `connection` `count` times, one after another, each required to answer
/// 200 (`what` names it in the error): the time to each whole answer, in milliseconds.
func timedExchanges(_ request: [UInt8], on connection: Connection, count: Int, what: String) throws -> [Double] {
    var times: [Double] = []
    for _ in 0..<count {
        let start = monotonicNanoseconds()
        let status = try connection.exchange(request)
        times.append(Double(monotonicNanoseconds() - start) / 1e6)
        guard status == 200 else { throw MeasurementError("\(what) answered \(status)") }
    }
    return times
}

/// `probes` readiness probes on `connection`, one after another: the median time to a 200, and
/// the agent's CPU time per probe (the clock ticks of `/proc/PID/stat` over all of them).
func readinessProbeFigures(of agent: Child, on connection: Connection, label: String, probes: Int = 50) throws -> [String: Any] {
    let cpuBefore = agent.cpuSeconds()
    let times = try timedExchanges(readinessRequest(), on: connection, count: probes, what: "GET /readyz on the idle \(label) agent")
    let cpuMilliseconds = (agent.cpuSeconds() - cpuBefore) * 1000 / Double(probes)
    return ["readyz_ms_\(label)": rounded(median(times), 2), "readyz_cpu_ms_\(label)": rounded(cpuMilliseconds, 2)]
}

/// `scrapes` Prometheus scrapes (`GET /metrics`, 200) on `connection`, one after another: the
/// median time to a whole answer.
func metricsScrapeFigures(on connection: Connection, label: String, scrapes: Int = 10) throws -> [String: Any] {
    let request = Array("GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n".utf8)
    let times = try timedExchanges(request, on: connection, count: scrapes, what: "GET /metrics on the \(label) agent")
    return ["metrics_scrape_ms_\(label)": rounded(median(times), 2)]
}

/// The first `pages` pages of `GET /v1/subjects?limit=1000` on `connection`, each after the last
/// subject of the one before (as its Link header says): the median time to a whole page.
func subjectsPageFigures(on connection: Connection, label: String, pages: Int = 10) throws -> [String: Any] {
    var times: [Double] = []
    var after = ""
    for _ in 0..<pages {
        let request = Array("GET /v1/subjects?limit=1000\(after) HTTP/1.1\r\nHost: localhost\r\nFleet-Token-Request: true\r\n\r\n".utf8)
        let start = monotonicNanoseconds()
        let page = try connection.fetch(request)
        times.append(Double(monotonicNanoseconds() - start) / 1e6)
        guard page.status == 200,
              let link = page.head.split(separator: "\r\n").first(where: { $0.lowercased().hasPrefix("link:") }),
              let range = link.range(of: "&after=") else {
            throw MeasurementError("GET /v1/subjects?limit=1000\(after) answered \(page.status) without a next link on the \(label) agent")
        }
        after = "&after=" + link[range.upperBound...].prefix { $0 != ">" }
    }
    return ["subjects_page_ms_\(label)": rounded(median(times), 2)]
}
