// Shared by the test targets: waiting for a condition, collecting a stream. (Reading logs is
// the test kit's LogRecorder, in FleetTokenStoreTesting.)

import Foundation
import Synchronization

/// Waits (polling every 20 ms, at most `seconds` of real time) until `condition` holds;
/// returns whether it did.
public func eventually(within seconds: Double = 30, _ condition: () async throws -> Bool) async rethrows -> Bool {
    let deadline = Date().addingTimeInterval(seconds)
    while Date() < deadline {
        if try await condition() { return true }
        try? await Task.sleep(for: .milliseconds(20))
    }
    return try await condition()
}

/// Collects what an async stream yields, in the background.
public final class StreamRecorder<Element: Sendable>: Sendable {
    private let items = Mutex<[Element]>([])
    private let task = Mutex<Task<Void, Never>?>(nil)

    public init(_ stream: AsyncStream<Element>) {
        let task = Task { [weak self] in
            for await item in stream { self?.items.withLock { $0.append(item) } }
        }
        self.task.withLock { $0 = task }
    }

    /// What the stream yielded so far.
    public var elements: [Element] { items.withLock { $0 } }

    deinit { task.withLock { $0?.cancel() } }
}

/// Set once, read from any task (say, "this task has ended").
public final class EndFlag: Sendable {
    private let value = Mutex(false)
    public init() {}
    public func set() { value.withLock { $0 = true } }
    public var isSet: Bool { value.withLock { $0 } }
}
