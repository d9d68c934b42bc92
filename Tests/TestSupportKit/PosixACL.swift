// Shared by the test targets: POSIX ACLs written as the kernel keeps them (the
// `system.posix_acl_*` extended attributes), since `setfacl` is not installed here.

import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// POSIX ACLs for tests of the edges that refuse them.
public enum PosixACL {
    /// An ACL granting `uid` read and search (its rwx entry under an r-x mask, so the mode's
    /// group bits stay r-x and the mode alone looks safe) beside the owner's rwx, the group's r-x
    /// and nothing for others: version 2, then (tag, permissions, id) entries in tag order.
    public static func namingUser(_ uid: UInt32) -> [UInt8] {
        let undefined = UInt32.max
        let entries: [(UInt16, UInt16, UInt32)] = [(0x01, 7, undefined), (0x02, 7, uid), (0x04, 5, undefined), (0x10, 5, undefined), (0x20, 0, undefined)]
        var bytes = littleEndian(UInt32(2))
        for (tag, permissions, id) in entries { bytes += littleEndian(tag) + littleEndian(permissions) + littleEndian(id) }
        return bytes
    }

    /// Sets the ACL attribute `name` (`system.posix_acl_access` or `…_default`) of `path`.
    public static func set(_ value: [UInt8], name: String, on path: String) throws {
        guard setExtendedAttribute(path, name, value, value.count, 0) == 0 else {
            throw Failure(message: "setxattr \(name) on \(path): \(String(cString: strerror(errno)))")
        }
    }

    private static func littleEndian<T: FixedWidthInteger>(_ value: T) -> [UInt8] {
        withUnsafeBytes(of: value.littleEndian) { Array($0) }
    }

    /// An ACL could not be set.
    public struct Failure: Error, CustomStringConvertible {
        public let message: String
        public var description: String { message }
    }
}

@_silgen_name("setxattr")
private func setExtendedAttribute(_ path: UnsafePointer<CChar>, _ name: UnsafePointer<CChar>, _ value: UnsafeRawPointer, _ size: Int, _ flags: Int32) -> Int32
