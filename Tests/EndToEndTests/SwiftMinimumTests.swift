import Foundation
import TestSupportKit
import Testing

/// Issue 12 item 13: the README promised Swift 6.1+, but dependencies at the resolved versions
/// declare tools version 6.2, so a 6.1 toolchain cannot even resolve the package. This reads
/// the promise from the README and checks it against every resolved dependency's manifest, the
/// way SwiftPM picks one (a `Package@swift-X.Y.swift` only on toolchains at or above X.Y).
@Suite("The README's Swift minimum", .paced)
struct SwiftMinimumTests {
    static let packageRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
        .deletingLastPathComponent().deletingLastPathComponent()
    static let checkouts = packageRoot.appendingPathComponent(".build/checkouts")
    static var haveCheckouts: Bool { FileManager.default.fileExists(atPath: checkouts.path) }

    struct Version: Comparable, CustomStringConvertible {
        let parts: [Int]
        init?(_ text: some StringProtocol) {
            let parts = text.split(separator: ".").map { Int($0) }
            guard !parts.isEmpty, parts.count <= 3, !parts.contains(nil) else { return nil }
            self.parts = parts.compactMap { $0 } + Array(repeating: 0, count: 3 - parts.count)
        }
        static func < (lhs: Version, rhs: Version) -> Bool { lhs.parts.lexicographicallyPrecedes(rhs.parts) }
        var description: String { parts.map(String.init).joined(separator: ".") }
    }

    /// The `// swift-tools-version:` of a manifest.
    static func toolsVersion(of manifest: URL) throws -> Version {
        let firstLine = try String(contentsOf: manifest, encoding: .utf8).prefix { $0 != "\n" }
        let declared = try #require(firstLine.split(separator: ":").last?.split(separator: ";").first)
        return try #require(Version(declared.trimmingCharacters(in: .whitespaces)), "\(manifest.path): \(firstLine)")
    }

    /// The minimum the README's set-up section states ("Swift 6.2+").
    static func readmeMinimum() throws -> Version {
        let readme = try String(contentsOf: packageRoot.appendingPathComponent("README.md"), encoding: .utf8)
        let match = try #require(readme.firstMatch(of: /with Swift (\d+\.\d+)\+/), "the README states no Swift minimum")
        return try #require(Version(match.1))
    }

    @Test("every resolved dependency has a manifest a toolchain at the README's minimum can read, and so does this package",
          .enabled(if: haveCheckouts, "no .build/checkouts beside the package (built with another scratch path)"))
    func minimumCoversDependencies() throws {
        let minimum = try Self.readmeMinimum()
        #expect(try Self.toolsVersion(of: Self.packageRoot.appendingPathComponent("Package.swift")) <= minimum)
        var unreadable: [String] = []
        let packages = try FileManager.default.contentsOfDirectory(atPath: Self.checkouts.path).sorted()
        #expect(packages.count > 10)
        for package in packages {
            let directory = Self.checkouts.appendingPathComponent(package)
            let manifests = try FileManager.default.contentsOfDirectory(atPath: directory.path)
                .filter { $0 == "Package.swift" || ($0.hasPrefix("Package@swift-") && $0.hasSuffix(".swift")) }
            guard !manifests.isEmpty else { continue }
            let readable = try manifests.contains { name in
                if name != "Package.swift" {
                    let suffix = name.dropFirst("Package@swift-".count).dropLast(".swift".count)
                    guard let variant = Version(suffix), variant <= minimum else { return false }
                }
                return try Self.toolsVersion(of: directory.appendingPathComponent(name)) <= minimum
            }
            if !readable {
                unreadable.append("\(package) (Package.swift: tools \(try Self.toolsVersion(of: directory.appendingPathComponent("Package.swift"))))")
            }
        }
        #expect(unreadable.isEmpty, "the README says Swift \(minimum)+, but these need more: \(unreadable.joined(separator: ", "))")
    }
}
