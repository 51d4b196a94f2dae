"""Recipes are immutable (issue 33): a stage learns what it needs from its constructor and
never writes into another stage; a fluent method returns a new recipe and leaves the one it
is called on as it was."""

from __future__ import annotations

from collections.abc import Callable

from shardkit import Schedule, ShardDataset, mix
from shardkit.format.manifest.model import Manifest
from shardkit.stages.mixture import Mix, find_mix
from shardkit.stages.tokens import PackTokens
from tests.helpers.resumable import assert_resumable

MakeShards = Callable[..., Manifest]


def _two(make_shards: MakeShards) -> list[ShardDataset]:
    a, b = make_shards([6, 5], prefix="a"), make_shards([7], prefix="b", seed=1)
    return [ShardDataset(m, seed=3).decode() for m in (a, b)]


def test_pack_tokens_leaves_the_mixture_it_reads_from_unchanged(make_shards: MakeShards) -> None:
    """PackTokens set the upstream Mix's token field in place: a mixture given to two
    packers (or kept by the caller) changed under them."""
    mixture = mix(_two(make_shards), [1, 1], seed=1).pipeline()
    assert isinstance(mixture, Mix) and mixture.tokens_field is None
    spec = mixture.spec()
    packed = PackTokens(mixture, "tokens.npy", 32)
    assert mixture.tokens_field is None and mixture.spec() == spec  # the given one: as it was
    counting = find_mix(packed)
    assert counting is not None and counting is not mixture
    assert counting.tokens_field == "tokens.npy"  # the packer's own: counts tokens
    assert counting.stages == mixture.stages  # the sources are the same recipes
    # the same fingerprint as a mixture given the field, so saved states still load
    given = mix(_two(make_shards), [1, 1], seed=1, tokens_field="tokens.npy").pipeline()
    assert PackTokens(given, "tokens.npy", 32).spec() == packed.spec()


def test_a_mixture_packed_by_its_field_counts_tokens_and_resumes(make_shards: MakeShards) -> None:
    """A schedule in tokens learns its field from pack_tokens; the base recipe does not."""
    tokens = Schedule([(0, [1, 0]), (400, [1, 1])], unit="tokens", interpolate="linear")
    base = mix(_two(make_shards), tokens, seed=2, stop="never")
    packed = base.pack_tokens("tokens.npy", 48).with_epoch(6)
    found = find_mix(base.pipeline())
    assert found is not None and found.tokens_field is None
    assert len(list(packed)) == 6  # no "a schedule in tokens needs the token field"
    assert_resumable(lambda: base.pack_tokens("tokens.npy", 48).with_epoch(6), rounds=2, seed=4)


def test_source_methods_make_new_sources_with_their_plan(make_shards: MakeShards) -> None:
    """shuffle, split_by_node and with_epoch are plan choices: each makes new sources whose
    PlanConfig holds them (under a mixture too); the recipe called on keeps its own."""
    base = mix(_two(make_shards), [1, 1], seed=1)
    before = [(s, s.config) for s in base.sources]
    shuffled = base.shuffle(8, initial=2).split_by_node()
    assert [(s, s.config) for s in base.sources] == before
    assert not {id(s) for s in shuffled.sources} & {id(s) for s, _ in before}
    assert [(s.config.bufsize, s.config.initial, s.config.by_node) for s in shuffled.sources] == [
        (8, 2, True),
        (8, 2, True),
    ]
    found = find_mix(shuffled.pipeline())
    assert found is not None and found.stages[0].upstream is shuffled.sources[0]  # decode()
    resampled = ShardDataset(make_shards([4]), resampled=True).with_epoch(9)
    assert resampled.sources[0].config.epoch_length == 9 and len(list(resampled)) == 9
