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
        // The number must come back to this test and not to another thread of the process. As
        // soon as the listener's number is free, F_DUPFD claims it: it gives the lowest free number
        // at or above the one asked for, so it takes that number or a higher one and never
        // another thread's socket. In a full run other tests open sockets all the time and may
        // take the number first (seen in a fresh-clone CI run: five rounds all lost); a lost round
        // is simply tried again.
        var arranged = false
        for _ in 0..<40 where !arranged {
            let relay = try FreezingRelay(target: target.port)
            let listener = try #require(Self.listeningDescriptor(port: relay.port), "the relay's listening socket")
            let inode = Self.inode(listener)
            // Stream socket pair: a shut-down end refuses to send (EPIPE).
            var pair: [Int32] = [-1, -1]
            try #require(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0, &pair) == 0, "a socket pair: errno \(errno)")
            defer { close(pair[0]); close(pair[1]) }
            relay.freeze()
            let claimed = Self.claimWhenFreed(listener, formerInode: inode, with: pair[0], within: 5)
            guard let claimed else {
                relay.stop()
                continue
            }
            defer { close(claimed) }
            arranged = true
            relay.stop()
            let sent = send(claimed, "x", 1, Int32(MSG_NOSIGNAL))
            #expect(sent == 1, "the socket holding the relay's old number was shut down by stop(): errno \(errno)")
        }
        #expect(arranged, "in 40 rounds another thread always took the relay's old number first")
    }

    /// Waits for `number` to stop referring to the socket with `formerInode`, then gives it a
    /// duplicate of `socket` and returns it. Nil when the number was not freed within the time or
    /// another thread took it first. Polls without sleeping to keep that window small.
    static func claimWhenFreed(_ number: Int32, formerInode: UInt?, with socket: Int32, within seconds: Double) -> Int32? {
        let deadline = Date().addingTimeInterval(seconds)
        while Date() < deadline {
            let current = inode(number)
            if current == formerInode {
                sched_yield()
                continue
            }
            if current != nil { return nil }  // Freed and already taken by another thread.
            let duplicate = fcntl(socket, F_DUPFD, number)
            if duplicate == number { return duplicate }
            if duplicate >= 0 { close(duplicate) }
            return nil
        }
        Issue.record("the relay's accept loop did not close its listener within \(seconds) s of freeze()")
        return nil
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
