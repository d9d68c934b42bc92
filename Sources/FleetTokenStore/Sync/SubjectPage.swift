// Sync layer: which subjects make one page of the status listing, chosen from keys offered in
// any order, without sorting every subject the engine knows.

import HeapModule

/// The first `limit` distinct keys after `after`, in key order, of those offered: one page of
/// ``TokenSyncEngine/subjects(after:limit:where:)``.
///
/// Keys come in any order and may come twice (memory's keys, then the tracked ones); the page
/// keeps the `limit` smallest seen so far in a heap, so a key costs one comparison once the page
/// is full. At 100,000 subjects each page used to build the union of both sets and sort it
/// whole: a page of 1,000 took 350 ms with its answer written, 150 once chosen this way (and 40
/// once the answer was written by hand too).
struct SubjectPage {
    /// Only keys after this one (the last of the previous page), or all when nil.
    let after: TokenKey?
    /// The most keys on the page.
    let limit: Int
    private var smallest = Heap<TokenKey>()
    private var members: Set<TokenKey> = []

    init(after: TokenKey?, limit: Int) {
        self.after = after
        self.limit = max(0, limit)
    }

    /// Considers `key`; `included` (a caller's grants, say) is asked only of a key that would
    /// make the page as it stands, so keys the page has no room for cost no more than a
    /// comparison. It may be asked twice of a key offered twice: it must answer alike.
    mutating func offer(_ key: TokenKey, if included: (TokenKey) -> Bool = { _ in true }) {
        guard limit > 0, after.map({ $0 < key }) ?? true else { return }
        if smallest.count == limit, let largest = smallest.max, !(key < largest) { return }
        guard !members.contains(key), included(key) else { return }
        if smallest.count == limit { members.remove(smallest.removeMax()) }
        smallest.insert(key)
        members.insert(key)
    }

    /// The page, in key order.
    var keys: [TokenKey] { smallest.unordered.sorted() }
}
