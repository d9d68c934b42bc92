// A symbolic link swapped between its targets on a thread of its own: the race a check of a
// path and a later read of it lose (steering-file tests of the agent and of the fetcher).

import Foundation
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// Swaps a symbolic link between its targets as fast as it can, on a thread of its own, until
/// stopped: what anyone who can write the link's directory could do between a check of the
/// path and a read of it.
public final class LinkSwapper: Sendable {
    private let stopped = Atomic<Bool>(false)
    private let finished = DispatchSemaphore(value: 0)

    public init(link: String, targets: [String]) {
        _ = symlink(targets[0], link)
        let thread = Thread { [self] in
            var next = 1
            let staging = link + ".next"
            while !stopped.load(ordering: .relaxed) {
                _ = unlink(staging)
                _ = symlink(targets[next % targets.count], staging)
                _ = rename(staging, link)
                next += 1
            }
            finished.signal()
        }
        thread.start()
    }

    public func stop() {
        guard !stopped.exchange(true, ordering: .relaxed) else { return }
        finished.wait()
    }
}
