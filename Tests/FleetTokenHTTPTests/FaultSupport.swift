// Support for driving TokenSyncEngine + HTTPTokenFetcher + a real SQLite store against faulty
// loopback providers: simulated time, a fetcher the test can repoint, servers that misbehave
// in ways the development issuer cannot, log capture and a secret scanner.

import Clocks
import DevTokenIssuer
import FleetTokenHTTP
@testable import FleetTokenStore
import Foundation
import TestSupportKit
import Hummingbird
import InMemoryLogging
import Logging
import NIOCore
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

// MARK: - Time

/// Scheduling time (a TestClock) and wall time moving together; the wall clock starts at the
/// real time, because the development issuer signs with the real clock.
final class SimulatedTime: Sendable {
    let clock = TestClock()
    let start: Date

    init(start: Date = Date()) {
        self.start = start
    }

    var now: Date {
        let elapsed = TestClock<Duration>.Instant().duration(to: clock.now)
        return start.addingTimeInterval(Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18)
    }

    var wall: @Sendable () -> Date { { [self] in self.now } }

    func advance(by seconds: TimeInterval) async {
        await clock.advance(by: .milliseconds(Int64((seconds * 1000).rounded(.up))))
    }
}

/// Deterministic uniform values in 0...1 (SplitMix64), so jitter varies but runs repeat.
final class SeededRandom: Sendable {
    private let state: Mutex<UInt64>

    init(seed: UInt64) { state = Mutex(seed) }

    func next() -> Double {
        let value = state.withLock { state -> UInt64 in
            state &+= 0x9E37_79B9_7F4A_7C15
            var z = state
            z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
            z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
            return z ^ (z >> 31)
        }
        return Double(value >> 11) / Double(1 << 53)
    }
}

// MARK: - Logs and secrets

/// Token values that passed through a test, and the texts that must never contain them.
final class SecretScanner: Sendable {
    private let values = Mutex<Set<String>>([])

    func add(_ value: String) { values.withLock { _ = $0.insert(value) } }

    var count: Int { values.withLock { $0.count } }

    /// What must not appear: each whole value and, for JWT-shaped ones, the payload and the
    /// signature part (the header is the same in every token and not secret).
    var needles: [String] {
        values.withLock { values in
            values.flatMap { value -> [String] in
                let parts = value.split(separator: ".", omittingEmptySubsequences: false).map(String.init)
                var needles = [value]
                if parts.count == 3 { needles += [parts[1], parts[2]] }
                return needles.filter { $0.count >= 16 }
            }
        }
    }

    /// The needles found in `text` (shortened, for the failure message).
    func leaks(in text: String) -> [String] {
        needles.filter { text.contains($0) }.map { String($0.prefix(24)) + "…" }
    }
}

// MARK: - A fetcher the test can repoint

/// The engine's fetcher: forwards to the current real `HTTPTokenFetcher`, so the test can point
/// the engine at a faulty provider after a good fetch. Counts calls and records every token
/// value a provider returned, for the secret scan. Adds no behaviour of its own.
final class SwitchingFetcher: TokenFetcher, Sendable {
    private let current: Mutex<HTTPTokenFetcher>
    private let all: Mutex<[HTTPTokenFetcher]>
    private let counter = Mutex(0)
    let secrets: SecretScanner

    init(_ initial: HTTPTokenFetcher, secrets: SecretScanner) {
        current = Mutex(initial)
        all = Mutex([initial])
        self.secrets = secrets
    }

    func use(_ fetcher: HTTPTokenFetcher) {
        current.withLock { $0 = fetcher }
        all.withLock { $0.append(fetcher) }
    }

    var calls: Int { counter.withLock { $0 } }

    func fetchToken(for key: TokenKey) async throws(TokenProviderError) -> FetchedToken {
        counter.withLock { $0 += 1 }
        let fetcher = current.withLock { $0 }
        let fetched = try await fetcher.fetchToken(for: key)
        secrets.add(fetched.value)
        return fetched
    }

    func shutdown() async {
        for fetcher in all.withLock({ $0 }) { await fetcher.shutdown() }
    }
}

// MARK: - Misbehaving loopback endpoints

/// A TCP socket on 127.0.0.1 that never answers. Not listening: connections are refused. Listening
/// but never accepting: the kernel completes the handshake and queues the connection, so the
/// client's request is taken and no answer ever comes (accept, then hang).
final class SilentSocket: Sendable {
    let port: Int
    private let descriptor: Int32

    init(listening: Bool) throws {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw SocketError(step: "socket") }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = 0
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        let length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, length) }
        }
        guard bound == 0, !listening || listen(fd, 16) == 0 else {
            Glibc.close(fd)
            throw SocketError(step: "bind/listen")
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

    struct SocketError: Error { let step: String }
}

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
}

/// A minimal Hummingbird server (like `HeaderRecorder`) answering every request with the
/// current canned answer, for faults the development issuer has no `?fault=` for.
final class CannedServer: Sendable {
    private let answer: Mutex<CannedAnswer>
    private let task: Mutex<Task<Void, any Error>?> = Mutex(nil)
    private let portBox = Mutex(0)
    var port: Int { portBox.withLock { $0 } }

    init(_ answer: CannedAnswer) {
        self.answer = Mutex(answer)
    }

    func start() async throws {
        let router = Router()
        router.get("**") { [self] _, _ -> Response in
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

// MARK: - Small helpers

/// A JWT-shaped token (unsigned: random signature bytes) for canned answers.
func cannedJWT(subject: String, issuedAt: Date, lifetime: TimeInterval = 3600, claim: String = "vehicleid") -> String {
    func base64URL(_ data: Data) -> String {
        data.base64EncodedString().replacingOccurrences(of: "+", with: "-")
            .replacingOccurrences(of: "/", with: "_").replacingOccurrences(of: "=", with: "")
    }
    let iat = Int(issuedAt.timeIntervalSince1970)
    // The subject as a JSON string: ids may hold quotes and backslashes.
    let quoted = String(decoding: try! JSONSerialization.data(withJSONObject: subject, options: .fragmentsAllowed), as: UTF8.self)
    let payload = #"{"iat":\#(iat),"exp":\#(iat + Int(lifetime)),"authorization":{"\#(claim)":\#(quoted)}}"#
    let signature = Data((0..<256).map { _ in UInt8.random(in: 0...255) })
    return [Data(#"{"alg":"RS256","typ":"JWT"}"#.utf8), Data(payload.utf8), signature].map(base64URL).joined(separator: ".")
}
