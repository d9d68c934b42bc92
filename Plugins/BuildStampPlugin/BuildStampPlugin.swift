// BuildStampPlugin: writes the git revision the package is built from into the BuildStamp
// target, so a binary reports the commit it was BUILT from (not whatever checkout the current
// directory holds when it runs). Without git or a .git (a source tarball) the revision is
// "unknown" and the build goes on.
//
// A build command, not a prebuild command: SwiftPM reuses its cached build plan while the
// package's file structure is unchanged, and then runs no prebuild command at all, so a commit
// would leave a stale stamp. A build command is part of the plan and llbuild reruns it whenever
// one of its inputs changes: the files that move when HEAD moves, the index, and every source
// file of the package's targets (an edit makes the tree dirty). The script rewrites its output
// only when the text differs, so a rerun that finds the same revision recompiles nothing.

import Foundation
import PackagePlugin

@main
struct BuildStampPlugin: BuildToolPlugin {
    func createBuildCommands(context: PluginContext, target: any Target) throws -> [Command] {
        let package = context.package.directoryURL.standardizedFileURL
        let output = context.pluginWorkDirectoryURL.appending(path: "BuildRevision.swift")
        let targets = context.package.targets
        let sources = targets.compactMap { $0 as? any SourceModuleTarget }.flatMap { $0.sourceFiles.map(\.url) }
        // What `git status` looks at: the targets' folders and the files that make the build.
        let built = targets.map { Self.relative($0.directoryURL, to: package) } + ["Package.swift", "Package.resolved", "Plugins"]
        return [
            .buildCommand(
                displayName: "Stamping the git revision into \(target.name)",
                executable: URL(fileURLWithPath: "/bin/sh"),
                arguments: ["-c", Self.script, "build-stamp", package.path, output.path] + built,
                environment: ["PATH": ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin"],
                inputFiles: GitFiles(checkout: package).existing + sources + [package.appending(path: "Package.swift")],
                outputFiles: [output]
            ),
        ]
    }

    /// `url`'s path below `base`, or "." for `base` itself.
    static func relative(_ url: URL, to base: URL) -> String {
        let path = url.standardizedFileURL.path, prefix = base.path.hasSuffix("/") ? base.path : base.path + "/"
        return path.hasPrefix(prefix) ? String(path.dropFirst(prefix.count)) : "."
    }

    /// `sh -c` script; $1 the package directory, $2 the file to write, then git pathspecs.
    /// `-c safe.directory`: a checkout owned by another user (a CI container) still answers;
    /// `--no-optional-locks`: status does not refresh the index, one of this command's inputs.
    static let script = #"""
        dir=$1 out=$2
        shift 2
        PATH="$PATH:/usr/bin:/bin:/usr/local/bin:/opt/homebrew/bin"
        revision=unknown
        if [ -e "$dir/.git" ] && command -v git >/dev/null 2>&1; then
            if head=$(git -c safe.directory="$dir" -C "$dir" rev-parse --short=12 HEAD 2>/dev/null); then
                revision=$head
                changes=$(git -c safe.directory="$dir" -C "$dir" --no-optional-locks status --porcelain --untracked-files=no -- "$@" 2>/dev/null)
                if [ -n "$changes" ]; then revision="$revision-dirty"; fi
            fi
        fi
        text="// Written by Plugins/BuildStampPlugin when the package is built; not in the repository.
        let stampedRevision = \"$revision\""
        if [ "$(cat "$out" 2>/dev/null)" != "$text" ]; then
            printf '%s\n' "$text" > "$out.new" && mv "$out.new" "$out"
        fi
        exit 0
        """#
}

/// The files of a git checkout that change when HEAD moves (commit, checkout, reset, pull) or
/// the index does; only those that exist (a missing input would stop the build).
struct GitFiles {
    let existing: [URL]

    init(checkout: URL) {
        let dotGit = checkout.appending(path: ".git")
        var gitDirectory = dotGit
        // A worktree or submodule: .git is a file naming the real directory.
        if let text = try? String(contentsOf: dotGit, encoding: .utf8), text.hasPrefix("gitdir:") {
            let path = text.dropFirst("gitdir:".count).trimmingCharacters(in: .whitespacesAndNewlines)
            gitDirectory = path.hasPrefix("/") ? URL(fileURLWithPath: path) : checkout.appending(path: path)
        }
        var candidates = ["HEAD", "logs/HEAD", "index", "packed-refs"].map { gitDirectory.appending(path: $0) }
        if let head = try? String(contentsOf: gitDirectory.appending(path: "HEAD"), encoding: .utf8), head.hasPrefix("ref: ") {
            candidates.append(gitDirectory.appending(path: head.dropFirst(5).trimmingCharacters(in: .whitespacesAndNewlines)))
        }
        existing = candidates.filter { FileManager.default.fileExists(atPath: $0.path) }
    }
}
