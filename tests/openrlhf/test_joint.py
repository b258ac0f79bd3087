"""HACPO on OpenRLHF (issue 11), against the real openrlhf==0.11.2 classes on CPU.

Three agents with tiny local models: two share the character tokenizer (ids reused), one has the word
tokenizer (text decoded and re-encoded). Rows are made by OpenRLHF's own ``_process_response_into_experience``
from vLLM-shaped responses, log-probs by OpenRLHF's ``Actor``; then:
- own/cross rows: ids, masks, ratio denominators and rewards as the local engine's functions give them;
- per-row fields survive OpenRLHF's split → remove padding → make_experience_batch, rows in any order;
- advantages grouped by prompt id (shuffled rows) equal hacpo.algo's, for HACPO, Naive and the ablations;
- the training step (HacpoActorTrainer: forward, loss, backward per micro-batch, gradient accumulation,
  DP normalisers) gives per optimizer step the gradient of hacpo.algo.policy_loss on that step's rows;
- with own rows only, the loss equals OpenRLHF's PolicyLoss(gspo) plus its k3 KL loss.
"""

from __future__ import annotations

import copy
import math
import random
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from real_stack import on_this_machine, require  # noqa: E402

require("openrlhf", "vllm")
on_this_machine()

from openrlhf.models import Actor, PolicyLoss  # noqa: E402
from openrlhf.models.loss import aggregate_loss  # noqa: E402
from openrlhf.models.utils import compute_approx_kl  # noqa: E402
from openrlhf.trainer.ppo_utils.experience import (  # noqa: E402
    Experience,
    make_experience_batch,
    remove_padding_in_sequences,
    split_experience_batch,
)
from openrlhf.trainer.ppo_utils.samples_generator import SamplesGenerator  # noqa: E402

from hacpo.agents.models import AgentArch, build_model  # noqa: E402
from hacpo.agents.prompting import prompt_text  # noqa: E402
from hacpo.agents.retokenize import cross_tokens  # noqa: E402
from hacpo.agents.tokenizers import build_tokenizer  # noqa: E402
from hacpo.algo import (  # noqa: E402
    MiniBatch,
    get_method,
    joint_advantages,
    metric_floats,
    policy_loss,
    seq_mean_logp,
)
from hacpo.data.synthetic import Problem  # noqa: E402
from hacpo.engines.core.metrics import aggregate  # noqa: E402
from hacpo.engines.openrlhf.joint import rows as R  # noqa: E402
from hacpo.engines.openrlhf.joint.actor import HacpoActorTrainer  # noqa: E402
from hacpo.engines.openrlhf.joint.loss import StepNorm, microbatch_loss, step_norm  # noqa: E402

G = 4
MAX_NEW = 24
MAX_LEN = 160
ANSWERS = ["12", "7", "105", "3"]


# ---------------------------------------------------------------------------------------- fixtures
class AgentStack(SimpleNamespace):
    """One agent: tokenizer, OpenRLHF Actor over a tiny model, reference Actor."""


def _agent(root: Path, kind: str, arch: str, seed: int) -> AgentStack:
    """Saved to disk and loaded by OpenRLHF's Actor from the path (float32 here), as PolicyModelActor does."""
    tok = build_tokenizer(kind)
    shape = AgentArch(arch=arch, hidden=32, layers=1, heads=2, intermediate=64)
    actors, paths = [], []
    for name, s in (("actor", seed), ("ref", seed + 100)):
        path = root / f"{kind}-{arch}-{seed}-{name}"
        build_model(shape, tok, s).save_pretrained(path)
        tok.save_pretrained(path)
        actor = Actor(str(path), attn_implementation="sdpa", param_dtype="bf16")
        actors.append(actor.float())  # CPU autograd checks at float32; OpenRLHF's default dtype is bf16
        paths.append(path)
    return AgentStack(tok=tok, actor=actors[0].train(), ref=actors[1].eval(), path=paths[0])


@pytest.fixture(scope="module")
def agents(tmp_path_factory) -> list[AgentStack]:
    root = tmp_path_factory.mktemp("agents")
    return [
        _agent(root, "char", "llama", 0),
        _agent(root, "word", "qwen3", 1),
        _agent(root, "char", "qwen3", 2),
    ]


def _problems() -> list[Problem]:
    return [Problem(id=f"p{i}", problem=f"{i + 3}+{i * 2}", answer=a, family="add2", difficulty=1)
            for i, a in enumerate(ANSWERS)]  # fmt: skip


def _response_texts(rng: random.Random) -> list[str]:
    pool = ["\\boxed{12}", "5+7=12 so \\boxed{12}", "\\boxed{7}", "I think 105", "3", "\\boxed{3} done",
            "x", "", "\\frac{1}{2}"]  # fmt: skip
    return [rng.choice(pool) for _ in range(G)]


def _own_rows(agent: AgentStack, k: int, problems, rng: random.Random) -> tuple[list[Experience], list[int]]:
    """Agent k's rollouts as OpenRLHF makes them from vLLM responses (one per sample), with old and
    reference log-probs from OpenRLHF's Actor (what make_experience attaches), split as the buffer holds."""
    tok, rows, pids = agent.tok, [], []
    for pid, p in enumerate(problems):
        prompt = tok(prompt_text(tok, p, "compact"), add_special_tokens=False)["input_ids"]
        for text in _response_texts(rng):
            resp = tok(text, add_special_tokens=False)["input_ids"]
            truncated = rng.random() < 0.25 and len(resp) > 0  # no EOS: cut at the length limit
            resp = resp[:MAX_NEW] + ([] if truncated else [tok.eos_token_id])
            reward = float(p.answer in text)
            response = {
                "observation_tokens": prompt + resp,
                "action_ranges": [(len(prompt), len(prompt) + len(resp))],
                "reward": reward, "scores": reward, "rollout_log_probs": None, "truncated": truncated,
                "prompt": prompt_text(tok, p, "compact"), "label": p.answer,
                "extra_logs": {"reward_error": 0.0},
            }  # fmt: skip
            rows.append(SamplesGenerator._process_response_into_experience(None, response, max_len=MAX_LEN))
            pids.append(pid)
    batch = Experience.concat_experiences(rows, tok.pad_token_id)
    with torch.no_grad():
        batch.action_log_probs = agent.actor(batch.sequences, batch.action_mask, batch.attention_mask)
        batch.base_action_log_probs = agent.ref(batch.sequences, batch.action_mask, batch.attention_mask)
    batch.info["kl"] = torch.zeros(len(rows))
    items = remove_padding_in_sequences(split_experience_batch(batch))
    R.mark_own(items, k, pids)
    return items, pids


@pytest.fixture(scope="module")
def step(agents):
    """One joint step's rows: own rows per agent, then each learner's buffer (own + cross), ω given."""
    rng = random.Random(0)
    problems = _problems()
    own = [_own_rows(a, k, problems, rng)[0] for k, a in enumerate(agents)]
    omegas = torch.tensor([[1.0, 2.0, 0.5], [0.5, 1.0, 0.25], [2.0, 4.0, 1.0]], dtype=torch.float64)
    return SimpleNamespace(problems=problems, own=own, omegas=omegas)


def _buffer(agents, step, k: int, method) -> list[Experience]:
    own = step.own
    rows = [copy.deepcopy(r) for r in own[k]]  # advantages are per learner: never share row objects
    prompts = R.learner_prompts(own[k])
    for j in range(len(agents)):
        if j != k:
            rows += R.cross_rows(own[j], agents[j].tok, agents[k].tok, prompts, float(step.omegas[j, k]),
                                 MAX_NEW, MAX_LEN)  # fmt: skip
    random.Random(k).shuffle(rows)  # arrival order must not matter: groups come from prompt ids
    return R.assign_advantages(rows, k, len(agents), step.omegas, method)  # the rows the method keeps


# ---------------------------------------------------------------------------------------- rows
def test_cross_rows_match_the_local_text_exchange(agents, step):
    """Cross rows = the learner's prompt + cross_tokens' ids (the local engine's exchange); the ratio
    denominator = the source's mean old log-prob over the shared tokens (EOS excluded when re-encoded)."""
    for k, j in [(0, 2), (0, 1), (1, 0)]:  # same tokenizer (char/char), char→word... word→char
        src, learner = agents[j], agents[k]
        prompts = R.learner_prompts(step.own[k])
        cross = R.cross_rows(
            step.own[j], src.tok, learner.tok, prompts, float(step.omegas[j, k]), MAX_NEW, MAX_LEN
        )
        responses = [R.response_ids(r) for r in step.own[j]]
        want = cross_tokens(src.tok, learner.tok, responses, MAX_NEW)
        assert want.reused == ((k, j) == (0, 2))
        for row, own_row, ids, n_src in zip(cross, step.own[j], want.ids, want.source_len, strict=True):
            pid = int(own_row.info[R.PROMPT_ID])
            assert R.prompt_ids(row) == prompts[pid]
            assert R.response_ids(row) == ids
            assert int(row.action_mask.sum()) == len(ids)
            lp = R.response_logp(own_row)
            assert float(row.info[R.OLD_MEAN_LOGP]) == pytest.approx(
                float(lp[:n_src].mean()) if n_src else 0.0, abs=1e-6
            )
            assert float(row.rewards) == float(own_row.rewards)
            assert float(row.info[R.IS_SELF]) == 0 and float(row.info[R.SOURCE]) == j
            assert float(row.info[R.OMEGA]) == pytest.approx(float(step.omegas[j, k]))
        if want.reused:  # same tokenizer: EOS reused, and the denominator is the source's own mean
            assert [float(r.info[R.OLD_MEAN_LOGP]) for r in cross] == pytest.approx(
                [float(r.info[R.OLD_MEAN_LOGP]) for r in step.own[j]], abs=1e-9)  # fmt: skip


def test_own_row_denominator_is_the_local_seq_mean(step):
    for row in step.own[0]:
        lp = row.action_log_probs.reshape(1, -1)
        mask = row.action_mask.reshape(1, -1).bool()
        assert float(row.info[R.OLD_MEAN_LOGP]) == pytest.approx(float(seq_mean_logp(lp, mask)), abs=1e-6)


def test_naive_self_old_denominators_are_the_learners_own_old_log_probs(agents, step):
    """Naive's default reading (spec §2.5): a cross row's denominator is the learner's pre-update mean
    log-prob of the row's tokens as its make_experience scores them (its Actor), not the source's."""
    k, j = 1, 0  # learner Qwen3/word, source Llama/char: re-tokenised rows
    cross = R.cross_rows(step.own[j], agents[j].tok, agents[k].tok, R.learner_prompts(step.own[k]), 1.0,
                         MAX_NEW, MAX_LEN)  # fmt: skip
    source_means = [float(r.info[R.OLD_MEAN_LOGP]) for r in cross]
    # make_experience batches generator-form samples (Experience.concat_experiences): buffer rows refused
    with pytest.raises(IndexError):
        Experience.concat_experiences(copy.deepcopy(cross), agents[k].tok.pad_token_id)
    batch = Experience.concat_experiences([R.rollout_form(r) for r in cross], agents[k].tok.pad_token_id)
    with torch.no_grad():  # what the learner's make_experience attaches
        batch.action_log_probs = agents[k].actor(batch.sequences, batch.action_mask, batch.attention_mask)
    scored = remove_padding_in_sequences(split_experience_batch(batch))
    R.learner_old_logp(cross, scored)
    want = seq_mean_logp(batch.action_log_probs, batch.action_mask.bool())
    got = torch.stack([torch.as_tensor(r.info[R.OLD_MEAN_LOGP]) for r in cross]).float()
    assert torch.allclose(got, want, atol=1e-6)
    assert max(abs(a - b) for a, b in zip(got.tolist(), source_means, strict=True)) > 0.1
    with pytest.raises(ValueError, match="other rows"):
        R.learner_old_logp(cross, scored[::-1])


def test_row_fields_survive_openrlhf_batching(agents, step):
    """info fields and masks survive make_experience_batch → split → remove padding → batch again."""
    rows = _buffer(agents, step, 1, get_method("hacpo"))
    batch = make_experience_batch(rows)
    for key in R.KEYS:
        assert R.info_column(batch, key).shape == (len(rows),)
    again = remove_padding_in_sequences(split_experience_batch(make_experience_batch(rows)))
    rebatched = make_experience_batch(again)
    for key in R.KEYS:
        assert torch.equal(R.info_column(rebatched, key), R.info_column(batch, key)), key
    assert torch.equal(rebatched.action_mask, batch.action_mask)
    assert [R.response_ids(a) for a in again] == [R.response_ids(r) for r in rows]


@pytest.mark.parametrize("name", ["hacpo", "naive", "hacpo_no_adv", "hacpo_no_adv_own"])
def test_advantages_group_by_prompt_id_and_equal_hacpo_algo(agents, step, name):
    method = get_method(name)
    n = len(agents)
    rewards = torch.stack(
        [torch.stack([r.rewards.reshape(()) for r in own]).view(len(step.problems), G) for own in step.own],
        dim=1,
    ).float()  # [P, n, G] in generation order
    for k in range(n):
        rows = _buffer(agents, step, k, method)
        want = joint_advantages(rewards, k, step.omegas[k], method.baseline)
        # expected per row: its (prompt, source, position within the source's group)
        seen: dict = {}
        for row in sorted(rows, key=lambda r: (int(r.info[R.SOURCE]), int(r.info[R.PROMPT_ID]))):
            key = (int(row.info[R.PROMPT_ID]), int(row.info[R.SOURCE]))
            seen.setdefault(key, []).append(row)
        for (pid, j), group in seen.items():
            got = sorted(float(r.info[R.ADV]) for r in group)
            assert got == pytest.approx(sorted(want[pid, j].tolist()), abs=1e-6), (k, pid, j)
            for r in group:
                a = float(r.info[R.ADV])
                assert torch.allclose(r.advantages, r.action_mask.float() * a)


def test_a_filtered_prompt_leaves_the_other_groups_unchanged(agents, step):
    """A prompt dropped for every agent (filtered upstream) removes its joint group and nothing else."""
    method = get_method("hacpo")
    full = _buffer(agents, step, 0, method)
    kept = [copy.deepcopy(r) for r in full if int(r.info[R.PROMPT_ID]) != 2]
    random.Random(7).shuffle(kept)
    R.assign_advantages(kept, 0, len(agents), step.omegas, method)
    key = lambda r: (int(r.info[R.PROMPT_ID]), int(r.info[R.SOURCE]), R.response_ids(r))  # noqa: E731
    want = sorted((key(r), float(r.info[R.ADV])) for r in full if int(r.info[R.PROMPT_ID]) != 2)
    assert sorted((key(r), float(r.info[R.ADV])) for r in kept) == want


@pytest.mark.parametrize("name", ["xgrpo", "xgrpo_capability", "sgt"])
def test_sharing_rules_keep_the_rows_and_advantages_of_hacpo_algo(agents, step, name):
    """XGRPO and SGT on Experience rows (issue 45): the rows kept and their advantages are
    ``Method.learner_rows``'s (the local engine's function), and a learner keeps GSPO's row count."""
    method, k = get_method(name), 0
    rows = _buffer(agents, step, k, get_method("hacpo"))
    for r in rows:  # prompt 0: the learner failed every answer, agent 1 solved them all (a rescue case)
        if int(r.info[R.PROMPT_ID]) == 0:
            r.rewards = torch.tensor([0.0 if int(r.info[R.SOURCE]) != 1 else 1.0])
    kept = R.assign_advantages(rows, k, len(agents), step.omegas, method)
    column = lambda key: torch.tensor([float(r.info[key]) for r in rows])  # noqa: E731
    rewards = torch.tensor([float(r.rewards) for r in rows])
    want = method.learner_rows(rewards, column(R.PROMPT_ID).long(), column(R.SOURCE).long(), len(agents), k,
                               step.omegas[k])  # fmt: skip
    assert [id(r) for r in kept] == [id(r) for r, keep in zip(rows, want.keep.tolist(), strict=True) if keep]
    assert column(R.ADV).tolist() == pytest.approx(want.adv.tolist(), abs=1e-6)
    assert len(kept) == len(step.own[k])
    cross = [r for r in kept if int(r.info[R.IS_SELF]) == 0]
    if name == "sgt":
        on_0 = [int(r.info[R.SOURCE]) for r in cross if int(r.info[R.PROMPT_ID]) == 0]
        assert on_0 == [1] * G  # prompt 0's rescue set: agent 1's G successes
        assert all(float(r.rewards) == 1.0 and float(r.info[R.ADV]) == 1.0 for r in cross)
    else:
        assert not cross


def test_grouping_refuses_incomplete_groups(agents, step):
    rows = _buffer(agents, step, 0, get_method("hacpo"))[1:]
    with pytest.raises(ValueError, match="same, non-zero number of responses"):
        R.assign_advantages(rows, 0, len(agents), step.omegas, get_method("hacpo"))


# ---------------------------------------------------------------------------------------- loss
def _full_step_loss(actor: Actor, rows: list[Experience], spec, m: int):
    """hacpo.algo.policy_loss on one optimizer step's rows as one mini-batch (the local engine's maths)."""
    batch = make_experience_batch(rows)
    logp = actor(batch.sequences, batch.action_mask, batch.attention_mask)
    mb = MiniBatch(
        logp=logp, mask=batch.action_mask.bool(), adv=R.info_column(batch, R.ADV).float(),
        old_mean_logp=R.info_column(batch, R.OLD_MEAN_LOGP).float(),
        is_own=R.info_column(batch, R.IS_SELF).bool(),
        omega=R.info_column(batch, R.OMEGA), ref_logp=batch.base_action_log_probs,
    )  # fmt: skip
    loss, metrics = policy_loss(mb, spec, m)
    return loss, metric_floats([metrics])[0]  # the loss's metrics are 0-d tensors


def _some_cross_rows_in_bounds(actor: Actor, rows: list[Experience]) -> None:
    """Two unrelated random models give cross ratios far from 1, all clamped: move every other cross row's
    denominator so that its ratio is 0.9 at the current weights, inside [lo_m, 1] for m ≤ 3."""
    cross = [r for r in rows if float(r.info[R.IS_SELF]) == 0][::2]
    batch = make_experience_batch(cross)
    with torch.no_grad():
        logp = actor(batch.sequences, batch.action_mask, batch.attention_mask)
    means = seq_mean_logp(logp, batch.action_mask.bool())
    for row, mean in zip(cross, means.tolist(), strict=True):
        row.info[R.OLD_MEAN_LOGP] = torch.tensor(mean - math.log(0.9), dtype=torch.float64)


def _grads(model) -> torch.Tensor:
    return torch.cat([p.grad.reshape(-1) if p.grad is not None else torch.zeros(p.numel())
                      for p in model.parameters()])  # fmt: skip


class AccumulatingStrategy:
    """DeepSpeed's contract as training_step uses it: loss/gas per backward, an optimizer step every gas
    micro-batches. Here the 'step' records the accumulated gradient and clears it without moving the weights,
    so every optimizer step is compared at the same weights."""

    ring_attn_group = None
    stage = 2  # ZeRO stage: the head in slices needs ≤ 2 (joint/logprobs.py)

    def __init__(self, gas: int):
        self.accumulated_gradient, self.micro, self.step_grads = gas, 0, []

    def backward(self, loss, model, optimizer):
        (loss / self.accumulated_gradient).backward()

    def optimizer_step(self, optimizer, model, scheduler, name="actor"):
        self.micro += 1
        if self.micro % self.accumulated_gradient == 0:
            self.step_grads.append(_grads(model).clone())
            model.zero_grad(set_to_none=True)

    def get_grad_norm(self, model):
        return None


def _trainer(actor, rows, spec, gas: int, micro: int, order="mixed") -> HacpoActorTrainer:
    trainer = HacpoActorTrainer.__new__(HacpoActorTrainer)  # OpenRLHF's __init__ needs torch.distributed
    trainer.args = SimpleNamespace(train=SimpleNamespace(dynamic_batch_enable=False))
    trainer.strategy = AccumulatingStrategy(gas)
    trainer.actor, trainer.actor_optim = actor, None
    trainer.actor_scheduler = SimpleNamespace(get_last_lr=lambda: [1e-6])
    trainer.micro_train_batch_size, trainer.max_epochs = micro, 1
    trainer.replay_buffer = SimpleNamespace(items=rows)
    trainer.configure(spec, order, seed=3)
    return trainer


def _fit_matches_hacpo_algo(trainer, steps, actor, spec) -> list[dict]:
    """Run the trainer's fit: each optimizer step's accumulated gradient and merged metrics are
    hacpo.algo.policy_loss's on that step's rows at its m; returns the updates' metrics."""
    updates = trainer.ppo_train()
    assert [u["update"] for u in updates] == list(range(len(steps)))
    assert len(trainer.strategy.step_grads) == len(steps)
    for (micro, m), got in zip(steps, trainer.strategy.step_grads, strict=True):
        step_rows = [r for mb in micro for r in split_experience_batch(mb)]
        step_rows = remove_padding_in_sequences(step_rows)
        actor.zero_grad(set_to_none=True)
        loss, full = _full_step_loss(actor, step_rows, spec, m)
        loss.backward()
        want = _grads(actor)
        actor.zero_grad(set_to_none=True)
        assert torch.allclose(got, want, atol=1e-7, rtol=1e-5), (m, float((got - want).abs().max()))
        assert float(want.abs().max()) > 0
        for key in ("loss", "kl", "own_rows", "s_homo_mean", "cross_in_bounds_frac", "rescue_rows"):
            if key in full:  # merged = whole's
                assert updates[m][key] == pytest.approx(full[key], abs=1e-6), (m, key)
    return updates


@pytest.mark.parametrize("name", ["xgrpo", "sgt"])
def test_sharing_rules_training_step_gradient_equals_hacpo_algo(agents, step, name):
    """XGRPO and SGT on HACPO's OpenRLHF trainer: 16 rows per learner (GSPO's count), micro-batches of 2, 2
    per optimizer step → 4 steps, each the gradient of hacpo.algo.policy_loss (SGT: own rows GSPO, rescue
    rows −A·∇ mean log π)."""
    method = get_method(name)
    spec = method.loss_spec(kl_beta=1e-3)
    actor = agents[0].actor
    rows = _buffer(agents, step, 0, method)
    assert len(rows) == len(step.own[0])
    rescued = [r for r in rows if int(r.info[R.IS_SELF]) == 0]
    assert bool(rescued) == (name == "sgt")  # the fixture's learner 0 failed a prompt agent 1 or 2 solved
    trainer = _trainer(actor, rows, spec, gas=2, micro=2, order="mixed")
    steps = trainer.steps()
    assert [m for _, m in steps] == [0, 1, 2, 3]
    updates = _fit_matches_hacpo_algo(trainer, steps, actor, spec)
    assert sum(u.get("rescue_rows", 0.0) for u in updates) == len(rescued)


@pytest.mark.parametrize("name", ["hacpo", "naive", "hacpo_no_clip"])
@pytest.mark.parametrize("order", ["mixed", "self_first", "agent_order"])
def test_training_step_gradient_equals_hacpo_algo_per_optimizer_step(agents, step, name, order):
    """48 rows per learner, micro-batches of 3, 4 per optimizer step → 4 steps m = 0..3: each step's
    accumulated gradient = ∇ hacpo.algo.policy_loss(that step's 12 rows, m) (own GSPO, cross term with lo_m,
    KL on own rows), and the metrics of the fit are hacpo.algo's."""
    method = get_method(name)
    spec = method.loss_spec(alpha=1.0, cross_clip_low=0.8, delta_step=0.025, kl_beta=1e-3)
    k = 1
    actor = agents[k].actor
    rows = _buffer(agents, step, k, method)
    _some_cross_rows_in_bounds(actor, rows)
    trainer = _trainer(actor, rows, spec, gas=4, micro=3, order=order)
    steps = trainer.steps()
    assert [m for _, m in steps] == [0, 1, 2, 3]
    if order == "self_first":
        flags = [float(x) for micro, _ in steps for mb in micro for x in R.info_column(mb, R.IS_SELF)]
        assert flags == sorted(flags, reverse=True)
    if order == "agent_order":  # by generating agent, then prompt: the local engine's order
        keys = [
            (int(a), int(p))
            for micro, _ in steps for mb in micro
            for a, p in zip(R.info_column(mb, R.SOURCE), R.info_column(mb, R.PROMPT_ID), strict=True)
        ]  # fmt: skip
        assert keys == sorted(keys) and len({a for a, _ in keys}) == len(agents)
    updates = _fit_matches_hacpo_algo(trainer, steps, actor, spec)
    assert [u["rows"] for u in updates] == [12] * 4  # each update's micro-batches merged (shares summed)
    status = aggregate(updates)
    assert status["updates"] == 4 and "s_homo_mean" in status and "kl" in status
    if method.loss == "hacpo" and method.cross_clip == "stepwise":
        assert 0 < status["cross_in_bounds_frac"] < 1
        assert status["cross_lo"] > 0.8  # the mean of lo_m over the fit: lo_m rose with m


def test_data_parallel_normalisers(agents, step):
    """Two DP ranks × two micro-batches: per-rank losses with the step's global normalisers, scaled as
    DeepSpeed does (1/gas, mean over ranks), sum to hacpo.algo's loss on all rows of the step."""
    spec = get_method("hacpo").loss_spec(kl_beta=1e-3)
    k, m = 0, 2
    actor = agents[k].actor
    rows = _buffer(agents, step, k, get_method("hacpo"))[:12]
    ranks = [[make_experience_batch(rows[0:3]), make_experience_batch(rows[3:6])],
             [make_experience_batch(rows[6:9]), make_experience_batch(rows[9:12])]]  # fmt: skip
    totals = [torch.tensor([float(mb.action_mask.shape[0]) for mb in r]).sum() for r in ranks]
    own_tok = [
        sum(float(mb.action_mask[R.info_column(mb, R.IS_SELF).bool()].sum()) for mb in r) for r in ranks
    ]
    everything = torch.tensor([sum(totals), sum(own_tok)], dtype=torch.float64)
    combined = torch.zeros(())
    for r in ranks:
        norm = step_norm(r, m, dp_size=2, all_reduce=lambda _t: everything.clone())
        assert norm.rows == pytest.approx(12 / 4)
        for mb in r:
            logp = actor(mb.sequences, mb.action_mask, mb.attention_mask)
            combined = combined + microbatch_loss(logp, mb, spec, norm)[0] / 2 / 2  # 1/gas, mean over 2 ranks
    want, _ = _full_step_loss(actor, rows, spec, m)
    assert float(combined) == pytest.approx(float(want), rel=1e-5, abs=1e-8)


def test_own_rows_only_equal_openrlhf_gspo_and_kl(agents, step):
    """All-own micro-batch: HACPO's loss = OpenRLHF's PolicyLoss(gspo, 3e-4/4e-4) + 0.001 · its k3 KL loss."""
    spec = get_method("hacpo").loss_spec(kl_beta=1e-3)
    actor = copy.deepcopy(agents[0].actor)
    rows = [copy.deepcopy(r) for r in step.own[0]]
    R.assign_advantages(rows, 0, 1, torch.ones(1, 1), get_method("gspo"))
    own = rows[:8]
    mb = make_experience_batch(own)
    norm = StepNorm(rows=8.0, own_tokens=float(mb.action_mask.sum()), m=0)
    with torch.no_grad():  # move off the old policy so the ratios are not all 1
        for p in actor.parameters():
            p.add_(0.01 * torch.randn_like(p))
    logp = actor(mb.sequences, mb.action_mask, mb.attention_mask)
    ours, _ = microbatch_loss(logp, mb, spec, norm)
    loss_fn = PolicyLoss(
        clip_eps_low=3e-4, clip_eps_high=4e-4, token_level_loss=False, policy_loss_type="gspo"
    )
    old = mb.action_log_probs
    pg = loss_fn(logp, old, mb.advantages, action_mask=mb.action_mask, global_batch_size=torch.tensor(8.0))[0]
    kl = compute_approx_kl(logp, mb.base_action_log_probs, kl_estimator="k3")
    kl_loss = aggregate_loss(kl, mb.action_mask, token_level_loss=True, batch_num_tokens=norm.own_tokens)
    # float32: the loss sums terms of size |A|·s ≈ 1 that cancel to ~5e-3, so the agreement is absolute
    # (OpenRLHF averages per-token log-ratios, hacpo.algo subtracts mean log-probs: rounding differs)
    assert float(ours) == pytest.approx(float(pg + 1e-3 * kl_loss), abs=1e-6)


def test_uneven_rows_refused_before_training(agents, step):
    rows = _buffer(agents, step, 0, get_method("hacpo"))[:10]
    trainer = _trainer(agents[0].actor, rows, get_method("hacpo").loss_spec(), gas=3, micro=3)
    with pytest.raises(ValueError, match="multiple of train.batch_size"):
        trainer.steps()


# ------------------------------------------------------------------------------- against the local engine
def _local_trainer(agents, tmp_path):
    """The local engine's trainer over the same three agents (fp32 from the same directories)."""
    import json

    from hacpo.config import TrainConfig
    from hacpo.engines.local.trainer import LocalTrainer

    train = tmp_path / "train.jsonl"
    rows = [{"id": p.id, "problem": p.problem, "answer": p.answer, "family": p.family, "difficulty": 1}
            for p in _problems()]  # fmt: skip
    train.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = TrainConfig(
        method="hacpo", agents=[{"name": f"a{k}", "path": str(a.path)} for k, a in enumerate(agents)],
        train_file=str(train), out_dir=str(tmp_path / "local"), prompts_per_step=len(rows), group_size=G,
        max_new_tokens=MAX_NEW, minibatch_size=48, prompt_style="compact", device="cpu",
    )  # fmt: skip
    return LocalTrainer(cfg), rows


def _rollouts(own: list[Experience], tok):
    """One agent's rows as the local engine's Rollouts (same tokens, rewards, old and reference log-probs)."""
    from hacpo.agents.retokenize import response_text, source_logp_mask
    from hacpo.engines.local.trainer import Rollouts

    resp = [R.response_ids(r) for r in own]
    width = max(len(x) for x in resp)
    tokens = torch.full((len(own), width), tok.pad_token_id, dtype=torch.long)
    logp, ref = torch.zeros(len(own), width), torch.zeros(len(own), width)
    mask = torch.zeros(len(own), width, dtype=torch.bool)
    for i, (row, ids) in enumerate(zip(own, resp, strict=True)):
        tokens[i, : len(ids)], mask[i, : len(ids)] = torch.tensor(ids), True
        logp[i, : len(ids)] = R.response_logp(row)
        ref[i, : len(ids)] = row.base_action_log_probs.reshape(-1)[row.action_mask.reshape(-1).bool()]
    shared = source_logp_mask(tokens, tok.eos_token_id) & mask
    return Rollouts(
        prompt_index=torch.tensor([int(r.info[R.PROMPT_ID]) for r in own]), tokens=tokens, logp=logp,
        mask=mask, texts=[response_text(tok, t[m]) for t, m in zip(tokens, mask, strict=True)],
        rewards=torch.stack([r.rewards for r in own]), src_mean_logp=seq_mean_logp(logp, shared),
        ref_logp=ref,
    )  # fmt: skip


def test_rows_advantages_loss_and_gradients_equal_the_local_engines(agents, step, tmp_path):
    """The same batch (texts, rewards, old and reference log-probs) through the local engine's own row
    builder and mini-batch loss, and through the OpenRLHF rows and HACPO micro-batch loss: identical
    response ids, ratio denominators, ω and advantages per row, equal loss and gradients (fp32)."""
    local, problems = _local_trainer(agents, tmp_path)
    rolls = [_rollouts(own, a.tok) for own, a in zip(step.own, agents, strict=True)]
    method = get_method("hacpo")
    for k in range(3):
        want = local._rows_for(k, rolls, step.omegas)
        ours = [copy.deepcopy(r) for r in step.own[k]]
        prompts = R.learner_prompts(step.own[k])
        by_source = {k: ours}
        for j in range(3):
            if j != k:
                by_source[j] = R.cross_rows(step.own[j], agents[j].tok, agents[k].tok, prompts,
                                            float(step.omegas[j, k]), MAX_NEW, MAX_LEN)  # fmt: skip
        ordered = [r for j in range(3) for r in by_source[j]]  # the local engine's row order
        R.assign_advantages(ordered, k, 3, step.omegas, method)
        assert len(ordered) == len(want.adv)
        for i, row in enumerate(ordered):
            assert R.response_ids(row) == want.response[i][want.mask[i]].tolist(), (k, i)
            assert float(row.info[R.IS_SELF]) == float(want.is_own[i])
            assert float(row.info[R.OLD_MEAN_LOGP]) == pytest.approx(float(want.old_mean_logp[i]), abs=1e-6)
            assert float(row.info[R.OMEGA]) == pytest.approx(float(want.omega[i]))
            assert float(row.info[R.ADV]) == pytest.approx(float(want.adv[i]), abs=1e-6)
            assert int(row.info[R.PROMPT_ID]) == int(want.prompt_index[i])

        # one mini-batch of all rows at update m = 1: the local engine's loss vs the OpenRLHF micro-batch loss
        spec = local.spec
        learner = local.agents[k]
        actor = copy.deepcopy(agents[k].actor)
        actor.model.load_state_dict(learner.model.state_dict())  # the same fp32 weights in both engines
        _some_cross_rows_in_bounds(actor, ordered)
        for i, row in enumerate(ordered):  # the moved denominators, for the local engine too
            want.old_mean_logp[i] = float(row.info[R.OLD_MEAN_LOGP])
        width = int(want.mask.sum(1).max())
        batch = MiniBatch(
            logp=torch.empty(0), mask=want.mask[:, :width], adv=want.adv, old_mean_logp=want.old_mean_logp,
            is_own=want.is_own, omega=want.omega, old_logp=want.old_logp[:, :width],
            ref_logp=want.ref_logp[:, :width],
        )  # fmt: skip
        p_ids, p_mask = learner.prompt_ids(problems, "compact", "cpu")
        learner.model.zero_grad(set_to_none=True)
        local_loss, local_metrics = local._minibatch_loss(
            learner, batch, want.prompt_index, want.response[:, :width], p_ids, p_mask, 1
        )
        local_loss.backward()
        exp = make_experience_batch(ordered)
        own_tokens = float(exp.action_mask[R.info_column(exp, R.IS_SELF).bool()].sum())
        norm = StepNorm(rows=float(len(ordered)), own_tokens=own_tokens, m=1)
        logp = actor(exp.sequences, exp.action_mask, exp.attention_mask)
        loss, metrics = microbatch_loss(logp, exp, spec, norm)
        loss.backward()
        local_metrics, metrics = metric_floats([local_metrics, metrics])
        # the local engine backpropagates only rows with a gradient (exact, skip_dead_rows); its metrics
        # carry the full mini-batch loss, which is the value to compare
        assert float(loss) == pytest.approx(local_metrics["loss"], abs=1e-6)
        assert metrics["kl"] == pytest.approx(local_metrics["kl"], abs=1e-7)
        assert metrics["cross_in_bounds_frac"] == pytest.approx(local_metrics["cross_in_bounds_frac"])
        ours_g = dict(actor.model.named_parameters())
        for name, p in learner.model.named_parameters():
            assert torch.allclose(ours_g[name].grad, p.grad, atol=1e-6, rtol=1e-4), (k, name)
