// Storage layer: fan-out of a store's change feed (SQLite's poller, PostgreSQL's listener) to
// its subscribers, each read at its own pace, none of them ever missing a change.
import Synchronization

/// Gives each subscriber its own stream of the store changes emitted after it subscribed.
///
/// A reader slower than the feed loses nothing and holds bounded memory: once more than
/// `limit` changes wait unread for it, they are replaced by one ``TokenStoreChange/unknown``
/// (re-read what you hold), and what arrives while that waits is covered by it, since the reader
/// re-reads the store only after taking it. A stream ends when its reader's task is cancelled,
/// when the stream is dropped, or (after its unread changes) when the broadcaster finishes.
package final class StoreChangeBroadcaster: Sendable {
    /// Unread changes a subscriber may have before they become one `.unknown`. A burst larger
    /// than this (a purge of the whole store) is handled by one re-read, not a read per change.
    package static let defaultLimit = 10_000

    private struct State: Sendable {
        var inboxes: [UInt64: ChangeInbox] = [:]
        var nextID: UInt64 = 0
        var finished = false
    }

    private let state = Mutex(State())
    private let limit: Int

    /// A broadcaster whose subscribers each keep at most `limit` unread changes itemized.
    package init(limit: Int = StoreChangeBroadcaster.defaultLimit) {
        self.limit = max(1, limit)
    }

    /// A new stream of what is emitted from now on; already finished when the broadcaster is.
    package func subscribe() -> AsyncStream<TokenStoreChange> {
        let inbox = ChangeInbox(limit: limit)
        let id: UInt64? = state.withLock { state in
            guard !state.finished else { return nil }
            let id = state.nextID
            state.nextID += 1
            state.inboxes[id] = inbox
            return id
        }
        guard let id else {
            inbox.finish()
            return AsyncStream(unfolding: { nil })
        }
        // Unregisters when the stream is dropped (the closure below holds it) or cancelled.
        let subscription = Subscription { [weak self] in self?.remove(id) }
        return AsyncStream(unfolding: {
            let next = await inbox.next()
            if next == nil { subscription.end() }
            return next
        }, onCancel: {
            inbox.finish()
            subscription.end()
        })
    }

    /// Whether any stream is still read.
    package var hasSubscribers: Bool { state.withLock { !$0.inboxes.isEmpty } }

    /// Emits `change` to every subscriber.
    package func emit(_ change: TokenStoreChange) {
        emit(contentsOf: [change])
    }

    /// Emits `changes` in order to every subscriber.
    package func emit(contentsOf changes: [TokenStoreChange]) {
        guard !changes.isEmpty else { return }
        let inboxes = state.withLock { Array($0.inboxes.values) }
        for inbox in inboxes { inbox.post(changes) }
    }

    /// Ends every stream once its unread changes are read; later subscribers get an ended one.
    package func finish() {
        let inboxes = state.withLock { state in
            state.finished = true
            defer { state.inboxes = [:] }
            return Array(state.inboxes.values)
        }
        for inbox in inboxes { inbox.finish() }
    }

    private func remove(_ id: UInt64) {
        _ = state.withLock { $0.inboxes.removeValue(forKey: id) }
    }
}

/// Runs its action once: when ended, or at the latest when released.
private final class Subscription: Sendable {
    private let action: Mutex<(@Sendable () -> Void)?>

    init(_ action: @escaping @Sendable () -> Void) { self.action = Mutex(action) }

    func end() {
        let action = self.action.withLock { action in
            defer { action = nil }
            return action
        }
        action?()
    }

    deinit { end() }
}

/// One subscriber's unread changes and its waiting reader.
private final class ChangeInbox: Sendable {
    private struct State: Sendable {
        var items: [TokenStoreChange] = []
        var head = 0
        /// One `.unknown` waits in place of everything that came before it.
        var rereadPending = false
        var finished = false
        var reader: CheckedContinuation<TokenStoreChange?, Never>?

        var unread: Int { items.count - head }

        mutating func take() -> TokenStoreChange? {
            if rereadPending {
                rereadPending = false
                return .unknown
            }
            guard head < items.count else { return nil }
            let change = items[head]
            head += 1
            if head == items.count {
                // A burst's storage goes back; a steady trickle keeps its small buffer.
                items.removeAll(keepingCapacity: items.capacity <= 256)
                head = 0
            }
            return change
        }
    }

    private let state = Mutex(State())
    private let limit: Int

    init(limit: Int) { self.limit = limit }

    func post(_ changes: [TokenStoreChange]) {
        let (reader, change) = state.withLock { state -> (CheckedContinuation<TokenStoreChange?, Never>?, TokenStoreChange?) in
            // While a re-read waits, what arrives is covered by it: the reader re-reads after taking it.
            guard !state.finished, !state.rereadPending else { return (nil, nil) }
            if changes.contains(.unknown) || state.unread + changes.count > limit {
                state.items.removeAll()
                state.head = 0
                state.rereadPending = true
            } else {
                state.items.append(contentsOf: changes)
            }
            guard let reader = state.reader else { return (nil, nil) }
            state.reader = nil
            return (reader, state.take())
        }
        reader?.resume(returning: change)
    }

    /// The next change; nil once finished and read. One reader at a time (an `AsyncStream`'s).
    func next() async -> TokenStoreChange? {
        await withCheckedContinuation { (continuation: CheckedContinuation<TokenStoreChange?, Never>) in
            let ready = state.withLock { state -> TokenStoreChange?? in
                if let change = state.take() { return .some(change) }
                if state.finished { return .some(nil) }
                state.reader = continuation
                return nil
            }
            if let ready { continuation.resume(returning: ready) }
        }
    }

    /// No more changes are accepted; a waiting reader gets nil, unread changes stay readable.
    func finish() {
        let reader = state.withLock { state in
            state.finished = true
            defer { state.reader = nil }
            return state.reader
        }
        reader?.resume(returning: nil)
    }
}
