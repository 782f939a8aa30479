"""The Merkle tree against published RFC 6962 test vectors, and its proofs' properties.

The vectors are those of the Certificate Transparency C++ merkle tree test
(certificate-transparency, cpp/merkletree/merkle_tree_test.cc), as published
again with the transparency-dev Merkle implementation
(github.com/transparency-dev/merkle, proof/verify_test.go: ``leaves``,
``roots``, ``inclusionProofs``, ``consistencyProofs``).  Nobody here wrote them.
"""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given, settings, strategies as st

from bridge.protocol import merkle
from bridge.protocol.merkle import ProofError

LEAVES = [bytes.fromhex(h) for h in (
    "", "00", "10", "2021", "3031", "40414243", "5051525354555657", "606162636465666768696a6b6c6d6e6f")]
ROOTS = [bytes.fromhex(h) for h in (
    "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
    "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
    "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
    "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
    "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
    "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
    "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
    "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328")]


def _h(*hexes: str) -> list[bytes]:
    return [bytes.fromhex(h) for h in hexes]


# (leaf, 1-based as published; tree size; audit path)
INCLUSION = [
    (1, 1, []),
    (1, 8, _h("96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
              "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
              "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4")),
    (6, 8, _h("bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
              "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
              "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7")),
    (3, 3, _h("fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125")),
    (2, 5, _h("6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
              "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
              "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b")),
]
CONSISTENCY = [
    (1, 1, []),
    (1, 8, _h("96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
              "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
              "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4")),
    (6, 8, _h("0ebc5d3437fbe2db158b9f126a1d118e308181031d0a949f8dededebc558ef6a",
              "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
              "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7")),
    (2, 5, _h("5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
              "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b")),
    (6, 7, _h("0ebc5d3437fbe2db158b9f126a1d118e308181031d0a949f8dededebc558ef6a",
              "b08693ec2e721597130641e8211e7eedccb4c26413963eee6c1e2ed16ffb1a5f",
              "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7")),
]
HASHES = [merkle.leaf_hash(leaf) for leaf in LEAVES]


def test_the_empty_tree_is_the_hash_of_nothing():
    assert merkle.root([]).hex() == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"


@pytest.mark.parametrize("size", range(1, 9))
def test_roots_of_the_published_trees(size):
    assert merkle.root(HASHES[:size]) == ROOTS[size - 1]


@pytest.mark.parametrize("leaf, size, path", INCLUSION)
def test_published_inclusion_proofs_are_made_and_verified(leaf, size, path):
    assert merkle.inclusion_proof(leaf - 1, HASHES[:size]) == path
    merkle.verify_inclusion(leaf - 1, size, HASHES[leaf - 1], path, ROOTS[size - 1])


@pytest.mark.parametrize("size1, size2, path", CONSISTENCY)
def test_published_consistency_proofs_are_made_and_verified(size1, size2, path):
    assert merkle.consistency_proof(size1, HASHES[:size2]) == path
    merkle.verify_consistency(size1, size2, ROOTS[size1 - 1], ROOTS[size2 - 1], path)


def _flip(path: list[bytes], i: int) -> list[bytes]:
    out = list(path)
    out[i] = bytes([out[i][0] ^ 8]) + out[i][1:]
    return out


@pytest.mark.parametrize("leaf, size, path", [v for v in INCLUSION if v[2]])
def test_corrupted_inclusion_proofs_are_refused(leaf, size, path):
    """The probes transparency-dev runs: wrong index, size, leaf, root; garbage; a flipped bit."""
    index, good_root, good_leaf = leaf - 1, ROOTS[size - 1], HASHES[leaf - 1]
    probes = [(index + 1, size, good_leaf, path, good_root), (index ^ 2, size, good_leaf, path, good_root),
              (index, size * 2, good_leaf, path, good_root), (index, size // 2, good_leaf, path, good_root),
              (index, size, hashlib.sha256(b"WrongLeaf").digest(), path, good_root),
              (index, size, good_leaf, path, merkle.EMPTY_ROOT),
              (index, size, good_leaf, path + [good_root], good_root),
              (index, size, good_leaf, [good_root] + path, good_root),
              (index, size, good_leaf, path[:-1], good_root)]
    if index > 0:
        probes.append((index - 1, size, good_leaf, path, good_root))
    probes += [(index, size, good_leaf, _flip(path, i), good_root) for i in range(len(path))]
    for probe in probes:
        with pytest.raises(ProofError):
            merkle.verify_inclusion(*probe)


@pytest.mark.parametrize("size1, size2, path", [v for v in CONSISTENCY if v[2]])
def test_corrupted_consistency_proofs_are_refused(size1, size2, path):
    r1, r2 = ROOTS[size1 - 1], ROOTS[size2 - 1]
    probes = [(size1 + 1, size2, r1, r2, path), (size1 ^ 2, size2, r1, r2, path),
              (size1, size2 * 2, r1, r2, path), (size1, size2 // 2, r1, r2, path),
              (size1, size2, merkle.EMPTY_ROOT, r2, path), (size1, size2, r1, merkle.EMPTY_ROOT, path),
              (size1, size2, r2, r1, path), (size1, size2, r1, r2, []),
              (size1, size2, r1, r2, path + [r1]), (size1, size2, r1, r2, [r2] + path),
              (size1, size2, r1, r2, path[:-1])]
    if size1 > 1:
        probes.append((size1 - 1, size2, r1, r2, path))
    probes += [(size1, size2, r1, r2, _flip(path, i)) for i in range(len(path))]
    for probe in probes:
        with pytest.raises(ProofError):
            merkle.verify_consistency(*probe)


def test_a_receipt_past_the_tree_is_refused():
    with pytest.raises(ProofError):
        merkle.inclusion_proof(8, HASHES)
    with pytest.raises(ProofError):
        merkle.verify_inclusion(8, 8, HASHES[0], [], ROOTS[7])


def _reference_root(hashes: list[bytes]) -> bytes:
    """MTH as RFC 9162 2.1.1 writes it, recursively: the property tests' yardstick."""
    if len(hashes) == 1:
        return hashes[0]
    k = 1 << ((len(hashes) - 1).bit_length() - 1)
    return merkle.node_hash(_reference_root(hashes[:k]), _reference_root(hashes[k:]))


_trees = st.integers(min_value=1, max_value=300).map(
    lambda n: [merkle.leaf_hash(i.to_bytes(4, "big")) for i in range(n)])


@settings(max_examples=60, deadline=None)
@given(_trees, st.data())
def test_every_leaf_is_proven_under_the_root(hashes, data):
    assert merkle.root(hashes) == _reference_root(hashes)
    index = data.draw(st.integers(min_value=0, max_value=len(hashes) - 1))
    proof = merkle.inclusion_proof(index, hashes)
    merkle.verify_inclusion(index, len(hashes), hashes[index], proof, merkle.root(hashes))
    other = (index + 1) % len(hashes)
    if hashes[other] != hashes[index]:
        with pytest.raises(ProofError):
            merkle.verify_inclusion(index, len(hashes), hashes[other], proof, merkle.root(hashes))


@settings(max_examples=60, deadline=None)
@given(_trees, st.data())
def test_every_prefix_is_consistent_and_a_rewritten_one_is_not(hashes, data):
    size1 = data.draw(st.integers(min_value=1, max_value=len(hashes)))
    proof = merkle.consistency_proof(size1, hashes)
    merkle.verify_consistency(size1, len(hashes), merkle.root(hashes[:size1]), merkle.root(hashes), proof)
    if size1 < len(hashes):
        # History rewritten: one leaf of the old tree changed, the new tree built on that.
        at = data.draw(st.integers(min_value=0, max_value=size1 - 1))
        rewritten = list(hashes)
        rewritten[at] = merkle.leaf_hash(b"rewritten")
        with pytest.raises(ProofError):
            merkle.verify_consistency(size1, len(hashes), merkle.root(hashes[:size1]), merkle.root(rewritten),
                                      merkle.consistency_proof(size1, rewritten))


@settings(max_examples=40, deadline=None)
@given(_trees, st.data())
def test_one_tree_gives_every_smaller_trees_proofs(hashes, data):
    """``Tree`` (levels kept, for many proofs) agrees with the proofs of each prefix alone."""
    tree = merkle.Tree(hashes)
    size = data.draw(st.integers(min_value=1, max_value=len(hashes)))
    index = data.draw(st.integers(min_value=0, max_value=size - 1))
    assert tree.root(size) == merkle.root(hashes[:size])
    assert tree.inclusion_proof(index, size) == merkle.inclusion_proof(index, hashes[:size])
    assert tree.consistency_proof(index + 1, size) == merkle.consistency_proof(index + 1, hashes[:size])


@settings(max_examples=40, deadline=None)
@given(_trees, st.data())
def test_a_tree_grown_piece_by_piece_is_the_tree_built_at_once(hashes, data):
    """The agents' proofs come from one tree grown with the log (``extend``):
    every level, so every proof, must be what a tree of all the leaves has."""
    cuts = sorted(data.draw(st.lists(st.integers(min_value=0, max_value=len(hashes)), max_size=4)))
    grown = merkle.Tree()
    for start, end in zip([0, *cuts], [*cuts, len(hashes)]):
        grown.extend(hashes[start:end])
    whole = merkle.Tree(hashes)
    assert grown.size == whole.size and grown.levels == whole.levels


def test_the_agents_proofs_stay_right_as_the_log_grows_between_them(tmp_path):
    """The HTTP routes keep one tree and grow it with the log: each proof,
    asked between answers, verifies against the root of the log as it was."""
    from types import SimpleNamespace

    from bridge.agents.log_routes import LogRoutes
    from bridge.service.storage.store import LogEntry, Store

    store = Store(tmp_path / "s.sqlite")
    with store.transaction():
        store.set_meta("audit_origin", "example.org/askwright-bridge/bridge")
    routes = LogRoutes(store, sets=None)

    def answered(n: int) -> None:
        with store.transaction():
            store.append_log(LogEntry(f"$a{n}", "!r", "@ana:hs", "answer_event", "accepted", set_id="s",
                                      set_dir="/sets/s", qid=f"q{n}", record={"qid": f"q{n}", "state": "answered",
                                                                             "choice": "x"}, ts=n))

    def asked(route, **query):
        return route(SimpleNamespace(query={k: str(v) for k, v in query.items()}), "agent")

    for n in range(3):
        answered(n)
    first = asked(routes._inclusion, index=1, size=3)
    for n in range(3, 8):
        answered(n)
    hashes = store.audit.hashes()
    assert len(hashes) == 8
    assert first["root"] == merkle.root(hashes[:3]).hex()
    later = asked(routes._inclusion, index=6, size=8)
    merkle.verify_inclusion(6, 8, hashes[6], [bytes.fromhex(p) for p in later["proof"]], merkle.root(hashes))
    grown = asked(routes._consistency, **{"from": 3, "to": 8})
    merkle.verify_consistency(3, 8, merkle.root(hashes[:3]), merkle.root(hashes),
                              [bytes.fromhex(p) for p in grown["proof"]])
    store.close()


def test_a_consistency_proof_from_the_empty_tree_is_refused():
    # transparency-dev/merkle's testdata: from size 0 to any size, whatever
    # the proof, verification fails (every tree "extends" the empty one).
    for size2, proof in ((1, []), (8, []), (8, [HASHES[0]])):
        with pytest.raises(ProofError):
            merkle.verify_consistency(0, size2, merkle.EMPTY_ROOT, merkle.root(HASHES[:size2]), proof)
    merkle.verify_consistency(0, 0, merkle.EMPTY_ROOT, merkle.EMPTY_ROOT, [])


async def test_an_agents_leaves_are_sorted_out_of_every_folder_off_the_stores_thread(tmp_path):
    """Which sets are the agent's was read from every set folder's owner file
    inside the store's job, where answers wait to be made durable: 50,000
    folders, 1.4 s a request, every agent's answers waiting behind it."""
    import json as jsonlib
    import threading
    from types import SimpleNamespace

    from bridge.agents.log_routes import LogRoutes
    from bridge.agents.sets import AgentSets
    from bridge.service.storage.store import LogEntry, Store
    from helpers.agents import one_question

    store = Store(tmp_path / "s.sqlite")
    with store.transaction():
        store.set_meta("audit_origin", "example.org/askwright-bridge/bridge")
    sets = AgentSets(tmp_path / "sets")
    for agent, set_id in (("a", "mine"), ("b", "theirs")):
        sets.ask(agent, set_id, one_question(set_id))
        with store.transaction():
            store.append_log(LogEntry(f"${set_id}", "!r", "@ana:hs", "answer_event", "accepted", set_id=set_id,
                                      set_dir=str(tmp_path / "sets" / set_id), qid="q",
                                      record={"qid": "q", "state": "answered", "choice": "x"}, ts=1))
    threads = []
    real = sets.log_starts

    def log_starts(agent: str) -> dict[str, int]:
        threads.append(threading.current_thread().name)
        return real(agent)

    sets.log_starts = log_starts
    routes = LogRoutes(store, sets=sets)
    response = await routes.leaves(SimpleNamespace(query={}), "a")
    leaves = jsonlib.loads(response.body)["leaves"]
    assert [leaf["index"] for leaf in leaves] == [0]
    assert threads and not any(name.startswith("store") for name in threads), threads
    store.close()
