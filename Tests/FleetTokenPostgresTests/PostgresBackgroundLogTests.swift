// postgres-nio's background logger as the store wraps it: an agent printed "Trying to lease
// connection from `PostgresClient`, but `PostgresClient.run()` hasn't been called yet." as a
// warning at every start and after every move to another host, about nothing (the request waits
// for run(), a child task started with the client).
@testable import FleetTokenPostgres
import FleetTokenStore
import FleetTokenStoreTesting
import Foundation
import Logging
import Testing
import TestSupportKit

@Suite("postgres-nio's background messages", .paced)
struct PostgresBackgroundLogTests {
    @Test("warnings and errors pass with their metadata; the request-before-run() warning and anything below a warning do not")
    func passesWhatMatters() {
        let recorder = LogRecorder()
        var logger = PostgresBackgroundLog.logger(recorder.logger)
        logger[metadataKey: "psql_connection_id"] = "3"
        logger.warning("Trying to lease connection from `PostgresClient`, but `PostgresClient.run()` hasn't been called yet.")
        logger.info("Connection creation failed")
        logger.debug("Connection leased")
        logger.warning("Connection closed unexpectedly", metadata: ["reason": "eof"])
        logger.error("Pool shut down")
        #expect(recorder.entries.map(\.message.description) == ["Connection closed unexpectedly", "Pool shut down"])
        #expect(recorder.entries.first?.metadata["reason"] == "eof")
        #expect(recorder.entries.allSatisfy { $0.metadata["psql_connection_id"] == "3" })
    }

    @Test("a store opened and used at once logs no request-before-run() warning", .enabled(if: PostgresServer.testsEnabled))
    func noWarningAtOpen() async throws {
        let server = try await PostgresServer.make()
        defer { server.stopInBackground() }
        try await server.createDatabase("quiet")
        // The suite's generous timeouts: with the defaults (a 1 s connection wait), a first
        // connection slowed by the whole suite starting on two cores failed this test once.
        let configuration = try configuration(server, "quiet")
        let log = LogRecorder()
        try await PostgresTokenRepository.withRepository(configuration, logger: log.logger) { store in
            // At once, before the pool's run() had a chance to start: the case that warned.
            async let first: Void = store.upsert(token(try TokenKey.vehicle("quiet-1"), expiresIn: 3600, now: Date()))
            async let second = store.entry(for: try TokenKey.vehicle("quiet-2"))
            _ = try await (first, second)
        }
        #expect(!log.allText.contains("hasn't been called yet"), "\(log.messages(at: .warning))")
    }
}
