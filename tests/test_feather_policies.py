"""Feather policies: homogeneous batches, safety vs FCFS, learning, persistence."""

from __future__ import annotations

import json
import random
from collections import deque
from statistics import mean

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from toy_engine import ToyRequest, add, admission_step, grouped_requests, run

from feather.policies import (
    Action,
    PolicyError,
    Request,
    StepContext,
    StepOutcome,
    create_scheduler,
)
from feather.policies.cht_policy import DecisionState
from feather.policies.learned import REWARD_WINDOWS, _Window
from feather.policies.learning import QTable, StateBuckets, UCBTable, greedy_action
from feather.policies.static_rules import FeatherStaticPolicy

FEATHER = ("feather-static", "feather-reference", "feather-ucb", "feather-qlearn")


def make(name: str, **params):
    """Toy prompts are tens of tokens: let any shared chunk count as sharing (the default,
    256 tokens, is tested on its own)."""
    if name == "fcfs":
        return create_scheduler(name)
    return create_scheduler(name, chunk_size=4, **{"min_share_tokens": 0, **params})


def test_interleaved_groups_form_homogeneous_batches_where_fcfs_mixes() -> None:
    # 1,024-token prefixes (feather-static's threshold), staggered finishes, a kernel that
    # reads the common prefix once (cascade): the only place the rule is consulted. The rule
    # stops from half the 12 slots here (its default, three quarters, lets a draining batch
    # take more of the next group: 1.57 groups per batch)
    reqs = grouped_requests(8, 12, prefix=1024, suffix=8, output_len=lambda i: 5 + i % 5)
    fcfs = run(make("fcfs"), reqs, max_running=12, prefix_read_once=True)
    static = run(make("feather-static", min_batch=6), reqs, max_running=12, prefix_read_once=True)
    fcfs_groups = mean(len(s.groups) for s in fcfs if s.running)
    static_groups = mean(len(s.groups) for s in static if s.running)
    assert fcfs_groups >= 6  # arrival order interleaves all 8 groups in every batch
    assert static_groups <= 1.5  # one group, plus a tail of the last while it drains
    assert max(len(s.groups) for s in static) == 2
    # whole batches of one group: the first batch is 12 requests of group 0
    assert static[0].admitted == [i for i in range(96) if i % 8 == 0]
    # a kernel that reads every request's own KV: nothing to protect, every decision forced,
    # so the batch fills as FCFS's does (with sharers first: the candidate order still groups)
    paged = make("feather-static")
    forced = []
    logs = run(
        paged,
        reqs,
        max_running=12,
        on_step=lambda p: forced.extend(d.forced for d in p.last_step.decisions),
    )
    assert forced and all(forced)
    admitted_so_far = 0
    for step in logs:  # no step leaves a slot empty while a request waits
        admitted_so_far += len(step.admitted)
        assert len(step.running) == 12 or admitted_so_far == len(reqs)
    assert mean(len(s.groups) for s in logs if s.running) < fcfs_groups


def test_deepest_first_keeps_arrival_order_where_fewest_missing_goes_shortest_first() -> None:
    """Three documents behind one system prompt, in grouped order (every question of a
    document together): deepest-first offers them as FCFS does; fewest-missing jumps to the
    shortest document as soon as the first one's questions are in (the grouped L-Eval loss)."""
    system = [7] * 8
    docs = {"long": [1] * 40, "mid": [2] * 24, "short": [3] * 8}
    prompts = {
        f"{d}{q}": system + body + [100 + 10 * i + q] * 4
        for i, (d, body) in enumerate(docs.items())
        for q in range(2)
    }
    offered = {}
    for order in ("deepest", "fewest-missing"):
        policy = make("feather-static", candidate_order=order)
        add(policy, **prompts)
        offered[order] = admission_step(policy)
    assert offered["deepest"] == list(prompts)  # arrival order
    assert offered["fewest-missing"] == ["long0", "long1", "short0", "short1", "mid0", "mid1"]


@st.composite
def unshared_workloads(draw):
    """Requests that share no chunk (distinct first token), arriving over time."""
    n = draw(st.integers(1, 25))
    reqs = []
    for i in range(n):
        length = draw(st.integers(0, 30))
        tokens = [1_000 + i] + [draw(st.integers(0, 3)) for _ in range(length)]
        reqs.append(
            ToyRequest(i, tokens, draw(st.integers(1, 6)), arrival_step=draw(st.integers(0, 8)))
        )
    return reqs


@given(
    reqs=unshared_workloads(),
    max_running=st.integers(1, 6),
    refuse_mod=st.integers(2, 7),
    preempt_mod=st.integers(2, 9),
)
@settings(max_examples=150, deadline=None)
def test_without_sharing_every_feather_policy_admits_exactly_as_fcfs(
    reqs, max_running, refuse_mod, preempt_mod
) -> None:
    """C6 by construction: same admissions, same order, same steps - learners exploring too."""

    def engine(policy):
        return run(
            policy,
            reqs,
            max_running=max_running,
            fits=lambda step, req_id: (step + req_id) % refuse_mod != 0,
            preempt_at=lambda step: step % preempt_mod == preempt_mod - 1,
            step_time_s=lambda batch: 1.0 / len(batch),  # rewards differ by batch size
        )

    expected = [s.admitted for s in engine(make("fcfs"))]
    for name in FEATHER:
        extra = {"epsilon_start": 1.0, "epsilon_min": 1.0} if name == "feather-qlearn" else {}
        for consult in ("kernel", "every", "group", "always"):  # the paper's reading too
            policy = make(name, **extra, consult=consult)
            assert [s.admitted for s in engine(policy)] == expected, (name, consult)


def test_reference_rule_keeps_one_prefix_per_batch_where_fcfs_mixes_four() -> None:
    """The branch's rule on 4 interleaved groups of 12 with 400-token prefixes and 32 slots:
    a group's members cut at most a few tokens of its prefix (ADD, the floor grows to 10);
    the first request of another group would cut 400 (> 5 chunks of 50), and the batch of 12
    is past the floor: STOP. Every batch holds one prefix; FCFS's hold all four."""
    reqs = grouped_requests(4, 12, prefix=400, suffix=8, output_len=lambda i: 5)
    fcfs = run(make("fcfs"), reqs, max_running=32)
    reference = make("feather-reference")
    decisions = []
    logs = run(reference, reqs, max_running=32,
               on_step=lambda p: decisions.extend(p.last_step.decisions))
    assert max(len(s.groups) for s in fcfs) == 4
    assert max(len(s.groups) for s in logs if s.running) == 1
    assert logs[0].admitted == [i for i in range(48) if i % 4 == 0]
    assert reference.floor == 10
    stops = [d for d in decisions if d.action is Action.STOP]
    assert stops and all(not d.forced and d.batch_size == 12 for d in stops)
    # the kernel-gated variant on the same engine is never consulted: FCFS-like fill
    gated = run(make("feather-reference", consult="kernel"), reqs, max_running=32)
    assert max(len(s.groups) for s in gated) > 1


@pytest.mark.parametrize("running, expected", [(9, Action.ADD), (10, Action.STOP)])
def test_reference_rule_floor_and_busy_threshold(running, expected) -> None:
    policy = make("feather-reference")
    policy.floor = 10
    state = DecisionState(running, delta_tokens=300, w=0, max_running=64, waiting=3)
    assert policy._decide(state) is expected  # 300 > 5 x 50: only the floor admits it
    busy = DecisionState(running, delta_tokens=300, w=0, max_running=64, waiting=10)
    assert policy._decide(busy) is Action.ADD  # 10 waiting: up to 7 chunks may go
    with pytest.raises(ValueError, match="floor_cap"):
        make("feather-reference", floor_start=4, floor_cap=3)


def test_a_request_sharing_less_than_min_share_tokens_does_not_pass_the_oldest() -> None:
    """A chat template or a short system prompt is no reason to make the oldest wait."""
    template = [5] * 8  # 2 chunks = 8 tokens
    offered = {}
    for min_share in (0, 12):
        policy = make("feather-static", min_share_tokens=min_share)
        add(policy, a0=template + [1] * 8, old=[9] * 16, a1=template + [2] * 8)
        assert admission_step(policy, max_running=1) == ["a0"]
        offered[min_share] = admission_step(policy, max_running=2)
    assert offered == {0: ["a1"], 12: ["old"]}


def test_first_request_of_an_empty_batch_is_the_oldest() -> None:
    policy = make("feather-static", candidate_order="fewest-missing")
    policy.add_request(Request("old", list(range(100, 140))))  # long, shares nothing
    policy.add_request(Request("short", [7, 7, 7, 7]))  # CHT best(): fewest missing chunks
    assert policy.cht.best() == ("short", 1)
    policy.begin_step(StepContext(num_running=0, max_running=1))
    assert policy.next_candidate() == "old"
    assert policy.last_step.decisions[0].forced


def test_refused_candidate_is_not_lost() -> None:
    for name in ("fcfs", *FEATHER):
        policy = make(name)
        for i in range(3):
            policy.add_request(Request(i, [5, 5, 5, 5, i, i, i, i]))
        policy.begin_step(StepContext(num_running=0, max_running=4))
        first = policy.next_candidate()
        policy.refused(first)
        assert policy.next_candidate() is None  # a refusal ends the step's admission
        assert policy.last_step.stop_reason == "refused"
        assert policy.num_waiting == 3
        policy.begin_step(StepContext(num_running=0, max_running=4))
        assert policy.next_candidate() == first, name
        policy.admitted(first)
        assert policy.num_running == 1


def test_decision_state_matches_the_tree() -> None:
    """b, delta and w recorded with a STOP are the CHT's numbers, delta in tokens."""
    policy = make("feather-static", min_batch=2, min_delta_tokens=8)
    a = [1] * 16  # 4 chunks
    for i in range(3):
        policy.add_request(Request(f"a{i}", a + [100 + i] * 4))  # 5 chunks, 4 shared
    for i in range(2):
        policy.add_request(Request(f"b{i}", [2] * 16 + [200 + i] * 4))
    policy.begin_step(StepContext(num_running=0, max_running=10, prefix_read_once=True))
    admitted = []
    while (c := policy.next_candidate()) is not None:
        policy.admitted(c)
        admitted.append(c)
    assert admitted == ["a0", "a1", "a2"]
    stop = policy.last_step.decisions[-1]
    assert (stop.req_id, stop.action, stop.forced) == ("b0", Action.STOP, False)
    assert stop.batch_size == 3
    assert stop.delta_tokens == 4 * 4  # shared depth 4 chunks -> 0
    assert stop.w == 1  # new depth 0: every other waiting request (b1) could follow
    assert policy.last_step.stop_reason == "policy"


def test_starvation_guard_adds_the_oldest_after_max_bypass_admissions() -> None:
    policy = make("feather-static", max_bypass=3)
    group = [3] * 16
    policy.add_request(Request("g0", group + [1] * 4))
    policy.add_request(Request("g1", group + [2] * 4))
    policy.begin_step(StepContext(num_running=0, max_running=100))
    while (c := policy.next_candidate()) is not None:
        policy.admitted(c)
    policy.add_request(Request("loner", [9] * 20))
    for i in range(6):
        policy.add_request(Request(f"g{i + 2}", group + [10 + i] * 4))
    policy.begin_step(StepContext(num_running=2, max_running=100))
    order = []
    while (c := policy.next_candidate()) is not None:
        policy.admitted(c)
        order.append(c)
    assert order[:4] == ["g2", "g3", "g4", "loner"]


def _toy_episodes(policy, episodes: int) -> list[list[int]]:
    """Two interleaved groups; a batch mixing them decodes at a quarter of the speed."""
    batches = []
    for e in range(episodes):
        reqs = []
        for i in range(20):
            g = i % 2
            reqs.append(ToyRequest(e * 100 + i, [g + 1] * 32 + [e * 100 + i] * 4, 1, g))
        logs = run(
            policy,
            reqs,
            max_running=20,
            step_time_s=lambda batch: 1.0 if len({r.group for r in batch}) == 1 else 4.0,
            prefix_read_once=True,
        )
        batches.append([len(s.admitted) for s in logs])
    return batches


@pytest.mark.parametrize("name", ["feather-ucb", "feather-qlearn"])
def test_learners_converge_to_the_better_arm_on_a_toy_reward(name: str, tmp_path) -> None:
    """One-step toy episodes: the kernel-gated rule (asked at every candidate of a kernel that
    reads a common prefix once, credited until the next decision) is the one they fit."""
    name = f"{name}-kernel-gated"
    policy = make(name, seed=3)
    _toy_episodes(policy, 150)
    # Mixing: 20 tokens / 4 s = 5 tok/s; stopping at one group: 10 tokens / 1 s.
    frozen = make(name, policy_file=policy.save(tmp_path / "p.json"), frozen=True)
    assert _toy_episodes(frozen, 3) == [[10, 10]] * 3  # homogeneous batches of one group
    stop_states = [k for k in frozen.table.to_json() if greedy_action(frozen.table, k) == "STOP"]
    assert stop_states


def test_a_frozen_table_stops_only_under_the_kind_of_kernel_it_was_trained_on(tmp_path) -> None:
    """The toy table learns to stop under a kernel that reads the prefix once; recorded as
    trained on cascade, deployed frozen it stops there, and never on a kernel that reads
    each request's KV (there every decision is ADD: batches as FCFS's, both groups mixed);
    trained on a paged kernel, the other way round."""
    trained = make("feather-ucb", seed=3, consult="always")
    _toy_episodes(trained, 150)
    reqs = [ToyRequest(i, [i % 2 + 1] * 32 + [i] * 4, 1, i % 2) for i in range(20)]
    for kernel, stops_where_read_once in (("cascade", True), ("paged", False)):
        trained.trained_on = {"kernel": kernel}
        path = trained.save(tmp_path / f"{kernel}.json")
        for read_once in (True, False):
            frozen = make("feather-ucb", policy_file=path, frozen=True)
            logs = run(frozen, reqs, max_running=20, prefix_read_once=read_once)
            stopped = len(logs[0].admitted) < 20
            assert stopped == (read_once == stops_where_read_once), (kernel, read_once)


def test_ucb_and_q_tables_pick_the_better_arm_under_noise() -> None:
    rng = random.Random(0)
    for table in (UCBTable(exploration=0.5), QTable(gamma=0.0, epsilon_start=0.3)):
        for _ in range(600):
            action = table.choose("s", greedy=False, rng=rng)
            mean_reward = 0.7 if action is Action.STOP else 0.5
            table.update("s", action, mean_reward + rng.uniform(-0.2, 0.2), None)
        assert greedy_action(table, "s") is Action.STOP, type(table).__name__
    assert greedy_action(UCBTable(), "never-seen") is Action.ADD


@pytest.mark.parametrize("table_kind", [UCBTable, QTable])
def test_confident_greedy_stops_only_where_the_evidence_separates_the_actions(table_kind):
    """Rewards 0.1 above and below 0.50 (ADD) and 0.51 (STOP) in turn in one state, 0.50
    and 0.60 in another, 400 of each: the plain greedy choice takes STOP in both, z = 2
    only where the gap is wider than two standard errors of the difference (UCB's sample
    means: 0.007; Q-learning's averages over ~19 targets: 0.032)."""
    plain, confident = table_kind(), table_kind(confidence=2.0)
    for key, stop_mean in (("close", 0.51), ("apart", 0.60)):
        for i in range(400):
            for action, mean_reward in ((Action.ADD, 0.5), (Action.STOP, stop_mean)):
                reward = mean_reward + (0.1 if i % 2 else -0.1)
                for table in (plain, confident):
                    table.update(key, action, reward, None)
    assert confident.standard_error(confident.stats["close"][Action.ADD]) == pytest.approx(
        0.1 / 400**0.5 if table_kind is UCBTable else 0.1 * (0.1 / 1.9) ** 0.5, rel=0.01
    )
    assert greedy_action(plain, "apart") is Action.STOP
    assert greedy_action(confident, "apart") is Action.STOP
    assert greedy_action(confident, "close") is Action.ADD
    assert greedy_action(plain, "close") is Action.STOP
    # one credited action is no evidence against the other: ADD
    lone = table_kind(confidence=2.0)
    for _ in range(5):
        lone.update("s", Action.STOP, 0.9, None)
    assert greedy_action(lone, "s") is Action.ADD
    assert greedy_action(table_kind(), "s") is Action.ADD


def test_confidence_is_saved_with_the_table_and_old_tables_still_load(tmp_path) -> None:
    trained = make("feather-ucb", seed=1, confidence=1.5)
    _toy_episodes(trained, 20)
    data = trained.to_json()
    assert data["learner"]["confidence"] == 1.5
    loaded = make("feather-ucb", policy_file=trained.save(tmp_path / "p.json"), frozen=True)
    assert loaded.table.confidence == 1.5
    # a table saved before the spread was kept: [count, value] per arm, no confidence
    data["table"] = {k: {a: v[:2] for a, v in arms.items()} for k, arms in data["table"].items()}
    del data["learner"]["confidence"]
    (tmp_path / "old.json").write_text(json.dumps(data))
    old = make("feather-ucb", policy_file=tmp_path / "old.json", frozen=True)
    assert old.table.confidence == 0.0
    assert {k: v["action"] for k, v in old.greedy_policy().items()} == {
        k: v["action"] for k, v in trained.greedy_policy().items()
    }
    with pytest.raises(ValueError, match="confidence must be >= 0"):
        make("feather-qlearn", confidence=-1.0)


_KEY = st.tuples(*(st.integers(0, 9) for _ in range(3))).map(lambda t: "b{}|d{}|w{}".format(*t))


def _idx(key: str) -> tuple[int, int, int]:
    b, d, w = (int(part[1:]) for part in key.split("|"))
    return b, d, -w  # larger = more favourable to STOP in each coordinate


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(_KEY, st.sampled_from(list(Action)), max_size=12), _KEY)
def test_unseen_state_stops_only_where_seen_decisions_imply_it(known, key) -> None:
    got = StateBuckets().generalise(key, known)
    if key in known:
        assert got is known[key]
        return
    k = _idx(key)
    below = [a for o, a in known.items() if all(x <= y for x, y in zip(_idx(o), k, strict=True))]
    above = [a for o, a in known.items() if all(x >= y for x, y in zip(_idx(o), k, strict=True))]
    assert got is (
        Action.STOP if Action.STOP in below and Action.ADD not in above else Action.ADD
    )
    # a table that never chose STOP never stops, whatever it is asked
    if Action.STOP not in known.values():
        assert got is Action.ADD


@pytest.mark.parametrize("name", ["feather-ucb", "feather-qlearn"])
def test_frozen_learner_generalises_only_in_the_direction_its_table_implies(name: str) -> None:
    # learned: STOP for batches of 64-127 (b7), ADD for 8-15 (b4), at 1K-4K-token deltas (d3)
    policy = make(name, frozen=True)
    # (w3: 16-63 waiting requests could follow the candidate)
    policy.table.load_json({"b4|d3|w3": {"ADD": [3, 0.8], "STOP": [2, 0.1]},
                            "b7|d3|w3": {"ADD": [3, 0.8], "STOP": [3, 1.0]}})

    def decide(batch: int, delta: int = 3000, w: int = 30) -> Action:
        return policy._decide(DecisionState(batch, delta, w, 256))

    assert decide(100) is Action.STOP and decide(10) is Action.ADD  # seen
    assert decide(200) is Action.STOP  # a larger batch, same prefix: stopping pays more
    assert decide(200, delta=5000) is Action.STOP  # and a longer prefix cut
    # not implied: a smaller batch (the A100 table carried down to 12 groups of 50 with
    # 2K-token prefixes ran at 0.68x FCFS), a shorter prefix, more requests that could follow
    assert decide(40) is Action.ADD
    assert decide(100, delta=800) is Action.ADD
    assert decide(100, w=100) is Action.ADD
    assert decide(100, w=5) is Action.STOP  # fewer could follow: implied
    empty = make(name, frozen=True)
    assert empty._decide(DecisionState(100, 3000, 100, 256)) is Action.ADD


@pytest.mark.parametrize("name", ["feather-ucb", "feather-qlearn"])
def test_save_load_round_trips(name: str, tmp_path) -> None:
    trained = make(name, seed=1)
    _toy_episodes(trained, 20)
    path = trained.save(tmp_path / "policy.json")
    loaded = make(name, policy_file=path, frozen=True)
    assert loaded.to_json() == trained.to_json()
    assert loaded.policy_file_sha256 and len(loaded.policy_file_sha256) == 64
    assert loaded.params()["policy_file_sha256"] == loaded.policy_file_sha256
    before = loaded.to_json()
    _toy_episodes(loaded, 3)
    assert loaded.to_json() == before  # frozen: no learning


def test_a_table_runs_under_the_decision_rule_it_was_trained_with(tmp_path) -> None:
    """Trained asked at every candidate with held STOPs, deployed with the defaults (asked
    only where the kernel reads a prefix once, STOP for one step): the file's rule wins, and
    a file saved before the rule was recorded keeps the constructor's."""
    trained = make("feather-ucb", seed=1, consult="every", stop_holds="group-change")
    _toy_episodes(trained, 5)
    path = trained.save(tmp_path / "p.json")
    deployed = make("feather-ucb", policy_file=path, frozen=True)
    assert (deployed.consult, deployed.stop_holds) == ("every", "group-change")
    assert deployed.params()["stop_holds"] == "group-change"
    data = json.loads(path.read_text())
    del data["decision"]
    (tmp_path / "old.json").write_text(json.dumps(data))
    old = make("feather-ucb", policy_file=tmp_path / "old.json", frozen=True, consult="always")
    assert (old.consult, old.stop_holds) == ("always", "step")
    data["decision"] = {"consult": "sometimes"}
    (tmp_path / "bad.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match="unknown decision rule"):
        make("feather-ucb", policy_file=tmp_path / "bad.json", frozen=True)
    with pytest.raises(ValueError, match="stop_holds must be one of"):
        make("feather-ucb", stop_holds="forever")


def test_policy_file_errors(tmp_path) -> None:
    ucb = make("feather-ucb")
    path = ucb.save(tmp_path / "ucb.json")
    with pytest.raises(ValueError, match="holds a 'ucb' table"):
        make("feather-qlearn", policy_file=path)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="not JSON"):
        make("feather-ucb", policy_file=bad)
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(ValueError, match="format 'something-else'"):
        make("feather-ucb", policy_file=other)


def test_protocol_errors_are_clear() -> None:
    policy = make("feather-static")
    policy.add_request(Request("r", [1, 2, 3, 4]))
    with pytest.raises(PolicyError, match="duplicate request id 'r'"):
        policy.add_request(Request("r", [1, 2, 3, 4]))
    with pytest.raises(TypeError, match="integer token ids"):
        policy.add_request(Request("bad", [1, 2.5, 3]))
    assert policy.num_waiting == 1  # the rejected request left nothing behind
    with pytest.raises(PolicyError, match="admit of unknown request id 'x'"):
        policy.admitted("x")
    with pytest.raises(PolicyError, match="outside a step"):
        policy.next_candidate()
    with pytest.raises(PolicyError, match="engine reports 3 running requests"):
        policy.begin_step(StepContext(num_running=3, max_running=4))
    with pytest.raises(ValueError, match="prompt_token_ids or chunk_hashes"):
        Request("empty")
    policy.begin_step(StepContext(num_running=0, max_running=4))
    assert policy.next_candidate() == "r"
    with pytest.raises(PolicyError, match="neither admitted nor refused"):
        policy.next_candidate()


def test_report_step_reward_is_throughput() -> None:
    assert StepOutcome(batch_size=4, tokens=8, step_time_s=0.5).throughput_tok_s == 16.0


def test_reward_signals_differ_only_in_whether_prefill_steps_count() -> None:
    """After a decision: one prefill step (10 tokens in 0.5 s), two decode steps (40 tokens in
    0.5 s each). The paper's decode reward is 80 tok/s, the all-steps one 90 / 1.5 = 60; the
    reference's one-step reward is the first step's batch over its time, 8 / 0.5 = 16."""
    steps = (StepOutcome(8, 10, 0.5, prefill_tokens=3000), StepOutcome(8, 40, 0.5),
             StepOutcome(8, 40, 0.5))  # fmt: skip
    for signal, expected in (("decode", 0.8), ("all-steps", 0.6), ("one-step", 0.16)):
        policy = make("feather-ucb", reward_scale_tok_s=100.0, reward_signal=signal)
        window = _Window([("b4|d3|w3", Action.ADD)], policy._totals.snapshot(), 0)
        policy._windows = deque([window])
        for outcome in steps:
            policy.report_step(outcome)
        if policy._windows:
            policy._credit(window)
        assert policy.table.stats["b4|d3|w3"][Action.ADD].value == pytest.approx(expected)
        assert policy.params()["reward_signal"] == signal


def decide_then_report(policy, key: str, outcome: StepOutcome) -> None:
    """One step of a learner that took one decision in state `key`."""
    policy._decided_step, policy._step_decisions = policy._step, [(key, Action.ADD)]
    policy.report_step(outcome)
    policy._step += 1


def test_a_horizon_window_is_not_cut_short_by_later_decisions() -> None:
    """Decisions in two consecutive steps, then decode steps at 40 and 80 tok/s: with
    "until-next" the first decision is judged on its one step (40), with "horizon" on the
    three steps of its horizon (40 + 80 + 80 tokens in 3 s: 66.7), the second on its own
    three (80)."""
    slow, fast = StepOutcome(8, 40, 1.0), StepOutcome(8, 80, 1.0)
    values = {}
    for window in ("until-next", "horizon"):
        policy = make("feather-qlearn", reward_scale_tok_s=200.0, reward_horizon=3,
                      reward_window=window, alpha=1.0, gamma=0.0)  # fmt: skip
        decide_then_report(policy, "first", slow)
        decide_then_report(policy, "second", fast)
        for _ in range(4):
            policy.report_step(fast)
            policy._step += 1
        stats = policy.table.stats
        values[window] = (stats["first"][Action.ADD].value, stats["second"][Action.ADD].value)
        assert policy.params()["reward_window"] == window
    assert values["until-next"] == pytest.approx((0.2, 0.4))
    assert values["horizon"] == pytest.approx((200 / 3 / 200, 0.4))
    with pytest.raises(ValueError, match="reward_window must be one of"):
        make("feather-ucb", reward_window="forever")
    with pytest.raises(ValueError, match="reward_signal must be one of"):
        make("feather-ucb", reward_signal="makespan")


def test_a_lifetime_window_runs_until_a_prefix_group_starts_or_stops_running() -> None:
    """Decisions at steps 0 and 2, decode at 40 tok/s then 80; a group starts running before
    step 4 (at 40 tok/s). "lifetime" judges both on the batch they formed, steps 0-3 and 2-3
    (70 and 80 tok/s), longer than `reward_horizon` (2) and not on step 4; "until-next" cuts
    the first at step 2 (60), "horizon" runs the second into step 4 (60). A group that
    starts within a window's first `reward_horizon` steps does not end it (the third)."""
    slow, fast = StepOutcome(8, 40, 1.0), StepOutcome(8, 80, 1.0)
    values = {}
    for window in REWARD_WINDOWS:
        policy = make("feather-qlearn", reward_scale_tok_s=200.0, reward_horizon=2,
                      reward_window=window, alpha=1.0, gamma=0.0)  # fmt: skip
        decide_then_report(policy, "first", slow)
        policy.report_step(fast)
        policy._step += 1
        decide_then_report(policy, "second", fast)
        policy.report_step(fast)
        policy._step += 1
        policy.cht._group_changes += 1  # a new group's first request was admitted
        decide_then_report(policy, "third", slow)
        policy.cht._group_changes += 1  # and another's, one step into the third's window
        policy.report_step(fast)
        policy._step += 1
        stats = policy.table.stats
        values[window] = tuple(
            stats[k][Action.ADD].value if k in stats else None for k in ("first", "second")
        )
        if window == "lifetime":
            assert "third" not in stats  # one step old: still open, not credited
            policy.report_step(fast)  # two steps (40 and 80 tok/s), groups changed: closed
            assert stats["third"][Action.ADD].value == pytest.approx(60 / 200)
    assert values["lifetime"] == pytest.approx((70 / 200, 80 / 200))
    assert values["until-next"] == pytest.approx((60 / 200, 80 / 200))
    assert values["horizon"] == pytest.approx((60 / 200, 80 / 200))


def test_lifetime_windows_see_one_running_set_of_groups_on_a_run() -> None:
    """On a run (4 interleaved groups, random outputs, the rule asked at every candidate),
    every credited lifetime window (at least one step) spans steps whose running prefix
    groups are the same."""
    requests = grouped_requests(4, 6, prefix=64, suffix=5, output_len=lambda i: 2 + i % 7)
    group_of = {r.req_id: r.group for r in requests}
    policy = make("feather-ucb", min_share_tokens=32, consult="every", reward_horizon=1,
                  reward_window="lifetime", reward_scale_tok_s=10.0)  # fmt: skip
    groups_per_step: list[frozenset[int]] = []
    credited: list[tuple[int, int]] = []  # (first step, steps)

    def record(p) -> None:
        groups_per_step.append(
            frozenset(group_of[r] for r, st_ in p._state.items() if st_.name == "RUNNING")
        )

    credit = policy._credit

    def spy(window) -> None:
        first = window.start[4]
        credited.append((first, window.steps(policy._totals)))
        credit(window)

    policy._credit = spy
    run(policy, requests, max_running=6, on_step=record)
    assert policy.updates > 0 and len(credited) > 5
    assert any(steps > 1 for _, steps in credited)
    for first, steps in credited:
        assert steps >= 1
        assert len(set(groups_per_step[first : first + steps])) == 1, (first, steps)


@pytest.mark.parametrize("holds", ["step", "group-change"])
def test_a_held_stop_keeps_new_groups_out_until_the_running_groups_change(holds) -> None:
    """Two groups of 4 (group 0 first, outputs 3-6 steps), 8 slots, the rule asked where a
    candidate changes the groups and answering STOP the first time a second group could
    open, ADD after. "step": the table is asked again the next step and group 1 opens then;
    "group-change": group 1's candidates are held back without asking until group 0 has
    drained (its last request finished), and then starts a batch of its own."""
    requests = [ToyRequest(i, [g] * 40 + [100 + i] * 4, output_len=3 + i % 4, group=g)
                for g in (0, 1) for i in range(4 * g, 4 * g + 4)]  # fmt: skip
    policy = make("feather-ucb", consult="group", stop_holds=holds)
    asked: list[tuple[int, DecisionState]] = []

    def scripted(state: DecisionState) -> Action:
        asked.append((policy._step, state))
        opens = not state.joins_group
        first_opening = opens and sum(not st_.joins_group for _, st_ in asked) == 1
        return Action.STOP if first_opening else Action.ADD

    policy._decide = scripted
    logs = run(policy, requests, max_running=8)
    opened = next(i for i, log in enumerate(logs) if 1 in log.groups)
    opening = [step for step, state in asked if not state.joins_group]
    stop_step = opening[0]
    if holds == "step":
        assert opened == stop_step + 1 and policy.held_stops == 0
        assert 0 in logs[opened].groups  # mixed: group 0 still runs
    else:
        assert opened > stop_step + 1 and policy.held_stops == opened - stop_step - 1
        assert logs[opened].groups == {1}  # group 0 drained first: the batch stayed homogeneous
        assert opening == [stop_step]  # not asked while held; group 1 then starts a new batch


def test_decision_states_count_running_prefix_groups_and_whether_the_candidate_joins() -> None:
    """The learners' context dimensions against the toy engine's own view: at every
    delegated decision, the distinct prefix groups among running requests, and whether the
    candidate's group is one of them (requests interleaved over 4 prefixes, random outputs,
    the rule asked at every candidate and answering at random)."""
    requests = grouped_requests(4, 6, prefix=64, suffix=5, output_len=lambda i: 2 + i % 5)
    group_of = {r.req_id: r.group for r in requests}
    rng = random.Random(3)
    seen: list[tuple[DecisionState, int, set[int]]] = []

    class Recording(FeatherStaticPolicy):
        def _decide(self, state: DecisionState) -> Action:
            running = {group_of[r] for r, st_ in self._state.items() if st_.name == "RUNNING"}
            seen.append((state, group_of[self._candidate], running))
            return rng.choice(list(Action))

    run(Recording(chunk_size=4, min_share_tokens=32, consult="every"), requests, max_running=6)
    assert len(seen) > 20
    assert any(s.groups_running >= 2 for s, _, _ in seen) and any(s.joins_group for s, _, _ in seen)
    assert any(not s.joins_group and s.batch_size > 0 for s, _, _ in seen)
    for state, group, running in seen:
        assert state.groups_running == len(running)
        assert state.joins_group == (group in running)


def test_state_keys_carry_the_context_dimensions_and_generalise_only_within_them() -> None:
    plain = StateBuckets()
    rich = StateBuckets.from_json({**plain.to_json(), "groups": [1, 2, 4], "joins": True})
    assert plain.key(8, 2000, 20, groups=3, joins=True) == "b4|d3|w3"  # old keys unchanged
    assert rich.key(8, 2000, 20, groups=3, joins=True) == "b4|d3|w3|g2|j1"
    assert rich.key(8, 2000, 20, groups=0, joins=False) == "b4|d3|w3|g0|j0"
    assert StateBuckets.from_json(rich.to_json()) == rich
    assert StateBuckets.from_json({"batch": [1, 2], "delta_tokens": [1], "w": [1]}).groups is None
    with pytest.raises(ValueError, match="unknown bucket dimension"):
        StateBuckets.from_json({"batch": [1], "kv_headroom": [1]})
    # a STOP learned with one group running implies STOP for a larger batch with one group,
    # never for a state whose running set is mixed or whose candidate opens a group
    known = {"b4|d3|w3|g1|j1": Action.STOP}
    assert rich.generalise("b5|d3|w3|g1|j1", known) is Action.STOP
    assert rich.generalise("b5|d3|w3|g2|j1", known) is Action.ADD
    assert rich.generalise("b5|d3|w3|g1|j0", known) is Action.ADD


@pytest.mark.parametrize("table", [UCBTable(), QTable(epsilon_start=0.0, epsilon_min=0.0)])
def test_a_choice_awaiting_its_reward_counts_as_tried(table) -> None:
    """Rewards arrive steps after a decision; a state asked again before that must not take
    the 'untried' action again: each action once, then, once credited, the better one."""
    rng = random.Random(0)
    first = table.choose("s", greedy=False, rng=rng)
    second = table.choose("s", greedy=False, rng=rng)
    assert {first, second} == {Action.ADD, Action.STOP}
    table.update("s", Action.ADD, 0.9, None)
    table.update("s", Action.STOP, 0.1, None)
    assert table.pending["s"] == {Action.ADD: 0, Action.STOP: 0}
    assert table.choose("s", greedy=False, rng=rng) is Action.ADD


def test_group_consultation_asks_only_where_the_candidate_changes_the_running_groups() -> None:
    """consult="group": every delegated decision either cuts the shared prefix or opens a
    group that does not run; a candidate joining a running group is a forced ADD. "every"
    asks at those candidates too."""
    requests = grouped_requests(4, 6, prefix=64, suffix=5, output_len=lambda i: 2 + i % 5)
    asked: dict[str, list[DecisionState]] = {}
    for consult in ("group", "every"):
        rng = random.Random(5)
        seen = asked.setdefault(consult, [])

        class Recording(FeatherStaticPolicy):
            def _decide(self, state: DecisionState, seen=seen, rng=rng) -> Action:
                seen.append(state)
                return rng.choice(list(Action))

        run(Recording(chunk_size=4, min_share_tokens=32, consult=consult), requests,
            max_running=6)  # fmt: skip
    assert asked["group"] and all(s.delta_tokens > 0 or not s.joins_group for s in asked["group"])
    assert any(s.joins_group and s.delta_tokens == 0 for s in asked["every"])


def test_feather_nostop_is_the_candidate_order_with_every_decision_an_add() -> None:
    """Feather without STOP admits exactly what any Feather rule admits when never consulted,
    even on a kernel where feather-static stops; it refuses to be consulted."""
    reqs = grouped_requests(8, 12, prefix=1024, suffix=8, output_len=lambda i: 5 + i % 5)
    decisions = []
    nostop = run(make("feather-nostop"), reqs, max_running=12, prefix_read_once=True,
                 on_step=lambda p: decisions.extend(p.last_step.decisions))
    never = run(make("feather-static", min_batch=6, consult="never"), reqs, max_running=12,
                prefix_read_once=True)
    stopping = run(make("feather-static", min_batch=6), reqs, max_running=12,
                   prefix_read_once=True)
    assert [s.admitted for s in nostop] == [s.admitted for s in never]
    assert decisions and all(d.action is Action.ADD and d.forced for d in decisions)
    assert [s.admitted for s in stopping] != [s.admitted for s in never]  # STOP changes it
    with pytest.raises(ValueError, match="consult must be 'never'"):
        make("feather-nostop", consult="every")
