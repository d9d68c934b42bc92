// Test kit layer: a log recorder. A `Logger` whose entries (level, message, metadata, error) a test
// reads back, to check what was logged and, with a `SecretScanner`, that no token was.

public import InMemoryLogging
public import Logging

/// A `Logger` to hand to the code under test, and the entries it logged.
///
/// Built on swift-log's `InMemoryLogHandler`. Every entry at or above the level is kept, with
/// its metadata (the logger's, the provider's and the call's) and any attached error.
///
/// ```swift
/// let log = LogRecorder()
/// let engine = TokenSyncEngine(repository: store, fetcher: fetcher, logger: log.logger)
/// …
/// #expect(log.messages(at: .warning).isEmpty)
/// ```
public struct LogRecorder: Sendable {
    /// One logged entry: level, message, metadata and attached error.
    public typealias Entry = InMemoryLogHandler.Entry

    /// The logger to give the code under test.
    public let logger: Logger
    private let handler: InMemoryLogHandler

    /// Creates a recorder keeping entries at `level` and above.
    /// - Parameters:
    ///   - label: The logger's label.
    ///   - level: The lowest level kept; trace by default, so redaction checks see everything.
    public init(label: String = "test", level: Logger.Level = .trace) {
        let handler = InMemoryLogHandler()
        var logger = Logger(label: label, factory: { _ in handler })
        logger.logLevel = level
        self.handler = handler
        self.logger = logger
    }

    /// Every entry logged so far, oldest first.
    public var entries: [Entry] { handler.entries }

    /// How many entries were logged.
    public var count: Int { handler.entries.count }

    /// The messages logged at `level`, oldest first.
    public func messages(at level: Logger.Level) -> [String] {
        handler.entries.filter { $0.level == level }.map { $0.message.description }
    }

    /// Every entry as one line: level, message, each metadata key and value, and an attached
    /// error (its description and reflection). What a redaction check must search.
    public var allText: String {
        handler.entries.map(Self.text(of:)).joined(separator: "\n")
    }

    /// Forgets every entry logged so far.
    public func clear() { handler.clear() }

    static func text(of entry: Entry) -> String {
        var text = "\(entry.level) \(entry.message) "
        text += entry.metadata.map { "\($0.key)=\($0.value)" }.joined(separator: " ")
        if let error = entry.error { text += " error=\(error) \(String(reflecting: error))" }
        return text
    }
}
