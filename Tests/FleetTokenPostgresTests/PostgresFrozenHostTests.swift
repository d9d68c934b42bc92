// Issue 30 item 2, found by PostgresFailoverTests (three agents): right after a failover, a call
// that had leased a connection to the old primary waited its whole statement timeout (10 s) and
// failed, and its refresh fetched again without the lease. A host that loses power (or its
// network) leaves its connections open and silent: the pool keeps leasing them, each call's
// statement goes unanswered, and a call that has a connection never asked whether the host was
// still there. Here the host in use sits behind a FreezingRelay, which at freeze() stops carrying
// anything on the open connections and refuses new ones.

import FleetTokenStoreTesting
import Foundation
import Logging
import Testing
import TestSupportKit
@testable import FleetTokenPostgres
@testable import FleetTokenStore

@Suite("PostgresTokenRepository when the host in use loses power", .paced, .serialized, .enabled(if: PostgresServer.testsEnabled))
struct PostgresFrozenHostTests {
    /// Upserts `count` keys named `prefix-N` at once; each call's seconds and error.
    private func writeConcurrently(_ store: PostgresTokenRepository, _ prefix: String, count: Int) async -> [(seconds: Double, error: String?)] {
        await withTaskGroup(of: (Double, String?).self) { group in
            for index in 0..<count {
                group.addTask {
                    let start = ContinuousClock.now
                    var failure: String?
                    do {
                        try await store.upsert(token(try TokenKey.vehicle("\(prefix)-\(index)"), expiresIn: 3600, now: Date()))
                    } catch {
                        failure = "\(error)"
                    }
                    let elapsed = ContinuousClock.now - start
                    return (Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18, failure)
                }
            }
            var results: [(seconds: Double, error: String?)] = []
            for await result in group { results.append(result) }
            return results
        }
    }

    @Test("two hosts, the one in use loses power: calls holding its silent connections move to the other host within seconds, not at their statement timeout")
    func callsLeaveAFrozenHost() async throws {
        let first = try await PostgresServer.make()
        defer { first.stopInBackground() }
        let second = try await PostgresServer.make()
        defer { second.stopInBackground() }
        for server in [first, second] { try await server.createDatabase("frozen") }
        let relay = try FreezingRelay(target: first.port)
        defer { relay.stop() }
        let scratch = Scratch()
        let passfile = try passwordFile([(relay.port, first.password), (second.port, second.password)], database: "frozen", in: scratch)
        let log = LogRecorder()
        // The second server's schema, made as an agent would make it there.
        try await PostgresTokenRepository.withRepository(try configuration(hosts: "127.0.0.1:\(second.port)", database: "frozen", passfile: passfile), logger: log.logger) { _ in }

        var both = try configuration(hosts: "127.0.0.1:\(relay.port),127.0.0.1:\(second.port)", database: "frozen", passfile: passfile)
        // Far from the bound below: a call that waits for its silent connection takes 61 s.
        both.statementTimeout = .seconds(60)
        let results = try await PostgresTokenRepository.withRepository(both, logger: log.logger) { store in
            // The pool holds connections through the relay.
            for round in 0..<2 {
                let warm = await writeConcurrently(store, "warm\(round)", count: 6)
                #expect(warm.allSatisfy { $0.error == nil }, "\(warm)")
            }
            relay.freeze()
            return await writeConcurrently(store, "after", count: 6)
        }
        let described = results.map { String(format: "%.2f s %@", $0.seconds, $0.error ?? "ok") }
        // On the old code every call waited for its statement timeout. A move takes about a
        // second on an idle machine; 16 s at the start of a CI run with every suite starting.
        #expect(results.allSatisfy { $0.seconds < 30 }, "calls after the freeze: \(described)")
        #expect(results.allSatisfy { $0.error == nil }, "calls after the freeze: \(described)")
        let stored = "SELECT count(*) FROM fleet_token_store.tokens WHERE subject_id LIKE 'after-%'"
        #expect(try await second.psql(stored, database: "frozen") == "6")
        #expect(log.messages(at: .warning).contains { $0.contains("moved to another host") }, "\(log.messages(at: .warning))")
    }

    // From a review: with one host whose open connections went silent while new ones are
    // answered (its address moved, as with a DNS-based failover; a NAT dropped the flows), a
    // search found the host in use fitting and kept the pool: each silent connection cost a
    // call its whole statement timeout, and once all were held by abandoned calls, every call
    // failed, for as long as TCP took to give them up (minutes).
    @Test("one host whose open connections go silent while new ones are answered: the pool starts afresh once a call's statement is still unanswered well past its timeout, and writes land again")
    func silentConnectionsReplaced() async throws {
        let server = try await PostgresServer.make()
        defer { server.stopInBackground() }
        try await server.createDatabase("silent")
        let relay = try FreezingRelay(target: server.port)
        defer { relay.stop() }
        let scratch = Scratch()
        let passfile = try passwordFile([(relay.port, server.password)], database: "silent", in: scratch)
        let log = LogRecorder()
        var only = try configuration(hosts: "127.0.0.1:\(relay.port)", database: "silent", passfile: passfile)
        only.statementTimeout = .seconds(2)
        only.maximumConnections = 3
        let (frozenRound, later) = try await PostgresTokenRepository.withRepository(only, logger: log.logger) { store in
            let warm = await writeConcurrently(store, "warm", count: 6)
            #expect(warm.allSatisfy { $0.error == nil }, "\(warm)")
            relay.freezeOpenConnections()
            // Calls on the silent connections get no answer by their deadline; a call after two
            // statement timeouts more finds them still unanswered and renews the pool.
            let frozenRound = await writeConcurrently(store, "frozen", count: 6)
            let recovery = ContinuousClock.now + .seconds(60)
            var attempt = 0
            while ContinuousClock.now < recovery {
                attempt += 1
                if await writeConcurrently(store, "recovering\(attempt)", count: 1).allSatisfy({ $0.error == nil }) { break }
                try await Task.sleep(for: .milliseconds(500))
            }
            var later: [[(seconds: Double, error: String?)]] = []
            for round in 0..<3 { later.append(await writeConcurrently(store, "later\(round)", count: 6)) }
            return (frozenRound, later)
        }
        func described(_ results: [(seconds: Double, error: String?)]) -> String {
            results.map { String(format: "%.2f s %@", $0.seconds, $0.error ?? "ok") }.joined(separator: ", ")
        }
        #expect(frozenRound.allSatisfy { $0.seconds < 20 }, "the round at the freeze: \(described(frozenRound))")
        for (index, round) in later.enumerated() {
            #expect(round.allSatisfy { $0.error == nil }, "round \(index) after it: \(described(round))")
        }
        let stored = "SELECT count(*) FROM fleet_token_store.tokens WHERE subject_id LIKE 'later%'"
        #expect(try await server.psql(stored, database: "silent") == "18")
        #expect(log.messages(at: .warning).contains { $0.contains("long past its timeout; the pool's connections are replaced") }, "\(log.messages(at: .warning))")
    }

    @Test("one host, and it loses power: a call holding a silent connection fails as unavailable within seconds, not at its statement timeout")
    func callFailsFastOnAFrozenOnlyHost() async throws {
        let server = try await PostgresServer.make()
        defer { server.stopInBackground() }
        try await server.createDatabase("frozen")
        let relay = try FreezingRelay(target: server.port)
        defer { relay.stop() }
        let scratch = Scratch()
        let passfile = try passwordFile([(relay.port, server.password)], database: "frozen", in: scratch)
        let log = LogRecorder()
        let results = try await PostgresTokenRepository.withRepository(try configuration(hosts: "127.0.0.1:\(relay.port)", database: "frozen", passfile: passfile), logger: log.logger) { store in
            let warm = await writeConcurrently(store, "warm", count: 4)
            #expect(warm.allSatisfy { $0.error == nil }, "\(warm)")
            relay.freeze()
            return await writeConcurrently(store, "after", count: 4)
        }
        let described = results.map { String(format: "%.2f s %@", $0.seconds, $0.error ?? "ok") }
        #expect(results.allSatisfy { $0.seconds < 5 }, "calls after the freeze: \(described)")
        #expect(results.allSatisfy { ($0.error ?? "").contains("cannot reach the token database") }, "calls after the freeze: \(described)")
    }
}
