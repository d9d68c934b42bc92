// What a build of token-agent, tokenctl and dev-token-server is: the release version (here,
// the one place it is written), the git revision the build was made from (BuildRevision.swift,
// written by Plugins/BuildStampPlugin at build time) and the Swift compiler that made it.

/// The version, git revision and Swift version of this build, for `--version` and
/// `fleet_tokens_build_info`.
public enum BuildStamp {
    /// The release version (Semantic Versioning), the same for every executable of the package.
    public static let version = "0.1.0"

    /// The git revision the build was made from: 12 hex digits, with `-dirty` when tracked
    /// files of the built targets differed from that commit; `unknown` when built without git
    /// or outside a checkout (a source tarball).
    public static let revision = stampedRevision

    /// The compiler's Swift version, major.minor.
    ///
    /// A compiler newer than the last step below reports that step with "or later" (the
    /// `--version` test then fails until a step is added).
    public static var swiftVersion: String {
        #if compiler(>=6.6)
        return "6.6 or later"
        #elseif compiler(>=6.5)
        return "6.5"
        #elseif compiler(>=6.4)
        return "6.4"
        #elseif compiler(>=6.3)
        return "6.3"
        #else
        return "6.2"
        #endif
    }

    /// The line `--version` prints: "token-agent 0.1.0 (revision 1a2b3c4d5e6f, Swift 6.3)".
    /// - Parameter program: the executable's name.
    public static func versionLine(program: String) -> String {
        "\(program) \(version) (revision \(revision), Swift \(swiftVersion))"
    }
}
