import SwiftCompilerPlugin
import SwiftDiagnostics
public import SwiftSyntax
import SwiftSyntaxBuilder
public import SwiftSyntaxMacros

/// `@Replicated`: validates the class, marks its stored `var`s `@_ReplicatedTracked`, adds the
/// registrar and the schema, and conforms the class to `ReplicatedModel` (hence `Observable`).
///
/// All semantics live in `StateSync.ModelRegistrar`; this only wires syntax to it.
public struct ReplicatedMacro: MemberMacro, MemberAttributeMacro, ExtensionMacro {
    // MARK: MemberMacro

    public static func expansion(
        of node: AttributeSyntax,
        providingMembersOf declaration: some DeclGroupSyntax,
        conformingTo protocols: [TypeSyntax],
        in context: some MacroExpansionContext
    ) throws -> [DeclSyntax] {
        guard let classDecl = validatedClass(declaration, attribute: node, in: context) else { return [] }
        let typeName = classDecl.name.trimmed.text
        let access = accessLevel(of: classDecl)
        let properties = TrackedProperty.all(in: classDecl, diagnosingIn: context)

        var members: [DeclSyntax] = [
            "\(raw: access)let _$registrar = StateSync.ModelRegistrar()"
        ]
        for property in properties {
            members.append(
                """
                \(raw: access)static let _$\(raw: property.name) = StateSync.ReplicatedProperty(\
                "\(raw: property.name)", \\\(raw: typeName).\(raw: property.name), \
                get: { $0._\(raw: property.name) }, set: { $0._\(raw: property.name) = $1 })
                """
            )
        }
        let list = properties.map { "\(typeName)._$\($0.name)" }.joined(separator: ", ")
        members.append(
            "\(raw: access)static let _$schema = StateSync.ModelSchema<\(raw: typeName)>([\(raw: list)])"
        )
        // The class is declared Sendable: its `let`s and `@Local var`s must hold Sendable values
        // (tracked properties are checked by ReplicatedProperty). Types written out are checked
        // here; an inferred type is the compiler's to check wherever the value is shared.
        let untracked = TrackedProperty.untrackedTypes(in: classDecl)
        if !untracked.isEmpty {
            let checks = untracked.map { "requireSendable((\($0)).self)" }.joined(separator: "; ")
            members.append(
                "private static func _$requireSendableStorage() { func requireSendable<T: Sendable>(_: T.Type) {}; \(raw: checks) }"
            )
        }
        return members
    }

    // MARK: MemberAttributeMacro

    public static func expansion(
        of node: AttributeSyntax,
        attachedTo declaration: some DeclGroupSyntax,
        providingAttributesFor member: some DeclSyntaxProtocol,
        in context: some MacroExpansionContext
    ) throws -> [AttributeSyntax] {
        guard let classDecl = declaration.as(ClassDeclSyntax.self), isFinal(classDecl) else { return [] }
        guard let variable = member.as(VariableDeclSyntax.self), TrackedProperty.isTracked(variable) else {
            return []
        }
        return ["@StateSync._ReplicatedTracked"]
    }

    // MARK: ExtensionMacro

    public static func expansion(
        of node: AttributeSyntax,
        attachedTo declaration: some DeclGroupSyntax,
        providingExtensionsOf type: some TypeSyntaxProtocol,
        conformingTo protocols: [TypeSyntax],
        in context: some MacroExpansionContext
    ) throws -> [ExtensionDeclSyntax] {
        guard let classDecl = declaration.as(ClassDeclSyntax.self), isFinal(classDecl) else { return [] }
        let observable: DeclSyntax = "extension \(type.trimmed): Observation.Observable {}"
        let model: DeclSyntax = "extension \(type.trimmed): StateSync.ReplicatedModel {}"
        let sendable: DeclSyntax = """
            // Safe: every mutable stored property of a @Replicated class is a macro-generated backing
            // store read and written only under its ModelRegistrar's lock.
            extension \(type.trimmed): @unchecked Sendable {}
            """
        return [observable, model, sendable].compactMap { $0.as(ExtensionDeclSyntax.self) }
    }

    // MARK: Validation

    static func isFinal(_ classDecl: ClassDeclSyntax) -> Bool {
        classDecl.modifiers.contains { $0.name.tokenKind == .keyword(.final) }
    }

    static func validatedClass(
        _ declaration: some DeclGroupSyntax, attribute: AttributeSyntax, in context: some MacroExpansionContext
    ) -> ClassDeclSyntax? {
        let kind: String
        if declaration.is(StructDeclSyntax.self) {
            kind = "a struct"
        } else if declaration.is(EnumDeclSyntax.self) {
            kind = "an enum"
        } else if declaration.is(ActorDeclSyntax.self) {
            kind = "an actor"
        } else if declaration.is(ProtocolDeclSyntax.self) {
            kind = "a protocol"
        } else if declaration.is(ExtensionDeclSyntax.self) {
            kind = "an extension"
        } else if let classDecl = declaration.as(ClassDeclSyntax.self) {
            if isFinal(classDecl) { return classDecl }
            context.diagnose(
                Diagnostic(
                    node: classDecl.name,
                    message: ReplicatedDiagnostic.notFinal(classDecl.name.text),
                    fixIt: FixIt(
                        message: ReplicatedFixIt.addFinal,
                        changes: [
                            .replace(
                                oldNode: Syntax(classDecl.classKeyword),
                                newNode: Syntax(
                                    TokenSyntax.keyword(.class, leadingTrivia: [.spaces(0)]).with(
                                        \.leadingTrivia, "final "))
                            )
                        ])))
            return nil
        } else {
            kind = "this declaration"
        }
        context.diagnose(Diagnostic(node: attribute, message: ReplicatedDiagnostic.notAClass(kind)))
        return nil
    }

    static func accessLevel(of classDecl: ClassDeclSyntax) -> String {
        for modifier in classDecl.modifiers {
            switch modifier.name.tokenKind {
            case .keyword(.public), .keyword(.open): return "public "
            case .keyword(.package): return "package "
            default: continue
            }
        }
        return ""
    }
}

/// A stored `var` of a `@Replicated` class that becomes a tracked property.
struct TrackedProperty {
    let name: String
    let variable: VariableDeclSyntax

    /// Whether `variable` is a stored instance `var` the macro tracks (not `let`, `static`,
    /// computed, `@Local` or already expanded).
    static func isTracked(_ variable: VariableDeclSyntax) -> Bool {
        guard variable.bindingSpecifier.tokenKind == .keyword(.var) else { return false }
        if variable.modifiers.contains(where: {
            [.keyword(.static), .keyword(.class), .keyword(.lazy)].contains($0.name.tokenKind)
        }) {
            return false
        }
        if hasAttribute(variable, named: ["Local", "_ReplicatedTracked", "ObservationIgnored"]) { return false }
        guard variable.bindings.count == 1, let binding = variable.bindings.first else { return false }
        guard binding.pattern.is(IdentifierPatternSyntax.self) else { return false }
        // Properties the member macro diagnoses get no accessors: one clear error, not a cascade.
        if let type = binding.typeAnnotation?.type, nonCodableReason(type) != nil { return false }
        if let accessors = binding.accessorBlock {
            // A computed property (get-only or get/set) is not storage; observers (willSet/didSet)
            // are not allowed on tracked properties and are diagnosed.
            if case .getter = accessors.accessors { return false }
            if case .accessors(let list) = accessors.accessors, !list.isEmpty {
                return false  // computed (get/set) or observed (willSet/didSet, diagnosed)
            }
        }
        return true
    }

    /// The written-out types of stored `let`s and `@Local var`s (instance members).
    static func untrackedTypes(in classDecl: ClassDeclSyntax) -> [String] {
        classDecl.memberBlock.members.compactMap { member -> String? in
            guard let variable = member.decl.as(VariableDeclSyntax.self), variable.bindings.count == 1,
                let binding = variable.bindings.first,
                binding.accessorBlock == nil || hasAttribute(variable, named: ["Local"]),
                let type = binding.typeAnnotation?.type,
                !variable.modifiers.contains(where: {
                    [.keyword(.static), .keyword(.class)].contains($0.name.tokenKind)
                })
            else { return nil }
            let isLet = variable.bindingSpecifier.tokenKind == .keyword(.let)
            return isLet || hasAttribute(variable, named: ["Local"]) ? type.trimmedDescription : nil
        }
    }

    static func hasAttribute(_ variable: VariableDeclSyntax, named names: Set<String>) -> Bool {
        variable.attributes.contains { element in
            guard case .attribute(let attribute) = element else { return false }
            let name = attribute.attributeName.trimmedDescription
            return names.contains(name) || names.contains(where: { name.hasSuffix(".\($0)") })
        }
    }

    /// The tracked properties of `classDecl`, diagnosing the ones the macro cannot support.
    static func all(in classDecl: ClassDeclSyntax, diagnosingIn context: some MacroExpansionContext)
        -> [TrackedProperty]
    {
        var result: [TrackedProperty] = []
        for member in classDecl.memberBlock.members {
            guard let variable = member.decl.as(VariableDeclSyntax.self) else { continue }
            diagnoseUnsupported(variable, in: context)
            let isStatic = variable.modifiers.contains {
                [.keyword(.static), .keyword(.class)].contains($0.name.tokenKind)
            }
            guard variable.bindingSpecifier.tokenKind == .keyword(.var), !isStatic,
                !hasAttribute(variable, named: ["Local", "ObservationIgnored"]),
                variable.bindings.count == 1, let binding = variable.bindings.first,
                let identifier = binding.pattern.as(IdentifierPatternSyntax.self)
            else { continue }
            if let type = binding.typeAnnotation?.type, let reason = nonCodableReason(type) {
                context.diagnose(
                    Diagnostic(
                        node: type,
                        message: ReplicatedDiagnostic.notCodable(
                            identifier.identifier.text, type.trimmedDescription, reason)))
                continue
            }
            if let accessors = binding.accessorBlock, case .accessors(let list) = accessors.accessors,
                let observer = list.first(where: {
                    [.keyword(.willSet), .keyword(.didSet)].contains($0.accessorSpecifier.tokenKind)
                })
            {
                context.diagnose(
                    Diagnostic(
                        node: observer, message: ReplicatedDiagnostic.propertyObserver(identifier.identifier.text)))
                continue
            }
            guard isTracked(variable) else { continue }
            result.append(TrackedProperty(name: identifier.identifier.text, variable: variable))
        }
        return result
    }

    static func diagnoseUnsupported(_ variable: VariableDeclSyntax, in context: some MacroExpansionContext) {
        let isStatic = variable.modifiers.contains {
            [.keyword(.static), .keyword(.class)].contains($0.name.tokenKind)
        }
        guard variable.bindingSpecifier.tokenKind == .keyword(.var), !isStatic else { return }
        if hasAttribute(variable, named: ["Local"]) { return }
        if variable.bindings.count > 1 {
            context.diagnose(Diagnostic(node: variable, message: ReplicatedDiagnostic.multipleBindings))
            return
        }
        if variable.modifiers.contains(where: { $0.name.tokenKind == .keyword(.lazy) }) {
            context.diagnose(Diagnostic(node: variable, message: ReplicatedDiagnostic.lazy))
            return
        }
        guard let binding = variable.bindings.first, let accessors = binding.accessorBlock,
            case .accessors(let list) = accessors.accessors,
            let setter = list.first(where: { $0.accessorSpecifier.tokenKind == .keyword(.set) })
        else { return }
        let name = binding.pattern.trimmedDescription
        context.diagnose(Diagnostic(node: setter, message: ReplicatedDiagnostic.computedSetter(name)))
    }

    /// Why `type` cannot be `Codable & Sendable`, when that is visible from syntax alone.
    /// Other types are checked by the compiler through `ReplicatedProperty`'s constraints.
    static func nonCodableReason(_ type: TypeSyntax) -> String? {
        if type.is(FunctionTypeSyntax.self) { return "a function type is neither Codable nor Sendable" }
        if let attributed = type.as(AttributedTypeSyntax.self), attributed.baseType.is(FunctionTypeSyntax.self) {
            return "a function type is neither Codable nor Sendable"
        }
        if type.is(TupleTypeSyntax.self), type.as(TupleTypeSyntax.self)!.elements.count > 1 {
            return "tuples are not Codable; use a Codable struct"
        }
        let text = type.trimmedDescription
        if ["Any", "AnyObject", "any Any"].contains(text) { return "'\(text)' is not Codable" }
        if type.is(SomeOrAnyTypeSyntax.self) { return "an existential is not Codable; use a concrete type" }
        if type.is(MetatypeTypeSyntax.self) { return "a metatype is not Codable" }
        return nil
    }
}

@main
struct StateSyncMacrosPlugin: CompilerPlugin {
    let providingMacros: [any Macro.Type] = [
        ReplicatedMacro.self,
        ReplicatedTrackedMacro.self,
        LocalMacro.self,
    ]
}
