"""Training: AdamW with warmup + cosine decay and clipping, atomic checkpoints, the loop."""
from .checkpoint import load as load_checkpoint
from .checkpoint import save as save_checkpoint
from .loop import TASK_DEFAULT_LR, TASK_DEFAULTS, TASKS, TrainConfig, evaluate, load_model, train
from .optim import AdamW, clip_global_norm, lr_at

__all__ = ["AdamW", "TASK_DEFAULT_LR", "TASK_DEFAULTS", "TASKS", "TrainConfig", "clip_global_norm", "evaluate", "load_checkpoint",
           "load_model", "lr_at", "save_checkpoint", "train"]
