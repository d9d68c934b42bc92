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

    private let configurations: [PostgresClient.Configuration]
    private let logger: Logger
    private let current: Mutex<Running>
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
        let client = PostgresClient(configuration: configuration, backgroundLogger: logger.withLevelAtLeast(.warning))
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
        let (client, retired, retire) = Self.make(configurations[index], logger: logger)
        let old = current.withLock { running -> Running? in
            guard running.hostIndex != index else { return nil }
            defer { running = Running(client: client, hostIndex: index, retire: retire, generation: running.generation + 1) }
            return running
        }
        guard let old else { return nil }
        starter.yield((client, retired))
        old.retire.finish()
        return old.hostIndex
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
