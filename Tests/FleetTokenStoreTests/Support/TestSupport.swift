import Crypto
import Synchronization
import Foundation
import TestSupportKit
import InMemoryLogging
import Logging
@testable import FleetTokenStore

/// A fresh directory under the system temporary directory, removed when the value is released.
final class TemporaryDirectory: Sendable {
    let path: String

    init() {
        let base = FileManager.default.temporaryDirectory.path
        path = "\(base)/fts-test-\(UUID().uuidString.prefix(8))"
        try! FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
    }

    deinit {
        try? FileManager.default.removeItem(atPath: path)
    }

    func file(_ name: String) -> String { "\(path)/\(name)" }

    /// Names of the entries in the directory, sorted.
    var contents: [String] {
        ((try? FileManager.default.contentsOfDirectory(atPath: path)) ?? []).sorted()
    }
}

func sha256(ofFile path: String) -> String {
    let data = FileManager.default.contents(atPath: path) ?? Data()
    return SHA256.hash(data: data).map { String(format: "%02x", $0) }.joined()
}

func fileMode(_ path: String) -> Int {
    ((try? FileManager.default.attributesOfItem(atPath: path)[.posixPermissions]) as? Int) ?? -1
}

/// Runs a program to completion and returns its exit status and output.
@discardableResult
func run(_ executable: String, _ arguments: [String], stdin: String? = nil) throws -> (status: Int32, stdout: String, stderr: String) {
    let process = try ChildProcess(executable, arguments, stdin: .pipe, stdout: .pipe, stderr: .pipe)
    if let stdin { process.standardInput!.write(Data(stdin.utf8)) }
    try process.standardInput!.close()
    let output = try process.collectOutput()
    return (process.terminationStatus, output.stdout, output.stderr)
}

/// The stock sqlite3 shell.
let sqlite3Path = ["/usr/bin/sqlite3", "/usr/local/bin/sqlite3"].first { FileManager.default.isExecutableFile(atPath: $0) } ?? "sqlite3"

func sqlite3(_ path: String, _ sql: String) throws -> String {
    let result = try run(sqlite3Path, [path, sql])
    guard result.status == 0 else { throw ShellError(message: result.stderr) }
    return result.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
}

struct ShellError: Error, CustomStringConvertible {
    let message: String
    var description: String { message }
}

/// A plausible token value (not a signed JWT; storage does not validate).
func fakeToken(_ seed: String, length: Int = 120) -> String {
    var text = "eyJhbGciOiJSUzI1NiJ9.\(Data(seed.utf8).base64EncodedString())."
    while text.count < length { text += "x" }
    return text
}

let referenceNow = Date(timeIntervalSince1970: 1_800_000_000)

func token(_ key: TokenKey, expiresIn seconds: TimeInterval, lifetime: TimeInterval = 3600,
           now: Date = referenceNow, value: String? = nil) -> StoredToken {
    let expires = now.addingTimeInterval(seconds)
    return StoredToken(key: key, value: value ?? fakeToken("\(key)-\(seconds)"), expiresAt: expires,
                       issuedAt: expires.addingTimeInterval(-lifetime), fetchedAt: expires.addingTimeInterval(-lifetime))
}

func openStore(_ path: String, mode: StoreOpenMode = .agent, configure: (inout StoreConfiguration) -> Void = { _ in },
               logger: Logger = Logger(label: "test")) throws -> SQLiteTokenRepository {
    var configuration = StoreConfiguration()
    configure(&configuration)
    return try SQLiteTokenRepository(path: path, mode: mode, configuration: configuration, logger: logger)
}

