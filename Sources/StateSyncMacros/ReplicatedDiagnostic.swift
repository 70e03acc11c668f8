import SwiftDiagnostics

/// The compile-time errors of `@Replicated`, each saying what is wrong and what to do.
enum ReplicatedDiagnostic: DiagnosticMessage {
    case notAClass(String)
    case notFinal(String)
    case computedSetter(String)
    case notCodable(String, String, String)
    case multipleBindings
    case lazy
    case propertyObserver(String)
    case observationIgnored(String)

    var message: String {
        switch self {
        case .notAClass(let kind):
            "@Replicated cannot be applied to \(kind); apply it to a 'final class'"
        case .notFinal(let name):
            "@Replicated class '\(name)' must be 'final' (subclasses would bypass its tracked storage)"
        case .computedSetter(let name):
            "@Replicated cannot replicate computed property '\(name)' with a setter; make it stored, or get-only"
        case .notCodable(let name, let type, let reason):
            "property '\(name)' of type '\(type)' cannot be replicated: \(reason); tracked properties must be Codable & Sendable (or mark it @Local)"
        case .multipleBindings:
            "@Replicated needs one property per 'var' declaration; split this declaration"
        case .lazy:
            "@Replicated cannot track a 'lazy var'; make it a plain stored 'var' or mark it @Local"
        case .propertyObserver(let name):
            "tracked property '\(name)' cannot have willSet/didSet; use observe(\\.\(name)) instead"
        case .observationIgnored(let name):
            "@ObservationIgnored leaves '\(name)' unguarded in a model shared between threads; mark it @Local instead (not tracked, not replicated, guarded by the model's lock)"
        }
    }

    var diagnosticID: MessageID {
        MessageID(domain: "StateSyncMacros", id: "\(self)".prefix(while: { $0 != "(" }).description)
    }

    var severity: DiagnosticSeverity { .error }
}

enum ReplicatedFixIt: FixItMessage {
    case addFinal
    case useLocal

    var message: String {
        switch self {
        case .addFinal: "add 'final'"
        case .useLocal: "use '@Local'"
        }
    }

    var fixItID: MessageID { MessageID(domain: "StateSyncMacros", id: "\(self)") }
}
