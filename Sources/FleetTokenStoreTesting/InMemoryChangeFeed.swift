// Test kit layer: InMemoryChangeFeed, the change-feed registry of one in-memory store: each
// view's `changes()` streams, fed what the other views write.

import FleetTokenStore
import Synchronization

/// The streams of every view of one store, by view.
final class InMemoryChangeFeed: Sendable {
    private struct Subscriber: Sendable {
        let view: UInt64
        let continuation: AsyncStream<TokenStoreChange>.Continuation
    }

    private struct State: Sendable {
        var subscribers: [UInt64: Subscriber] = [:]
        var nextID: UInt64 = 0
    }

    private let state = Mutex(State())

    /// A stream of what views other than `view` write; finished at once when `open` is false.
    func subscribe(view: UInt64, open: Bool) -> AsyncStream<TokenStoreChange> {
        let (stream, continuation) = AsyncStream<TokenStoreChange>.makeStream()
        guard open else {
            continuation.finish()
            return stream
        }
        let id = state.withLock { state in
            state.nextID += 1
            state.subscribers[state.nextID] = Subscriber(view: view, continuation: continuation)
            return state.nextID
        }
        continuation.onTermination = { [weak self] _ in
            self?.state.withLock { _ = $0.subscribers.removeValue(forKey: id) }
        }
        return stream
    }

    /// The continuations of every stream but `view`'s, for a write of `view` to feed once it
    /// has committed. Taken inside the write, so a stream opened after the commit misses it.
    func listeners(excluding view: UInt64) -> [AsyncStream<TokenStoreChange>.Continuation] {
        state.withLock { $0.subscribers.values.filter { $0.view != view }.map(\.continuation) }
    }

    /// Ends the streams of `view`.
    func finishStreams(of view: UInt64) {
        let ending = state.withLock { state in
            let ids = state.subscribers.filter { $0.value.view == view }.map(\.key)
            return ids.compactMap { state.subscribers.removeValue(forKey: $0)?.continuation }
        }
        ending.forEach { $0.finish() }
    }
}
