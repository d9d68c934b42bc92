// Issue 13: the subject list file of `token-agent --subjects-file` (pure parser and diff).

import FleetTokenService
import TokenAgentRuntime
import FleetTokenStore
import Foundation
import TestSupportKit
import Testing

@Suite("SubjectListFile (pure)", .paced)
struct SubjectListFileTests {
    @Test("a good file: every kind, comments, blank lines, surrounding whitespace, CRLF, a BOM; duplicates kept once at their first line")
    func goodFile() throws {
        let text = "\u{FEFF}# depot north\n"
            + "vehicle:truck-7\n"
            + "\n"
            + "   \t\n"
            + "  trip:t-1001  \r\n"
            + "    # an indented comment\n"
            + "deliveryVehicle:van-12\r\n"
            + "task:task-55\n"
            + "vehicle:truck-7\n"
            + "vehicle:a#1\n"
            + "vehicle:x:y\n"
            + "trip:with space\n"
            + "#vehicle:commented-out"
        let list = try SubjectListFile(parsing: text)
        #expect(list.subjects == [
            try .vehicle("truck-7"), try .trip("t-1001"), try .deliveryVehicle("van-12"), try .task("task-55"),
            try .vehicle("a#1"), try .vehicle("x:y"), try .trip("with space"),
        ])
    }

    @Test("an empty file, or one of comments only, is an empty list", arguments: ["", "\n\n", "# nothing yet\n# really\n", "  \r\n"])
    func empty(text: String) throws {
        #expect(try SubjectListFile(parsing: text).subjects.isEmpty)
    }

    @Test("each kind is its TokenKind raw value", arguments: TokenKind.allCases)
    func kinds(kind: TokenKind) throws {
        #expect(try SubjectListFile(parsing: "\(kind.rawValue):id-1\n").subjects == [try TokenKey(kind: kind, subjectID: "id-1")])
    }

    @Test("every bad line is reported with its number; the good ones do not hide them")
    func badLines() throws {
        let text = """
            vehicle:ok-1
            bus:b-1
            vehicle
            vehicle:
            # fine
            vehicle : v-2
            vehicle:v-3 # spare truck
            delivery-vehicle:van-1
            trip:..
            task:\(String(repeating: "x", count: 513))
            Vehicle:v-4
            trip:ok-2
            """
        let error = try #require(throws: SubjectListFileError.self) { try SubjectListFile(parsing: text) }
        #expect(error.code == .badLines)
        #expect(error.lines == [2, 3, 4, 6, 7, 8, 9, 10, 11])
        let byLine = Dictionary(uniqueKeysWithValues: error.problems.map { ($0.line, $0.message) })
        #expect(byLine[2]?.contains("unknown kind \"bus\"") == true)
        #expect(byLine[2]?.contains("vehicle, trip, deliveryVehicle, task") == true)
        #expect(byLine[3]?.contains("KIND:ID") == true)
        #expect(byLine[4]?.contains("empty") == true)
        #expect(byLine[6]?.contains("no spaces around the colon") == true)
        #expect(byLine[6]?.contains("\"vehicle:v-2\"") == true)
        #expect(byLine[7]?.contains("comment must be on its own line") == true)
        #expect(byLine[8]?.contains("deliveryVehicle") == true)
        #expect(byLine[9]?.contains("relative path segment") == true)
        #expect(byLine[10]?.contains("513 bytes") == true)
        #expect(byLine[11]?.contains("unknown kind \"Vehicle\"") == true)
        #expect(error.description.hasPrefix("subjects file: line 2: unknown kind \"bus\""))
        #expect(error.description.contains("; line 11: "))
        // A long bad line is quoted shortened, never whole.
        let long = String(repeating: "k", count: 200) + ":id"
        let quoted = try #require(throws: SubjectListFileError.self) { try SubjectListFile(parsing: long) }
        #expect(!quoted.description.contains(String(repeating: "k", count: 41)))
    }

    @Test("the description lists the first 20 bad lines and counts the rest")
    func manyBadLines() throws {
        let text = (1...50).map { "bus:\($0)" }.joined(separator: "\n")
        let error = try #require(throws: SubjectListFileError.self) { try SubjectListFile(parsing: text) }
        #expect(error.problems.count == 50)
        #expect(error.description.contains("line 20: "))
        #expect(!error.description.contains("line 21: "))
        #expect(error.description.hasSuffix("and 30 more bad lines"))
    }

    @Test("10,000 lines parse in linear time (100,000 take about ten times as long, not a hundred)")
    func scales() throws {
        func text(_ count: Int) -> String {
            (0..<count).map { "# vehicle \($0)\nvehicle:truck-\($0)\ntrip:t-\($0 % (count / 2))\n" }.joined()
        }
        let small = text(10_000), large = text(100_000)
        let clock = ContinuousClock()
        var list: SubjectListFile?
        let smallTime = try clock.measure { list = try SubjectListFile(parsing: small) }
        #expect(list?.subjects.count == 15_000)
        let largeTime = try clock.measure { list = try SubjectListFile(parsing: large) }
        #expect(list?.subjects.count == 150_000)
        // Linear is about 10x; quadratic would be 100x. A generous bound against scheduling noise.
        #expect(largeTime < smallTime * 40, "10k lines: \(smallTime), 100k lines: \(largeTime)")
    }

    @Test("reading a file: its path in errors; missing, a directory, not UTF-8 are unreadable; bad lines keep their numbers")
    func files() throws {
        let scratch = Scratch()
        let good = scratch.file("good.txt")
        try "vehicle:v-1\ntrip:t-1\n".write(toFile: good, atomically: true, encoding: .utf8)
        #expect(try SubjectListFile(contentsOfFile: good).subjects == [try .vehicle("v-1"), try .trip("t-1")])

        let missing = try #require(throws: SubjectListFileError.self) { try SubjectListFile(contentsOfFile: scratch.file("nope.txt")) }
        #expect(missing.code == .unreadable && missing.lines.isEmpty)
        #expect(missing.description.contains(scratch.file("nope.txt")) && missing.description.contains("no such file"))

        let directory = try #require(throws: SubjectListFileError.self) { try SubjectListFile(contentsOfFile: scratch.path) }
        #expect(directory.code == .unreadable)

        let binary = scratch.file("binary.txt")
        try #require(FileManager.default.createFile(atPath: binary, contents: Data([0x76, 0x3A, 0xFF, 0xFE, 0x0A])))
        let notText = try #require(throws: SubjectListFileError.self) { try SubjectListFile(contentsOfFile: binary) }
        #expect(notText.code == .unreadable && notText.description.contains("UTF-8"))

        let bad = scratch.file("bad.txt")
        try "vehicle:v-1\n\nbus:1\n".write(toFile: bad, atomically: true, encoding: .utf8)
        let badLines = try #require(throws: SubjectListFileError.self) { try SubjectListFile(contentsOfFile: bad) }
        #expect(badLines.code == .badLines && badLines.lines == [3] && badLines.path == bad)
        #expect(badLines.description == "subjects file \(bad): line 3: unknown kind \"bus\": use vehicle, trip, deliveryVehicle, task")
    }

    @Test("a change adds the new subjects in file order and removes the dropped ones, never touching kept ones")
    func change() throws {
        let (a, b, c, d, kept) = (try TokenKey.vehicle("a"), try TokenKey.vehicle("b"), try TokenKey.trip("c"),
                                  try TokenKey.task("d"), try TokenKey.vehicle("kept"))
        let change = SubjectListChange(from: [a, b, kept], to: [d, a, c, c], keeping: [kept])
        #expect(change.added == [d, c])
        #expect(change.removed == [b, kept].filter { $0 != kept })
        #expect(!change.isEmpty)
        // A kept subject added to or dropped from the file changes nothing.
        #expect(SubjectListChange(from: [a], to: [a, kept], keeping: [kept]).isEmpty)
        #expect(SubjectListChange(from: [a, kept], to: [a], keeping: [kept]).isEmpty)
        #expect(SubjectListChange(from: [a, b], to: [b, a]).isEmpty)
        #expect(SubjectListFile(subjects: [a, b, a]).subjects == [a, b])
    }
}
