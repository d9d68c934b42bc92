// What a reload compares with the configuration in force (ReloadInputs): the bytes that were
// parsed and applied. A review found them read again by path after the parse: a config or
// subjects file saved in steps, caught half way by a reload and finished before that second
// read, was recorded as applied in its finished form, so every later reload of the finished
// file said "nothing to reload" and the half-written one stayed in force (its missing
// allow-client lines, its missing subjects) until the next edit.

import FleetTokenStore
import Foundation
import Testing
import TestSupportKit
import TokenAgentRuntime
@testable import token_agent

@Suite("token-agent's reload inputs: the bytes applied, not the files read again", .paced)
struct ReloadInputsTests {
    @Test("a config file and a subjects file changed after their parse differ from what is in force: the next reload applies them")
    func changedAfterParseIsNotTakenForApplied() async throws {
        let scratch = Scratch()
        let config = scratch.file("agent.yaml"), subjects = scratch.file("subjects.txt")
        let halfWritten = "subjects-file: \(subjects)\n"
        try Data(halfWritten.utf8).write(to: URL(fileURLWithPath: config))
        try Data("vehicle:a\n".utf8).write(to: URL(fileURLWithPath: subjects))
        for path in [config, subjects] { #expect(chmod(path, 0o600) == 0) }

        // A reload's parse catches both files half way...
        let parsedFile = try await AgentConfigFile.load(config)
        let settings = try AgentSettings.resolve(SettingSources(flags: [:], environment: [:], file: parsedFile))
        #expect(settings.subjectsFile == subjects)
        let parsedList = try SubjectListFile(contentsOfFile: subjects)
        // ...and both are finished before what is in force is recorded.
        let finished = halfWritten + "allow-client:\n  - \"uid:0 vehicle:*\"\n"
        try Data(finished.utf8).write(to: URL(fileURLWithPath: config))
        try Data("vehicle:a\nvehicle:b\n".utf8).write(to: URL(fileURLWithPath: subjects))
        let inForce = ReloadInputs(configFile: parsedFile, subjectsBytes: parsedList.bytes, settings: settings)
        #expect(inForce.contents[config] == .some(Data(halfWritten.utf8)), "the config file in force is the one parsed")
        #expect(inForce.contents[subjects] == .some(Data("vehicle:a\n".utf8)), "the subjects file in force is the one parsed")

        // The next reload reads the finished files: they differ, so it applies them.
        let nextFile = try await AgentConfigFile.load(config)
        let nextSettings = try AgentSettings.resolve(SettingSources(flags: [:], environment: [:], file: nextFile))
        let next = ReloadInputs(configFile: nextFile, subjectsBytes: try SubjectListFile(contentsOfFile: subjects).bytes, settings: nextSettings)
        #expect(next != inForce, "the finished files were taken for the ones in force: nothing would be reloaded")

        // Files unchanged since their parse: the same, so a second trigger applies nothing.
        let again = ReloadInputs(configFile: try await AgentConfigFile.load(config), subjectsBytes: try SubjectListFile(contentsOfFile: subjects).bytes,
                                 settings: nextSettings)
        #expect(again == next)
    }

    @Test("a subjects file whose parsed bytes are not known counts as changed")
    func unknownSubjectsBytes() throws {
        var settings = AgentSettings()
        settings.subjectsFile = "/nonexistent/subjects.txt"
        let unknown = ReloadInputs(configFile: nil, subjectsBytes: nil, settings: settings)
        #expect(unknown.contents.keys.contains("/nonexistent/subjects.txt"))
        #expect(unknown != ReloadInputs(configFile: nil, subjectsBytes: Data("vehicle:a\n".utf8), settings: settings))
    }
}
