// Service layer: the body of a `GET /v1/subjects` page, written by hand.

import FleetTokenStore
import Foundation
import NIOCore

extension TokenAPI {
    /// A page of subject statuses as the JSON array `/v1/subjects` answers: each object's keys in
    /// sorted order, as Foundation's serializer with `.sortedKeys` wrote them, byte for byte.
    ///
    /// Written by hand because the serializer sorted every object's keys with a locale-aware
    /// string compare and bridged each value: at 100,000 subjects, three quarters of the 150 ms
    /// a page of 1,000 still took once its keys were chosen without sorting them all (perf).
    static func subjectsPage(_ page: [SubjectStatus]) -> ByteBuffer {
        var buffer = ByteBuffer()
        buffer.reserveCapacity(page.count * 240 + 2)
        buffer.writeStaticString("[")
        for (index, status) in page.enumerated() {
            if index > 0 { buffer.writeStaticString(",") }
            buffer.writeStaticString("{\"consecutive_failures\":")
            buffer.writeString(String(status.failure?.consecutiveFailures ?? 0))
            buffer.writeStaticString(",\"expires_at\":")
            writeOptionalTimestamp(status.expiresAt, to: &buffer)
            buffer.writeStaticString(",\"fingerprint\":")
            writeOptionalString(status.fingerprint?.description, to: &buffer)
            buffer.writeStaticString(",\"id\":")
            JSONText.writeQuoted(status.key.subjectID, to: &buffer)
            buffer.writeStaticString(",\"kind\":")
            JSONText.writeQuoted(status.key.kind.rawValue, to: &buffer)
            buffer.writeStaticString(",\"last_error_kind\":")
            writeOptionalString(status.failure?.lastErrorKind, to: &buffer)
            buffer.writeStaticString(",\"next_attempt_at\":")
            writeOptionalTimestamp(status.failure?.nextAttemptAt, to: &buffer)
            buffer.writeStaticString(",\"source\":")
            writeOptionalString(status.source?.rawValue, to: &buffer)
            buffer.writeStaticString(",\"status\":")
            JSONText.writeQuoted(status.state.rawValue, to: &buffer)
            buffer.writeStaticString(status.tracked ? ",\"tracked\":true}" : ",\"tracked\":false}")
        }
        buffer.writeStaticString("]")
        return buffer
    }

    private static func writeOptionalString(_ text: String?, to buffer: inout ByteBuffer) {
        guard let text else {
            buffer.writeStaticString("null")
            return
        }
        JSONText.writeQuoted(text, to: &buffer)
    }

    private static func writeOptionalTimestamp(_ date: Date?, to buffer: inout ByteBuffer) {
        guard let date else {
            buffer.writeStaticString("null")
            return
        }
        JSONText.writeQuoted(timestamp(date), to: &buffer)
    }
}
