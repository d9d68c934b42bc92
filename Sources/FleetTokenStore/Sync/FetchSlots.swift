// Sync layer: the bound on fetches in flight across all keys (RefreshPolicy.maxConcurrentFetches),
// a semaphore whose waiters can be let go without a slot when their key's token arrives.
import Synchronization

/// At most `limit` fetches at once. Waiters queue oldest first; a released slot passes straight
/// to the oldest waiter. A waiter whose key got a fresher token meanwhile is let go without a
/// slot (a caller must not queue behind other keys' fetches for a token already here).
final class FetchSlots: Sendable {
    private struct State: Sendable {
        var active = 0
        var waiters: [(key: TokenKey, continuation: CheckedContinuation<Bool, Never>)] = []
        var closed = false
    }

    private let state = Mutex(State())
    let limit: Int

    init(limit: Int) {
        self.limit = max(1, limit)
    }

    /// Waits for a slot: true with one; false, without one, when `served()` is already true
    /// as the wait begins, when ``endWait(for:)`` let the waiter go, or when the slots were
    /// closed for shutdown. `served` is asked under the slots' lock, so a token installed
    /// (then ``endWait(for:)``) at any moment is either seen by it or ends the wait.
    func acquire(for key: TokenKey, unless served: () -> Bool) async -> Bool {
        await withCheckedContinuation { continuation in
            let granted: Bool? = state.withLock { state in
                if state.closed || served() { return false }
                guard state.active >= limit else {
                    state.active += 1
                    return true
                }
                state.waiters.append((key, continuation))
                return nil
            }
            if let granted { continuation.resume(returning: granted) }
        }
    }

    /// Gives a slot back, to the oldest waiter when there is one.
    func release() {
        let next = state.withLock { state -> CheckedContinuation<Bool, Never>? in
            guard !state.waiters.isEmpty else {
                state.active -= 1
                return nil
            }
            return state.waiters.removeFirst().continuation
        }
        next?.resume(returning: true)
    }

    /// Lets the waiter of `key` go without a slot.
    func endWait(for key: TokenKey) {
        let waiter = state.withLock { state -> CheckedContinuation<Bool, Never>? in
            guard let index = state.waiters.firstIndex(where: { $0.key == key }) else { return nil }
            return state.waiters.remove(at: index).continuation
        }
        waiter?.resume(returning: false)
    }

    /// Shutdown: every waiter goes without a slot, and so does every later request.
    func close() {
        let waiters = state.withLock { state in
            state.closed = true
            defer { state.waiters.removeAll() }
            return state.waiters.map(\.continuation)
        }
        for waiter in waiters { waiter.resume(returning: false) }
    }
}
