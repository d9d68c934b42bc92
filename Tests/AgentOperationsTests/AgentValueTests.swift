// Issue 18: token-agent's small decision types, with plain values: which options a reload
// applies, the counts systemd sees, when refusals count as permanent, how a provider URL is
// printed.

import FleetTokenStore
import Foundation
import Testing
@testable import token_agent

@Suite("token-agent's decisions, with plain values", .paced)
struct AgentValueTests {
    @Test("every live option is copied by a reload, and nothing else is")
    func liveOptions() {
        var proposed = AgentSettings()
        proposed.vehicles = ["v"]; proposed.trips = ["t"]; proposed.deliveryVehicles = ["d"]; proposed.tasks = ["k"]
        proposed.subjectsFile = "/s"; proposed.headers = ["A: b"]; proposed.headerFiles = ["B:/f"]
        proposed.caFiles = ["/ca"]; proposed.extraCAFiles = ["/x"]; proposed.clientCertificate = "/c"; proposed.clientKey = "/k"
        proposed.logLevel = .debug; proposed.allow = ["trip:*"]; proposed.allowClient = ["uid:7 trip:*"]
        proposed.db = "/other.sqlite"; proposed.listen = ["unix:/s"]; proposed.connectTimeout = 9; proposed.logFormat = .json
        let applied = AgentSettings().takingLiveOptions(from: proposed)
        for option in AgentOption.all {
            let changed = applied.values[option.key] != AgentSettings().values[option.key]
            let differs = proposed.values[option.key] != AgentSettings().values[option.key]
            if option.live {
                #expect(applied.values[option.key] == proposed.values[option.key], "\(option.key) is live but not copied")
            } else if differs {
                #expect(!changed, "\(option.key) needs a restart but was copied")
            }
        }
        #expect(AgentOption.all.filter(\.live).map(\.key).sorted() == [
            "allow", "allow-client", "ca-file", "client-cert", "client-key", "delivery-vehicle", "extra-ca-file", "header", "header-file",
            "log-level", "subjects-file", "task", "trip", "vehicle",
        ])
    }

    @Test("STATUS= counts in a fixed order; READY=1 waits until every subject has a token or a failure")
    func counts() throws {
        func status(_ state: SubjectStatus.State, usable: Bool, failed: Bool) -> SubjectStanding {
            let failure = failed ? RefreshFailureState(consecutiveFailures: 1, nextAttemptAt: Date(), lastErrorKind: "httpStatus",
                                                       lastErrorMessage: nil, lastFailureAt: Date()) : nil
            return SubjectStanding(state: state, isUsable: usable, failure: failure)
        }
        let mixed = SubjectCounts([status(.valid, usable: true, failed: false), status(.backoff, usable: false, failed: true),
                                   status(.valid, usable: true, failed: false), status(.refreshDue, usable: true, failed: false)])
        #expect(mixed.description == "2 valid, 1 refresh due, 1 backoff")
        #expect(mixed.isSettled)
        let waiting = SubjectCounts([status(.valid, usable: true, failed: false), status(.unavailable, usable: false, failed: false)])
        #expect(!waiting.isSettled, "a subject with neither a token nor a failed attempt holds READY back")
        #expect(SubjectCounts([]).description == "no subjects" && SubjectCounts([]).isSettled)
    }

    @Test("STATUS= pauses: 200 ms while settling and the status interval once ready, but a slow count paces itself")
    func statusPacing() {
        let pacing = StatusPacing(statusInterval: .seconds(5))
        // A few subjects: counting takes microseconds, the intervals stand.
        #expect(pacing.pause(afterCountingFor: .microseconds(20), ready: false) == .milliseconds(200))
        #expect(pacing.pause(afterCountingFor: .microseconds(20), ready: true) == .seconds(5))
        // 100,000 subjects: a 46 ms count waits 23 s once ready (0.2% of a core), 0.92 s while settling (5%).
        #expect(pacing.pause(afterCountingFor: .milliseconds(46), ready: true) == .seconds(23))
        #expect(pacing.pause(afterCountingFor: .milliseconds(46), ready: false) == .milliseconds(920))
        // Where the two meet: 10 ms of counting is exactly the 5 s interval, 10 ms while settling 200 ms.
        #expect(pacing.pause(afterCountingFor: .milliseconds(10), ready: true) == .seconds(5))
        #expect(pacing.pause(afterCountingFor: .milliseconds(10), ready: false) == .milliseconds(200))
        // A count stretched by a stalled machine (a paused VM): at most 60 s, and 2 s before READY=1.
        #expect(pacing.pause(afterCountingFor: .seconds(3), ready: true) == .seconds(60))
        #expect(pacing.pause(afterCountingFor: .seconds(3), ready: false) == .seconds(2))
        // A status interval set longer than the cap still stands.
        #expect(StatusPacing(statusInterval: .seconds(120)).pause(afterCountingFor: .seconds(3), ready: true) == .seconds(120))
    }

    @Test("refusals count per subject in a row; any other outcome starts again; all subjects must be refused")
    func refusals() throws {
        let a = try TokenKey.vehicle("a"), b = try TokenKey.vehicle("b")
        let next = Date()
        func refused(_ key: TokenKey, _ code: Int = 403) -> TokenSyncEvent {
            .refreshFailed(key: key, error: .httpStatus(code: code, retryAfter: nil), consecutiveFailures: 1, nextAttemptAt: next)
        }
        var refusals = ProviderRefusals(attempts: 2)
        refusals.record(refused(a)); refusals.record(refused(b, 401)); refusals.record(refused(a))
        #expect(!refusals.allRefused([a, b]), "b was refused once")
        refusals.record(refused(b))
        #expect(refusals.allRefused([a, b]))
        refusals.record(.refreshFailed(key: a, error: .timeout(seconds: 5), consecutiveFailures: 3, nextAttemptAt: next))
        #expect(!refusals.allRefused([a, b]), "a timeout is not a refusal: a starts again")
        refusals.record(refused(a)); refusals.record(refused(a))
        #expect(refusals.allRefused([a, b]))
        refusals.record(refused(b, 500))
        #expect(!refusals.allRefused([a, b]), "a 500 is not a refusal")
        #expect(!ProviderRefusals(attempts: 1).allRefused([]), "no subjects: nothing to give up on")
    }

    @Test("refusals remember only configured subjects being refused: after a success or another failure nothing is left of a subject, and other ids are not counted")
    func refusalsForget() throws {
        let next = Date()
        func refused(_ key: TokenKey) -> TokenSyncEvent {
            .refreshFailed(key: key, error: .httpStatus(code: 403, retryAfter: nil), consecutiveFailures: 1, nextAttemptAt: next)
        }
        var refusals = ProviderRefusals(attempts: 3)
        for index in 0..<1_000 {
            let trip = try TokenKey.trip("t\(index)")
            refusals.record(refused(trip))
            refusals.record(index.isMultiple(of: 2)
                ? .refreshed(key: trip, fingerprint: TokenFingerprint(of: "a.b.c"), expiresAt: next, source: .provider)
                : .refreshFailed(key: trip, error: .timeout(seconds: 5), consecutiveFailures: 2, nextAttemptAt: next))
        }
        #expect(refusals.consecutive.count == 0, "subjects remembered after their refusals ended")

        // Ids callers ask for, refused by the provider and never asked for again: not counted.
        let configured = try TokenKey.vehicle("configured")
        for index in 0..<1_000 { refusals.record(refused(try TokenKey.trip("asked-\(index)")), isConfigured: { $0 == configured }) }
        refusals.record(refused(configured), isConfigured: { $0 == configured })
        #expect(refusals.consecutive == [configured: 1])

        // A reload removes it while it is refused: a later refusal forgets it, and so does the
        // reload itself (no later event may come).
        refusals.record(refused(configured), isConfigured: { _ in false })
        #expect(refusals.consecutive.isEmpty)
        refusals.record(refused(configured), isConfigured: { $0 == configured })
        refusals.forgetUnconfigured { _ in false }
        #expect(refusals.consecutive.isEmpty)
    }

    @Test("the provider URL is printed without a password or query values; placeholders stay")
    func providerURL() {
        #expect(EffectiveConfiguration.redactedURL("https://auth.example.com/fleet/{kind}/{id}") == "https://auth.example.com/fleet/{kind}/{id}")
        #expect(EffectiveConfiguration.redactedURL("https://gw:s3cret@auth.example.com/t/{id}") == "https://gw:***@auth.example.com/t/{id}")
        #expect(EffectiveConfiguration.redactedURL("https://a.example/t?api_key=s3cret&vehicle={id}&flag")
                == "https://a.example/t?api_key=<redacted>&vehicle={id}&flag")
    }
}
