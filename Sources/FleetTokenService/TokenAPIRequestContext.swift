// Service layer: the request context of the local token API: Hummingbird's core context plus
// who called (a Unix-socket caller's identity, read once per connection when it was accepted).

public import Hummingbird
import NIOCore

/// The token API's request context: Hummingbird's, plus the caller's identity on a Unix socket.
public struct TokenAPIRequestContext: RequestContext {
    /// Hummingbird's per-request storage.
    public var coreContext: CoreRequestContextStorage
    /// The connection the request came on (to look its caller up).
    let connection: ObjectIdentifier
    /// The caller's identity, set by the access rules on a Unix socket; nil on TCP.
    package internal(set) var peer: PeerIdentity?

    /// A context for a request arriving on `source`'s channel.
    public init(source: ApplicationRequestContextSource) {
        coreContext = .init(source: source)
        connection = ObjectIdentifier(source.channel)
        peer = nil
    }
}
