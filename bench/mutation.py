"""Mutation testing of the defences of issue 35: robust.py, aggregation.py, validation.py, chunking.py.

Two sets of mutants per module, each run against only the tests that exercise that module:

* **cosmic-ray 8.7.0**: every core operator (`cosmic-ray init`; its session file, a
  ``<module>.sqlite`` in the work directory, holds the results, so ``cr-report`` works on it);
* **guard removal**, written here with ``ast``: every ``if``/``while`` condition replaced by ``False``,
  every operand of an ``and``/``or`` dropped in turn, every ``where=`` keyword removed, and every
  statement that only changes state (``x += ...``, a bare call, a re-assignment) deleted.

A mutant is *killed* when a test fails (or the run times out), *survives* otherwise. A survivor
must be listed in ``EQUIVALENT`` below with the reason no observable behaviour can differ; any
other survivor is printed with its diff and the run exits 1.

Mutants are written into a scratch copy of the checkout (``--workdir``, default
``/tmp/edgefl-mutation``), never into the checkout itself. By default each mutant's tests run
in a child forked from a process that has already imported numpy, torch and pytest (about a
second a mutant instead of five); ``--engine cosmic-ray`` runs the cosmic-ray mutants with
``cosmic-ray exec`` instead (one ``python -m pytest`` per mutant, as cosmic-ray does).

Run it from the repository root in its own virtual environment (ignored by git)::

    python3 -m venv .venv-mutation
    .venv-mutation/bin/pip install "torch==2.13.0" -e ".[all]" "cosmic-ray==8.7.0"
    OMP_NUM_THREADS=1 .venv-mutation/bin/python bench/mutation.py            # all four modules
    OMP_NUM_THREADS=1 .venv-mutation/bin/python bench/mutation.py chunking   # one of them
"""

from __future__ import annotations

import argparse
import ast
import difflib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

REPO = Path(__file__).resolve().parents[1]
PROJECT_PACKAGES = ("coordinator", "edge_sdk", "simulation", "tests", "bench")


def _nth_replace(text: str, old: str, new: str, n: int) -> str:
    """``text`` with the ``n``-th (from 0) occurrence of ``old`` replaced."""
    parts = text.split(old)
    return old.join(parts[:n + 1]) + new + old.join(parts[n + 1:])


@dataclass(frozen=True)
class Target:
    path: str
    tests: tuple[str, ...]  # fast, exact tests first: -x stops at the first failure
    deselect: str = ""  # a pytest -k expression (tests needing a broker are left out)
    #: slower tests, run only for a mutant the fast ones let through (the outcome is the same as
    #: running them all with -x; a mutant they kill is counted as killed)
    slow: tuple[str, ...] = ()


TARGETS = {
    "robust": Target("coordinator/aggregate/robust.py", ("tests/coordinator/test_robust_exact.py",), "not real_broker",
                     ("tests/coordinator/test_robust.py",)),
    "aggregation": Target("coordinator/aggregate/averaging.py", ("tests/coordinator/test_robust_exact.py",), "not real_broker",
                          ("tests/coordinator/test_robust.py",)),
    "validation": Target("coordinator/aggregate/validation.py",
                         ("tests/coordinator/test_validation_exact.py", "tests/coordinator/test_fuzz_validation.py")),
    "chunking": Target("edge_sdk/protocol/chunking.py", ("tests/edge_sdk/protocol/test_reassembly_exact.py",), "",
                       ("tests/edge_sdk/protocol/test_chunking.py",)),
}

#: Survivors that are equivalent: ``(module, original line, mutated line)`` -> why nothing
#: observable can differ. Lines are stripped; a mutant spanning several lines is keyed by its first
#: changed line.
_FINITE = ("updates decode only to SAFE_DTYPES and must have the spec's dtype; np.isfinite of an int, uint or "
           "bool array is all True, so testing non-float kinds too changes nothing")
_UNIFORM = ("the fallback when every weight was scaled to 0: any common non-zero constant gives the same "
            "result, as every mean divides by its holders' summed weight (integer counters, the only tensors "
            "it can move, then differ at most in the last bit of a float64 before rounding)")
_MIN_CUT = ("cut = floor(trim * k) with trim < 0.5 is at most (k - 1) // 2 already (for the largest trim below "
            "0.5 too), and max(cut, 1) from 3 holders as well: this bound never binds, so changing it changes nothing")
_SCALE = ("normalising the weights is not needed for the result: after clipping they are normalised again and "
          "every mean divides by its holders' summed weight, so a common factor cancels (it could show at most in "
          "the last bit of a float64 before the float32 cast)")
_BREAK = ("the loop reaches k * max_share >= 1 only when every weight below the k largest is 0 (at the last k "
          "with k max_share < 1 the cap covers the next weight, up to rounding); c is then 0 or NaN, never > 0, so "
          "leaving or going on ends in the same equal weights (a search over 1.5 million weight vectors and 14 "
          "caps found no difference)")
_ONLY_KEEP = ("with only the transfer being added to open, the global budget cannot be short: it holds at most "
              "total_bytes <= max_total_bytes <= max_buffered_bytes (checked in __init__)")
_HEADER = ("unreachable: a valid chunk's header is at most 384 bytes (docs/protocol.md; "
           "test_every_chunk_fits_even_with_worst_case_header), so a frame is at most chunk_size - 128")
_LEX = "for the three valid rules (checked in __post_init__), 'mean' is the only one <= 'mean'"
_RENORMALISE = ("w is normalised already (above); normalising it a second time when nothing was scaled back changes at "
                "most the last bit of a float64 weight, which the float32 result hides (200 random folds: identical)")
_GUARD = "if (scales < 1.0).any():  # a screen that scales nothing back changes nothing, to the bit"
_STRICT = "the lengths are equal by construction (one weight and one scale per tensor set, checked on entry)"
EQUIVALENT: dict[tuple[str, str, str], str] = {
    **{("robust", _GUARD, _GUARD.replace("scales < 1.0", after)): _RENORMALISE
       for after in ("scales != 1.0", "scales <= 1.0", "scales < 2.0")},
    ("robust", "for d, w in zip(deltas, weights, strict=True):",
     "for d, w in zip(deltas, weights, strict=False):"): _STRICT,
    ("robust", "ds = [_delta(t[k], base[k]) * s for t, s in zip(tensor_sets, scales, strict=True)]",
     "ds = [_delta(t[k], base[k]) * s for t, s in zip(tensor_sets, scales, strict=False)]"): _STRICT,
    ("aggregation", "for tensors, w in zip(tensor_sets, weights, strict=True):  # lengths checked above",
     "for tensors, w in zip(tensor_sets, weights, strict=False):  # lengths checked above"): _STRICT,
    **{("validation", 'if array.dtype.kind == "f" and not np.isfinite(array).all():', after): _FINITE
       for after in ('if array.dtype.kind <= "f" and not np.isfinite(array).all():',
                     'if array.dtype.kind >= "f" and not np.isfinite(array).all():',
                     'if array.dtype.kind is not "f" and not np.isfinite(array).all():',
                     'if (not np.isfinite(array).all()):')},
    ("robust", "lo, hi = np.maximum(k - 1, 0) // 2, k // 2  # the middle one or two",
     "lo, hi = np.maximum(k - 1, 1) // 2, k // 2  # the middle one or two"):
        "max(k - 1, 1) // 2 == max(k - 1, 0) // 2 for every k >= 0 (both 0 for k = 0, 1, 2)",
    ("robust", 'folded = _fold_mean(base[k].shape, ds, w) if config.rule == "mean" \\',
     'folded = _fold_mean(base[k].shape, ds, w) if config.rule <= "mean" \\'): _LEX,
    ("robust", "total = np.take_along_axis(sums, (k - cut)[None], 0)[0] - np.take_along_axis(sums, cut[None], 0)[0]",
     "total = np.take_along_axis(sums, (k - cut)[None], 0)[ -1] - np.take_along_axis(sums, cut[None], 0)[0]"):
        "the taken array has a leading axis of length 1: [-1] is [0]",
    ("robust", "total = np.take_along_axis(sums, (k - cut)[None], 0)[0] - np.take_along_axis(sums, cut[None], 0)[0]",
     "total = np.take_along_axis(sums, (k - cut)[None], 0)[0] - np.take_along_axis(sums, cut[None], 0)[ -1]"):
        "the taken array has a leading axis of length 1: [-1] is [0]",
    ("robust", "mid = np.take_along_axis(stack, lo[None], 0)[0] + np.take_along_axis(stack, hi[None], 0)[0]",
     "mid = np.take_along_axis(stack, lo[None], 0)[ -1] + np.take_along_axis(stack, hi[None], 0)[0]"):
        "the taken array has a leading axis of length 1: [-1] is [0]",
    ("robust", 'if rule == "median":', 'if rule <= "median":'):
        "_fold_order gets 'median' or 'trimmed' only, and 'trimmed' > 'median'",
    ("robust", "return np.where(k > 0, mid / 2, 0.0)", "return np.where(k != 0, mid / 2, 0.0)"):
        "k counts holders: never negative",
    ("robust", "full = all(np.shape(t[k]) == np.shape(current[k]) for t in tensor_sets for k in current)",
     "full = all(np.shape(t[k]) >= np.shape(current[k]) for t in tensor_sets for k in current)"):
        "a leading block is nowhere larger than its tensor, so it is >= (lexicographically) only when equal",
    ("robust", "cut = np.where(k >= 3, np.maximum(cut, 1), cut)  # at least one per side from 3 holders",
     "cut = np.where(k >= 2, np.maximum(cut, 1), cut)  # at least one per side from 3 holders"): _MIN_CUT,
    **{("aggregation", "rest = np.concatenate([np.cumsum(desc[::-1])[::-1], [0.0]])  # rest[k] = sum of all but "
        "the k largest", f"rest = np.concatenate([np.cumsum(desc[::-1])[::-1], [{after}]])  # rest[k] = sum of all "
        "but the k largest"): "rest[len(w)] is never read: k < len(w)" for after in (" -1.0", " 1.0")},
    **{("aggregation", "if w.ndim != 1 or len(w) == 0:", after): why for after, why in (
        ("if w.ndim != 1 or len(w) <= 0:", "a length is never negative"),
        ("if w.ndim > 1 or len(w) == 0:", "np.asarray(list(...)) is at least 1-D"))},
    ("aggregation", "if not np.isfinite(w).all() or (w < 0).any() or not w.sum() > 0:",
     "if not np.isfinite(w).all() or (w < 0).any() or not w.sum() != 0:"):
        "negative weights were refused by the clause before: the sum is never below 0",
    **{("aggregation", "if k * max_share >= 1:", after): _BREAK
       for after in ("if k * max_share == 1:", "if False:")},
    ("aggregation", "break", "continue"): _BREAK,
    ("aggregation", "for k in range(1, len(w)):  # cap the k largest at c, with c = max_share * (k c + rest[k])",
     "for k in range( 0, len(w)):  # cap the k largest at c, with c = max_share * (k c + rest[k])"):
        "k = 0 gives c = max_share * sum, below the largest weight (else the early return): it never returns",
    ("aggregation", "if desc[k] <= cap and cap > 0:  # cap 0: only zero weights besides the k largest; no cap holds",
     "if desc[k] <= cap and cap != 0:  # cap 0: only zero weights besides the k largest; no cap holds"):
        "while k * max_share < 1, cap = max_share * rest[k] / (1 - k max_share) is never negative",
    **{("aggregation", before, before.replace("[0]", "[ -1]")):
       "every set holds the same names and shapes (weighted_average's precondition; robust_aggregate passes "
       "{k: t[k] for k in current} of whole tensors only)"
       for before in ("acc = np.zeros(tensor_sets[0][name].shape, dtype=np.float64)", "for name in tensor_sets[0]:")},
    **{("chunking", before, before.replace(old, new)): "the default is only indexed at the other position"
       for before, old, new in (
           ("return self._by_source.get(source, [0, 0])[1]", "[0, 0]", "[ 1, 0]"),
           ("return self._by_source.get(source, [0, 0])[1]", "[0, 0]", "[ -1, 0]"),
           ("while self._by_source.get(source, [0, 0])[0] >= self.max_pending_per_source:", "[0, 0]", "[0, 1]"),
           ("while self._by_source.get(source, [0, 0])[0] >= self.max_pending_per_source:", "[0, 0]", "[0, -1]"))},
    ("chunking", "while self._by_source.get(source, [0, 0])[0] >= self.max_pending_per_source:",
     "while self._by_source.get(source, [ -1, 0])[0] >= self.max_pending_per_source:"):
        "the default is read for a source with nothing open: 0 and -1 are both below max_pending_per_source >= 1",
    **{("chunking", before, _nth_replace(before, "is not int", "!= int", i)):
       "a type compares equal only to itself: != is 'is not' for the class int"
       for before, i in (("if type(chunk.index) is not int or type(chunk.count) is not int or not 0 <= chunk.index "
                          "< chunk.count:", 0),
                         ("if type(chunk.index) is not int or type(chunk.count) is not int or not 0 <= chunk.index "
                          "< chunk.count:", 1),
                         ("elif type(max_bytes) is not int or not 0 <= max_bytes <= self.max_buffered_bytes:", 0),
                         ("if type(max_bytes) is not int or not 0 <= max_bytes <= self.max_buffered_bytes:", 0))},
    ("chunking", "if held[0] == 0:", "if held[0] <= 0:"): "an open-transfer count is never negative",
    ("chunking", "if len(payload) != t.total_bytes or hashlib.sha256(payload).digest() != t.sha256:",
     "if len(payload) < t.total_bytes or hashlib.sha256(payload).digest() != t.sha256:"):
        "a transfer never holds more than total_bytes (refused as malformed when a chunk would overflow it)",
    ("chunking", "if len(t.parts) < t.count:", "if len(t.parts) != t.count:"):
        "a transfer never holds more than count parts (indices are checked to be below count)",
    ("chunking", "while len(self._pending) >= self.max_pending:", "while len(self._pending) == self.max_pending:"):
        "the loop evicts whenever max_pending is reached: the number open never exceeds it",
    ("chunking", "while self._by_source.get(source, [0, 0])[0] >= self.max_pending_per_source:",
     "while self._by_source.get(source, [0, 0])[0] == self.max_pending_per_source:"):
        "the loop evicts whenever max_pending_per_source is reached: a source never has more open",
    ("chunking", "if len(wire) > chunk_size:  # cannot happen for valid senders; never emit oversize",
     "if len(wire) >= chunk_size:  # cannot happen for valid senders; never emit oversize"): _HEADER,
    **{("chunking", "if len(wire) > chunk_size:  # cannot happen for valid senders; never emit oversize",
        f"if {after}:  # cannot happen for valid senders; never emit oversize"): _HEADER
       for after in ("False", "len(wire) is chunk_size", "len(wire) == chunk_size")},
    **{("chunking", "while self._buffered + size > self.max_buffered_bytes and len(self._pending) > 1:", after):
       _ONLY_KEEP for after in (
           "while self._buffered + size > self.max_buffered_bytes and len(self._pending) >= 1:",
           "while self._buffered + size > self.max_buffered_bytes and len(self._pending) > 0:",
           "while self._buffered + size > self.max_buffered_bytes and len(self._pending) > 1:".replace("> 1", "!= 1"),
           "while self._buffered + size > self.max_buffered_bytes and len(self._pending) != 1:",
           "while (self._buffered + size > self.max_buffered_bytes):")},
    ("robust", "lo, hi = np.maximum(k - 1, 0) // 2, k // 2  # the middle one or two",
     "lo, hi = np.maximum(k - 1, -1) // 2, k // 2  # the middle one or two"):
        "differs only for k = 0 (index -1 instead of 0), a coordinate nobody holds, which np.where sets to 0",
    ("robust", "if len(tensor_sets) >= 3 and config.max_share < 1.0:",
     "if len(tensor_sets) >= 3 and config.max_share != 1.0:"): "max_share is checked to be <= 1 in __post_init__",
    ("robust", "if len(tensor_sets) == 0:", "if len(tensor_sets) <= 0:"): "a length is never negative",
    ("robust", "return np.divide(acc, held, out=np.zeros(shape, dtype=np.float64), where=held > 0)",
     "return np.divide(acc, held, out=np.zeros(shape, dtype=np.float64), where=held != 0)"):
        "held sums non-negative weights (check_weights, scales >= 0): never negative",
    ("robust", "w = w / w.sum() if w.sum() > 0 else np.full(len(w), 1.0 / len(w))",
     "w = w / w.sum() if w.sum() != 0 else np.full(len(w), 1.0 / len(w))"):
        "the weights are non-negative, so their sum is never below 0",
    ("robust", "w = w / w.sum() if w.sum() > 0 else np.full(len(w), 1.0 / len(w))",
     "w = w * w.sum() if w.sum() > 0 else np.full(len(w), 1.0 / len(w))"): _SCALE,
    ("robust", "w = w / w.sum()", "w = w * w.sum()"): _SCALE,
    ("robust", "w = w / w.sum()", "pass"): _SCALE,
    ("robust", "cut = np.minimum(cut, np.maximum(k - 1, 0) // 2)  # always keep one or two",
     "pass  # always keep one or two"): _MIN_CUT,
    ("robust", "metrics.update(clip_bound=bound, clipped=float(np.sum(scales < 1.0)))",
     "metrics.update(clip_bound=bound, clipped=float(np.sum(scales != 1.0)))"):
        "scales = min(1, ...) is never above 1, so != 1 is < 1",
    ("robust", "mid = np.take_along_axis(stack, lo[None], 0)[0] + np.take_along_axis(stack, hi[None], 0)[0]",
     "mid = np.take_along_axis(stack, lo[None], 0)[0] + np.take_along_axis(stack, hi[None], 0)[ -1]"):
        "the taken array has a leading axis of length 1: [-1] is [0]",
    ("robust", "return np.divide(total, count, out=np.zeros(shape, dtype=np.float64), where=count > 0)",
     "return np.divide(total, count, out=np.zeros(shape, dtype=np.float64), where=count != 0)"):
        "count = k - 2 cut is never negative (cut <= (k - 1) // 2), so != 0 is > 0",
    ("robust", "candidates = [float(norms.min())] if len(norms) == 2 else []",
     "candidates = [float(norms.min())] if len(norms) >= 2 else []"):
        "three or more norms returned their median above: here len(norms) >= 2 means == 2",
    **{("robust", "w = w / w.sum() if w.sum() > 0 else np.full(len(w), 1.0 / len(w))",
        f"w = w / w.sum() if w.sum() > 0 else np.full(len(w), {after})"): _UNIFORM
       for after in ("1.0 ** len(w)", "1.0 * len(w)", "1.0 + len(w)", "1.0 % len(w)", "2.0 / len(w)")},
    **{("robust", "cut = np.minimum(cut, np.maximum(k - 1, 0) // 2)  # always keep one or two",
        f"cut = np.minimum(cut, {after})  # always keep one or two"): _MIN_CUT
       for after in ("np.maximum(k + 1, 0) // 2", "np.maximum(k - 1, 1) // 2", "np.maximum(k - 1, -1) // 2",
                     "np.maximum(k - 1, 0) // 1", "np.maximum(k - 1, 0) ** 2", "np.maximum(k * 1, 0) // 2",
                     "np.maximum(k ** 1, 0) // 2", "np.maximum(k // 1, 0) // 2", "np.maximum(k - 1, 0) + 2",
                     "np.maximum(k - 1, 0) << 2", "np.maximum(k - 1, 0) * 2", "np.maximum(k << 1, 0) // 2",
                     "np.maximum(k | 1, 0) // 2", "np.maximum(k ^ 1, 0) // 2", "np.maximum(k - 1, 0) | 2",
                     "np.maximum(k - 0, 0) // 2")},
}


# ------------------------------------------------------------------------------- own mutants

@dataclass(frozen=True)
class Mutant:
    kind: str
    source: str  # the whole mutated module

    def key(self, module: str, original: str) -> tuple[str, str, str]:
        return (module, *changed_line(original, self.source))


def changed_line(original: str, mutated: str) -> tuple[str, str]:
    """The first line that differs, before and after (stripped)."""
    a, b = original.splitlines(), mutated.splitlines()
    for i in range(max(len(a), len(b))):
        x = a[i] if i < len(a) else ""
        y = b[i] if i < len(b) else ""
        if x != y:
            return x.strip(), y.strip()
    return "", ""


def _offsets(source: str) -> list[int]:
    starts, total = [0], 0
    for line in source.splitlines(keepends=True):
        total += len(line.encode())
        starts.append(total)
    return starts


def _replace(source: str, node: ast.AST, text: str) -> str:
    raw = source.encode()
    starts = _offsets(source)
    lo = starts[node.lineno - 1] + node.col_offset  # type: ignore[attr-defined]
    hi = starts[node.end_lineno - 1] + node.end_col_offset  # type: ignore[attr-defined]
    return (raw[:lo] + text.encode() + raw[hi:]).decode()


def annotation_spans(source: str) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """``((line, col), (end_line, end_col))`` of every annotation: with ``from __future__ import
    annotations`` they are strings that nothing here evaluates, so mutating them changes nothing."""
    tree = ast.parse(source)
    assert any(isinstance(n, ast.ImportFrom) and n.module == "__future__" and
               any(a.name == "annotations" for a in n.names) for n in tree.body)
    nodes = [n.annotation for n in ast.walk(tree) if isinstance(n, (ast.arg, ast.AnnAssign)) and n.annotation]
    nodes += [n.returns for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.returns]
    return [((n.lineno, n.col_offset), (n.end_lineno, n.end_col_offset)) for n in nodes]  # type: ignore[misc]


ANNOTATION = "mutates a type annotation, a string never evaluated (from __future__ import annotations)"


def _bound_names(func: ast.AST) -> set[str]:
    return {a.arg for a in ast.walk(func) if isinstance(a, ast.arg)}


def guard_mutants(source: str) -> list[Mutant]:
    """Guard-removal mutants of ``source`` (see the module doc)."""
    tree = ast.parse(source)
    out: list[Mutant] = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.If, ast.While, ast.IfExp)):
            out.append(Mutant("guard_false", _replace(source, node.test, "False")))
        if isinstance(node, ast.BoolOp) and len(node.values) >= 2:
            for i in range(len(node.values)):
                rest = node.values[:i] + node.values[i + 1:]
                new = rest[0] if len(rest) == 1 else ast.BoolOp(node.op, rest)
                out.append(Mutant("drop_clause", _replace(source, node, f"({ast.unparse(new)})")))
        if isinstance(node, ast.Call):
            for kw in node.keywords:
                if kw.arg == "where":
                    call = ast.Call(node.func, node.args, [k for k in node.keywords if k is not kw])
                    out.append(Mutant("drop_where", _replace(source, node, ast.unparse(call))))
    for func in ast.walk(tree):
        if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        assigned = _bound_names(func)
        body_nodes = [n for n in ast.walk(func) if isinstance(n, ast.stmt) and n is not func]
        for stmt in sorted(body_nodes, key=lambda n: (n.lineno, n.col_offset)):
            if isinstance(stmt, ast.AugAssign) or (
                    isinstance(stmt, ast.Expr) and not isinstance(stmt.value, ast.Constant)):
                out.append(Mutant("delete_statement", _replace(source, stmt, "pass")))
            elif isinstance(stmt, (ast.Assign, ast.AnnAssign)):
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                names = {t.id for t in targets if isinstance(t, ast.Name)}
                if names and names <= assigned and stmt.value is not None:  # a re-assignment
                    out.append(Mutant("delete_statement", _replace(source, stmt, "pass")))
                assigned |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
            elif isinstance(stmt, (ast.For, ast.With)):
                assigned |= {n.id for n in ast.walk(stmt.target if isinstance(stmt, ast.For) else stmt)
                             if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    unique: dict[str, Mutant] = {}
    for m in out:
        if m.source != source:
            compile(m.source, "<mutant>", "exec")  # every mutant must be valid Python
            unique.setdefault(m.source, m)
    return list(unique.values())


# ------------------------------------------------------------------------------- running tests

class ForkRunner:
    """Runs pytest in a child forked from a process that has imported the heavy dependencies."""

    def __init__(self, workdir: Path, target: Target) -> None:
        self.workdir = workdir
        self.target = target
        self.log = workdir / "mutant-output.txt"
        import numpy  # noqa: F401
        import pytest  # noqa: F401
        import torch

        torch.set_num_threads(1)
        import hypothesis  # noqa: F401
        for test in target.tests + target.slow:  # warm every import the tests need
            __import__(test[:-3].replace("/", "."))
        # then forget the target, every project module that imports it (directly or not) and the
        # tests: a child imports those afresh, the mutated file from disk; the rest stays loaded
        self.stale = dependents(target.path[:-3].replace("/", "."))
        self._purge()

    def _purge(self) -> None:
        for name in list(sys.modules):
            if name in self.stale or name.split(".")[0] == "tests" or name.startswith("test_"):
                del sys.modules[name]

    def args(self, slow: bool) -> list[str]:
        args = ["-x", "-q", "-p", "no:cacheprovider", "--noconftest", *self.target.tests]
        args += self.target.slow if slow else ()
        return args + (["-k", self.target.deselect] if self.target.deselect else [])

    def run(self, timeout: float) -> tuple[str, str]:
        """``(outcome, output tail)``: outcome ``killed`` or ``survived``."""
        outcome, output = self._run(timeout, False)
        if outcome == "survived" and self.target.slow:
            outcome, output = self._run(timeout, True)
        return outcome, output

    def _run(self, timeout: float, slow: bool) -> tuple[str, str]:
        pid = os.fork()
        if pid == 0:  # the child: fresh project modules, the mutated file read from disk
            rc = 70
            try:
                fd = os.open(self.log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
                os.dup2(fd, 1)
                os.dup2(fd, 2)
                import pytest

                os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"  # no entry-point plugins: seconds less a mutant
                self._purge()
                rc = int(pytest.main(self.args(slow)))
            finally:
                os._exit(rc)
        deadline = time.monotonic() + timeout
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return "killed", "timeout"
            time.sleep(0.02)
        output = self.log.read_text(errors="replace")[-2000:]
        return ("survived" if os.waitstatus_to_exitcode(status) == 0 else "killed"), output


def _imports(name: str, module: object) -> set[str]:
    """The modules ``module`` (called ``name``) imports, as absolute names."""
    path = getattr(module, "__file__", None)
    if not path or not path.endswith(".py"):
        return set()
    package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(Path(path).read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package
            for _ in range(node.level - 1):
                base = base.rpartition(".")[0]
            base = (f"{base}.{node.module}" if node.module else base) if node.level else (node.module or "")
            out |= {base} | {f"{base}.{a.name}" for a in node.names}
    return out


def dependents(target: str) -> set[str]:
    """``target`` and every loaded project module that imports it, directly or through others."""
    graph = {name: _imports(name, m) for name, m in list(sys.modules.items())
             if name.split(".")[0] in PROJECT_PACKAGES}
    stale, changed = {target}, True
    while changed:
        changed = False
        for name, imported in graph.items():
            if name not in stale and imported & stale:
                stale.add(name)
                changed = True
    return stale


def _write(path: Path, text: str) -> None:
    path.write_text(text)
    for pyc in (path.parent / "__pycache__").glob(f"{path.stem}.*.pyc"):
        pyc.unlink()


def scratch_copy(workdir: Path) -> None:
    """A copy of the checkout's files (tracked and untracked, not ignored) in ``workdir``."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                           check=True, capture_output=True).stdout.decode().split("\0")
    if workdir.exists():
        shutil.rmtree(workdir)
    for name in filter(None, files):
        src = REPO / name
        if src.is_file():
            (workdir / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, workdir / name)


def cosmic_ray(workdir: Path, module: str, target: Target, engine: str, timeout: float,
               runner: ForkRunner) -> list[dict]:
    """Run the cosmic-ray mutants of ``target``; one dict per mutant."""
    from cosmic_ray.mutating import mutate_code
    from cosmic_ray.plugins import get_operator
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import TestOutcome, WorkerOutcome, WorkResult

    bin_dir = Path(sys.executable).parent
    config, session = workdir / f"{module}.toml", workdir / f"{module}.sqlite"
    k = f" -k '{target.deselect}'" if target.deselect else ""
    command = (f"env PYTHONDONTWRITEBYTECODE=1 {sys.executable} -m pytest -x -q -p no:cacheprovider --noconftest "
               f"{' '.join(target.tests + target.slow)}{k}")
    config.write_text(f'[cosmic-ray]\nmodule-path = "{target.path}"\ntimeout = {timeout}\nexcluded-modules = []\n'
                      f'test-command = "{command}"\n\n[cosmic-ray.distributor]\nname = "local"\n')
    subprocess.run([bin_dir / "cosmic-ray", "init", config, session, "--force"], cwd=workdir, check=True)
    path = workdir / target.path
    original = path.read_text()
    spans = annotation_spans(original)

    def in_annotation(spec) -> bool:
        return any(lo <= tuple(spec.start_pos) < hi for lo, hi in spans)

    if engine == "cosmic-ray":
        subprocess.run([bin_dir / "cosmic-ray", "exec", config, session], cwd=workdir, check=True)
    else:
        with use_db(str(session), WorkDB.Mode.open) as db:
            items = list(db.pending_work_items)
            for n, item in enumerate(items):
                (spec,) = item.mutations
                mutated = mutate_code(original, get_operator(spec.operator_name)(**spec.operator_args),
                                      spec.occurrence)
                if mutated is None:
                    db.set_result(item.job_id, WorkResult(worker_outcome=WorkerOutcome.NO_TEST))
                    continue
                if in_annotation(spec):  # recorded as a survivor, not run
                    db.set_result(item.job_id, WorkResult(worker_outcome=WorkerOutcome.NORMAL, output=ANNOTATION,
                                                          test_outcome=TestOutcome.SURVIVED))
                    continue
                diff = "".join(difflib.unified_diff(original.splitlines(True), mutated.splitlines(True),
                                                    target.path, target.path))
                seen = (f"cosmic-ray/{spec.operator_name}", spec.start_pos[0], diff)
                if seen in KILLED_BEFORE:
                    outcome, output = "killed", "killed in the earlier run (--rerun)"
                elif seen in EQUIVALENT_BEFORE:
                    outcome, output = "survived", "equivalent, survived the earlier run (--rerun)"
                else:
                    try:
                        _write(path, mutated)
                        outcome, output = runner.run(timeout)
                    finally:
                        _write(path, original)
                db.set_result(item.job_id, WorkResult(worker_outcome=WorkerOutcome.NORMAL, output=output,
                                                      test_outcome=TestOutcome(outcome), diff=diff))
                if n % 50 == 0:
                    print(f"  cosmic-ray {module}: {n}/{len(items)}", flush=True)
    results = []
    with use_db(str(session), WorkDB.Mode.open) as db:
        for item, result in db.completed_work_items:
            if result.worker_outcome == WorkerOutcome.NO_TEST:
                continue
            (spec,) = item.mutations
            mutated = mutate_code(original, get_operator(spec.operator_name)(**spec.operator_args), spec.occurrence)
            key = (module, *changed_line(original, mutated))
            results.append({"kind": f"cosmic-ray/{spec.operator_name}", "line": spec.start_pos[0],
                            "outcome": "survived" if result.test_outcome == TestOutcome.SURVIVED else "killed",
                            "key": key, "diff": result.diff or "",
                            "equivalent": ANNOTATION if in_annotation(spec) else EQUIVALENT.get(key)})
    return results


#: ``(kind, line, diff)`` of the mutants an earlier run (``--rerun``) saw killed
KILLED_BEFORE: set[tuple[str, int, str]] = set()
#: and those it saw survive that are listed as equivalent (they are not run again either)
EQUIVALENT_BEFORE: set[tuple[str, int, str]] = set()


def own_mutants(workdir: Path, module: str, target: Target, timeout: float, runner: ForkRunner) -> list[dict]:
    path = workdir / target.path
    original = path.read_text()
    results = []
    mutants = guard_mutants(original)
    for n, m in enumerate(mutants):
        diff = "".join(difflib.unified_diff(original.splitlines(True), m.source.splitlines(True),
                                            target.path, target.path))
        line = next((i + 1 for i, (a, b) in enumerate(zip(original.splitlines(), m.source.splitlines())) if a != b), 0)
        if (f"guard/{m.kind}", line, diff) in KILLED_BEFORE:
            outcome = "killed"
        elif (f"guard/{m.kind}", line, diff) in EQUIVALENT_BEFORE:
            outcome = "survived"
        else:
            try:
                _write(path, m.source)
                outcome, _ = runner.run(timeout)
            finally:
                _write(path, original)
        key = m.key(module, original)
        results.append({"kind": f"guard/{m.kind}", "line": line, "outcome": outcome, "key": key, "diff": diff,
                        "equivalent": EQUIVALENT.get(key)})
        if n % 50 == 0:
            print(f"  guard {module}: {n}/{len(mutants)}", flush=True)
    return results


def summarise(module: str, results: list[dict]) -> bool:
    """Print the counts and the survivors of ``module``; True when every survivor is explained."""
    for r in results:
        if r["outcome"] == "survived" and not r["equivalent"]:
            r["equivalent"] = EQUIVALENT.get(tuple(r["key"]))
    survivors = [r for r in results if r["outcome"] == "survived"]
    equivalent = [r for r in survivors if r["equivalent"]]
    unexplained = [r for r in survivors if not r["equivalent"]]
    for kind in ("cosmic-ray", "guard"):
        rs = [r for r in results if r["kind"].startswith(kind)]
        print(f"{module} {kind}: {len(rs)} mutants, {sum(r['outcome'] == 'killed' for r in rs)} killed, "
              f"{sum(r['outcome'] == 'survived' and bool(r['equivalent']) for r in rs)} equivalent, "
              f"{sum(r['outcome'] == 'survived' and not r['equivalent'] for r in rs)} unexplained")
    print(f"{module}: {len(results)} mutants, {len(results) - len(survivors)} killed, {len(equivalent)} equivalent "
          f"({sum(r['equivalent'] == ANNOTATION for r in equivalent)} of them type annotations), "
          f"{len(unexplained)} unexplained survivors", flush=True)
    for r in equivalent:
        if r["equivalent"] != ANNOTATION:
            print(f"  equivalent {r['kind']} line {r['line']}: {r['key'][2]!r}  -- {r['equivalent']}")
    for r in unexplained:
        print(f"  SURVIVED {r['kind']} line {r['line']}: {r['key'][1]!r} -> {r['key'][2]!r}\n{r['diff']}")
    return not unexplained


def stale_equivalents(module: str, root: Path = Path(".")) -> list[str]:
    """The ``EQUIVALENT`` entries of ``module`` quoting a line its source no longer has (the code
    moved on: the entry explains nothing any more); printed, and they fail the run."""
    lines = {line.strip() for line in (root / TARGETS[module].path).read_text().splitlines()}
    stale = [original for (name, original, _), _reason in EQUIVALENT.items()
             if name == module and original.strip() not in lines]
    for original in sorted(set(stale)):
        print(f"  stale EQUIVALENT entry of {module}: {original!r} is no longer in {TARGETS[module].path}")
    return stale


def report(results: list[dict], modules: list[str]) -> int:
    ok = True
    for module in modules:
        mine = [r for r in results if r["key"][0] == module]
        if mine:
            ok &= summarise(module, mine)
        ok &= not stale_equivalents(module)
    return 0 if ok else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("modules", nargs="*", help=f"some of {', '.join(TARGETS)} (default: all four)")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/edgefl-mutation"))
    parser.add_argument("--engine", choices=("fork", "cosmic-ray"), default="fork")
    parser.add_argument("--no-guards", action="store_true", help="cosmic-ray's operators only")
    parser.add_argument("--json", type=Path, help="write every mutant's outcome here")
    parser.add_argument("--report", type=Path, help="only summarise a --json of an earlier run (with the "
                        "current EQUIVALENT table)")
    parser.add_argument("--rerun", type=Path, help="a --json of an earlier run: mutants it saw killed are not "
                        "run again (tests are only ever added, so they stay killed), the others are")
    opts = parser.parse_args()
    modules = opts.modules or list(TARGETS)
    if opts.report:
        return report(json.loads(opts.report.read_text()), modules)
    if opts.rerun:
        earlier = json.loads(opts.rerun.read_text())
        KILLED_BEFORE.update((r["kind"], r["line"], r["diff"]) for r in earlier if r["outcome"] == "killed")
        EQUIVALENT_BEFORE.update((r["kind"], r["line"], r["diff"]) for r in earlier if r["outcome"] == "survived"
                                 and (r.get("equivalent") or tuple(r["key"]) in EQUIVALENT))
    if unknown := set(modules) - set(TARGETS):
        parser.error(f"unknown modules {sorted(unknown)}: choose from {', '.join(TARGETS)}")
    workdir = opts.workdir.resolve()
    scratch_copy(workdir)
    subprocess.run([sys.executable, "-m", "compileall", "-q", "coordinator", "edge_sdk", "tests"], cwd=workdir,
                   check=True)  # the children import unchanged modules from bytecode; mutants are never cached
    os.chdir(workdir)
    sys.path.insert(0, str(workdir))
    sys.dont_write_bytecode = True
    everything, failed = [], False
    for module in modules:
        target = TARGETS[module]
        runner = ForkRunner(workdir, target)
        start = time.monotonic()
        outcome, output = runner.run(600)  # no mutant yet: every test must pass
        baseline = time.monotonic() - start
        if outcome != "survived":
            print(f"{module}: the tests fail without any mutant:\n{output}")
            return 2
        timeout = max(20.0, 4 * baseline)
        print(f"{module}: baseline {baseline:.1f} s, timeout {timeout:.0f} s", flush=True)
        results = cosmic_ray(workdir, module, target, opts.engine, timeout, runner)
        if not opts.no_guards:
            results += own_mutants(workdir, module, target, timeout, runner)
        print(f"{module}: {time.monotonic() - start:.0f} s")
        failed |= not summarise(module, results)
        failed |= bool(stale_equivalents(module))
        everything += results
        if opts.json:  # after every module: a run cut short keeps what it did
            opts.json.write_text(json.dumps(everything, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
