public import SwiftSyntax
public import SwiftSyntaxMacros

/// `@_ReplicatedTracked` (added by `@Replicated`): turns a stored `var` into accessors over a
/// private backing store, routed through the model's `ModelRegistrar`.
public struct ReplicatedTrackedMacro: AccessorMacro, PeerMacro {
    public static func expansion(
        of node: AttributeSyntax,
        providingAccessorsOf declaration: some DeclSyntaxProtocol,
        in context: some MacroExpansionContext
    ) throws -> [AccessorDeclSyntax] {
        guard let name = BackingStore.propertyName(of: declaration) else { return [] }
        return [
            """
            @storageRestrictions(initializes: _\(raw: name))
            init(initialValue) {
                _\(raw: name) = initialValue
            }
            """,
            """
            get {
                _$registrar.read(self, Self._$\(raw: name))
            }
            """,
            """
            set {
                _$registrar.write(self, Self._$\(raw: name), newValue)
            }
            """,
        ]
    }

    public static func expansion(
        of node: AttributeSyntax,
        providingPeersOf declaration: some DeclSyntaxProtocol,
        in context: some MacroExpansionContext
    ) throws -> [DeclSyntax] {
        BackingStore.peer(of: declaration).map { [$0] } ?? []
    }
}

/// `@_ReplicatedTrackedGeneric(index)` (added by `@Replicated` in a generic class, which cannot
/// have the static stored property per property that `@_ReplicatedTracked` refers to): the same
/// accessors, reaching the property through the cached schema by its index.
public struct ReplicatedTrackedGenericMacro: AccessorMacro, PeerMacro {
    public static func expansion(
        of node: AttributeSyntax,
        providingAccessorsOf declaration: some DeclSyntaxProtocol,
        in context: some MacroExpansionContext
    ) throws -> [AccessorDeclSyntax] {
        guard let name = BackingStore.propertyName(of: declaration),
            case .argumentList(let arguments) = node.arguments,
            let index = arguments.first?.expression.trimmedDescription
        else { return [] }
        return [
            """
            @storageRestrictions(initializes: _\(raw: name))
            init(initialValue) {
                _\(raw: name) = initialValue
            }
            """,
            """
            get {
                _$registrar.read(self, Self._$schema.property(at: \(raw: index)))
            }
            """,
            """
            set {
                _$registrar.write(self, Self._$schema.property(at: \(raw: index)), newValue)
            }
            """,
        ]
    }

    public static func expansion(
        of node: AttributeSyntax,
        providingPeersOf declaration: some DeclSyntaxProtocol,
        in context: some MacroExpansionContext
    ) throws -> [DeclSyntax] {
        BackingStore.peer(of: declaration).map { [$0] } ?? []
    }
}

/// `@Local`: a `var` of a `@Replicated` class kept out of tracking and replication, but still
/// guarded by the model's lock so the class stays safe to share between threads.
public struct LocalMacro: AccessorMacro, PeerMacro {
    public static func expansion(
        of node: AttributeSyntax,
        providingAccessorsOf declaration: some DeclSyntaxProtocol,
        in context: some MacroExpansionContext
    ) throws -> [AccessorDeclSyntax] {
        guard let name = BackingStore.propertyName(of: declaration) else {
            throw MacroExpansionErrorMessage("@Local applies to a stored 'var' of a @Replicated class")
        }
        return [
            """
            @storageRestrictions(initializes: _\(raw: name))
            init(initialValue) {
                _\(raw: name) = initialValue
            }
            """,
            """
            get {
                _$registrar.readLocal(self) { $0._\(raw: name) }
            }
            """,
            """
            set {
                _$registrar.writeLocal(self) { $0._\(raw: name) = newValue }
            }
            """,
        ]
    }

    public static func expansion(
        of node: AttributeSyntax,
        providingPeersOf declaration: some DeclSyntaxProtocol,
        in context: some MacroExpansionContext
    ) throws -> [DeclSyntax] {
        BackingStore.peer(of: declaration).map { [$0] } ?? []
    }
}

enum BackingStore {
    static func propertyName(of declaration: some DeclSyntaxProtocol) -> String? {
        guard let variable = declaration.as(VariableDeclSyntax.self),
            variable.bindingSpecifier.tokenKind == .keyword(.var),
            variable.bindings.count == 1,
            let identifier = variable.bindings.first?.pattern.as(IdentifierPatternSyntax.self)
        else { return nil }
        if let accessors = variable.bindings.first?.accessorBlock, case .getter = accessors.accessors { return nil }
        return identifier.identifier.trimmed.text
    }

    /// `nonisolated(unsafe) private var _name: Type = initial`, the storage the accessors read
    /// and write.
    ///
    /// `nonisolated(unsafe)`: safe because only the accessors touch it, and they go through the
    /// model's `ModelRegistrar`, which holds the model's lock for every read and write (or runs
    /// on the thread that holds it, inside a transaction). The storage of a model `init` sets
    /// before the model is shared needs no lock. This is what lets the class be `Sendable`
    /// with the compiler still checking its `let`s.
    static func peer(of declaration: some DeclSyntaxProtocol) -> DeclSyntax? {
        guard let name = propertyName(of: declaration),
            let binding = declaration.as(VariableDeclSyntax.self)?.bindings.first
        else { return nil }
        let type = binding.typeAnnotation.map { ": \($0.type.trimmedDescription)" } ?? ""
        let initializer = binding.initializer.map { " = \($0.value.trimmedDescription)" } ?? ""
        return "nonisolated(unsafe) private var _\(raw: name)\(raw: type)\(raw: initializer)"
    }
}
