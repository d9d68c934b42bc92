// Issue 26, item 8, in the fetcher: header files and TLS files are re-read when they change on
// disk, without any reload; a version another user could have written is refused there too.
// A real TLS server with a generated CA.

@testable import FleetTokenHTTP
import FleetTokenStore
import FleetTokenStoreTesting
import Foundation
import Logging
import Synchronization
import Testing
import TestSupportKit
#if canImport(Glibc)
import Glibc
#endif

@Suite("HTTPTokenFetcher refuses header and TLS files others could have written", .paced, .exclusive)
struct SteeringFileFetcherTests {
    let key = try! TokenKey.vehicle("truck-7")

    /// Rewrites `path` in place (same inode, owner and mode), as a user with write access would.
    static func rewrite(_ path: String, _ text: String) throws {
        let handle = try #require(FileHandle(forWritingAtPath: path))
        try handle.truncate(atOffset: 0)
        try handle.write(contentsOf: Data(text.utf8))
        try handle.close()
    }

    @Test("a header file made writable by others and rewritten is not sent: the fetch fails naming the file and the fix; fixed, the next fetch sends it")
    func headerFile() async throws {
        let pki = try TestPKI()
        defer { pki.removeFiles() }
        let credential = pki.directory.appendingPathComponent("credential").path
        try "Bearer first-credential\n".write(toFile: credential, atomically: true, encoding: .utf8)
        #expect(chmod(credential, 0o600) == 0)
        let server = try TLSTokenServer(pki: pki)
        try await server.whileRunning {
            var configuration = HTTPTokenFetcherConfiguration(urlTemplate: "\(server.baseURL)/token/{kind}/{id}")
            configuration.tls.caFiles = [pki.caPath]
            configuration.headerFiles = [(name: "Authorization", path: credential)]
            let fetcher = try HTTPTokenFetcher(configuration: configuration, logger: Logger(label: "steering-test"))
            _ = try await fetcher.fetchToken(for: key)
            #expect(server.requests.last?.headers["Authorization"] == ["Bearer first-credential"])

            #expect(chmod(credential, 0o666) == 0)
            try Self.rewrite(credential, "Bearer planted-credential\n")
            let sent = server.requests.count
            let error = await #expect(throws: TokenProviderError.self) { try await fetcher.fetchToken(for: key) }
            #expect(error?.description.contains("the Authorization header file \(credential) is writable by group or others") == true,
                    "\(String(describing: error))")
            #expect(error?.description.contains("chmod go-w \(credential)") == true)
            #expect(error?.description.contains("planted") == false)
            #expect(server.requests.count == sent, "nothing was sent")

            #expect(chmod(credential, 0o600) == 0)
            _ = try await fetcher.fetchToken(for: key)
            #expect(server.requests.last?.headers["Authorization"] == ["Bearer planted-credential"], "the owner's decision stands once fixed")
            await fetcher.shutdown()
        }
    }

    @Test("a CA file others could write is a set-up error; rotated into such a state, the previous trust stays and a warning names the file")
    func caFile() async throws {
        let pki = try TestPKI()
        defer { pki.removeFiles() }
        let ca = pki.directory.appendingPathComponent("trusted-ca.pem").path
        let pem = try String(contentsOfFile: pki.caPath, encoding: .utf8)
        try pem.write(toFile: ca, atomically: true, encoding: .utf8)
        #expect(chmod(ca, 0o664) == 0)
        let server = try TLSTokenServer(pki: pki)
        try await server.whileRunning {
            var configuration = HTTPTokenFetcherConfiguration(urlTemplate: "\(server.baseURL)/token/{kind}/{id}")
            configuration.tls.caFiles = [ca]
            let refused = #expect(throws: HTTPFetcherConfigurationError.self) {
                try HTTPTokenFetcher(configuration: configuration, logger: Logger(label: "steering-test"))
            }
            #expect(refused?.description.contains("the CA file \(ca) is writable by group or others (mode 0664)") == true,
                    "\(String(describing: refused))")
            #expect(refused?.description.contains("chmod go-w \(ca)") == true)

            #expect(chmod(ca, 0o644) == 0)
            let log = LogRecorder()
            let fetcher = try HTTPTokenFetcher(configuration: configuration, logger: log.logger)
            _ = try await fetcher.fetchToken(for: key)
            // Rewritten while writable by others: not used, the trust in force stays.
            #expect(chmod(ca, 0o646) == 0)
            try Self.rewrite(ca, pem + "\n")
            _ = try await fetcher.fetchToken(for: key)
            let warnings = log.messages(at: .warning).joined(separator: "\n")
            #expect(warnings.contains("token provider TLS files changed but cannot be used; keeping the previous ones"), "\(log.allText)")
            #expect(log.allText.contains("chmod go-w \(ca)"), "\(log.allText)")
            await fetcher.shutdown()
        }
    }

    @Test("the file judged is the file read: a header file path swapped between a sound file and a planted one others could write never yields the planted value")
    func headerFileSwapped() throws {
        let scratch = Scratch()
        let sound = scratch.file("sound-credential"), planted = scratch.file("planted-credential"), link = scratch.file("credential")
        try "Bearer sound-credential\n".write(toFile: sound, atomically: true, encoding: .utf8)
        try "Bearer planted-credential\n".write(toFile: planted, atomically: true, encoding: .utf8)
        #expect(chmod(sound, 0o600) == 0 && chmod(planted, 0o666) == 0)
        let flipper = LinkSwapper(link: link, targets: [sound, planted])
        var (sent, refused, planting) = (0, 0, 0)
        let deadline = Date().addingTimeInterval(3)
        while Date() < deadline && planting == 0 {
            // A new reader each time: no cached value.
            do {
                let value = try HeaderFile(name: "Authorization", path: link).value()
                if value.contains("planted") { planting += 1 } else { sent += 1 }
            } catch {
                refused += 1
            }
        }
        flipper.stop()
        #expect(planting == 0, "the planted credential was read after the sound file was judged (\(sent) sound, \(refused) refused)")
    }

    @Test("the file judged is the file read: a CA file path swapped between a sound bundle and a planted one others could write never loads the planted one")
    func caFileSwapped() throws {
        let pki = try TestPKI()
        defer { pki.removeFiles() }
        let scratch = Scratch()
        let sound = scratch.file("sound-ca.pem"), planted = scratch.file("planted-ca.pem"), link = scratch.file("ca.pem")
        try String(contentsOfFile: pki.caPath, encoding: .utf8).write(toFile: sound, atomically: true, encoding: .utf8)
        // Not a certificate: reading it shows as "holds no PEM certificate".
        try "planted\n".write(toFile: planted, atomically: true, encoding: .utf8)
        #expect(chmod(sound, 0o644) == 0 && chmod(planted, 0o666) == 0)
        var files = ProviderTLSFiles()
        files.caFiles = [link]
        let flipper = LinkSwapper(link: link, targets: [sound, planted])
        var (loaded, refused, planting) = (0, 0, 0)
        let deadline = Date().addingTimeInterval(3)
        while Date() < deadline && planting == 0 {
            do {
                _ = try ProviderTLS.load(files)
                loaded += 1
            } catch {
                if error.description.contains("holds no PEM certificate") { planting += 1 } else { refused += 1 }
            }
        }
        flipper.stop()
        #expect(planting == 0, "the planted CA file was read after the sound one was judged (\(loaded) loaded, \(refused) refused)")
    }
}
