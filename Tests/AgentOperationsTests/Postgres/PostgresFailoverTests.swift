// Issue 30 item 2: a PostgreSQL primary fails over to its streaming standby while three real
// token-agent processes serve 200 keys of 10 s tokens on the two-host URL
// (`postgres://fleet@127.0.0.1:P1,127.0.0.1:P2/db`, read-write by default). The primary is
// stopped with `pg_ctl stop -m immediate` (a crash) and the standby promoted; the agents must
// find it without a restart. The standby is stopped before the crash while the agents keep
// writing, so the promoted standby really misses the old primary's last committed writes (the
// test counts them and requires some). Every process is stopped by its pid; both clusters are removed.

import Foundation
import Synchronization
import Testing
import TestSupportKit
#if canImport(Glibc)
import Glibc
#endif

@Suite("PostgreSQL failover to a promoted standby", .paced, .serialized, .exclusive, .enabled(if: PostgresServer.testsEnabled))
struct PostgresFailoverTests {
    @Test("primary crashes, standby promoted: three token-agents on the two-host URL keep serving, find the new primary, resume writes and single flight; tokenctl follows")
    func agentsFollowThePromotion() async throws {
        let primary = try await PostgresServer.make()
        defer { primary.stopInBackground() }
        try await primary.createDatabase("failover")
        let standby = try await primary.makeStandby()
        defer { standby.stopInBackground() }
        #expect(try standby.isInRecovery(), "the standby is not in recovery")

        let scratch = Scratch()
        let lifetime = 10.0
        let floor = min(30, 0.1 * lifetime)
        let issuer = try await IssuerProcess(scratch: scratch, lifetime: Int(lifetime))
        defer { issuer.process.signal(SIGTERM) }
        let (ids, subjects) = try PostgresReplicaTests.truckSubjects(200, in: scratch)
        // Both hosts, the primary first; one CA signed both servers' certificates.
        let url = "postgres://fleet@127.0.0.1:\(primary.port),127.0.0.1:\(standby.port)/failover"
            + "?sslmode=verify-full&sslrootcert=\(primary.caFile)"
        let environment = ["PGPASSWORD": primary.password]

        var agents: [PostgresReplicaTests.ServingReplica] = []
        defer { for agent in agents { agent.process.signal(SIGTERM) } }
        for index in 0..<3 {
            let socket = scratch.file("api-\(index).sock"), sink = scratch.file("sink-\(index)")
            let process = try AgentFixture.launch(["--db", url, "--provider-url", issuer.template, "--subjects-file", subjects,
                                                   "--listen", "unix:\(socket)", "--log-level", "info"],
                                                  environment: environment, in: scratch)
            agents.append(.init(process: process, socket: socket, sink: sink))
        }
        for agent in agents {
            try #require(await agent.process.waitForOutput("token API listening", within: 30), "\(agent.process.stderr.suffix(2000))")
        }
        let validSQL = "SELECT count(*) FROM fleet_token_store.tokens WHERE token IS NOT NULL "
            + "AND expires_at > extract(epoch from now()) + \(floor)"
        try #require(await eventually(within: 40) { (try? primary.psql(validSQL, database: "failover")) == "200" },
                     "the 200 keys were not all stored within 40 s: \(agents.map { $0.process.stderr.suffix(1000) })")

        let callers = Callers(agents, ids: ids, floor: floor, scratch: scratch)
        defer { callers.stop() }
        // A lifetime of steady refreshing before the crash.
        try await Task.sleep(for: .seconds(lifetime))
        #expect(callers.completedRounds >= 3, "the callers asked only \(callers.completedRounds) rounds before the crash")

        // Lose writes for real: the standby stops (fast) while the agents keep writing to the
        // primary (replication is asynchronous, so the primary does not wait), the primary then
        // crashes, and the standby comes back with only what it had and is promoted.
        try await standby.shutDown(mode: .fast)
        // Refreshes come in bursts (every key was first fetched at once): wait for writes the
        // standby cannot have, committed on the primary after it stopped (not a fixed time,
        // which fell between bursts in 3 of 5 runs and lost nothing).
        let standbyStopped = Date().timeIntervalSince1970
        let committedSince = "SELECT count(*) FROM fleet_token_store.tokens WHERE fetched_at > \(standbyStopped)"
        let wroteMore = await eventually(within: 2 * lifetime) { (Int((try? primary.psql(committedSince, database: "failover")) ?? "") ?? 0) >= 5 }
        #expect(wroteMore, "the agents committed fewer than 5 tokens on the primary within \(2 * lifetime) s of the standby's stop")
        // The old primary's rows just before its crash: a later issued_at than the new primary's is a lost committed write.
        let onOldPrimary = try await Self.issuedAt(primary)
        let stopped = Date().timeIntervalSince1970
        try await primary.shutDown(mode: .immediate)
        try await standby.start()
        try await standby.promote()
        let promoted = Date().timeIntervalSince1970
        // What the new primary holds at promotion: a later issue of the key was lost with the old one.
        let atPromotion = try await Self.issuedAt(standby)
        let lostCommitted = Set(ids.filter { (onOldPrimary[$0] ?? 0) > (atPromotion[$0] ?? 0) })
        #expect(!lostCommitted.isEmpty, "no committed write was lost with the old primary: the test did not exercise a lost write")

        // Writes resume: a token fetched after the promotion reaches the new primary.
        let written = "SELECT count(*) FROM fleet_token_store.tokens WHERE fetched_at > \(promoted)"
        let resumed = await eventually(within: 60) { (Int((try? standby.psql(written, database: "failover")) ?? "") ?? 0) > 0 }
        let resumedAfter = Date().timeIntervalSince1970 - promoted
        #expect(resumed && resumedAfter < 10, "no write reached the promoted standby within \(String(format: "%.1f", resumedAfter)) s of the promotion: \(agents.map { Self.warnings($0.process.stderr) })")

        // Two and a half lifetimes on the new primary, then every key valid there.
        try await Task.sleep(for: .seconds(2.5 * lifetime))
        let allValid = (try? await standby.psql(validSQL, database: "failover")) ?? "?"
        #expect(allValid == "200", "\(allValid) of 200 keys valid on the new primary")
        let (rounds, problems) = await callers.finish()
        #expect(rounds >= 20, "only \(rounds) caller rounds")
        #expect(problems.isEmpty, "\(problems.count) API answers were errors while the caller's token was still valid, or tokens below the floor: \(problems.prefix(10)); crash at \(String(format: "%.2f", stopped)), promotion at \(String(format: "%.2f", promoted)); \(agents.map { Self.warnings($0.process.stderr) })")

        // Fetches: two issues of a key closer than a lifetime allows are a second fetch for one lifetime.
        let times = try await issuer.issuedTimes()
        let window = (from: stopped, to: promoted + 10)
        var lostWrite: [String] = [], inOutage: [String] = [], broken: [String] = []
        var lostWriteExtra: [String: Int] = [:]
        var lostKeys = lostCommitted
        for id in ids {
            let issued = (times["vehicle/\(id)"] ?? []).sorted()
            let lastBeforeStop = issued.last { $0 < stopped }
            // The dev issuer's iat is whole seconds of the issue. Also lost: an issue whose write was
            // in flight at the crash, or committed after the snapshot above.
            let lost = lostCommitted.contains(id) || (lastBeforeStop.map { ($0.rounded(.down)) > (atPromotion[id] ?? 0) + 0.5 } ?? false)
            if lost { lostKeys.insert(id) }
            for (earlier, gap) in IssuerProcess.refetchesTooSoon(issued, lifetime: lifetime) {
                let later = earlier + gap
                let what = "\(id): \(String(format: "%.2f", gap)) s apart at +\(String(format: "%.1f", later - promoted)) s from the promotion"
                // A lost key's second fetch once the new primary serves, after its last issue
                // before the promotion, counts against the lost write: at most one. Those while no
                // host takes writes are the outage's, below, as are two agents' fetches of it
                // both after the promotion, before they found the new primary (a lost key was
                // once fetched at +0.9 s by two agents 0.07 s apart, and counted twice here).
                if lost && earlier >= (lastBeforeStop ?? stopped) && earlier < promoted && later > promoted {
                    lostWrite.append(what)
                    lostWriteExtra[id, default: 0] += 1
                } else if later >= window.from && later <= window.to {
                    inOutage.append(what)
                } else {
                    broken.append(what)
                }
            }
        }
        let total = times.values.map(\.count).reduce(0, +)
        let extra = lostWrite.count + inOutage.count + broken.count
        let perLifetime = Double(total) / Double(max(1, total - extra))
        let apartFromExcused = Double(total - lostWrite.count - inOutage.count) / Double(max(1, total - extra))
        #expect(lostWriteExtra.values.allSatisfy { $0 <= 1 }, "a key whose last write was lost was fetched again more than once: \(lostWriteExtra.filter { $0.value > 1 }) in \(lostWrite)")
        #expect(broken.isEmpty, "\(broken.count) second fetches for one lifetime outside the failover (single flight broken, or not resumed within 10 s of the promotion): \(broken.prefix(10)); \(agents.map { Self.warnings($0.process.stderr) })")
        #expect(apartFromExcused == 1, "fetches per key per lifetime apart from lost writes and the failover window: \(apartFromExcused)")

        // tokenctl on the same URL finds the new primary.
        let list = try await runToEnd("tokenctl", ["list", "--db", url], environment: environment, in: scratch)
        #expect(list.status == 0 && list.stdout.contains("truck-199"), "tokenctl list: \(list.status) \(list.stdout.suffix(500)) \(list.stderr)")
        #expect(list.stderr.isEmpty || !list.stderr.contains(primary.password))

        for (index, agent) in agents.enumerated() {
            let log = agent.process.stderr
            #expect(agent.process.isRunning, "agent \(index) exited: \(log.suffix(2000))")
            #expect(log.contains("token database moved to another host") && log.contains("127.0.0.1:\(standby.port)"),
                    "agent \(index) did not log its move to the standby: \(log.suffix(3000))")
            #expect(!log.contains(primary.password) && !agent.process.stdout.contains(primary.password), "agent \(index) printed the password")
        }
        print("failover: \(lostCommitted.count) keys lost their last committed write with the old primary "
              + "(\(lostKeys.count) with in-flight ones), \(lostWriteExtra.count) of them fetched again (at most once each: "
              + "\(lostWriteExtra.values.max() ?? 0) max)")
        print("failover: writes resumed \(String(format: "%.1f", resumedAfter)) s after the promotion; \(total) tokens issued; "
              + "second fetches: \(lostWrite.count) for lost writes (\(lostWriteExtra.count) keys), \(inOutage.count) in the failover window "
              + "(fetched without a lease while the store was down), \(broken.count) elsewhere; fetches per key per lifetime "
              + "\(String(format: "%.3f", perLifetime)) overall, \(String(format: "%.3f", apartFromExcused)) apart from those; "
              + "\(rounds) caller rounds; first in-window: \(inOutage.prefix(3))")

        for agent in agents { agent.process.signal(SIGTERM) }
        for agent in agents { #expect(await agent.process.wait(upTo: 15) == 0, "\(agent.process.stderr.suffix(2000))") }
    }

    /// The warnings and errors an agent logged (the last ones), for failure messages.
    private static func warnings(_ log: String) -> String {
        log.split(separator: "\n").filter { $0.contains("warning") || $0.contains("error") || $0.contains("notice") }.suffix(12).joined(separator: "\n")
    }

    /// issued_at by vehicle id on `server`.
    private static func issuedAt(_ server: PostgresServer) async throws -> [String: Double] {
        let rows = try await server.psql("SELECT subject_id || ' ' || issued_at FROM fleet_token_store.tokens WHERE token IS NOT NULL", database: "failover")
        var result: [String: Double] = [:]
        for row in rows.split(separator: "\n") {
            let fields = row.split(separator: " ")
            if fields.count == 2, let value = Double(fields[1]) { result[String(fields[0])] = value }
        }
        return result
    }

    /// API callers: one agent a round (in turn), every key, through its token API. A failed
    /// answer is a problem when the last token that caller got for the key was still valid;
    /// a token below the floor always is.
    final class Callers: Sendable {
        private let stopFlag = EndFlag()
        private let rounds = Counter()
        private final class Counter: Sendable { let value = Atomic<Int>(0) }
        private let task: Task<(rounds: Int, problems: [String]), Never>

        var completedRounds: Int { rounds.value.load(ordering: .relaxed) }

        init(_ agents: [PostgresReplicaTests.ServingReplica], ids: [String], floor: Double, scratch: Scratch) {
            let curl = executable(["/usr/bin/curl", "/usr/local/bin/curl"])
            let stopFlag = stopFlag, rounds = rounds
            task = Task {
                var count = 0
                var problems: [String] = []
                var lastExpiry: [String: Double] = [:]
                while !stopFlag.isSet {
                    let index = count % agents.count
                    let agent = agents[index]
                    let asked = Date().timeIntervalSince1970
                    let served = await PostgresReplicaTests.servedTokens(ids, socket: agent.socket, sink: agent.sink, curl: curl, scratch: scratch)
                    for id in ids {
                        let key = "\(index)/\(id)"
                        switch served[id] ?? .failure(PostgresReplicaTests.Problem("no answer")) {
                        case .failure(let why):
                            if let exp = lastExpiry[key], exp > asked + floor {
                                problems.append("agent \(index) \(id) at \(String(format: "%.2f", asked)): \(why) (its last token had \(String(format: "%.1f", exp - asked)) s left)")
                            }
                        case .success(let token):
                            let exp = PostgresReplicaTests.claim("exp", of: token) ?? 0
                            lastExpiry[key] = exp
                            if exp < asked + floor {
                                problems.append("agent \(index) \(id) at \(String(format: "%.2f", asked)): a token \(String(format: "%.2f", exp - asked)) s from expiry")
                            }
                        }
                    }
                    count += 1
                    rounds.value.add(1, ordering: .relaxed)
                    try? await Task.sleep(for: .milliseconds(200))
                }
                return (count, problems)
            }
        }

        func finish() async -> (rounds: Int, problems: [String]) {
            stopFlag.set()
            return await task.value
        }

        func stop() { stopFlag.set() }
    }
}
