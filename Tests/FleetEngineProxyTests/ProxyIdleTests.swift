// A caller's connection is idle when nothing moves on it and none of its calls is waiting for
// an answer: a call waiting on Fleet Engine (or on a retry: two upstream attempts and a fetch)
// longer than the idle timeout keeps its connection. The idle timeout was once shorter than a
// retried call's longest wait, and such a call lost its connection before its answer.

@testable import FleetEngineProxy
import Foundation
import TestSupportKit
import Testing
#if canImport(Glibc)
import Glibc
#endif

@Suite("Fleet Engine proxy: idle connections", .paced)
struct ProxyIdleTests {
    @Test("a call waiting on Fleet Engine longer than the idle timeout keeps its connection and gets its answer; a connection with nothing waiting is closed")
    func waitingCallIsNotIdle() async throws {
        let rig = try await InProcessProxy.make(label: "proxy-idle-test")
        defer { rig.close() }
        let fake = rig.fake
        // Fleet Engine answers after three idle timeouts. (An idle timeout of 300 ms was once used:
        // on a loaded machine a new connection's request was sometimes read later than that.)
        fake.delayAnswers(by: .seconds(3))

        try await rig.withService(idleTimeout: .seconds(1)) { bound in
            let endpoint = RawHTTP.Endpoint.tcp(port: bound)
            let host = "127.0.0.1:\(bound)"

            let started = ContinuousClock.now
            // Off the cooperative pool: the proxy's fetch on a miss runs a task there.
            let answer = try await offCooperativePool {
                try RawHTTP.send(endpoint, "GET", "/v1/providers/p/vehicles/v-1", host: host,
                                 headers: [("x-goog-api-client", "gl-python/3.11 grpc/1.60")], timeout: 15)
            }
            #expect(answer.status == 200, "\(answer)")
            #expect(ContinuousClock.now - started >= .seconds(3), "the answer came after Fleet Engine's delay")
            #expect(fake.calls.count == 1 && fake.calls.first?.resource == "providers/p/vehicles/v-1", "\(fake.calls)")

            // A connection with nothing waiting: closed once idle (well before 5 s).
            let idle = RawHTTP.openIdle(endpoint)
            try #require(idle >= 0)
            defer { close(idle) }
            var poll = pollfd(fd: idle, events: Int16(POLLIN), revents: 0)
            #expect(Glibc.poll(&poll, 1, 5_000) == 1, "the idle connection was not closed")
            var byte: UInt8 = 0
            #expect(recv(idle, &byte, 1, 0) == 0, "closed without a byte")
        }
    }
}
