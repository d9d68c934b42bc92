// The test kit's RawHTTP.pipelined writes its burst from a thread of its own while it reads.
// It closed the connection as soon as reading ended, while the writer could still be sending:
// the writer's next send then went to whatever socket of the process had taken the number,
// another test's connection among them.

import Foundation
import Synchronization
import Testing
import TestSupportKit
#if canImport(Glibc)
import Glibc
#endif

@Suite("Test kit: raw HTTP", .paced)
struct RawHTTPKitTests {
    @Test("pipelined() returns once its writer is done with the connection: a socket that takes the old number afterwards receives nothing")
    func writerStopsBeforeTheClose() async throws {
        let server = try HalfClosingServer()
        defer { server.close() }
        // 16 MB, more than the kernel buffers between the two ends hold (about 4 MB here): the
        // writer waits in send() (up to the 2 s timeout) when the server's end of the answers
        // makes reading end. Made inside the call, so that it is freed when pipelined()
        // returns: the uptime tests read the whole process's live heap.
        let answers = try await offCooperativePool {
            let burst = String(repeating: "GET /v1/token/vehicle/v-1 HTTP/1.1\r\nHost: localhost\r\n\r\n", count: 285_000)
            return try RawHTTP.pipelined(.tcp(port: server.port), [burst], timeout: 2)
        }
        #expect(answers.isEmpty)

        // The kernel hands out the lowest free number: the connection's, if it was closed.
        var pairs: [(Int32, Int32)] = []
        defer { for (one, other) in pairs { close(one); close(other) } }
        for _ in 0..<16 {
            var ends: [Int32] = [-1, -1]
            guard socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue), 0, &ends) == 0 else { break }
            pairs.append((ends[0], ends[1]))
        }
        // The server reads a little: a writer still waiting in send() moves on to its next send.
        server.drain()
        let ends = pairs.flatMap { [$0.0, $0.1] }
        let strayed = await eventually(within: 4) {
            ends.contains { descriptor in
                var byte: UInt8 = 0
                return recv(descriptor, &byte, 1, Int32(MSG_DONTWAIT)) > 0
            }
        }
        #expect(!strayed, "bytes of the burst arrived on a socket opened after pipelined() returned")
        #expect(server.drained > 0, "the server received the start of the burst")
    }
}

/// A TCP server on 127.0.0.1 for one connection: it accepts, ends its side once 64 KiB of the
/// client's data wait unread (the client reads the end while it is still sending), and reads
/// nothing until ``drain()``, then about 1 MiB.
final class HalfClosingServer: Sendable {
    let port: Int
    private let descriptor: Int32
    /// The listener is shut down and closed under this lock, and shut down only while open.
    private let state = Mutex((draining: false, drained: 0, closed: false, listenerOpen: true))

    init() throws {
        (descriptor, port) = try boundLoopbackSocket(listening: 4)
        Thread { [self] in serve() }.start()
    }

    /// Bytes read since ``drain()``.
    var drained: Int { state.withLock { $0.drained } }

    /// Lets the server read about 1 MiB.
    func drain() { state.withLock { $0.draining = true } }

    /// Ends the server; its thread closes the connection within 100 ms.
    func close() {
        state.withLock { state in
            state.closed = true
            if state.listenerOpen { shutdown(descriptor, Int32(SHUT_RDWR)) }
        }
    }

    private func serve() {
        defer {
            state.withLock { state in
                state.listenerOpen = false
                Glibc.close(descriptor)
            }
        }
        var entry = pollfd(fd: descriptor, events: Int16(POLLIN), revents: 0)
        while !state.withLock({ $0.closed }), poll(&entry, 1, 100) == 0 {}
        let connection = accept(descriptor, nil, nil)
        guard connection >= 0 else { return }
        defer { Glibc.close(connection) }
        // The end of the answers once the burst is arriving, so that the writer is sending.
        var buffer = [UInt8](repeating: 0, count: 65_536)
        let deadline = Date().addingTimeInterval(10)
        while !state.withLock({ $0.closed }), Date() < deadline,
              recv(connection, &buffer, buffer.count, Int32(MSG_PEEK | MSG_DONTWAIT)) < buffer.count {
            usleep(10_000)
        }
        shutdown(connection, Int32(SHUT_WR))
        while !state.withLock({ $0.closed }) {
            let (draining, drained) = state.withLock { ($0.draining, $0.drained) }
            guard draining, drained < 1 << 20 else {
                usleep(20_000)
                continue
            }
            var readable = pollfd(fd: connection, events: Int16(POLLIN), revents: 0)
            guard poll(&readable, 1, 100) > 0 else { continue }
            let count = read(connection, &buffer, buffer.count)
            guard count > 0 else { return }
            state.withLock { $0.drained += count }
        }
    }
}
