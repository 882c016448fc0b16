"""Trace loaders, format detection, bad input and transforms (simulator/workload/traces.py)."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pandas as pd
import pytest

from simulator.config.workload import WorkloadConfig
from simulator.errors import ConfigError
from simulator.workload.load import generate
from simulator.workload.traces import read_trace

SEED = np.random.SeedSequence(0)


def load(path, **kw):
    return generate(WorkloadConfig(trace=str(path), **kw), np.random.SeedSequence(0))


def write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return p


def cv(t):
    g = np.diff(t)
    return g.std() / g.mean()


# --- real traces: loaded figures vs the raw files read independently -------------------------
@pytest.mark.parametrize("name", ["azure_llm_2023_conv.csv", "azure_llm_2023_code.csv"])
def test_azure_trace_matches_raw_file(shared_data, name):
    raw = pd.read_csv(shared_data / "traces" / name)
    t = pd.to_datetime(raw["TIMESTAMP"])
    secs = (t - t.min()).dt.total_seconds().to_numpy()
    w = load(shared_data / "traces" / name)
    assert len(w) == len(raw)
    np.testing.assert_allclose(w.arrival_s, np.sort(secs), atol=1e-6)
    np.testing.assert_array_equal(w.prompt_tokens, raw["ContextTokens"])
    np.testing.assert_array_equal(w.output_tokens, raw["GeneratedTokens"])
    assert w.prefix is None and w.info["dropped_failed"] == 0


def test_azure_conv_headline_figures(shared_data):
    w = load(shared_data / "traces" / "azure_llm_2023_conv.csv")
    assert len(w) == 19_366
    assert 58.0 < w.arrival_s[-1] / 60 < 58.7  # ~58 min (58.36)


def test_mooncake_conversation_matches_raw_file(shared_data):
    path = shared_data / "traces" / "mooncake_conversation.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    w = load(path)
    assert len(w) == len(rows) == 12_031
    assert w.prompt_tokens.mean() == pytest.approx(12_035, abs=0.5)
    assert w.output_tokens.mean() == pytest.approx(343, abs=0.5)
    ts = np.array([r["timestamp"] for r in rows], dtype=float)
    np.testing.assert_allclose(w.arrival_s, (ts - ts[0]) / 1000.0)
    assert w.prefix_block_tokens == 512
    for i in (0, 1, 4242, 12_030):  # hash_ids kept verbatim, one id per 512-token block
        assert list(w.prefix[i]) == rows[i]["hash_ids"]
        assert len(w.prefix[i]) == -(-rows[i]["input_length"] // 512)


def test_mooncake_synthetic_and_lengths_files_load(shared_data):
    d = shared_data / "traces"
    w = load(d / "mooncake_synthetic.jsonl")
    assert len(w) == 3_993 and w.prefix is not None
    for name in ("lengths_sharegpt_8k_filtered_stats_llama2_tokenizer.csv",
                 "lengths_arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv",
                 "lengths_bwb_stats_llama2_tokenizer_filtered_v2.csv"):
        raw = pd.read_csv(d / name)
        w = load(d / name, arrival={"process": "poisson", "rate": 10.0})
        assert len(w) == len(raw)
        np.testing.assert_array_equal(w.prompt_tokens, raw["num_prefill_tokens"])  # file order
        np.testing.assert_array_equal(w.output_tokens, raw["num_decode_tokens"])
        assert w.arrival_s[0] == 0 and len(w) / w.arrival_s[-1] == pytest.approx(10.0, rel=0.03)


def test_rate_scaling_preserves_cv_of_a_real_trace(shared_data):
    path = shared_data / "traces" / "azure_llm_2023_conv.csv"
    base = load(path)
    rate = (len(base) - 1) / base.arrival_s[-1]
    for kw in ({"speedup": 3.0}, {"target_rate": 2.0}, {"target_rate": 40.0}):
        w = load(path, **kw)
        assert cv(w.arrival_s) == pytest.approx(cv(base.arrival_s), rel=0.02)
        want = rate * kw["speedup"] if "speedup" in kw else kw["target_rate"]
        assert (len(w) - 1) / w.arrival_s[-1] == pytest.approx(want, rel=1e-9)
    # a 10-minute window keeps its own burst shape when rescaled
    win = load(path, window_start_s=600, duration_s=600)
    fast = load(path, window_start_s=600, duration_s=600, target_rate=20.0)
    assert cv(fast.arrival_s) == pytest.approx(cv(win.arrival_s), rel=0.02)


# --- formats ---------------------------------------------------------------------------------
BURST = ("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
         "5,ChatGPT,472,18,490,Conversation log\n"
         "45,ChatGPT,1087,230,1317,Conversation log\n"
         "118,GPT-4,417,276,693,API log\n"
         "120,ChatGPT,10,0,10,Conversation log\n"
         "130,GPT-4,0,0,0,Conversation log\n"
         "185,ChatGPT,1360,647,2007,API log\n")


def test_burstgpt_drops_failed_and_counts(tmp_path):
    p = write(tmp_path, "burst.csv", BURST)
    with pytest.warns(UserWarning, match="0-token prompt"):
        w = load(p)
    assert w.info["source"].endswith("(burstgpt)")
    assert list(w.prompt_tokens) == [472, 1087, 417, 1360]
    assert list(w.arrival_s) == [0, 40, 113, 180]
    assert w.info["dropped_failed"] == 2 and w.info["dropped_zero_prompt"] == 1
    with pytest.warns(UserWarning):
        kept = load(p, keep_failed=True)
    assert list(kept.output_tokens) == [18, 230, 276, 1, 647]
    assert kept.info["failed_kept"] == 1


def test_burstgpt_filter_by_column(tmp_path):
    p = write(tmp_path, "burst.csv", BURST)
    w = load(p, filter={"Log Type": "Conversation log", "Model": ["ChatGPT"]})
    assert list(w.prompt_tokens) == [472, 1087]  # the failed ChatGPT row is dropped too
    assert w.info["filtered_out"] == 3
    with pytest.raises(ConfigError, match="no rows match"):
        load(p, filter={"Model": "llama"})
    with pytest.raises(ConfigError, match="missing column 'Region'"):
        load(p, filter={"Region": "eu"})


def test_vidur_and_generic_formats(tmp_path):
    p = write(tmp_path, "v.csv", "arrived_at,num_prefill_tokens,num_decode_tokens\n"
                                 "10.0,100,5\n10.5,200,6\n12.0,300,7\n")
    w = load(p)
    assert w.info["source"].endswith("(vidur)") and list(w.arrival_s) == [0, 0.5, 2.0]
    g = write(tmp_path, "g.jsonl", "\n".join(json.dumps(r) for r in [
        {"t_ms": 1000, "in": 600, "out": 3, "user": "a", "ids": [7, 8], "conv": "x"},
        {"t_ms": 1500, "in": 520, "out": 4, "user": "b", "ids": [7], "conv": "y"},
        {"t_ms": 4000, "in": 1100, "out": 5, "user": "a", "ids": [7, 8, 9], "conv": "x"}]))
    cols = {"timestamp": "t_ms", "prompt_tokens": "in", "output_tokens": "out", "tenant": "user",
            "hash_ids": "ids", "session_id": "conv"}
    w = load(g, format="generic", columns=cols, timestamp_unit="ms")
    assert list(w.arrival_s) == [0, 0.5, 3.0]
    assert list(w.tenant) == ["a", "b", "a"] and list(w.session_id) == [0, 1, 0]
    # the second row has 2 chunks of 512 but only one id: the rest gets a fresh unique id
    assert list(w.prefix[1][:1]) == [7] and w.prefix[1][1] not in (7, 8, 9)
    assert w.info["hash_ids_padded"] == 1
    # columns alone select the generic format
    assert len(load(g, columns=cols, timestamp_unit="ms")) == 3


@pytest.mark.parametrize("value, why", [("1.5", "1.5 is not a whole number$"),
                                        ("3e10", "30000000000.0 is above 2,147,483,647$")])
def test_a_priority_is_not_called_tokens(tmp_path, value, why):
    g = write(tmp_path, "p.csv", f"t,in,out,prio\n0,10,2,1\n1,10,2,{value}\n")
    cols = {"timestamp": "t", "prompt_tokens": "in", "output_tokens": "out", "priority": "prio"}
    with pytest.raises(ConfigError, match=r"row 2 \(line 3\), column 'prio': " + why):
        load(g, format="generic", columns=cols, timestamp_unit="s")


def test_lengths_only_with_duration_and_process(tmp_path):
    p = write(tmp_path, "l.csv", "num_prefill_tokens,num_decode_tokens\n" +
              "".join(f"{i + 1},{i + 2}\n" for i in range(500)))
    w = load(p, arrival={"process": "gamma", "rate": 5.0, "cv": 2.0}, duration_s=20)
    assert 0 < len(w) < 500 and w.arrival_s[-1] < 20
    assert list(w.prompt_tokens[:3]) == [1, 2, 3]  # file order
    w = load(p, num_requests=50)
    assert len(w) == 50 and list(w.prompt_tokens[-1:]) == [50]


# --- bad input: each one clear error naming file, row/line and column -------------------------
AZ = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
GOOD = "2023-11-16 18:15:46.6805900,374,44\n"


@pytest.mark.parametrize("body, pattern", [
    (AZ + GOOD + "2023-11-16 18:15:47.0,abc,44\n",
     r"row 2 \(line 3\), column 'ContextTokens': 'abc' is not a number"),
    (AZ + GOOD + "2023-11-16 18:15:47.0,-5,44\n",
     r"row 2 \(line 3\), column 'ContextTokens': -5 is negative"),
    (AZ + GOOD + "2023-11-16 18:15:47.0,12.5,44\n",
     r"row 2 \(line 3\), column 'ContextTokens': 12.5 is not a whole number"),
    (AZ + GOOD + "2023-11-16 18:15:47.0,10,30000000000\n",  # (an int64 cast of 1e20 wraps around)
     r"row 2 \(line 3\), column 'GeneratedTokens': 30000000000 is above 2,147,483,647 tokens"),
    (AZ + GOOD + "2023-11-16 18:15:47.0,10,\n",
     r"row 2 \(line 3\), column 'GeneratedTokens': missing value \(NaN\)"),
    (AZ + GOOD + "2023-11-16 18:15:47.0,10,NaN\n",
     r"row 2 \(line 3\), column 'GeneratedTokens': missing value \(NaN\)"),
    (AZ + GOOD + "yesterday at noon,10,5\n",
     r"row 2 \(line 3\), column 'TIMESTAMP': unparseable timestamp 'yesterday at noon'"),
    ("TIMESTAMP,ContextTokens\n" + "2023-11-16 18:15:46,374\n",
     r"missing column 'GeneratedTokens'"),
    ("", r"empty file"),
    (AZ, r"no data rows"),
])
def test_bad_csv_input(tmp_path, body, pattern):
    p = write(tmp_path, "bad.csv", body)
    with pytest.raises(ConfigError, match=pattern) as e:
        load(p, format="azure")
    assert str(p) in str(e.value)


def test_bad_jsonl_input(tmp_path):
    ok = '{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1]}\n'
    cases = [
        (ok + '{"timestamp": 5, "input_length": 10}\n', r"row 2 \(line 2\): missing column 'output_length'"),
        (ok + "\n" + '{"timestamp": 5, "input_length": "ten", "output_length": 2, "hash_ids": [2]}\n',
         r"row 2 \(line 3\), column 'input_length': 'ten' is not a number"),
        (ok + '{"timestamp": 5, "input_length": 10, "output_length": 2, "hash_ids": 3}\n',
         r"row 2 \(line 2\), column 'hash_ids': expected a list of integer ids"),
        (ok + '{"timestamp": 5, "input_length": 10, "output_length": 2, "hash_ids": [1, 2]}\n',
         r"row 2 \(line 2\), column 'hash_ids': 2 ids for a 10-token prompt"),
        (ok + '{"timestamp": 5, "input_length": 10\n', r"line 2: invalid JSON"),
    ]
    for body, pattern in cases:
        p = write(tmp_path, "bad.jsonl", body)
        with pytest.raises(ConfigError, match=pattern) as e:
            load(p)
        assert str(p) in str(e.value)


def test_unsorted_timestamps_sorted_with_warning_or_rejected(tmp_path):
    p = write(tmp_path, "u.csv", AZ + "2023-11-16 18:00:10,1,1\n2023-11-16 18:00:05,2,2\n"
                                      "2023-11-16 18:00:20,3,3\n")
    with pytest.warns(UserWarning, match=r"row 2 \(line 3\), column 'TIMESTAMP': timestamps are not sorted"):
        w = load(p)
    assert list(w.prompt_tokens) == [2, 1, 3] and list(w.arrival_s) == [0, 5, 15]
    assert w.info["sorted_backward_steps"] == 1
    with pytest.raises(ConfigError, match=r"row 2 \(line 3\).*not sorted.*on_unsorted"):
        load(p, on_unsorted="error")


def test_unknown_and_undetectable_format(tmp_path):
    p = write(tmp_path, "x.csv", "a,b\n1,2\n")
    with pytest.raises(ConfigError, match=r"unknown trace format 'mooncak' \(did you mean 'mooncake'\?\)"):
        load(p, format="mooncak")
    with pytest.raises(ConfigError, match=r"cannot detect the format.*\['a', 'b'\].*generic"):
        load(p)
    with pytest.raises(ConfigError, match="not found"):
        load(tmp_path / "nope.csv")
    with pytest.raises(ConfigError, match="columns applies to format generic"):
        load(p, format="azure", columns={"prompt_tokens": "a", "output_tokens": "b"})


def test_blank_lines_keep_line_numbers(tmp_path):
    p = write(tmp_path, "b.csv", AZ + GOOD + "\n" + "2023-11-16 18:15:47.0,x,1\n")
    with pytest.raises(ConfigError, match=r"row 2 \(line 4\)"):
        load(p)


# --- transforms ------------------------------------------------------------------------------
def test_window_sample_and_clip(tmp_path):
    rows = "".join(f"{t},{p},{o}\n" for t, p, o in
                   [(0, 100, 10), (10, 5000, 10), (20, 300, 9000), (30, 40, 4), (40, 50, 5)])
    p = write(tmp_path, "v.csv", "arrived_at,num_prefill_tokens,num_decode_tokens\n" + rows)
    w = load(p, window_start_s=10, duration_s=20)
    assert list(w.arrival_s) == [0, 10] and list(w.prompt_tokens) == [5000, 300]
    w = load(p, max_model_len=4096)
    assert list(w.prompt_tokens) == [100, 4095, 300, 40, 50]
    assert list(w.output_tokens) == [10, 1, 3796, 4, 5]
    assert w.info["clipped_to_max_model_len"] == 2
    a, b = load(p, sample_n=3), load(p, sample_n=3)
    assert len(a) == 3 and np.array_equal(a.prompt_tokens, b.prompt_tokens)  # seeded
    assert a.arrival_s[0] == 0 and np.all(np.diff(a.arrival_s) >= 0)
    with pytest.raises(ConfigError, match="no requests in the window"):
        load(p, window_start_s=1000)


def test_clip_truncates_prefix_ids(shared_data):
    w = load(shared_data / "traces" / "mooncake_conversation.jsonl", num_requests=200,
             max_model_len=4096)
    assert w.prompt_tokens.max() == 4095
    for i in range(len(w)):
        assert len(w.prefix[i]) == -(-w.prompt_tokens[i] // 512)


def test_read_trace_reports_format(tmp_path):
    p = write(tmp_path, "s.csv", AZ + GOOD)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        work, has_time = read_trace(WorkloadConfig(trace=str(p)))
    assert has_time and work.info["source"].endswith("(azure)") and work.info["rows_read"] == 1


def test_azure_2024_timestamps_with_timezone(tmp_path):
    p = write(tmp_path, "az24.csv", AZ + "2024-05-10 00:00:00.009930+00:00,4808,10\n"
                                        "2024-05-10 00:00:01.509930+00:00,3180,8\n"
                                        "2024-05-10 02:00:02.009930+02:00,110,27\n")
    w = load(p)
    assert w.info["source"].endswith("(azure)")
    np.testing.assert_allclose(w.arrival_s, [0.0, 1.5, 2.0])  # +02:00 honoured
