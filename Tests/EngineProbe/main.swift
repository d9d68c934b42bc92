// A test helper process: runs one TokenSyncEngine on a shared store and asks it for one token,
// with a fetcher that logs every fetch to a file and answers slowly. Two of these started
// together prove that processes sharing a store fetch a key once between them.
//
//   token-engine-probe STORE KIND ID FETCH_LOG DELAY_MS

import FleetTokenStore
import FleetTokenStoreTesting
import Foundation
import Logging

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

let arguments = CommandLine.arguments
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
