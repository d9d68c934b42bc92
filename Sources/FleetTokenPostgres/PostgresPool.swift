// FleetTokenPostgres: the connection pool of the host in use. postgres-nio's PostgresClient
// connects to one host; when the store moves to another (a promoted standby), the pool is
// replaced by one for the new host and the old one is closed (its waiting calls fail at once,
// its connections, the change feed's LISTEN among them, are closed). Every client's run() is a
// child task of run(), itself a child task of withRepository's task group: nothing unstructured.
import Logging
import PostgresNIO
import Synchronization

final class PostgresPool: Sendable {
    /// A client and what ends its run().
    private struct Running: Sendable {
        let client: PostgresClient
        let hostIndex: Int
        let retire: AsyncStream<Void>.Continuation
        /// Counts the moves: a connection's id is unique only within one client.
        var generation = 0
    }

    /// Calls waiting for a move away from their pool generation (see ``waitForMove(from:until:)``).
    private struct MoveWaiters {
        var generation = 0
        var nextID = 0
        /// nil: cancelled before it waited.
        var waiting: [Int: CheckedContinuation<Void, Never>?] = [:]
    }

    private let configurations: [PostgresClient.Configuration]
    private let logger: Logger
    private let current: Mutex<Running>
    private let moveWaiters = Mutex(MoveWaiters())
    /// Clients to run, each with the stream whose end retires it.
    private let started: AsyncStream<(PostgresClient, AsyncStream<Void>)>
    private let starter: AsyncStream<(PostgresClient, AsyncStream<Void>)>.Continuation

    /// A pool for `configurations[hostIndex]` (one configuration per host, in the URL's order).
    init(configurations: [PostgresClient.Configuration], hostIndex: Int, logger: Logger) {
        self.configurations = configurations
        self.logger = logger
        (started, starter) = AsyncStream.makeStream()
        let (client, retired, retire) = Self.make(configurations[hostIndex], logger: logger)
        current = Mutex(Running(client: client, hostIndex: hostIndex, retire: retire))
        starter.yield((client, retired))
    }

    private static func make(_ configuration: PostgresClient.Configuration, logger: Logger)
        -> (PostgresClient, AsyncStream<Void>, AsyncStream<Void>.Continuation) {
        let client = PostgresClient(configuration: configuration, backgroundLogger: PostgresBackgroundLog.logger(logger))
        let (retired, retire) = AsyncStream<Void>.makeStream()
        return (client, retired, retire)
    }

    /// The client of the host in use.
    var client: PostgresClient { current.withLock { $0.client } }

    /// The client of the host in use and how many moves came before it.
    var clientAndGeneration: (client: PostgresClient, generation: Int) { current.withLock { ($0.client, $0.generation) } }

    /// The index of the host in use.
    var hostIndex: Int { current.withLock { $0.hostIndex } }

    /// Moves to the host at `index`: a new client for it, the old one closed. Nil when it is
    /// the host in use already; else the index moved from.
    func move(to index: Int) -> Int? {
        guard hostIndex != index else { return nil }
        return replace(with: index) { $0.hostIndex != index }?.hostIndex
    }

    /// A new client for the host in use, the old one closed, unless the pool has moved past
    /// `generation` already; true when it renewed. For connections gone silent (a statement
    /// with no answer at all, not even the server's own timeout, while the host takes new
    /// connections): the pool never gives a silent connection up by itself, and a host whose
    /// address moved (DNS-based failover) leaves every connection to its old address so.
    func renew(from generation: Int) -> Bool {
        let (index, now) = current.withLock { ($0.hostIndex, $0.generation) }
        guard now == generation else { return false }
        return replace(with: index) { $0.generation == generation } != nil
    }

    /// Replaces the client by a new one for the host at `index` when `fitting` holds for the
    /// one running (checked under the lock); the replaced one, closed, or nil.
    private func replace(with index: Int, if fitting: (Running) -> Bool) -> Running? {
        let (client, retired, retire) = Self.make(configurations[index], logger: logger)
        let old = current.withLock { running -> Running? in
            guard fitting(running) else { return nil }
            defer { running = Running(client: client, hostIndex: index, retire: retire, generation: running.generation + 1) }
            return running
        }
        guard let old else { return nil }
        starter.yield((client, retired))
        old.retire.finish()
        let waiting = moveWaiters.withLock { waiters in
            waiters.generation = old.generation + 1
            defer { waiters.waiting = [:] }
            return waiters.waiting.values.compactMap { $0 }
        }
        for waiter in waiting { waiter.resume() }
        return old
    }

    /// Returns at `deadline`, or throws ``PostgresFailure/HostMoved`` as soon as the pool
    /// moves past `generation` (a call on that generation's host will get no answer there).
    func waitForMove(from generation: Int, until deadline: ContinuousClock.Instant) async throws {
        let moved = try await withThrowingTaskGroup(of: Bool.self) { group in
            group.addTask {
                try await Task.sleep(until: deadline, clock: .continuous)
                return false
            }
            group.addTask {
                await self.moved(past: generation)
                return !Task.isCancelled
            }
            defer { group.cancelAll() }
            return try await group.next() ?? false
        }
        if moved { throw PostgresFailure.HostMoved() }
    }

    /// Returns once the pool has moved past `generation`, or the task is cancelled.
    private func moved(past generation: Int) async {
        let id = moveWaiters.withLock { waiters in
            defer { waiters.nextID += 1 }
            return waiters.nextID
        }
        await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                let now = moveWaiters.withLock { waiters -> Bool in
                    if waiters.generation > generation { return true }
                    // Cancelled before this wait began: the handler left a marker.
                    if waiters.waiting.removeValue(forKey: id) != nil { return true }
                    waiters.waiting.updateValue(continuation, forKey: id)
                    return false
                }
                if now { continuation.resume() }
            }
        } onCancel: {
            let waiter = moveWaiters.withLock { waiters -> CheckedContinuation<Void, Never>? in
                if let entry = waiters.waiting.removeValue(forKey: id) { return entry }
                // Not waiting yet (and no move that would end the wait at once): leave a marker.
                if waiters.generation <= generation { waiters.waiting.updateValue(nil, forKey: id) }
                return nil
            }
            waiter?.resume()
        }
    }

    /// Runs every client until it is retired or the calling task is cancelled.
    func run() async {
        await withDiscardingTaskGroup { group in
            for await (client, retired) in started {
                group.addTask {
                    await withTaskGroup(of: Void.self) { running in
                        running.addTask { await client.run() }
                        running.addTask { for await _ in retired {} }
                        _ = await running.next()
                        running.cancelAll()
                    }
                }
            }
        }
    }

    /// Ends ``run()`` once its clients are done (the repository's group cancels them).
    func close() {
        starter.finish()
    }
}

/// postgres-nio's background messages as the store passes them on: warnings and above, but for
/// the one a request gets when it comes before its client's run() ("Trying to lease connection
/// from `PostgresClient`, but `PostgresClient.run()` hasn't been called yet."). Here run() is
/// always a moment away (a child task the pool starts with every client, at open and at a
/// move), and postgres-nio keeps the request until then: an operator would read a warning
/// about nothing at every start.
struct PostgresBackgroundLog: LogHandler {
    private var wrapped: Logger
    var metadata: Logger.Metadata = [:]
    var logLevel: Logger.Level

    /// `logger` at `warning` or above, without that message.
    static func logger(_ logger: Logger) -> Logger {
        let handler = PostgresBackgroundLog(wrapped: logger, logLevel: max(logger.logLevel, .warning))
        return Logger(label: logger.label, factory: { _ in handler })
    }

    private init(wrapped: Logger, logLevel: Logger.Level) {
        self.wrapped = wrapped
        self.logLevel = logLevel
    }

    subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    func log(event: LogEvent) {
        guard !event.message.description.hasPrefix("Trying to lease connection from `PostgresClient`, but `PostgresClient.run()` hasn't been called") else { return }
        var event = event
        if !metadata.isEmpty { event.metadata = metadata.merging(event.metadata ?? [:]) { $1 } }
        wrapped.handler.log(event: event)
    }
}
