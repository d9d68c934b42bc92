// Sync layer: the pure rule of what the change follower re-reads from the store: the keys other
// processes changed since its last re-read, coalesced, or everything memory holds.

/// What the engine must re-read from the store to follow other processes' changes.
///
/// Changes that arrive while a re-read runs are gathered and handled by the next one, in one
/// read: a burst (a purge of thousands of rows) costs a few reads, not one per change. When the
/// changes cannot be itemized (the feed said ``TokenStoreChange/unknown``: a lost connection, a
/// burst larger than it keeps, a start of watching) or too many keys are waiting, everything
/// memory holds is re-read in one pass.
struct PendingReread: Sendable, Equatable {
    /// One re-read.
    enum Reread: Sendable, Equatable {
        /// These keys, where memory holds them.
        case keys([TokenKey])
        /// Every key memory holds.
        case everything
    }

    /// Keys gathered before the re-read becomes ``Reread/everything`` (bounds the memory a
    /// burst takes; reading all held keys once is then no dearer than reading these).
    static let maximumKeys = 10_000

    private var keys: [TokenKey] = []
    private var noted: Set<TokenKey> = []
    private var everything = false

    /// Nothing to re-read.
    init() {}

    /// Just subscribed to the feed: what memory loaded before (``TokenSyncEngine/track(_:)``
    /// reads the store before `run()` subscribes) may have changed unseen since, so all of it is
    /// re-read once. The feed reports what comes after.
    static var afterSubscribing: PendingReread {
        var pending = PendingReread()
        pending.everything = true
        return pending
    }

    /// Whether nothing waits to be re-read.
    var isEmpty: Bool { !everything && keys.isEmpty }

    /// Adds what `change` makes stale.
    mutating func note(_ change: TokenStoreChange) {
        guard !everything else { return }
        switch change {
        case .upserted(let key), .removed(let key):
            guard noted.insert(key).inserted else { return }
            keys.append(key)
            if keys.count > Self.maximumKeys { markEverything() }
        case .unknown:
            markEverything()
        }
    }

    /// The re-read to do now (nil when nothing waits); what is noted later goes to the next one.
    mutating func take() -> Reread? {
        defer { self = PendingReread() }
        if everything { return .everything }
        return keys.isEmpty ? nil : .keys(keys)
    }

    private mutating func markEverything() {
        everything = true
        keys = []
        noted = []
    }
}
