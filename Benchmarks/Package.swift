// swift-tools-version: 6.1
// Micro-benchmarks of StateSync's hot path (ordo-one/package-benchmark), kept in their own
// package so the main build and `swift test` never build the benchmark machinery.
//   cd Benchmarks && swift package benchmark
import Foundation
import PackageDescription

// A path dependency's identity is its directory's name, which depends on where the repository
// was cloned: read it instead of guessing.
let root = URL(fileURLWithPath: Context.packageDirectory).deletingLastPathComponent().lastPathComponent.lowercased()

let package = Package(
    name: "StateSyncBenchmarks",
    platforms: [.macOS(.v15)],
    dependencies: [
        .package(path: ".."),
        .package(url: "https://github.com/ordo-one/benchmark", from: "1.38.1", traits: ["MallocInterposer"]),
    ],
    targets: [
        .executableTarget(
            name: "HotPathBenchmarks",
            dependencies: [
                .product(name: "StateSync", package: root),
                .product(name: "Benchmark", package: "benchmark"),
            ],
            path: "Benchmarks/HotPathBenchmarks",
            swiftSettings: [.swiftLanguageMode(.v6)],
            plugins: [.plugin(name: "BenchmarkPlugin", package: "benchmark")]
        )
    ]
)
