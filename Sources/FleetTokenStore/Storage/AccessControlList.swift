// Storage layer: POSIX ACLs, which grant access the mode bits do not show. The edges where
// tokens leave the agent (the sink's directories, the socket's directory) refuse them, since a
// named user's entry gives that user access and a default one is inherited by what is created.

#if canImport(Glibc)
import Glibc
#endif

/// POSIX ACLs, kept in extended attributes: a file's own (`system.posix_acl_access`), which
/// can grant other users access its mode bits do not show, and a directory's default one
/// (`system.posix_acl_default`), which every file and directory created in it inherits.
package enum AccessControlList {
    /// The attribute of a file's own ACL.
    package static let accessName = "system.posix_acl_access"
    /// The attribute of a directory's default ACL.
    package static let defaultName = "system.posix_acl_default"

    /// The ACLs the open `descriptor` has, by attribute name: none when it has none, or when
    /// its file system keeps none.
    package static func present(on descriptor: Int32) -> [String] {
        [accessName, defaultName].filter { getExtendedAttribute(descriptor, $0, nil, 0) > 0 }
    }

    /// The ACLs of what `path` names (following links), by attribute name.
    package static func present(at path: String) -> [String] {
        [accessName, defaultName].filter { getExtendedAttributeByPath(path, $0, nil, 0) > 0 }
    }

    /// Removes both from the open `descriptor`; one it does not have is no error.
    package static func remove(from descriptor: Int32) {
        for name in [accessName, defaultName] { _ = removeExtendedAttribute(descriptor, name) }
    }

    /// What the ACLs `names` (attribute names) at `path` let other users do and how to remove
    /// them, for a message that names `path` just before: `has a default ACL, which every
    /// token file made in it would inherit (`getfacl PATH` shows it), which can let other users
    /// read them whatever its mode says: remove it with `setfacl -b PATH``.
    /// - Parameters:
    ///   - madeInIt: What would inherit a default ACL (`the socket`).
    ///   - harm: What another user could do (`replace the socket or connect to it`).
    package static func reason(_ names: [String], path: String, madeInIt: String, harm: String) -> String {
        let which = names.map { $0 == defaultName ? "a default ACL, which \(madeInIt) would inherit" : "an ACL" }
        let shown = SteeringFileCheck.shellQuoted(path)
        return "has \(which.joined(separator: " and ")) (`getfacl \(shown)` shows it), which can let other users \(harm) whatever its mode says: remove it with `setfacl -b \(shown)`"
    }
}

// glibc's <sys/xattr.h>, which the Glibc module does not import.
@_silgen_name("fgetxattr")
private func getExtendedAttribute(_ descriptor: Int32, _ name: UnsafePointer<CChar>, _ value: UnsafeMutableRawPointer?, _ size: Int) -> Int
@_silgen_name("getxattr")
private func getExtendedAttributeByPath(_ path: UnsafePointer<CChar>, _ name: UnsafePointer<CChar>, _ value: UnsafeMutableRawPointer?, _ size: Int) -> Int
@_silgen_name("fremovexattr")
private func removeExtendedAttribute(_ descriptor: Int32, _ name: UnsafePointer<CChar>) -> Int32
