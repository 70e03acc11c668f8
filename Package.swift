// swift-tools-version: 6.1
import CompilerPluginSupport
import PackageDescription

let strictSettings: [SwiftSetting] = [
    .swiftLanguageMode(.v6),
    .enableUpcomingFeature("ExistentialAny"),
    .enableUpcomingFeature("InternalImportsByDefault"),
]

let package = Package(
    name: "StateSync",
    platforms: [.macOS(.v15)],
    products: [
        .library(name: "StateSync", targets: ["StateSync"]),
        .library(name: "StateSyncZeroMQ", targets: ["StateSyncZeroMQ"]),
        .library(name: "StateSyncClient", targets: ["StateSyncClient"]),
        .library(name: "StateSyncTesting", targets: ["StateSyncTesting"]),
        .library(name: "StateSyncHTTP", targets: ["StateSyncHTTP"]),
        .library(name: "ZeroMQ", targets: ["ZeroMQ"]),
        .executable(name: "statesyncd", targets: ["statesyncd"]),
        .executable(name: "statesync", targets: ["statesync"]),
    ],
    dependencies: [
        .package(url: "https://github.com/swiftlang/swift-syntax", from: "603.0.1"),
        .package(url: "https://github.com/apple/swift-argument-parser", from: "1.8.2"),
        .package(url: "https://github.com/apple/swift-log", from: "1.16.2"),
        .package(url: "https://github.com/apple/swift-configuration", from: "1.4.0", traits: [.defaults, "YAML"]),
        // The YAML parser swift-configuration reads files with: named here to list a file's keys
        // (an unknown key is refused, not ignored).
        .package(url: "https://github.com/jpsim/Yams", from: "6.2.2"),
        .package(url: "https://github.com/swift-server/swift-service-lifecycle", from: "2.13.0"),
        .package(url: "https://github.com/apple/swift-metrics", from: "2.13.0"),
        .package(url: "https://github.com/swift-server/swift-prometheus", from: "2.4.1"),
        .package(url: "https://github.com/hummingbird-project/hummingbird", from: "2.28.1"),
        .package(url: "https://github.com/apple/swift-crypto", from: "4.5.2"),
    ],
    targets: [
        // The C library: a module map over <zmq.h>, nothing else.
        .systemLibrary(
            name: "CZeroMQ",
            providers: [.apt(["libzmq3-dev"])]
        ),
        // The thin, safe binding. The only module that imports CZeroMQ; knows nothing of deltas.
        .target(
            name: "ZeroMQ",
            dependencies: ["CZeroMQ"],
            swiftSettings: strictSettings
        ),
        // Child processes started with posix_spawn (the harness's daemons, the bench's nodes, the
        // tests' children): Foundation's Process.run() crashes intermittently on Linux.
        .target(name: "CProcessSpawn"),
        // CRC-32C with the processor's instruction (SSE 4.2), for the log's records.
        .target(name: "CChecksum"),
        .target(
            name: "ChildProcesses",
            dependencies: ["CProcessSpawn"],
            swiftSettings: strictSettings
        ),
        // The @Replicated macro: syntax in, calls into ModelRegistrar out.
        .macro(
            name: "StateSyncMacros",
            dependencies: [
                .product(name: "SwiftSyntaxMacros", package: "swift-syntax"),
                .product(name: "SwiftCompilerPlugin", package: "swift-syntax"),
                .product(name: "SwiftDiagnostics", package: "swift-syntax"),
            ],
            swiftSettings: strictSettings
        ),
        // The core: models, values, versions, deltas, replica store, wire codec, the node machine
        // and its host. No sockets, no threads of its own: a driver feeds it.
        .target(
            name: "StateSync",
            dependencies: [
                "StateSyncMacros",
                "CChecksum",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Configuration", package: "swift-configuration"),
                .product(name: "Yams", package: "Yams"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "CoreMetrics", package: "swift-metrics"),
            ],
            swiftSettings: strictSettings
        ),
        // The operator's HTTP listener: Prometheus metrics, health and readiness, the live view.
        .target(
            name: "StateSyncHTTP",
            dependencies: [
                "StateSync", "StateSyncClient", "ZeroMQ",
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "Prometheus", package: "swift-prometheus"),
                .product(name: "CoreMetrics", package: "swift-metrics"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ],
            swiftSettings: strictSettings
        ),
        // The production driver: the node's ZeroMQ sockets on an I/O thread, its observer queue.
        .target(
            name: "StateSyncZeroMQ",
            dependencies: ["StateSync", "ZeroMQ", .product(name: "Logging", package: "swift-log")],
            swiftSettings: strictSettings
        ),
        // Test support, public: the deterministic cluster simulator, simulated network and disk,
        // manual clock, seeded randomness, and the convergence checker.
        .target(
            name: "StateSyncTesting",
            dependencies: ["StateSync", .product(name: "Logging", package: "swift-log")],
            swiftSettings: strictSettings
        ),
        // The client library that apps and the CLI use to talk to a daemon.
        .target(
            name: "StateSyncClient",
            dependencies: ["StateSync", "ZeroMQ", .product(name: "Logging", package: "swift-log")],
            swiftSettings: strictSettings
        ),
        // The multi-node convergence harness (`statesync harness`): real daemons, real faults.
        .target(
            name: "StateSyncHarness",
            dependencies: [
                "StateSync", "StateSyncZeroMQ", "StateSyncClient", "StateSyncTesting", "ZeroMQ", "ChildProcesses",
            ],
            swiftSettings: strictSettings
        ),
        // `statesync bench`: the whole path measured against raw libzmq in the same run.
        .target(
            name: "StateSyncBench",
            dependencies: [
                "StateSync", "StateSyncZeroMQ", "StateSyncClient", "ZeroMQ", "StateSyncHarness", "ChildProcesses",
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: strictSettings
        ),
        .executableTarget(
            name: "statesyncd",
            dependencies: [
                "StateSync",
                "StateSyncZeroMQ",
                "StateSyncHTTP",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "CoreMetrics", package: "swift-metrics"),
            ],
            swiftSettings: strictSettings
        ),
        .executableTarget(
            name: "statesync",
            dependencies: [
                "StateSync",
                "StateSyncClient",
                "StateSyncHarness",
                "StateSyncBench",
                "StateSyncTesting",
                "StateSyncHTTP",
                "ZeroMQ",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: strictSettings
        ),
        .testTarget(
            name: "ChildProcessesTests",
            dependencies: ["ChildProcesses"],
            swiftSettings: strictSettings
        ),
        .testTarget(
            name: "ZeroMQTests",
            dependencies: ["ZeroMQ"],
            swiftSettings: strictSettings
        ),
        .testTarget(
            name: "StateSyncTests",
            dependencies: [
                "StateSync", "StateSyncZeroMQ", "StateSyncClient", "ZeroMQ", "StateSyncHarness", "StateSyncTesting",
                "StateSyncHTTP", "StateSyncBench",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Prometheus", package: "swift-prometheus"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ],
            swiftSettings: strictSettings
        ),
        .testTarget(
            name: "StateSyncMacrosTests",
            dependencies: [
                "StateSyncMacros",
                .product(name: "SwiftSyntaxMacrosGenericTestSupport", package: "swift-syntax"),
                .product(name: "SwiftSyntaxMacroExpansion", package: "swift-syntax"),
                .product(name: "SwiftSyntaxMacros", package: "swift-syntax"),
            ],
            swiftSettings: strictSettings
        ),
        // Real processes: the built statesyncd and statesync binaries on loopback.
        .testTarget(
            name: "IntegrationTests",
            dependencies: [
                "StateSync", "StateSyncZeroMQ", "StateSyncClient", "StateSyncHarness", "ChildProcesses", "statesyncd",
                "statesync",
            ],
            swiftSettings: strictSettings
        ),
    ]
)
