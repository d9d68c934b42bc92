// Issue 26, item 8: token-agent refuses to start from a file others could have written, as sshd
// refuses such an authorized_keys: its config file, subjects file, provider header files, CA
// files, client certificate and key. Real processes, real files; the provider is a closed
// loopback port, so an accepted file ends in a fetch failure (exit 1), a refused one in a usage
// error (exit 64) naming the file and the fix.

import Foundation
import Synchronization
import TestSupportKit
import Testing
#if canImport(Glibc)
import Glibc
#endif

@Suite("token-agent refuses files others could have written", .paced)
struct SteeringFileProcessTests {
    /// The files the agent takes its settings and provider credentials from.
    enum Role: String, CaseIterable, CustomTestStringConvertible, Sendable {
        case config, subjectsFile, headerFile, caFile, extraCAFile, clientCertificate, clientKey
        var testDescription: String { rawValue }
    }

    /// What is wrong with the file, or nothing (`mode` 0644, owned by this user). The last three
    /// leave the file sound and put it in a directory of its own: writable by all, or by all
    /// but sticky (as /tmp: admitted), or another user's.
    enum Setting: String, CaseIterable, CustomTestStringConvertible, Sendable {
        case sound, writableByAll, writableByGroup, writableByOthers, ownedByAnotherUser
        case inDirectoryWritableByAll, inStickyDirectory, inDirectoryOfAnotherUser
        var testDescription: String { rawValue }
        var directoryMode: mode_t? {
            switch self {
            case .inDirectoryWritableByAll: 0o777
            case .inStickyDirectory: 0o1777
            case .inDirectoryOfAnotherUser: 0o755
            default: nil
            }
        }
    }

    /// A CA certificate file `name` in `scratch` with `mode`: its path.
    static func caFile(_ scratch: Scratch, _ name: String, mode: mode_t) throws -> String {
        let path = scratch.file(name)
        try certificateAndKey(scratch).certificate.write(toFile: path, atomically: true, encoding: .utf8)
        #expect(chmod(path, mode) == 0)
        return path
    }

    /// A self-signed certificate and its key, made by openssl.
    static func certificateAndKey(_ scratch: Scratch) throws -> (certificate: String, key: String) {
        let (certificate, key) = (scratch.file("made-cert.pem"), scratch.file("made-key.pem"))
        let made = try runCapturing(["/usr/bin/openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                                     "-keyout", key, "-out", certificate, "-days", "2", "-subj", "/CN=steering-test"])
        guard made.status == 0 else { throw ProcessFailure(message: "openssl: \(made.stderr)") }
        return (try String(contentsOfFile: certificate, encoding: .utf8), try String(contentsOfFile: key, encoding: .utf8))
    }

    /// The agent's arguments with the file of `role` at `path` (every other file sound).
    static func arguments(_ role: Role, path: String, scratch: Scratch, pem: (certificate: String, key: String)) throws -> [String] {
        let port = SecretOutputTests.closedPort
        let http = "http://127.0.0.1:\(port)/{id}"
        let https = "https://127.0.0.1:\(port)/{id}"
        let base = ["--once", "--db", scratch.file("tokens.sqlite"), "--connect-timeout", "1"]
        let soundCertificate = scratch.file("sound-cert.pem"), soundKey = scratch.file("sound-key.pem")
        try pem.certificate.write(toFile: soundCertificate, atomically: true, encoding: .utf8)
        try pem.key.write(toFile: soundKey, atomically: true, encoding: .utf8)
        _ = chmod(soundKey, 0o600)
        switch role {
        case .config:
            try "provider-url: \(http)\nvehicle: [a]\n".write(toFile: path, atomically: false, encoding: .utf8)
            return base + ["--config", path]
        case .subjectsFile:
            try "vehicle:a\n".write(toFile: path, atomically: false, encoding: .utf8)
            return base + ["--provider-url", http, "--subjects-file", path]
        case .headerFile:
            try "Bearer agent-credential\n".write(toFile: path, atomically: false, encoding: .utf8)
            return base + ["--provider-url", http, "--vehicle", "a", "--header-file", "Authorization:\(path)"]
        case .caFile, .extraCAFile:
            try pem.certificate.write(toFile: path, atomically: false, encoding: .utf8)
            return base + ["--provider-url", https, "--vehicle", "a", role == .caFile ? "--ca-file" : "--extra-ca-file", path]
        case .clientCertificate:
            try pem.certificate.write(toFile: path, atomically: false, encoding: .utf8)
            return base + ["--provider-url", https, "--vehicle", "a", "--client-cert", path, "--client-key", soundKey]
        case .clientKey:
            try pem.key.write(toFile: path, atomically: false, encoding: .utf8)
            return base + ["--provider-url", https, "--vehicle", "a", "--client-cert", soundCertificate, "--client-key", path]
        }
    }

    @Test("at start: a file writable by group or others, or owned by another user, is a usage error naming the file and the fix; a sound one is used",
          arguments: Role.allCases, Setting.allCases)
    func atStart(_ role: Role, _ setting: Setting) async throws {
        if [.ownedByAnotherUser, .inDirectoryOfAnotherUser].contains(setting) && geteuid() != 0 { return }  // only root can give a file away
        let scratch = Scratch()
        let pem = try Self.certificateAndKey(scratch)
        let directory = setting.directoryMode == nil ? scratch.path : scratch.file("holding-\(role.rawValue)")
        if let mode = setting.directoryMode {
            #expect(mkdir(directory, 0o755) == 0 && chmod(directory, mode) == 0)
            if setting == .inDirectoryOfAnotherUser { #expect(chown(directory, 65534, 65534) == 0) }
        }
        let path = directory + "/steering-\(role.rawValue)"
        let arguments = try Self.arguments(role, path: path, scratch: scratch, pem: pem)
        switch setting {
        case .sound, .inDirectoryWritableByAll, .inStickyDirectory, .inDirectoryOfAnotherUser: #expect(chmod(path, 0o644) == 0)
        case .writableByAll: #expect(chmod(path, 0o666) == 0)
        case .writableByGroup: #expect(chmod(path, 0o620) == 0)
        case .writableByOthers: #expect(chmod(path, 0o602) == 0)
        case .ownedByAnotherUser:
            #expect(chmod(path, 0o644) == 0)
            #expect(chown(path, 65534, 65534) == 0)
        }
        let result = try await AgentFixture.run(arguments, in: scratch)
        switch setting {
        case .sound, .inStickyDirectory:
            #expect(result.status == 1, "the provider is unreachable: \(result.stderr)")
            #expect(!result.stderr.contains("chmod") && !result.stderr.contains("chown"), "\(result.stderr)")
        case .writableByAll, .writableByGroup, .writableByOthers:
            #expect(result.status == 64, "\(result.stderr)")
            // "config file PATH: is writable …", "--ca-file: the CA file PATH is writable …"
            #expect(result.stderr.contains(path) && result.stderr.contains("is writable by group or others (mode 0"), "\(result.stderr)")
            #expect(result.stderr.contains("chmod go-w \(path)"), "\(result.stderr)")
        case .ownedByAnotherUser:
            #expect(result.status == 64, "\(result.stderr)")
            #expect(result.stderr.contains(path) && result.stderr.contains("belongs to uid 65534"), "\(result.stderr)")
            #expect(result.stderr.contains("chown \(geteuid()) \(path)"), "\(result.stderr)")
        case .inDirectoryWritableByAll:
            #expect(result.status == 64, "\(result.stderr)")
            #expect(result.stderr.contains(path) && result.stderr.contains("chmod go-w \(directory)"), "\(result.stderr)")
        case .inDirectoryOfAnotherUser:
            #expect(result.status == 64, "\(result.stderr)")
            #expect(result.stderr.contains(path) && result.stderr.contains(directory) && result.stderr.contains("belongs to uid 65534"),
                    "\(result.stderr)")
        }
        // The refusal says what the file is, never what it holds.
        #expect(!result.stderr.contains("agent-credential") && !result.stderr.contains("PRIVATE KEY"), "\(result.stderr)")
    }

    @Test("--print-config refuses an unsafe config file too: what it would print is what an agent would refuse to run with")
    func printConfig() async throws {
        let scratch = Scratch()
        let path = scratch.file("agent.yaml")
        try "vehicle: [a]\n".write(toFile: path, atomically: false, encoding: .utf8)
        #expect(chmod(path, 0o666) == 0)
        let result = try await AgentFixture.run(["--config", path, "--print-config"], in: scratch)
        #expect(result.status == 64, "\(result.stderr)")
        #expect(result.stderr.contains("chmod go-w \(path)"), "\(result.stderr)")
    }

    @Test("the config file judged is the config file read: a path swapped between a sound file and a planted one never makes --print-config show the planted settings")
    func configSwapped() async throws {
        let scratch = Scratch()
        let sound = scratch.file("sound.yaml"), planted = scratch.file("planted.yaml"), link = scratch.file("agent.yaml")
        try "vehicle: [sound]\n".write(toFile: sound, atomically: true, encoding: .utf8)
        try "vehicle: [sound]\nallow: [\"vehicle:*\"]\n".write(toFile: planted, atomically: true, encoding: .utf8)
        #expect(chmod(sound, 0o644) == 0 && chmod(planted, 0o666) == 0)
        let flipper = LinkSwapper(link: link, targets: [sound, planted])
        defer { flipper.stop() }
        var outcomes: [Int32: Int] = [:]
        for _ in 0..<40 {
            let result = try await AgentFixture.run(["--config", link, "--print-config"], in: scratch)
            outcomes[result.status, default: 0] += 1
            #expect(!result.stdout.contains("vehicle:*"), "the planted file was read after the sound one was judged: \(result.stdout)")
            if result.stdout.contains("vehicle:*") { break }
        }
        #expect(outcomes[0, default: 0] + outcomes[64, default: 0] == outcomes.values.reduce(0, +), "\(outcomes)")
    }

    @Test("a PostgreSQL sslrootcert file others could write is refused naming the file and the fix")
    func databaseCAFile() async throws {
        let scratch = Scratch()
        let ca = try Self.caFile(scratch, "db-ca.pem", mode: 0o666)
        let url = "postgres://agent@127.0.0.1:\(SecretOutputTests.closedPort)/db?sslmode=verify-full&sslrootcert=\(ca)"
        let agent = try await AgentFixture.run(["--once", "--vehicle", "a", "--provider-url", "http://127.0.0.1:\(SecretOutputTests.closedPort)/{id}",
                                                       "--connect-timeout", "1", "--db", url], in: scratch)
        #expect(agent.status != 0)
        #expect(agent.stderr.contains("chmod go-w \(ca)"), "\(agent.stderr)")
        let tokenctl = try await runToEnd("tokenctl", ["--db", url, "list"], in: scratch)
        #expect(tokenctl.status != 0)
        #expect(tokenctl.stderr.contains("chmod go-w \(ca)"), "\(tokenctl.stderr)")
    }

    @Test("--fleet-engine-ca-file with a plain http:// --fleet-engine-url is a usage error, as --ca-file is with an http:// provider")
    func fleetEngineCAFileWithPlainURL() async throws {
        let scratch = Scratch()
        let ca = try Self.caFile(scratch, "fleet-engine-ca.pem", mode: 0o644)
        let arguments = ["--db", scratch.file("tokens.sqlite"), "--vehicle", "a", "--fleet-engine-listen", "unix:\(scratch.file("fleet.sock"))",
                         "--fleet-engine-url", "http://127.0.0.1:\(SecretOutputTests.closedPort)", "--fleet-engine-ca-file", ca]
        for extra in [["--check-config"], []] {
            let result = try await AgentFixture.run(arguments + extra, in: scratch, timeout: 30)
            #expect(result.status == 64, "\(extra): \(result.stderr)")
            #expect(result.stderr.contains("--fleet-engine-ca-file applies to an https:// --fleet-engine-url, not http://127.0.0.1:"), "\(result.stderr)")
        }
    }

    @Test("--fleet-engine-ca-file others could write, or owned by another user, is refused at start and by --check-config, naming the file and the fix; a sound one passes",
          arguments: [Setting.sound, .writableByAll, .ownedByAnotherUser])
    func fleetEngineCAFile(_ setting: Setting) async throws {
        if setting == .ownedByAnotherUser && geteuid() != 0 { return }  // only root can give a file away
        let scratch = Scratch()
        let ca = try Self.caFile(scratch, "fleet-engine-ca.pem", mode: setting == .writableByAll ? 0o666 : 0o644)
        if setting == .ownedByAnotherUser { #expect(chown(ca, 65534, 65534) == 0) }
        // Whoever can write the file can trust their own server, and read every call's token.
        let arguments = ["--db", scratch.file("tokens.sqlite"), "--vehicle", "a", "--fleet-engine-listen", "unix:\(scratch.file("fleet.sock"))",
                         "--fleet-engine-url", "https://127.0.0.1:\(SecretOutputTests.closedPort)", "--fleet-engine-ca-file", ca]
        let checked = try await AgentFixture.run(arguments + ["--check-config"], in: scratch)
        if setting == .sound {
            #expect(checked.status == 0 && checked.stdout.contains("configuration OK"), "\(checked.stderr)")
            return
        }
        // A real start refuses it before it listens (a start that went on would run to the bound).
        let started = try await AgentFixture.run(arguments, in: scratch, timeout: 30)
        for result in [checked, started] {
            switch setting {
            case .writableByAll:
                #expect(result.status == 64, "\(result.stderr)")
                #expect(result.stderr.contains("--fleet-engine-ca-file") && result.stderr.contains("chmod go-w \(ca)"), "\(result.stderr)")
            case .ownedByAnotherUser:
                #expect(result.status == 64, "\(result.stderr)")
                #expect(result.stderr.contains("belongs to uid 65534") && result.stderr.contains("chown \(geteuid()) \(ca)"), "\(result.stderr)")
            default:
                Issue.record("unexpected setting \(setting)")
            }
        }
    }
}
