import CZeroMQ

/// The ZeroMQ socket patterns this binding exposes.
public enum SocketType: Sendable, CustomStringConvertible {
    case pub, sub, xpub, xsub, router, dealer, req, rep, pair, push, pull

    var rawValue: Int32 {
        switch self {
        case .pub: ZMQ_PUB
        case .sub: ZMQ_SUB
        case .xpub: ZMQ_XPUB
        case .xsub: ZMQ_XSUB
        case .router: ZMQ_ROUTER
        case .dealer: ZMQ_DEALER
        case .req: ZMQ_REQ
        case .rep: ZMQ_REP
        case .pair: ZMQ_PAIR
        case .push: ZMQ_PUSH
        case .pull: ZMQ_PULL
        }
    }

    public var description: String {
        switch self {
        case .pub: "PUB"
        case .sub: "SUB"
        case .xpub: "XPUB"
        case .xsub: "XSUB"
        case .router: "ROUTER"
        case .dealer: "DEALER"
        case .req: "REQ"
        case .rep: "REP"
        case .pair: "PAIR"
        case .push: "PUSH"
        case .pull: "PULL"
        }
    }
}
