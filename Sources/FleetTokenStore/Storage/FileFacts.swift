// Storage layer: what `stat` says of a path, in the fields the path checks read. Modules that
// import NIO's modules judge socket paths through it: there `struct stat` may resolve to NIO's C
// shim's copy (a whole-module release build of FleetTokenService did), whose fields then fail
// under MemberImportVisibility. This module imports no NIO.

import Foundation
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// The type, permission bits, owner and identity of a file, as `stat` (or `lstat`) reports them.
package struct FileFacts: Sendable, Equatable {
    /// What kind of file the path names.
    package enum Kind: Sendable, Equatable {
        case directory, socket, regularFile, symbolicLink, other
    }

    /// The file's kind.
    package let kind: Kind
    /// The permission bits, sticky, set-user-ID and set-group-ID included (`st_mode & 0o7777`).
    package let mode: UInt32
    /// The file's owner (`st_uid`).
    package let ownerID: UInt32
    /// The device and inode (`st_dev`, `st_ino`): the same pair is the same file, whatever
    /// path reached it.
    package let identity: [UInt64]

    /// What `path` names, following a final symbolic link unless `followingLinks` is false
    /// (then a link is reported as ``Kind/symbolicLink``); nil when it cannot be examined
    /// (missing, or a directory on the way this user cannot search).
    package static func of(_ path: String, followingLinks: Bool = true) -> FileFacts? {
        var info = stat()
        guard (followingLinks ? stat(path, &info) : lstat(path, &info)) == 0 else { return nil }
        let kind: Kind = switch info.st_mode & S_IFMT {
        case S_IFDIR: .directory
        case S_IFSOCK: .socket
        case S_IFREG: .regularFile
        case S_IFLNK: .symbolicLink
        default: .other
        }
        return FileFacts(kind: kind, mode: UInt32(info.st_mode) & 0o7777, ownerID: UInt32(info.st_uid),
                         identity: [UInt64(info.st_dev), UInt64(info.st_ino)])
    }
}
