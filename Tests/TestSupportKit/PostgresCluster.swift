// How PostgresServer makes a cluster: the directory and who owns it, initdb, the certificates,
// the settings, the first start on a free port; and the record of the test process that owns it,
// by which a later run's sweep tells a crashed run's cluster from a live one.

import Foundation
#if canImport(Glibc)
import Glibc
#endif

extension PostgresServer {
    static func makeDirectory(owner tools: PostgresBinaries) throws -> String {
        var template = Array("\(ClusterLayout.parent)/\(ClusterLayout.prefix)XXXXXX".utf8CString)
        guard let directory = template.withUnsafeMutableBufferPointer({ buffer in mkdtemp(buffer.baseAddress!).map { String(cString: $0) } }) else {
            throw ProcessFailure(message: "mkdtemp in \(ClusterLayout.parent) failed: errno \(errno)")
        }
        let layout = ClusterLayout(directory: directory)
        // First, so that a crash from here on leaves a directory the sweep can attribute.
        try OwnerProcess.current.write(toFile: layout.ownerFile, atomically: true, encoding: .utf8)
        // The directory stays the harness's own, searchable but not listable by others (mode
        // 0711): the CA file it hands out (`sslrootcert=`) sits there, and the store refuses a
        // CA file in a directory another user (the server's) could write to. The server gets
        // its data directory, its socket directory and its log file.
        chmod(directory, 0o711)
        for owned in [layout.data, layout.socket] {
            try FileManager.default.createDirectory(atPath: owned, withIntermediateDirectories: false, attributes: [.posixPermissions: 0o700])
            try tools.giveToServerUser(owned)
        }
        guard FileManager.default.createFile(atPath: layout.log, contents: nil, attributes: [.posixPermissions: 0o600]) else {
            throw ProcessFailure(message: "cannot create \(layout.log)")
        }
        try tools.giveToServerUser(layout.log)
        return directory
    }

    static func initialize(_ layout: ClusterLayout, password: String, tools: PostgresBinaries) throws {
        let passwordFile = "\(layout.directory)/pwfile"
        try tools.writeServerFile(passwordFile, password + "\n", mode: 0o600)
        defer { try? FileManager.default.removeItem(atPath: passwordFile) }
        let initdb = try PostgresBinaries.run(tools.asServerUser + [
            "\(tools.bin)/initdb", "-D", layout.data, "-U", "fleet", "--pwfile=\(passwordFile)",
            "--auth-local=trust", "--auth-host=scram-sha-256", "--no-sync", "-E", "UTF8", "--locale=C",
        ], timeout: 180)
        guard initdb.status == 0 else { throw ProcessFailure(message: "initdb exited with \(initdb.status): \(initdb.stdout)\(initdb.stderr)") }
        // initdb's pg_hba.conf has `host all all 127.0.0.1/32 scram-sha-256` (--auth-host),
        // which covers TLS and plain TCP; nothing to add there.
        try makeCertificates(layout, tools: tools)
        let config = try String(contentsOfFile: layout.mainConfig, encoding: .utf8)
        try tools.writeServerFile(layout.mainConfig, config + "\ninclude 'fleet-test.conf'\n", mode: 0o600)
    }

    /// A CA, and a server certificate for localhost and 127.0.0.1 it signs; the CA's key is deleted.
    private static func makeCertificates(_ layout: ClusterLayout, tools: PostgresBinaries) throws {
        let dir = layout.directory
        let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        let extensions = "\(dir)/server.ext"
        try "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n"
            .write(toFile: extensions, atomically: true, encoding: .utf8)
        let steps: [[String]] = [
            ["req", "-x509"] + ec + ["-keyout", "\(dir)/ca.key", "-out", layout.caFile, "-days", "30", "-subj", "/CN=fleet-test-ca",
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign"],
            ["req", "-new"] + ec + ["-keyout", layout.serverKey, "-out", "\(dir)/server.csr", "-subj", "/CN=localhost"],
            ["x509", "-req", "-in", "\(dir)/server.csr", "-CA", layout.caFile, "-CAkey", "\(dir)/ca.key",
             "-set_serial", "0x\(UUID().uuidString.replacingOccurrences(of: "-", with: "").prefix(16))", "-days", "30",
             "-extfile", extensions, "-out", layout.serverCertificate],
        ]
        for step in steps {
            let result = try PostgresBinaries.run([tools.openssl] + step, timeout: 60)
            guard result.status == 0 else { throw ProcessFailure(message: "openssl \(step[0]) exited with \(result.status): \(result.stderr)") }
        }
        for leftover in ["ca.key", "server.csr", "server.ext"] { try? FileManager.default.removeItem(atPath: "\(dir)/\(leftover)") }
        // The server refuses a key others can read; it must be the server user's.
        chmod(layout.serverKey, 0o600)
        chmod(layout.caFile, 0o644)
        try tools.giveToServerUser(layout.serverKey)
        try tools.giveToServerUser(layout.serverCertificate)
    }

    /// Fast and not crash-safe against the machine going down (fsync off), but a commit is
    /// written to the kernel before it is acknowledged (synchronous_commit on, a write() without
    /// an fsync): with it off, `shutDown(mode: .immediate)` right after a commit lost that commit,
    /// and tests that crash the server would see acknowledged writes vanish. A lock waited for
    /// longer than deadlock_timeout (1 s) is logged with its holder, for a failed test's report.
    private static func settings(port: Int, layout: ClusterLayout) -> String {
        """
        listen_addresses = '127.0.0.1'
        port = \(port)
        unix_socket_directories = '\(layout.socket)'
        fsync = off
        synchronous_commit = on
        full_page_writes = off
        max_connections = 200
        log_lock_waits = on
        shared_buffers = 32MB
        ssl = on
        ssl_cert_file = '\(layout.serverCertificate)'
        ssl_key_file = '\(layout.serverKey)'

        """
    }

    /// Picks a port the kernel says is free, and tries another when the server finds it taken
    /// (someone bound it between our check and the server's bind).
    static func startOnFreePort(_ layout: ClusterLayout, tools: PostgresBinaries) throws -> Int {
        var lastFailure = ""
        for _ in 0..<5 {
            let port = try freePort()
            try tools.writeServerFile(layout.testConfig, settings(port: port, layout: layout), mode: 0o600)
            let logSize = (try? FileManager.default.attributesOfItem(atPath: layout.log)[.size] as? Int) ?? 0
            let result = try PostgresBinaries.run(tools.asServerUser + ["\(tools.bin)/pg_ctl", "-D", layout.data, "-w", "-t", "30",
                                                                     "-l", layout.log, "start"], timeout: 60)
            if result.status == 0 { return port }
            let log = (try? String(contentsOfFile: layout.log, encoding: .utf8)) ?? ""
            let newLog = log.utf8.count > logSize ? String(decoding: log.utf8.dropFirst(logSize), as: UTF8.self) : log
            lastFailure = "pg_ctl start exited with \(result.status): \(result.stdout)\(result.stderr)\nserver log:\n\(layout.logTail(lines: 30))"
            guard newLog.contains("could not bind") || newLog.contains("Address already in use") else { break }
        }
        throw ProcessFailure(message: lastFailure)
    }

    static func freePort() throws -> Int {
        let (descriptor, port) = try boundLoopbackSocket(listening: nil)
        close(descriptor)
        return port
    }

    /// After a failed init: stop whatever started and remove the directory.
    static func discard(_ layout: ClusterLayout, tools: PostgresBinaries) {
        if FileManager.default.fileExists(atPath: "\(layout.data)/postmaster.pid") {
            _ = try? PostgresBinaries.run(tools.asServerUser + ["\(tools.bin)/pg_ctl", "-D", layout.data, "-w", "-t", "20", "-m", "immediate", "stop"], timeout: 40)
        }
        try? FileManager.default.removeItem(atPath: layout.directory)
    }

    static func randomPassword() -> String {
        let alphabet = Array("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
        var generator = SystemRandomNumberGenerator()
        return String((0..<24).map { _ in alphabet.randomElement(using: &generator)! })
    }

    static func percentEncoded(_ text: String) -> String {
        var unreserved = CharacterSet(charactersIn: "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
        unreserved.insert(charactersIn: "-._~")
        return text.addingPercentEncoding(withAllowedCharacters: unreserved) ?? text
    }

    /// A libpq conninfo value between single quotes.
    static func quotedValue(_ text: String) -> String {
        text.replacingOccurrences(of: "\\", with: "\\\\").replacingOccurrences(of: "'", with: "\\'")
    }
}

/// Where one cluster's files are.
struct ClusterLayout {
    static let parent = "/tmp"
    /// The sweep recognises the harness's directories by this prefix (and their owner.pid).
    static let prefix = "fleet-pg-"
    let directory: String
    var data: String { "\(directory)/data" }
    var socket: String { "\(directory)/socket" }
    var log: String { "\(directory)/server.log" }
    var ownerFile: String { "\(directory)/owner.pid" }
    var caFile: String { "\(directory)/ca.crt" }
    var serverCertificate: String { "\(directory)/server.crt" }
    var serverKey: String { "\(directory)/server.key" }
    var mainConfig: String { "\(data)/postgresql.conf" }
    var testConfig: String { "\(data)/fleet-test.conf" }

    func logTail(lines: Int) -> String {
        guard let text = try? String(contentsOfFile: log, encoding: .utf8) else { return "(no server log at \(log))" }
        return text.split(separator: "\n", omittingEmptySubsequences: false).suffix(lines).joined(separator: "\n")
    }
}

/// The test process that owns a cluster: its pid and its start time (so a reused pid does not
/// keep a dead run's cluster alive).
enum OwnerProcess {
    static var current: String { "\(getpid()) \(startTime(of: getpid()) ?? "?")\n" }

    static func isAlive(_ record: String) -> Bool {
        let fields = record.split(whereSeparator: \.isWhitespace)
        guard let first = fields.first, let pid = pid_t(first) else { return true }   // unreadable: leave it
        guard kill(pid, 0) == 0 || errno == EPERM else { return false }
        guard fields.count > 1, let recorded = Optional(String(fields[1])), recorded != "?", let now = startTime(of: pid) else { return true }
        return now == recorded
    }

    /// Field 22 of /proc/PID/stat, counted after the command name (which may hold spaces).
    private static func startTime(of pid: pid_t) -> String? {
        guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
              let end = stat.lastIndex(of: ")") else { return nil }
        let fields = stat[stat.index(after: end)...].split(separator: " ")
        return fields.count > 19 ? String(fields[19]) : nil
    }
}
