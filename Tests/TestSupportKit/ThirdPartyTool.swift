// A program from outside the project that some suites drive (Schemathesis, promtool, nginx,
// tinyproxy): where it is, and the one rule for its absence: a suite runs when the tool is
// found, or when FLEET_REQUIRE_THIRD_PARTY=1 (.ci/run sets it), and then its absence fails.

import Foundation

/// An external program a suite needs, found at a variable's path or at known places.
public struct ThirdPartyTool: Sendable {
    /// The program's name, for messages.
    public let name: String
    /// An environment variable naming its path, checked first (nil: none).
    public let variable: String?
    /// Paths tried in order after the variable.
    public let candidates: [String]
    /// How to get it, for the failure message (e.g. "apt-get install prometheus").
    public let installHint: String

    /// A tool found at `variable`'s path or the first executable of `candidates`.
    public init(_ name: String, variable: String? = nil, candidates: [String], installHint: String) {
        self.name = name
        self.variable = variable
        self.candidates = candidates
        self.installHint = installHint
    }

    /// Whether CI asked for every third-party tool (FLEET_REQUIRE_THIRD_PARTY=1).
    public static var required: Bool { ProcessInfo.processInfo.environment["FLEET_REQUIRE_THIRD_PARTY"] == "1" }

    /// Where the tool is; nil when absent.
    public var path: String? {
        if let variable, let given = ProcessInfo.processInfo.environment[variable], !given.isEmpty { return given }
        return executable(candidates)
    }

    /// Whether a suite needing only this tool runs: it is installed, or required.
    public var shouldRun: Bool { path != nil || Self.required }

    /// The tool's path.
    /// - Throws: ``ProcessFailure`` naming the tool and how to get it, when it is absent.
    public func require() throws -> String {
        guard let path, FileManager.default.isExecutableFile(atPath: path) else {
            throw ProcessFailure(message: "FLEET_REQUIRE_THIRD_PARTY=1 but \(name) is not installed: \(installHint)"
                + (variable.map { "; or set \($0)" } ?? ""))
        }
        return path
    }
}

extension ThirdPartyTool {
    /// A Python tool `.ci/run` installs in its own virtual environment,
    /// `$HOME/.cache/fleet-token-store/VENV` (pinned there): `variable`'s path, else the
    /// environment's `bin/EXECUTABLE`, else `EXECUTABLE` on `PATH`.
    public static func inVirtualEnvironment(_ name: String, executable: String, venv: String, variable: String) -> ThirdPartyTool {
        let home = ProcessInfo.processInfo.environment["HOME"] ?? FileManager.default.homeDirectoryForCurrentUser.path
        let environment = "\(home)/.cache/fleet-token-store/\(venv)"
        let onPath = (ProcessInfo.processInfo.environment["PATH"] ?? "").split(separator: ":").map { "\($0)/\(executable)" }
        return ThirdPartyTool(name, variable: variable, candidates: ["\(environment)/bin/\(executable)"] + onPath,
                              installHint: ".ci/run installs it in \(environment)")
    }
}
