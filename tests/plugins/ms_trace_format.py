"""Trace format `kvlog`: a CSV log with t_ms (milliseconds), in_tok, out_tok."""

from simulator.workload.traces import TRACE_FORMATS, TraceFormat

TRACE_FORMATS.register("kvlog")(TraceFormat(
    "kvlog", "csv", {"timestamp": "t_ms", "prompt_tokens": "in_tok", "output_tokens": "out_tok"},
    "ms", "kvlog CSV: t_ms, in_tok, out_tok"))
