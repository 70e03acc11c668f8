/// The host part of a `tcp://HOST:PORT` endpoint (brackets of an IPv6 address kept), or `nil`
/// for another transport (`ipc://`, `inproc://`, …), which never leaves the machine.
package func tcpHost(of endpoint: String) -> Substring? {
    guard endpoint.hasPrefix("tcp://") else { return nil }
    let rest = endpoint.dropFirst(6)
    return rest.lastIndex(of: ":").map { rest[..<$0] } ?? rest
}
