// The provider client the engine fetches through, replaceable while the agent runs: a reload
// that changes headers, header files or TLS files swaps in a new HTTPTokenFetcher, and the old
// one is shut down once the requests it carries have been answered (none is cut off).

import FleetTokenHTTP
import FleetTokenStore
import Synchronization

/// A ``TokenFetcher`` that forwards to the HTTP fetcher in force.
final class ProviderClient: TokenFetcher {
    private struct Generation {
        let fetcher: HTTPTokenFetcher
        var inFlight = 0
        /// Resumed when a replaced generation's last request ends.
        var drained: CheckedContinuation<Void, Never>?
    }

    private struct State {
        var current = 0
        var generations: [Int: Generation] = [:]
    }

    private let state: Mutex<State>

    init(_ fetcher: HTTPTokenFetcher) {
        state = Mutex(State(current: 0, generations: [0: Generation(fetcher: fetcher)]))
    }

    func fetchToken(for key: TokenKey) async throws(TokenProviderError) -> FetchedToken {
        let (id, fetcher) = state.withLock { state in
            state.generations[state.current]!.inFlight += 1
            return (state.current, state.generations[state.current]!.fetcher)
        }
        defer { finished(id) }
        return try await fetcher.fetchToken(for: key)
    }

    /// The digest of the fetcher in force: a reload that changes it makes failures stored
    /// under the old one retried at once.
    var configurationDigest: String? {
        state.withLock { $0.generations[$0.current]!.fetcher }.configurationDigest
    }

    private func finished(_ id: Int) {
        let drained = state.withLock { state -> CheckedContinuation<Void, Never>? in
            state.generations[id]!.inFlight -= 1
            guard id != state.current, state.generations[id]!.inFlight == 0 else { return nil }
            defer { state.generations[id]!.drained = nil }
            return state.generations[id]!.drained
        }
        drained?.resume()
    }

    /// One fetcher replaced by another: ``retire()`` shuts it down once its requests end.
    struct Replaced {
        fileprivate let id: Int
        fileprivate let client: ProviderClient

        /// Waits for the replaced fetcher's requests, then shuts it down.
        func retire() async { await client.retire(id) }
    }

    /// Makes `fetcher` the one in force: every request from now on goes through it.
    func install(_ fetcher: HTTPTokenFetcher) -> Replaced {
        let old = state.withLock { state -> Int in
            let old = state.current
            state.current = old + 1
            state.generations[old + 1] = Generation(fetcher: fetcher)
            return old
        }
        return Replaced(id: old, client: self)
    }

    fileprivate func retire(_ id: Int) async {
        await withCheckedContinuation { continuation in
            let done = state.withLock { state -> Bool in
                if state.generations[id]!.inFlight == 0 { return true }
                state.generations[id]!.drained = continuation
                return false
            }
            if done { continuation.resume() }
        }
        let fetcher = state.withLock { $0.generations.removeValue(forKey: id)!.fetcher }
        await fetcher.shutdown()
    }

    /// Shuts down every fetcher (the agent is stopping; the engine has stopped fetching).
    func shutdown() async {
        let fetchers = state.withLock { state in state.generations.values.map(\.fetcher) }
        for fetcher in fetchers { await fetcher.shutdown() }
    }
}
