import AsyncHTTPClient
import Foundation
import NIOCore
import NIOHTTP1
import TestSupportKit
#if canImport(Glibc)
import Glibc
#endif

/// A client of the local token API over a Unix socket or loopback TCP (AsyncHTTPClient).
struct APIClient: Sendable {
    let client: HTTPClient
    /// `http+unix://<socket>` or `http://127.0.0.1:PORT`.
    let base: String

    static func unix(_ path: String, _ client: HTTPClient) -> APIClient {
        APIClient(client: client, base: "http+unix://" + path.addingPercentEncoding(withAllowedCharacters: .alphanumerics)!)
    }

    static func tcp(_ port: Int, _ client: HTTPClient) -> APIClient {
        APIClient(client: client, base: "http://127.0.0.1:\(port)")
    }

    struct Answer: Sendable {
        let status: Int
        let headers: HTTPHeaders
        let body: String
        var json: [String: Any]? { try? JSONSerialization.jsonObject(with: Data(body.utf8)) as? [String: Any] }
    }

    /// The API's request header, present unless `marked` is false.
    func send(_ path: String, method: HTTPMethod = .GET, marked: Bool = true, headers: [(String, String)] = []) async throws -> Answer {
        var request = HTTPClientRequest(url: base + path)
        request.method = method
        if marked { request.headers.add(name: "Fleet-Token-Request", value: "true") }
        for (name, value) in headers { request.headers.add(name: name, value: value) }
        let response = try await client.execute(request, timeout: .seconds(30))
        let body = try await response.body.collect(upTo: 1 << 22)
        return Answer(status: Int(response.status.code), headers: response.headers, body: String(buffer: body))
    }
}

/// An HTTP client allowing many connections per host, shut down after `body`.
func withAPIClient<T>(_ body: (HTTPClient) async throws -> T) async throws -> T {
    var configuration = HTTPClient.Configuration()
    configuration.connectionPool.concurrentHTTP1ConnectionsPerHostSoftLimit = 1200
    configuration.timeout = .init(connect: .seconds(10))
    let client = HTTPClient(eventLoopGroupProvider: .singleton, configuration: configuration)
    do {
        let result = try await body(client)
        try await client.shutdown()
        return result
    } catch {
        try? await client.shutdown()
        throw error
    }
}

/// A long-lived token-agent with the API on a Unix socket (and loopback TCP when `tcp`).
struct APIAgent {
    let process: RunningProcess
    let socket: String
    let tcpPort: Int?

    /// `logLevel` nil leaves the level to the arguments or a config file (it must log notices,
    /// which say when the API listens).
    static func start(_ scratch: Scratch, provider: String, _ arguments: [String], tcp: Bool = false,
                      socket: String? = nil, logLevel: String? = "trace") async throws -> APIAgent {
        let socket = socket ?? scratch.file("api.sock")
        var all = ["--db", scratch.file("tokens.sqlite"), "--provider-url", provider, "--listen", "unix:\(socket)"]
            + (logLevel.map { ["--log-level", $0] } ?? []) + arguments
        if tcp { all += ["--listen", "127.0.0.1:0"] }
        let agent = try await AgentFixture.serving(all, listeners: tcp ? 2 : 1, in: scratch)
        return APIAgent(process: agent.process, socket: socket, tcpPort: tcp ? agent.tcpPort : nil)
    }

    /// Sends SIGTERM and waits (bounded); the exit status, nil if it did not stop in 20 s.
    func stop() async -> Int32? {
        process.signal(SIGTERM)
        return await process.wait(upTo: 20)
    }
}

/// Every line of Prometheus text format 0.0.4 is a comment or `name{labels} value`.
func isPrometheusText(_ text: String) -> Bool {
    let sample = #"^[a-zA-Z_:][a-zA-Z0-9_:]*(\{([a-zA-Z_][a-zA-Z0-9_]*="([^"\\]|\\.)*",?)*\})? -?([0-9.e+-]+|NaN|\+Inf|-Inf)( [0-9]+)?$"#
    return text.split(separator: "\n").allSatisfy { line in
        line.hasPrefix("# HELP ") || line.hasPrefix("# TYPE ") || line.range(of: sample, options: .regularExpression) != nil
    }
}

/// The value of an unlabelled sample in Prometheus text.
func sample(_ name: String, in text: String) -> Double? {
    text.split(separator: "\n").first { $0.hasPrefix(name + " ") }.flatMap { Double($0.split(separator: " ")[1]) }
}
