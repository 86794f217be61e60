"""benchmarks/ab_builds.py's second order (--both-orders) runs with every option of the
first: the swapped command line is built from the parsed options, not from a list of them."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
import ab_builds  # noqa: E402

SKIP = ("checkout_a", "checkout_b", "both_orders")


@pytest.mark.parametrize("argv", [
    ["old", "new"],
    ["old", "new", "--both-orders"],
    ["--pairs", "12", "old", "new", "--kinds", "flex_s", "--seq-len", "512", "--threads", "1", "--both-orders"],
    ["old", "new", "--kinds", "flex_n", "flex_s", "--pairs", "7"],
])
def test_swapped_command_line_keeps_every_option(argv):
    args = ab_builds.parser().parse_args(argv)
    again = ab_builds.parser().parse_args([args.checkout_b, args.checkout_a, *ab_builds.option_args(args, SKIP)])
    assert (again.checkout_a, again.checkout_b) == (args.checkout_b, args.checkout_a)
    assert not again.both_orders  # the second process must not start a third
    for dest, value in vars(args).items():
        if dest not in SKIP:
            assert getattr(again, dest) == value, dest


def test_a_new_option_is_passed_on():
    """An option added to the parser later reaches the swapped run without a change here."""
    ap = ab_builds.parser()
    ap.add_argument("--new-knob", type=float, default=1.0)
    ap.add_argument("--flag", action="store_true")
    args = ap.parse_args(["a", "b", "--new-knob", "2.5", "--flag"])
    assert ab_builds.option_args(args, SKIP)[-3:] == ["--new-knob", "2.5", "--flag"]
