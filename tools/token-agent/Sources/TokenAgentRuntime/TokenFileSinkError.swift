// Agent runtime: what stops a file sink's start, said for an operator: a sink directory that
// cannot be created or written, or one that is not safe to keep tokens in.

/// A token sink problem at start, said for an operator: thrown by ``TokenFileSink/prepare()``.
///
/// Check ``code`` against the static values of ``Code`` (`error.code == .directoryNotWritable`).
/// ``description`` names the directory at fault (``path``) and what to do; it never holds a
/// token.
package struct TokenFileSinkError: Error, Sendable, Equatable, CustomStringConvertible {
    /// What is wrong. More codes may come: match them with `==`, keep a `default`.
    package struct Code: Hashable, Sendable, CustomStringConvertible {
        fileprivate enum Value: String, Sendable {
            case directoryNotCreated, directoryNotWritable, symbolicLink, notADirectory, foreignOwner, writableByOthers, setGroupID
            case accessControlList
        }

        fileprivate let value: Value

        /// The sink directory is missing and could not be created.
        package static let directoryNotCreated = Code(value: .directoryNotCreated)
        /// This user cannot write in the sink directory.
        package static let directoryNotWritable = Code(value: .directoryNotWritable)
        /// The sink directory or one of its kind directories is a symbolic link: the sink does
        /// not follow links, so a link cannot send token files (or stale-file removals) elsewhere.
        package static let symbolicLink = Code(value: .symbolicLink)
        /// Something other than a directory is where the sink directory or a kind directory
        /// must be.
        package static let notADirectory = Code(value: .notADirectory)
        /// The directory belongs to a user other than the sink's (its effective uid) and other
        /// than root: that user could read, swap or plant token files.
        package static let foreignOwner = Code(value: .foreignOwner)
        /// Group or others may write in the directory: they could swap or plant token files.
        package static let writableByOthers = Code(value: .writableByOthers)
        /// The directory is set-group-ID: files in it would take the directory's group instead
        /// of the sink's, and that group could read them.
        package static let setGroupID = Code(value: .setGroupID)
        /// The directory has a POSIX ACL: its own, which can give other users access its mode
        /// does not show, or a default one, which token files made in it would inherit.
        package static let accessControlList = Code(value: .accessControlList)

        /// The code's name, e.g. `directoryNotWritable`.
        package var description: String { value.rawValue }
    }

    /// What is wrong.
    package let code: Code
    /// The sink directory (the root, as configured).
    package let directory: String
    /// The directory at fault: ``directory`` itself, or one of its kind directories.
    package let path: String
    /// What is wrong and what to do.
    package let description: String

    init(_ code: Code, directory: String, path: String? = nil, _ description: String) {
        self.code = code
        self.directory = directory
        self.path = path ?? directory
        self.description = description
    }
}
