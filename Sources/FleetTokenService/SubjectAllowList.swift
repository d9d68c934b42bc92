// Service layer: which subjects a local client may ask for (the token API's policy). A pure value.

public import FleetTokenStore
import Foundation

/// Which subjects the local token API hands out: the configured ones, and those matching an
/// allow pattern such as `trip:*` or `vehicle:truck-*`.
///
/// A pattern is `KIND:GLOB`: the kind as written in URLs (`vehicle`, `trip`, `deliveryVehicle`,
/// `task`) and a glob over the whole id in which `*` stands for any run of characters (none
/// included) and every other character for itself. There is no other wildcard, so an id with
/// `?` or `[` needs no escaping.
public struct SubjectAllowList: Sendable, Equatable {
    /// One `KIND:GLOB` pattern.
    public struct Pattern: Sendable, Equatable, CustomStringConvertible {
        /// The kind it applies to.
        package let kind: TokenKind
        /// The glob over the id, as written.
        package let glob: String
        /// The glob's literal pieces between `*`s, as UTF-8 bytes: ids match byte for byte, as
        /// keys compare.
        private let pieces: [[UInt8]]

        /// Parses `KIND:GLOB`.
        /// - Throws: ``SubjectPatternError`` without a colon, with an unknown kind, or with an
        ///   empty glob.
        public init(parsing text: String) throws(SubjectPatternError) {
            guard let colon = text.firstIndex(of: ":") else {
                throw SubjectPatternError(.invalidForm, pattern: text, problem: "write KIND:GLOB, e.g. trip:* or vehicle:truck-*")
            }
            let kindText = String(text[..<colon])
            guard let kind = TokenKind(rawValue: kindText) else {
                throw SubjectPatternError(.unknownKind, pattern: text, problem: "unknown kind \"\(kindText)\": use vehicle, trip, deliveryVehicle or task")
            }
            let glob = String(text[text.index(after: colon)...])
            guard !glob.isEmpty else { throw SubjectPatternError(.emptyIDPattern, pattern: text, problem: "the id pattern is empty: use * for every id") }
            self.kind = kind
            self.glob = glob
            self.pieces = glob.utf8.split(separator: UInt8(ascii: "*"), omittingEmptySubsequences: false).map(Array.init)
        }

        /// True when `key` is of this kind and its id matches the glob.
        package func matches(_ key: TokenKey) -> Bool {
            key.kind == kind && Self.match(Array(key.subjectID.utf8)[...], pieces[...])
        }

        /// `KIND:GLOB`.
        public var description: String { "\(kind.rawValue):\(glob)" }

        /// Literal pieces separated by `*`: the first anchors the start, the last the end, the
        /// middle ones are found left to right (greedy-free, so linear in the id's length per piece).
        private static func match(_ id: ArraySlice<UInt8>, _ pieces: ArraySlice<[UInt8]>) -> Bool {
            guard let first = pieces.first else { return id.isEmpty }
            if pieces.count == 1 { return id.elementsEqual(first) }
            guard id.starts(with: first) else { return false }
            var rest = id.dropFirst(first.count)
            let last = pieces.last!
            for middle in pieces.dropFirst().dropLast() where !middle.isEmpty {
                guard let end = endOfFirst(middle, in: rest) else { return false }
                rest = rest[end...]
            }
            return rest.count >= last.count && rest.suffix(last.count).elementsEqual(last)
        }

        /// The index just past the first occurrence of `needle` in `haystack`.
        private static func endOfFirst(_ needle: [UInt8], in haystack: ArraySlice<UInt8>) -> Int? {
            guard needle.count <= haystack.count else { return nil }
            var start = haystack.startIndex
            while start + needle.count <= haystack.endIndex {
                if haystack[start..<start + needle.count].elementsEqual(needle) { return start + needle.count }
                start += 1
            }
            return nil
        }

        public static func == (lhs: Pattern, rhs: Pattern) -> Bool { lhs.kind == rhs.kind && lhs.glob == rhs.glob }
    }

    /// Subjects always allowed (the agent's configured subjects).
    package var subjects: Set<TokenKey>
    /// Patterns of further allowed subjects.
    package var patterns: [Pattern]

    /// An allow list of `subjects` and `patterns`.
    public init(subjects: Set<TokenKey> = [], patterns: [Pattern] = []) {
        self.subjects = subjects
        self.patterns = patterns
    }

    /// True when a client may ask for `key`.
    package func allows(_ key: TokenKey) -> Bool {
        subjects.contains(key) || patterns.contains { $0.matches(key) }
    }
}

/// An allow pattern that cannot be read: thrown by ``SubjectAllowList/Pattern/init(parsing:)``.
///
/// Its ``description`` names the pattern and says what is wrong and how to write it.
public struct SubjectPatternError: Error, Sendable, Equatable, CustomStringConvertible {
    /// What is wrong. More codes may come: match them with `==`, keep a `default`.
    package struct Code: Hashable, Sendable, CustomStringConvertible {
        fileprivate enum Value: String, Sendable { case invalidForm, unknownKind, emptyIDPattern }

        fileprivate let value: Value

        /// Not `KIND:GLOB` (no colon).
        package static let invalidForm = Code(value: .invalidForm)
        /// The kind is not one of `TokenKind`'s.
        package static let unknownKind = Code(value: .unknownKind)
        /// Nothing after the colon.
        package static let emptyIDPattern = Code(value: .emptyIDPattern)

        /// The code's name, e.g. `unknownKind`.
        package var description: String { value.rawValue }
    }

    /// What is wrong.
    package let code: Code
    /// The pattern as given.
    package let pattern: String
    /// What is wrong and how to write it.
    package let problem: String

    init(_ code: Code, pattern: String, problem: String) {
        self.code = code
        self.pattern = pattern
        self.problem = problem
    }

    /// `allow pattern "…": problem`.
    public var description: String { "allow pattern \"\(pattern)\": \(problem)" }
}
