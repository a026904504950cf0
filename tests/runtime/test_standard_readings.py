"""One worker's standard FP8 recipe readings (:class:`precsearch.runtime.standard.StandardReadings`), without a probe.

What would be wrong if these failed: a study reads the standard recipe again for every trial (a reading each), keeps a
failed one (so later runs never retry it) or shows a figure it never read.
"""

from __future__ import annotations

import torch

from _spaces import tiny_space_dict
from precsearch.config.loader import parse_space
from precsearch.probe.result import ProbeResult
from precsearch.runtime.executor import ProbeCrashed
from precsearch.runtime.reference import ReferenceCache
from precsearch.runtime.standard import StandardReadings, standard_key

CPU = torch.device("cpu")
READ = {"value": 0.0012, "se": 0.0001, "measure": "update_norm", "recipe": "FP8 delayed scaling ...", "states": []}


def _readings(tmp_path, said: list, tags: list, **overrides) -> StandardReadings:
    space = parse_space(tiny_space_dict(**{"objectives.reading": "damage", **overrides}))
    return StandardReadings(space, ReferenceCache(tmp_path / "references"), CPU, said.append, tags.append)


def test_it_is_read_once_per_clip_value_and_kept_for_the_next_run(tmp_path):
    said, tags, calls = [], [], []

    def read() -> ProbeResult:
        calls.append(1)
        return ProbeResult(damage=READ)

    standard = _readings(tmp_path, said, tags)
    assert standard.reading(1.0, read) == READ and standard.reading(1.0, read) == READ and len(calls) == 1
    assert tags == [{"instability_standard.clip_grad_1.0": "0.0012", "standard_recipe": READ["recipe"]}]
    again = _readings(tmp_path, said, tags)  # a resumed run: a new worker, the same study directory
    assert again.reading(1.0, read) == READ and len(calls) == 1 and said == []
    assert again.reading(None, read) == READ and len(calls) == 2  # another clip value is read for itself


def test_a_failed_reading_is_said_once_left_out_and_tried_again_by_the_next_run(tmp_path):
    said, tags, calls = [], [], []

    def crash() -> ProbeResult:
        calls.append(1)
        raise ProbeCrashed("probe process killed by SIGKILL")

    standard = _readings(tmp_path, said, tags)
    assert standard.reading(1.0, crash) is None and standard.reading(1.0, crash) is None
    assert len(calls) == 1 and len(said) == 1 and "SIGKILL" in said[0] and tags == []
    assert not list((tmp_path / "references").glob("standard-*.json"))
    assert _readings(tmp_path, said, tags).reading(1.0, lambda: ProbeResult(damage=READ)) == READ


def test_a_backend_that_runs_no_standard_recipe_gives_none(tmp_path):
    said, tags = [], []
    standard = _readings(tmp_path, said, tags)
    assert standard.reading(1.0, lambda: ProbeResult(damage=None)) is None
    assert len(said) == 1 and "no standard FP8 recipe runs" in said[0] and tags == []


def test_switched_off_or_another_reading_reads_nothing(tmp_path):
    said, tags = [], []

    def never() -> ProbeResult:
        raise AssertionError("read although off")

    for overrides in ({"objectives.damage.standard_reference": False}, {"objectives.reading": "final"}):
        standard = _readings(tmp_path, said, tags, **overrides)
        assert not standard.on and standard.reading(1.0, never) is None
    assert said == [] and tags == []


def test_its_key_follows_what_the_reading_depends_on_and_not_the_limit():
    space = parse_space(tiny_space_dict(**{"objectives.reading": "damage"}))
    key = standard_key(space, 1.0, CPU)
    moved = parse_space(tiny_space_dict(**{"objectives.reading": "damage", "objectives.damage.limit": 0.01}))
    assert standard_key(moved, 1.0, CPU) == key  # the limit judges the figure; it does not change it
    other = parse_space(tiny_space_dict(**{"objectives.reading": "damage", "objectives.damage.batches": 5}))
    assert standard_key(other, 1.0, CPU) != key and standard_key(space, None, CPU) != key
    margin = parse_space(tiny_space_dict(**{"objectives.reading": "damage", "search.recipe.margin": 1}))
    assert standard_key(margin, 1.0, CPU) != key  # the standard recipe takes the space's fixed settings
