// Issue 26, item 8, for the PostgreSQL store: the CA file of `sslrootcert=` and the password
// files (`passfile=`, PGPASSFILE, ~/.pgpass, PostgresStoreConfiguration.passwordFile) are
// refused when another user could have written them, as token-agent's other steering files are.
// Whoever can write the CA file can have the agent trust their own server and intercept the
// database connection. No server needed: the files are read before any connection.

import Foundation
import Testing
import TestSupportKit
@testable import FleetTokenPostgres
@testable import FleetTokenStore
#if canImport(Glibc)
import Glibc
#endif

@Suite("PostgreSQL store: the CA and password files no other user could have written", .paced)
struct PostgresSteeringFileTests {
    /// A self-signed certificate (PEM), made by openssl in `scratch`.
    static func certificate(_ scratch: Scratch) throws -> String {
        let (certificate, key) = (scratch.file("made-ca.pem"), scratch.file("made-ca.key"))
        let made = try runCapturing(["/usr/bin/openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                                     "-keyout", key, "-out", certificate, "-days", "2", "-subj", "/CN=db-test-ca"])
        guard made.status == 0 else { throw ProcessFailure(message: "openssl: \(made.stderr)") }
        return try String(contentsOfFile: certificate, encoding: .utf8)
    }

    @Test("sslrootcert writable by group or others, or in such a directory: opening is refused naming the file and the fix", arguments: [
        "verify-full", "verify-ca", "require",
    ])
    func rootCertificate(_ mode: String) throws {
        let scratch = Scratch()
        let pem = try Self.certificate(scratch)
        let ca = scratch.file("db-ca.pem")
        try pem.write(toFile: ca, atomically: true, encoding: .utf8)
        #expect(chmod(ca, 0o644) == 0)
        let configuration = try PostgresStoreConfiguration(url: "postgres://agent@127.0.0.1:1/db?sslmode=\(mode)&sslrootcert=\(ca)")
        _ = try configuration.clientConfigurations(applicationName: "test")

        #expect(chmod(ca, 0o666) == 0)
        let loose = #expect(throws: TokenStoreError.self) { try configuration.clientConfigurations(applicationName: "test") }
        #expect(loose?.description.contains(ca) == true && loose?.description.contains("chmod go-w \(ca)") == true, "\(String(describing: loose))")

        let shared = scratch.file("shared")
        #expect(mkdir(shared, 0o777) == 0 && chmod(shared, 0o777) == 0)
        let inShared = shared + "/db-ca.pem"
        try pem.write(toFile: inShared, atomically: true, encoding: .utf8)
        #expect(chmod(inShared, 0o644) == 0)
        let there = try PostgresStoreConfiguration(url: "postgres://agent@127.0.0.1:1/db?sslmode=\(mode)&sslrootcert=\(inShared)")
        let directory = #expect(throws: TokenStoreError.self) { try there.clientConfigurations(applicationName: "test") }
        #expect(directory?.description.contains("chmod go-w \(shared)") == true, "\(String(describing: directory))")
    }

    @Test("password files writable by group or others are refused naming the file and the fix: passwordFile, passfile=, PGPASSFILE, ~/.pgpass")
    func passwordFiles() throws {
        let scratch = Scratch()
        let password = scratch.file("password"), pgpass = scratch.file(".pgpass")
        try "from-file\n".write(toFile: password, atomically: true, encoding: .utf8)
        try "*:*:*:*:from-pgpass\n".write(toFile: pgpass, atomically: true, encoding: .utf8)
        #expect(chmod(password, 0o600) == 0 && chmod(pgpass, 0o600) == 0)
        let plain = try PostgresStoreLocation(url: "postgres://agent@db.example/fleet")
        let named = try PostgresStoreLocation(url: "postgres://agent@db.example/fleet?passfile=\(pgpass)")
        #expect(try plain.password(passwordFile: password, environment: [:]) == "from-file")
        #expect(try named.password(passwordFile: nil, environment: [:]) == "from-pgpass")
        #expect(try plain.password(passwordFile: nil, environment: ["PGPASSFILE": pgpass]) == "from-pgpass")
        #expect(try plain.password(passwordFile: nil, environment: ["HOME": scratch.path]) == "from-pgpass")

        #expect(chmod(password, 0o620) == 0 && chmod(pgpass, 0o602) == 0)
        let cases: [(String, () throws -> String?, String)] = [
            ("passwordFile", { try plain.password(passwordFile: password, environment: [:]) }, password),
            ("passfile=", { try named.password(passwordFile: nil, environment: [:]) }, pgpass),
            ("PGPASSFILE", { try plain.password(passwordFile: nil, environment: ["PGPASSFILE": pgpass]) }, pgpass),
            ("~/.pgpass", { try plain.password(passwordFile: nil, environment: ["HOME": scratch.path]) }, pgpass),
        ]
        for (what, read, path) in cases {
            let error = #expect(throws: PostgresURLError.self, "\(what)") { _ = try read() }
            #expect(error?.description.contains(path) == true && error?.description.contains("chmod go-w \(path)") == true,
                    "\(what): \(String(describing: error))")
            #expect(error?.description.contains("from-") == false, "never the content")
        }
    }

    @Test("PGPASSFILE=/dev/null (not a regular file) means no password file, as with libpq")
    func devNull() throws {
        let plain = try PostgresStoreLocation(url: "postgres://agent@db.example/fleet")
        #expect(try plain.password(passwordFile: nil, environment: ["PGPASSFILE": "/dev/null"]) == nil)
    }
}
