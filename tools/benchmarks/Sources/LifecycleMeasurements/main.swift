// Lifecycle figures: how long a store's close() takes, and how long an agent takes to go on
// with the refresh leases of an agent that was killed. They were bounds inside tests (close()
// under 1 s, twice; the take-over under 5 s); the tests now prove only the behaviour (close()
// does not wait for a pending check or a reader's lock; a dead process's leases are taken over,
// not waited out), and the goals live here, in ../../run. Prints one JSON object on stdout.
//
//   token-store-lifecycle-measurements --agent PATH [--rounds 5] [--takeover-rounds 3]
//
// - close() with the deferred integrity check still pending (its start delay not yet passed),
//   for each open mode that defers it (agent, adminReadWrite, migrate): the median of the rounds
//   per mode; the figure is the largest of those medians.
// - close() right after a write while another connection holds a read transaction (so a
//   checkpoint on close could not complete): the median of the rounds.
// - A release token-agent whose provider never answers holds the refresh leases of its three
//   subjects (default 30 s lease) when it is killed with SIGKILL; the figure is the median time
//   from exec to exit of `token-agent --once` for the same subjects on the same store, which
//   must take every lease over (its log says so) and exit 0. The provider of the `--once` run is
//   the in-process development issuer, on loopback.

import BenchmarkSupport
import DevTokenIssuer
import FleetTokenStore
import Foundation
import GRDBSQLite
import Logging
#if canImport(Glibc)
import Glibc
#endif

func option(_ flag: String) -> String? {
    let arguments = CommandLine.arguments
    return arguments.firstIndex(of: flag).flatMap { $0 + 1 < arguments.count ? arguments[$0 + 1] : nil }
}

func median(_ values: [Double]) -> Double {
    let sorted = values.sorted()
    return sorted.isEmpty ? 0 : sorted[sorted.count / 2]
}

func rounded(_ value: Double, _ places: Int = 3) -> Double {
    let scale = pow(10, Double(places))
    return (value * scale).rounded() / scale
}

func milliseconds(_ duration: Duration) -> Double {
    Double(duration.components.seconds) * 1000 + Double(duration.components.attoseconds) / 1e15
}

// MARK: - Raw SQLite, beside the store

/// A connection of its own on the store's file, as another process's sqlite3 would be.
final class RawConnection {
    private var handle: OpaquePointer?

    init(path: String) throws {
        guard sqlite3_open_v2(path, &handle, SQLITE_OPEN_READONLY, nil) == SQLITE_OK else {
            throw MeasurementError("cannot open \(path) read-only")
        }
        sqlite3_busy_timeout(handle, 5000)
    }

    func execute(_ sql: String) throws {
        guard sqlite3_exec(handle, sql, nil, nil, nil) == SQLITE_OK else {
            throw MeasurementError("\(sql): \(String(cString: sqlite3_errmsg(handle)))")
        }
    }

    /// The first column of the first row, as an integer (nil when there is no row).
    func integer(_ sql: String) throws -> Int? {
        var statement: OpaquePointer?
        guard sqlite3_prepare_v2(handle, sql, -1, &statement, nil) == SQLITE_OK else {
            throw MeasurementError("\(sql): \(String(cString: sqlite3_errmsg(handle)))")
        }
        defer { sqlite3_finalize(statement) }
        return sqlite3_step(statement) == SQLITE_ROW ? Int(sqlite3_column_int64(statement, 0)) : nil
    }

    deinit { sqlite3_close_v2(handle) }
}

func storedToken(_ key: TokenKey) -> StoredToken {
    let now = Date()
    return StoredToken(key: key, value: realisticJWT(for: key, issuedAt: now), expiresAt: now.addingTimeInterval(3600),
                       issuedAt: now, fetchedAt: now)
}

// MARK: - close()

/// Median close() time (ms) per open mode, with the deferred integrity check pending.
func closeWithPendingCheck(rounds: Int) async throws -> [String: Double] {
    let directory = scratchDirectory("close-pending")
    defer { try? FileManager.default.removeItem(atPath: directory) }
    let path = directory + "/tokens.sqlite"
    let seed = try SQLiteTokenRepository(path: path, logger: quietLogger)
    try await seed.upsert(storedToken(try .vehicle("v")))
    seed.close()
    var medians: [String: Double] = [:]
    for (name, mode) in [("agent", StoreOpenMode.agent), ("adminReadWrite", .adminReadWrite), ("migrate", .migrate)] {
        var times: [Double] = []
        for _ in 0..<rounds {
            let store = try SQLiteTokenRepository(path: path, mode: mode, logger: quietLogger)
            let clock = ContinuousClock()
            times.append(milliseconds(clock.measure { store.close() }))
        }
        medians[name] = rounded(median(times))
    }
    return medians
}

/// close() times (ms) right after a write, while another connection holds a read transaction.
func closeBesideReader(rounds: Int) async throws -> [Double] {
    let directory = scratchDirectory("close-reader")
    defer { try? FileManager.default.removeItem(atPath: directory) }
    let path = directory + "/tokens.sqlite"
    var times: [Double] = []
    for round in 0..<rounds {
        let store = try SQLiteTokenRepository(path: path, logger: quietLogger)
        try await store.upsert(storedToken(try .vehicle("truck-\(round)")))
        let reader = try RawConnection(path: path)
        try reader.execute("BEGIN; SELECT count(*) FROM tokens;")
        try await store.upsert(storedToken(try .vehicle("truck-\(round)-b")))
        let clock = ContinuousClock()
        times.append(rounded(milliseconds(clock.measure { store.close() })))
        try reader.execute("COMMIT;")
    }
    return times
}

// MARK: - A killed agent's leases


/// A TCP listener on loopback that never accepts: connections complete in its backlog and a
/// request sent on them is never answered, so an agent's fetch hangs until its request timeout.
final class SilentProvider {
    let descriptor: Int32
    let port: Int

    init() throws {
        let descriptor = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        self.descriptor = descriptor
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        address.sin_port = 0
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(descriptor, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard descriptor >= 0, bound == 0, listen(descriptor, 64) == 0 else { throw MeasurementError("cannot listen on 127.0.0.1") }
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(descriptor, $0, &length) }
        }
        port = Int(UInt16(bigEndian: address.sin_port))
    }

    var urlTemplate: String { "http://127.0.0.1:\(port)/token/{kind}/{id}" }

    deinit { close(descriptor) }
}

/// Seconds from exec to exit of `token-agent --once` on the leases a killed agent left.
func deadAgentTakeover(agent: String, issuer: DevTokenIssuer, silent: SilentProvider) async throws -> Double {
    let directory = scratchDirectory("takeover")
    defer { try? FileManager.default.removeItem(atPath: directory) }
    let db = directory + "/tokens.sqlite"
    let subjects = ["--vehicle", "van-1", "--vehicle", "van-2", "--trip", "trip-1"]
    let hanging = try Child(agent, ["--db", db, "--provider-url", silent.urlTemplate, "--no-proxy", "--request-timeout", "60",
                                    "--log-level", "warning"] + subjects, log: directory + "/hanging.log")
    // Every subject's lease taken (each fetch hangs): then it dies holding them.
    let deadline = Date().addingTimeInterval(60)
    var leased = 0
    while leased < 3 {
        guard Date() < deadline else {
            kill(hanging.pid, SIGKILL)
            hanging.wait()
            throw MeasurementError("the hanging agent took \(leased) of 3 leases in 60 s: \(hanging.output.suffix(2000))")
        }
        if FileManager.default.fileExists(atPath: db) {
            leased = (try? RawConnection(path: db).integer("SELECT count(*) FROM refresh_leases")).flatMap { $0 } ?? 0
        }
        if leased < 3 { try await Task.sleep(for: .milliseconds(20)) }
    }
    kill(hanging.pid, SIGKILL)
    hanging.wait()

    let started = ContinuousClock.now
    let once = try Child(agent, ["--db", db, "--provider-url", issuer.urlTemplate, "--no-proxy", "--once", "--json",
                                 "--log-level", "notice"] + subjects, log: directory + "/once.log")
    let status = once.wait()
    let seconds = milliseconds(ContinuousClock.now - started) / 1000
    let output = once.output
    let takeOvers = output.components(separatedBy: "took over the refresh lease of a process that died").count - 1
    guard status == 0, takeOvers == 3 else {
        throw MeasurementError("token-agent --once exited \(status) after taking over \(takeOvers) of 3 leases: \(output.suffix(2000))")
    }
    return seconds
}

// MARK: - Main

guard let agent = option("--agent"), FileManager.default.isExecutableFile(atPath: agent) else {
    FileHandle.standardError.write(Data("usage: token-store-lifecycle-measurements --agent PATH [--rounds 5] [--takeover-rounds 3]\n".utf8))
    exit(64)
}
let rounds = option("--rounds").flatMap(Int.init) ?? 5
let takeoverRounds = option("--takeover-rounds").flatMap(Int.init) ?? 3

do {
    var results: [String: Any] = [:]
    let pending = try await closeWithPendingCheck(rounds: rounds)
    results["close_with_pending_check_ms"] = pending.values.max() ?? 0
    results["close_with_pending_check_ms_by_mode"] = pending
    let beside = try await closeBesideReader(rounds: rounds)
    results["close_beside_reader_ms"] = median(beside)
    results["close_beside_reader_ms_each"] = beside

    let issuer = try await DevTokenIssuer.start(logger: quietLogger)
    let silent = try SilentProvider()
    var takeovers: [Double] = []
    do {
        for _ in 0..<takeoverRounds {
            takeovers.append(rounded(try await deadAgentTakeover(agent: agent, issuer: issuer, silent: silent)))
        }
    } catch {
        await issuer.stop()
        throw error
    }
    await issuer.stop()
    results["dead_agent_lease_takeover_seconds"] = median(takeovers)
    results["dead_agent_lease_takeover_seconds_each"] = takeovers
    results["dead_agent_lease_duration_seconds"] = 30
    let data = try JSONSerialization.data(withJSONObject: results, options: [.prettyPrinted, .sortedKeys])
    print(String(decoding: data, as: UTF8.self))
} catch {
    FileHandle.standardError.write(Data("token-store-lifecycle-measurements: \(error)\n".utf8))
    exit(1)
}
