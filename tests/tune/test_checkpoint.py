"""The JSONL checkpoint of a tuning job: highest repetitions kept, other contexts filtered out,
a torn last line survived."""

from __future__ import annotations

from servelab.tune import checkpoint as CK

E = {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 32,
     "num_warps": 4, "num_stages": 3}


def test_checkpoint_keeps_highest_reps_filters_context_and_survives_a_torn_line(tmp_path):
    ck = CK.Checkpoint(tmp_path / CK.FILE_NAME)
    rec = {"t": "m", "ctx": "a", "n": 1, "k": 2, "m": 3, "cfg_key": "x", "cfg": E, "us": 5.0, "reps": 3}
    ck.append(rec)
    ck.append(dict(rec, us=4.0, reps=7))
    ck.append(dict(rec, ctx="b", us=1.0, reps=9))                   # another device/method
    ck.append({"t": "unit", "ctx": "a", "search": "fast", "n": 1, "k": 2, "m": 3, "best": E})
    ck.close()
    with open(ck.path, "ab") as f:
        f.write(b'{"t": "m", "ctx": "a", "n": 1, "k"')                # killed mid-write
    ck2 = CK.Checkpoint(ck.path)
    ck2.append({"t": "unit", "ctx": "a", "search": "fast", "n": 1, "k": 2, "m": 4, "best": E})
    ck2.close()
    st = CK.Checkpoint(ck.path).load("a", "fast")
    assert st.torn_lines == 1
    assert st.measurements[(1, 2, 3)]["x"]["us"] == 4.0
    assert set(st.units) == {(1, 2, 3), (1, 2, 4)}
    assert CK.Checkpoint(ck.path).load("a", "exhaustive").units == {}
    assert CK.context_id(a=1, b=2) == CK.context_id(b=2, a=1) != CK.context_id(a=1, b=3)
