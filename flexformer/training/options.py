"""The training options of the command lines, generated from :class:`TrainConfig`'s fields.

Each field's name, type, default and help text live once, on the field
(``flexformer/training/loop.py``); ``flexformer train`` and ``python -m flexformer.torch.train``
build their options from them with :func:`add_train_options` and read them back with
:func:`config_from_options`. An option not given stays ``None`` on the namespace, so the
configuration takes the field's default (or, for ``lr`` and ``short_conv``, the task's), and a
resumed run can tell which options were given.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import typing
from typing import Dict, Iterable, Optional

from ..init import DEFAULT_MATCH_TAU, DEFAULT_SCALE, DEFAULT_SPREAD
from .loop import TASK_DEFAULTS, TrainConfig

#: the fields that :func:`kernel_init_args` adds as one group (shared with distillation)
KERNEL_INIT_FIELDS = ("kernel_init_scale", "kernel_init_spread", "kernel_init_match_tau")


def option_name(field: dataclasses.Field) -> str:
    """The option string of a TrainConfig field: ``--seq-len`` for ``seq_len``, or the
    field's ``flag`` metadata (``--features`` for ``num_features``)."""
    return field.metadata.get("flag", "--" + field.name.replace("_", "-"))


_FIELD_DEFAULT = object()


def option_help(field: dataclasses.Field, text: Optional[str] = None, default=_FIELD_DEFAULT) -> str:
    """``text`` (default: the field's help) with the option's default: the task's defaults
    for the fields that take them, else ``default`` (default: the field's own)."""
    text = field.metadata["help"] if text is None else text
    default = field.default if default is _FIELD_DEFAULT else default
    if field.name in TASK_DEFAULTS["listops"]:
        per_task = ", ".join(f"{task} {values[field.name]:g}" for task, values in TASK_DEFAULTS.items())
        return f"{text} (default: the task's, {per_task})"
    if "(default" in text or _value_type(field) is bool or default is None:
        return text
    return f"{text} (default {default})"


def _value_type(field: dataclasses.Field):
    hint = _type_hints()[field.name]
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if args else hint


@functools.lru_cache(maxsize=None)
def _type_hints() -> dict:
    return typing.get_type_hints(TrainConfig)


def add_train_options(parser: argparse.ArgumentParser, *, include: Optional[Iterable[str]] = None,
                      exclude: Iterable[str] = (), help: Optional[Dict[str, str]] = None) -> None:
    """Add an option per TrainConfig field to ``parser``: the fields in ``include`` (default
    all) but not in ``exclude``; ``help`` replaces a field's help text in this command (its
    default is added as for the field's own text)."""
    names = None if include is None else set(include)
    help = help or {}
    kernel_init = False
    for field in dataclasses.fields(TrainConfig):
        if (names is not None and field.name not in names) or field.name in exclude:
            continue
        if field.name in KERNEL_INIT_FIELDS:
            kernel_init = True
            continue
        text = option_help(field, help.get(field.name))
        kind = _value_type(field)
        if kind is bool:
            parser.add_argument(option_name(field), dest=field.name, action="store_true", default=None, help=text)
        else:
            parser.add_argument(option_name(field), dest=field.name, type=kind, default=None, help=text,
                                metavar=field.metadata.get("metavar"))
    if kernel_init:
        kernel_init_args(parser)


def config_from_options(args: argparse.Namespace, **values) -> TrainConfig:
    """The TrainConfig of the options given on ``args`` (the others keep the field's
    default); ``values`` set fields directly (a command's own rule, e.g. threads)."""
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(TrainConfig)
             if getattr(args, f.name, None) is not None}
    return TrainConfig(**{**given, **values})


def kernel_init_args(p: argparse.ArgumentParser, match_tau: Optional[bool] = None,
                     scale: Optional[float] = None) -> None:
    """The attention kernel's initialisation options (shared with the torch trainer and
    distillation); ``match_tau`` and ``scale`` override the default start of this command."""
    scale = DEFAULT_SCALE if scale is None else scale
    fields = {f.name: f for f in dataclasses.fields(TrainConfig)}
    p.add_argument("--kernel-init-scale", type=float, default=scale,
                   help=option_help(fields["kernel_init_scale"], default=scale))
    p.add_argument("--kernel-init-spread", type=float, default=DEFAULT_SPREAD,
                   help=option_help(fields["kernel_init_spread"]))
    match_tau = DEFAULT_MATCH_TAU if match_tau is None else match_tau
    tau = p.add_mutually_exclusive_group()
    tau.add_argument("--kernel-init-fixed-tau", dest="kernel_init_match_tau", action="store_false",
                     help="flex_n's initial tau = log(2 sqrt d) at any scale, the norm factor of flex_s"
                          + (" (default)" if not match_tau else ""))
    tau.add_argument("--kernel-init-matched-tau", dest="kernel_init_match_tau", action="store_true",
                     help="flex_n's initial tau = log(2 sqrt d / s^2): the start estimates exp(s^2 q.k / sqrt d)"
                          + (" (default)" if match_tau else ""))
    p.set_defaults(kernel_init_match_tau=match_tau)
