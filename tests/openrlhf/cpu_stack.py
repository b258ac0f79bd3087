"""An agent stack made of OpenRLHF's own pieces on CPU, for the joint controller's tests (issue 11).

Its ``Actor`` (log-probs, training forward), ``_process_response_into_experience`` (rows), our reward file
(rewards) and :class:`HacpoActorTrainer` (updates); DeepSpeed's accumulation contract is played by a plain
optimizer (:class:`PlainStrategy`), and Hugging Face sampling stands in for vLLM, the one part that needs a
GPU. Checkpoints hold the model, optimizer and sampling RNG, so a resumed run continues exactly.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).parent))
import gpu_only_modules  # noqa: E402  (also in Ray workers, which import this module on their own)

gpu_only_modules.install()

from openrlhf.models import Actor  # noqa: E402
from openrlhf.trainer.ppo_utils.experience import (  # noqa: E402
    Experience,
    remove_padding_in_sequences,
    split_experience_batch,
)
from openrlhf.trainer.ppo_utils.samples_generator import SamplesGenerator  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

from hacpo.engines.openrlhf.joint.actor import HacpoActorTrainer  # noqa: E402
from hacpo.engines.openrlhf.reward_func import reward_func  # noqa: E402

MAX_NEW, MAX_LEN = 16, 64


class PlainStrategy:
    """DeepSpeed as the trainer uses it: loss/gas per backward, clip + step every gas micro-batches."""

    ring_attn_group = None

    def __init__(self, gas: int, optimizer):
        self.accumulated_gradient, self.optimizer, self.micro = gas, optimizer, 0

    def backward(self, loss, model, optimizer):
        (loss / self.accumulated_gradient).backward()

    def optimizer_step(self, optimizer, model, scheduler, name="actor"):
        self.micro += 1
        if self.micro % self.accumulated_gradient == 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)

    def get_grad_norm(self, model):
        return None


class CpuStack:
    """An agent stack from OpenRLHF's pieces on CPU (see the module docstring); records the calls it gets."""

    def __init__(
        self, name: str, path: Path, calls: list, spec, seed: int, gas: int = 2, micro: int = 4, ckpt=None
    ):
        self.name, self.calls, self.seed, self.ckpt = name, calls, seed, ckpt
        self.timeline: list[
            tuple[float, str, str]
        ] = []  # (monotonic time, call, agent): order across processes
        self.gen = torch.Generator().manual_seed(seed)
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.actor = Actor(str(path), attn_implementation="sdpa", param_dtype="bf16").float().train()
        self.ref = Actor(str(path), attn_implementation="sdpa", param_dtype="bf16").float().eval()
        optimizer = torch.optim.AdamW(self.actor.parameters(), lr=1e-3)
        trainer = HacpoActorTrainer.__new__(HacpoActorTrainer)  # OpenRLHF's __init__ needs torch.distributed
        trainer.args = SimpleNamespace(train=SimpleNamespace(dynamic_batch_enable=False))
        trainer.strategy, trainer.actor, trainer.actor_optim = (
            PlainStrategy(gas, optimizer),
            self.actor,
            optimizer,
        )
        trainer.actor_scheduler = SimpleNamespace(get_last_lr=lambda: [1e-3])
        trainer.micro_train_batch_size, trainer.max_epochs = micro, 1
        trainer.replay_buffer = SimpleNamespace(items=[])
        trainer.configure(spec, "mixed", seed)
        self.trainer = trainer

    def _record(self, call: str) -> None:
        self.calls.append((call, self.name))
        self.timeline.append((time.monotonic(), call, self.name))

    def get_timeline(self):
        return self.timeline

    def generate(self, prompts, labels, n):
        self._record("generate")
        tok, rows = self.tokenizer, []
        gen = self.gen
        for prompt, label in reversed(list(zip(prompts, labels, strict=True))):  # arrival order is not ours
            ids = tok(prompt, add_special_tokens=False)["input_ids"]
            torch.manual_seed(int(torch.randint(0, 2**31, (1,), generator=gen)))
            with torch.no_grad():
                out = self.actor.model.generate(
                    torch.tensor([ids] * n), attention_mask=torch.ones(n, len(ids), dtype=torch.long),
                    do_sample=True, max_new_tokens=MAX_NEW, eos_token_id=tok.eos_token_id,
                    pad_token_id=tok.pad_token_id, top_p=1.0, temperature=1.0,
                )  # fmt: skip
            for seq in out.tolist():
                resp = seq[len(ids) :]
                if tok.eos_token_id in resp:
                    resp = resp[: resp.index(tok.eos_token_id) + 1]
                query = tok.decode(ids + resp, skip_special_tokens=False)
                reward = reward_func([query], [prompt], [label])
                response = {
                    "observation_tokens": ids + resp, "action_ranges": [(len(ids), len(ids) + len(resp))],
                    "reward": float(reward["rewards"][0]), "scores": float(reward["scores"][0]),
                    "extra_logs": reward["extra_logs"], "rollout_log_probs": None,
                    "truncated": tok.eos_token_id not in resp, "prompt": prompt, "label": label,
                }  # fmt: skip
                rows.append(
                    SamplesGenerator._process_response_into_experience(None, response, max_len=MAX_LEN)
                )
        return rows

    def score(self, rows):
        self._record("score")
        batch = Experience.concat_experiences(rows, self.tokenizer.pad_token_id)
        with torch.no_grad():
            batch.action_log_probs = self.actor(batch.sequences, batch.action_mask, batch.attention_mask)
            batch.base_action_log_probs = self.ref(batch.sequences, batch.action_mask, batch.attention_mask)
        batch.info["kl"] = torch.zeros(len(rows))
        return remove_padding_in_sequences(split_experience_batch(batch))

    def train(self, rows):
        self._record("train")
        self.trainer.replay_buffer.items = rows
        try:
            return self.trainer.ppo_train()
        finally:
            self.trainer.replay_buffer.items = []

    def sync(self):
        self._record("sync")

    def evaluate(self, prompts, labels):
        self._record("evaluate")
        tok, out = self.tokenizer, []
        for prompt, label in zip(prompts, labels, strict=True):
            ids = tok(prompt, add_special_tokens=False)["input_ids"]
            with torch.no_grad():
                seq = self.actor.model.generate(
                    torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                    do_sample=False, max_new_tokens=MAX_NEW, eos_token_id=tok.eos_token_id,
                    pad_token_id=tok.pad_token_id,
                )[0].tolist()  # fmt: skip
            query = tok.decode(seq, skip_special_tokens=False)
            out.append(float(reward_func([query], [prompt], [label])["rewards"][0]))
        return out

    def save_checkpoint(self, step):
        """As PolicyModelActor.save_checkpoint: resumable states in DeepSpeed's layout (``_actor/<tag>``,
        ``_actor/latest``) and a Hugging Face copy ``global_step<N>_hf``."""
        self._record("save_checkpoint")
        if self.ckpt is None:
            return
        tag = Path(self.ckpt) / "_actor" / f"global_step{step}"
        tag.mkdir(parents=True, exist_ok=True)
        state = {"model": self.actor.model.state_dict(), "optim": self.trainer.actor_optim.state_dict(),
                 "gen": self.gen.get_state(), "fits": self.trainer.fits}  # fmt: skip
        torch.save(state, tag / "state.pt")
        (Path(self.ckpt) / "_actor" / "latest").write_text(tag.name)
        hf = Path(self.ckpt) / f"global_step{step}_hf"
        self.actor.model.save_pretrained(hf)
        self.tokenizer.save_pretrained(hf)

    def load_latest(self) -> int:
        """As ``--ckpt.load_enable`` at start-up: the states ``_actor/latest`` names, if any; their step."""
        latest = Path(self.ckpt) / "_actor" / "latest"
        if not latest.is_file():
            return 0
        tag = latest.read_text().strip()
        state = torch.load(latest.parent / tag / "state.pt", weights_only=False)
        self.actor.model.load_state_dict(state["model"])
        self.trainer.actor_optim.load_state_dict(state["optim"])
        self.gen.set_state(state["gen"])
        self.trainer.fits = state["fits"]
        return int(tag.removeprefix("global_step"))

    def save_model(self):
        self._record("save_model")
        if self.ckpt is not None:
            final = Path(self.ckpt).parent / "final"
            self.actor.model.save_pretrained(final)
            self.tokenizer.save_pretrained(final)


class RayStack:
    """The controller's view of an agent stack living in a Ray actor (as OpenRLHF's groups do): every call
    is a remote call, every row crosses Ray's object store."""

    def __init__(self, handle, name, tokenizer):
        self.handle, self.name, self.tokenizer = handle, name, tokenizer

    def __getattr__(self, method):
        import ray

        return lambda *a, **kw: ray.get(getattr(self.handle, method).remote(*a, **kw))


class StepRunner:
    """Plays the driver's remote controller: JointStep over RayStack proxies, inside a Ray actor."""

    def __init__(self, handles, names, paths, method, group_size):
        from hacpo.algo import get_method
        from hacpo.engines.openrlhf.joint.controller import JointStep

        tokenizers = [AutoTokenizer.from_pretrained(p) for p in paths]
        stacks = [RayStack(*x) for x in zip(handles, names, tokenizers, strict=True)]
        self.step = JointStep(stacks, get_method(method), group_size=group_size, max_new_tokens=MAX_NEW,
                              max_len=MAX_LEN, prompt_style="compact")  # fmt: skip

    def run(self, step, problems):
        return self.step.run(step, problems)
