"""Hand-traced golden logs for the vLLM 0.33 rules kvsim adopted from the parity traces
(docs/parity.md, "What kvsim changed"); no vLLM needed. Log rows: (step, {req: tokens},
[preempted], [finished])."""

from __future__ import annotations

from helpers import drive, make_scheduler


def test_admission_reserves_the_whole_sequence():
    # 6 usable blocks of 4, budget 8. Step 0: r0 (12-token prompt, 3 blocks) takes 8 tokens.
    # Step 1: r0 its last 4 (3 blocks held, 3 free); r1 (16 tokens = 4 blocks) would fit its
    # first 4-token chunk, but vLLM 0.33 (scheduler_reserve_full_isl) asks room for all 4
    # blocks: not admitted. Step 2: r0 decodes (4th block) and finishes; r1 runs after it.
    sched = make_scheduler(num_blocks=7, block_size=4, budget=8, max_num_seqs=4)
    assert drive(sched, {0: [(12, 2), (16, 1)]}) == [
        (0, {0: 8}, [], []),
        (1, {0: 4}, [], []),
        (2, {0: 1}, [], [0]),
        (3, {1: 8}, [], []),
        (4, {1: 8}, [], [1]),
    ]
    # Without the gate (vLLM before the option): r1 is admitted on its first chunk at step 1
    # and preempted at step 2, when r0's 4th block leaves r1 one block short.
    sched = make_scheduler(num_blocks=7, block_size=4, budget=8, max_num_seqs=4)
    sched.reserve_full_isl = False
    assert drive(sched, {0: [(12, 2), (16, 1)]})[1:3] == [
        (1, {0: 4, 1: 4}, [], []),
        (2, {0: 1}, [1], [0]),
    ]


def test_priority_goes_on_after_a_request_preempts_itself():
    # 3 usable blocks of 4. Step 0 admits by (priority, arrival, id): r0 (prio 0), r2 (prio 0),
    # r1 (prio 5); one block each. Step 2: r2 needs a 2nd block; victim max (priority,
    # arrival) = r1. Step 3: r0 needs a 2nd block; victim = first max of (0, 0.0) = r0 itself.
    # vLLM 0.33 goes on with r2, which fits its own block (under fcfs the loop would stop, and
    # kvsim used to stop here too, making an empty step).
    sched = make_scheduler(num_blocks=4, block_size=4, budget=16, max_num_seqs=4, policy="priority")
    log = drive(sched, {0: [(2, 6, 0), (2, 6, 5), (3, 6, 0)]})
    assert log[:4] == [
        (0, {0: 2, 2: 3, 1: 2}, [], []),
        (1, {0: 1, 2: 1, 1: 1}, [], []),
        (2, {0: 1, 2: 1}, [1], []),
        (3, {2: 1}, [0], []),
    ]
    assert all(scheduled for _, scheduled, _, _ in log)  # never an empty step
