import SwiftCompilerPlugin
import SwiftDiagnostics
public import SwiftSyntax
import SwiftSyntaxBuilder
public import SwiftSyntaxMacros

/// `@Replicated`: validates the class, marks its stored `var`s `@_ReplicatedTracked`, adds the
/// registrar and the schema (and `Codable` members when the class declares that conformance), and
/// conforms the class to `ReplicatedModel`, `Observable` and `Sendable` where it does not already.
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
        let model = ModelDeclaration(classDecl)
        let access = model.access
        for problem in model.problems { context.diagnose(problem) }

        var members: [DeclSyntax] = ["\(raw: access)let _$registrar = StateSync.ModelRegistrar()"]
        let properties = model.tracked.enumerated().map { index, property in
            """
            StateSync.ReplicatedProperty("\(property.name)", index: \(index), \\\(model.typeName).\(property.name), \
            get: { $0._\(property.name) }, set: { $0._\(property.name) = $1 })
            """
        }
        if model.isGeneric {
            // Generic types have no static stored properties: the schema is built once per
            // specialisation and cached by the library.
            members.append(
                """
                \(raw: access)static var _$schema: StateSync.ModelSchema<\(raw: model.typeName)> {
                    StateSync.ModelSchema<\(raw: model.typeName)>.shared { [\(raw: properties.joined(separator: ", "))] }
                }
                """)
        } else {
            for (property, made) in zip(model.tracked, properties) {
                members.append("\(raw: access)static let _$\(raw: property.name) = \(raw: made)")
            }
            let list = model.tracked.map { "\(model.typeName)._$\($0.name)" }.joined(separator: ", ")
            members.append(
                "\(raw: access)static let _$schema = StateSync.ModelSchema<\(raw: model.typeName)>([\(raw: list)])")
        }
        // `@Local` storage is exempt from the compiler's Sendable checking (it is guarded by the
        // model's lock), so its values must be checked here: written-out types are; an inferred
        // type is the compiler's to check wherever the value is shared.
        let localTypes = model.localTypes
        if !localTypes.isEmpty {
            let checks = localTypes.map { "requireSendable((\($0)).self)" }.joined(separator: "; ")
            members.append(
                "private static func _$requireSendableStorage() { func requireSendable<T: Sendable>(_: T.Type) {}; \(raw: checks) }"
            )
        }
        members += CodableMembers.make(for: model)
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
        guard let variable = member.as(VariableDeclSyntax.self), TrackedProperty.isTracked(variable),
            let name = TrackedProperty.name(of: variable)
        else {
            return []
        }
        let model = ModelDeclaration(classDecl)
        guard model.isGeneric else { return ["@StateSync._ReplicatedTracked"] }
        guard let index = model.tracked.firstIndex(where: { $0.name == name }) else { return [] }
        return ["@StateSync._ReplicatedTrackedGeneric(\(raw: index))"]
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
        // Only what the class does not conform to already: a hand-written `: Observable` or
        // `: Sendable` is accepted as it is.
        let missing = Set(protocols.map { $0.trimmedDescription.split(separator: ".").last.map(String.init) ?? "" })
        var extensions: [DeclSyntax] = []
        if missing.contains("Observable") {
            extensions.append("extension \(type.trimmed): Observation.Observable {}")
        }
        if missing.contains("ReplicatedModel") {
            extensions.append("extension \(type.trimmed): StateSync.ReplicatedModel {}")
        }
        if missing.contains("Sendable") {
            if ModelDeclaration(classDecl).problems.isEmpty {
                // Checked by the compiler: tracked and @Local storage is `nonisolated(unsafe)` (the
                // registrar's lock guards it), so what it checks are the `let`s.
                extensions.append("extension \(type.trimmed): Sendable {}")
            } else {
                // The declaration has errors the member macro reports; a stored property it could
                // not take over would add a second, confusing error here.
                extensions.append("extension \(type.trimmed): @unchecked Sendable {}")
            }
        }
        return extensions.compactMap { $0.as(ExtensionDeclSyntax.self) }
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
}

/// What the macro reads from a `@Replicated` class: its name (with generic parameters), access
/// level, tracked and `@Local` properties, the conformances it declares, and what is wrong with it.
struct ModelDeclaration {
    let classDecl: ClassDeclSyntax
    /// `Counter`, or `Box<T>` for a generic class.
    let typeName: String
    let isGeneric: Bool
    /// `public `, `package ` or empty.
    let access: String
    let tracked: [TrackedProperty]
    let problems: [Diagnostic]

    init(_ classDecl: ClassDeclSyntax) {
        self.classDecl = classDecl
        let name = classDecl.name.trimmed.text
        if let generics = classDecl.genericParameterClause {
            isGeneric = true
            typeName = name + "<" + generics.parameters.map { $0.name.trimmed.text }.joined(separator: ", ") + ">"
        } else {
            isGeneric = false
            typeName = name
        }
        access = Self.accessLevel(of: classDecl)
        (tracked, problems) = TrackedProperty.all(in: classDecl)
    }

    /// The written-out types of `@Local var`s (instance members).
    var localTypes: [String] {
        classDecl.memberBlock.members.compactMap { member -> String? in
            guard let variable = member.decl.as(VariableDeclSyntax.self), variable.bindings.count == 1,
                TrackedProperty.hasAttribute(variable, named: ["Local"]),
                let type = variable.bindings.first?.typeAnnotation?.type
            else { return nil }
            return type.trimmedDescription
        }
    }

    /// The names of the `@Local var`s, whose storage `Codable` members also cover.
    var localNames: [String] {
        classDecl.memberBlock.members.compactMap { member -> String? in
            guard let variable = member.decl.as(VariableDeclSyntax.self),
                TrackedProperty.hasAttribute(variable, named: ["Local"])
            else { return nil }
            return TrackedProperty.name(of: variable)
        }
    }

    /// Whether the class declaration itself lists `name` (e.g. `Codable`) among its inherited types.
    func declares(_ names: Set<String>) -> Bool {
        classDecl.inheritanceClause?.inheritedTypes.contains { inherited in
            let text = inherited.type.trimmedDescription
            return names.contains(text) || names.contains(String(text.split(separator: ".").last ?? ""))
        } ?? false
    }

    /// Whether the class already has a member called `name` (a user-written `CodingKeys`,
    /// `encode(to:)`, `init(from:)`).
    func hasMember(named name: String) -> Bool {
        func signature(_ base: String, _ parameters: FunctionParameterListSyntax) -> String {
            base + "(" + parameters.map { $0.firstName.text + ":" }.joined() + ")"
        }
        return classDecl.memberBlock.members.contains { member in
            if let type = member.decl.as(EnumDeclSyntax.self) { return type.name.text == name }
            if let type = member.decl.as(StructDeclSyntax.self) { return type.name.text == name }
            if let function = member.decl.as(FunctionDeclSyntax.self) {
                return signature(function.name.text, function.signature.parameterClause.parameters) == name
            }
            if let initializer = member.decl.as(InitializerDeclSyntax.self) {
                return signature("init", initializer.signature.parameterClause.parameters) == name
            }
            return false
        }
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

/// `Codable` for a `@Replicated` class that declares it: the compiler cannot synthesise it (the
/// stored properties became accessors over macro-generated storage), so the macro writes what it
/// would have. Encoding reads every tracked and `@Local` property under the model's lock (one
/// consistent state); decoding makes a fresh standalone model with `init()` and sets the stored
/// values it finds (no versions, no notifications). `let`s keep what `init()` gives them.
enum CodableMembers {
    static func make(for model: ModelDeclaration) -> [DeclSyntax] {
        let encodable = model.declares(["Codable", "Encodable"])
        let decodable = model.declares(["Codable", "Decodable"])
        guard encodable || decodable else { return [] }
        let names = model.tracked.map(\.name) + model.localNames
        let access = model.access
        var members: [DeclSyntax] = []
        if !model.hasMember(named: "CodingKeys") {
            let cases = names.isEmpty ? "" : "case " + names.joined(separator: ", ")
            members.append("\(raw: access)enum CodingKeys: String, CodingKey { \(raw: cases) }")
        }
        if encodable && !model.hasMember(named: "encode(to:)") {
            let encodes = names.map { "try container.encode(model._\($0), forKey: .\($0))" }.joined(separator: "\n")
            members.append(
                """
                \(raw: access)func encode(to encoder: any Encoder) throws {
                    try _$registrar.consistentRead(self) { (model) throws in
                        var container = encoder.container(keyedBy: CodingKeys.self)
                        \(raw: encodes)
                    }
                }
                """)
        }
        if decodable && !model.hasMember(named: "init(from:)") {
            let decodes = names.map {
                "if container.contains(.\($0)) { _\($0) = try container.decode(Swift.type(of: _\($0)), forKey: .\($0)) }"
            }.joined(separator: "\n")
            members.append(
                """
                \(raw: access)convenience init(from decoder: any Decoder) throws {
                    self.init()
                    let container = try decoder.container(keyedBy: CodingKeys.self)
                    \(raw: decodes)
                }
                """)
        }
        return members
    }
}

/// A stored `var` of a `@Replicated` class that becomes a tracked property.
struct TrackedProperty {
    let name: String
    let variable: VariableDeclSyntax

    /// The identifier of a single-binding variable.
    static func name(of variable: VariableDeclSyntax) -> String? {
        guard variable.bindings.count == 1,
            let identifier = variable.bindings.first?.pattern.as(IdentifierPatternSyntax.self)
        else { return nil }
        return identifier.identifier.trimmed.text
    }

    /// Whether `variable` is a stored instance `var` the macro tracks (not `let`, `static`,
    /// computed, `@Local` or already expanded).
    static func isTracked(_ variable: VariableDeclSyntax) -> Bool {
        guard variable.bindingSpecifier.tokenKind == .keyword(.var) else { return false }
        if variable.modifiers.contains(where: {
            [.keyword(.static), .keyword(.class), .keyword(.lazy)].contains($0.name.tokenKind)
        }) {
            return false
        }
        if hasAttribute(
            variable, named: ["Local", "_ReplicatedTracked", "_ReplicatedTrackedGeneric", "ObservationIgnored"])
        {
            return false
        }
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

    static func hasAttribute(_ variable: VariableDeclSyntax, named names: Set<String>) -> Bool {
        attribute(of: variable, named: names) != nil
    }

    static func attribute(of variable: VariableDeclSyntax, named names: Set<String>) -> AttributeSyntax? {
        for element in variable.attributes {
            guard case .attribute(let attribute) = element else { continue }
            let name = attribute.attributeName.trimmedDescription
            if names.contains(name) || names.contains(where: { name.hasSuffix(".\($0)") }) { return attribute }
        }
        return nil
    }

    /// The tracked properties of `classDecl`, in declaration order, and the diagnostics of the
    /// declarations the macro cannot support.
    static func all(in classDecl: ClassDeclSyntax) -> (tracked: [TrackedProperty], problems: [Diagnostic]) {
        var result: [TrackedProperty] = []
        var problems: [Diagnostic] = []
        for member in classDecl.memberBlock.members {
            guard let variable = member.decl.as(VariableDeclSyntax.self) else { continue }
            if let problem = unsupported(variable) {
                problems.append(problem)
                continue
            }
            let isStatic = variable.modifiers.contains {
                [.keyword(.static), .keyword(.class)].contains($0.name.tokenKind)
            }
            guard variable.bindingSpecifier.tokenKind == .keyword(.var), !isStatic,
                !hasAttribute(variable, named: ["Local"]),
                variable.bindings.count == 1, let binding = variable.bindings.first,
                let identifier = binding.pattern.as(IdentifierPatternSyntax.self)
            else { continue }
            if let type = binding.typeAnnotation?.type, let reason = nonCodableReason(type) {
                problems.append(
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
                problems.append(
                    Diagnostic(
                        node: observer, message: ReplicatedDiagnostic.propertyObserver(identifier.identifier.text)))
                continue
            }
            guard isTracked(variable) else { continue }
            result.append(TrackedProperty(name: identifier.identifier.text, variable: variable))
        }
        return (result, problems)
    }

    /// The diagnostic of a `var` declaration the macro cannot take over, if it is one.
    static func unsupported(_ variable: VariableDeclSyntax) -> Diagnostic? {
        let isStatic = variable.modifiers.contains {
            [.keyword(.static), .keyword(.class)].contains($0.name.tokenKind)
        }
        guard variable.bindingSpecifier.tokenKind == .keyword(.var), !isStatic else { return nil }
        if hasAttribute(variable, named: ["Local"]) { return nil }
        if let ignored = attribute(of: variable, named: ["ObservationIgnored"]) {
            // Left alone, it would be plain unguarded storage in a class shared between threads.
            return Diagnostic(
                node: ignored, message: ReplicatedDiagnostic.observationIgnored(name(of: variable) ?? "this property"),
                fixIt: FixIt(
                    message: ReplicatedFixIt.useLocal,
                    changes: [
                        .replace(
                            oldNode: Syntax(ignored),
                            newNode: Syntax(
                                ignored.with(\.attributeName, TypeSyntax(IdentifierTypeSyntax(name: "Local")))))
                    ]))
        }
        if variable.bindings.count > 1 {
            return Diagnostic(node: variable, message: ReplicatedDiagnostic.multipleBindings)
        }
        if variable.modifiers.contains(where: { $0.name.tokenKind == .keyword(.lazy) }) {
            return Diagnostic(node: variable, message: ReplicatedDiagnostic.lazy)
        }
        guard let binding = variable.bindings.first, let accessors = binding.accessorBlock,
            case .accessors(let list) = accessors.accessors,
            let setter = list.first(where: { $0.accessorSpecifier.tokenKind == .keyword(.set) })
        else { return nil }
        let name = binding.pattern.trimmedDescription
        return Diagnostic(node: setter, message: ReplicatedDiagnostic.computedSetter(name))
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
        ReplicatedTrackedGenericMacro.self,
        LocalMacro.self,
    ]
}
