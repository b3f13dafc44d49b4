"""The simulator's engine and KV pool: invariants under every policy, both engine modes."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from feather.policies import create_scheduler
from feather.sim.engine import Engine, EngineConfig
from feather.sim.kv_pool import BlockPool
from feather.sim.sched_cost import SchedulingCostModel
from feather.workloads import load_workload

ZERO = SchedulingCostModel.zero()
POLICIES = ("fcfs", "lpm", "dfs-weight", "feather-static", "feather-ucb", "feather-qlearn")


def policy(name: str):
    return (
        create_scheduler(name, chunk_size=16)
        if name.startswith("feather")
        else create_scheduler(name)
    )


class CheckingCost:
    """A stand-in step time (1 ms + 1 us per token) that checks the pool at every step."""

    def __init__(self) -> None:
        self.engine: Engine | None = None
        self.steps = 0

    def __call__(self, batch):
        pool = self.engine.pool
        pool.check_invariants()
        assert pool.num_used <= pool.num_blocks
        held = {req.id: pool.blocks_of(req.id) for req in self.engine.running}
        for seq in batch.seqs:  # every block a sequence reads is one it holds (never evicted)
            assert any(
                list(seq.block_ids) == blocks[: len(seq.block_ids)] for blocks in held.values()
            )
        self.steps += 1
        return SimpleNamespace(time_s=1e-3 + 1e-6 * sum(s.new_tokens for s in batch.seqs))


def run(workload, name: str, **config):
    cost = CheckingCost()
    engine = Engine(workload.requests, policy(name), EngineConfig(**config), cost, ZERO)
    cost.engine = engine
    return engine, engine.run()


@pytest.mark.parametrize("mode", ["vllm", "sglang"])
@pytest.mark.parametrize("name", POLICIES)
def test_every_request_completes_with_its_output_length_under_memory_pressure(mode, name):
    w = load_workload(
        "synthetic:groups=4,per_group=12,prefix=200,suffix=40,output=30,order=shuffled,seed=1"
    )
    # 60 blocks of 16 tokens: far less than 48 requests x 270 tokens, so requests wait,
    # get refused, and running ones get preempted.
    engine, result = run(
        w, name, mode=mode, num_blocks=60, max_num_seqs=16, max_num_batched_tokens=256
    )
    assert all(r.num_output == r.output_len for r in result.requests)
    assert all(r.finish_s is not None and r.first_token_s <= r.finish_s for r in result.requests)
    sampled = sum(s.sampled_tokens for s in result.steps)
    assert sampled == sum(r.output_len for r in result.requests)  # none lost or repeated
    assert engine.pool.num_used == 0  # everything was given back
    assert not engine.running and not engine.waiting


def test_preemption_happens_and_recomputes_without_losing_tokens() -> None:
    w = load_workload("synthetic:groups=2,per_group=10,prefix=64,suffix=64,output=120,seed=2")
    _, result = run(w, "fcfs", num_blocks=40, max_num_seqs=16, max_num_batched_tokens=512)
    assert sum(r.preemptions for r in result.requests) > 0
    assert sum(s.preempted for s in result.steps) == sum(r.preemptions for r in result.requests)
    assert all(r.num_output == r.output_len for r in result.requests)


def test_prefix_cache_hits_within_a_group_and_only_whole_blocks() -> None:
    w = load_workload(
        "synthetic:groups=1,per_group=5,prefix=100,suffix=10,output=2,order=grouped,seed=3"
    )
    _, result = run(w, "fcfs", num_blocks=100, max_num_batched_tokens=4096)
    first = result.steps[0]
    assert first.admitted == 5
    # the first request computes everything; the 4 others hit 6 whole blocks (96 tokens) of
    # the 100-token prefix, cached the moment the first request's blocks were allocated
    assert first.cache_hit_tokens == 4 * 96
    assert first.prefill_tokens == 110 + 4 * 14


def test_feather_keeps_batches_homogeneous_in_the_engine() -> None:
    w = load_workload(
        "synthetic:groups=4,per_group=20,prefix=512,suffix=16,output=8,order=shuffled,seed=4"
    )
    _, fcfs = run(w, "fcfs", num_blocks=4000, max_num_seqs=64, prefix_read_once=True)
    # the rule is asked where the kernel reads the common prefix once (cascade); thresholds
    # that let a 20-request group of 512-token prefixes stop (the defaults need half the slots
    # and 1024 tokens: docs/stop.md)
    static = create_scheduler("feather-static", chunk_size=16, min_batch=2, min_delta_tokens=256)
    cost = CheckingCost()
    engine = Engine(w.requests, static,
                    EngineConfig(num_blocks=4000, max_num_seqs=64, prefix_read_once=True),
                    cost, ZERO)
    cost.engine = engine
    feather = engine.run()

    def groups(result):
        return [len({s.group for s in step.batch.seqs}) for step in result.steps]

    assert max(groups(fcfs)) == 4  # arrival order mixes every group into the 64-wide batch
    assert max(groups(feather)) == 1  # one group at a time: 20 requests, then STOP
    assert max(len(step.batch.seqs) for step in feather.steps) == 20


def test_requests_too_large_for_the_pool_and_stalling_policies_fail_clearly() -> None:
    w = load_workload("synthetic:groups=1,per_group=2,prefix=64,suffix=0,output=64")
    with pytest.raises(ValueError, match="need more KV blocks than the whole pool"):
        Engine(w.requests, policy("fcfs"), EngineConfig(num_blocks=4), lambda b: None, ZERO)

    class Never(create_scheduler("fcfs").__class__):
        name = "never"

        def _choose(self):
            return None

    engine = Engine(w.requests, Never(), EngineConfig(num_blocks=64), CheckingCost(), ZERO)
    with pytest.raises(RuntimeError, match="admitted nothing into an idle engine"):
        engine.run()


def test_arrivals_delay_admission_and_the_clock_jumps_over_idle_time() -> None:
    w = load_workload(
        "synthetic:groups=1,per_group=3,prefix=32,suffix=8,output=4,arrival=bursts:1:5.0"
    )
    _, result = run(w, "fcfs", num_blocks=64)
    for r in result.requests:
        assert r.admitted_s >= r.arrival_s
    assert result.makespan_s > 10.0  # the last request arrives at 10 s


# ---- the block pool against a plain-list reference ---------------------------------------
class Reference:
    """vLLM's free-queue rules with lists: head = next to reuse, hashed blocks to the tail."""

    def __init__(self, n: int, bs: int) -> None:
        self.bs, self.free, self.ref = bs, list(range(n)), [0] * n
        self.hash, self.cached, self.held = [None] * n, {}, {}

    def allocate(self, seq, tokens, hit):
        held = self.held.get(seq, [])
        need = max(0, -(-tokens // self.bs) - len(held) - len(hit))
        need += sum(1 for b in hit if self.ref[b] == 0)
        if need > len(self.free):
            return False
        held = self.held.setdefault(seq, [])
        for b in hit:
            if self.ref[b] == 0:
                self.free.remove(b)
            self.ref[b] += 1
            held.append(b)
        while len(held) * self.bs < tokens:
            b = self.free.pop(0)
            if self.hash[b] is not None:
                if self.cached.get(self.hash[b]) == b:
                    del self.cached[self.hash[b]]
                self.hash[b] = None
            self.ref[b] = 1
            held.append(b)
        return True

    def cache(self, seq, hashes, tokens):
        for i in range(min(tokens // self.bs, len(self.held.get(seq, [])), len(hashes))):
            b = self.held[seq][i]
            if self.hash[b] is None:
                self.hash[b] = hashes[i]
                self.cached.setdefault(hashes[i], b)

    def free_seq(self, seq):
        for b in reversed(self.held.pop(seq, [])):
            self.ref[b] -= 1
            if self.ref[b] == 0:
                if self.hash[b] is None:
                    self.free.insert(0, b)
                else:
                    self.free.append(b)

    def hit(self, hashes, max_tokens):
        out = []
        for h in hashes[: max_tokens // self.bs]:
            if h not in self.cached:
                break
            out.append(self.cached[h])
        return out


class PoolMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.pool, self.ref = BlockPool(12, 4), Reference(12, 4)
        self.seqs: dict[int, list] = {}
        self.next = 0

    @rule(prefix=st.integers(0, 3), length=st.integers(1, 30))
    def new_sequence(self, prefix: int, length: int) -> None:
        """A sequence whose hashes share `prefix`'s family for its first blocks."""
        seq = self.next
        self.next += 1
        hashes = [(prefix, k) if k < 3 else (prefix, k, seq) for k in range(length // 4)]
        hit = self.pool.longest_hit(hashes, length - 1)
        assert hit == self.ref.hit(hashes, length - 1)
        ok = self.pool.allocate(seq, length, hit)
        assert ok == self.ref.allocate(seq, length, hit)
        if ok:
            self.pool.cache_full_blocks(seq, hashes, length)
            self.ref.cache(seq, hashes, length)
            self.seqs[seq] = hashes

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def grow(self, data) -> None:
        seq = data.draw(st.sampled_from(sorted(self.seqs)))
        tokens = len(self.pool.blocks_of(seq)) * 4 + data.draw(st.integers(1, 8))
        assert self.pool.allocate(seq, tokens) == self.ref.allocate(seq, tokens, [])

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def step_in_place(self, data) -> None:
        """The engine skips allocate + cache_full_blocks for a running sequence where `covers`
        says so: exactly where the two would change neither its blocks nor its registered
        count (given its hashes, which the engine extends as tokens are generated)."""
        seq = data.draw(st.sampled_from(sorted(self.seqs)))
        tokens = data.draw(st.integers(1, len(self.pool.blocks_of(seq)) * 4 + 4))
        hashes = self.seqs[seq]
        hashes += [("generated", seq, k) for k in range(len(hashes), tokens // 4)]
        before = (list(self.pool.blocks_of(seq)), self.pool._registered.get(seq, 0))
        covered = self.pool.covers(seq, tokens)
        ok = self.pool.allocate(seq, tokens)
        assert ok == self.ref.allocate(seq, tokens, [])
        if ok:
            self.pool.cache_full_blocks(seq, hashes, tokens)
            self.ref.cache(seq, hashes, tokens)
        after = (list(self.pool.blocks_of(seq)), self.pool._registered.get(seq, 0))
        assert covered == (ok and before == after)

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def finish(self, data) -> None:
        seq = data.draw(st.sampled_from(sorted(self.seqs)))
        del self.seqs[seq]
        self.pool.free(seq)
        self.ref.free_seq(seq)

    @invariant()
    def same_state(self) -> None:
        self.pool.check_invariants()
        assert list(self.pool._free) == self.ref.free
        assert self.pool._cached == self.ref.cached
        assert self.pool.num_used + self.pool.num_free == 12


TestPoolAgainstReference = PoolMachine.TestCase
TestPoolAgainstReference.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None
)


def test_fixed_batches_drain_one_batch_before_the_next() -> None:
    from feather.policies.fixed_batches import FixedBatchesPolicy, plan_batches

    w = load_workload(
        "synthetic:groups=3,per_group=6,prefix=64,suffix=8,output=5,order=shuffled,seed=5"
    )
    homogeneous = plan_batches(w.requests, "homogeneous", 4)
    assert [len(b) for b in homogeneous] == [4, 2, 4, 2, 4, 2]
    assert all(len({rid.split("/")[1] for rid in b}) == 1 for b in homogeneous)
    mixed = plan_batches(w.requests, "mixed", 6)
    assert all(len({rid.split("/")[1] for rid in b}) == 3 for b in mixed)
    for plan in (homogeneous, mixed):
        policy = FixedBatchesPolicy(batches=plan)
        engine = Engine(w.requests, policy, EngineConfig(num_blocks=500), CheckingCost(), ZERO)
        engine.cost_fn.engine = engine
        result = engine.run()
        batches_seen = [{s.group for s in st.batch.seqs} for st in result.steps]
        running = [len(st.batch.seqs) for st in result.steps]
        assert max(running) == max(len(b) for b in plan)
        # every step runs members of exactly one planned batch
        member = {rid: i for i, b in enumerate(plan) for rid in b}
        finished_order = sorted(result.requests, key=lambda r: r.finish_s)
        assert [member[r.id] for r in finished_order] == sorted(
            member[r.id] for r in finished_order
        )
        assert batches_seen


def test_c2_workload_puts_k_divergent_requests_in_one_batch() -> None:
    from feather.policies.fixed_batches import plan_batches

    w = load_workload("synthetic:groups=1,per_group=100,prefix=256,suffix=16,unshared=0.03")
    (batch,) = plan_batches(w.requests, "mixed", 100)
    groups = {r.request_id: r.group_id for r in w.requests}
    assert sum(groups[rid].startswith("unshared/") for rid in batch) == 3


def test_kernel_order_follows_vllms_persistent_batch() -> None:
    """A finished request leaves a hole a new one fills; otherwise the last moves in."""
    import numpy as np

    from feather.workloads.schema import WorkloadRequest

    def request(name: str, output: int, arrival: float = 0.0) -> WorkloadRequest:
        tokens = np.arange(40, dtype=np.int32) + 1000 * ord(name)
        return WorkloadRequest(name, "t", "t", [name, name], [0, 0], tokens, output, arrival)

    layouts = []

    class Recording(CheckingCost):
        def __call__(self, batch):
            layouts.append(
                "".join(
                    self.engine.rule.slots[i].id
                    for i in range(len(self.engine.rule.slots))
                    if self.engine.rule.slots[i] is not None
                )
            )
            return super().__call__(batch)

    w = [
        request("A", 6),
        request("B", 2),
        request("C", 6),
        request("D", 6),
        request("E", 3, arrival=0.0021),
    ]
    cost = Recording()
    engine = Engine(w, policy("fcfs"), EngineConfig(num_blocks=64, max_num_seqs=4), cost, ZERO)
    cost.engine = engine
    engine.run()
    assert layouts[0] == "ABCD"
    assert "AECD" in layouts  # B finished; E arrived and took B's slot
    assert layouts[-1] in ("A", "AC", "ACD", "ADC", "AD")  # condensed, never a gap
