// Shared by the test targets: waiting for a condition, collecting a stream, reading logs.

import Foundation
import InMemoryLogging
import Logging
import Synchronization

/// Waits (polling every 20 ms, at most `seconds` of real time) until `condition` holds;
/// returns whether it did.
public func eventually(within seconds: Double = 10, _ condition: () async throws -> Bool) async rethrows -> Bool {
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

/// A logger whose entries a test can read.
public struct RecordingLogger: Sendable {
    public let handler: InMemoryLogHandler
    public let logger: Logger

    public init(level: Logger.Level = .trace) {
        let handler = InMemoryLogHandler()
        var logger = Logger(label: "test", factory: { _ in handler })
        logger.logLevel = level
        self.handler = handler
        self.logger = logger
    }

    /// The messages logged at `level`.
    public func messages(at level: Logger.Level) -> [String] {
        handler.entries.filter { $0.level == level }.map { $0.message.description }
    }

    /// Every level, message, metadata key and value, and attached error, for redaction checks.
    public var allText: String {
        handler.entries.map { entry in
            var text = "\(entry.level) \(entry.message) "
            text += entry.metadata.map { "\($0.key)=\($0.value)" }.joined(separator: " ")
            if let error = entry.error { text += " error=\(error) \(String(reflecting: error))" }
            return text
        }.joined(separator: "\n")
    }

    /// How many entries were logged.
    public var count: Int { handler.entries.count }
}
