// Sync layer: the engine's end of the store's change feed. Reads the feed as fast as it comes
// (no I/O per change) and hands the change follower everything gathered since its last turn.
import Synchronization

/// Gathers a change feed into ``PendingReread``s for the engine's change follower.
///
/// ``collect()`` (a child task of the follower) drains the feed at once, so it never falls
/// behind by a store read per change; ``next()`` waits for something to re-read and takes all
/// of it. The first re-read is of everything memory holds (``PendingReread/afterSubscribing``).
final class StoreChangeReader: Sendable {
    private struct State: Sendable {
        var pending = PendingReread.afterSubscribing
        var feedEnded = false
    }

    private let changes: AsyncStream<TokenStoreChange>
    private let state = Mutex(State())
    private let wake = WakeSignal()

    /// A reader of `changes`, a stream made before the memory it follows is re-read.
    init(_ changes: AsyncStream<TokenStoreChange>) {
        self.changes = changes
    }

    /// Reads the feed until it ends or the task is cancelled.
    func collect() async {
        for await change in changes {
            state.withLock { $0.pending.note(change) }
            wake.signal()
        }
        state.withLock { $0.feedEnded = true }
        wake.signal()
    }

    /// The next re-read, waiting for one; nil once the feed ended with nothing left, or when the
    /// task is cancelled.
    func next() async -> PendingReread.Reread? {
        while !Task.isCancelled {
            _ = wake.take()
            let (reread, ended) = state.withLock { ($0.pending.take(), $0.feedEnded) }
            if let reread { return reread }
            if ended { return nil }
            await wake.wait()
        }
        return nil
    }
}
