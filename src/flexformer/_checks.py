"""Type checks for the keyword flags of the public functions (arrays are checked in C)."""
from typing import Any

import numpy as np


def check_bool(name: str, value: Any) -> bool:
    """``value`` as a bool; TypeError naming ``name`` unless it is a Python or NumPy bool."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return bool(value)


def check_real(name: str, value: Any, *, optional: bool = False):
    """``value`` as a float (None passes when ``optional``); TypeError naming ``name``."""
    if optional and value is None:
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.floating, np.integer)):
        kind = "a float or None" if optional else "a float"
        raise TypeError(f"{name} must be {kind}, got {type(value).__name__}")
    return float(value)
