// Service layer: the rules for a Unix socket path of the token API (and of the Fleet Engine
// proxy): the socket's directory and those above it, and a file already at the path.
//
// `stat` is read through FleetTokenStore's FileFacts, never here: with NIO's modules among this
// module's imports, `struct stat` resolved to NIO's C shim's copy (in a file importing NIOCore
// under an incremental debug build, in every file under a whole-module release build), and its
// fields failed under MemberImportVisibility.

import FleetTokenStore
import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// The rules for a Unix socket path.
package enum SocketPath {
    /// The directory must exist, belong to this user (or root) and not be writable by others,
    /// nor may any directory above it (sticky ones of this user or root excepted, as for the
    /// files that steer the agent); an existing file must be a socket nobody answers on.
    ///
    /// With `refusingALiveSocket` false (`token-agent --check-config`, which may run beside the
    /// agent that listens there), a socket something answers on passes.
    package static func check(_ path: String, refusingALiveSocket: Bool = true) throws(TokenAPIError) {
        let directory = (path as NSString).deletingLastPathComponent.isEmpty ? "." : (path as NSString).deletingLastPathComponent
        guard let info = FileFacts.of(directory), info.kind == .directory else {
            throw TokenAPIError(.socketDirectoryMissing, path, "the socket's directory \(directory) does not exist: create it (or have the service manager create it, as systemd's RuntimeDirectory= does)")
        }
        // Whoever may write the directory may move the socket away and put their own in its
        // place, or (sticky or not) take its name while the agent is stopped.
        let check = SteeringFileCheck(mode: info.mode, ownerID: info.ownerID, userID: UInt32(geteuid()))
        if let reason = check.holdingDirectoryReason(directory: directory, thing: "the socket") {
            throw TokenAPIError(.socketDirectoryUnsafe, path, "the socket's directory \(directory) \(reason)")
        }
        // An ACL can let another user in whatever the mode says (a named user's entry: take the
        // socket's name or move it), and a default one is inherited by the private directory the
        // socket is bound in and by the socket itself (a named user could connect).
        let acls = AccessControlList.present(at: directory)
        if !acls.isEmpty {
            let reason = AccessControlList.reason(acls, path: directory, madeInIt: "the socket", harm: "replace the socket or connect to it")
            throw TokenAPIError(.socketDirectoryUnsafe, path, "the socket's directory \(directory) \(reason), or use another directory")
        }
        // Whoever may write a directory on the way (above it as the path names it, or one a
        // link leads through) could move the socket's directory away and put their own in its
        // place, or point a link at their own.
        let name = (path as NSString).lastPathComponent
        if let unsafe = SteeringFileCheck.unsafeDirectory(onTheWayTo: directory + "/" + name, thing: "the socket") {
            throw TokenAPIError(.socketDirectoryUnsafe, path, "the socket \(path) \(unsafe.reason)")
        }
        guard let existing = FileFacts.of(path, followingLinks: false) else { return }
        guard existing.kind == .socket else {
            throw TokenAPIError(.notASocket, path, "\(path) exists and is not a socket: remove it or choose another path")
        }
        if refusingALiveSocket && answers(path) {
            throw TokenAPIError(.socketInUse, path, "another process is listening on \(path): stop it, or choose another socket path")
        }
    }

    /// True when something accepts connections on the socket at `path`.
    static func answers(_ path: String) -> Bool {
        let descriptor = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
        guard descriptor >= 0 else { return false }
        defer { close(descriptor) }
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        let bytes = Array(path.utf8)
        guard bytes.count < MemoryLayout.size(ofValue: address.sun_path) else { return false }
        withUnsafeMutableBytes(of: &address.sun_path) { buffer in
            for (index, byte) in bytes.enumerated() { buffer[index] = byte }
        }
        return withUnsafePointer(to: &address) { pointer in
            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                connect(descriptor, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) == 0
            }
        }
    }
}
