// Service layer: a Unix socket bound where nobody else can reach it, given its mode there, and
// then moved to its path, so that it is never reachable with another mode than the operator's.

import Foundation
#if canImport(Glibc)
package import Glibc
#endif

/// Where a Unix socket is bound before it is put in place: a directory only this user can
/// enter (mode 0700), beside the socket's path (the same file system, so the move is a rename).
///
/// `bind` creates the socket file with the process's umask, and no descriptor changes a bound
/// socket file's mode (`fchmod` on a socket sets the socket's, not the file's), so the mode is
/// set by path inside the private directory, where no other user can reach or swap the file,
/// and `rename` then puts the socket in place atomically, replacing a stale one.
package struct SocketStaging: Sendable {
    /// The final path of the socket.
    package let path: String
    /// The private directory.
    let directory: String
    /// Where the listener binds.
    package var stagedPath: String { directory + "/s" }

    /// Creates the private directory beside `path`.
    /// - Throws: ``TokenAPIError`` when it cannot be made, or the staged path is too long for a
    ///   socket address.
    package init(path: String) throws(TokenAPIError) {
        let parent = (path as NSString).deletingLastPathComponent
        let directory = (parent.isEmpty ? "." : parent) + "/.token-agent-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
        self.path = path
        self.directory = directory
        guard (directory + "/s").utf8.count < MemoryLayout.size(ofValue: sockaddr_un().sun_path) else {
            throw TokenAPIError(.invalidAddress, path, "the socket path \(path) is too long: the agent binds it in a private directory beside it first, and that path needs \(directory.utf8.count + 2) of the \(MemoryLayout.size(ofValue: sockaddr_un().sun_path) - 1) bytes a socket address holds; choose a shorter path")
        }
        guard mkdir(directory, 0o700) == 0 else {
            let reason = String(cString: strerror(errno))
            throw TokenAPIError(.socketDirectoryUnsafe, path, "cannot create \(directory) to bind the socket in private: \(reason); check the socket directory's owner and mode")
        }
    }

    /// Gives the bound socket `mode` and moves it to ``path``; removes the private directory.
    /// - Returns: nil, or what went wrong (errno's text).
    package func place(mode: mode_t) -> String? {
        defer { rmdir(directory) }
        guard chmod(stagedPath, mode) == 0 else { return "chmod: \(String(cString: strerror(errno)))" }
        guard rename(stagedPath, path) == 0 else {
            let reason = String(cString: strerror(errno))
            unlink(stagedPath)
            return "rename to \(path): \(reason)"
        }
        return nil
    }

    /// Removes what a listener that never ran left behind.
    package func discard() {
        unlink(stagedPath)
        rmdir(directory)
    }
}
