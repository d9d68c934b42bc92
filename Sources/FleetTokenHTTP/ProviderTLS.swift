// Transport layer: the fetcher's TLS material (the CAs it trusts, its client certificate),
// rebuilt when the PEM files rotate on disk.

import CoreMetrics
import FleetTokenStore
import Foundation
import Logging
import NIOSSL
import SwiftASN1
import Synchronization
import X509
#if canImport(Glibc)
import Glibc
#endif

/// Where the fetcher's TLS material comes from: the CAs it trusts and the client certificate it
/// presents (mutual TLS). All PEM files, re-read when they change on disk; each must belong to
/// the running user or root and be writable by neither group nor others, nor lie in a directory
/// another user could write to (`SteeringFileCheck`).
public struct ProviderTLSFiles: Sendable, Equatable {
    /// PEM bundles that replace the system's trust roots (a private CA). Empty: system roots.
    public var caFiles: [String] = []
    /// PEM bundles trusted in addition to the system's (or ``caFiles``') roots.
    public var extraCAFiles: [String] = []
    /// The client certificate (PEM; the leaf first, intermediates after it).
    public var clientCertificateFile: String?
    /// The client certificate's private key (PEM, PKCS#8, SEC1 or PKCS#1).
    public var clientKeyFile: String?

    /// No custom trust, no client certificate.
    public init() {}

    /// True when nothing is customised (the system's roots, no client certificate).
    public var isDefault: Bool { self == ProviderTLSFiles() }
}

/// The TLS configuration built from ``ProviderTLSFiles``, rebuilt when any of the files changes
/// (certificates rotate on disk, as header files do). A rebuild that fails (a certificate and a
/// key that do not match while a rotation is half written, an unreadable file, a file another
/// user could have written or replaced: `SteeringFileCheck`) keeps the last good configuration and warns
/// once; requests in flight keep their connections.
final class ProviderTLS: Sendable {
    /// Warned about when the client certificate expires within this. Seven days.
    static let expiryWarning: TimeInterval = 7 * 86_400

    let files: ProviderTLSFiles
    private let logger: Logger
    private let expiryGauge = Gauge(label: FleetTokenMetric.clientCertificateExpiry.name)
    private let loaded: ReloadedOnChange<(configuration: TLSConfiguration, clientCertificateExpiry: Date?), HTTPFetcherConfigurationError>

    /// Loads the files once.
    /// - Throws: ``HTTPFetcherConfigurationError/tls(_:)`` naming the file and the problem.
    init(files: ProviderTLSFiles, logger: Logger) throws(HTTPFetcherConfigurationError) {
        self.files = files
        self.logger = logger
        let paths = files.caFiles + files.extraCAFiles + [files.clientCertificateFile, files.clientKeyFile].compactMap { $0 }
        loaded = try ReloadedOnChange(paths: paths) { () throws(HTTPFetcherConfigurationError) in try Self.load(files) }
        record(expiry: loaded.lastGood.clientCertificateExpiry)
    }

    /// The configuration for the next request: rebuilt when a file changed since the last call.
    func current() -> TLSConfiguration {
        let (files, logger) = (files, logger)
        return loaded.current(rebuilt: { loaded in
            logger.notice("token provider TLS files changed; new connections use them", metadata: [
                "client_certificate": .string(files.clientCertificateFile ?? "-"),
            ])
            record(expiry: loaded.clientCertificateExpiry)
        }, failed: { error in
            logger.warning("token provider TLS files changed but cannot be used; keeping the previous ones", metadata: [
                "error": .string(error.description),
            ])
        }).configuration
    }

    private func record(expiry: Date?) {
        guard let expiry else { return }
        expiryGauge.record(expiry.timeIntervalSince1970)
        let left = expiry.timeIntervalSinceNow
        if left < Self.expiryWarning {
            logger.warning("the client certificate for the token provider expires soon: renew it", metadata: [
                "client_certificate": .string(files.clientCertificateFile ?? "-"),
                "not_valid_after": .string(expiry.formatted(.iso8601)),
                "days_left": .stringConvertible(Int((left / 86_400).rounded(.down))),
            ])
        }
    }

    static func load(_ files: ProviderTLSFiles) throws(HTTPFetcherConfigurationError) -> (configuration: TLSConfiguration, clientCertificateExpiry: Date?) {
        var configuration = TLSConfiguration.makeClientConfiguration()
        if !files.caFiles.isEmpty {
            var roots: [NIOSSLCertificate] = []
            for path in files.caFiles { roots += try certificates(path, role: "CA file") }
            configuration.trustRoots = .certificates(roots)
        }
        if !files.extraCAFiles.isEmpty {
            var roots: [NIOSSLCertificate] = []
            for path in files.extraCAFiles { roots += try certificates(path, role: "extra CA file") }
            configuration.additionalTrustRoots = [.certificates(roots)]
        }
        var expiry: Date?
        switch (files.clientCertificateFile, files.clientKeyFile) {
        case (nil, nil):
            break
        case (let certificatePath?, let keyPath?):
            // One read of each: the chain and the leaf come from the same bytes.
            let certificatePEM = try text(certificatePath, role: "client certificate")
            let chain = try certificates(pem: certificatePEM, path: certificatePath, role: "client certificate")
            let keyPEM = try text(keyPath, role: "client key")
            let key: NIOSSLPrivateKey
            do {
                key = try NIOSSLPrivateKey(bytes: Array(keyPEM.utf8), format: .pem)
            } catch {
                throw .tls("the client key \(keyPath) is not a PEM private key")
            }
            let leaf = try parsedLeaf(pem: certificatePEM, path: certificatePath)
            do {
                guard try Certificate.PrivateKey(pemEncoded: keyPEM).publicKey == leaf.publicKey else {
                    throw HTTPFetcherConfigurationError.tls("the client key \(keyPath) does not belong to the certificate \(certificatePath)")
                }
            } catch let error as HTTPFetcherConfigurationError {
                throw error
            } catch {
                throw .tls("the client key \(keyPath) cannot be read as an RSA, EC or Ed25519 key")
            }
            configuration.certificateChain = chain.map { .certificate($0) }
            configuration.privateKey = .privateKey(key)
            expiry = leaf.notValidAfter
        default:
            throw .tls("a client certificate needs both a certificate and a key file")
        }
        return (configuration, expiry)
    }

    private static func text(_ path: String, role: String) throws(HTTPFetcherConfigurationError) -> String {
        // Trust and client identity another user could have written or replaced are refused,
        // at the first load (a set-up error) and at each rebuild (the previous configuration
        // stays); what is used is what was judged (read from the same open file).
        let data: Data
        do { data = try SteeringFileCheck.read(path: path, role: role) } catch {
            switch error.code {
            case .missing, .unreadable:
                throw .tls("cannot read the \(role) \(path): check that it exists and is readable")
            default:
                throw .tls(error.description)
            }
        }
        return String(decoding: data, as: UTF8.self)
    }

    private static func certificates(_ path: String, role: String) throws(HTTPFetcherConfigurationError) -> [NIOSSLCertificate] {
        try certificates(pem: try text(path, role: role), path: path, role: role)
    }

    private static func certificates(pem: String, path: String, role: String) throws(HTTPFetcherConfigurationError) -> [NIOSSLCertificate] {
        let certificates = try? NIOSSLCertificate.fromPEMBytes(Array(pem.utf8))
        guard let certificates, !certificates.isEmpty else {
            throw .tls("the \(role) \(path) holds no PEM certificate")
        }
        return certificates
    }

    /// The first certificate of a PEM file, parsed for its public key and expiry.
    private static func parsedLeaf(pem: String, path: String) throws(HTTPFetcherConfigurationError) -> Certificate {
        let end = "-----END CERTIFICATE-----"
        guard let begin = pem.range(of: "-----BEGIN CERTIFICATE-----"),
              let finish = pem.range(of: end, range: begin.upperBound..<pem.endIndex),
              let certificate = try? Certificate(pemEncoded: String(pem[begin.lowerBound..<finish.upperBound])) else {
            throw .tls("the client certificate \(path) holds no PEM certificate")
        }
        return certificate
    }
}
