// Test kit (issue 30): a TCP relay on 127.0.0.1 in front of a server that can "lose power": after
// freeze() its open connections stay open and carry nothing more (no FIN, no RST: what a client
// sees of a host that lost power or its network), and new connections are refused. Threads and
// blocking sockets, one per relayed connection; every loop wakes at least every 100 ms and ends
// once stop() is called.

import Foundation
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// Relays 127.0.0.1:``port`` to 127.0.0.1:`target` until ``freeze()`` or ``stop()``. Call
/// ``stop()`` when done: the relay's threads hold it until then.
public final class FreezingRelay: Sendable {
    /// The port clients connect to.
    public let port: Int
    private let target: Int
    private let listener: Int32
    private let state = Mutex(State())

    /// Every shutdown() and close() of the relay's descriptors happens under this lock, and a
    /// descriptor is shut down only while it is still open: a number the relay has closed may
    /// already belong to another socket of the process (a test's connection to a shared server).
    private struct State {
        var frozen = false
        var stopped = false
        var listenerOpen = true
        var descriptors: Set<Int32> = []
        /// Client sides of connections frozen one by one (``freezeOpenConnections()``).
        var frozenClients: Set<Int32> = []
        var relayed = 0
    }

    /// Listens on a free port of 127.0.0.1 and relays each connection to 127.0.0.1:`target`.
    public init(target: Int) throws {
        (listener, port) = try boundLoopbackSocket(listening: 64)
        self.target = target
        Thread { [self] in acceptLoop() }.start()
    }

    /// How many connections were relayed so far.
    public var relayedConnections: Int { state.withLock { $0.relayed } }

    /// From now on nothing passes either way on open connections, which stay open, and new
    /// connections are refused (the listening socket is closed).
    public func freeze() {
        state.withLock { state in
            guard !state.frozen else { return }
            state.frozen = true
            if state.listenerOpen { shutdown(listener, Int32(SHUT_RDWR)) }
        }
    }

    /// From now on nothing passes either way on the connections open now, which stay open;
    /// new connections are relayed as before (a host whose address moved: the old flows go
    /// silent, a new connection reaches the server).
    public func freezeOpenConnections() {
        state.withLock { state in state.frozenClients = state.descriptors }
    }

    /// Closes every connection and the listener; the relay's threads end within 100 ms.
    public func stop() {
        state.withLock { state in
            guard !state.stopped else { return }
            state.stopped = true
            if state.listenerOpen { shutdown(listener, Int32(SHUT_RDWR)) }
            for descriptor in state.descriptors { shutdown(descriptor, Int32(SHUT_RDWR)) }
        }
    }

    private var frozen: Bool { state.withLock { $0.frozen } }

    /// Whether the connection of `client` carries nothing now.
    private func isFrozen(_ client: Int32) -> Bool { state.withLock { $0.frozen || $0.frozenClients.contains(client) } }
    private var stopped: Bool { state.withLock { $0.stopped } }

    private func acceptLoop() {
        defer {
            state.withLock { state in
                state.listenerOpen = false
                close(listener)
            }
        }
        while !stopped, !frozen {
            guard Self.readable(listener) else { continue }
            let client = accept(listener, nil, nil)
            guard client >= 0 else { continue }
            let upstream = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
            var address = Self.loopback(port: target)
            let connected = withUnsafePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(upstream, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
            }
            let kept = state.withLock { state -> Bool in
                guard !state.stopped, connected == 0 else { return false }
                state.descriptors.formUnion([client, upstream])
                state.relayed += 1
                return true
            }
            guard kept else {
                close(client)
                close(upstream)
                continue
            }
            Thread { [self] in relay(client, upstream) }.start()
        }
    }

    /// Copies bytes both ways until either side closes or the relay stops; frozen, it copies
    /// nothing and keeps both sockets open.
    private func relay(_ client: Int32, _ upstream: Int32) {
        defer {
            state.withLock { state in
                state.descriptors.subtract([client, upstream])
                state.frozenClients.remove(client)
                close(client)
                close(upstream)
            }
        }
        var buffer = [UInt8](repeating: 0, count: 16 * 1024)
        while !stopped {
            if isFrozen(client) {
                usleep(100_000)
                continue
            }
            var fds = [pollfd(fd: client, events: Int16(POLLIN), revents: 0), pollfd(fd: upstream, events: Int16(POLLIN), revents: 0)]
            guard poll(&fds, 2, 100) > 0, !isFrozen(client) else { continue }
            for (from, to) in [(fds[0], upstream), (fds[1], client)] where from.revents != 0 {
                let count = read(from.fd, &buffer, buffer.count)
                guard count > 0 else { return }
                var sent = 0
                while sent < count {
                    let wrote = buffer.withUnsafeBytes { write(to, $0.baseAddress! + sent, count - sent) }
                    guard wrote > 0 else { return }
                    sent += wrote
                }
            }
        }
    }

    /// True when `descriptor` has something to read within 100 ms.
    private static func readable(_ descriptor: Int32) -> Bool {
        var fds = [pollfd(fd: descriptor, events: Int16(POLLIN), revents: 0)]
        return poll(&fds, 1, 100) > 0
    }

    private static func loopback(port: Int) -> sockaddr_in {
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(port).bigEndian)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        return address
    }
}
