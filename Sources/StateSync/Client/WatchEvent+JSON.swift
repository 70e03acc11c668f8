/// The JSON line `statesync watch --json` prints for a change (README, "The CLI").
extension PropertyChange {
    /// How a change is named in output: how it came (initial, resync), or what it was when it
    /// came live (live for a new value, deleted, expired).
    package func watchKindName(_ kind: WatchEvent.Kind) -> String {
        kind == .live ? (self.kind == .set ? "live" : self.kind.rawValue) : "\(kind)"
    }

    /// The change as one JSON object, keys in ascending order, as ``Value/jsonText()`` writes the
    /// map ``watchJSONFields(kind:cursor:)`` — written directly, since a watch prints one per
    /// change.
    package func watchJSONLine(kind: WatchEvent.Kind, cursor: WatchCursor) -> String {
        var out = "{\"channel\":"
        out.reserveCapacity(256)
        Value.writeJSONString(channel, into: &out)
        out += ",\"cursor\":"
        Value.writeJSONString(cursor.description, into: &out)
        out += isRemoval ? ",\"deleted\":true" : ",\"deleted\":false"
        if let expiresAt { out += ",\"expires_at\":\(Int64(expiresAt))" }
        out += ",\"kind\":"
        Value.writeJSONString(watchKindName(kind), into: &out)
        out += ",\"model\":"
        Value.writeJSONString(model, into: &out)
        out += ",\"new\":"
        new.writeJSON(into: &out)
        out += ",\"old\":"
        (old ?? .null).writeJSON(into: &out)
        out += ",\"origin\":"
        Value.writeJSONString(origin, into: &out)
        out += ",\"property\":"
        Value.writeJSONString(property, into: &out)
        out += ",\"version\":"
        Value.writeJSONString(version.description, into: &out)
        out += "}"
        return out
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
