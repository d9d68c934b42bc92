// Test kit (issue 14): a private PKI generated in-process with swift-certificates and
// swift-crypto (P-256 keys, ECDSA-SHA256), written as PEM files for the fetcher and the servers.

import Crypto
import Foundation
import X509
#if canImport(Glibc)
import Glibc
#endif

/// A private certificate authority with a server certificate for `127.0.0.1`/`localhost`, able to
/// issue client certificates. Every instance is a new, unrelated CA: a second `TestPKI` is the
/// "untrusted" one. Files live in ``directory`` (a fresh temporary directory unless one is given);
/// ``removeFiles()`` deletes it.
///
/// Files per identity named `stem`: `stem.pem` (certificate), `stem.key` (PKCS#8 key, mode 0600),
/// `stem-chain.pem` (certificate then CA). The CA's stem is `ca`, the server's `server`.
package struct TestPKI: Sendable {
    /// A certificate, its key, and where both are on disk.
    package struct Identity: Sendable {
        package let certificate: Certificate
        package let privateKey: Certificate.PrivateKey
        /// PEM of the certificate alone.
        package let certificatePEM: String
        /// PEM (PKCS#8) of the private key.
        package let keyPEM: String
        /// PEM of the certificate followed by the issuing CA's (the CA's own: just itself).
        package let chainPEM: String
        package let certificatePath: String
        package let keyPath: String
        package let chainPath: String

        /// The subject's common name.
        package var commonName: String { TestPKI.commonName(of: certificate) ?? "" }
        package var notValidBefore: Date { certificate.notValidBefore }
        package var notValidAfter: Date { certificate.notValidAfter }

        /// Writes this identity's certificate (or chain) and key over `certificatePath` and
        /// `keyPath`, each atomically (temporary file, then rename; key mode 0600): how a
        /// rotation lands on disk. The certificate is written first.
        package func install(certificateAt certificatePath: String, keyAt keyPath: String, chain: Bool = false) throws {
            try TestPKI.write(chain ? chainPEM : certificatePEM, to: certificatePath, mode: 0o644)
            try TestPKI.write(keyPEM, to: keyPath, mode: 0o600)
        }
    }

    /// Where the files are.
    package let directory: URL
    /// The self-signed CA (path length 0).
    package let ca: Identity
    /// Server certificate: SANs IP `127.0.0.1` and DNS `localhost`, EKU serverAuth, CN `localhost`.
    package let server: Identity
    private let caKey: P256.Signing.PrivateKey

    /// The CA certificate's PEM file: what `--ca-file` takes.
    package var caPath: String { ca.certificatePath }

    /// Generates a CA named `name` and its server certificate, and writes their files.
    /// - Parameters:
    ///   - directory: where to write; nil creates a fresh temporary directory.
    ///   - name: the CA's common name (also in the server certificate's issuer).
    /// - Throws: certificate construction or file errors.
    package init(directory: URL? = nil, name: String = "Fleet Token Test CA") throws {
        if let directory {
            try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
            self.directory = directory
        } else {
            self.directory = FileManager.default.temporaryDirectory
                .appendingPathComponent("test-pki-\(UUID().uuidString.prefix(8))", isDirectory: true)
            try FileManager.default.createDirectory(at: self.directory, withIntermediateDirectories: true)
        }
        let key = P256.Signing.PrivateKey()
        caKey = key
        let publicKey = Certificate.PublicKey(key.publicKey)
        let subject = try DistinguishedName {
            OrganizationName("FleetTokenStore tests")
            CommonName(name)
        }
        let now = Date()
        let caCertificate = try Certificate(
            version: .v3, serialNumber: .init(), publicKey: publicKey,
            notValidBefore: now.addingTimeInterval(-3600), notValidAfter: now.addingTimeInterval(10 * 86_400),
            issuer: subject, subject: subject, signatureAlgorithm: .ecdsaWithSHA256,
            extensions: try Certificate.Extensions {
                Critical(BasicConstraints.isCertificateAuthority(maxPathLength: 0))
                Critical(KeyUsage(keyCertSign: true, cRLSign: true))
                SubjectKeyIdentifier(hash: publicKey)
            },
            issuerPrivateKey: .init(key))
        ca = try Self.writeIdentity(stem: "ca", certificate: caCertificate, key: key, caPEM: nil, in: self.directory)
        server = try Self.issue(
            stem: "server", commonName: "localhost", usage: .serverAuth,
            sans: [.dnsName("localhost"), .ipAddress(.init(contentBytes: [127, 0, 0, 1]))],
            validity: now.addingTimeInterval(-3600)...now.addingTimeInterval(86_400),
            ca: ca, caKey: key, directory: self.directory)
    }

    /// Issues a client certificate (EKU clientAuth) for `commonName`, signed by this CA.
    /// - Parameters:
    ///   - commonName: the subject CN a server reports (make it distinct per certificate).
    ///   - stem: the file name stem; default: the common name with unsafe characters replaced.
    ///   - validity: default one hour ago to one day ahead. Pass a past range for an expired
    ///     certificate, a future one for a not-yet-valid certificate.
    /// - Throws: certificate construction or file errors.
    package func issueClient(commonName: String, stem: String? = nil, validity: ClosedRange<Date>? = nil) throws -> Identity {
        let now = Date()
        return try Self.issue(
            stem: stem ?? Self.fileStem(commonName), commonName: commonName, usage: .clientAuth, sans: [],
            validity: validity ?? now.addingTimeInterval(-3600)...now.addingTimeInterval(86_400),
            ca: ca, caKey: caKey, directory: directory)
    }

    /// Issues another server certificate (EKU serverAuth) with the given SANs, e.g. one that
    /// does not name 127.0.0.1, or an expired one.
    package func issueServer(commonName: String = "localhost", stem: String, dnsNames: [String] = ["localhost"], ipv4: [[UInt8]] = [[127, 0, 0, 1]],
                     validity: ClosedRange<Date>? = nil) throws -> Identity {
        let now = Date()
        let sans = dnsNames.map { GeneralName.dnsName($0) } + ipv4.map { GeneralName.ipAddress(.init(contentBytes: $0[...])) }
        return try Self.issue(
            stem: stem, commonName: commonName, usage: .serverAuth, sans: sans,
            validity: validity ?? now.addingTimeInterval(-3600)...now.addingTimeInterval(86_400),
            ca: ca, caKey: caKey, directory: directory)
    }

    /// Deletes ``directory`` and everything in it.
    package func removeFiles() {
        try? FileManager.default.removeItem(at: directory)
    }

    /// The subject common name of `certificate`, if it has one.
    package static func commonName(of certificate: Certificate) -> String? {
        for rdn in certificate.subject {
            for attribute in rdn where attribute.type == .RDNAttributeType.commonName {
                return String(attribute.value) ?? attribute.value.description
            }
        }
        return nil
    }

    // MARK: - Implementation

    private static func issue(stem: String, commonName: String, usage: ExtendedKeyUsage.Usage, sans: [GeneralName],
                              validity: ClosedRange<Date>, ca: Identity, caKey: P256.Signing.PrivateKey,
                              directory: URL) throws -> Identity {
        let key = P256.Signing.PrivateKey()
        let publicKey = Certificate.PublicKey(key.publicKey)
        let caKeyIdentifier = try ca.certificate.extensions.subjectKeyIdentifier?.keyIdentifier
        let certificate = try Certificate(
            version: .v3, serialNumber: .init(), publicKey: publicKey,
            notValidBefore: validity.lowerBound, notValidAfter: validity.upperBound,
            issuer: ca.certificate.subject,
            subject: try DistinguishedName {
                OrganizationName("FleetTokenStore tests")
                CommonName(commonName)
            },
            signatureAlgorithm: .ecdsaWithSHA256,
            extensions: try Certificate.Extensions {
                Critical(BasicConstraints.notCertificateAuthority)
                Critical(KeyUsage(digitalSignature: true))
                try ExtendedKeyUsage([usage])
                SubjectKeyIdentifier(hash: publicKey)
                AuthorityKeyIdentifier(keyIdentifier: caKeyIdentifier)
                if !sans.isEmpty { SubjectAlternativeNames(sans) }
            },
            issuerPrivateKey: .init(caKey))
        return try writeIdentity(stem: stem, certificate: certificate, key: key, caPEM: ca.certificatePEM, in: directory)
    }

    private static func writeIdentity(stem: String, certificate: Certificate, key: P256.Signing.PrivateKey,
                                      caPEM: String?, in directory: URL) throws -> Identity {
        let certificatePEM = try certificate.serializeAsPEM().pemString + "\n"
        let keyPEM = key.pemRepresentation + "\n"
        let chainPEM = certificatePEM + (caPEM ?? "")
        let base = directory.appendingPathComponent(stem).path
        let identity = Identity(
            certificate: certificate, privateKey: .init(key), certificatePEM: certificatePEM, keyPEM: keyPEM,
            chainPEM: chainPEM, certificatePath: base + ".pem", keyPath: base + ".key", chainPath: base + "-chain.pem")
        try write(certificatePEM, to: identity.certificatePath, mode: 0o644)
        try write(keyPEM, to: identity.keyPath, mode: 0o600)
        try write(chainPEM, to: identity.chainPath, mode: 0o644)
        return identity
    }

    /// Writes atomically: a temporary file in the same directory with `mode`, then a rename.
    fileprivate static func write(_ text: String, to path: String, mode: Int) throws {
        let temporary = path + ".tmp-\(UUID().uuidString.prefix(8))"
        guard FileManager.default.createFile(atPath: temporary, contents: Data(text.utf8),
                                             attributes: [.posixPermissions: mode]) else {
            throw CocoaError(.fileWriteUnknown, userInfo: [NSFilePathErrorKey: temporary])
        }
        try FileManager.default.setAttributes([.posixPermissions: mode], ofItemAtPath: temporary)
        guard rename(temporary, path) == 0 else {
            try? FileManager.default.removeItem(atPath: temporary)
            throw CocoaError(.fileWriteUnknown, userInfo: [NSFilePathErrorKey: path])
        }
    }

    private static func fileStem(_ name: String) -> String {
        String(name.map { $0.isLetter || $0.isNumber || $0 == "-" || $0 == "_" || $0 == "." ? $0 : "_" })
    }
}
