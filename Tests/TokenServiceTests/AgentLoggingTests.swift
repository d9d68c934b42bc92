// Agent logging: the JSON and text lines of AgentLogHandler, escaping, metadata merging, the shared
// level that a reload changes under loggers already handed out, and whole lines under concurrency.

@testable import FleetTokenService
@testable import TokenAgentRuntime
import Foundation
import Logging
import Synchronization
import Testing
#if canImport(Glibc)
import Glibc
#endif

@Suite("AgentLogHandler: JSON and text lines, shared level", .paced)
struct AgentLoggingTests {
    /// Every line a handler hands to its output.
    final class Lines: Sendable {
        private let received = Mutex<[String]>([])
        var all: [String] { received.withLock { $0 } }
        var output: LogOutput { .lines { line in self.received.withLock { $0.append(line) } } }
    }

    static func logger(
        _ lines: Lines, format: LogFormat = .json, level: LogLevelSetting = LogLevelSetting(.trace),
        provider: Logger.MetadataProvider? = nil
    ) -> Logger {
        Logger(label: "fleet.agent") { label in
            AgentLogHandler(label: label, format: format, level: level, output: lines.output, metadataProvider: provider)
        }
    }

    /// `line` as a JSON object, after checking it is exactly one newline-terminated line.
    static func object(_ line: String) throws -> [String: Any] {
        #expect(line.utf8.last == UInt8(ascii: "\n"))
        #expect(line.utf8.count(where: { $0 == UInt8(ascii: "\n") }) == 1)
        return try #require(try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any])
    }

    static func onlyLine(_ lines: Lines) throws -> String {
        try #require(lines.all.count == 1)
        return lines.all[0]
    }

    @Test("a JSON line carries time, level, label, message, metadata and source, in that order")
    func jsonFields() throws {
        let lines = Lines()
        Self.logger(lines).notice("agent started", metadata: ["subjects": "3"], source: "token-agent")
        let line = try Self.onlyLine(lines)
        let object = try Self.object(line)
        let time = try #require(object["time"] as? String)
        #expect(time.wholeMatch(of: /\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z/) != nil)
        #expect(object["level"] as? String == "notice")
        #expect(object["label"] as? String == "fleet.agent")
        #expect(object["message"] as? String == "agent started")
        #expect(object["metadata"] as? [String: String] == ["subjects": "3"])
        #expect(object["source"] as? String == "token-agent")
        #expect(object.count == 6)

        #expect(line.hasPrefix(#"{"time":""#))
        let positions = [#","level":"#, #","label":"#, #","message":"#, #","metadata":"#, #","source":"#].map {
            line.range(of: $0)?.lowerBound
        }
        #expect(!positions.contains(nil))
        #expect(positions.compactMap { $0 } == positions.compactMap { $0 }.sorted())
    }

    @Test("every level is written under its swift-log name")
    func levels() throws {
        let lines = Lines()
        let logger = Self.logger(lines)
        for level in Logger.Level.allCases { logger.log(level: level, "x") }
        #expect(try lines.all.map { try Self.object($0)["level"] as? String } == Logger.Level.allCases.map(\.rawValue))
    }

    @Test("times are RFC 3339 UTC with milliseconds, truncated", arguments: [
        (0, 0, "1970-01-01T00:00:00.000Z"),
        (1_795_449_845, 123_999_999, "2026-11-23T16:04:05.123Z"),
        (1_835_481_599, 999_000_000, "2028-02-29T23:59:59.999Z"),
        (1_795_449_845, 7_000_000, "2026-11-23T16:04:05.007Z"),
    ])
    func utcTimes(seconds: Int, nanoseconds: Int, expected: String) {
        #expect(WallTime(seconds: seconds, nanoseconds: nanoseconds).utc == expected)
    }

    @Test("an event line's time is written as Foundation's .iso8601 style writes it", arguments: [
        0, 1_795_449_845, 1_795_449_845.5, 1_795_449_845.999_9, 1_795_449_845.000_001, 951_782_400, 4_102_444_799.75,
    ])
    func wholeSecondTimes(since1970: Double) {
        let date = Date(timeIntervalSince1970: since1970)
        #expect(WallTime(date).utcWholeSeconds == date.formatted(.iso8601))
    }

    /// A message to escape, named in test output so no raw control character reaches the log.
    struct Awkward: CustomTestStringConvertible, Sendable {
        let name: String
        let text: String
        var testDescription: String { name }
    }

    @Test("messages that need escaping still give one valid JSON line and read back unchanged", arguments: [
        Awkward(name: "newlines", text: "line one\nline two\r\n"), Awkward(name: "quotes", text: #"say "hi""#),
        Awkward(name: "backslashes", text: #"C:\path\"#), Awkward(name: "NUL", text: "nul\u{0}byte"),
        Awkward(name: "U+001F and ESC", text: "unit\u{1F}separator\u{1B}[31m"), Awkward(name: "tab", text: "tab\there"),
        Awkward(name: "emoji and non-ASCII", text: "🚚 é ü 中文"), Awkward(name: "U+2028, U+2029, DEL", text: "\u{2028}\u{2029}\u{7F}"),
        Awkward(name: "invalid UTF-8", text: String(decoding: [0x61, 0xFF, 0xED, 0xA0, 0x80, 0x62] as [UInt8], as: UTF8.self)),
        Awkward(name: "lone UTF-16 surrogates", text: String(decoding: [0xD800, 0x61, 0xDC00] as [UInt16], as: UTF16.self)),
    ])
    func escaping(sample: Awkward) throws {
        let message = sample.text
        let lines = Lines()
        Self.logger(lines).info("\(message)", metadata: ["value": "\(message)"])
        let object = try Self.object(try Self.onlyLine(lines))
        #expect(object["message"] as? String == message)
        #expect(object["metadata"] as? [String: String] == ["value": message])
    }

    @Test("metadata keys, labels and sources with quotes and control characters are escaped")
    func escapedKeys() throws {
        let lines = Lines()
        let logger = Logger(label: "we\"ird\nlabel") { label in
            AgentLogHandler(label: label, format: .json, level: LogLevelSetting(.trace), output: lines.output, metadataProvider: nil)
        }
        logger.info("m", metadata: [#"key "quoted""#: "1", "back\\slash\u{1}": "2", "🚚": "3"], source: "src\"\n")
        let object = try Self.object(try Self.onlyLine(lines))
        #expect(object["label"] as? String == "we\"ird\nlabel")
        #expect(object["source"] as? String == "src\"\n")
        #expect(object["metadata"] as? [String: String] == [#"key "quoted""#: "1", "back\\slash\u{1}": "2", "🚚": "3"])
    }

    @Test("nested metadata becomes nested objects and arrays; string convertibles become strings")
    func nestedMetadata() throws {
        let lines = Lines()
        Self.logger(lines).info("m", metadata: [
            "subject": ["kind": "vehicle", "ids": ["truck-7", "truck-8"], "count": .stringConvertible(2)],
            "empty": [:], "list": [["a": "b"], [], "c"],
        ])
        let metadata = try #require(try Self.object(try Self.onlyLine(lines))["metadata"] as? [String: Any])
        let subject = try #require(metadata["subject"] as? [String: Any])
        #expect(subject["kind"] as? String == "vehicle")
        #expect(subject["ids"] as? [String] == ["truck-7", "truck-8"])
        #expect(subject["count"] as? String == "2")
        #expect((metadata["empty"] as? [String: Any])?.isEmpty == true)
        let list = try #require(metadata["list"] as? [Any])
        #expect(list.count == 3)
        #expect(list[0] as? [String: String] == ["a": "b"])
        #expect((list[1] as? [Any])?.isEmpty == true)
        #expect(list[2] as? String == "c")
    }

    @Test("call metadata beats provider metadata, which beats handler metadata; errors are reported")
    func metadataPrecedence() throws {
        struct Refused: Error {}
        let lines = Lines()
        let provider = Logger.MetadataProvider { ["shared": "provider", "fromProvider": "p", "both": "provider"] }
        var logger = Self.logger(lines, provider: provider)
        logger[metadataKey: "shared"] = "handler"
        logger[metadataKey: "both"] = "handler"
        logger[metadataKey: "fromHandler"] = "h"
        logger.error("failed", error: Refused(), metadata: ["both": "call", "fromCall": "c"])
        let metadata = try #require(try Self.object(try Self.onlyLine(lines))["metadata"] as? [String: String])
        #expect(metadata["both"] == "call")
        #expect(metadata["shared"] == "provider")
        #expect(metadata["fromHandler"] == "h")
        #expect(metadata["fromProvider"] == "p")
        #expect(metadata["fromCall"] == "c")
        #expect(metadata["error.type"]?.hasSuffix("Refused") == true)
        #expect(metadata["error.message"] == "Refused()")
    }

    @Test("changing the shared setting changes loggers that already exist")
    func sharedLevel() throws {
        let lines = Lines()
        let setting = LogLevelSetting(.info)
        let logger = Self.logger(lines, level: setting)
        logger.debug("dropped")
        logger.info("kept 1")
        setting.level = .debug
        #expect(logger.logLevel == .debug)
        logger.debug("kept 2")
        setting.level = .error
        logger.warning("dropped")
        logger.error("kept 3")
        #expect(try lines.all.map { try Self.object($0)["message"] as? String } == ["kept 1", "kept 2", "kept 3"])
    }

    @Test("a floor set on one copy keeps that copy quiet while the shared level goes lower")
    func floor() throws {
        let lines = Lines()
        let setting = LogLevelSetting(.info)
        let logger = Self.logger(lines, level: setting)
        var issuer = logger
        issuer.logLevel = .warning
        setting.level = .trace
        #expect(issuer.logLevel == .warning)
        #expect(logger.logLevel == .trace)
        issuer.info("issuer info, dropped")
        issuer.warning("issuer warning")
        logger.debug("agent debug")
        setting.level = .error
        #expect(issuer.logLevel == .error)
        issuer.warning("issuer warning, dropped")
        #expect(try lines.all.map { try Self.object($0)["message"] as? String } == ["issuer warning", "agent debug"])
    }

    @Test("text lines use swift-log's layout, one line per message")
    func text() throws {
        let lines = Lines()
        var logger = Self.logger(lines, format: .text)
        logger[metadataKey: "z"] = "last"
        logger.info("token refreshed", metadata: ["a": "first"], source: "engine")
        logger.warning("first\nsecond\r\u{1B}[31m", source: "engine")
        try #require(lines.all.count == 2)
        let first = lines.all[0]
        #expect(first.wholeMatch(of: /\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}[+-]\d{4} info fleet\.agent: a=first z=last \[engine\] token refreshed\n/) != nil)
        let second = lines.all[1]
        #expect(second.utf8.count(where: { $0 == UInt8(ascii: "\n") }) == 1)
        #expect(second.hasSuffix(#" warning fleet.agent: z=last [engine] first\nsecond\r\x1b[31m"# + "\n"))
    }

    @Test("many tasks logging at once hand the output only whole lines")
    func concurrentClosure() async throws {
        let lines = Lines()
        let logger = Self.logger(lines)
        await withTaskGroup(of: Void.self) { group in
            for task in 0..<16 {
                group.addTask {
                    for index in 0..<200 {
                        logger.info("message \(task)-\(index) \(String(repeating: "x", count: index * 7))", metadata: ["task": "\(task)"])
                    }
                }
            }
        }
        let messages = try lines.all.map { try #require(try Self.object($0)["message"] as? String) }
        #expect(messages.count == 16 * 200)
        #expect(Set(messages.map { $0.split(separator: " ")[1] }).count == 16 * 200)
    }

    /// Reads a pipe to its end on a thread of its own, so blocking reads never hold a task thread.
    final class PipeDrain: Sendable {
        private let received = Mutex<[UInt8]>([])
        private let finished = Mutex<(done: Bool, waiter: CheckedContinuation<Void, Never>?)>((false, nil))

        init(_ descriptor: Int32) {
            Thread { [self] in
                var buffer = [UInt8](repeating: 0, count: 4096)
                while true {
                    let count = read(descriptor, &buffer, buffer.count)
                    if count <= 0 { break }
                    received.withLock { $0.append(contentsOf: buffer[..<count]) }
                }
                finished.withLock { state in
                    state.done = true
                    state.waiter?.resume()
                    state.waiter = nil
                }
            }.start()
        }

        /// Everything read, once the write end is closed.
        func bytes() async -> [UInt8] {
            await withCheckedContinuation { continuation in
                finished.withLock { state in
                    if state.done { continuation.resume() } else { state.waiter = continuation }
                }
            }
            return received.withLock { $0 }
        }
    }

    @Test("lines longer than a pipe's atomic size (4096 bytes on Linux) reach a pipe whole from many tasks")
    func concurrentPipe() async throws {
        var ends: [Int32] = [0, 0]
        try #require(pipe(&ends) == 0)
        let (readEnd, writeEnd) = (ends[0], ends[1])
        defer { close(readEnd) }
        let drain = PipeDrain(readEnd)
        let writers = 8, perWriter = 40, length = 3 * 4096
        await withTaskGroup(of: Void.self) { group in
            for writer in 0..<writers {
                group.addTask {
                    for index in 0..<perWriter {
                        StandardError.emit("\(writer)-\(index) " + String(repeating: "\(writer % 10)", count: length) + "\n", to: writeEnd)
                    }
                }
            }
        }
        close(writeEnd)
        let text = String(decoding: await drain.bytes(), as: UTF8.self)
        #expect(text.hasSuffix("\n"))
        let lines = text.split(separator: "\n", omittingEmptySubsequences: false).dropLast()
        #expect(lines.count == writers * perWriter)
        // Counted, not asserted one by one: a torn line is 12 KB of digits.
        let torn = lines.filter { line in
            let parts = line.split(separator: " ")
            guard parts.count == 2, let writer = parts[0].split(separator: "-").first.flatMap({ Int($0) }) else { return true }
            return parts[1] != String(repeating: "\(writer % 10)", count: length)[...]
        }
        #expect(torn.count == 0)
    }

    @Test("log formats have the names the --log-format option takes")
    func formats() {
        #expect(LogFormat.allCases.map(\.rawValue) == ["text", "json"])
    }
}
