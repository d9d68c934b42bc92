// Issue 26, item 8: token-agent refuses to start from a file others could have written, as sshd
// refuses such an authorized_keys: its config file, subjects file, provider header files, CA
// files, client certificate and key. Real processes, real files; the provider is a closed
// loopback port, so an accepted file ends in a fetch failure (exit 1), a refused one in a usage
// error (exit 64) naming the file and the fix.

import Foundation
import TestSupportKit
import Testing
#if canImport(Glibc)
import Glibc
#endif

@Suite("token-agent refuses files others could have written")
struct SteeringFileProcessTests {
    /// The files the agent takes its settings and provider credentials from.
    enum Role: String, CaseIterable, CustomTestStringConvertible, Sendable {
        case config, subjectsFile, headerFile, caFile, extraCAFile, clientCertificate, clientKey
        var testDescription: String { rawValue }
    }

    /// What is wrong with the file, or nothing (`mode` 0644, owned by this user).
    enum Setting: String, CaseIterable, CustomTestStringConvertible, Sendable {
        case sound, writableByAll, writableByGroup, writableByOthers, ownedByAnotherUser
        var testDescription: String { rawValue }
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
        if setting == .ownedByAnotherUser && geteuid() != 0 { return }  // only root can give a file away
        let scratch = Scratch()
        let pem = try Self.certificateAndKey(scratch)
        let path = scratch.file("steering-\(role.rawValue)")
        let arguments = try Self.arguments(role, path: path, scratch: scratch, pem: pem)
        switch setting {
        case .sound: #expect(chmod(path, 0o644) == 0)
        case .writableByAll: #expect(chmod(path, 0o666) == 0)
        case .writableByGroup: #expect(chmod(path, 0o620) == 0)
        case .writableByOthers: #expect(chmod(path, 0o602) == 0)
        case .ownedByAnotherUser:
            #expect(chmod(path, 0o644) == 0)
            #expect(chown(path, 65534, 65534) == 0)
        }
        let result = try await runToEnd("token-agent", arguments, in: scratch)
        switch setting {
        case .sound:
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
        let result = try await runToEnd("token-agent", ["--config", path, "--print-config"], in: scratch)
        #expect(result.status == 64, "\(result.stderr)")
        #expect(result.stderr.contains("chmod go-w \(path)"), "\(result.stderr)")
    }
}
