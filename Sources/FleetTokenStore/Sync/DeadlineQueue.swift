// Sync layer: keys ordered by when they are next due, for the scheduler.

import Foundation
import HeapModule

/// Keys ordered by when they are due, one pending deadline per key. Rescheduling a key pushes a
/// new item and leaves the old one to be skipped when it surfaces (cheaper than removal).
struct DeadlineQueue {
    private struct Item: Comparable {
        let due: Date
        let key: TokenKey
        static func < (lhs: Item, rhs: Item) -> Bool { lhs.due < rhs.due }
        static func == (lhs: Item, rhs: Item) -> Bool { lhs.due == rhs.due && lhs.key == rhs.key }
    }

    private var heap = Heap<Item>()
    private var current: [TokenKey: Date] = [:]

    /// Number of keys with a deadline.
    var count: Int { current.count }

    /// The deadline of `key`, if it has one.
    func deadline(of key: TokenKey) -> Date? { current[key] }

    /// Sets `key`'s deadline, replacing any earlier one. Returns true when it became the earliest.
    @discardableResult
    mutating func schedule(_ key: TokenKey, at due: Date) -> Bool {
        guard current[key] != due else { return false }
        current[key] = due
        heap.insert(Item(due: due, key: key))
        compactIfBloated()
        return earliest == due
    }

    /// Drops `key`'s deadline.
    mutating func cancel(_ key: TokenKey) {
        current[key] = nil
        releaseStorageIfSparse()
    }

    /// The earliest live deadline.
    var earliest: Date? {
        mutating get {
            while let top = heap.min, current[top.key] != top.due { heap.removeMin() }
            return heap.min?.due
        }
    }

    /// Removes and returns the keys due at or before `now`, earliest first, at most `limit`.
    mutating func popDue(at now: Date, limit: Int) -> [TokenKey] {
        var due: [TokenKey] = []
        while due.count < limit, let top = heap.min {
            if current[top.key] != top.due {
                heap.removeMin()
                continue
            }
            guard top.due <= now else { break }
            heap.removeMin()
            current[top.key] = nil
            due.append(top.key)
        }
        if !due.isEmpty { releaseStorageIfSparse() }
        return due
    }

    /// Rebuilds the heap when stale items outnumber live ones, so memory stays proportional to
    /// the number of keys.
    private mutating func compactIfBloated() {
        guard heap.count > 64, heap.count > current.count * 2 else { return }
        heap = Heap(current.map { Item(due: $0.value, key: $0.key) })
    }

    /// Rebuilds the map and the heap at their current size once most keys have gone (idle
    /// trips dropped): neither an array nor a dictionary gives back storage as it empties. The
    /// heap's storage grew with the map's (it holds at most twice the live keys past 64).
    private mutating func releaseStorageIfSparse() {
        let before = current.capacity
        current.releaseStorageIfSparse()
        guard current.capacity < before else { return }
        heap = Heap(current.map { Item(due: $0.value, key: $0.key) })
    }
}
