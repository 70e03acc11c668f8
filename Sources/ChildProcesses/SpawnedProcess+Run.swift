#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

extension SpawnedProcess {
    /// Runs `executable` to its end and returns its exit status and what it wrote to standard
    /// output and standard error (together, in the order written). Its standard input is
    /// `/dev/null`.
    package static func run(
        _ executable: String, _ arguments: [String], environment: [String: String]
    ) throws(SpawnError) -> (status: Int32, output: String) {
        var ends: [Int32] = [0, 0]
        // Both ends close on exec; the child's copy of the write end (made by dup2) does not.
        guard pipe(&ends) == 0 else { throw SpawnError(executable, "pipe", errno) }
        _ = fcntl(ends[0], F_SETFD, FD_CLOEXEC)
        _ = fcntl(ends[1], F_SETFD, FD_CLOEXEC)
        defer { close(ends[0]) }
        let child: SpawnedProcess
        do {
            defer { close(ends[1]) }  // the child holds its own: end of file when it exits
            child = try SpawnedProcess(
                executable: executable, arguments: arguments, environment: environment,
                standardOutput: .descriptor(ends[1]), standardError: .descriptor(ends[1]))
        }
        var output: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 4096)
        while true {
            let count = buffer.withUnsafeMutableBytes { read(ends[0], $0.baseAddress, $0.count) }
            if count > 0 {
                output += buffer[0..<count]
            } else if count == 0 || errno != EINTR {
                break
            }
        }
        return (child.waitUntilExit(), String(decoding: output, as: UTF8.self))
    }
}
