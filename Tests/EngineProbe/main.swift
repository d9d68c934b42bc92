// A test helper process: runs one TokenSyncEngine on a shared store and asks it for one token,
// with a fetcher that logs every fetch to a file and answers slowly. Two of these started
// together prove that processes sharing a store fetch a key once between them.
//
//   token-engine-probe STORE KIND ID FETCH_LOG DELAY_MS
//
// Or measures the CPU time the engine burns while a store write it does not own keeps failing
// (a process of its own, so that no other test's work is counted):
//
//   token-engine-probe idle-while-blocked STORE READY_FILE GO_FILE WINDOW_MS
//
// It opens STORE, creates READY_FILE and waits for GO_FILE (the test then holds the store's
// write lock from another process); gets a token without run(), so that its commit is written,
// and retried every 2 s, by a writer of its own; starts run() and gets a second token, whose
// commit run()'s loop is told about; and prints the process's CPU time over the next
// WINDOW_MS of wall time: `cpu_ms=N window_ms=N`.

import FleetTokenStore
import FleetTokenStoreTesting
import Foundation
import Logging
#if canImport(Glibc)
import Glibc
#endif

struct SlowLoggingFetcher: TokenFetcher {
    let fetchLog: String
    let delay: Duration

    func fetchToken(for key: TokenKey) async throws(TokenProviderError) -> FetchedToken {
        let line = "\(ProcessInfo.processInfo.processIdentifier) \(key)\n"
        guard let handle = FileHandle(forWritingAtPath: fetchLog) else { throw .other(detail: "no fetch log") }
        handle.seekToEndOfFile()
        handle.write(Data(line.utf8))
        try? handle.close()
        try? await Task.sleep(for: delay)
        return FetchedToken(value: TestJWT.make(for: key, issuedAt: Date()))
    }
}

/// CPU time this process has used, in milliseconds (every thread).
func processCPUMilliseconds() -> Double {
    var spec = timespec()
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &spec)
    return Double(spec.tv_sec) * 1000 + Double(spec.tv_nsec) / 1_000_000
}

func idleWhileBlocked(_ arguments: [String]) async throws {
    guard arguments.count == 4, let window = Int(arguments[3]) else {
        FileHandle.standardError.write(Data("usage: token-engine-probe idle-while-blocked STORE READY_FILE GO_FILE WINDOW_MS\n".utf8))
        exit(64)
    }
    let logger = Logger(label: "probe")
    var configuration = StoreConfiguration()
    // Each failed write gives up quickly: the commit then waits for its retry nearly all the time.
    configuration.busyTimeout = 0.1
    let store = try SQLiteTokenRepository(path: arguments[0], configuration: configuration, logger: logger)
    let fetchLog = arguments[1] + ".fetches"
    _ = FileManager.default.createFile(atPath: fetchLog, contents: nil)
    let engine = TokenSyncEngine(repository: store, fetcher: SlowLoggingFetcher(fetchLog: fetchLog, delay: .zero), logger: logger)
    _ = FileManager.default.createFile(atPath: arguments[1], contents: nil)
    while !FileManager.default.fileExists(atPath: arguments[2]) { usleep(10_000) }
    // Fetched (the lease cannot be taken while the lock is held), served, and its commit fails.
    _ = try await engine.token(for: try TokenKey(kind: .vehicle, subjectID: "blocked"))
    let running = Task { try await engine.run() }
    usleep(300_000)
    // A second token for run()'s commit loop to write, while the first one's writer owns the writing.
    _ = try await engine.token(for: try TokenKey(kind: .vehicle, subjectID: "blocked-2"))
    usleep(300_000)
    let before = processCPUMilliseconds()
    usleep(useconds_t(window) * 1000)
    let used = processCPUMilliseconds() - before
    print("cpu_ms=\(Int(used.rounded())) window_ms=\(window)")
    running.cancel()
    exit(0)
}

let arguments = CommandLine.arguments
if arguments.count > 1 && arguments[1] == "idle-while-blocked" {
    do {
        try await idleWhileBlocked(Array(arguments.dropFirst(2)))
    } catch {
        FileHandle.standardError.write(Data("probe failed: \(error)\n".utf8))
        exit(1)
    }
}
guard arguments.count == 6, let kind = TokenKind(rawValue: arguments[2]), let delay = Int(arguments[5]) else {
    FileHandle.standardError.write(Data("usage: token-engine-probe STORE KIND ID FETCH_LOG DELAY_MS\n".utf8))
    exit(64)
}
let logger = Logger(label: "probe")
do {
    let store = try SQLiteTokenRepository(path: arguments[1], logger: logger)
    let engine = TokenSyncEngine(repository: store, fetcher: SlowLoggingFetcher(fetchLog: arguments[4], delay: .milliseconds(delay)),
                                 logger: logger)
    let key = try TokenKey(kind: kind, subjectID: arguments[3])
    let (token, source) = try await engine.tokenWithSource(for: key)
    await engine.shutdown()
    store.close()
    print("\(token.fingerprint) \(source.rawValue)")
} catch {
    FileHandle.standardError.write(Data("probe failed: \(error)\n".utf8))
    exit(1)
}
