import FleetTokenHTTP
import FleetTokenStore
import Foundation
import Logging
import Testing
import TestSupportKit

/// The fetcher's request shape and route (issue 14, library level): POST bodies, the proxy chosen
/// for the template's host, and the configurations it refuses.
@Suite("HTTPTokenFetcher: request method, body and proxy", .paced, .exclusive)
struct ProviderRequestShapeTests {
    let key = try! TokenKey.task("task 1/\"x\"")

    func configuration(_ url: String, pki: TestPKI) -> HTTPTokenFetcherConfiguration {
        var configuration = HTTPTokenFetcherConfiguration(urlTemplate: url)
        configuration.tls.caFiles = [pki.caPath]
        // Generous: in a full parallel run the CONNECT through the test proxy once took over 2 s.
        configuration.connectTimeout = 10
        configuration.totalTimeout = 20
        return configuration
    }

    @Test("POST sends the rendered body with its content type; the URL may leave the subject to the body")
    func postBody() async throws {
        let pki = try TestPKI()
        defer { pki.removeFiles() }
        let server = try TLSTokenServer(pki: pki, answer: TLSTokenServer.anyKindToken { _ in ("task", "task 1/\"x\"") })
        try await server.whileRunning {
            var configuration = configuration("\(server.baseURL)/mint", pki: pki)
            configuration.method = .post
            configuration.body = try RequestBodyTemplate(#"{"taskId":"{id}","kind":"{kind}"}"#, contentType: "application/json; charset=utf-8")
            let fetcher = try HTTPTokenFetcher(configuration: configuration, logger: Logger(label: "shape-test"))
            _ = try await fetcher.fetchToken(for: key)
            await fetcher.shutdown()
            let request = try #require(server.requests.first)
            #expect(request.method == .POST)
            #expect(request.bodyText == #"{"taskId":"task 1/\"x\"","kind":"task"}"#)
            #expect(request.headers.first(name: "Content-Type") == "application/json; charset=utf-8")
            #expect(request.headers.first(name: "Content-Length") == "\(request.body.count)")
        }
    }

    @Test("configurations that cannot work are refused at init")
    func refusedConfigurations() throws {
        var body = HTTPTokenFetcherConfiguration(urlTemplate: "https://auth.example.com/mint")
        body.body = try RequestBodyTemplate("id={id}", contentType: "application/x-www-form-urlencoded")
        #expect(throws: HTTPFetcherConfigurationError.request("a body template needs the POST method")) {
            try HTTPTokenFetcher(configuration: body, logger: Logger(label: "shape-test"))
        }
        body.method = .post
        _ = try HTTPTokenFetcher(configuration: body, logger: Logger(label: "shape-test"))
        body.body = try RequestBodyTemplate("kind={kind}", contentType: "application/x-www-form-urlencoded")
        #expect(throws: HTTPFetcherConfigurationError.missingIDPlaceholder("https://auth.example.com/mint")) {
            try HTTPTokenFetcher(configuration: body, logger: Logger(label: "shape-test"))
        }
    }

    @Test("the proxy carries the request through a CONNECT tunnel; NO_PROXY sends it direct; a dead proxy is named")
    func proxyRoute() async throws {
        let pki = try TestPKI()
        defer { pki.removeFiles() }
        let proxy = ConnectProxy(username: "gw", password: "pa:ss@word-long-enough")
        let server = try TLSTokenServer(pki: pki, answer: TLSTokenServer.anyKindToken())
        let dead = ConnectProxy()
        let deadPort = try await dead.whileRunning { dead.port }
        try await proxy.whileRunning {
            try await server.whileRunning {
                let environment = ["HTTPS_PROXY": "http://gw:pa%3Ass%40word-long-enough@127.0.0.1:\(proxy.port)"]
                for (noProxy, expectedTunnels) in [("", 1), ("127.0.0.1", 1)] {
                    var configuration = configuration("\(server.baseURL)/token/{kind}/{id}", pki: pki)
                    configuration.proxy = try ProxySettings.fromEnvironment(environment.merging(["NO_PROXY": noProxy]) { $1 })
                    let fetcher = try HTTPTokenFetcher(configuration: configuration, logger: Logger(label: "shape-test"))
                    _ = try await fetcher.fetchToken(for: key)
                    await fetcher.shutdown()
                    #expect(proxy.requests.filter { $0.outcome == .tunnelled }.count == expectedTunnels)
                }
                #expect(server.requests.count == 2)
                #expect(proxy.requests.first?.target == "127.0.0.1:\(server.port)")

                var configuration = configuration("\(server.baseURL)/token/{kind}/{id}", pki: pki)
                configuration.proxy = ProxySettings(proxy: .init(host: "127.0.0.1", port: deadPort))
                let fetcher = try HTTPTokenFetcher(configuration: configuration, logger: Logger(label: "shape-test"))
                let error = await #expect(throws: TokenProviderError.self) { try await fetcher.fetchToken(for: key) }
                await fetcher.shutdown()
                #expect(error?.kind == "unreachable")
                #expect(error?.description.contains("through the proxy 127.0.0.1:\(deadPort)") == true, "\(String(describing: error))")
            }
        }
    }
}
