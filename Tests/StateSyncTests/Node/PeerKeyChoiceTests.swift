import Testing

@testable import StateSyncZeroMQ

/// Which of a rotating peer's keys the node dials it with (``PeerKeyChoice``).
@Suite("Security: dialling a peer that has several trusted keys")
struct PeerKeyChoiceTests {
    let old: [UInt8] = Array(repeating: 1, count: 32)
    let new: [UInt8] = Array(repeating: 2, count: 32)
    let other: [UInt8] = Array(repeating: 3, count: 32)

    @Test func aSilentLinkMovesToThePeersNextKeyRoundTheList() {
        var choice = PeerKeyChoice(keys: ["node2": [old, new], "node3": [other]])
        #expect(choice.key(for: "node2") == old)
        let movedOnce = choice.linkFailed(node: "node2")
        #expect(movedOnce && choice.key(for: "node2") == new)
        let movedTwice = choice.linkFailed(node: "node2")
        #expect(movedTwice && choice.key(for: "node2") == old)
        // A peer with one key keeps it; an unknown peer gets no key (its handshake fails).
        let movedSingle = choice.linkFailed(node: "node3")
        #expect(!movedSingle)
        #expect(choice.key(for: "node3") == other)
        #expect(choice.key(for: "node9") == [])
    }

    @Test func aReloadKeepsTheKeyThatWorksAndRedialsOnlyPeersThatLostIt() {
        var choice = PeerKeyChoice(keys: ["node2": [old], "node3": [other]])
        // Rotation, step 1: the new key is added — nothing is redialled.
        let added = choice.reload(["node2": [old, new], "node3": [other]])
        #expect(added.isEmpty)
        #expect(choice.key(for: "node2") == old)
        // The peer restarted with its new key: the silent link moved on to it.
        choice.linkFailed(node: "node2")
        // Step 3: the old key is removed — the chosen (new) key stays, nothing is redialled.
        let oldRemoved = choice.reload(["node2": [new], "node3": [other]])
        #expect(oldRemoved.isEmpty)
        #expect(choice.key(for: "node2") == new)
        // A peer whose dialled key goes, or that loses every key, is redialled.
        let lost = choice.reload(["node2": [old]])
        #expect(lost == ["node2", "node3"])
        #expect(choice.key(for: "node2") == old && choice.key(for: "node3") == [])
    }
}
