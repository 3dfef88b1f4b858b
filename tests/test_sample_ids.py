"""plan.json's sample ids as runs (results/files/sample_ids.py): packing is lossless, in order, a slice is generated
for just its positions, duplicates are found from the runs, and an old plan's plain list of strings reads the same."""
from __future__ import annotations

import json
from typing import List

import pandas as pd
import pytest

from robustbench_pid.errors import UserError
from robustbench_pid.results.files.sample_ids import SampleIds, pack, parse
from robustbench_pid.specs import Unit


def roundtrip(ids: List[str]) -> SampleIds:
    entries = json.loads(json.dumps(pack(iter(ids))))  # as plan.json holds them; pack takes an iterator
    got = SampleIds(entries)
    assert list(got) == ids and len(got) == len(ids) and [got[i] for i in range(len(ids))] == ids
    for a in range(len(ids) + 1):
        for b in range(a, len(ids) + 2):
            assert got.slice(a, b) == ids[a:b] == got[a:b]
    assert got[::2] == ids[::2] and (not ids or got[-1] == ids[-1])
    old = SampleIds(ids)  # an old plan: every id a literal string
    assert list(old) == ids and old.slice(1, 3) == ids[1:3]
    return got


def test_parse_is_canonical() -> None:
    assert parse("gaussian_noise/1/test/9999") == ("gaussian_noise/1/test/", 9999)
    assert parse("0") == ("", 0) and parse("17") == ("", 17) and parse("a10") == ("a", 10)
    for lit in ("", "img.JPEG", "img_007", "00", "a01", "x" + "9" * 19, "٣"):  # no digits, leading zeros, too long
        assert parse(lit) is None


def test_pack_stores_runs_and_literals_in_order() -> None:
    cifar_c = [f"{c}/test/{i}" for c in ("clean", "fog/1", "fog/2") for i in range(1000)]
    assert pack(cifar_c) == [["clean/test/", 0, 1000], ["fog/1/test/", 0, 1000], ["fog/2/test/", 0, 1000]]
    roundtrip(cifar_c[:7] + cifar_c[1000:1003])
    assert pack(str(i) for i in range(5)) == [["", 0, 5]]  # digits: str(int(r))
    assert pack(["a1", "a2", "a5"]) == [["a", 1, 2], "a5"]  # a lone numbered id stays a string
    assert pack([]) == [] and list(SampleIds([])) == [] and SampleIds([]).slice(0, 3) == []
    mixed = ["n01/img_1.JPEG", "img_007", "img_008", "b9", "b10", "b11", "x", "0", "1", "01", "c", "c0", "c1"]
    assert pack(mixed) == ["n01/img_1.JPEG", "img_007", "img_008", ["b", 9, 3], "x", ["", 0, 2], "01", "c",
                           ["c", 0, 2]]
    roundtrip(mixed)
    roundtrip(["a9", "a10", "a11", "a100", "a99", "a98"])  # 9 -> 10 -> 11 is one run; descending is not
    assert pack([3, 4]) == [["", 3, 2]]  # ids are str()'ed, as plan.json always stored them


def test_duplicates_from_runs_and_literals() -> None:
    assert SampleIds(pack([f"s{i}" for i in range(100)])).duplicates() == []
    assert SampleIds(pack(["s0", "s1", "s2", "s1", "s2", "s3"])).duplicates() == ["s1", "s2"]  # runs overlapping
    assert SampleIds(pack(["a10", "b", "a10"])).duplicates() == ["a10"]  # lone numbered ids
    assert SampleIds(pack(["img.JPEG", "x", "img.JPEG"])).duplicates() == ["img.JPEG"]
    # 'a1' + '0' and 'a' + '10' are one id: the parse makes them one pair
    assert SampleIds([["a", 9, 3], "a10"]).duplicates() == ["a10"]
    assert SampleIds(["a10", "a11", "a10"]).duplicates() == ["a10"]  # an old plan's strings
    assert SampleIds(pack(["a007", "a7", "a07"])).duplicates() == []  # distinct strings, whatever their numbers
    three = SampleIds([["p", 0, 4], ["p", 0, 4], ["p", 2, 4]])
    assert three.duplicates() == ["p0", "p1", "p2", "p3"] and three.duplicates(2) == ["p0", "p1"]
    with pytest.raises(ValueError, match="not a run"):
        SampleIds([["a1", 0, 2]])  # a prefix ending in a digit: ids the parse would give another pair
    with pytest.raises(ValueError, match="not a run"):
        SampleIds([["a", -1, 2]])


def test_check_records_on_packed_ids_names_duplicates_missing_and_unexpected() -> None:
    from robustbench_pid.results.files.merge import check_records

    ids = [f"fog/1/test/{i}" for i in range(6)] + ["x.JPEG", "y.JPEG"]

    def unit(s: int, e: int, key: str) -> Unit:
        return Unit("robustbench_corruptions", "clean", 0.0, "{}", "", s, e, key * 12)

    def frame(u: Unit, sids: List[str]) -> pd.DataFrame:
        return pd.DataFrame({"unit": u.key, "sample_id": sids})

    units = [unit(0, 4, "a"), unit(4, 8, "b")]
    good = [frame(u, ids[u.start:u.stop]) for u in units]
    for stored in (pack(ids), ids, SampleIds(pack(ids))):  # new plan, old plan, already decoded
        check_records(units, good, stored)
    wrong = [good[0], frame(units[1], ["fog/1/test/4", "fog/1/test/6", "x.JPEG", "y.JPEG"])]
    with pytest.raises(UserError, match=r"samples missing \['fog/1/test/5'\] / unexpected \['fog/1/test/6'\]"):
        check_records(units, wrong, pack(ids))
    dup = ids[:5] + ["fog/1/test/1", "x.JPEG", "y.JPEG"]
    with pytest.raises(UserError, match=r"repeats sample ids \['fog/1/test/1'\]"):
        check_records(units, [frame(u, dup[u.start:u.stop]) for u in units], pack(dup))
