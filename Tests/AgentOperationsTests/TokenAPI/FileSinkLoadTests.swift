// Issue 26 item 4: the file sink costs what changed, not a walk of every subject per event.
// A real token-agent (--sink, --listen, --allow 'trip:*') and a real dev-token-server with
// short-lived tokens: a few tracked vehicles and many pattern-allowed trips, all refreshing
// every few seconds, while the test compares each vehicle's file with the API's token.

import FleetTokenService
import TokenAgentRuntime
import FleetTokenStore
import FleetTokenStoreTesting
import Foundation
import Logging
import TestSupportKit
import Testing
#if canImport(Glibc)
import Glibc
#endif

@Suite("token-agent --sink under load: files follow what changed", .paced, .exclusive)
struct FileSinkLoadTests {
    /// Pattern-allowed trip ids fetched through the API (each then refreshed by the agent while
    /// used within the idle window).
    static let trips = 1_000
    /// The issuer's token lifetime: refreshed at about 80% of it (minus up to 5% jitter).
    static let lifetime = 10
    static let vehicles = ["v-1", "v-2", "v-3"]
    /// How long the load runs while the files are compared with the API.
    static let window: Double = 60

    /// `iat` and `exp` of a JWT, in seconds since 1970.
    static func times(of jwt: String) -> (iat: Double, exp: Double)? {
        let parts = jwt.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3 else { return nil }
        var payload = parts[1].replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
        payload += String(repeating: "=", count: (4 - payload.count % 4) % 4)
        guard let data = Data(base64Encoded: payload),
              let object = try? JSONSerialization.jsonObject(with: data) as? [String: Any],
              let iat = (object["iat"] as? NSNumber)?.doubleValue, let exp = (object["exp"] as? NSNumber)?.doubleValue else { return nil }
        return (iat, exp)
    }

    /// What the observer saw, for the assertions and the record.
    struct Observed: Sendable {
        var comparisons = 0
        var behind = 0
        /// The most seconds a file held a token past its (latest possible) soft point while the
        /// API served a newer one.
        var worstLag: Double = -.infinity
        var lagging: [String] = []
        var slowestTokenGET: Double = 0
        var slowestSubjects: Double = 0
        var subjectsCalls = 0
        /// When the API first served each token (by fingerprint), and the longest seen between
        /// that and the file first holding it (to the observer's resolution, a few tenths of a second).
        var firstServed: [String: Date] = [:]
        var followed: Set<String> = []
        var slowestFollow: Double = 0
        var failures: [String] = []
    }

    @Test("with 1,000 pattern-allowed trips refreshing, each tracked vehicle's file is never more than 5 s past its token's soft point while the API serves a newer one; a token GET and /v1/subjects stay live")
    func filesKeepUpWhileManyUntrackedSubjectsRefresh() async throws {
        let scratch = Scratch()
        let issuer = try await IssuerProcess(scratch: scratch, lifetime: Self.lifetime)
        let sink = scratch.file("sink")
        let agent = try await APIAgent.start(scratch, provider: issuer.template,
                                             ["--sink", sink, "--allow", "trip:*"] + Self.vehicles.flatMap { ["--vehicle", $0] },
                                             logLevel: "notice")
        let files = Self.vehicles.map { "\(sink)/vehicle/\($0).jwt" }
        #expect(await eventually(within: 60) { files.allSatisfy { FileManager.default.fileExists(atPath: $0) } }, "\(agent.process.stderr)")

        let observed = try await withAPIClient { client in
            let api = APIClient.unix(agent.socket, client)
            let stop = EndFlag()
            // Four clients fetch every trip once (each a miss: a fetch), then keep using them
            // (memory hits, paced) so that the agent keeps refreshing them.
            let load = Task {
                await withDiscardingTaskGroup { group in
                    for worker in 0..<4 {
                        group.addTask {
                            var index = worker
                            while !stop.isSet {
                                _ = try? await api.send("/v1/token/trip/t-\(index % Self.trips)")
                                index += 4
                                if index >= Self.trips { try? await Task.sleep(for: .milliseconds(10)) }
                            }
                        }
                    }
                }
            }
            var observed = Observed()
            let deadline = Date().addingTimeInterval(Self.window)
            var nextSubjects = Date()
            while Date() < deadline {
                for (vehicle, file) in zip(Self.vehicles, files) {
                    let asked = Date()
                    let answer = try await api.send("/v1/token/vehicle/\(vehicle)")
                    observed.slowestTokenGET = max(observed.slowestTokenGET, Date().timeIntervalSince(asked))
                    guard answer.status == 200, let served = answer.json?["token"] as? String, let servedTimes = Self.times(of: served) else {
                        observed.failures.append("GET vehicle/\(vehicle): \(answer.status)")
                        continue
                    }
                    // Read after the API answered: the agent held `served` before this read.
                    guard let data = FileManager.default.contents(atPath: file) else {
                        observed.failures.append("\(file) missing")
                        continue
                    }
                    let now = Date().timeIntervalSince1970
                    let written = String(decoding: data, as: UTF8.self)
                    let servedPrint = TokenFingerprint(of: served).description, writtenPrint = TokenFingerprint(of: written).description
                    if observed.firstServed[servedPrint] == nil { observed.firstServed[servedPrint] = asked }
                    if let first = observed.firstServed[writtenPrint], observed.followed.insert(writtenPrint).inserted {
                        observed.slowestFollow = max(observed.slowestFollow, Date().timeIntervalSince(first))
                    }
                    observed.comparisons += 1
                    guard written != served, let writtenTimes = Self.times(of: written), servedTimes.iat > writtenTimes.iat else { continue }
                    observed.behind += 1
                    // The latest the soft point can be: 80% of the lifetime (jitter moves it earlier).
                    let lag = now - (writtenTimes.iat + 0.8 * (writtenTimes.exp - writtenTimes.iat))
                    observed.worstLag = max(observed.worstLag, lag)
                    if lag > 5 {
                        observed.lagging.append("\(vehicle): file \(TokenFingerprint(of: written)) \(String(format: "%.1f", lag)) s past its soft point, "
                                                + "\(String(format: "%.1f", now - writtenTimes.exp)) s past exp; API \(TokenFingerprint(of: served))")
                    }
                }
                if Date() >= nextSubjects {
                    let asked = Date()
                    let subjects = try await api.send("/v1/subjects")
                    observed.slowestSubjects = max(observed.slowestSubjects, Date().timeIntervalSince(asked))
                    observed.subjectsCalls += 1
                    if subjects.status != 200 { observed.failures.append("GET /v1/subjects: \(subjects.status)") }
                    nextSubjects = Date().addingTimeInterval(2)
                }
                try await Task.sleep(for: .milliseconds(200))
            }
            stop.set()
            await load.value
            return observed
        }
        let issued = try await issuer.stats().issued
        let summary = "trips \(Self.trips), lifetime \(Self.lifetime) s, window \(Int(Self.window)) s: issued \(issued), "
            + "\(observed.comparisons) comparisons, \(observed.behind) behind, worst \(observed.behind == 0 ? "-" : String(format: "%.1f", observed.worstLag)) s past the soft point, "
            + "\(observed.followed.count) tokens followed, slowest \(String(format: "%.1f", observed.slowestFollow)) s after the API served it; "
            + "slowest token GET \(String(format: "%.2f", observed.slowestTokenGET)) s, slowest /v1/subjects \(String(format: "%.2f", observed.slowestSubjects)) s "
            + "(\(observed.subjectsCalls) calls)"
        print("FileSinkLoadTests: \(summary)")
        #expect(issued > Self.trips + Self.vehicles.count, "the trips were refreshed during the load: \(summary)")
        #expect(observed.failures.isEmpty, "\(observed.failures.prefix(5)); \(summary)")
        #expect(observed.comparisons > 100, "the files were compared throughout: \(summary)")
        #expect(observed.lagging.isEmpty, "\(observed.lagging.count) times a file was more than 5 s past its soft point while the API served a newer token: \(observed.lagging.prefix(5)); \(summary)")
        // Liveness only (no timing goal): the API answers while the sink follows the load.
        #expect(observed.slowestTokenGET < 10, "\(summary)")
        #expect(observed.slowestSubjects < 10, "\(summary)")
        #expect(await agent.stop() == 0, "\(agent.process.stderr.suffix(2000))")
    }
}
