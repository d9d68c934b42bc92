// Agent runtime: how token-agent writes its logs. The swift-log handler the agent
// bootstraps writes every message as one line (human text, or one JSON object for journald, Loki
// and friends) and filters against a level shared by every logger of the process, so a
// configuration reload changes the level of loggers that were handed out long before.

import FleetTokenService
package import Foundation
package import Logging
import Synchronization
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// The process's current minimum log level, shared by every ``AgentLogHandler`` made with it.
///
/// Loggers copy their handler, so a level stored in a handler could never be changed for the
/// loggers already held by the engine, the API and the fetcher. They hold this object instead;
/// setting ``level`` (on a configuration reload) takes effect on their next message.
package final class LogLevelSetting: Sendable {
    // Read on every log call, including the ones it filters out: a plain value behind a Mutex.
    private let current: Mutex<Logger.Level>

    /// A setting that starts at `level`.
    ///
    /// - Parameter level: The initial minimum level; `.info` unless given.
    package init(_ level: Logger.Level = .info) {
        current = Mutex(level)
    }

    /// The minimum level messages need to be written. Safe to read and set from any thread.
    package var level: Logger.Level {
        get { current.withLock { $0 } }
        set { current.withLock { $0 = newValue } }
    }
}

/// How ``AgentLogHandler`` lays out each line.
package enum LogFormat: String, Sendable, CaseIterable {
    /// swift-log's human layout: `<time> <level> <label>: <metadata> [<source>] <message>`.
    case text
    /// One JSON object per line: `time`, `level`, `label`, `message`, `metadata`, `source`.
    case json
}

/// Where ``AgentLogHandler`` sends its finished lines.
package struct LogOutput: Sendable {
    let write: @Sendable (String) -> Void

    /// Standard error, one `write(2)` per line, so lines from several threads never interleave.
    package static var standardError: LogOutput {
        LogOutput { StandardError.emit($0, to: 2) }
    }

    /// A closure that receives each finished line, newline included (tests, embedding).
    ///
    /// - Parameter receive: Called once per line, possibly from several threads at once.
    package static func lines(_ receive: @escaping @Sendable (String) -> Void) -> LogOutput {
        LogOutput(write: receive)
    }
}

/// The token agent's swift-log handler: one line per message, as text or JSON, filtered by a
/// shared ``LogLevelSetting``.
///
/// ``logLevel`` reads as the higher of the shared setting and this handler's own floor. Setting
/// it sets only the floor, so `logger.logLevel = .warning` quiets that one logger (the agent's
/// embedded demo issuer) while a reload still moves the level of every other logger.
package struct AgentLogHandler: LogHandler {
    private let label: String
    private let format: LogFormat
    private let setting: LogLevelSetting
    private let output: LogOutput
    // `.trace`: with no floor set, the shared setting alone decides.
    private var floor: Logger.Level = .trace

    /// Metadata added to every message of loggers using this handler.
    package var metadata: Logger.Metadata = [:]

    /// Metadata collected at each message (e.g. from task-local context); call metadata wins
    /// over it, and it wins over ``metadata``.
    package var metadataProvider: Logger.MetadataProvider?

    /// A handler for the logger `label`.
    ///
    /// - Parameters:
    ///   - label: The logger's label, written on each line.
    ///   - format: Text or JSON lines.
    ///   - level: The shared minimum level; changing it later affects this handler.
    ///   - output: Where the lines go; standard error unless given.
    ///   - metadataProvider: The bootstrapped provider unless given.
    package init(
        label: String, format: LogFormat, level: LogLevelSetting, output: LogOutput = .standardError,
        metadataProvider: Logger.MetadataProvider? = LoggingSystem.metadataProvider
    ) {
        self.label = label
        self.format = format
        self.setting = level
        self.output = output
        self.metadataProvider = metadataProvider
    }

    /// The higher of the shared ``LogLevelSetting`` and this handler's floor; setting it sets
    /// the floor only.
    package var logLevel: Logger.Level {
        get { max(setting.level, floor) }
        set { floor = newValue }
    }

    /// One entry of ``metadata``.
    package subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    /// Writes `event` as one line. `Logger` has already checked the level.
    package func log(event: LogEvent) {
        output.write(line(for: event, at: WallTime.now()))
    }

    /// The line for `event` logged at `time`, newline included.
    func line(for event: LogEvent, at time: WallTime) -> String {
        let metadata = merged(event)
        switch format {
        case .json:
            var line = "{\"time\":\"" + time.utc + "\",\"level\":\"" + event.level.rawValue + "\",\"label\":"
            JSONText.appendQuoted(label, to: &line)
            line += ",\"message\":"
            JSONText.appendQuoted(event.message.description, to: &line)
            line += ",\"metadata\":"
            Self.appendObject(metadata, to: &line)
            line += ",\"source\":"
            JSONText.appendQuoted(event.source, to: &line)
            return line + "}\n"
        case .text:
            // StreamLogHandler's layout, so operators see what they saw before `--log-format`.
            let pretty = metadata.sorted { $0.key < $1.key }.map { " \($0.key)=\($0.value)" }.joined()
            let line = "\(time.local) \(event.level)\(label.isEmpty ? "" : " ")\(label):\(pretty) [\(event.source)] \(event.message)"
            return Self.singleLine(line) + "\n"
        }
    }

    /// Handler metadata, then the provider's, then the call's (later wins), then the error as
    /// swift-log's own handlers report it.
    private func merged(_ event: LogEvent) -> Logger.Metadata {
        var result = metadata
        if let provided = metadataProvider?.get(), !provided.isEmpty {
            result.merge(provided) { _, provided in provided }
        }
        if let explicit = event.metadata, !explicit.isEmpty {
            result.merge(explicit) { _, explicit in explicit }
        }
        if let error = event.error {
            result["error.message"] = "\(error)"
            result["error.type"] = "\(String(reflecting: type(of: error)))"
        }
        return result
    }

    /// `metadata` as a JSON object with sorted keys, so equal metadata gives equal text.
    private static func appendObject(_ metadata: Logger.Metadata, to line: inout String) {
        line += "{"
        for (index, (key, value)) in metadata.sorted(by: { $0.key < $1.key }).enumerated() {
            if index > 0 { line += "," }
            JSONText.appendQuoted(key, to: &line)
            line += ":"
            appendValue(value, to: &line)
        }
        line += "}"
    }

    private static func appendValue(_ value: Logger.MetadataValue, to line: inout String) {
        switch value {
        case .string(let text): JSONText.appendQuoted(text, to: &line)
        case .stringConvertible(let convertible): JSONText.appendQuoted(convertible.description, to: &line)
        case .dictionary(let dictionary): appendObject(dictionary, to: &line)
        case .array(let array):
            line += "["
            for (index, element) in array.enumerated() {
                if index > 0 { line += "," }
                appendValue(element, to: &line)
            }
            line += "]"
        }
    }

    /// `text` with line breaks and other control characters (tab aside) made visible, so one
    /// message stays one line for journald and `grep`, and no escape sequence reaches a terminal.
    static func singleLine(_ text: String) -> String {
        guard text.utf8.contains(where: { $0 < 0x20 && $0 != UInt8(ascii: "\t") }) else { return text }
        var result = ""
        result.reserveCapacity(text.utf8.count + 8)
        for scalar in text.unicodeScalars {
            switch scalar {
            case "\n": result += "\\n"
            case "\r": result += "\\r"
            case "\t": result += "\t"
            case _ where scalar.value < 0x20: result += "\\x" + WallTime.padded(Int(scalar.value), 2, radix: 16)
            default: result.unicodeScalars.append(scalar)
            }
        }
        return result
    }
}

/// A wall-clock instant as the handler writes it, without a formatter per line.
package struct WallTime {
    /// Whole seconds since 1970 (rounded down).
    package var seconds: Int
    /// Nanoseconds past `seconds`.
    var nanoseconds: Int

    init(seconds: Int, nanoseconds: Int) {
        self.seconds = seconds
        self.nanoseconds = nanoseconds
    }

    /// The instant of `date`, to the nanosecond below it.
    package init(_ date: Date) {
        let since1970 = date.timeIntervalSince1970
        let whole = since1970.rounded(.down)
        self.init(seconds: Int(whole), nanoseconds: min(999_999_999, Int((since1970 - whole) * 1e9)))
    }

    static func now() -> WallTime {
        var spec = timespec()
        clock_gettime(CLOCK_REALTIME, &spec)
        return WallTime(seconds: Int(spec.tv_sec), nanoseconds: Int(spec.tv_nsec))
    }

    /// RFC 3339 in UTC with milliseconds: `2026-11-23T16:04:05.123Z`.
    var utc: String {
        var time = time_t(seconds)
        var parts = tm()
        guard gmtime_r(&time, &parts) != nil else { return "1970-01-01T00:00:00.000Z" }
        return Self.dateAndTime(parts) + "." + Self.padded(nanoseconds / 1_000_000, 3) + "Z"
    }

    /// RFC 3339 in UTC to the second, as Foundation's `.iso8601` style writes a date:
    /// `2026-11-23T16:04:05Z`, for the agent's event lines, without a Foundation formatter.
    package var utcWholeSeconds: String {
        var time = time_t(seconds)
        var parts = tm()
        guard gmtime_r(&time, &parts) != nil else { return "1970-01-01T00:00:00Z" }
        return Self.dateAndTime(parts) + "Z"
    }

    /// Local time with its offset, as swift-log's `StreamLogHandler` writes it:
    /// `2026-11-23T17:04:05+0100`.
    var local: String {
        var time = time_t(seconds)
        var parts = tm()
        guard localtime_r(&time, &parts) != nil else { return "<unknown>" }
        let offset = Int(parts.tm_gmtoff) / 60
        return Self.dateAndTime(parts) + (offset < 0 ? "-" : "+") + Self.padded(abs(offset) / 60, 2) + Self.padded(abs(offset) % 60, 2)
    }

    private static func dateAndTime(_ parts: tm) -> String {
        padded(Int(parts.tm_year) + 1900, 4) + "-" + padded(Int(parts.tm_mon) + 1, 2) + "-" + padded(Int(parts.tm_mday), 2)
            + "T" + padded(Int(parts.tm_hour), 2) + ":" + padded(Int(parts.tm_min), 2) + ":" + padded(Int(parts.tm_sec), 2)
    }

    static func padded(_ value: Int, _ width: Int, radix: Int = 10) -> String {
        let digits = String(value, radix: radix)
        return digits.count >= width ? digits : String(repeating: "0", count: width - digits.count) + digits
    }
}

/// Lines to standard error without stdio's buffering.
enum StandardError {
    // One write(2) per line is enough for pipes (atomic up to PIPE_BUF) and files; the lock covers
    // the rest: a line the kernel takes in parts (longer than PIPE_BUF, a signal) still ends
    // before another thread's line starts.
    private static let lock = Mutex(())

    /// Writes `line` to `descriptor` (2 outside tests), whole unless the descriptor fails.
    static func emit(_ line: String, to descriptor: Int32) {
        var line = line
        line.withUTF8 { bytes in
            lock.withLock { _ in
                var rest = UnsafeRawBufferPointer(bytes)
                while !rest.isEmpty {
                    let written = write(descriptor, rest.baseAddress, rest.count)
                    if written > 0 {
                        rest = UnsafeRawBufferPointer(rebasing: rest[written...])
                    } else if written < 0 && errno == EINTR {
                        continue
                    } else {
                        // Closed, or non-blocking and full: losing a log line beats blocking or
                        // spinning every thread that logs.
                        return
                    }
                }
            }
        }
    }
}
