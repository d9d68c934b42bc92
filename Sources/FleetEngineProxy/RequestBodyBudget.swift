// The Fleet Engine proxy's request bodies, counted across all its connections: a call's body
// is read whole before it is sent on, and without a bound on their sum one local process could
// open many streams of almost 16 MiB each and have the agent hold them all.

import Synchronization

/// The bytes of request bodies the proxy holds at once, across every connection, and their
/// limit. A body is counted from its first byte read until its call is answered and dropped
/// (``BodyReservation``).
package final class RequestBodyBudget: Sendable {
    /// The most bytes held at once.
    package let limit: Int
    private let held = Atomic<Int>(0)

    package init(limit: Int) { self.limit = limit }

    /// Bytes held now.
    package var bytesHeld: Int { held.load(ordering: .relaxed) }

    /// Counts `count` more bytes; false, counting nothing, when that would pass the limit.
    func take(_ count: Int) -> Bool {
        var current = held.load(ordering: .relaxed)
        while true {
            guard current + count <= limit else { return false }
            let (exchanged, original) = held.compareExchange(expected: current, desired: current + count, ordering: .relaxed)
            if exchanged { return true }
            current = original
        }
    }

    /// Counts `count` more bytes of the body `reservation` holds, starting its reservation
    /// with its first bytes; false, counting nothing more, when the budget is spent.
    func take(_ count: Int, for reservation: inout BodyReservation?) -> Bool {
        if reservation == nil { reservation = BodyReservation(self) }
        return reservation!.take(count)
    }

    func give(_ count: Int) {
        held.subtract(count, ordering: .relaxed)
    }
}

/// One request body's bytes in a ``RequestBodyBudget``, given back when the reservation goes:
/// with the request that carries it, once its call is answered, or with the handler reading it
/// when the stream or connection ends first.
package final class BodyReservation: Sendable {
    private let budget: RequestBodyBudget
    private let bytes = Atomic<Int>(0)

    init(_ budget: RequestBodyBudget) { self.budget = budget }

    /// Counts `count` more bytes of this body; false when the budget is spent.
    func take(_ count: Int) -> Bool {
        guard budget.take(count) else { return false }
        bytes.add(count, ordering: .relaxed)
        return true
    }

    deinit { budget.give(bytes.load(ordering: .relaxed)) }
}
