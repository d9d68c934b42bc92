// The provider configuration's syntax (proxy settings, body templates, the answer's format) is
// its own module so that the fuzz harnesses build it without the HTTP stack; an embedder who
// imports FleetTokenHTTP sees its types as before.
@_exported public import FleetTokenHTTPSyntax
