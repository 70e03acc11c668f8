import Foundation
import Yams

extension NodeConfiguration {
    /// The sections of the file (`node`, `network`, ...): the first part of every key.
    static let sections: [String] = {
        var seen: [String] = []
        for key in Key.allCases {
            let section = String(key.rawValue.prefix { $0 != "." })
            if !seen.contains(section) { seen.append(section) }
        }
        return seen
    }()

    /// Why the configuration text `yaml` (from `path`) names a key the node does not read, or
    /// `nil` when every key is known. A misspelt key would otherwise be ignored and its default
    /// used: a misspelt `security:` section would run the node without CurveZMQ.
    static func unknownKeyProblem(yaml: [UInt8], source path: String) -> String? {
        // The file parsed already (as a YAML mapping): a failure here has nothing to add.
        guard let root = try? Yams.compose(yaml: String(decoding: yaml, as: UTF8.self)), let mapping = root.mapping
        else { return nil }
        let known = Set(Key.allCases.map(\.rawValue))
        for (keyNode, value) in mapping {
            let section = keyNode.string ?? "\(keyNode)"
            // An extension field (`x-defaults: &defaults ...`), the usual place for anchors: not
            // read, and not a misspelling.
            if section.hasPrefix("x-") { continue }
            guard section != "<<" else { return mergeKeyProblem(path, "the top level") }
            guard sections.contains(section) else {
                return
                    "\(path): '\(section)' is not a configuration section\(suggestion(for: section, among: sections))"
                    + " (the sections: \(sections.joined(separator: ", ")))"
            }
            guard let entries = value.mapping else {
                if value.null != nil || value.scalar?.string.isEmpty == true { continue }  // `http:` alone
                return
                    "\(path): \(section): expected a mapping of its keys (e.g. \(section):\\n  \(firstKey(of: section)): ...)"
            }
            for (entryNode, _) in entries {
                let entry = entryNode.string ?? "\(entryNode)"
                guard entry != "<<" else { return mergeKeyProblem(path, section) }
                let name = section + "." + entry
                guard known.contains(name) else {
                    let siblings = Key.allCases.map(\.rawValue).filter { $0.hasPrefix(section + ".") }
                    return "\(path): \(name): unknown key\(suggestion(for: name, among: siblings))"
                        + " (\(section) has: \(siblings.map { String($0.dropFirst(section.count + 1)) }.joined(separator: ", ")))"
                }
            }
        }
        return nil
    }

    /// The keys whose value is text (a path, an endpoint, a name, a word).
    static let textKeys: Set<Key> = [
        .nodeID, .dataDirectory, .publish, .api, .repair, .logLevel, .logFormat, .httpListen, .fsync, .publishAt,
        .secretKey,
    ]

    /// Why the configuration text `yaml` gives a text key a YAML boolean or null (`id: true`,
    /// `id: yes`, `data_dir: ~`), or `nil`. The configuration reader would take `true` as the
    /// text "true": a node named "true" is more likely a slip than a choice, and a quoted
    /// `'true'` still says it is meant.
    static func nonTextValueProblem(yaml: [UInt8], source path: String) -> String? {
        guard let root = try? Yams.compose(yaml: String(decoding: yaml, as: UTF8.self)), let mapping = root.mapping
        else { return nil }
        for key in Key.allCases where textKeys.contains(key) {
            let parts = key.rawValue.split(separator: ".").map(String.init)
            guard let value = mapping[parts[0]]?.mapping?[parts[1]], let scalar = value.scalar,
                scalar.style == .plain,
                [Tag.Name.bool.rawValue, Tag.Name.null.rawValue].contains(value.tag.description),
                !scalar.string.isEmpty
            else { continue }
            let kind = value.tag.description == Tag.Name.bool.rawValue ? "a YAML boolean" : "YAML's null"
            return
                "\(path): \(key.rawValue): expected a string, not \(scalar.string) (\(kind)); quote it ('\(scalar.string)') if that is the value meant"
        }
        return nil
    }

    /// Why `environment` holds a variable that looks like an override but names no key, or
    /// `nil`: one that starts with `STATESYNC_` and a section's name, or one within two edits of
    /// a key's variable (a misspelt section: `STATESYNC_SECURTY_SECRET_KEY`). Other `STATESYNC_`
    /// variables (the CLI's `STATESYNC_DAEMON`, the test hooks) are not the node's to judge.
    static func unknownEnvironmentProblem(_ environment: [String: String]) -> String? {
        let known = Key.allCases.map(\.environmentVariable)
        let prefixes = sections.map { "STATESYNC_" + $0.uppercased() + "_" }
        for name in environment.keys.sorted() where name.hasPrefix("STATESYNC_") && !known.contains(name) {
            let near = suggestion(for: name, among: known)
            guard prefixes.contains(where: { name.hasPrefix($0) }) || !near.isEmpty else { continue }
            return "environment variable \(name): not a configuration key\(near)"
        }
        return nil
    }

    /// YAML merge keys are not read (the values they would bring would be ignored): refused.
    private static func mergeKeyProblem(_ path: String, _ place: String) -> String {
        "\(path): a merge key (<<) in \(place): merged values are not read; write the keys out (anchors may stay in a top-level x- field)"
    }

    private static func firstKey(of section: String) -> String {
        let first = Key.allCases.first { $0.rawValue.hasPrefix(section + ".") }?.rawValue ?? section + ".key"
        return String(first.dropFirst(section.count + 1))
    }

    /// " (did you mean 'X'?)" for the candidate within two edits of `name`, else "". A key is
    /// also matched without its unit (`network.hearbeat` → `network.heartbeat_ms`).
    static func suggestion(for name: String, among candidates: [String]) -> String {
        let scored = candidates.map { candidate in
            (candidate, min(editDistance(name, candidate), editDistance(name, withoutUnit(candidate))))
        }.filter { $0.1 <= 2 }
        guard let best = scored.min(by: { $0.1 < $1.1 }) else { return "" }
        return " (did you mean '\(best.0)'?)"
    }

    /// A dotted key without the last word of its name (`network.heartbeat_ms` →
    /// `network.heartbeat`); anything else as it is (a variable's name has no unit apart).
    private static func withoutUnit(_ key: String) -> String {
        guard let dot = key.lastIndex(of: "."), let underscore = key.lastIndex(of: "_"), underscore > dot else {
            return key
        }
        return String(key[..<underscore])
    }

    /// Levenshtein distance over characters.
    static func editDistance(_ a: String, _ b: String) -> Int {
        let (a, b) = (Array(a), Array(b))
        guard !a.isEmpty else { return b.count }
        guard !b.isEmpty else { return a.count }
        var previous = Array(0...b.count)
        var current = [Int](repeating: 0, count: b.count + 1)
        for i in 1...a.count {
            current[0] = i
            for j in 1...b.count {
                current[j] = min(
                    previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1))
            }
            swap(&previous, &current)
        }
        return previous[b.count]
    }
}
