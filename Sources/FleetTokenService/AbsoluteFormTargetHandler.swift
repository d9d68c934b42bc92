// Service layer: an HTTP/1.1 request whose target is in absolute form, turned into the request
// it names before anything reads it (the token API's conversion to HTTPTypes, the Fleet Engine
// proxy's REST calls).

package import NIOCore
// Implementation-only, as NIOHTTPTypesHTTP1 in GatedHTTP1Channel.swift: with a plain import, a
// module importing this one loaded NIOHTTP1 too, after which its files' `struct stat` came from
// NIO's C shim and failed under MemberImportVisibility (token-agent's sink code, in a clean
// build). No declaration a client sees uses a type of either module, so the compiler's warning
// about implementation-only imports without library evolution names a risk this code does not run.
@_implementationOnly import NIOHTTP1

/// In front of what reads an HTTP/1.1 request (the token API's conversion to HTTPTypes, the
/// Fleet Engine proxy's REST handler): a request whose target is in absolute form names the
/// server with the target's authority, not its Host header (RFC 9112 3.2.2), so the authority
/// goes in Host and the target becomes origin form. The Host rule then judges the server the
/// request names; before, `GET http://rebind.attacker.example/v1/token/…` with a loopback Host
/// was served. A request with more than one Host is left as it came: the rule refuses it 400.
final class AbsoluteFormTargetHandler: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPServerRequestPart
    typealias InboundOut = HTTPServerRequestPart

    init() {}

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard case .head(let head) = unwrapInboundIn(data), let named = Self.named(head) else {
            return context.fireChannelRead(data)
        }
        context.fireChannelRead(wrapInboundOut(.head(named)))
    }

    /// `head` as the request its absolute-form target names; nil when the target is in another form.
    static func named(_ head: HTTPRequestHead) -> HTTPRequestHead? {
        guard let split = RequestTarget.absoluteForm(head.uri) else { return nil }
        var named = head
        named.uri = split.originForm
        if named.headers["host"].count <= 1 { named.headers.replaceOrAdd(name: "host", value: split.authority) }
        return named
    }
}

/// A new ``AbsoluteFormTargetHandler``, for a pipeline built outside this module (the Fleet Engine
/// proxy's REST connections). Typed as any handler: its HTTP/1.1 types stay this module's.
package func makeAbsoluteFormTargetHandler() -> any ChannelHandler {
    AbsoluteFormTargetHandler()
}
