// Agent runtime: the subject list file of `token-agent --subjects-file`,
// read at start and on SIGHUP. A pure parser plus the difference between two lists.

package import FleetTokenStore
package import Foundation

/// A list of subjects to keep tokens for, as written in a subject list file.
///
/// The format, one subject per line:
///
/// ```
/// # Vehicles of the north depot
/// vehicle:truck-7
/// vehicle:truck-8
/// deliveryVehicle:van-12
/// trip:t-1001
/// task:task-55
/// ```
///
/// - Each line is `KIND:ID`. The kind is a `TokenKind` raw value (`vehicle`, `trip`,
///   `deliveryVehicle`, `task`); the id is everything after the first colon, checked by
///   `TokenKey.init(kind:subjectID:)`. There are no spaces around the colon.
/// - Whitespace around a line (including a Windows `\r`) is ignored, and so are blank lines.
/// - `#` starts a comment only as the first non-blank character of a line. There are no
///   trailing comments: an id may contain `#`, so `vehicle:truck-7 # spare` cannot be read
///   unambiguously and is reported as a bad line (an id never contains whitespace followed by
///   `#`). Put the comment on its own line.
/// - A subject listed twice is kept once, at its first line.
///
/// Every bad line is reported at once, with its line number, in a ``SubjectListFileError``.
/// Parsing is linear in the size of the text.
package struct SubjectListFile: Sendable, Equatable {
    /// The subjects, in the order of their first line, without duplicates.
    package let subjects: [TokenKey]
    /// The bytes parsed, when read from a file (``init(contentsOfFile:)``): what a reload
    /// compares the file with.
    package private(set) var bytes: Data?

    /// The largest file ``init(contentsOfFile:)`` reads: 16 MiB, about 300,000 subjects.
    package static let maximumFileSize = 16 << 20

    /// Parses the text of a subject list file.
    /// - Throws: ``SubjectListFileError`` with code ``SubjectListFileError/Code/badLines``,
    ///   listing every bad line with its number and what is wrong.
    package init(parsing text: String) throws(SubjectListFileError) {
        var subjects: [TokenKey] = []
        var seen: Set<TokenKey> = []
        var problems: [SubjectListFileError.Problem] = []
        var number = 0
        // Split on scalars: as Characters, "\r\n" is one grapheme that is not "\n".
        for scalars in text.unicodeScalars.split(separator: "\n", omittingEmptySubsequences: false) {
            number += 1
            var line = Substring(scalars)
            if number == 1, line.first == "\u{FEFF}" { line = line.dropFirst() }
            line = Self.trimmed(line)
            if line.isEmpty || line.first == "#" { continue }
            switch Self.read(line) {
            case .key(let key):
                if seen.insert(key).inserted { subjects.append(key) }
            case .bad(let message):
                problems.append(.init(line: number, message: message))
            }
        }
        guard problems.isEmpty else { throw SubjectListFileError(code: .badLines, path: nil, problems: problems) }
        self.subjects = subjects
    }

    /// Reads and parses the subject list file at `path`.
    ///
    /// The file decides which tokens are kept, so it is read as a steering file
    /// (FleetTokenStore's `SteeringFileCheck.read(path:role:maximumSize:)`): refused when another user could
    /// have written it or replaced it through a directory on the way, and what is parsed is
    /// the content of the file that was judged.
    /// - Throws: ``SubjectListFileError`` with code ``SubjectListFileError/Code/unreadable``
    ///   when the file is missing, unreadable, not a regular file, larger than
    ///   ``maximumFileSize`` or not UTF-8; ``SubjectListFileError/Code/refused`` when another
    ///   user could have written it (the problem says how and the command that fixes it); and
    ///   ``SubjectListFileError/Code/badLines`` as ``init(parsing:)`` does. The error names `path`.
    package init(contentsOfFile path: String) throws(SubjectListFileError) {
        let data: Data
        do {
            data = try SteeringFileCheck.read(path: path, role: "subjects file", maximumSize: Self.maximumFileSize)
        } catch {
            let (code, reason): (SubjectListFileError.Code, String)
            switch error.code {
            case .missing: (code, reason) = (.unreadable, "no such file: create it, or check the path")
            case .unreadable: (code, reason) = (.unreadable, "cannot read it (\(error.systemMessage ?? "unknown error")): check its permissions")
            case .notARegularFile: (code, reason) = (.unreadable, "not a regular file: give the path of the list itself")
            case .tooLarge: (code, reason) = (.unreadable, "larger than \(Self.maximumFileSize >> 20) MiB: is it the right file?")
            default: (code, reason) = (.refused, error.reason)
            }
            throw SubjectListFileError(code: code, path: path, problems: [.init(line: 0, message: reason)])
        }
        guard let text = String(data: data, encoding: .utf8) else {
            throw SubjectListFileError(code: .unreadable, path: path, problems: [.init(line: 0, message: "not UTF-8 text")])
        }
        do {
            try self.init(parsing: text)
        } catch {
            throw SubjectListFileError(code: error.code, path: path, problems: error.problems)
        }
        bytes = data
    }

    /// A list of `subjects` as they are (duplicates are dropped, first one kept).
    package init(subjects: [TokenKey]) {
        var seen: Set<TokenKey> = []
        self.subjects = subjects.filter { seen.insert($0).inserted }
    }

    // MARK: one line

    private enum Line {
        case key(TokenKey)
        case bad(String)
    }

    private static func read(_ line: Substring) -> Line {
        if let key = plainKey(line) { return .key(key) }
        guard let colon = line.firstIndex(of: ":") else {
            return .bad("write KIND:ID, e.g. vehicle:truck-7 (kinds: \(kindList))")
        }
        let kindText = line[..<colon]
        let id = line[line.index(after: colon)...]
        if kindText.last?.isWhitespace == true || id.first?.isWhitespace == true {
            let fixed = kindText.trimmingCharacters(in: .whitespaces) + ":" + id.trimmingCharacters(in: .whitespaces)
            return .bad("no spaces around the colon: write \(quoted(fixed))")
        }
        guard let kind = TokenKind(rawValue: String(kindText)) else {
            let hint = kindText.lowercased().filter { $0.isLetter } == "deliveryvehicle" ? ": write deliveryVehicle" : ": use \(kindList)"
            return .bad("unknown kind \(quoted(kindText))\(hint)")
        }
        if hasTrailingComment(id) {
            return .bad("a comment must be on its own line (# as the first character): ids never contain a space followed by #")
        }
        do {
            return .key(try TokenKey(kind: kind, subjectID: String(id)))
        } catch {
            return .bad(error.description)
        }
    }

    /// The key of a line of printable ASCII without spaces (nearly every line), read byte by
    /// byte; nil for any other line, which ``read(_:)`` then reads (and reports) in full. For
    /// such a line both readings agree: nothing to trim, no whitespace, so no trailing comment.
    /// A 100,000-line file took 0.3 s of the agent's start-up read character by character.
    private static func plainKey(_ line: Substring) -> TokenKey? {
        var colon: Substring.Index?
        for index in line.utf8.indices {
            let byte = line.utf8[index]
            guard byte > 0x20, byte < 0x7F else { return nil }
            if byte == UInt8(ascii: ":"), colon == nil { colon = index }
        }
        guard let colon, let kind = TokenKind(rawValue: String(line[..<colon])) else { return nil }
        return try? TokenKey(kind: kind, subjectID: String(line[line.utf8.index(after: colon)...]))
    }

    private static let kindList = TokenKind.allCases.map(\.rawValue).joined(separator: ", ")

    /// True when whitespace is followed by `#` somewhere in `id`.
    private static func hasTrailingComment(_ id: Substring) -> Bool {
        var afterSpace = false
        for character in id.unicodeScalars {
            if character == "#" && afterSpace { return true }
            afterSpace = character.properties.isWhitespace
        }
        return false
    }

    /// `"text"`, shortened to 40 characters: a bad line is quoted, never echoed whole.
    private static func quoted(_ text: some StringProtocol) -> String {
        text.count > 40 ? "\"\(text.prefix(40))…\"" : "\"\(text)\""
    }

    private static func trimmed(_ line: Substring) -> Substring {
        var line = line
        while let first = line.first, first.isWhitespace { line = line.dropFirst() }
        while let last = line.last, last.isWhitespace { line = line.dropLast() }
        return line
    }
}

/// How a newly read subject list differs from the one in force.
package struct SubjectListChange: Sendable, Equatable {
    /// Subjects to start tracking, in the new list's order.
    package let added: [TokenKey]
    /// Subjects to stop tracking (still served while in use), sorted.
    package let removed: [TokenKey]

    /// The change from `old` to `new`, leaving out `kept`: subjects tracked regardless of the
    /// file (given on the command line), which are never added or removed by a reload.
    package init(from old: [TokenKey], to new: [TokenKey], keeping kept: Set<TokenKey> = []) {
        let oldSet = Set(old)
        let newSet = Set(new)
        var seen: Set<TokenKey> = []
        added = new.filter { !oldSet.contains($0) && !kept.contains($0) && seen.insert($0).inserted }
        removed = oldSet.subtracting(newSet).subtracting(kept).sorted()
    }

    /// True when nothing changes.
    package var isEmpty: Bool { added.isEmpty && removed.isEmpty }
}

/// A subject list file that cannot be used, with every bad line.
///
/// Its ``description`` is for an operator: the path, then `line N: problem` for each bad line
/// (the first 20, then how many more). It quotes at most 40 characters of a line.
package struct SubjectListFileError: Error, Sendable, Equatable, CustomStringConvertible {
    /// What kind of problem this is.
    package struct Code: Hashable, Sendable, CustomStringConvertible {
        private let name: String
        /// The file is missing, unreadable, not a regular file, too large or not UTF-8.
        package static let unreadable = Code(name: "unreadable")
        /// Some lines are not `KIND:ID` with a known kind and a valid id.
        package static let badLines = Code(name: "bad_lines")
        /// Another user could have written the file, or replaced it through a directory on the
        /// way (FleetTokenStore's `SteeringFileCheck`): it is not read.
        package static let refused = Code(name: "refused")
        /// The code's name, e.g. `bad_lines`.
        package var description: String { name }
    }

    /// One bad line.
    package struct Problem: Sendable, Equatable, CustomStringConvertible {
        /// The line's number, from 1; 0 for a problem with the whole file.
        package let line: Int
        /// What is wrong with it and what to write instead.
        package let message: String

        /// A problem at `line` (0 for the whole file).
        package init(line: Int, message: String) {
            self.line = line
            self.message = message
        }

        /// `line N: message`, or the message alone for the whole file.
        package var description: String { line > 0 ? "line \(line): \(message)" : message }
    }

    /// What kind of problem this is.
    package let code: Code
    /// The file, when the list was read from one.
    package let path: String?
    /// Every problem, in line order.
    package let problems: [Problem]

    /// The numbers of the bad lines.
    package var lines: [Int] { problems.map(\.line).filter { $0 > 0 } }

    /// `subjects file PATH: line 3: unknown kind "bus": use vehicle, …; line 7: …`.
    package var description: String {
        let shown = problems.prefix(20).map(\.description)
        let more = problems.count > 20 ? ["and \(problems.count - 20) more bad lines"] : []
        return "subjects file\(path.map { " \($0)" } ?? ""): " + (shown + more).joined(separator: "; ")
    }
}
