#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// A number identifying the calling thread, never 0.
@inline(__always)
package func currentThreadID() -> UInt {
    #if canImport(Darwin)
        return UInt(bitPattern: pthread_self())
    #else
        return UInt(pthread_self())
    #endif
}

/// Names the calling thread for the operating system (at most 15 bytes on Linux): what `top -H`,
/// `perf` and core dumps show. Foundation's `Thread.name` does not reach the OS thread on Linux,
/// which keeps the name of the thread that started it.
package func nameCurrentThread(_ name: String) {
    #if canImport(Glibc)
        // pthread_setname_np and prctl are not imported into Swift; this file is their interface.
        let fd = open("/proc/thread-self/comm", O_WRONLY)
        guard fd >= 0 else { return }
        defer { close(fd) }
        let bytes = Array(name.utf8.prefix(15))
        _ = bytes.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
    #elseif canImport(Darwin)
        _ = pthread_setname_np(name)
    #endif
}

/// How many model locks the calling thread holds through ``ModelRegistrar``'s transactions and
/// consistent reads (the only places where a model's lock is held while the app's code runs).
/// A thread that holds one must not wait for the node's I/O thread, which may be waiting for
/// that very lock to apply a peer's write.
enum HeldModelLocks {
    private static let key: pthread_key_t = {
        var key = pthread_key_t()
        let created = pthread_key_create(&key, nil)
        precondition(created == 0, "pthread_key_create failed: \(created)")
        return key
    }()

    /// The number held by the calling thread.
    static var count: Int { Int(bitPattern: pthread_getspecific(key)) }

    static func enter() { pthread_setspecific(key, UnsafeRawPointer(bitPattern: count + 1)) }

    static func leave() { pthread_setspecific(key, UnsafeRawPointer(bitPattern: count - 1)) }
}
