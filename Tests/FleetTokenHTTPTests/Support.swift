import DevTokenIssuer
import FleetTokenHTTP
import FleetTokenStore
import Foundation
import Hummingbird
import Logging
import NIOCore
import Synchronization

let quietLogger: Logger = {
    var logger = Logger(label: "test")
    logger.logLevel = .warning
    return logger
}()

/// Starts a development issuer on a free loopback port for the duration of `body`.
func withIssuer<T>(lifetime: TimeInterval = 3600, _ body: (DevTokenIssuer) async throws -> T) async throws -> T {
    var configuration = DevTokenIssuer.Configuration()
    configuration.lifetime = lifetime
    let issuer = try await DevTokenIssuer.start(configuration, logger: quietLogger)
    do {
        let result = try await body(issuer)
        await issuer.stop()
        return result
    } catch {
        await issuer.stop()
        throw error
    }
}

func fetcher(_ template: String, _ configure: (inout HTTPTokenFetcherConfiguration) -> Void = { _ in }) throws -> HTTPTokenFetcher {
    var configuration = HTTPTokenFetcherConfiguration(urlTemplate: template)
    configure(&configuration)
    return try HTTPTokenFetcher(configuration: configuration, logger: quietLogger)
}

/// A minimal recording server built on Hummingbird.
final class HeaderRecorder: Sendable {
    let seen = Mutex<[(path: String, authorization: String?, custom: String?)]>([])
    private let task: Mutex<Task<Void, any Error>?> = Mutex(nil)
    var port: Int { portBox.withLock { $0 } }
    private let portBox = Mutex(0)

    func start() async throws {
        let router = Router()
        router.get("**") { [self] request, _ -> Response in
            self.seen.withLock {
                $0.append((request.uri.path, request.headers[.authorization], request.headers[.init("X-Agent")!]))
            }
            return Response(status: .ok, headers: [.contentType: "application/json"],
                            body: .init(byteBuffer: ByteBuffer(string: #"{"VEHICLE_TOKEN_KEY":"opaque","TOKEN_EXPIRATION":60}"#)))
        }
        let (stream, continuation) = AsyncStream<Int>.makeStream()
        let app = Application(router: router, configuration: .init(address: .hostname("127.0.0.1", port: 0)),
                              onServerRunning: { channel in
                                  continuation.yield(channel.localAddress?.port ?? 0)
                                  continuation.finish()
                              }, logger: quietLogger)
        task.withLock { $0 = Task { try await app.runService(gracefulShutdownSignals: []) } }
        for await port in stream { portBox.withLock { $0 = port } }
    }

    func stop() async {
        let running = task.withLock { $0 }
        running?.cancel()
        _ = try? await running?.value
    }
}
