// Issue 26, item 8: the rule for files that steer an agent, as plain values (mode, owner, the
// agent's uid), and its I/O wrapper on real files.

@testable import FleetTokenStore
import Foundation
import TestSupportKit
import Testing
#if canImport(Glibc)
import Glibc
#endif

@Suite("SteeringFileCheck: files others could have written", .paced)
struct SteeringFileCheckTests {
    @Test("sound: owned by the agent's user or root, no write bit for group or others", arguments: [
        (UInt32(0o600), UInt32(1000), UInt32(1000)),
        (0o644, 1000, 1000),
        (0o640, 0, 1000),      // root's file, readable by the agent's group: the packaged layout
        (0o444, 0, 1000),
        (0o755, 1000, 1000),   // execute and read bits do not count
        (0o4644, 1000, 1000),  // nor setuid and the like
        (0o600, 0, 0),         // an agent running as root
    ])
    func sound(_ mode: UInt32, _ owner: UInt32, _ user: UInt32) {
        let check = SteeringFileCheck(mode: mode, ownerID: owner, userID: user)
        #expect(check.isSafe && !check.writableByGroupOrOthers && !check.ownedByAnotherUser)
        #expect(check.reason(path: "/etc/a") == nil)
    }

    @Test("writable by group or others: any of the two write bits, whoever owns it", arguments: [
        (UInt32(0o620), UInt32(1000)), (0o602, 1000), (0o666, 1000), (0o664, 0), (0o100622, 1000), (0o777, 0),
    ])
    func writable(_ mode: UInt32, _ owner: UInt32) {
        let check = SteeringFileCheck(mode: mode, ownerID: owner, userID: 1000)
        #expect(!check.isSafe && check.writableByGroupOrOthers && !check.ownedByAnotherUser)
        let reason = check.reason(path: "/etc/token-agent/agent.yaml") ?? ""
        #expect(reason.hasPrefix("is writable by group or others (mode 0\(String(mode & 0o777, radix: 8)))"), "\(reason)")
        #expect(reason.hasSuffix("run `chmod go-w /etc/token-agent/agent.yaml`"), "\(reason)")
    }

    @Test("owned by another user: refused whatever the mode, the fix names the agent's uid")
    func otherOwner() {
        let check = SteeringFileCheck(mode: 0o600, ownerID: 1001, userID: 1000)
        #expect(!check.isSafe && check.ownedByAnotherUser && !check.writableByGroupOrOthers)
        let reason = check.reason(path: "/etc/a") ?? ""
        #expect(reason.hasPrefix("belongs to uid 1001"), "\(reason)")
        #expect(reason.contains("run `chown 1000 /etc/a` as root"), "\(reason)")

        let both = SteeringFileCheck(mode: 0o666, ownerID: 1001, userID: 1000)
        #expect(both.ownedByAnotherUser && both.writableByGroupOrOthers)
        #expect(both.reason(path: "/etc/a")?.contains("run `chown 1000 /etc/a && chmod go-w /etc/a` as root") == true)
        // Root's files are trusted; the agent's user is trusted even when not root.
        #expect(SteeringFileCheck(mode: 0o600, ownerID: 0, userID: 1000).isSafe)
        #expect(!SteeringFileCheck(mode: 0o600, ownerID: 1000, userID: 0).isSafe, "an agent running as root trusts only root's files")
    }

    @Test("a directory on the way: the agent's user's or root's, and writable by group or others only when sticky", arguments: [
        (UInt32(0o755), UInt32(0), true), (0o700, 1000, true), (0o1777, 0, true), (0o1777, 1000, true), (0o1770, 0, true),
        (0o777, 0, false), (0o775, 1000, false), (0o2775, 0, false), (0o757, 0, false), (0o755, 1001, false), (0o1777, 1001, false),
    ])
    func directory(_ mode: UInt32, _ owner: UInt32, _ sound: Bool) {
        let check = SteeringFileCheck(mode: 0o040000 | mode, ownerID: owner, userID: 1000)
        #expect(check.isSafeDirectory == sound)
        #expect((check.directoryReason(directory: "/srv/d") == nil) == sound)
        if !sound, owner == 1001 {
            #expect(check.directoryReason(directory: "/srv/d")?.contains("run `chown 1000 /srv/d") == true)
        } else if !sound {
            #expect(check.directoryReason(directory: "/srv/d")?.contains("and not sticky: another user could replace the file; run `chmod go-w /srv/d`") == true)
            #expect(check.directoryReason(directory: "/srv/d", thing: "the socket")?.contains("another user could replace the socket; run `chmod go-w /srv/d`, or keep the socket in") == true)
        }
    }

    // Sticky directories were accepted when the agent's user's (a review found that anyone who
    // may write one can take the socket's name while it is free, as it is whenever the agent
    // stops; the agent then refuses to start and its clients reach the other user's socket).
    @Test("the directory holding the agent's own file (its socket): the agent's user's or root's, and writable by neither group nor others, sticky or not", arguments: [
        (UInt32(0o750), UInt32(1000), true), (0o755, 0, true), (0o700, 1000, true), (0o1755, 1000, true),
        (0o1777, 1000, false), (0o1770, 1000, false), (0o1777, 0, false), (0o777, 1000, false), (0o770, 0, false),
        (0o755, 1001, false), (0o1777, 1001, false),
    ])
    func holdingDirectory(_ mode: UInt32, _ owner: UInt32, _ sound: Bool) {
        let check = SteeringFileCheck(mode: 0o040000 | mode, ownerID: owner, userID: 1000)
        #expect(check.isSafeHoldingDirectory == sound)
        let reason = check.holdingDirectoryReason(directory: "/run/my agent", thing: "the socket")
        #expect((reason == nil) == sound)
        switch (sound, owner == 1001, mode & 0o002 != 0) {
        case (true, _, _): break
        case (false, true, _): #expect(reason == "belongs to another user (uid 1001): use a directory this user owns")
        case (false, false, true):
            #expect(reason?.hasPrefix("is writable by everyone") == true, "\(String(describing: reason))")
            #expect(reason?.contains("who could replace the socket: use a directory only this user can write (chmod go-w '/run/my agent', mode 0750)") == true)
            #expect(reason?.contains("(sticky, which keeps others from removing the socket but not from taking its name while it is free") == (mode & 0o1000 != 0))
        case (false, false, false):
            #expect(reason?.hasPrefix("is writable by its group") == true && reason?.contains("who could replace the socket") == true, "\(String(describing: reason))")
        }
        // An agent running as root: /tmp is refused too, though root's own.
        #expect(!SteeringFileCheck(mode: 0o041777, ownerID: 0, userID: 0).isSafeHoldingDirectory)
    }

    @Test("a path with spaces or quotes is quoted for the shell in the fix")
    func quoting() {
        let check = SteeringFileCheck(mode: 0o666, ownerID: 7, userID: 7)
        #expect(check.reason(path: "/srv/my config.yaml")?.hasSuffix("run `chmod go-w '/srv/my config.yaml'`") == true)
        #expect(check.reason(path: "/srv/it's.yaml")?.hasSuffix(#"run `chmod go-w '/srv/it'\''s.yaml'`"#) == true)
    }

    @Test("the I/O wrapper: a sound file passes, a loose one throws naming role, path and fix, a missing one is left to the reader")
    func onDisk() throws {
        let scratch = Scratch()
        let path = scratch.file("agent.yaml")
        try "vehicle: [a]\n".write(toFile: path, atomically: true, encoding: .utf8)
        #expect(chmod(path, 0o640) == 0)
        try SteeringFileCheck.check(path: path, role: "config file")
        #expect(chmod(path, 0o660) == 0)
        let error = #expect(throws: SteeringFileReadError.self) { try SteeringFileCheck.check(path: path, role: "config file") }
        #expect(error?.code == .refused && error?.refusal?.code == .writableByGroupOrOthers && error?.refusal?.directory == nil)
        #expect(error?.description == "the config file \(path) is writable by group or others (mode 0660): another user could change what the agent does; run `chmod go-w \(path)`")
        #expect(error?.description == error?.refusal?.description, "the refusal's own words")
        #expect(error?.description.contains("vehicle") == false, "never the content")
        // Through a symbolic link: the file it points to is judged.
        let link = scratch.file("link.yaml")
        #expect(symlink(path, link) == 0)
        #expect(throws: SteeringFileReadError.self) { try SteeringFileCheck.check(path: link, role: "config file") }
        try SteeringFileCheck.check(path: scratch.file("absent.yaml"), role: "config file")
    }

    @Test("the I/O wrapper: a path that cannot be examined for a reason other than its absence is refused, not passed")
    func unexaminable() throws {
        let scratch = Scratch()
        // A symbolic link to itself: stat fails with ELOOP.
        let loop = scratch.file("loop.yaml")
        #expect(symlink(loop, loop) == 0)
        let looped = #expect(throws: SteeringFileReadError.self) { try SteeringFileCheck.check(path: loop, role: "config file") }
        #expect(looped?.code == .unreadable && looped?.systemError == ELOOP)
        #expect(looped?.description.hasPrefix("the config file \(loop) cannot be read (") == true, "\(String(describing: looped))")
        // A path through a regular file: stat fails with ENOTDIR.
        let file = scratch.file("plain")
        try "x".write(toFile: file, atomically: true, encoding: .utf8)
        let through = #expect(throws: SteeringFileReadError.self) { try SteeringFileCheck.check(path: file + "/agent.yaml", role: "config file") }
        #expect(through?.code == .unreadable && through?.systemError == ENOTDIR)
        // Not a regular file: a directory.
        let directory = #expect(throws: SteeringFileReadError.self) { try SteeringFileCheck.check(path: scratch.path, role: "CA file") }
        #expect(directory?.code == .notARegularFile)
    }

    @Test("directories from the file up to /: one writable by group or others is refused, naming it and the fix, unless sticky like /tmp")
    func directories() throws {
        let scratch = Scratch()
        let shared = scratch.file("shared")
        #expect(mkdir(shared, 0o755) == 0)
        let path = shared + "/agent.yaml"
        try "vehicle: [a]\n".write(toFile: path, atomically: true, encoding: .utf8)
        #expect(chmod(path, 0o644) == 0)
        try SteeringFileCheck.check(path: path, role: "config file")  // the scratch directory is under /tmp: root's, sticky
        for mode: mode_t in [0o777, 0o775, 0o757] {
            #expect(chmod(shared, mode) == 0)
            let error = #expect(throws: SteeringFileReadError.self, "mode \(String(mode, radix: 8))") {
                try SteeringFileCheck.check(path: path, role: "config file")
            }
            #expect(error?.code == .refused && error?.refusal?.code == .writableByGroupOrOthers && error?.refusal?.directory == shared)
            #expect(error?.description == "the config file \(path) is under \(shared), a directory writable by group or others (mode 0\(String(mode, radix: 8))) "
                    + "and not sticky: another user could replace the file; run `chmod go-w \(shared)`, or keep the file in a directory only this user or root can write",
                    "\(String(describing: error))")
            #expect(throws: SteeringFileReadError.self) { try SteeringFileCheck.read(path: path, role: "config file") }
        }
        // Sticky (as /tmp is): others may create files there but not replace this user's.
        #expect(chmod(shared, 0o1777) == 0)
        try SteeringFileCheck.check(path: path, role: "config file")
        #expect(try SteeringFileCheck.read(path: path, role: "config file") == Data("vehicle: [a]\n".utf8))
        // Deeper: every directory on the way counts.
        #expect(chmod(shared, 0o777) == 0)
        let inner = shared + "/inner"
        #expect(mkdir(inner, 0o755) == 0)
        try "vehicle: [a]\n".write(toFile: inner + "/agent.yaml", atomically: true, encoding: .utf8)
        let deep = #expect(throws: SteeringFileReadError.self) { try SteeringFileCheck.check(path: inner + "/agent.yaml", role: "config file") }
        #expect(deep?.refusal?.directory == shared)
        // A link from a sound directory to a file in a loose one: the file's directories count too.
        let link = scratch.file("link.yaml")
        #expect(symlink(inner + "/agent.yaml", link) == 0)
        let linked = #expect(throws: SteeringFileReadError.self) { try SteeringFileCheck.read(path: link, role: "config file") }
        #expect(linked?.refusal?.directory == shared && linked?.path == link)
    }

    // Found by a review: the directories judged were those above the path as given and those
    // above the file it resolves to; a directory holding a link met on the way to the file (a
    // "current" link in a deploy directory others may write) was in neither.
    @Test("directories: one holding a link met on the way (a link reached through a link) is judged too")
    func linkReachedThroughALink() throws {
        let scratch = Scratch()
        let (shared, releases, etc) = (scratch.file("shared"), scratch.file("releases/v1"), scratch.file("etc"))
        for directory in [shared, releases, etc] { try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true) }
        for directory in [scratch.file("releases"), releases, etc] { #expect(chmod(directory, 0o755) == 0) }
        try "vehicle: [a]\n".write(toFile: releases + "/config.yaml", atomically: true, encoding: .utf8)
        #expect(chmod(releases + "/config.yaml", 0o644) == 0)
        #expect(symlink(releases, shared + "/current") == 0)
        #expect(symlink(shared + "/current/config.yaml", etc + "/config.yaml") == 0)
        #expect(chmod(shared, 0o755) == 0)
        #expect(try SteeringFileCheck.read(path: etc + "/config.yaml", role: "config file") == Data("vehicle: [a]\n".utf8))
        #expect(chmod(shared, 0o777) == 0)
        let error = #expect(throws: SteeringFileReadError.self) { try SteeringFileCheck.read(path: etc + "/config.yaml", role: "config file") }
        #expect(error?.refusal?.directory == shared, "\(String(describing: error))")
        // The walk itself: each directory an entry is looked up in, links followed.
        let looked = try #require(SteeringFileCheck.lookupDirectories(of: etc + "/config.yaml"))
        for directory in [etc, shared, releases, scratch.path, "/"] { #expect(looked.contains(directory), "\(directory) not in \(looked)") }
        #expect(SteeringFileCheck.lookupDirectories(of: scratch.file("missing/x")) == nil)
        #expect(symlink(scratch.file("loop"), scratch.file("loop")) == 0)
        #expect(SteeringFileCheck.lookupDirectories(of: scratch.file("loop")) == nil, "a link loop ends")
    }

    @Test("directories: a relative path is judged from the working directory, up to /")
    func relative() throws {
        #expect(SteeringFileCheck.ancestors(of: "/a/b/c") == ["/a/b", "/a", "/"])
        #expect(SteeringFileCheck.ancestors(of: "//a//b/") == ["/a", "/"])
        #expect(SteeringFileCheck.ancestors(of: "/") == [])
        // The package's working directory is root's or this user's, and not writable by others.
        let here = FileManager.default.currentDirectoryPath
        let scratch = Scratch()
        let path = scratch.file("relative.yaml")
        try "x: 1\n".write(toFile: path, atomically: true, encoding: .utf8)
        let relative = String(repeating: "../", count: here.split(separator: "/").count) + String(path.dropFirst())
        #expect(try SteeringFileCheck.read(path: relative, role: "config file") == Data("x: 1\n".utf8))
        #expect(chmod(scratch.path, 0o777) == 0)
        let error = #expect(throws: SteeringFileReadError.self) { try SteeringFileCheck.read(path: relative, role: "config file") }
        #expect(error?.refusal?.directory?.hasSuffix(scratch.path) == true, "\(String(describing: error))")
    }

    @Test("directories: one owned by another user is refused even when sticky (run as root: chown to nobody)", .enabled(if: geteuid() == 0))
    func directoryOwner() throws {
        let scratch = Scratch()
        let theirs = scratch.file("theirs")
        #expect(mkdir(theirs, 0o755) == 0)
        let path = theirs + "/subjects.txt"
        try "vehicle:a\n".write(toFile: path, atomically: true, encoding: .utf8)
        #expect(chmod(path, 0o644) == 0)
        #expect(chown(theirs, 65534, 65534) == 0)
        for mode: mode_t in [0o755, 0o1777] {
            #expect(chmod(theirs, mode) == 0)
            let error = #expect(throws: SteeringFileReadError.self) { try SteeringFileCheck.check(path: path, role: "subjects file") }
            #expect(error?.refusal?.code == .ownedByAnotherUser && error?.refusal?.directory == theirs)
            #expect(error?.description.contains("is under \(theirs), a directory that belongs to uid 65534") == true, "\(String(describing: error))")
            #expect(error?.description.contains("run `chown 0 \(theirs)` as root") == true, "\(String(describing: error))")
        }
    }

    @Test("the I/O wrapper: a file owned by another user is refused (run as root: chown to nobody)", .enabled(if: geteuid() == 0))
    func onDiskOwner() throws {
        let scratch = Scratch()
        let path = scratch.file("subjects.txt")
        try "vehicle:a\n".write(toFile: path, atomically: true, encoding: .utf8)
        #expect(chown(path, 65534, 65534) == 0)
        let error = #expect(throws: SteeringFileReadError.self) { try SteeringFileCheck.check(path: path, role: "subjects file") }
        #expect(error?.refusal?.code == .ownedByAnotherUser)
        #expect(error?.refusal?.check.ownerID == 65534 && error?.refusal?.check.userID == 0)
        #expect(error?.description.contains("run `chown 0 \(path)` as root") == true, "\(String(describing: error))")
        #expect(throws: SteeringFileReadError.self) { try SteeringFileCheck.read(path: path, role: "subjects file") }
    }

    @Test("read: the bytes of the file judged; missing, not a regular file (a FIFO does not hang the open), too large, unreadable")
    func read() throws {
        let scratch = Scratch()
        let path = scratch.file("subjects.txt")
        try "vehicle:a\n".write(toFile: path, atomically: true, encoding: .utf8)
        #expect(try SteeringFileCheck.read(path: path, role: "subjects file") == Data("vehicle:a\n".utf8))
        #expect(try SteeringFileCheck.read(path: path, role: "subjects file", maximumSize: 10).count == 10)
        let large = #expect(throws: SteeringFileReadError.self) { try SteeringFileCheck.read(path: path, role: "subjects file", maximumSize: 9) }
        #expect(large?.code == .tooLarge)
        let missing = #expect(throws: SteeringFileReadError.self) { try SteeringFileCheck.read(path: scratch.file("absent"), role: "subjects file") }
        #expect(missing?.code == .missing && missing?.systemError == ENOENT)
        let fifo = scratch.file("fifo")
        #expect(mkfifo(fifo, 0o600) == 0)
        let notRegular = #expect(throws: SteeringFileReadError.self) { try SteeringFileCheck.read(path: fifo, role: "subjects file") }
        #expect(notRegular?.code == .notARegularFile)
        #expect(notRegular?.description == "the subjects file \(fifo) is not a regular file: give the path of a file")
        #expect(chmod(path, 0o622) == 0)
        let loose = #expect(throws: SteeringFileReadError.self) { try SteeringFileCheck.read(path: path, role: "subjects file") }
        #expect(loose?.code == .refused && loose?.description.contains("vehicle") == false)
        if geteuid() != 0 {
            #expect(chmod(path, 0o200) == 0)
            let unreadable = #expect(throws: SteeringFileReadError.self) { try SteeringFileCheck.read(path: path, role: "subjects file") }
            #expect(unreadable?.code == .unreadable && unreadable?.systemError == EACCES)
        }
    }
}
