"""Write docs/ops.md: every op type real Caffe2 registers, and how far rnn2jax takes each.

The columns come from the registries, never from hand-kept lists: real Caffe2's operator and gradient
registries (asked through the oracle worker), rnn2jax's op registry, the builder's gradient makers, and
the `CASES` tables of the differential tests (`tests/ops/test_<family>.py`), which the test suite runs against
real Caffe2. `tests/ops/test_scoreboard.py` fails when the file is stale.

    .venv/bin/python scripts/ops_scoreboard.py [--caffe2 .venv-caffe2/bin/python] [-o docs/ops.md]
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rnn2jax.ops.facets import FACETS, NO_ROLES
from rnn2jax.ops.unsupported import WHY_UNSUPPORTED

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
OUTPUT = ROOT / "docs" / "ops.md"
DIFFERENTIAL_FOLDERS = ("ops", "recurrent")  # where each op family's tests live

_ENGINE = re.compile(r"^(.*?)_ENGINE_(\w+)$")
_HAS_GRADIENT = {"gradient"}
_FACET_WORDS = {"roles": "roles", "shape_rule": "shape rule", "gradient": "maker", "emitter": "emitter"}
_GRADIENT_WORDS = {
    "gradient": "yes",
    "no_gradient": "none (NO_GRADIENT)",
    "should_not": "none (SHOULD_NOT_DO_GRADIENT)",
    "not_implemented": "not implemented in Caffe2",
    "none": "",
}


@dataclass(frozen=True)
class Tested:
    """What the differential tests cover: forward op types, and gradient op types they reach."""

    forward: frozenset[str]
    with_gradient: frozenset[str]
    gradient_ops: Mapping[str, str]  # gradient op type -> the forward op whose case checks it


def differential_cases() -> Tested:
    """The `CASES` tables (`differential.cases(...)`) of the op families' tests: tests/ops/ and tests/recurrent/
    (RecurrentNetwork's). Test modules import each other by name, as pytest's `pythonpath` lets them."""
    sys.path[:0] = [str(TESTS), *(str(p) for p in sorted(TESTS.iterdir()) if p.is_dir())]
    sys.path.insert(0, str(ROOT))  # some test modules import `tests.conftest`
    forward, with_gradient, gradient_ops = set(), set(), {}
    for path in sorted(p for folder in DIFFERENTIAL_FOLDERS for p in (TESTS / folder).glob("test_*.py")):
        if "\nCASES = cases(" not in path.read_text():
            continue
        module = importlib.import_module(path.stem)
        table = getattr(module, "CASES", {})
        for op_type, case in table.items():
            forward.add(op_type)
            if case.gradient_ops:
                with_gradient.add(op_type)
            for grad_type in case.gradient_ops:
                gradient_ops.setdefault(grad_type, op_type)
    return Tested(frozenset(forward), frozenset(with_gradient), gradient_ops)


def op_types(keys: Iterable[str]) -> tuple[set[str], dict[str, list[str]]]:
    """Real Caffe2's operator keys as op types, and the engines registered for each: `X_ENGINE_E` is an engine of X
    where X itself is registered, else an op type of its own (DNNLOWP's Quantize has no default engine)."""
    keys = set(keys)
    engines: dict[str, list[str]] = defaultdict(list)
    types: set[str] = set()
    for key in keys:
        match = _ENGINE.match(key)
        if match and match.group(1) in keys:
            engines[match.group(1)].append(match.group(2))
        else:
            types.add(key)
    return types, engines


def _family(schema_file: str | None) -> str:
    if not schema_file:
        return "(no schema)"
    path = schema_file.split("caffe2/", 1)[-1]
    return re.sub(r"\.(cc|cu|cpp|h)$", "", path)


def facets(record: Any) -> str:
    """The facets an op's record has, in the registry's order (lowering and host first)."""
    names = ["lowering"] if record.build is not None else []
    names += ["host"] if record.host is not None else []
    names += [_FACET_WORDS[f] for f in FACETS if getattr(record, f) and not (f == "roles" and record.roles == NO_ROLES)]
    return ", ".join(names)


def module_of(record: Any) -> str:
    """`ops/norm.py`: where every facet of the op is (a package module's path, relative to rnn2jax/)."""
    return f"`{record.module.removeprefix('rnn2jax.').replace('.', '/')}.py`" if record.module else ""


def render(
    catalog,
    gradient_kinds: Mapping[str, str],
    registered: set[str],
    makers: set[str],
    tested: Tested,
    records: Mapping[str, Any] | None = None,
) -> str:
    """The scoreboard as Markdown. `registered` are the lowered types, as Caffe2's operator keys
    (`registry.lowered_keys`); `records` every registry record (host ops too), for the module and facets
    columns. A record of a type Caffe2 has only under engines (DNNLOWP's Quantize) stands for its keys
    (`Quantize_ENGINE_DNNLOWP`, ...), which real Caffe2's catalog lists as op types of their own."""
    records = {key: r for t, r in (records or {}).items() for key in _keys(t, r)}
    types, engines = op_types(catalog.ops)
    families: dict[str, list[str]] = defaultdict(list)
    for op_type in types:
        families[_family(catalog.schema_files.get(op_type))].append(op_type)

    lowered = types & registered
    host = sorted(t for t in types - registered if t in records and records[t].host is not None)
    fwd = lowered & (tested.forward | set(tested.gradient_ops))
    with_grad = {t for t in lowered if gradient_kinds.get(t) in _HAS_GRADIENT}
    grad_tested = with_grad & tested.with_gradient
    # lowered or host ops that real Caffe2's registry (this build of it) lacks
    # (an engine variant rnn2jax lowers, `Tanh_ENGINE_DNNLOWP`, is one of Caffe2's keys, not a type of its own)
    ours_only = sorted((registered | {t for t, r in records.items() if r.host is not None}) - set(catalog.ops))
    lines = [
        "# Op scoreboard",
        "",
        "Generated by `scripts/ops_scoreboard.py` from real Caffe2's registries (torch "
        f"{catalog.versions['torch']}), rnn2jax's op registry, the builder's gradient makers and the differential "
        "tests; `tests/ops/test_scoreboard.py` fails when it is stale. Do not edit by hand.",
        "",
        f"- Real Caffe2 registers **{len(catalog.ops)}** operator keys: **{len(types)}** op types, plus "
        f"{len(catalog.ops) - len(types)} engine variants of them (`Conv_ENGINE_CUDNN`, ...); rnn2jax lowers "
        f"{len((registered & set(catalog.ops)) - types)} of those variants (marked * below).",
        f"- rnn2jax lowers **{len(lowered)}** of those op types; a workspace runs **{len(host)}** more as host ops "
        f"(in Python between jitted segments): {', '.join(host)}.",
        f"- **{len(fwd)}** of them have a forward differential test against real Caffe2 (run by `make test`).",
        f"- **{len(with_grad)}** lowered op types have a gradient in Caffe2; **{len(grad_tested)}** of them have a "
        "gradient differential test (Caffe2's gradient ops run in both, the builder's gradient OperatorDefs "
        "compared byte for byte where it has a maker)"
        + (f"; not: {', '.join(sorted(with_grad - grad_tested))}." if with_grad - grad_tested else "."),
        f"- The builder (`rnn2jax.caffe2`) has gradient makers for **{len(makers & types)}** op types.",
    ]
    if ours_only:
        lines.append(
            f"- rnn2jax also registers {len(ours_only)} type(s) this build of real Caffe2 does not: "
            f"{', '.join(ours_only)}."
        )
    not_run = sorted(types - registered - set(host))
    # engine variants whose class rnn2jax lacks: it refuses them rather than run the type's own kernel
    refused = sorted(k for k in set(catalog.ops) - types - registered if k in WHY_UNSUPPORTED)
    lines.append(
        f"- **{len(not_run)}** op types rnn2jax does not run; each is listed under *Not run, and why* below, with "
        "the reason (`rnn2jax/ops/unsupported.py`, which rnn2jax's error for such an op also gives)"
        + (
            f"; so are the **{len(refused)}** engine variants it refuses (Caffe2 runs another class under the "
            "engine, which rnn2jax has not lowered)."
            if refused
            else "."
        )
    )
    lines += [
        "",
        "Columns: **lowered**: rnn2jax compiles it (`host op`: a workspace runs it in Python between jitted "
        "segments; an engine marked * it compiles too, `Tanh_ENGINE_DNNLOWP`, with a differential test of that "
        "key); **module**: the family module holding every facet of the op (docs/architecture.md); "
        "**facets**: those it has (each other facet it states it has none of, saying why); **Caffe2 gradient**: "
        "what Caffe2's gradient registry says; **builder maker**: `rnn2jax.ops.gradient_makers.get_gradient_for_op` "
        "knows it; **differential test**: "
        "`fwd` (outputs compared with real Caffe2), `grad` (its gradient ops too), `via X` (checked as the "
        "gradient op of X).",
        "",
    ]
    lines += ["## Not run, and why", "", "| op | why rnn2jax does not run it |", "|---|---|"]
    lines += [
        f"| {op_type} | {WHY_UNSUPPORTED.get(op_type, '**no reason given**')} |" for op_type in [*not_run, *refused]
    ]
    lines.append("")
    for family in sorted(families, key=lambda f: (not any(t in registered for t in families[f]), f)):
        lines += [
            f"## {family}",
            "",
            "| op | lowered | module | facets | Caffe2 gradient | builder maker | differential test |",
        ]
        lines.append("|---|---|---|---|---|---|---|")
        for op_type in sorted(families[family]):
            marked = [e + ("*" if f"{op_type}_ENGINE_{e}" in registered else "") for e in sorted(engines[op_type])]
            name = op_type + (f" (engines: {', '.join(marked)})" if marked else "")
            test = []
            if op_type in tested.forward:
                test.append("fwd")
            if op_type in tested.with_gradient:
                test.append("grad")
            if op_type in tested.gradient_ops:
                test.append(f"via {tested.gradient_ops[op_type]}")
            record = records.get(op_type)
            lowered_word = "yes" if op_type in registered else ("host op" if record is not None else "")
            lines.append(
                f"| {name} | {lowered_word} | {module_of(record) if record else ''} | "
                f"{facets(record) if record else ''} | "
                f"{_GRADIENT_WORDS.get(gradient_kinds.get(op_type, 'none'), '')} | "
                f"{'yes' if op_type in makers else ''} | {', '.join(test)} |"
            )
        lines.append("")
    return "\n".join(lines)


def _keys(op_type: str, record: Any) -> tuple[str, ...]:
    engines = getattr(record, "engines", ())
    return tuple(f"{op_type}_ENGINE_{e}" for e in engines) if engines else (op_type,)


def generate(python: str | Path) -> str:
    from rnn2jax.checking.oracle import Caffe2Oracle
    from rnn2jax.ops.gradient_makers import gradient_maker_types
    from rnn2jax.ops.registry import REGISTRY, lowered_keys, supported

    supported("FC")  # loads every op family
    import rnn2jax.caffe2.python.workspace  # noqa: F401  (registers the Caffe2 API's host ops: Python, ...)

    with Caffe2Oracle(python) as oracle:
        catalog = oracle.catalog()
        kinds = oracle.gradient_kinds()
    tested = differential_cases()  # first: importing the tests registers makers too (the Python op's), as in pytest
    return render(catalog, kinds, set(lowered_keys()), gradient_maker_types(), tested, dict(REGISTRY))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--caffe2", default=str(ROOT / ".venv-caffe2" / "bin" / "python"))
    parser.add_argument("-o", "--output", default=str(OUTPUT))
    args = parser.parse_args()
    text = generate(args.caffe2)
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(text + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
