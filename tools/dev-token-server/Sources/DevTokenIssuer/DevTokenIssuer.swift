public import Foundation
import Hummingbird
import JWTKit
public import Logging
import NIOCore
import ServiceLifecycle
import Synchronization
import _CryptoExtras

/// A development issuer of Fleet-Engine-shaped tokens: real RS256 JWTs, signed with a fresh key
/// per start (or a PEM key file), served over HTTP the way the Fleet Engine samples' provider
/// expects. **Not for production**: it hands a token for any subject to anyone who asks.
///
/// `GET /token/{kind}/{id}` answers `{"VEHICLE_TOKEN_KEY": "<jwt>", "TOKEN_EXPIRATION": <exp>}`
/// (`TRIP_TOKEN_KEY` for trips). Query parameters help test clients:
/// `expiration_format=epoch-seconds|epoch-millis|relative-seconds|none` and
/// `fault=<name>` to simulate a broken provider (see ``Fault``).
/// `GET /stats` answers `{"issued": N, "requests": N}`. With ``Configuration/recordIssuedTokens``,
/// `GET /stats/tokens` answers every token issued, by `kind/id` (tests that scan a store's bytes
/// for plaintext tokens need the values).
public final class DevTokenIssuer: Sendable {
    /// How the issuer runs.
    public struct Configuration: Sendable {
        /// Address to listen on. Default 127.0.0.1; anything else needs `allowNonLoopback`.
        public var host = "127.0.0.1"
        /// Port; 0 picks a free one (see ``DevTokenIssuer/port``).
        public var port = 0
        /// Token lifetime in seconds (Fleet Engine accepts at most 3600). Default 3600.
        public var lifetime: TimeInterval = 3600
        /// A PEM RSA private key to sign with; nil generates a fresh 2048-bit key.
        public var keyFile: String?
        /// Allow a non-loopback `host`.
        public var allowNonLoopback = false
        /// The service account named in `iss` and `sub`.
        public var serviceAccount = "fleet-engine-dev@fleet-token-store-dev.iam.gserviceaccount.com"
        /// The clock tokens are issued by (`iat`, `exp`). Tests that run a client on simulated
        /// time inject the same clock here, so tokens follow it. (The HTTP `Date` header stays
        /// the real time: the server framework sets it.)
        public var now: @Sendable () -> Date = { Date() }
        /// Keep every issued token and answer them at `GET /stats/tokens` (off by default: the
        /// list grows with every token, and it hands out every token issued to whoever asks).
        public var recordIssuedTokens = false

        /// The defaults.
        public init() {}
    }

    /// Ways the issuer can misbehave on request (`?fault=`), for testing clients.
    public enum Fault: String, Sendable, CaseIterable {
        /// Answer with the HTTP status in `status=` (default 500), with `retry_after=` if given.
        case status
        /// Answer 200 with an HTML page.
        case html
        /// Answer 200 with JSON lacking the token field.
        case missingToken = "missing-token"
        /// Answer 200 with JSON lacking the expiration field.
        case missingExpiration = "missing-expiration"
        /// A token whose `authorization` names another subject.
        case wrongSubject = "wrong-subject"
        /// A token that expired a minute ago.
        case expired
        /// A token valid for two hours (Fleet Engine rejects more than one).
        case tooLong = "too-long"
        /// A token whose payload is not base64url.
        case badBase64 = "bad-base64"
        /// A body of 4 MiB.
        case hugeBody = "huge-body"
        /// Accept the request, then never answer.
        case hang
        /// Send the body slowly, a byte every `delay_ms` (default 500).
        case slowBody = "slow-body"
        /// The same token every time (a caching provider).
        case sameToken = "same-token"
        /// Answer normally after `delay_ms` (default 500): a slow provider.
        case slow
    }

    /// Why the issuer could not start.
    public enum StartError: Error, CustomStringConvertible {
        /// The host is not loopback and `allowNonLoopback` is false.
        case nonLoopbackHost(String)
        /// The key file could not be read or is not a PEM RSA private key.
        case badKeyFile(String, String)

        /// What is wrong.
        public var description: String {
            switch self {
            case .nonLoopbackHost(let host): "refusing to listen on \(host): the development issuer serves tokens to anyone; pass --allow-non-loopback to insist"
            case .badKeyFile(let path, let reason): "cannot use key file \(path): \(reason)"
            }
        }
    }

    /// The port the issuer listens on.
    public let port: Int
    /// The key id (`kid`) of the signing key.
    public let keyID: String
    /// `http://host:port/token/{kind}/{id}`: the template for a `TokenFetcher`.
    public var urlTemplate: String { "http://\(host):\(port)/token/{kind}/{id}" }

    private let host: String
    private let task: Task<Void, any Error>
    private let group: ServiceGroup
    private let counters: Counters

    private init(host: String, port: Int, keyID: String, task: Task<Void, any Error>, group: ServiceGroup, counters: Counters) {
        self.host = host
        self.port = port
        self.keyID = keyID
        self.task = task
        self.group = group
        self.counters = counters
    }

    /// Tokens issued so far.
    public var issuedCount: Int { counters.issued.withLock { $0 } }
    /// Requests answered so far (including faults).
    public var requestCount: Int { counters.requests.withLock { $0 } }
    /// Every token issued so far, by `kind/id`, oldest first; empty unless
    /// ``Configuration/recordIssuedTokens`` is set.
    public var issuedTokens: [String: [String]] { counters.issuedTokens.withLock { $0 } }

    /// Starts an issuer and returns once it accepts connections.
    /// - Throws: ``StartError``, or the server's error when it cannot bind.
    public static func start(_ configuration: Configuration = Configuration(), logger: Logger) async throws -> DevTokenIssuer {
        guard configuration.allowNonLoopback || isLoopback(configuration.host) else {
            throw StartError.nonLoopbackHost(configuration.host)
        }
        let signingKey = try loadKey(configuration.keyFile)
        let keyID = String(TokenIssuing.fingerprint(signingKey.publicKey.derRepresentation).prefix(40))
        let keys = JWTKeyCollection()
        await keys.add(rsa: signingKey, digestAlgorithm: .sha256, kid: JWKIdentifier(string: keyID))
        let counters = Counters(recordingTokens: configuration.recordIssuedTokens)
        let issuing = TokenIssuing(keys: keys, keyID: keyID, configuration: configuration, counters: counters)

        let router = Router()
        router.get("token/:kind/:id") { request, context in
            try await issuing.answer(request, context: context)
        }
        router.get("stats") { _, _ in
            let body = #"{"issued":\#(counters.issued.withLock { $0 }),"requests":\#(counters.requests.withLock { $0 })}"#
            return Response(status: .ok, headers: [.contentType: "application/json"], body: .init(byteBuffer: ByteBuffer(string: body)))
        }
        router.get("stats/issued") { _, _ in
            let times = counters.issuedAt.withLock { $0 }
            let body = (try? JSONSerialization.data(withJSONObject: times, options: [.sortedKeys])) ?? Data("{}".utf8)
            return Response(status: .ok, headers: [.contentType: "application/json"], body: .init(byteBuffer: ByteBuffer(bytes: body)))
        }
        router.get("stats/tokens") { _, _ in
            guard counters.recordingTokens else {
                return Response(status: .notFound, headers: [.contentType: "application/json"],
                                body: .init(byteBuffer: ByteBuffer(string: #"{"error":"issued tokens are not recorded; start with --record-issued-tokens"}"#)))
            }
            let tokens = counters.issuedTokens.withLock { $0 }
            let body = (try? JSONSerialization.data(withJSONObject: tokens, options: [.sortedKeys])) ?? Data("{}".utf8)
            return Response(status: .ok, headers: [.contentType: "application/json"], body: .init(byteBuffer: ByteBuffer(bytes: body)))
        }
        let (portStream, portContinuation) = AsyncStream<Int>.makeStream()
        let app = Application(
            router: router,
            configuration: .init(address: .hostname(configuration.host, port: configuration.port),
                                 serverName: "dev-token-server"),
            onServerRunning: { channel in
                portContinuation.yield(channel.localAddress?.port ?? 0)
                portContinuation.finish()
            },
            logger: logger)
        let group = ServiceGroup(configuration: .init(services: [app], logger: logger))
        let task = Task {
            defer { portContinuation.finish() }
            try await group.run()
        }
        var port = 0
        for await bound in portStream { port = bound }
        guard port > 0 else {
            _ = try await task.value
            throw StartError.badKeyFile("(server)", "the server stopped before listening")
        }
        logger.info("development token issuer listening", metadata: [
            "url": .string("http://\(configuration.host):\(port)/token/{kind}/{id}"), "kid": .string(keyID),
        ])
        return DevTokenIssuer(host: configuration.host, port: port, keyID: keyID, task: task, group: group, counters: counters)
    }

    /// Stops the server gracefully (open requests, such as a simulated hang, are cut).
    public func stop() async {
        await group.triggerGracefulShutdown()
        let task = self.task
        // A request that never ends (fault=hang) would hold a graceful shutdown forever.
        let deadline = Task {
            try await Task.sleep(for: .seconds(2))
            task.cancel()
        }
        _ = try? await task.value
        deadline.cancel()
    }

    /// Waits until the server stops (for the standalone executable).
    public func wait() async throws {
        try await task.value
    }

    /// Literal loopback addresses only: a name such as `127.example.com` could be anything.
    static func isLoopback(_ host: String) -> Bool {
        if host == "localhost" || host == "::1" { return true }
        let octets = host.split(separator: ".", omittingEmptySubsequences: false)
        return octets.count == 4 && octets.first == "127" && octets.allSatisfy { UInt8($0) != nil }
    }

    private static func loadKey(_ path: String?) throws -> JWTKit.Insecure.RSA.PrivateKey {
        guard let path else {
            return try JWTKit.Insecure.RSA.PrivateKey(backing: _RSA.Signing.PrivateKey(keySize: .bits2048))
        }
        guard let pem = FileManager.default.contents(atPath: path) else {
            throw StartError.badKeyFile(path, "cannot read it")
        }
        do {
            return try JWTKit.Insecure.RSA.PrivateKey(pem: String(decoding: pem, as: UTF8.self))
        } catch {
            throw StartError.badKeyFile(path, "not a PEM RSA private key (\(error))")
        }
    }
}

final class Counters: Sendable {
    let issued = Mutex(0)
    let requests = Mutex(0)
    /// When each subject's tokens were issued (Unix seconds), for GET /stats/issued: tests of
    /// several agents check that no key was fetched twice within one token lifetime. The latest
    /// ``issuedTimesKept`` per subject: a demo agent with 2-minute tokens added 720 a day per
    /// subject, for as long as it ran.
    let issuedAt = Mutex<[String: [Double]]>([:])
    /// How many issue times ``issuedAt`` keeps per subject.
    static let issuedTimesKept = 1_000
    /// Whether ``issuedTokens`` is kept (``DevTokenIssuer/Configuration/recordIssuedTokens``).
    let recordingTokens: Bool
    /// Every token issued, by `kind/id`, for GET /stats/tokens: tests that scan a store's bytes
    /// for plaintext tokens check every token the agent ever received.
    let issuedTokens = Mutex<[String: [String]]>([:])

    init(recordingTokens: Bool) {
        self.recordingTokens = recordingTokens
    }

    func noteIssued(kind: String, subject: String, at time: Date, token: String) {
        let name = "\(kind)/\(subject)"
        issued.withLock { $0 += 1 }
        issuedAt.withLock { issuedAt in
            issuedAt[name, default: []].append(time.timeIntervalSince1970)
            if issuedAt[name]!.count > Self.issuedTimesKept { issuedAt[name]!.removeFirst() }
        }
        if recordingTokens { issuedTokens.withLock { $0[name, default: []].append(token) } }
    }
}
