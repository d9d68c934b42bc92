import Foundation
import Testing
import TestSupportKit
#if canImport(Glibc)
import Glibc
#endif

@Suite("Test kit: RawHTTP.serverHasRead tells bytes a loopback server took from bytes still in the kernel", .paced)
struct ServerHasReadTests {
    @Test("false while the server has not read what the client wrote, true once it has; nil for a socket that is not TCP on loopback")
    func readOrNot() async throws {
        let listener = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        try #require(listener >= 0)
        defer { close(listener) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(listener, $0, length) == 0 && getsockname(listener, $0, &length) == 0 }
        }
        try #require(bound && listen(listener, 4) == 0)
        let client = RawHTTP.openIdle(.tcp(port: Int(UInt16(bigEndian: address.sin_port))))
        try #require(client >= 0)
        defer { close(client) }
        let server = accept(listener, nil, nil)
        try #require(server >= 0)
        defer { close(server) }

        #expect(RawHTTP.serverHasRead(client) == true, "nothing written yet: nothing to read")
        #expect(RawHTTP.writeAll(client, Array("GET / HTTP/1.1\r\n".utf8)))
        // Not read: the bytes stay in the server end's receive queue, however long we wait.
        try await Task.sleep(for: .milliseconds(300))
        #expect(RawHTTP.serverHasRead(client) == false, "written and not read")
        var buffer = [UInt8](repeating: 0, count: 64)
        let count = buffer.withUnsafeMutableBytes { read(server, $0.baseAddress, $0.count) }
        #expect(count == 16)
        #expect(await eventually(within: 10) { RawHTTP.serverHasRead(client) == true }, "read by the server")

        var pair: [Int32] = [0, 0]
        try #require(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0, &pair) == 0)
        defer { close(pair[0]); close(pair[1]) }
        #expect(RawHTTP.serverHasRead(pair[0]) == nil, "a Unix socket has no row in /proc/net/tcp")
    }
}
