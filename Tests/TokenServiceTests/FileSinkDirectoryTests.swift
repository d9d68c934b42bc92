// Issue 26 item 7: the file sink's directories are checked, then held. A root or kind directory
// that is a symlink, belongs to another user, is writable by group or others, or is setgid
// stops the start; writes and stale-file removals never leave directories checked that way.
// Real directories, a real engine (in-memory store, scripted provider), no mocks.

import FleetTokenService
import TokenAgentRuntime
import FleetTokenStore
import FleetTokenStoreTesting
import Foundation
import Logging
import ServiceLifecycle
import TestSupportKit
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// An unsafe sink layout, planted under `scratch/sink` before the sink starts.
struct UnsafeSinkLayout: Sendable, CustomTestStringConvertible {
    let name: String
    /// The directory at fault, relative to the scratch directory.
    let fault: String
    let code: TokenFileSinkError.Code
    /// Words the error must say (besides the path): what is wrong and the fix.
    let says: [String]
    let plant: @Sendable (Scratch) throws -> Void

    var testDescription: String { name }

    static func directory(_ path: String, mode: mode_t, owner: uid_t? = nil) throws {
        try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
        #expect(chmod(path, mode) == 0)
        if let owner { #expect(chown(path, owner, gid_t(owner)) == 0) }
    }

    static let all: [UnsafeSinkLayout] = [
        UnsafeSinkLayout(name: "root is a symlink", fault: "sink", code: .symbolicLink, says: ["symbolic link", "elsewhere"]) { scratch in
            try directory(scratch.file("elsewhere"), mode: 0o750)
            try FileManager.default.createSymbolicLink(atPath: scratch.file("sink"), withDestinationPath: scratch.file("elsewhere"))
        },
        UnsafeSinkLayout(name: "kind directory is a symlink", fault: "sink/vehicle", code: .symbolicLink, says: ["symbolic link", "remove the link"]) { scratch in
            try directory(scratch.file("sink"), mode: 0o750)
            try directory(scratch.file("elsewhere"), mode: 0o750)
            try FileManager.default.createSymbolicLink(atPath: scratch.file("sink/vehicle"), withDestinationPath: scratch.file("elsewhere"))
        },
        UnsafeSinkLayout(name: "root is group-writable (0770)", fault: "sink", code: .writableByOthers, says: ["0770", "chmod go-w"]) { scratch in
            try directory(scratch.file("sink"), mode: 0o770)
        },
        UnsafeSinkLayout(name: "kind directory is writable by others (0757)", fault: "sink/trip", code: .writableByOthers, says: ["0757", "chmod go-w"]) { scratch in
            try directory(scratch.file("sink/trip"), mode: 0o757)
        },
        UnsafeSinkLayout(name: "kind directory of another user planted 2777: every problem and fix in one message", fault: "sink/vehicle", code: .foreignOwner,
                         says: ["uid 65534", "2777", "chown 0 ", "chmod go-w,g-s", "or remove it and let the sink create it"]) { scratch in
            try directory(scratch.file("sink/vehicle"), mode: 0o2777, owner: 65534)
        },
        UnsafeSinkLayout(name: "kind directory is setgid (2750)", fault: "sink/vehicle", code: .setGroupID, says: ["2750", "chmod g-s"]) { scratch in
            try directory(scratch.file("sink/vehicle"), mode: 0o2750)
        },
        UnsafeSinkLayout(name: "kind directory owned by another user", fault: "sink/vehicle", code: .foreignOwner, says: ["uid 65534", "chown"]) { scratch in
            try directory(scratch.file("sink/vehicle"), mode: 0o750, owner: 65534)
        },
        UnsafeSinkLayout(name: "root owned by another user", fault: "sink", code: .foreignOwner, says: ["uid 65534", "chown"]) { scratch in
            try directory(scratch.file("sink"), mode: 0o750, owner: 65534)
        },
    ]
}

// Its own suite since the token-agent sink tests (FileSinkTests) moved to AgentOperationsTests;
// exclusive as they were there.
@Suite("token sinks in process: directories checked, then held; tracking followed between checks", .paced, .exclusive)
struct FileSinkDirectoryTests {
    /// The text of the file at `path`, nil when there is none.
    static func contents(_ path: String) -> String? {
        FileManager.default.contents(atPath: path).map { String(decoding: $0, as: UTF8.self) }
    }

    /// A sink under `scratch/sink` of an engine (in-memory store, a provider minting JWTs)
    /// tracking `keys`, checked every 50 ms.
    static func librarySink(_ scratch: Scratch, logger: Logger, keys: [TokenKey] = []) async -> (TokenSyncEngine, TokenFileSink) {
        let time = TestTime(start: Date())
        let store = InMemoryTokenRepository()
        let engine = TokenSyncEngine(repository: store, leases: store, fetcher: ScriptedFetcher.minting(time), logger: logger)
        await engine.track(keys)
        return (engine, TokenFileSink(engine: engine, directory: scratch.file("sink"), checkInterval: .milliseconds(50), logger: logger))
    }

    @Test("an unsafe root or kind directory fails prepare() with a typed error naming the path and the fix", arguments: UnsafeSinkLayout.all)
    func unsafeDirectoriesFailTheStart(_ layout: UnsafeSinkLayout) async throws {
        let scratch = Scratch()
        try layout.plant(scratch)
        let (_, sink) = await Self.librarySink(scratch, logger: Logger(label: "sink-test"))
        let error = #expect(throws: TokenFileSinkError.self) { try sink.prepare() }
        #expect(error?.code == layout.code, "\(String(describing: error))")
        #expect(error?.path == scratch.file(layout.fault))
        #expect(error?.directory == scratch.file("sink"))
        let text = error?.description ?? ""
        #expect(text.contains(scratch.file(layout.fault)), "\(text)")
        for words in layout.says { #expect(text.contains(words), "\(text) says \(words)") }
    }

    @Test("safe directories pass: root-owned or own, 0700 to 0755, sticky; missing ones (and missing parents) are created 0750 in the sink's group, whatever a set-group-ID parent says")
    func safeDirectoriesPass() async throws {
        let scratch = Scratch()
        try UnsafeSinkLayout.directory(scratch.file("sink/vehicle"), mode: 0o755)
        try UnsafeSinkLayout.directory(scratch.file("sink/trip"), mode: 0o700)
        try UnsafeSinkLayout.directory(scratch.file("sink/task"), mode: 0o1750)
        #expect(chown(scratch.file("sink/vehicle"), 0, 0) == 0)
        let (_, sink) = await Self.librarySink(scratch, logger: Logger(label: "sink-test"))
        try sink.prepare()

        // (The umask is the process's, shared with tests running beside this one: the agent's
        // own umask is tested in SinkDirectoryProcessTests.)
        let nested = Scratch()
        let (engine, _) = await Self.librarySink(nested, logger: Logger(label: "sink-test"))
        let deep = TokenFileSink(engine: engine, directory: nested.file("a/b/sink"), logger: Logger(label: "sink-test"))
        try deep.prepare()
        #expect(fileMode(nested.file("a/b/sink")) == 0o750)
        #expect(fileMode(nested.file("a/b")) == 0o750)

        // Under a set-group-ID parent of another group: the created directory is the sink's own.
        try UnsafeSinkLayout.directory(nested.file("shared"), mode: 0o2755)
        #expect(chown(nested.file("shared"), 0, 65534) == 0)
        let underShared = TokenFileSink(engine: engine, directory: nested.file("shared/sink"), logger: Logger(label: "sink-test"))
        try underShared.prepare()
        var info = stat()
        #expect(stat(nested.file("shared/sink"), &info) == 0)
        #expect(info.st_mode & 0o7777 == 0o750 && info.st_gid == getegid(), "mode \(String(info.st_mode & 0o7777, radix: 8)), gid \(info.st_gid)")
    }

    // A review found the sink's directories judged by their mode bits alone: under a parent with
    // a default ACL, the directories the sink made inherited it, and so did each token file,
    // so the user the ACL named could read every token whatever the modes said.
    @Test("under a parent whose default ACL names another user, the sink's directories and token files carry no ACL, and that user cannot read a token")
    func inheritedAccessControlListIsRemoved() async throws {
        let scratch = Scratch()
        let parent = scratch.file("parent")
        try UnsafeSinkLayout.directory(parent, mode: 0o755)
        try PosixACL.set(PosixACL.namingUser(65534), name: AccessControlList.defaultName, on: parent)
        let logs = LogRecorder(label: "sink-test", level: .debug)
        let (engine, _) = await Self.librarySink(scratch, logger: logs.logger, keys: [try TokenKey.vehicle("truck-7")])
        let sink = TokenFileSink(engine: engine, directory: parent + "/sink", checkInterval: .milliseconds(50), logger: logs.logger)
        try sink.prepare()
        let file = parent + "/sink/vehicle/truck-7.jwt"
        try await Self.running([engine, sink], logger: logs.logger) {
            #expect(await eventually(within: 30) { FileManager.default.fileExists(atPath: file) }, "\(logs.allText)")
        }
        for path in [parent + "/sink", parent + "/sink/vehicle", file] {
            #expect(AccessControlList.present(at: path).isEmpty, "\(path) has \(AccessControlList.present(at: path))")
        }
        #expect(fileMode(parent + "/sink") == 0o750 && fileMode(parent + "/sink/vehicle") == 0o750)
        // As the user the parent's ACL names (root can make another user's process).
        if geteuid() == 0 {
            let reader = try RunningProcess("/usr/bin/setpriv", ["--reuid=65534", "--regid=65534", "--clear-groups", "/bin/cat", file], in: scratch)
            let status = await reader.wait(upTo: 30)
            #expect(status != nil && status != 0, "uid 65534 read the token file: status \(String(describing: status))")
            #expect(reader.stdout.isEmpty)
        }
    }

    @Test("a sink or kind directory with an ACL of its own or a default one is refused, naming it and `setfacl -b`")
    func directoriesWithAccessControlListsAreRefused() async throws {
        for (directory, aclName) in [("sink", AccessControlList.accessName), ("sink", AccessControlList.defaultName), ("sink/trip", AccessControlList.defaultName)] {
            let scratch = Scratch()
            try UnsafeSinkLayout.directory(scratch.file("sink/trip"), mode: 0o750)
            try PosixACL.set(PosixACL.namingUser(65534), name: aclName, on: scratch.file(directory))
            let (_, sink) = await Self.librarySink(scratch, logger: Logger(label: "sink-test"))
            let error = #expect(throws: TokenFileSinkError.self, "\(directory) with \(aclName)") { try sink.prepare() }
            #expect(error?.code == .accessControlList && error?.path == scratch.file(directory), "\(String(describing: error))")
            let text = error?.description ?? ""
            #expect(text.contains("setfacl -b \(scratch.file(directory))"), "\(text)")
            #expect(text.contains("default ACL") == (aclName == AccessControlList.defaultName), "\(text)")
        }
    }

    @Test("a directory above the sink that group or others may write (not sticky) is refused: they could put their own sink directory in its place; a sticky one is fine")
    func unsafeDirectoryAboveTheSink() async throws {
        for (mode, refused) in [(mode_t(0o777), true), (0o775, true), (0o1777, false), (0o755, false)] {
            let scratch = Scratch()
            let shared = scratch.file("shared")
            try UnsafeSinkLayout.directory(shared, mode: mode)
            let (engine, _) = await Self.librarySink(scratch, logger: Logger(label: "sink-test"))
            let sink = TokenFileSink(engine: engine, directory: shared + "/agent/sink", logger: Logger(label: "sink-test"))
            if refused {
                let error = #expect(throws: TokenFileSinkError.self, "mode \(String(mode, radix: 8))") { try sink.prepare() }
                #expect(error?.code == .writableByOthers && error?.path == shared, "\(String(describing: error))")
                #expect(error?.description.contains("is under \(shared)") == true && error?.description.contains("could replace the sink directory") == true,
                        "\(String(describing: error))")
                #expect(!FileManager.default.fileExists(atPath: shared + "/agent"), "nothing is created under it")
            } else {
                try sink.prepare()
                #expect(fileMode(shared + "/agent/sink") == 0o750)
            }
        }
        // Through a link: the directories the path is looked up in count (var → shared/ta).
        let scratch = Scratch()
        let shared = scratch.file("shared")
        try UnsafeSinkLayout.directory(shared + "/ta", mode: 0o755)
        #expect(chmod(shared, 0o777) == 0)
        try FileManager.default.createSymbolicLink(atPath: scratch.file("var"), withDestinationPath: shared + "/ta")
        let (engine, _) = await Self.librarySink(scratch, logger: Logger(label: "sink-test"))
        let linked = TokenFileSink(engine: engine, directory: scratch.file("var/sink"), logger: Logger(label: "sink-test"))
        let error = #expect(throws: TokenFileSinkError.self, "through a link") { try linked.prepare() }
        #expect(error?.code == .writableByOthers && error?.path == shared, "\(String(describing: error))")
    }

    @Test("a symlinked kind directory: the link's target is never written nor cleaned, at start or when the link is swapped in while running")
    func symlinkTargetIsNeverTouched() async throws {
        let scratch = Scratch()
        let target = scratch.file("elsewhere")
        try UnsafeSinkLayout.directory(target, mode: 0o750)
        #expect(FileManager.default.createFile(atPath: target + "/important.jwt", contents: Data("keep me".utf8)))
        try UnsafeSinkLayout.directory(scratch.file("sink"), mode: 0o750)
        try FileManager.default.createSymbolicLink(atPath: scratch.file("sink/vehicle"), withDestinationPath: target)
        let logs = LogRecorder(label: "sink-test", level: .debug)
        let keys = [try TokenKey.vehicle("truck-7"), try TokenKey.trip("t-1")]
        let (engine, sink) = await Self.librarySink(scratch, logger: logs.logger, keys: keys)
        #expect(throws: TokenFileSinkError.self, "the start fails") { try sink.prepare() }

        // An embedder that runs the sink anyway: the trip file shows it works; the link is not followed.
        try await Self.running([engine, sink], logger: logs.logger) {
            #expect(await eventually(within: 30) { FileManager.default.fileExists(atPath: scratch.file("sink/trip/t-1.jwt")) }, "\(logs.allText)")
            // The sink has dealt with the linked vehicle directory: it logged its refusal.
            #expect(await eventually(within: 30) {
                logs.allText.contains(scratch.file("sink/vehicle")) && logs.allText.contains("symbolic link")
            }, "\(logs.allText)")
        }
        #expect(try FileManager.default.contentsOfDirectory(atPath: target) == ["important.jwt"], "nothing written to or deleted from the target")
        #expect(Self.contents(target + "/important.jwt") == "keep me")
        #expect(logs.allText.contains(scratch.file("sink/vehicle")) && logs.allText.contains("symbolic link"), "\(logs.allText)")

        // A sink that started safely; then the kind directory is swapped for a link.
        try FileManager.default.removeItem(atPath: scratch.file("sink/vehicle"))
        let (engine2, sink2) = await Self.librarySink(scratch, logger: logs.logger, keys: keys)
        try sink2.prepare()
        try await Self.running([engine2, sink2], logger: logs.logger) {
            #expect(await eventually(within: 30) { FileManager.default.fileExists(atPath: scratch.file("sink/vehicle/truck-7.jwt")) }, "\(logs.allText)")
            try FileManager.default.moveItem(atPath: scratch.file("sink/vehicle"), toPath: scratch.file("moved"))
            try FileManager.default.createSymbolicLink(atPath: scratch.file("sink/vehicle"), withDestinationPath: target)
            logs.clear()
            await engine2.untrack([keys[0]]) // its file would be removed, through the link
            #expect(await eventually(within: 5) { logs.allText.contains("symbolic link") }, "\(logs.allText)")
            try await Task.sleep(for: .milliseconds(300))
        }
        #expect(try FileManager.default.contentsOfDirectory(atPath: target) == ["important.jwt"], "nothing written to or deleted from the target")
        #expect(Self.contents(target + "/important.jwt") == "keep me")
    }

    /// Runs `services` in a group around `body`, then shuts them down.
    static func running(_ services: [any Service], logger: Logger, _ body: () async throws -> Void) async throws {
        let group = ServiceGroup(services: services, logger: logger)
        try await withThrowingTaskGroup(of: Void.self) { tasks in
            tasks.addTask { try await group.run() }
            do { try await body() } catch {
                await group.triggerGracefulShutdown()
                throw error
            }
            await group.triggerGracefulShutdown()
            try await tasks.waitForAll()
        }
    }
}

extension FileSinkDirectoryTests {
    // Found by a review of event races: a reload that tracked a subject whose token was already
    // stored (loaded, not fetched: no refresh event) got its file only at the next event of
    // another subject or at the check, 5 s later by default; an untracked subject's file went
    // the same way. An event that came between the tracking change and the load could also use
    // up the sink's look at it while the token was not yet in memory.
    @Test("a change of tracking is followed once it has taken effect, with no event: a subject tracked with its token already stored gets its file at once, an untracked subject's file goes")
    func followsTrackingWithoutEvents() async throws {
        let scratch = Scratch()
        let logs = LogRecorder(label: "sink-test", level: .debug)
        let time = TestTime(start: Date())
        let store = InMemoryTokenRepository()
        let v1 = try TokenKey.vehicle("v-1"), v2 = try TokenKey.vehicle("v-2")
        // v-2's token is in the store already, as an earlier run or another replica left it.
        let now = time.now
        let stored = StoredToken(key: v2, value: TestJWT.make(for: v2, issuedAt: now, lifetime: 3600), expiresAt: now + 3600,
                                 issuedAt: now, fetchedAt: now)
        try await store.upsert([stored], clearFailure: true)
        let fetcher = ScriptedFetcher.minting(time)
        let engine = TokenSyncEngine(repository: store, leases: store, fetcher: fetcher, logger: logs.logger)
        await engine.track([v1])
        // No periodic check during the test: nothing but the tracking changes moves v-2's file.
        let sink = TokenFileSink(engine: engine, directory: scratch.file("sink"), checkInterval: .seconds(3600), logger: logs.logger)
        try sink.prepare()
        let file1 = scratch.file("sink/vehicle/v-1.jwt"), file2 = scratch.file("sink/vehicle/v-2.jwt")

        try await Self.running([engine, sink], logger: logs.logger) {
            #expect(await eventually(within: 30) { FileManager.default.fileExists(atPath: file1) }, "\(logs.allText)")
            await engine.track([v2])
            #expect(await eventually(within: 10) { Self.contents(file2) == stored.value }, "\(logs.allText)")
            #expect(fetcher.count(v2) == 0, "loaded from the store, not fetched: no refresh event")
            await engine.untrack([v1])
            #expect(await eventually(within: 10) { !FileManager.default.fileExists(atPath: file1) }, "\(logs.allText)")
            let kept = Self.contents(file2) == stored.value
            #expect(kept, "v-2's file still holds its stored token")
        }
    }

    // From FileSinkLoadTests, whose agent test moved to AgentOperationsTests: in-process.
    @Test("between its checks the sink follows events and tracking changes: an untracked subject's refresh writes nothing, an untracked subject's file goes and a re-tracked one's comes back, other subjects' events beside them; the engine's tracked generation moves only with a change")
    func followsTrackingBetweenChecks() async throws {
        let scratch = Scratch()
        let logs = LogRecorder(label: "sink-test", level: .debug)
        let time = TestTime(start: Date())
        let store = InMemoryTokenRepository()
        let engine = TokenSyncEngine(repository: store, leases: store, fetcher: ScriptedFetcher.minting(time), logger: logs.logger)
        let v1 = try TokenKey.vehicle("v-1"), v2 = try TokenKey.vehicle("v-2")
        #expect(engine.tracked == TrackedKeys())
        await engine.track([v1])
        #expect(engine.tracked.keys == [v1] && engine.tracked.generation == 1)
        await engine.track([v1])
        #expect(engine.tracked.generation == 1, "tracking what is tracked changes nothing")
        #expect(engine.isTracked(v1) && !engine.isTracked(v2))
        // No periodic check during the test: only events and tracking changes move files.
        let sink = TokenFileSink(engine: engine, directory: scratch.file("sink"), checkInterval: .seconds(3600), logger: logs.logger)
        try sink.prepare()
        let file1 = scratch.file("sink/vehicle/v-1.jwt"), file2 = scratch.file("sink/vehicle/v-2.jwt")

        try await Self.running([engine, sink], logger: logs.logger) {
            #expect(await eventually(within: 30) { FileManager.default.fileExists(atPath: file1) }, "\(logs.allText)")
            // An on-demand (untracked) subject's fetch: an event the sink drops.
            _ = try await engine.token(for: try .trip("t-1"))
            // A newly tracked subject is fetched at once; its event writes its file. Events are
            // handled in order, so the trip's event was handled before.
            await engine.track([v2])
            #expect(await eventually(within: 30) { Self.contents(file2) == engine.heldToken(for: v2)?.token.value }, "\(logs.allText)")
            #expect(!FileManager.default.fileExists(atPath: scratch.file("sink/trip")), "no file for an untracked subject")

            // Untracked: its file goes (told by the tracking change; an on-demand fetch's event
            // comes beside it and must not hold it up).
            await engine.untrack([v1])
            #expect(engine.tracked.keys == [v2] && engine.tracked.generation == 3)
            _ = try await engine.token(for: try .trip("t-2"))
            #expect(await eventually(within: 5) { !FileManager.default.fileExists(atPath: file1) }, "\(logs.allText)")
            // Tracked again: still held (fresh), so nothing is fetched and no event of its own
            // comes; its file comes back.
            await engine.track([v1])
            _ = try await engine.token(for: try .trip("t-3"))
            #expect(await eventually(within: 5) { Self.contents(file1) == engine.heldToken(for: v1)?.token.value }, "\(logs.allText)")
            #expect(!FileManager.default.fileExists(atPath: scratch.file("sink/trip")))
        }
    }
}

