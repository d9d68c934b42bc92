// Sync layer: fan-out of one producer's events to every subscriber's stream. Shared by the
// engine's events (TokenSyncEvent) and the store's change feed (TokenStoreChange).
import Synchronization

/// Gives each subscriber its own `AsyncStream` of the events emitted after it subscribed; a
/// stream ends when its reader stops or the broadcaster finishes.
package final class EventBroadcaster<Event: Sendable>: Sendable {
    private struct State: Sendable {
        var continuations: [UInt64: AsyncStream<Event>.Continuation] = [:]
        var nextID: UInt64 = 0
        var finished = false
    }

    private let state = Mutex(State())
    private let buffering: AsyncStream<Event>.Continuation.BufferingPolicy

    /// `buffering` bounds what a slow reader keeps.
    package init(buffering: AsyncStream<Event>.Continuation.BufferingPolicy = .bufferingNewest(10_000)) {
        self.buffering = buffering
    }

    /// A new stream of what is emitted from now on; already finished when the broadcaster is.
    package func subscribe() -> AsyncStream<Event> {
        let (stream, continuation) = AsyncStream<Event>.makeStream(bufferingPolicy: buffering)
        let id: UInt64? = state.withLock { state in
            guard !state.finished else { return nil }
            let id = state.nextID
            state.nextID += 1
            state.continuations[id] = continuation
            return id
        }
        guard let id else {
            continuation.finish()
            return stream
        }
        continuation.onTermination = { [weak self] _ in
            self?.state.withLock { _ = $0.continuations.removeValue(forKey: id) }
        }
        return stream
    }

    /// Whether any stream is still read.
    package var hasSubscribers: Bool { state.withLock { !$0.continuations.isEmpty } }

    package func emit(_ event: Event) {
        emit(contentsOf: [event])
    }

    /// Emits `events` in order to every subscriber.
    package func emit(contentsOf events: [Event]) {
        guard !events.isEmpty else { return }
        let continuations = state.withLock { Array($0.continuations.values) }
        for event in events {
            for continuation in continuations { continuation.yield(event) }
        }
    }

    /// Ends every stream; later subscribers get an ended one.
    package func finish() {
        let continuations = state.withLock { state in
            state.finished = true
            defer { state.continuations = [:] }
            return Array(state.continuations.values)
        }
        for continuation in continuations { continuation.finish() }
    }
}
