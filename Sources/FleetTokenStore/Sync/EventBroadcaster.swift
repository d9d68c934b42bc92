import Synchronization

/// Fans engine events out to every subscriber's stream.
final class EventBroadcaster: Sendable {
    private struct State: Sendable {
        var continuations: [UInt64: AsyncStream<TokenSyncEvent>.Continuation] = [:]
        var nextID: UInt64 = 0
        var finished = false
    }

    private let state = Mutex(State())

    func subscribe() -> AsyncStream<TokenSyncEvent> {
        let (stream, continuation) = AsyncStream<TokenSyncEvent>.makeStream(bufferingPolicy: .bufferingNewest(10_000))
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

    func emit(_ event: TokenSyncEvent) {
        let continuations = state.withLock { Array($0.continuations.values) }
        for continuation in continuations { continuation.yield(event) }
    }

    func finish() {
        let continuations = state.withLock { state in
            state.finished = true
            defer { state.continuations = [:] }
            return Array(state.continuations.values)
        }
        for continuation in continuations { continuation.finish() }
    }
}
