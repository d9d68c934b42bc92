// Issue 30 item 2, at the repository: a host search must not hold calls. A host that accepts
// TCP but does not answer yet (a server starting up, a hung machine) holds a search up to the
// statement timeout; a refresh's lease call that waited for it kept API callers past their
// own timeouts in the agent-level failover test. Calls fail as unavailable within their
// connection wait instead, and the search goes on by itself.

import FleetTokenStoreTesting
import Foundation
import Glibc
import Logging
import Testing
import TestSupportKit
@testable import FleetTokenPostgres
@testable import FleetTokenStore

@Suite("PostgresAvailability: host searches", .serialized, .enabled(if: PostgresServer.testsEnabled))
struct PostgresAvailabilityHostSearchTests {
    @Test("the host in use stops and the other host accepts TCP but never answers: calls fail within their connection wait, not after the search")
    func callDoesNotWaitForASlowSearch() async throws {
        let server = try await PostgresServer.make()
        defer { try? server.stop() }
        try await server.createDatabase("search")
        let silent = try HangingListener()
        defer { silent.close() }
        // The live server first: open finds it without asking the silent one.
        var configuration = try PostgresStoreConfiguration(
            url: "postgres://fleet@127.0.0.1:\(server.port),127.0.0.1:\(silent.port)/search?sslmode=require")
        configuration.environment = ["PGPASSWORD": server.password]
        // A search asking the silent host lasts this long; the calls must not.
        configuration.statementTimeout = .seconds(30)
        configuration.connectTimeout = .seconds(20)
        let log = LogRecorder()
        let key = try TokenKey.vehicle("held")
        let clock = ContinuousClock()
        let closing = try await PostgresTokenRepository.withRepository(configuration, logger: log.logger) { store in
            try await store.upsert(token(key, expiresIn: 3600, now: Date()))
            try await server.shutDown(mode: .fast)
            var failure: TokenStoreError?
            let first = await clock.measure {
                do { _ = try await store.entry(for: key) } catch { failure = error as? TokenStoreError }
            }
            // The connection wait (1 s) and as much again for the search, not the search's 30 s;
            // the bound leaves room for a loaded machine.
            #expect(first < .seconds(8), "the first call after the server stopped took \(first)")
            #expect(failure?.code == .databaseUnavailable, "\(String(describing: failure))")
            let next = await clock.measure { _ = try? await store.acquireRefreshLease(for: key, holder: "h", now: Date(), duration: 30) }
            #expect(next < .seconds(1), "a call while the search runs took \(next)")
            return clock.now
        }
        // Closing does not wait for the search either.
        let closed = clock.now - closing
        #expect(closed < .seconds(8), "closing took \(closed) while a search was running")
        #expect(!log.allText.contains(server.password))
    }
}

/// A TCP socket on 127.0.0.1 listening but never accepting: the kernel completes the handshake
/// and queues the connection, so a client's first message is taken and no answer ever comes.
private final class HangingListener: Sendable {
    let port: Int
    private let descriptor: Int32

    init() throws {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw Failed(step: "socket") }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = 0
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        let length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, length) }
        }
        guard bound == 0, listen(fd, 16) == 0 else {
            Glibc.close(fd)
            throw Failed(step: "bind/listen")
        }
        var actual = sockaddr_in()
        var actualLength = length
        _ = withUnsafeMutablePointer(to: &actual) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &actualLength) }
        }
        descriptor = fd
        port = Int(UInt16(bigEndian: actual.sin_port))
    }

    func close() { Glibc.close(descriptor) }

    struct Failed: Error { let step: String }
}
