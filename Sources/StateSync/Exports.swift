// A @Replicated class conforms to Observation.Observable; users of StateSync get Observation
// without importing it themselves (as SwiftUI re-exports it).
@_exported public import Observation
