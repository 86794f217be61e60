"""Checkpoints: parameters, optimiser state, step and run configuration in one .npz,
written atomically (a temporary file in the same folder, flushed, then renamed), so a
crash while writing leaves the previous checkpoint intact."""
from __future__ import annotations

import json
import os
import tempfile
import zipfile
from typing import Dict, Tuple

import numpy as np

FORMAT = "flexformer-checkpoint-1"
TEMP_PREFIX = ".checkpoint-"


def save(path: str, params: Dict[str, np.ndarray], opt_state: Dict[str, np.ndarray], meta: dict) -> None:
    """Write parameters, optimiser state and metadata to ``path`` atomically (a temporary
    file, then a rename).

    Parameters
    ----------
    path : str
    params, opt_state : dict of ndarray
    meta : dict
        JSON-serialisable.

    Examples
    --------
    >>> import os, tempfile, numpy as np
    >>> from flexformer.training import save_checkpoint
    >>> path = os.path.join(tempfile.mkdtemp(), "checkpoint.npz")
    >>> save_checkpoint(path, {"w": np.ones(2)}, {}, {"step": 1})
    >>> os.path.exists(path)
    True
    """
    for name, value in (("params", params), ("opt_state", opt_state), ("meta", meta)):
        if not isinstance(value, dict):
            raise TypeError(f"{name} must be a dict, got {type(value).__name__}")
    arrays = {"param/" + k: v for k, v in params.items()}
    arrays.update({"opt/" + k: v for k, v in opt_state.items()})
    arrays["meta"] = np.array(json.dumps({"format": FORMAT, **meta}))
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=TEMP_PREFIX, suffix=".tmp", dir=folder)
    try:
        os.chmod(tmp, 0o666 & ~_umask())  # as open() makes metrics.json (mkstemp makes 0600)
        with os.fdopen(fd, "wb") as fh:
            np.savez(fh, **arrays)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def remove_stale_temporaries(folder: str) -> int:
    """Remove the temporary files of checkpoint writes that never finished (a killed
    process leaves them); returns how many. Call before a run starts writing there."""
    removed = 0
    for name in os.listdir(folder):
        if name.startswith(TEMP_PREFIX) and name.endswith(".tmp"):
            try:
                os.unlink(os.path.join(folder, name))
                removed += 1
            except OSError:
                pass
    return removed


def _read(path: str, meta_only: bool) -> Tuple[Dict[str, np.ndarray], dict]:
    """The arrays (none when ``meta_only``) and the checked meta of a checkpoint file."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"no checkpoint at {path}")
    try:
        loaded = np.load(path, allow_pickle=False)
        if not isinstance(loaded, np.lib.npyio.NpzFile):  # a bare .npy under this name
            raise ValueError("a single array, not an .npz archive")
        with loaded as z:
            data = {k: z[k] for k in (("meta",) if meta_only else z.files)}
        meta = json.loads(str(data.pop("meta")))
    except MemoryError:
        raise ValueError(f"{path} is not a readable flexformer checkpoint (an array header claims more memory "
                         f"than there is)") from None
    except (zipfile.BadZipFile, ValueError, KeyError, OSError, EOFError) as exc:
        raise ValueError(f"{path} is not a readable flexformer checkpoint ({exc.__class__.__name__}: {exc})") from None
    if not isinstance(meta, dict):
        raise ValueError(f"{path} is not a flexformer checkpoint (its meta is a {type(meta).__name__}, not an object)")
    if meta.get("format") != FORMAT:
        raise ValueError(f"{path} is not a flexformer checkpoint (format {meta.get('format')!r})")
    return data, meta


def load(path: str) -> Tuple[Dict[str, np.ndarray], Dict[str, np.ndarray], dict]:
    """(params, optimiser state, meta); ValueError for a file that is not a complete
    flexformer checkpoint (truncated, corrupted or something else).

    Parameters
    ----------
    path : str

    Returns
    -------
    params, opt_state : dict of ndarray
    meta : dict

    Raises
    ------
    ValueError
        Not a complete flexformer checkpoint.

    Examples
    --------
    >>> import os, tempfile, numpy as np
    >>> from flexformer.training import load_checkpoint, save_checkpoint
    >>> path = os.path.join(tempfile.mkdtemp(), "checkpoint.npz")
    >>> save_checkpoint(path, {"w": np.ones(2)}, {}, {"step": 3})
    >>> params, opt_state, meta = load_checkpoint(path)
    >>> params["w"].tolist(), meta["step"]
    ([1.0, 1.0], 3)
    """
    data, meta = _read(path, meta_only=False)
    params = {k[6:]: v for k, v in data.items() if k.startswith("param/")}
    opt = {k[4:]: v for k, v in data.items() if k.startswith("opt/")}
    return params, opt, meta


def load_meta(path: str) -> dict:
    """The meta of a checkpoint (step, configuration) without reading its arrays; the same
    errors as :func:`load` for a file that is not a flexformer checkpoint."""
    return _read(path, meta_only=True)[1]
