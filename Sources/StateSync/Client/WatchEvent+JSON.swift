/// The JSON line `statesync watch --json` prints for a change (README, "The CLI").
extension PropertyChange {
    /// How a change is named in output: how it came (initial, resync), or what it was when it
    /// came live (live for a new value, deleted, expired).
    package func watchKindName(_ kind: WatchEvent.Kind) -> String {
        "\(watchKindLiteral(kind))"
    }

    private func watchKindLiteral(_ kind: WatchEvent.Kind) -> StaticString {
        switch (kind, self.kind) {
        case (.live, .set): "live"
        case (.live, .deleted): "deleted"
        case (.live, .expired): "expired"
        case (.initial, _): "initial"
        case (.resync, _): "resync"
        }
    }

    /// The change as one JSON object, keys in ascending order, as ``Value/jsonText()`` writes the
    /// map ``watchJSONFields(kind:cursor:)``.
    package func watchJSONLine(kind: WatchEvent.Kind, cursor: WatchCursor) -> String {
        var out: [UInt8] = []
        writeWatchJSONLine(kind: kind, cursor: cursor, into: &out)
        return String(decoding: out, as: UTF8.self)
    }

    /// Appends ``watchJSONLine(kind:cursor:)`` (without a newline) to `out` — written directly,
    /// not through the map, since a watch prints one per change.
    package func writeWatchJSONLine(kind: WatchEvent.Kind, cursor: WatchCursor, into out: inout [UInt8]) {
        JSONOctets.append("{\"channel\":", to: &out)
        JSONOctets.appendString(channel, to: &out)
        JSONOctets.append(",\"cursor\":\"", to: &out)
        cursor.writeText(into: &out)
        JSONOctets.append(isRemoval ? "\",\"deleted\":true" : "\",\"deleted\":false", to: &out)
        if let expiresAt {
            JSONOctets.append(",\"expires_at\":", to: &out)
            JSONOctets.appendDecimal(expiresAt, to: &out)
        }
        JSONOctets.append(",\"kind\":\"", to: &out)
        JSONOctets.append(watchKindLiteral(kind), to: &out)
        JSONOctets.append("\",\"model\":", to: &out)
        JSONOctets.appendString(model, to: &out)
        JSONOctets.append(",\"new\":", to: &out)
        new.writeJSON(into: &out)
        JSONOctets.append(",\"old\":", to: &out)
        (old ?? .null).writeJSON(into: &out)
        JSONOctets.append(",\"origin\":", to: &out)
        JSONOctets.appendString(origin, to: &out)
        JSONOctets.append(",\"property\":", to: &out)
        JSONOctets.appendString(property, to: &out)
        JSONOctets.append(",\"version\":\"", to: &out)
        version.writeText(into: &out)
        JSONOctets.append("\"}", to: &out)
    }

    /// The fields of ``watchJSONLine(kind:cursor:)`` as a map (the definition it is tested
    /// against).
    package func watchJSONFields(kind: WatchEvent.Kind, cursor: WatchCursor) -> [String: Value] {
        var fields: [String: Value] = [
            "channel": .string(channel), "model": .string(model), "property": .string(property),
            "old": old ?? .null, "new": new, "version": .string(version.description), "origin": .string(origin),
            "kind": .string(watchKindName(kind)), "deleted": .bool(isRemoval), "cursor": .string(cursor.description),
        ]
        if let expiresAt { fields["expires_at"] = .int(Int64(expiresAt)) }
        return fields
    }
}
