"""What a newcomer meets first: the command line's help, version and progress output, the
packaging metadata, the build's messages without a compiler or without OpenMP, and
NumPy-style argument conversion with errors that name the argument."""
import io
import os
import platform
import re
import shutil
import stat
import subprocess
import sys
from importlib import metadata

import numpy as np
import pytest

import flexformer as ff
from flexformer.__main__ import build_parser, main
from flexformer._progress import ProgressLine
from conftest import make_inputs

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


# ---------------------------------------------------------------- command line

def test_no_command_prints_help_and_exits_0(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: flexformer")
    for command in ("train", "compare", "demo", "generate", "distill"):
        assert command in out


def test_version_flag_prints_the_package_version(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"flexformer {ff.__version__}"


def test_python_dash_m_with_no_command_is_quick_and_helpful():
    proc = subprocess.run([sys.executable, "-m", "flexformer"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0
    assert "usage: flexformer" in proc.stdout and "runs" not in proc.stderr


def test_every_option_of_every_command_has_help_text():
    parser = build_parser()
    commands = [a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction"][0]
    missing = []
    for name, sub in [("flexformer", parser)] + list(commands.choices.items()):
        for action in sub._actions:
            if action.option_strings and not (action.help and action.help.strip()):
                missing.append(f"{name} {action.option_strings[0]}")
    assert not missing, f"options without help text: {missing}"


def test_train_options_come_from_the_config_fields():
    """One place per option: every TrainConfig field (but clip and dtype) is an option of
    `flexformer train` with the field's help, no option given gives TrainConfig(), and
    each option given lands in its field."""
    import dataclasses

    from flexformer.training import TrainConfig
    from flexformer.training.options import config_from_options, option_name

    train = build_parser().train_parser
    by_dest = {a.dest: a for a in train._actions if a.option_strings}
    for field in dataclasses.fields(TrainConfig):
        if field.name in ("clip", "dtype"):
            assert field.name not in by_dest
            continue
        assert field.name in by_dest, field.name
        if field.name != "kernel_init_match_tau":   # a pair of flags, --kernel-init-{fixed,matched}-tau
            assert field.metadata["help"].split(";")[0] in by_dest[field.name].help
    assert config_from_options(train.parse_args([])) == TrainConfig()
    given = ["--features", "8", "--lr", "0.002", "--qk-norm", "--short-conv", "3", "--seq-len", "64",
             "--kernel-init-scale", "0.5", "--kernel-init-fixed-tau"]
    cfg = config_from_options(train.parse_args(given))
    assert (cfg.num_features, cfg.lr, cfg.qk_norm, cfg.short_conv, cfg.seq_len) == (8, 0.002, True, 3, 64)
    assert (cfg.kernel_init_scale, cfg.kernel_init_match_tau) == (0.5, False)
    assert option_name(next(f for f in dataclasses.fields(TrainConfig) if f.name == "num_features")) == "--features"


def test_console_script_is_declared_and_names_the_same_entry():
    scripts = {e.name: e.value for e in metadata.distribution("flexformer").entry_points
               if e.group == "console_scripts"}  # entry_points(group=...) needs Python 3.10
    assert scripts == {"flexformer": "flexformer.__main__:console_main"}
    exe = shutil.which("flexformer", path=os.path.dirname(sys.executable))
    if exe is not None:  # installed into this interpreter's environment
        proc = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0 and proc.stdout.strip() == f"flexformer {ff.__version__}"


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_redraws_on_a_terminal_and_logs_lines_elsewhere():
    log = io.StringIO()
    bar = ProgressLine(200, log)
    for step in range(1, 201):
        bar.show(step, f"step {step}")
    bar.close()
    lines = log.getvalue().splitlines()
    assert "\r" not in log.getvalue()
    assert lines[0] == "step 1" and lines[-1] == "step 200"
    assert 20 <= len(lines) <= 22  # one line every 5% (10 steps), the first and the last
    term = _Terminal()
    bar = ProgressLine(200, term)
    for step in range(1, 201):
        bar.show(step, f"step {step}")
    bar.close()
    text = term.getvalue()
    assert text.startswith("\rstep 1 ") and text.endswith("\rstep 200 \n")


def test_training_progress_in_a_log_file_has_no_carriage_returns(tmp_path):
    out = tmp_path / "run"
    log = tmp_path / "log.txt"
    with open(log, "w") as fh:
        proc = subprocess.run([sys.executable, "-m", "flexformer", "train", "--steps", "40", "--seq-len", "32",
                               "--batch-size", "4", "--dim", "16", "--heads", "2", "--depth", "1",
                               "--eval-batches", "1", "--out", str(out)],
                              stdout=subprocess.DEVNULL, stderr=fh, timeout=300)
    assert proc.returncode == 0
    text = log.read_text()
    assert "\r" not in text
    bars = [line for line in text.splitlines() if line.startswith("[")]
    assert bars[-1].startswith("[" + "#" * 24 + "] 40/40")
    assert 2 <= len(bars) <= 22


# ---------------------------------------------------------------- packaging

def test_license_and_spdx_metadata():
    meta = metadata.metadata("flexformer")
    assert os.path.isfile(os.path.join(ROOT, "LICENSE"))
    assert "MIT License" in open(os.path.join(ROOT, "LICENSE")).read()
    assert meta["License-Expression"] == "MIT"
    assert meta["Requires-Python"] == ">=3.9"
    assert any(c.startswith("Programming Language :: Python :: 3") for c in meta.get_all("Classifier"))


def test_one_version_source():
    assert metadata.version("flexformer") == ff.__version__
    pyproject = open(os.path.join(ROOT, "pyproject.toml")).read()
    assert re.search(r'^dynamic = \["version"\]', pyproject, re.M)
    assert not re.search(r"^version\s*=\s*\"", pyproject, re.M)  # no literal: read from _version.py
    written = [p for p in ("flexformer/__init__.py", "setup.py")
               if re.search(r'__version__\s*=\s*"|version\s*=\s*"', open(os.path.join(ROOT, p)).read())]
    assert written == []


def test_package_is_marked_typed():
    assert os.path.isfile(os.path.join(os.path.dirname(ff.__file__), "py.typed"))


# ---------------------------------------------------------------- builds

def _setuptools_version():
    try:
        import setuptools
    except ImportError:  # venvs of Python 3.12 and later start without it
        return (0, 0)
    return tuple(int(x) for x in re.findall(r"\d+", setuptools.__version__)[:2])


needs_build_requirements = pytest.mark.skipif(
    _setuptools_version() < (77, 0), reason="setup.py runs in this environment: needs setuptools>=77 (the build "
                                            "requirement; the test extra brings it)")


needs_gcc_on_x86 = pytest.mark.skipif(
    shutil.which("gcc") is None or platform.machine().lower() not in ("x86_64", "amd64"),
    reason="needs gcc to wrap, on x86-64 (where the kernels have AVX2 / AVX-512 copies)")


def _build(tmp_path, env):
    dest = tmp_path / "build"
    return subprocess.run([sys.executable, "setup.py", "build_ext", "--build-lib", str(dest), "--build-temp",
                           str(tmp_path / "tmp")], cwd=ROOT, env=dict(os.environ, **env), capture_output=True,
                          text=True, timeout=900), dest


@needs_build_requirements
def test_without_a_c_compiler_the_build_says_what_to_install(tmp_path):
    proc, _ = _build(tmp_path, {"CC": str(tmp_path / "no-such-cc")})
    assert proc.returncode != 0
    message = proc.stdout + proc.stderr
    assert "flexformer: no working C compiler" in message
    assert "apt-get install gcc python3-dev" in message
    assert "OpenMP" not in message  # the old, misleading cause


def _build_with_gcc_as(tmp_path, name, script):
    """Build with a wrapper of gcc (a shell script's body); the build's stderr, and the
    package (this checkout's Python files beside the new extension) to import."""
    wrapper = tmp_path / name
    wrapper.write_text("#!/bin/sh\n" + script)
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IEXEC)
    proc, dest = _build(tmp_path, {"CC": str(wrapper), "LDSHARED": f"{wrapper} -shared"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    shutil.copytree(os.path.dirname(ff.__file__), dest / "flexformer", dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("_C*", "__pycache__"))
    return proc.stderr, dest


def _kernels_match_reference(dest, first_line):
    """In a fresh process importing the package built into dest: `first_line` holds, and
    flex_s and flex_n (bidirectional and causal, float64) equal their NumPy references."""
    check = ("import numpy as np, flexformer as ff\n"
             "from flexformer import reference\n"
             f"{first_line}\n"
             "rng = np.random.default_rng(0)\n"
             "q, k, v = (rng.standard_normal((2, 2, 70, 8)) * 0.5 for _ in range(3))\n"
             "omega = ff.init.flex_s_omega(2, 16, 8, rng=1)\n"
             "o1, o2, tau = ff.init.flex_n_params(2, 16, 8, rng=1)\n"
             "for causal in (False, True):\n"
             "    for got, want in ((ff.flex_s_attention(q, k, v, omega, causal=causal),\n"
             "                       reference.flex_s_attention(q, k, v, omega, causal=causal)),\n"
             "                      (ff.flex_n_attention(q, k, v, o1, o2, tau, causal=causal),\n"
             "                       reference.flex_n_attention(q, k, v, o1, o2, tau, causal=causal))):\n"
             "        assert np.allclose(got, want, rtol=1e-9, atol=1e-11), abs(got - want).max()\n"
             "print(ff.__file__)\n")
    run = subprocess.run([sys.executable, "-c", check], cwd=dest.parent, env=dict(os.environ, PYTHONPATH=str(dest)),
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip().startswith(str(dest))


@needs_build_requirements
@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc to wrap")
def test_a_compiler_without_openmp_builds_serial_kernels_with_a_warning(tmp_path):
    stderr, dest = _build_with_gcc_as(tmp_path, "cc-without-openmp", 'for a in "$@"; do [ "$a" = -fopenmp ] && '
                                      '{ echo "no OpenMP" >&2; exit 1; }; done\nexec gcc "$@"\n')
    assert "flexformer: the C compiler" in stderr and "has no OpenMP" in stderr
    _kernels_match_reference(dest, "assert not ff.openmp_enabled() and ff.get_num_threads() == 1")


@needs_build_requirements
@needs_gcc_on_x86
def test_a_compiler_without_the_isa_copies_builds_the_portable_kernels_and_says_so(tmp_path):
    """A compiler for which ff_common.h turns off the AVX2 / AVX-512 copies (Clang, GCC < 11;
    here gcc told FF_NO_CLONES) builds working kernels, and the build says they are slower."""
    stderr, dest = _build_with_gcc_as(tmp_path, "cc-without-copies", 'exec gcc -DFF_NO_CLONES "$@"\n')
    assert "builds the kernels' portable copies only" in stderr and "GCC 11 or later" in stderr
    _kernels_match_reference(dest, "assert ff.dense_paths()['products'] == 'base' and ff.isa_level() == 0, "
                                   "ff.dense_paths()")


@needs_build_requirements
@needs_gcc_on_x86
def test_a_build_for_an_avx2_cpu_with_other_extensions_compiles_every_copy(tmp_path):
    """FLEXFORMER_NATIVE=1 on an AVX2 CPU without AVX-512 (a Zen 3's -march=native has SHA,
    VAES and more): the AVX-512 copies add their features to the build's instead of taking
    x86-64-v4's alone, which GCC refused (its intrinsics would not inline into them). Here
    gcc is told AVX2, FMA and SHA, which compiles on any x86-64 host; the kernels are run
    where this CPU has AVX2 (SHA is never emitted for this code)."""
    _, dest = _build_with_gcc_as(tmp_path, "cc-avx2-sha", 'exec gcc -mavx2 -mfma -msha "$@"\n')
    if ff.isa_level() >= 3:
        _kernels_match_reference(dest, "assert ff.isa_level() >= 3, ff.isa_level()")


# ---------------------------------------------------------------- NumPy-style inputs

def test_python_lists_take_the_dtype_of_the_arrays_beside_them():
    x = make_inputs(dtype=np.float32)
    want = ff.flex_s_attention(x["q"], x["k"], x["v"], x["omega"])
    got = ff.flex_s_attention(x["q"].tolist(), x["k"], x["v"], x["omega"].tolist())
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, want)
    got64 = ff.flex_s_attention(x["q"].tolist(), x["k"].tolist(), x["v"].tolist(), x["omega"].tolist())
    assert got64.dtype == np.float64
    np.testing.assert_allclose(got64, want, rtol=1e-5, atol=1e-6)


def test_a_number_for_a_per_head_parameter_is_every_heads():
    x = make_inputs()
    H = x["q"].shape[1]
    want = ff.flex_n_attention(x["q"], x["k"], x["v"], x["omega1"], x["omega2"], np.full(H, 1.5))
    for tau in (1.5, np.float64(1.5), [1.5] * H):
        np.testing.assert_array_equal(ff.flex_n_attention(x["q"], x["k"], x["v"], x["omega1"], x["omega2"], tau),
                                      want)
    x32 = make_inputs(dtype=np.float32)
    out = ff.flex_n_attention(x32["q"], x32["k"], x32["v"], x32["omega1"], x32["omega2"], 1.5)
    assert out.dtype == np.float32


def _swapped(x):
    """x with the same numbers in the other byte order (as read from a file a big-endian
    machine wrote): dtype '>f8' on this machine."""
    x = np.asarray(x)
    return x.astype(x.dtype.newbyteorder("S")) if x.dtype.kind == "f" else x


def _flat(result):
    """The arrays of a forward's or backward's result, in order (dicts by name)."""
    out = []
    for r in result if isinstance(result, tuple) else (result,):
        out += [r[n] for n in sorted(r)] if isinstance(r, dict) else [r]
    return out


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("kind", ff.attention_kinds())
def test_arrays_in_the_other_byte_order_give_the_native_results(kind, dtype):
    """Every kind's forward and backward, and its recurrent decoding, give the same bits for
    arrays in the other byte order as for native ones (the numbers are the same)."""
    spec = ff.get_attention(kind)
    B, H, N, d = 2, 2, 12, 8
    rng = np.random.default_rng(0)
    q, k, v = (0.4 * rng.standard_normal((B, H, N, d)).astype(dtype) for _ in range(3))
    params = spec.init(H, d, rng=1, dtype=dtype, **({"max_len": N} if kind == "linformer" else {}))
    swapped = {n: _swapped(a) for n, a in params.items()}
    assert _swapped(q).dtype.byteorder in "<>" and not _swapped(q).dtype.isnative
    for causal in (False, True) if spec.causal else (False,):
        want = ff.attention(kind, q, k, v, params, causal=causal)
        got = ff.attention(kind, _swapped(q), _swapped(k), _swapped(v), swapped, causal=causal)
        assert got.dtype == dtype
        np.testing.assert_array_equal(got, want)
        dout = np.ones_like(want)
        for g, w in zip(_flat(ff.attention_backward(kind, _swapped(dout), _swapped(q), _swapped(k), _swapped(v),
                                                    swapped, causal=causal)),
                        _flat(ff.attention_backward(kind, dout, q, k, v, params, causal=causal))):
            np.testing.assert_array_equal(g, w)
    if spec.recurrent:
        def decode(p, q, k, v):
            rec = ff.RecurrentAttention(kind, p)
            out, state = rec.prefill(q[:, :, :8], k[:, :, :8], v[:, :, :8])
            return out, rec.step(state, q[:, :, 8:9], k[:, :, 8:9], v[:, :, 8:9])
        for g, w in zip(decode(swapped, _swapped(q), _swapped(k), _swapped(v)), decode(params, q, k, v)):
            np.testing.assert_array_equal(g, w)


def test_states_layers_and_checks_take_the_other_byte_order():
    """The decoding states, the NumPy layers, the gradient checks and distillation's teacher
    take arrays in the other byte order as the same numbers."""
    rng = np.random.default_rng(0)
    B, H, N, d = 1, 2, 10, 8
    q, k, v = (0.4 * rng.standard_normal((B, H, N, d)) for _ in range(3))
    rec = ff.RecurrentAttention("flex_s", ff.get_attention("flex_s").init(H, d, rng=1))
    _, state = rec.prefill(q[:, :, :8], k[:, :, :8], v[:, :, :8])
    copy = ff.LinearAttentionState(*(_swapped(a) for a in (state.S, state.z, state.R, state.M)), tokens=8)
    assert copy.dtype == np.float64
    step = (q[:, :, 8:9], k[:, :, 8:9], v[:, :, 8:9])
    np.testing.assert_array_equal(rec.step(copy, *step), rec.step(state, *step))

    soft = ff.RecurrentAttention("softmax", {})
    _, cache = soft.prefill(q[:, :, :8], k[:, :, :8], v[:, :, :8])
    _, cache_swapped = soft.prefill(q[:, :, :8], k[:, :, :8], v[:, :, :8])
    cache.append(k[:, :, 8:], v[:, :, 8:], np.ones((B, 2), bool))
    cache_swapped.append(_swapped(k[:, :, 8:]), _swapped(v[:, :, 8:]), np.ones((B, 2), bool))
    np.testing.assert_array_equal(soft.step(cache_swapped, *step), soft.step(cache, *step))

    layer = ff.nn.MultiHeadAttention(16, 2, attention="flex_n", rng=0, dtype=np.float32)
    x = rng.standard_normal((2, N, 16)).astype(np.float32)
    np.testing.assert_array_equal(layer.forward(_swapped(x)), layer.forward(x))

    x64 = rng.standard_normal(3)
    g = ff.testing.numerical_gradient(lambda: float((x64 ** 3).sum()), x64)
    np.testing.assert_allclose(g, 3 * x64 ** 2, rtol=1e-6)
    xs = _swapped(x64)
    np.testing.assert_array_equal(ff.testing.numerical_gradient(lambda: float((xs ** 3).sum()), xs), g)
    omega = ff.get_attention("flex_s").init(H, d, rng=1)["omega"]
    errors = ff.testing.gradcheck(lambda q: ff.flex_s_attention(q, k, v, omega),
                                  lambda dout, q: ff.flex_s_attention_backward(dout, q, k, v, omega)[:1],
                                  [_swapped(q)])
    assert max(errors.values()) < 1e-6

    from flexformer import distill
    np.testing.assert_array_equal(distill.teacher_rows(_swapped(q), _swapped(k)), distill.teacher_rows(q, k))


@pytest.mark.parametrize("order", [">", "<"])
def test_a_dtype_argument_in_either_byte_order_makes_native_arrays(order):
    """dtype='>f4' (the dtype an array from a big-endian file carries) is float32 wherever a
    dtype is asked for: the initialisers, layers and states make native arrays (it was refused)."""
    for name, want in (("f4", np.float32), ("f8", np.float64)):
        dtype = order + name
        params = ff.get_attention("flex_n").init(2, 4, rng=0, dtype=dtype)
        assert all(p.dtype == want and p.dtype.isnative for p in params.values())
        np.testing.assert_array_equal(params["omega1"], ff.get_attention("flex_n").init(2, 4, rng=0, dtype=want)["omega1"])
        assert ff.nn.Linear(2, 3, 0, dtype=dtype).W.value.dtype == want
        assert ff.LinearAttentionState.empty(1, 2, 4, 4, dtype=dtype).dtype == want
    with pytest.raises(TypeError, match="dtype must be float32 or float64, got int32"):
        ff.nn.Linear(2, 3, 0, dtype=order + "i4")


@pytest.mark.parametrize("position,name", [(0, "q"), (1, "k"), (2, "v"), (3, "omega")])
def test_errors_name_the_argument_at_fault(position, name):
    x = make_inputs()
    args = [x["q"], x["k"], x["v"], x["omega"]]
    args[position] = [[1.0, 2.0], [3.0]]  # ragged: NumPy cannot convert it
    with pytest.raises(TypeError, match=rf"^{name} must be an array of real numbers"):
        ff.flex_s_attention(*args)
    if position < 3:
        args = [x["q"], x["k"], x["v"], x["omega"]]
        args[position] = args[position].astype(np.float32)  # a float32 array among float64 ones
        blamed = name if position > 0 else "k"  # q sets the call's dtype
        with pytest.raises(TypeError, match=rf"^{blamed} must have dtype"):
            ff.flex_s_attention(*args)


def test_a_list_query_beside_float32_keys_names_no_innocent_argument():
    x = make_inputs(dtype=np.float32)
    out = ff.flex_s_attention(x["q"].tolist(), x["k"], x["v"], x["omega"])
    assert out.dtype == np.float32


@pytest.mark.parametrize("kind", ff.attention_kinds())
def test_registry_calls_check_parameter_names(kind):
    spec = ff.get_attention(kind)
    x = make_inputs(B=1, H=2, Nq=8, d=4, e=4, m=4)
    params = spec.init(2, 4, num_features=4, rng=0, **({"max_len": 8} if kind == "linformer" else {}))
    expected = ", ".join(spec.params) if spec.params else "no parameters"
    with pytest.raises(ValueError, match=re.escape(f"params for {kind} must hold {expected}; unknown omgea")):
        spec.forward(x["q"], x["k"], x["v"], dict(params, omgea=1.0))
    for name in spec.params:
        partial = {n: p for n, p in params.items() if n != name}
        with pytest.raises(ValueError, match=re.escape(f"must hold {expected}; missing {name}")):
            spec.forward(x["q"], x["k"], x["v"], partial)
        with pytest.raises(ValueError, match=re.escape(f"missing {name}")):
            spec.backward(x["v"], x["q"], x["k"], x["v"], partial)
