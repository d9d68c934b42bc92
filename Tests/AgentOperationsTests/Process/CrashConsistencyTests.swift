// Crash consistency of the real token-agent process (issue 7, part 1): kill -9 at random
// moments while it refreshes 30 short-lived tokens from a real dev-token-server process.
//
// Soak knobs (environment variables):
//   FTS_CRASH_ROUNDS=500   kill rounds (default 25, the CI run)
//   FTS_CRASH_SEED=<n>     replay a run's kill moments and restart pauses (every run prints its
//                          seed: "crash consistency: seed ..."; process timing still varies)

import FleetTokenStoreTesting
import FleetTokenStore
import Foundation
import Testing
import TestSupportKit
#if canImport(Glibc)
import Glibc
#endif

@Suite("Crash consistency: kill -9 of a live token-agent", .paced, .serialized, .exclusive)
struct CrashConsistencyTests {
    /// Issuer token lifetime: soft points come 4.5-4.8 s after `iat`, so a round of up to 2 s
    /// always finds refreshes due, in flight or being committed, without sleeping for lifetimes.
    static let lifetime = 6

    @Test("random kill -9: store sound, nothing logged as committed is lost, no expired token served, restarts fetch only what is due")
    func randomKills() async throws {
        let rounds = environmentInt("FTS_CRASH_ROUNDS", default: 25)
        let seed = reproducibleSeed("FTS_CRASH_SEED", test: "crash consistency")
        var random = SeededGenerator(seed: seed)
        let scratch = Scratch()
        let issuer = try await IssuerProcess(scratch: scratch, lifetime: Self.lifetime)
        let db = scratch.file("tokens.sqlite")
        let subjects = Subjects(vehicles: 15, trips: 15)
        let agentArguments = ["--db", db, "--provider-url", issuer.template, "--log-level", "trace"] + subjects.arguments
        let onceArguments = agentArguments + ["--once", "--json"]
        let secrets = SecretScanner()
        var outputs: LabelledOutputs = []
        var linesLogged = 0, leasesLeftByKills = 0, roundsWithFetches = 0, fetchesOnRestart = 0
        var expiredAtRestart = 0, killsBetweenCommitAndLine = 0

        for round in 1...rounds {
            let context = "round \(round)/\(rounds), seed \(seed)"
            // Mostly while refreshing; one round in five during start-up (open, migration, load).
            let delay = Double.random(in: 0...1, using: &random) < 0.2
                ? Double.random(in: 0...0.3, using: &random) : Double.random(in: 0.3...2.0, using: &random)
            let agent = try AgentFixture.launch(agentArguments, in: scratch)
            try await Task.sleep(for: .milliseconds(Int(delay * 1000)))
            agent.signal(SIGKILL)
            let status = await agent.wait(upTo: 10)
            try #require(status != nil, "\(context): the agent did not die")
            #expect(agent.process.terminationReason == .uncaughtSignal && status == SIGKILL,
                    "\(context): the agent ended by itself before the kill (status \(status ?? -1)): \(agent.stderr.suffix(2000))")
            outputs += agent.outputs(labelled: "\(context) agent")

            // Whatever the moment, no quarantine and a sound store. Checked read-only, so the
            // next agent recovers from exactly the WAL the crash left.
            #expect(quarantineFiles(in: scratch.path).isEmpty, "\(context): \(quarantineFiles(in: scratch.path))")
            guard FileManager.default.fileExists(atPath: db) else { continue } // killed before creating it
            #expect(try await sqlite3(db, "PRAGMA integrity_check", readOnly: true) == "ok", "\(context)")
            expectStoreModes(db, requireSideFiles: false)
            leasesLeftByKills += (try? await LeaseRows(db))?.count ?? 0

            // Every token the agent logged as committed is in the store (or a newer one is).
            let lines = committedLines(agent.stdout)
            linesLogged += lines.count
            let before = try storeSnapshot(db)
            secrets.remember(tokensOf: before)
            let logged = lastCommitted(lines)
            expectCommittedTokensStored(logged, before, context: context)
            for line in lines {
                #expect(line.expiresAt > line.stamp, "\(context): \(line.key) reported with an expired token")
            }

            // A restart serves stored tokens before their soft point and fetches the others. In
            // some rounds the restart comes late, when many tokens are due and some expired.
            if Double.random(in: 0...1, using: &random) < 0.3 {
                try await Task.sleep(for: .milliseconds(Int.random(in: 500...5000, using: &random)))
            }
            let startedAt = Date()
            expiredAtRestart += before.values.filter { $0.expiresAt <= startedAt }.count
            if logged.contains(where: { key, line in before[key].map { $0.fingerprint != line.fingerprint } ?? false }) {
                killsBetweenCommitAndLine += 1
            }
            let requestsBefore = try await issuer.stats().requests
            let once = try await AgentFixture.run(onceArguments, in: scratch, timeout: 60)
            let endedAt = Date()
            let requestsAfter = try await issuer.stats().requests
            outputs.append(("\(context) --once stdout", once.stdout))
            outputs.append(("\(context) --once stderr", once.stderr))
            #expect(once.status == 0, "\(context): \(once.stderr.suffix(2000))")
            #expect(endedAt.timeIntervalSince(startedAt) < 10,
                    "\(context): the restart took \(endedAt.timeIntervalSince(startedAt)) s (waiting for the dead agent's leases?)")
            let results = try onceResults(once.stdout)
            #expect(Set(results.map { "\($0["kind"] ?? "")/\($0["id"] ?? "")" }) == Set(subjects.keys), "\(context)")
            let fetched = results.filter { $0["source"] == "provider" }.count
            #expect(requestsAfter - requestsBefore == fetched,
                    "\(context): \(requestsAfter - requestsBefore) provider requests for \(fetched) fetched subjects")
            fetchesOnRestart += fetched
            if fetched > 0 { roundsWithFetches += 1 }
            for result in results {
                let key = "\(result["kind"] ?? "")/\(result["id"] ?? "")"
                // Never expired when the restart began; a stored token only while above the floor.
                let expires = result["expires_at"].flatMap(parseISO)
                #expect(expires.map { $0 > startedAt } == true, "\(context): \(key) served expired (\(result["expires_at"] ?? "?"))")
                expectRestartSource(result["source"], key: key, fingerprint: result["fingerprint"], stored: before[key],
                                    window: startedAt...endedAt, context: context)
            }
            // --once exits only after its fetched tokens are committed.
            let after = try storeSnapshot(db)
            secrets.remember(tokensOf: after)
            for result in results where result["source"] == "provider" {
                let key = "\(result["kind"] ?? "")/\(result["id"] ?? "")"
                #expect(after[key]?.fingerprint == result["fingerprint"], "\(context): \(key) printed by --once but not stored")
            }
        }

        // A last, clean run: the agent still starts, serves and stops with 0.
        let final = try AgentFixture.launch(agentArguments, in: scratch)
        #expect(await final.waitForOutput("refreshed", within: 30))
        final.signal(SIGTERM)
        #expect(await final.wait(upTo: 5) == 0, "\(final.stderr.suffix(2000))")
        outputs += final.outputs(labelled: "final agent")
        #expect(try await sqlite3(db, "PRAGMA integrity_check") == "ok")
        secrets.remember(tokensOf: try storeSnapshot(db))
        secrets.expectNoLeaks(in: outputs, minimumTokens: 30)
        print("crash consistency: \(rounds) rounds, \(linesLogged) committed lines checked, \(killsBetweenCommitAndLine) kills between a commit and its line, \(leasesLeftByKills) leases left by kills, \(fetchesOnRestart) fetches on restart in \(roundsWithFetches) rounds, \(expiredAtRestart) expired tokens in the store at restart")
    }

    /// Where a restarted agent's token must come from, given what the store held before it
    /// started: before the earliest possible soft point (75% of the lifetime, with the 5%
    /// jitter) for the whole run, the store; past the latest one (80%) already at the start, or
    /// missing, the provider. In between either is right.
    private func expectRestartSource(_ source: String?, key: String, fingerprint: String?, stored: StoredRow?,
                                     window: ClosedRange<Date>, context: String) {
        guard let stored, let issued = stored.issuedAt else {
            #expect(source == "provider", "\(context): \(key) had no stored token but came from \(source ?? "?")")
            return
        }
        let lifetime = stored.expiresAt.timeIntervalSince(issued)
        let earliestSoftPoint = issued.addingTimeInterval(lifetime * 0.75)
        let latestSoftPoint = issued.addingTimeInterval(lifetime * 0.8)
        if earliestSoftPoint > window.upperBound {
            #expect(source == "store", "\(context): \(key) was fresh in the store but fetched again")
        } else if latestSoftPoint <= window.lowerBound {
            #expect(source == "provider", "\(context): \(key) was past its soft point but not refreshed")
        }
        if source == "store" {
            #expect(fingerprint == stored.fingerprint, "\(context): \(key) served a token that is not the stored one")
            let floor = min(30, lifetime * 0.1)
            #expect(stored.expiresAt.addingTimeInterval(-floor) > window.lowerBound,
                    "\(context): \(key) served from the store below its floor or expired (expires \(stored.expiresAt))")
        }
    }

    @Test("kill -9 during a fetch: the next agent takes over the dead agent's refresh leases at once")
    func deadAgentsLeases() async throws {
        let scratch = Scratch()
        let issuer = try await IssuerProcess(scratch: scratch, lifetime: 60)
        let db = scratch.file("tokens.sqlite")
        let subjects = Subjects(vehicles: 2, trips: 1)
        // The first agent's fetches hang, so it holds every lease when it dies. Its leases last
        // 600 s: an agent that waited for them to expire would run into the 60 s safety bound
        // below, so the take-over is proved without a timing goal (its time is the benchmarks'
        // `lifecycle.dead_agent_lease_takeover_seconds`).
        let hanging = try AgentFixture.launch(["--db", db, "--provider-url", issuer.template + "?fault=hang",
                                                         "--request-timeout", "60", "--lease-duration", "600",
                                                         "--log-level", "trace"] + subjects.arguments, in: scratch)
        let leased = await eventually(within: 60) {
            guard FileManager.default.fileExists(atPath: db) else { return false }
            return (try? await LeaseRows(db))?.count == 3
        }
        #expect(leased, "\(hanging.stderr.suffix(2000))")
        hanging.signal(SIGKILL)
        #expect(await hanging.wait(upTo: 5) != nil)
        let holders = try await LeaseRows(db).holders
        // `<host>/pid-<pid>-<random>@<machine>`: the dead agent's own process named.
        #expect(!holders.isEmpty && holders.allSatisfy { $0.contains("/pid-\(hanging.pid)-") || $0.hasPrefix("pid-\(hanging.pid)-") }, "\(holders)")

        let once = try await AgentFixture.run(["--db", db, "--provider-url", issuer.template, "--once", "--json",
                                                      "--log-level", "trace"] + subjects.arguments, in: scratch, timeout: 60)
        #expect(once.status == 0, "\(once.stderr.suffix(2000))")
        let takeOvers = once.stderr.components(separatedBy: "took over the refresh lease of a process that died").count - 1
        #expect(takeOvers == 3, "took over \(takeOvers) of the dead agent's 3 leases: \(once.stderr.suffix(3000))")
        #expect(try onceResults(once.stdout).allSatisfy { $0["source"] == "provider" })
        #expect(try await LeaseRows(db).count == 0)

        let secrets = SecretScanner()
        var outputs: LabelledOutputs = []
        outputs += hanging.outputs(labelled: "hanging agent")
        outputs.append(("--once stdout", once.stdout))
        outputs.append(("--once stderr", once.stderr))
        secrets.remember(tokensOf: try storeSnapshot(db))
        secrets.expectNoLeaks(in: outputs, minimumTokens: 3)
    }
}
