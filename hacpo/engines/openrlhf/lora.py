"""LoRA adapters on the OpenRLHF engine: OpenRLHF builds and trains them, hacpo serves them to
vLLM.

- **Training**: OpenRLHF's own options (``--ds.lora.rank/alpha/dropout/target_modules``, written by
  ``command._train_args`` after :func:`check_lora`): its ``Actor`` wraps the model with peft's
  ``get_peft_model`` and DeepSpeed optimises the adapter only.
- **The weight sync sends merged weights** (:func:`sync_merged_adapters`). OpenRLHF 0.11.2's
  ``broadcast_to_vllm`` sends every parameter under its peft name (``base_model.model.….base_layer.weight``,
  ``….lora_A.default.weight``), which vLLM's weight loader refuses (OpenRLHF issues #991, #1081). hacpo sends,
  for each adapted linear, W + ΔW (peft's own ``get_delta_weight``) under the base model's name, through
  OpenRLHF's unchanged transport (NCCL / CUDA IPC / gloo): vLLM serves the policy as a plain model, with no
  ``enable_lora`` and no LoRA kernels, so sampling costs what it costs for full fine-tuning and the
  vLLM-vs-actor log-prob gap means the same thing. The frozen weights never change, so only adapted layers
  travel after the engines load the base. vLLM's LoRA loading was the alternative: it needs
  ``enable_lora`` at engine creation, a ``max_lora_rank``, adapter files on a disk every engine reads and
  LoRA kernels in the sampler (slower decoding), for a sync whose merged form costs one matmul per layer.
- **The KL reference is the actor with its adapter off** in joint runs (:class:`AdapterOffReference`); a
  single-agent baseline runs OpenRLHF's ``train_ppo_ray`` unchanged, with its separate reference model.
- **Checkpoints** are OpenRLHF's: the adapter (``adapter_config.json``, ``adapter_model.safetensors``) and
  the base's ``config.json``; evaluation merges it (:func:`hacpo.agents.adapters.servable`).
"""

from __future__ import annotations

import functools

import torch

# Layers whose delta vLLM would drop (a tied head is not loaded from the checkpoint) or that LoRA's merged
# sync does not cover: the embedding and the head stay the base's.
UNSERVABLE = ("lm_head", "embed_tokens")


def check_lora(lora, opts, agent: str) -> None:
    """What OpenRLHF cannot train with an adapter, refused before launch with the fix."""
    where = f"agent {agent!r}: adapter.lora"
    if opts.zero_stage >= 3:
        raise ValueError(
            f"{where} with openrlhf.zero_stage 3: OpenRLHF 0.11.2 saves a ZeRO-3 adapter as .bin from "
            "partitioned weights and hacpo's merged sync gathers by layer only up to stage 2: use "
            "zero_stage 2"
        )
    if float(lora.alpha) != int(lora.alpha):
        raise ValueError(
            f"{where}.alpha {lora.alpha}: OpenRLHF takes a whole number (--ds.lora.alpha is an int)"
        )
    targets = lora.target_modules
    if not isinstance(targets, str) and (bad := sorted(set(targets) & set(UNSERVABLE))):
        raise ValueError(
            f"{where}.target_modules {bad}: the merged weight sync serves the blocks' linear layers only "
            "(vLLM skips a tied head): leave the embedding and the head to the base"
        )


def peft_of(actor):
    """The peft model inside OpenRLHF's ``Actor`` (``Actor.model`` is the DeepSpeed engine after
    ``strategy.prepare``), or None for full fine-tuning."""
    from peft import PeftModel

    model = getattr(actor, "model", None)
    model = getattr(model, "module", model)
    return model if isinstance(model, PeftModel) else None


def merged_weights(peft_model) -> list[tuple[str, torch.Tensor]]:
    """Every adapted linear's weight with its adapter merged, W + ΔW in W's dtype, under the base model's
    parameter name (the name vLLM loads): ``model.layers.0.self_attn.q_proj.weight``."""
    from peft.tuners.lora import LoraLayer

    out = []
    for name, module in peft_model.get_base_model().named_modules():
        if not isinstance(module, LoraLayer) or not module.active_adapters:
            continue
        base = module.get_base_layer().weight
        delta = sum(module.get_delta_weight(a).float() for a in module.active_adapters if a in module.lora_A)
        out.append((f"{name}.weight", (base.float() + delta).to(base.dtype).detach()))
    return out


class _MergedView(torch.nn.Module):
    """What OpenRLHF's ``broadcast_to_vllm`` reads from ``actor.model.module``: ``named_parameters`` as the
    merged weights (:func:`merged_weights`) under the base model's names."""

    def __init__(self, peft_model):
        super().__init__()
        self._weights = [
            (n, torch.nn.Parameter(w, requires_grad=False)) for n, w in merged_weights(peft_model)
        ]

    def named_parameters(self, *args, **kwargs):
        return iter(self._weights)


def _merged_broadcast(broadcast):
    if getattr(broadcast, "_hacpo", False):
        return broadcast

    @functools.wraps(broadcast)
    def broadcast_merged(self):
        engine = self.actor.model
        peft_model = peft_of(self.actor)
        if peft_model is None:
            return broadcast(self)
        with torch.no_grad():
            view = _MergedView(peft_model)
        if not view._weights:  # a sync that sends nothing would leave vLLM on the base without a word
            raise RuntimeError("hacpo: a LoRA actor with no adapted layer to sync into vLLM")
        engine.module = view  # the DeepSpeed engine's module, for the span of OpenRLHF's own sync loop
        try:
            return broadcast(self)
        finally:
            engine.module = peft_model

    broadcast_merged._hacpo = True
    return broadcast_merged


def sync_merged_adapters() -> None:
    """OpenRLHF's ``ActorPPOTrainer.broadcast_to_vllm`` sends merged weights when the actor trains an
    adapter (module docstring); unchanged otherwise. Every trainer class inherits it (HACPO's too)."""
    from openrlhf.trainer.ray.ppo_actor import ActorPPOTrainer

    ActorPPOTrainer.broadcast_to_vllm = _merged_broadcast(ActorPPOTrainer.broadcast_to_vllm)


class AdapterOffReference:
    """A joint LoRA run's reference group: the agent's own actor group, scoring with its adapter switched off
    (``HacpoPolicyActor.ref_forward``), in place of a second model. Answers what OpenRLHF's experience maker
    asks of a reference group: a batched ``forward`` and ``empty_cache``."""

    def __init__(self, actor_group):
        self.actor_group = actor_group

    def async_run_method_batch(self, method_name, **kwargs):
        name = "ref_forward" if method_name == "forward" else method_name
        return self.actor_group.async_run_method_batch(method_name=name, **kwargs)

    def async_run_method(self, method_name, *args, **kwargs):
        return self.actor_group.async_run_method(method_name, *args, **kwargs)
