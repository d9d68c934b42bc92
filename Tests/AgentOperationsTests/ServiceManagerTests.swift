// Issue 18: what token-agent tells systemd, and its JSON logs, through the real process. The
// test binds its own AF_UNIX datagram socket and passes it as NOTIFY_SOCKET, as systemd does.

import Foundation
import TestSupportKit
import Testing
#if canImport(Glibc)
import Glibc
#endif

@Suite("token-agent under systemd: sd_notify, watchdog, JSON logs", .paced, .exclusive)
struct ServiceManagerTests {
    /// token-agent on its own store against `issuer`, with `arguments` and `environment`.
    static func agent(_ scratch: Scratch, _ issuer: IssuerProcess, _ arguments: [String],
                      environment: [String: String] = [:]) throws -> RunningProcess {
        try AgentFixture.launch(["--db", scratch.file("tokens.sqlite"), "--provider-url", issuer.template] + arguments,
                           environment: environment, in: scratch)
    }

    static func events(_ stdout: String) -> [[String: String]] {
        stdout.split(separator: "\n").compactMap { (try? JSONSerialization.jsonObject(with: Data($0.utf8))) as? [String: String] }
    }

    @Test("READY=1 once the subjects have tokens, WATCHDOG=1 at half of WATCHDOG_USEC, RELOADING=1 then READY=1 around a reload, STOPPING=1 on SIGTERM")
    func notifications() async throws {
        let scratch = Scratch()
        let issuer = try await IssuerProcess(scratch: scratch)
        let receiver = try NotifySocketReceiver(directory: scratch.path)
        defer { receiver.close() }
        let config = scratch.file("token-agent.yaml")
        try "vehicle: [a, b]\njson: true\n".write(toFile: config, atomically: true, encoding: .utf8)
        let agent = try Self.agent(scratch, issuer, ["--config", config],
                                   environment: ["NOTIFY_SOCKET": receiver.notifySocket, "WATCHDOG_USEC": "1000000"])
        defer { agent.signal(SIGKILL) }

        let ready = try #require(await receiver.next(timeout: .seconds(30)) { $0.contains("READY=1") }, "\(agent.stderr)")
        let readyFields = NotifySocketReceiver.assignments(ready.message)
        #expect(readyFields["STATUS"] == "2 valid", "\(ready.message)")
        // Both subjects had tokens before READY=1 (their events may still be on their way to stdout).
        #expect(await eventually(within: 30) {
            Set(Self.events(agent.stdout).filter { $0["event"] == "refreshed" }.compactMap { $0["id"] }) == ["a", "b"]
        })

        // The watchdog: every 0.5 s (half of 1 s), from the engine's scheduler loop.
        var pets: [ContinuousClock.Instant] = []
        let watchEnd = ContinuousClock.now + .seconds(3)
        while ContinuousClock.now < watchEnd, let message = await receiver.next(timeout: .seconds(1)) {
            if message.message.contains("WATCHDOG=1") { pets.append(message.at) }
        }
        // Time-stamped on arrival by the receiver's own thread. Every gap stays under WATCHDOG_USEC
        // (what systemd enforces), and there is no flood: counted, not read from the gaps, since
        // a receiver that runs late takes two pets at once on a loaded machine.
        #expect(pets.count >= 3 && pets.count <= 12, "\(pets.count) pets in 3 s (one each 0.5 s)")
        let gaps = zip(pets.dropFirst(), pets).map { $0 - $1 }
        #expect(gaps.allSatisfy { $0 < .milliseconds(1000) }, "\(gaps)")

        // A reload: RELOADING=1 (with the monotonic time systemd wants), then READY=1 and new counts.
        try "vehicle: [a, b, c]\njson: true\n".write(toFile: config, atomically: true, encoding: .utf8)
        agent.signal(SIGHUP)
        let reloading = try #require(await receiver.next(timeout: .seconds(30)) { $0.contains("RELOADING=1") })
        #expect(NotifySocketReceiver.assignments(reloading.message)["MONOTONIC_USEC"].flatMap { UInt64($0) } != nil, "\(reloading.message)")
        let reloaded = try #require(await receiver.next(timeout: .seconds(30)) { $0.contains("READY=1") }, "READY=1 ends the reload")
        #expect(NotifySocketReceiver.assignments(reloaded.message)["STATUS"] != nil)
        let status = await receiver.next(timeout: .seconds(30)) { NotifySocketReceiver.assignments($0)["STATUS"] == "3 valid" }
        #expect(status != nil, "STATUS follows the third subject")

        agent.signal(SIGTERM)
        let stopping = await receiver.next(timeout: .seconds(30)) { $0.contains("STOPPING=1") }
        #expect(stopping != nil)
        #expect(await agent.wait(upTo: 30) == 0, "\(agent.stderr)")
    }

    @Test("READY=1 also when a subject's first attempt failed: the service is up, and STATUS says what is wrong")
    func readyAfterFailure() async throws {
        let scratch = Scratch()
        let receiver = try NotifySocketReceiver(directory: scratch.path)
        defer { receiver.close() }
        // Nothing listens on port 9 of loopback: every attempt fails at once.
        let agent = try AgentFixture.launch(["--db", scratch.file("tokens.sqlite"), "--provider-url", "http://127.0.0.1:9/{kind}/{id}",
                                                       "--vehicle", "a"], environment: ["NOTIFY_SOCKET": receiver.notifySocket], in: scratch)
        defer { agent.signal(SIGKILL) }
        let ready = try #require(await receiver.next(timeout: .seconds(30)) { $0.contains("READY=1") }, "\(agent.stderr)")
        #expect(NotifySocketReceiver.assignments(ready.message)["STATUS"] == "1 backoff", "\(ready.message)")
        agent.signal(SIGTERM)
        #expect(await agent.wait(upTo: 30) == 0, "\(agent.stderr)")
    }

    @Test("an unwritable NOTIFY_SOCKET is one warning; the agent starts, serves and stops as usual")
    func unwritableSocket() async throws {
        let scratch = Scratch()
        let issuer = try await IssuerProcess(scratch: scratch)
        let missing = scratch.file("no-such-dir/notify.sock")
        let agent = try Self.agent(scratch, issuer, ["--vehicle", "a", "--json", "--log-level", "debug"],
                                   environment: ["NOTIFY_SOCKET": missing, "WATCHDOG_USEC": "200000"])
        defer { agent.signal(SIGKILL) }
        #expect(await agent.waitForOutput(#""event":"refreshed""#, within: 30), "\(agent.stderr)")
        // Watchdog pets every 0.1 s fail too (each a debug line): after five of them, still one
        // warning, not one per pet.
        let failedNotifications = { agent.stderr.components(separatedBy: "cannot notify the service manager").count - 1 }
        #expect(await eventually(within: 30) { failedNotifications() >= 6 }, "\(agent.stderr)")
        #expect(agent.isRunning)
        let warnings = agent.stderr.split(separator: "\n").filter { $0.contains("warning") && $0.contains(missing) }
        #expect(warnings.count == 1, "\(agent.stderr)")
        agent.signal(SIGTERM)
        #expect(await agent.wait(upTo: 30) == 0, "\(agent.stderr)")
    }

    @Test("--log-format json: every line on stderr is one JSON object with time, level, label, message and metadata; no token value at trace level")
    func jsonLogs() async throws {
        let scratch = Scratch()
        let issuer = try await IssuerProcess(scratch: scratch)
        let sink = scratch.file("sink")
        let agent = try Self.agent(scratch, issuer, ["--vehicle", "a", "--trip", "t", "--log-format", "json", "--log-level", "trace",
                                                     "--sink", sink])
        defer { agent.signal(SIGKILL) }
        #expect(await eventually(within: 30) {
            FileManager.default.fileExists(atPath: sink + "/vehicle/a.jwt") && FileManager.default.fileExists(atPath: sink + "/trip/t.jwt")
        }, "\(agent.stderr)")
        agent.signal(SIGTERM)
        #expect(await agent.wait(upTo: 30) == 0, "\(agent.stderr)")

        let lines = agent.stderr.split(separator: "\n")
        #expect(lines.count > 10)
        for line in lines {
            let object = try #require(try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any], "not JSON: \(line)")
            #expect(Set(object.keys).isSuperset(of: ["time", "level", "label", "message", "metadata"]), "\(line)")
            #expect((object["time"] as? String)?.hasSuffix("Z") == true)
            #expect(object["metadata"] is [String: Any])
        }
        let levels = Set(lines.compactMap { (try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any])?["level"] as? String })
        #expect(levels.contains("debug") && levels.contains("notice"), "\(levels)")
        for file in [sink + "/vehicle/a.jwt", sink + "/trip/t.jwt"] {
            let token = try String(contentsOfFile: file, encoding: .utf8).trimmingCharacters(in: .whitespacesAndNewlines)
            #expect(token.split(separator: ".").count == 3)
            let signature = String(token.split(separator: ".").last!)
            #expect(!agent.stderr.contains(token) && !agent.stdout.contains(token))
            #expect(!agent.stderr.contains(signature), "no part of a token in the log")
        }
    }
}
