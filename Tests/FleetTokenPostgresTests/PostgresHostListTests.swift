// Issue 30 item 2: libpq's multi-host URLs and target_session_attrs, read by PostgresStoreLocation,
// and the pure rule that picks a host (PostgresHostChoice). No server needed.

import Foundation
import Testing
import TestSupportKit
@testable import FleetTokenPostgres

@Suite("PostgresStoreLocation: several hosts and target_session_attrs", .paced)
struct PostgresHostListTests {
    typealias Host = PostgresStoreLocation.Host

    @Test("hosts in the authority, in order, each with its port or 5432; read-write by default; the description shows every host, never the password")
    func authorityList() throws {
        let location = try PostgresStoreLocation(url: "postgres://agent:s3cret@db1.example:5432,db2.example:5433,[::1]:6000,db4/fleet?sslmode=verify-full")
        #expect(location.hosts == [Host(name: "db1.example", port: 5432), Host(name: "db2.example", port: 5433),
                                   Host(name: "::1", port: 6000), Host(name: "db4", port: 5432)])
        #expect(location.targetSessionAttributes == .readWrite)
        #expect(location.host == "db1.example" && location.port == 5432 && location.user == "agent" && location.database == "fleet")
        #expect(location.urlPassword == "s3cret")
        #expect(location.description == "postgres://agent@db1.example:5432,db2.example:5433,[::1]:6000,db4:5432/fleet?sslmode=verify-full")
        #expect(!location.description.contains("s3cret"))
    }

    @Test("one host: any by default, as before; target_session_attrs chooses otherwise, and shows in the description when not the default")
    func defaults() throws {
        let one = try PostgresStoreLocation(url: "postgres://agent@db/fleet")
        #expect(one.hosts == [Host(name: "db", port: 5432)] && one.targetSessionAttributes == .any)
        #expect(one.description == "postgres://agent@db:5432/fleet")
        let oneWritable = try PostgresStoreLocation(url: "postgres://agent@db/fleet?target_session_attrs=read-write")
        #expect(oneWritable.targetSessionAttributes == .readWrite)
        #expect(oneWritable.description == "postgres://agent@db:5432/fleet?target_session_attrs=read-write")
        let anyOfTwo = try PostgresStoreLocation(url: "postgres://agent@a,b/fleet?target_session_attrs=any")
        #expect(anyOfTwo.targetSessionAttributes == .any && anyOfTwo.description.hasSuffix("?target_session_attrs=any"))
        let primary = try PostgresStoreLocation(url: "postgres://agent@a,b/fleet?target_session_attrs=primary")
        #expect(primary.targetSessionAttributes == .primary)
        #expect(anyOfTwo != primary)
        let spelledOut = try PostgresStoreLocation(url: "postgres://agent@a:5432,b/fleet")
        #expect(spelledOut == (try PostgresStoreLocation(url: "postgres://agent@a,b:5432/fleet")))
    }

    @Test("host= and port= parameters: host= replaces the URL's hosts, port= gives one port for all or one per host; host= alone may still be a socket directory")
    func parameters() throws {
        let listed = try PostgresStoreLocation(url: "postgres://agent@/fleet?host=db1,db2&port=5432,5433")
        #expect(listed.hosts == [Host(name: "db1", port: 5432), Host(name: "db2", port: 5433)] && listed.targetSessionAttributes == .readWrite)
        let replaced = try PostgresStoreLocation(url: "postgres://agent@ignored:1111/fleet?host=db1,db2,db3&port=6543")
        #expect(replaced.hosts.map(\.description) == ["db1:6543", "db2:6543", "db3:6543"])
        let ports = try PostgresStoreLocation(url: "postgres://agent@db1:1,db2:2/fleet?port=7001,7002")
        #expect(ports.hosts.map(\.port) == [7001, 7002])
        let socket = try PostgresStoreLocation(url: "postgres://agent@/fleet?host=/run/postgresql&port=5433")
        #expect(socket.socketPath == "/run/postgresql/.s.PGSQL.5433" && socket.host == nil && socket.targetSessionAttributes == .any)
        #expect(socket.description == "postgres://agent@:5433/fleet?host=/run/postgresql")
    }

    @Test("refused with what to write instead, never echoing a value or the password", arguments: [
        ("postgres://u:pw@h1:5432,h2:70000/d", "port 70000 of host 2 is out of range", nil),
        ("postgres://u:pw@h1:5432,h2:0/d", "port 0 of host 2 is out of range", nil),
        ("postgres://u:pw@h1,h2:x1/d", "the port of host 2 is not a number", "x1"),
        ("postgres://u:pw@h1,,h3/d", "host 2 of the host list is empty", nil),
        ("postgres://u:pw@h1,h2:1:2/d", "more than one ':'", nil),
        ("postgres://u:pw@[::1/d", "no ']'", nil),
        ("postgres://u:pw@/d?host=a,b,c&port=5432,5433", "port= lists 2 ports for 3 hosts", nil),
        ("postgres://u:pw@a,b,c/d?port=1,2", "port= lists 2 ports for 3 hosts", nil),
        ("postgres://u:pw@h/d?port=99999", "parameter port is not accepted", "99999"),
        ("postgres://u:pw@h/d?port=5432,", "parameter port is not accepted", nil),
        ("postgres://u:pw@h/d?host=a,,b", "parameter host is not accepted", nil),
        ("postgres://u:pw@h/d?host=/run/a,/run/b", "parameter host is not accepted", "/run/a"),
        ("postgres://u:pw@a,b/d?host=/run/pg", "one server with a Unix socket directory", nil),
        ("postgres://u:pw@h/d?target_session_attrs=standby", "expected any, read-write, primary", "standby"),
        ("postgres://u:pw@h/d?target_session_attrs=hunter2", "parameter target_session_attrs is not accepted", "hunter2"),
        ("postgres://u:pw/d", "no user", nil),
    ] as [(String, String, String?)])
    func refused(url: String, says: String, value: String?) {
        #expect(throws: PostgresURLError.self) { try PostgresStoreLocation(url: url) }
        do { _ = try PostgresStoreLocation(url: url) } catch {
            #expect(error.description.contains(says), "\(error)")
            #expect(!error.description.contains("pw"), "\(error)")
            if let value { #expect(!error.description.contains(value), "\(error)") }
        }
    }

    @Test("redacted: the hosts, port= and target_session_attrs shown; the password and anything unknown as ***", arguments: [
        ("postgres://agent:s3cret@db1:5432,db2:5433/fleet?target_session_attrs=read-write",
         "postgres://agent:***@db1:5432,db2:5433/fleet?target_session_attrs=read-write"),
        ("postgres://agent:s3cret@/fleet?host=db1,db2&port=5432,5433&sslmode=require",
         "postgres://agent:***@/fleet?host=db1,db2&port=5432,5433&sslmode=require"),
        ("postgres://agent@[::1]:5432,db2/fleet?target_session_attrs=s3cret&port=s3cret",
         "postgres://agent@[::1]:5432,db2/fleet?target_session_attrs=***&port=***"),
        ("postgres://agent@db1,db2/fleet?host=s3cret%20s3cret", "postgres://agent@db1,db2/fleet?host=***"),
        ("postgres://agent:s3cret@db1,d%20b2/fleet", "postgres://<not shown: not a valid URL>"),
    ])
    func redacted(text: String, shown: String) {
        #expect(PostgresStoreLocation.redacted(text) == shown)
        #expect(!PostgresStoreLocation.redacted(text).lowercased().contains("s3cr"))
    }

    @Test("the libpq password file is matched per host: each server gets its own line")
    func passwordPerHost() throws {
        let scratch = Scratch()
        let pgpass = scratch.file("pgpass")
        try "db1:5432:fleet:agent:first\ndb2:5433:fleet:agent:second\n".write(toFile: pgpass, atomically: true, encoding: .utf8)
        let location = try PostgresStoreLocation(url: "postgres://agent@db1:5432,db2:5433/fleet?passfile=\(pgpass)")
        #expect(try location.password(passwordFile: nil, environment: [:], host: location.hosts[0]) == "first")
        #expect(try location.password(passwordFile: nil, environment: [:], host: location.hosts[1]) == "second")
        #expect(try location.password(passwordFile: nil, environment: [:]) == "first")
    }

    @Test("the choice: the host in use first, then the URL's order; read-write skips a read-only server, primary a server in recovery, any takes all")
    func choice() {
        let writable = PostgresHostChoice(count: 3, wanted: .readWrite)
        #expect(writable.order(current: nil) == [0, 1, 2])
        #expect(writable.order(current: 1) == [1, 0, 2])
        #expect(writable.order(current: 2) == [2, 0, 1])
        #expect(writable.order(current: 7) == [0, 1, 2])
        #expect(writable.fits(readOnly: false, inRecovery: false) && !writable.fits(readOnly: true, inRecovery: true))
        #expect(!writable.fits(readOnly: true, inRecovery: false), "default_transaction_read_only on a primary is not writable")
        let primary = PostgresHostChoice(count: 2, wanted: .primary)
        #expect(primary.fits(readOnly: true, inRecovery: false) && !primary.fits(readOnly: true, inRecovery: true))
        let any = PostgresHostChoice(count: 1, wanted: .any)
        #expect(any.fits(readOnly: true, inRecovery: true) && !any.asksServer && writable.asksServer)
    }
}
