// The test kit's FreezingRelay (used by the PostgreSQL host tests) must act only on descriptors
// it still holds. A fresh-clone CI run failed a PostgreSQL test that had nothing to do with the
// relay: its connection to the shared server was reset while it opened. The relay's accept loop
// closes the listener soon after freeze(); stop() then shut the listener's number down again,
// and by then the process had given that number to another socket.

import Foundation
import Testing
import TestSupportKit
#if canImport(Glibc)
import Glibc
#endif

@Suite("Test kit: the freezing relay", .paced)
struct FreezingRelayKitTests {
    @Test("stop() after freeze() leaves alone a socket that has since taken the number of the relay's closed listener")
    func stopLeavesReusedNumbersAlone() async throws {
        let target = try SilentSocket(listening: true)
        defer { target.close() }
        // The number must come back to this test and not to another thread of the process;
        // the kernel hands out the lowest free number, so a few rounds are enough.
        var arranged = false
        for _ in 0..<5 where !arranged {
            let relay = try FreezingRelay(target: target.port)
            let listener = try #require(Self.listeningDescriptor(port: relay.port), "the relay's listening socket")
            let inode = Self.inode(listener)
            relay.freeze()
            #expect(await eventually(within: 5) { Self.inode(listener) != inode },
                    "the relay's accept loop closes its listener after freeze()")
            // Stream socket pairs: a shut-down end refuses to send (EPIPE).
            var held: [Int32] = []
            defer { for descriptor in held { close(descriptor) } }
            for _ in 0..<8 where !held.contains(listener) {
                var pair: [Int32] = [-1, -1]
                guard socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0, &pair) == 0 else { break }
                held += pair
            }
            guard held.contains(listener) else {
                relay.stop()
                continue
            }
            arranged = true
            relay.stop()
            let sent = send(listener, "x", 1, Int32(MSG_NOSIGNAL))
            #expect(sent == 1, "the socket holding the relay's old number was shut down by stop(): errno \(errno)")
        }
        #expect(arranged, "in five rounds another thread always took the relay's old number first")
    }

    /// The inode of what `descriptor` refers to; nil once it is closed.
    static func inode(_ descriptor: Int32) -> UInt? {
        var status = stat()
        return fstat(descriptor, &status) == 0 ? UInt(status.st_ino) : nil
    }

    /// The descriptor of this process listening on 127.0.0.1:`port`.
    static func listeningDescriptor(port: Int) -> Int32? {
        let entries = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd")) ?? []
        return entries.compactMap { Int32($0) }.first { isListening($0, port: port) }
    }

    /// True when `descriptor` is a listening socket bound to `port`.
    static func isListening(_ descriptor: Int32, port: Int) -> Bool {
        var address = sockaddr_in()
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let named = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(descriptor, $0, &length) == 0 }
        }
        guard named, address.sin_family == sa_family_t(AF_INET), Int(UInt16(bigEndian: address.sin_port)) == port else { return false }
        var accepting: Int32 = 0
        var size = socklen_t(MemoryLayout<Int32>.size)
        return getsockopt(descriptor, SOL_SOCKET, SO_ACCEPTCONN, &accepting, &size) == 0 && accepting == 1
    }
}
