// Issue 27 item 2 from the outside: a real token-agent, run twice with --once, against a real
// HTTPS provider whose clock runs an hour ahead (its tokens' iat/exp and its Date header). The
// second run must not serve the stored token once the provider considers it expired, although
// by this machine's clock it has an hour left. The tokens live 2 s, so the test waits until the
// provider's clock is past the token's expiry (about 3 s), not a token's hour.

import FleetTokenStoreTesting
import FleetTokenStore
import Foundation
import NIOHTTP1
import TestSupportKit
import Testing

@Suite("token-agent and a provider whose clock runs ahead", .paced, .serialized, .exclusive)
struct AgentProviderClockTests {
    /// A provider an hour ahead of this machine, minting `lifetime`-second vehicle tokens.
    static func aheadProvider(by ahead: TimeInterval, lifetime: TimeInterval) -> TLSTokenServer.Respond {
        { request in
            let providerNow = Date().addingTimeInterval(ahead)
            let token = TestJWT.make(kind: .vehicle, subject: request.lastPathComponent, issuedAt: providerNow, lifetime: lifetime)
            let expiration = Int(providerNow.timeIntervalSince1970) + Int(lifetime)
            let formatter = DateFormatter()
            formatter.locale = Locale(identifier: "en_US_POSIX")
            formatter.timeZone = TimeZone(identifier: "GMT")
            formatter.dateFormat = "EEE, dd MMM yyyy HH:mm:ss 'GMT'"
            return .init(headers: ["Content-Type": "application/json", "Date": formatter.string(from: providerNow)],
                         body: #"{"VEHICLE_TOKEN_KEY":"\#(token)","TOKEN_EXPIRATION":\#(expiration)}"#)
        }
    }

    @Test("a restarted --once run does not serve a stored token the provider considers expired; it fetches")
    func restartedOnceRunFetches() async throws {
        let pki = try TestPKI()
        defer { pki.removeFiles() }
        let server = try TLSTokenServer(pki: pki, answer: Self.aheadProvider(by: 3600, lifetime: 2))
        try await server.whileRunning {
            let scratch = Scratch()
            let db = scratch.file("tokens.sqlite")
            let arguments = ["--db", db, "--provider-url", server.baseURL + "/token/{kind}/{id}", "--vehicle", "truck-7",
                             "--ca-file", pki.caPath, "--once", "--json"]
            let first = try await AgentFixture.runDirect(arguments, scratch)
            #expect(first.status == 0, "\(first.stderr)")
            #expect(try onceResults(first.stdout).map { $0["source"] } == ["provider"])
            #expect(server.requests.count == 1)

            // Wait until, by the provider's clock, the 2 s token has expired (its exp is whole
            // seconds, as is the Date header the agent reads the provider's clock from: 1 s of
            // margin); by ours it has an hour left.
            let answered = try #require(server.requests.first).date.addingTimeInterval(3600)
            let expiry = Date(timeIntervalSince1970: answered.timeIntervalSince1970.rounded(.down) + 2)
            #expect(await eventually(within: 30) { Date().addingTimeInterval(3600) > expiry.addingTimeInterval(1) })
            let second = try await AgentFixture.runDirect(arguments, scratch)
            #expect(second.status == 0, "\(second.stderr)")
            #expect(try onceResults(second.stdout).map { $0["source"] } == ["provider"], "\(second.stdout)")
            #expect(server.requests.count == 2)
        }
    }
}
