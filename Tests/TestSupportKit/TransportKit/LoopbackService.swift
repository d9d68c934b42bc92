/// A test server of the kit (``TLSTokenServer``, ``ConnectProxy``): started, stopped, and run
/// around a block.
package protocol LoopbackService: Sendable {
    /// Binds 127.0.0.1 on a free port and starts serving.
    func start() async throws
    /// Closes the listener and every connection, and waits until they are closed.
    func stop() async
}

extension LoopbackService {
    /// Starts, runs `body`, and stops, also when `body` throws.
    /// - Throws: what ``start()`` or `body` throws.
    @discardableResult
    package func whileRunning<T>(_ body: () async throws -> T) async throws -> T {
        try await start()
        do {
            let result = try await body()
            await stop()
            return result
        } catch {
            await stop()
            throw error
        }
    }
}
