"""Local engine: single-process training on CPU or one GPU with Hugging Face transformers models."""

from .trainer import LocalTrainer, train

__all__ = ["LocalTrainer", "train"]
