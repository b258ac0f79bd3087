"""The local engine's run directory: start or resume, ``run.json``, checkpoints saved atomically, pruned
and loaded (the contract of :mod:`hacpo.runio`)."""

from __future__ import annotations

import shutil
import sys

import torch

from hacpo.agents import adapters
from hacpo.checkpoints import intact_resume_step, write_checkpoint_manifest
from hacpo.engines.core.nonfinite import NonFiniteWeights, nonfinite_weights
from hacpo.provenance import machine, versions
from hacpo.runio import RunRecord, atomic_dir, sweep_temporaries


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class CheckpointMixin:
    """:class:`~hacpo.engines.local.trainer.LocalTrainer`'s run directory: the methods that start or resume
    a run and write, prune and load its checkpoints."""

    def _start_or_resume(self) -> int:
        """The step to start from: 0, the newest checkpoint every agent has, or -1 (already complete); the
        logs cut back to it and the validation at it run where due (:meth:`RunLoop.resume`)."""
        prev = RunRecord.for_config(self.out, self.config_hash())
        if prev is not None and prev.complete:
            return -1
        sweep_temporaries(self.out)  # leftovers of writes a kill interrupted (never read as complete)
        # the newest checkpoint every agent has intact (a damaged one is set aside, named with why)
        start = intact_resume_step(self.out, [a.name for a in self.agents], say=say)
        if start:
            say(f"resuming {self.out} from its step-{start} checkpoint")
            if prev is not None and prev.step > start:
                say(f"hacpo: steps {start + 1}–{prev.step} of {self.out} will be trained again")
            self._load_checkpoint(start)
        self.loop.resume(start, self.validate)
        self._write_run_json("running", start)
        if start:
            self._prune_checkpoints(start)
        return start

    def _write_run_json(self, status: str, step: int, **final) -> None:
        RunRecord(
            status=status,
            step=step,
            config_hash=self.config_hash(),
            config=self.cfg.model_dump(),
            engine="local",
            versions=versions(),
            machine=machine(),
            details={
                "method": self.method.to_dict(),
                "loss_spec": self.spec.__dict__,
                "device": str(self.device),
                "sampler_logp_as_old": self.sampler_logp,
                "fidelity": self.cfg.fidelity_record(),
                "reward": self.cfg.reward_record(),  # its scale and the map onto [0, 1] the metrics log
                "precision": self.precision,  # auto resolved here (hacpo.hardware.resolve_precision)
                "adapters": {
                    a.name: (lora.model_dump() if (lora := self.cfg.agent_adapter(i)) else "full")
                    for i, a in enumerate(self.cfg.agents)
                },
                "shared_base": {a.name: a.shared_base for a in self.cfg.agents if a.shared_base},
            },
            **final,
        ).write(self.out)

    def _save_checkpoint(self, step: int) -> None:
        """Every agent's checkpoint, then ``run.json`` (the step is resumable from here), then pruning: a kill
        at any point leaves the previous complete checkpoint of every agent in place. Weights holding NaN/inf
        are never written (:class:`~hacpo.engines.core.nonfinite.NonFiniteWeights`, before any agent's)."""
        for agent in self.agents:
            weights = agent.model.named_parameters()
            if agent.peft is not None:  # its adapter: the base never moves, a shared base's others are theirs
                weights = adapters.adapter_named_parameters(agent.peft, agent.adapter)
            if bad := nonfinite_weights(weights):
                raise NonFiniteWeights(agent.name, bad)
        for agent in self.agents:
            final = self.out / "checkpoints" / agent.name / f"step-{step}"
            with atomic_dir(final) as tmp:
                if agent.peft is not None:  # what trained: the adapter (megabytes), its base by path
                    adapters.save(agent.peft, tmp, agent.adapter)
                    agent.model.generation_config.save_pretrained(tmp)  # every stop id, beside the tokenizer
                else:
                    agent.model.save_pretrained(tmp)
                agent.tok.save_pretrained(tmp)
                torch.save(
                    {
                        "step": step,
                        "optimizer": agent.opt.state_dict(),
                        "generator": agent.gen.get_state(),
                        "capability": self.tracker.state_dict(),
                        "torch_rng": torch.get_rng_state(),
                        "device_type": self.device.type,
                    },
                    tmp / "trainer_state.pt",
                )
                write_checkpoint_manifest(tmp)  # last: what the checkpoint holds, checked on resume
        self._write_run_json("running", step)
        self._prune_checkpoints(step)

    def _prune_checkpoints(self, newest: int) -> None:
        """Keep each agent's ``keep_checkpoints`` newest checkpoints, and always step ``newest`` (the one
        run.json records). Also run on resume: a kill between run.json and pruning leaves extra ones."""
        for agent in self.agents:
            folder = self.out / "checkpoints" / agent.name
            periodic = sorted(int(p.name.split("-")[1]) for p in folder.glob("step-*") if p.is_dir())
            for s in periodic[: -self.cfg.keep_checkpoints]:
                if s != newest:
                    shutil.rmtree(folder / f"step-{s}", ignore_errors=True)

    def _load_checkpoint(self, step: int) -> None:
        from transformers import AutoModelForCausalLM

        for agent in self.agents:
            d = self.out / "checkpoints" / agent.name / f"step-{step}"
            # host tensors: the optimizer moves its state to the parameters' device when it loads it
            # weights_only: a run directory copied from elsewhere cannot run code on resume
            state = torch.load(d / "trainer_state.pt", map_location="cpu", weights_only=True)
            saved = state.get("device_type", "cpu")
            if saved != self.device.type:
                raise ValueError(
                    f"{self.out} was trained on {saved} and would resume on {self.device.type}: its "
                    "samplers' random streams belong to one device type, so resume it with "
                    f"`device: {saved}`, or train into a new out_dir"
                )
            if agent.peft is not None:
                adapters.load_weights(agent.peft, d, agent.adapter)
            else:
                loaded = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32)
                agent.model.load_state_dict(loaded.state_dict())
            agent.opt.load_state_dict(state["optimizer"])
            agent.gen.set_state(state["generator"])
            self.tracker.load_state_dict(state["capability"])
            torch.set_rng_state(state["torch_rng"])

    # ----------------------------------------------------------------------------- stage 1 and 2
