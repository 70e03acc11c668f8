import SwiftSyntax
import SwiftSyntaxMacroExpansion
import SwiftSyntaxMacros
import SwiftSyntaxMacrosGenericTestSupport
import Testing

@testable import StateSyncMacros

/// Expansion and diagnostics of `@Replicated`, checked without compiling the result.
@Suite("@Replicated macro")
struct ReplicatedMacroTests {
    /// The conformances the compiler asks the macro for: those the class does not declare.
    static func macros(missing conformances: [TypeSyntax] = ["ReplicatedModel", "Observable", "Sendable"])
        -> [String: MacroSpec]
    {
        [
            "Replicated": MacroSpec(type: ReplicatedMacro.self, conformances: conformances),
            "Local": MacroSpec(type: LocalMacro.self),
        ]
    }
    static let macros = macros()

    func expand(
        _ source: String, _ expanded: String, diagnostics: [DiagnosticSpec] = [],
        missing conformances: [TypeSyntax] = ["ReplicatedModel", "Observable", "Sendable"],
        sourceLocation: Testing.SourceLocation = #_sourceLocation
    ) {
        assertMacroExpansion(
            source, expandedSource: expanded, diagnostics: diagnostics,
            macroSpecs: Self.macros(missing: conformances),
            indentationWidth: .spaces(4),
            failureHandler: { failure in
                Issue.record(Comment(rawValue: failure.message), sourceLocation: sourceLocation)
            })
    }

    func diagnostics(of source: String, sourceLocation: Testing.SourceLocation = #_sourceLocation) -> [String] {
        var messages: [String] = []
        assertMacroExpansion(
            source, expandedSource: "", macroSpecs: Self.macros,
            failureHandler: { failure in messages.append(failure.message) })
        return messages
    }

    @Test func expandsAFinalClass() {
        expand(
            """
            @Replicated
            final class Counter {
                var count = 0
                let id = "x"
                @Local var scratch: Int = 0
            }
            """,
            """
            final class Counter {
                @StateSync._ReplicatedTracked
                var count = 0
                let id = "x"
                var scratch: Int {
                    @storageRestrictions(initializes: _scratch)
                    init(initialValue) {
                        _scratch = initialValue
                    }
                    get {
                        _$registrar.readLocal(self) {
                            $0._scratch
                        }
                    }
                    set {
                        _$registrar.writeLocal(self) {
                            $0._scratch = newValue
                        }
                    }
                }

                nonisolated(unsafe) private var _scratch: Int = 0

                let _$registrar = StateSync.ModelRegistrar()

                static let _$count = StateSync.ReplicatedProperty("count", index: 0, \\Counter.count, get: {
                        $0._count
                    }, set: {
                        $0._count = $1
                    })

                static let _$schema = StateSync.ModelSchema<Counter>([Counter._$count])

                private static func _$requireSendableStorage() {
                    func requireSendable<T: Sendable>(_: T.Type) {
                    };
                    requireSendable((Int).self)
                }
            }

            extension Counter: Observation.Observable {
            }

            extension Counter: StateSync.ReplicatedModel {
            }

            extension Counter: Sendable {
            }
            """)
    }

    @Test func trackedPropertyExpandsToRegistrarAccessors() {
        let specs: [String: MacroSpec] = ["_ReplicatedTracked": MacroSpec(type: ReplicatedTrackedMacro.self)]
        assertMacroExpansion(
            """
            final class C {
                @_ReplicatedTracked
                var count: Int = 0
            }
            """,
            expandedSource: """
                final class C {
                    var count: Int {
                        @storageRestrictions(initializes: _count)
                        init(initialValue) {
                            _count = initialValue
                        }
                        get {
                            _$registrar.read(self, Self._$count)
                        }
                        set {
                            _$registrar.write(self, Self._$count, newValue)
                        }
                    }

                    nonisolated(unsafe) private var _count: Int = 0
                }
                """, macroSpecs: specs, indentationWidth: .spaces(4),
            failureHandler: { Issue.record(Comment(rawValue: $0.message)) })
    }

    @Test(arguments: [
        (
            "@Replicated struct S { var x = 0 }",
            "@Replicated cannot be applied to a struct; apply it to a 'final class'"
        ),
        ("@Replicated enum E { case a }", "@Replicated cannot be applied to an enum; apply it to a 'final class'"),
        ("@Replicated actor A { var x = 0 }", "@Replicated cannot be applied to an actor; apply it to a 'final class'"),
        (
            "@Replicated class C { var x = 0 }",
            "@Replicated class 'C' must be 'final' (subclasses would bypass its tracked storage)"
        ),
        (
            "@Replicated final class C { var x: Int { get { 0 } set { } } }",
            "@Replicated cannot replicate computed property 'x' with a setter; make it stored, or get-only"
        ),
        (
            "@Replicated final class C { var f: () -> Void = {} }",
            "property 'f' of type '() -> Void' cannot be replicated: a function type is neither Codable nor Sendable; tracked properties must be Codable & Sendable (or mark it @Local)"
        ),
        (
            "@Replicated final class C { var a: Any = 1 }",
            "property 'a' of type 'Any' cannot be replicated: 'Any' is not Codable; tracked properties must be Codable & Sendable (or mark it @Local)"
        ),
        (
            "@Replicated final class C { var p: (Int, Int) = (1, 2) }",
            "property 'p' of type '(Int, Int)' cannot be replicated: tuples are not Codable; use a Codable struct; tracked properties must be Codable & Sendable (or mark it @Local)"
        ),
        (
            "@Replicated final class C { var a = 0 { didSet { } } }",
            "tracked property 'a' cannot have willSet/didSet; use observe(\\.a) instead"
        ),
        (
            "@Replicated final class C { var a = 1, b = 2 }",
            "@Replicated needs one property per 'var' declaration; split this declaration"
        ),
        (
            "@Replicated final class C { lazy var a = 1 }",
            "@Replicated cannot track a 'lazy var'; make it a plain stored 'var' or mark it @Local"
        ),
    ])
    func misuseIsAClearCompileTimeError(source: String, message: String) {
        let reported = diagnostics(of: source)
        #expect(reported.contains { $0.contains(message) }, "got: \(reported)")
    }

    @Test func diagnosticsPointAtTheOffendingDeclaration() {
        expand(
            """
            @Replicated
            final class C {
                var bad: () -> Void = {}
            }
            """,
            """
            final class C {
                var bad: () -> Void = {}

                let _$registrar = StateSync.ModelRegistrar()

                static let _$schema = StateSync.ModelSchema<C>([])
            }

            extension C: Observation.Observable {
            }

            extension C: StateSync.ReplicatedModel {
            }

            extension C: @unchecked Sendable {
            }
            """,
            diagnostics: [
                DiagnosticSpec(
                    message:
                        "property 'bad' of type '() -> Void' cannot be replicated: a function type is neither Codable nor Sendable; tracked properties must be Codable & Sendable (or mark it @Local)",
                    line: 3, column: 14)
            ])
    }

    /// A generic class has no static stored properties: the schema is a computed property over a
    /// cache, and accessors reach their property by index.
    @Test func expandsAGenericClass() {
        expand(
            """
            @Replicated
            public final class Box<T: Codable & Sendable> {
                public var value: T? = nil
            }
            """,
            """
            public final class Box<T: Codable & Sendable> {
                @StateSync._ReplicatedTrackedGeneric(0)
                public var value: T? = nil

                public let _$registrar = StateSync.ModelRegistrar()

                public static var _$schema: StateSync.ModelSchema<Box<T>> {
                    StateSync.ModelSchema<Box<T>>.shared {
                        [StateSync.ReplicatedProperty("value", index: 0, \\Box<T>.value, get: {
                                    $0._value
                                }, set: {
                                    $0._value = $1
                                })]
                    }
                }
            }

            extension Box: Observation.Observable {
            }

            extension Box: StateSync.ReplicatedModel {
            }

            extension Box: Sendable {
            }
            """)
    }

    @Test func trackedPropertyOfAGenericClassReachesItsPropertyByIndex() {
        let specs: [String: MacroSpec] = [
            "_ReplicatedTrackedGeneric": MacroSpec(type: ReplicatedTrackedGenericMacro.self)
        ]
        assertMacroExpansion(
            """
            final class C<T> {
                @_ReplicatedTrackedGeneric(1)
                var value: T? = nil
            }
            """,
            expandedSource: """
                final class C<T> {
                    var value: T? {
                        @storageRestrictions(initializes: _value)
                        init(initialValue) {
                            _value = initialValue
                        }
                        get {
                            _$registrar.read(self, Self._$schema.property(at: 1))
                        }
                        set {
                            _$registrar.write(self, Self._$schema.property(at: 1), newValue)
                        }
                    }

                    nonisolated(unsafe) private var _value: T? = nil
                }
                """, macroSpecs: specs, indentationWidth: .spaces(4),
            failureHandler: { Issue.record(Comment(rawValue: $0.message)) })
    }

    /// Conformances the class already declares (`Observable`, `Sendable`) are not added again.
    @Test func handWrittenConformancesAreNotRepeated() {
        expand(
            """
            @Replicated
            final class C: Observable, Sendable {
            }
            """,
            """
            final class C: Observable, Sendable {

                let _$registrar = StateSync.ModelRegistrar()

                static let _$schema = StateSync.ModelSchema<C>([])
            }

            extension C: StateSync.ReplicatedModel {
            }
            """, missing: ["ReplicatedModel"])
    }

    /// A class that declares `Codable` gets the members the compiler cannot synthesise.
    @Test func aCodableClassGetsItsCodingMembers() {
        expand(
            """
            @Replicated
            final class C: Codable {
                var count = 0
            }
            """,
            """
            final class C: Codable {
                @StateSync._ReplicatedTracked
                var count = 0

                let _$registrar = StateSync.ModelRegistrar()

                static let _$count = StateSync.ReplicatedProperty("count", index: 0, \\C.count, get: {
                        $0._count
                    }, set: {
                        $0._count = $1
                    })

                static let _$schema = StateSync.ModelSchema<C>([C._$count])

                enum CodingKeys: String, CodingKey {
                    case count
                }

                func encode(to encoder: any Encoder) throws {
                    try _$registrar.consistentRead(self) { (model) throws in
                        var container = encoder.container(keyedBy: CodingKeys.self)
                        try container.encode(model._count, forKey: .count)
                    }
                }

                convenience init(from decoder: any Decoder) throws {
                    self.init()
                    let container = try decoder.container(keyedBy: CodingKeys.self)
                    if container.contains(.count) {
                        _count = try container.decode(Swift.type(of: _count), forKey: .count)
                    }
                }
            }

            extension C: Observation.Observable {
            }

            extension C: StateSync.ReplicatedModel {
            }

            extension C: Sendable {
            }
            """)
    }

    @Test func observationIgnoredIsRefusedWithAFixItToLocal() {
        expand(
            """
            @Replicated
            final class C {
                @ObservationIgnored var cache = 0
            }
            """,
            """
            final class C {
                @ObservationIgnored var cache = 0

                let _$registrar = StateSync.ModelRegistrar()

                static let _$schema = StateSync.ModelSchema<C>([])
            }

            extension C: Observation.Observable {
            }

            extension C: StateSync.ReplicatedModel {
            }

            extension C: @unchecked Sendable {
            }
            """,
            diagnostics: [
                DiagnosticSpec(
                    message:
                        "@ObservationIgnored leaves 'cache' unguarded in a model shared between threads; mark it @Local instead (not tracked, not replicated, guarded by the model's lock)",
                    line: 3, column: 5, fixIts: [FixItSpec(message: "use '@Local'")])
            ])
    }
}
