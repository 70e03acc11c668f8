import Foundation
import StateSync

@Replicated
final class Counter {
    var count = 0
    var title = "untitled"
    @Local var scratch = 0
    let createdBy = "tests"
}

struct Point: Codable, Sendable, Equatable {
    var x: Double
    var y: Double
}

enum Mood: String, Codable, Sendable {
    case calm, busy
}

enum Shape: Codable, Sendable, Equatable {
    case circle(radius: Double)
    case square(side: Double)
}

@Replicated
final class Everything {
    var int = 0
    var double = 0.5
    var bool = false
    var string = ""
    var data = Data()
    var date = Date(timeIntervalSinceReferenceDate: 0)
    var optional: String? = nil
    var array: [Int] = []
    var dictionary: [String: Int] = [:]
    var point = Point(x: 0, y: 0)
    var mood = Mood.calm
    var shape = Shape.circle(radius: 1)
}
