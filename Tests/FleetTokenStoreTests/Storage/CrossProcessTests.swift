import FleetTokenStoreTesting
import Foundation
#if canImport(Glibc)
import Glibc
#endif
import Testing
import TestSupportKit
@testable import FleetTokenStore

/// A stock `sqlite3` shell kept running, fed statements on its standard input.
final class SQLiteShell {
    private let process: ChildProcess

    init(path: String) throws {
        process = try ChildProcess(sqlite3Path, [path], stdin: .pipe, stdout: .pipe, stderr: .standardOutput)
    }

    /// Sends `sql` and waits until the shell has run it (it echoes a marker afterwards).
    func execute(_ sql: String, timeout: TimeInterval = 10) throws -> String {
        let marker = "done-\(UUID().uuidString.prefix(8))"
        process.standardInput!.write(Data("\(sql)\nSELECT '\(marker)';\n".utf8))
        var collected = ""
        let deadline = Date().addingTimeInterval(timeout)
        while !collected.contains(marker), Date() < deadline {
            let chunk = process.standardOutput!.availableData
            if chunk.isEmpty { break }
            collected += String(decoding: chunk, as: UTF8.self)
        }
        guard collected.contains(marker) else { throw ProcessFailure(message: "sqlite3 did not answer: \(collected)") }
        return collected.replacingOccurrences(of: marker, with: "").trimmingCharacters(in: .whitespacesAndNewlines)
    }

    /// Sends text without waiting for it to run.
    func send(_ text: String) {
        process.standardInput!.write(Data(text.utf8))
    }

    func quit() {
        try? process.standardInput!.write(contentsOf: Data(".quit\n".utf8))
        try? process.standardInput!.close()
        process.waitUntilExit()
    }

    deinit {
        if process.isRunning { kill(process.processIdentifier, SIGTERM); process.waitUntilExit() }
    }
}

@Suite("Sharing a store with other connections and processes", .paced)
struct CrossProcessTests {
    let dir = Scratch()
    var path: String { dir.file("tokens.sqlite") }

    @Test("a second pool's upserts and purges reach subscribers within 1 s; own writes are not echoed")
    func twoPools() async throws {
        let feedClock = ManualClock()
        let watcher = try openStore(path, pollClock: feedClock)
        let writer = try openStore(path)
        defer { watcher.close(); writer.close() }
        let recorder = StreamRecorder(watcher.changes()) // the starting point is taken before changes() returns
        let work = Task { await watcher.runBackgroundWork() } // begun after: changes since changes() still count
        defer { work.cancel() }

        try await watcher.upsert(token(try .vehicle("own"), expiresIn: 600))
        try await writer.upsert(token(try .vehicle("theirs"), expiresIn: 600))
        #expect(await watcher.deliversWithinOneSecond(feedClock) { recorder.elements.contains(.upserted(try! .vehicle("theirs"))) })

        #expect(try await writer.purge(TokenFilter(subjectID: "own")) == 1)
        #expect(await watcher.deliversWithinOneSecond(feedClock) { recorder.elements.contains(.removed(try! .vehicle("own"))) })
        #expect(!recorder.elements.contains(.upserted(try .vehicle("own"))))
    }

    @Test("a change made by a stock sqlite3 process is seen within 1 s")
    func sqliteShellChange() async throws {
        let feedClock = ManualClock()
        let store = try openStore(path, pollClock: feedClock)
        defer { store.close() }
        try await store.upsert([token(try .trip("a"), expiresIn: 600), token(try .trip("b"), expiresIn: 600)])
        let recorder = StreamRecorder(store.changes())
        let work = Task { await store.runBackgroundWork() }
        defer { work.cancel() }

        _ = try await sqlite3(path, "DELETE FROM tokens WHERE kind = 'trip' AND subject_id = 'a'")
        _ = try await sqlite3(path, "UPDATE tokens SET token = 'replaced.by.shell', expires_at = expires_at + 1 WHERE subject_id = 'b'")
        #expect(await store.deliversWithinOneSecond(feedClock) {
            recorder.elements.contains(.removed(try! .trip("a"))) && recorder.elements.contains(.upserted(try! .trip("b")))
        })
        #expect(try await store.entry(for: try .trip("b"))?.token?.value == "replaced.by.shell")
    }

    // A close() that waited for the reader's lock (to checkpoint) would wait out the busy
    // timeout, set here far past the 30 s safety bound; how long close() takes is the
    // benchmarks' `lifecycle.close_beside_reader_ms`, not a goal of this test.
    @Test("close() beside another process reading the store returns without waiting for its lock, without a warning")
    func closeBesideReader() async throws {
        let log = LogRecorder()
        let store = try openStore(path, configure: { $0.busyTimeout = 600 }, logger: log.logger)
        try await store.upsert(token(try .vehicle("truck-7"), expiresIn: 600))
        let shell = try SQLiteShell(path: path)
        defer { shell.quit() }
        // Another process holds a read transaction on the snapshot before our next write.
        _ = try shell.execute("BEGIN; SELECT count(*) FROM tokens;")
        try await store.upsert(token(try .vehicle("truck-8"), expiresIn: 600))
        #expect(await store.closeReturns(within: 30), "close() waited for the reader's lock")
        #expect(log.messages(at: .warning).isEmpty, "\(log.messages(at: .warning))")
        _ = try shell.execute("COMMIT;")
        #expect(try await sqlite3(path, "SELECT count(*) FROM tokens") == "2")
    }

    @Test("a write waits for another process's lock, and fails as busy only past the timeout")
    func busyTimeout() async throws {
        let store = try openStore(path) { $0.busyTimeout = 0.4 }
        defer { store.close() }
        try await store.upsert(token(try .vehicle("v"), expiresIn: 600))
        let shell = try SQLiteShell(path: path)
        defer { shell.quit() }
        _ = try shell.execute("BEGIN IMMEDIATE; UPDATE tokens SET last_used_at = 1;")

        let error = await #expect(throws: TokenStoreError.self) { try await store.upsert(token(try .vehicle("w"), expiresIn: 600)) }
        #expect(error == .busy(path: path, timeoutSeconds: 0.4))
        #expect(error?.description.contains("locked") == true)
        // Reads are not blocked by the writer (WAL).
        #expect(try await store.entry(for: try .vehicle("v")) != nil)

        // Released within the timeout: the write waits and succeeds.
        _ = try shell.execute("COMMIT; BEGIN IMMEDIATE;")
        shell.send(".shell sleep 0.15\nCOMMIT;\n") // the shell lets go by itself, mid-wait
        try await store.upsert(token(try .vehicle("w"), expiresIn: 600))
        #expect(try await store.entry(for: try .vehicle("w")) != nil)
    }
}
