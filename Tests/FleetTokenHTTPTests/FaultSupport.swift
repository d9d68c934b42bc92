// Loopback endpoints that misbehave in ways the development issuer cannot (for the provider
// fault tests): a small server with a canned answer that records what it was asked. A socket that
// refuses or never answers (SilentSocket), time, the fetcher, logs and the secret scan are the
// test kits'.

import Foundation
import Hummingbird
import Logging
import NIOCore
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

// MARK: - Misbehaving loopback endpoints

/// A fixed answer the canned server gives.
struct CannedAnswer: Sendable {
    var status: Int = 200
    var headers: [(name: String, value: String)] = [("Content-Type", "application/json")]
    var body: CannedBody
    /// Token values the body carries, for the secret scan.
    var secrets: [String] = []

    enum CannedBody: Sendable {
        case text(String)
        /// `count` spaces in one buffer: the response declares its length up front.
        case spaces(count: Int)
    }

    /// An opaque vehicle token valid for a minute, in the samples' JSON.
    static let opaqueVehicleToken = CannedAnswer(body: .text(#"{"VEHICLE_TOKEN_KEY":"opaque","TOKEN_EXPIRATION":60}"#))
}

/// A minimal Hummingbird server answering every GET with the canned answer and recording each
/// request's path and its `Authorization` and `X-Agent` headers: for faults the development
/// issuer has no `?fault=` for, and for checking what a client sent.
final class CannedServer: Sendable {
    /// Every request so far: path, `Authorization`, `X-Agent`.
    let seen = Mutex<[(path: String, authorization: String?, custom: String?)]>([])
    private let answer: Mutex<CannedAnswer>
    private let task: Mutex<Task<Void, any Error>?> = Mutex(nil)
    private let portBox = Mutex(0)
    var port: Int { portBox.withLock { $0 } }

    init(_ answer: CannedAnswer) {
        self.answer = Mutex(answer)
    }

    func start() async throws {
        let router = Router()
        router.get("**") { [self] request, _ -> Response in
            self.seen.withLock {
                $0.append((request.uri.path, request.headers[.authorization], request.headers[.init("X-Agent")!]))
            }
            let answer = self.answer.withLock { $0 }
            var fields = HTTPFields()
            for header in answer.headers { fields[.init(header.name)!] = header.value }
            let buffer: ByteBuffer
            switch answer.body {
            case .text(let text): buffer = ByteBuffer(string: text)
            case .spaces(let count): buffer = ByteBuffer(repeating: UInt8(ascii: " "), count: count)
            }
            return Response(status: .init(code: answer.status), headers: fields, body: .init(byteBuffer: buffer))
        }
        let (stream, continuation) = AsyncStream<Int>.makeStream()
        let app = Application(router: router, configuration: .init(address: .hostname("127.0.0.1", port: 0)),
                              onServerRunning: { channel in
                                  continuation.yield(channel.localAddress?.port ?? 0)
                                  continuation.finish()
                              }, logger: Self.silent)
        task.withLock { $0 = Task { try await app.runService(gracefulShutdownSignals: []) } }
        for await port in stream { portBox.withLock { $0 = port } }
    }

    func stop() async {
        let running = task.withLock { $0 }
        running?.cancel()
        _ = try? await running?.value
    }

    /// Stopping by cancellation makes the server log errors about its cancelled channels.
    private static let silent: Logger = {
        var logger = Logger(label: "canned-server")
        logger.logLevel = .critical
        return logger
    }()
}
