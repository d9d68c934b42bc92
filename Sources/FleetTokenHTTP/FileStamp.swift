// Transport layer: a file's identity and version, so a rotated secret or certificate is noticed
// without reading the file.

#if canImport(Glibc)
import Glibc
#endif

/// A file's identity and version, to notice a rotated secret or certificate without reading it.
enum FileStamp {
    /// Inode, size and modification time, or "missing". `stat` follows symlinks: rotated secrets
    /// often swap a link (Kubernetes `..data`), which leaves the link's own times unchanged; the
    /// inode catches a same-size, same-second swap.
    static func of(_ path: String) -> String {
        var info = stat()
        guard stat(path, &info) == 0 else { return "missing" }
        return "\(info.st_ino)/\(info.st_size)/\(info.st_mtim.tv_sec).\(info.st_mtim.tv_nsec)"
    }
}
