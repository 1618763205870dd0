"""The documentation runs as written: every shell block of README.md and docs/*.md, and every link between them.

Each fenced block in sh, console, bash or shell is one test. Its lines that start with `rnn2jax ` (or
`$ rnn2jax`, or `python -m rnn2jax`) are commands, run in order as subprocesses of `python -m rnn2jax` in a
copy of a directory prepared once per session: the bundled example nets, a small LSTM (training net,
predict net, init net) built with the `caffe2` package, a training plan and a predictor export of the
bundled MLP, an input array, and the user-op module that docs/ops-guide.md shows. Each command must exit
0, or with the status a following `# exit N` line gives. In a console block, the lines after a command are
its output: each must appear in what the command printed (`...` stands for lines left out).

A block that cannot run here (`make test`, `pip install`, a download) carries an HTML comment right before
it, `<!-- not run: why -->`; any other line that is not an rnn2jax command fails its block's test. Commands
that need real Caffe2 (`compare`, `verify --caffe2`) run only where `make test` made .venv-caffe2.

Where a page promises more of a command's result than its output, PROMISES checks it on the files the command
wrote: docs/serving.md's export and docs/codegen.md's module take the inputs of the page's Python example (blob,
dtype, dims), return the outputs it reads, and give real Caffe2's values for the same predict net and weights
(those checks skip, after the commands ran, where the `caffe2` fixture finds no real Caffe2).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL_LANGUAGES = {"sh", "console", "bash", "shell"}
FENCE = re.compile(r"^(\s*)```\s*([\w+-]*)")
NOT_RUN = re.compile(r"^\s*<!--\s*not run:(.*?)-->\s*$")
EXIT_STATUS = re.compile(r"^#\s*exit\s+(\d+)\s*$")
CAFFE2_PYTHON = ROOT / ".venv-caffe2" / "bin" / "python"
TIMEOUT = 300


@dataclass
class Command:
    line: int
    text: str
    args: list[str] | None  # None: not an rnn2jax command
    status: int = 0
    output: list[str] = field(default_factory=list)


@dataclass
class Block:
    path: Path
    line: int  # of the opening fence, 1-based
    language: str
    body: list[tuple[int, str]]
    not_run: str | None  # the reason, when the block is marked

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def fenced_blocks(path: Path) -> list[Block]:
    """Every fenced code block of a Markdown page, with the `not run` reason of the comment right before it."""
    lines = path.read_text().splitlines()
    blocks, i = [], 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        start, body = i, []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith("```"):
            body.append((i + 1, lines[i]))
            i += 1
        before = next((lines[j] for j in range(start - 1, -1, -1) if lines[j].strip()), "")
        marked = NOT_RUN.match(before)
        blocks.append(Block(path, start + 1, match.group(2).lower(), body, marked.group(1).strip() if marked else None))
        i += 1
    return blocks


def shell_blocks() -> list[Block]:
    return [b for page in PAGES for b in fenced_blocks(page) if b.language in SHELL_LANGUAGES]


def rnn2jax_args(text: str) -> list[str] | None:
    """The arguments after `rnn2jax` of a command line, or None when the line runs something else."""
    try:
        argv = shlex.split(text, comments=True)
    except ValueError:
        return None
    if argv[:1] == ["rnn2jax"]:
        return argv[1:]
    if len(argv) >= 3 and argv[1:3] == ["-m", "rnn2jax"] and Path(argv[0]).name.startswith("python"):
        return argv[3:]
    return None


def commands(block: Block) -> list[Command]:
    """The block's commands in order (continuation lines joined), with their expected status and output."""
    console = block.language == "console"
    found: list[Command] = []
    pending: tuple[int, str] | None = None
    for number, raw in block.body:
        if pending is not None:
            number, raw = pending[0], pending[1] + " " + raw.strip()
            pending = None
        if raw.rstrip().endswith("\\"):
            pending = (number, raw.rstrip()[:-1])
            continue
        text = raw.strip()
        status = EXIT_STATUS.match(text)
        if status and found:
            found[-1].status = int(status.group(1))
            continue
        if console and not text.startswith("$ "):
            if found and text and text != "...":
                found[-1].output.append(text)
            continue
        text = text.removeprefix("$ ").strip()
        if not text or text.startswith("#"):
            continue
        found.append(Command(number, text, rnn2jax_args(text)))
    return found


BLOCKS = shell_blocks()

# The nets the blocks use besides the bundled ones, built with the `caffe2` package as a user would.
MAKE_FILES = r"""
import numpy as np
from google.protobuf import text_format

import rnn2jax.caffe2

rnn2jax.caffe2.install()
from caffe2.proto import caffe2_pb2  # noqa: E402
from caffe2.python import brew, core, model_helper, optimizer, workspace  # noqa: E402
from caffe2.python.predictor import predictor_exporter  # noqa: E402
from caffe2.python.rnn_cell import LSTM  # noqa: E402


def write(name, proto):
    with open(name, "w") as file:
        file.write(text_format.MessageToString(proto))


def read(name):
    net = caffe2_pb2.NetDef()
    text_format.Parse(open(name).read(), net)
    return net


# A small LSTM: data [T, N, 6], seq_lengths, h0 and c0 [1, N, 8]; softmax out; a training net with loss and
# Caffe2's gradient ops (targets [T * N], int32), a predict net, and their init net.
for train in (True, False):
    model = model_helper.ModelHelper(name="lstm_train" if train else "lstm_predict")
    data, lengths, h0, c0 = model.net.AddExternalInputs("data", "seq_lengths", "h0", "c0")
    hidden_all, _, _, _ = LSTM(model, data, lengths, (h0, c0), dim_in=6, dim_out=8, scope="lstm")
    softmax = model.net.Softmax(brew.fc(model, hidden_all, "logits", dim_in=8, dim_out=6, axis=2), "softmax", axis=2)
    if train:
        flat, _ = model.net.Reshape(softmax, ["softmax_2d", "_"], shape=[-1, 6])
        xent = model.net.LabelCrossEntropy([flat, model.net.AddExternalInput("target")])
        model.AddGradientOperators([model.net.AveragedLoss(xent, "loss")])
        write("lstm_train_net.pbtxt", model.net.Proto())
        write("lstm_init_net.pbtxt", model.param_init_net.Proto())
    else:
        model.net.AddExternalOutput(softmax)
        write("lstm_predict_net.pbtxt", model.net.Proto())
np.save("target.npy", (np.arange(20) % 6).astype(np.int32))

# A training plan for the bundled MLP (its parameter names): fill a batch, train, Save the weights.
model = model_helper.ModelHelper(name="mlp_train")
hidden = brew.relu(model, brew.fc(model, "data", "fc1", dim_in=8, dim_out=16), "fc1")
prob = model.net.Softmax(brew.fc(model, hidden, "fc2", dim_in=16, dim_out=3), "prob")
model.AddGradientOperators([model.net.AveragedLoss(model.net.LabelCrossEntropy([prob, "label"]), "loss")])
optimizer.build_sgd(model, base_learning_rate=0.5)
init = model.param_init_net
init.GaussianFill([], "data", shape=[32, 8])
init.GivenTensorIntFill([], "label", shape=[32], values=[i % 3 for i in range(32)])
save = core.Net("save")
save.Save(["fc1_w", "fc1_b", "fc2_w", "fc2_b"], [], db="mlp_weights.minidb", db_type="minidb")
plan = core.Plan("mlp_train_plan")
plan.AddStep(core.execution_step("init", init))
plan.AddStep(core.execution_step("train", model.net, num_iter=100))
plan.AddStep(core.execution_step("save", save))
write("mlp_train_plan.pbtxt", plan.Proto())

# A predictor export of the bundled MLP, as Caffe2's predictor_exporter writes one.
workspace.ResetWorkspace()
workspace.RunNetOnce(read("mlp_init_net.pbtxt"))
x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
workspace.FeedBlob("data", x)
workspace.RunNetOnce(read("mlp_predict_net.pbtxt"))
meta = predictor_exporter.PredictorExportMeta(
    read("mlp_predict_net.pbtxt"), ["fc1_w", "fc1_b", "fc2_w", "fc2_b"], ["data"], ["prob"]
)
predictor_exporter.save_to_db("minidb", "mlp_predictor.minidb", meta)

np.save("data.npy", x)
"""

SCALED_TANH_NET = """\
name: "scaled_tanh"
op { input: "x" output: "y" type: "ScaledTanh" arg { name: "alpha" f: 2.0 } }
external_input: "x"
external_output: "y"
"""


def environment() -> dict[str, str]:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)}
    if CAFFE2_PYTHON.exists():
        env["RNN2JAX_CAFFE2_PYTHON"] = str(CAFFE2_PYTHON)
    return env


def user_ops_module() -> str:
    """The registrations docs/ops-guide.md shows (its `--ops my_ops.py` example imports them)."""
    for block in fenced_blocks(ROOT / "docs" / "ops-guide.md"):
        code = "\n".join(text for _, text in block.body)
        if block.language == "python" and 'register_op("ScaledTanh"' in code:
            return code + "\n"
    raise AssertionError("docs/ops-guide.md has no python block registering ScaledTanh")


@pytest.fixture(scope="session")
def doc_files(tmp_path_factory) -> Path:
    """The files the documented commands read, made once per session."""
    folder = tmp_path_factory.mktemp("doc_files")
    for name in ("mlp_predict_net.pbtxt", "mlp_init_net.pbtxt"):
        shutil.copy(ROOT / "rnn2jax" / "examples" / name, folder / name)
    scripts = folder / "examples" / "caffe2_scripts"
    scripts.mkdir(parents=True)
    shutil.copy(ROOT / "examples" / "caffe2_scripts" / "char_lstm.py", scripts / "char_lstm.py")
    (folder / "scaled_tanh_net.pbtxt").write_text(SCALED_TANH_NET)
    (folder / "my_ops.py").write_text(user_ops_module())
    done = subprocess.run(
        [sys.executable, "-c", MAKE_FILES], cwd=folder, env=environment(), capture_output=True, text=True,
        timeout=TIMEOUT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return folder


def needs_caffe2(args: list[str]) -> bool:
    return args[:1] == ["compare"] or "--caffe2" in args


@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_shell_block_runs(block: Block, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    if block.not_run is not None:
        assert block.not_run, f"{block.id}: `<!-- not run: -->` needs a reason"
        pytest.skip(f"not run: {block.not_run}")
    found = commands(block)
    assert found, f"{block.id}: a shell block with no command (mark it `<!-- not run: why -->`)"
    for command in found:
        assert command.args is not None, (
            f"{block.path.name}:{command.line}: `{command.text}` is not an rnn2jax command; "
            "mark the block with `<!-- not run: why -->` right before it"
        )
    if any(needs_caffe2(c.args) for c in found) and not CAFFE2_PYTHON.exists():
        pytest.skip(f"needs real Caffe2 ({CAFFE2_PYTHON.relative_to(ROOT)}, made by `make test`)")
    work = tmp_path / "work"
    shutil.copytree(request.getfixturevalue("doc_files"), work)  # made only when a block runs
    for command in found:
        done = subprocess.run(
            [sys.executable, "-m", "rnn2jax", *command.args], cwd=work, env=environment(), capture_output=True,
            text=True, timeout=TIMEOUT,
        )  # fmt: skip
        where = f"{block.path.name}:{command.line}: `{command.text}`"
        assert done.returncode == command.status, (
            f"{where} exited {done.returncode}, the doc says {command.status}\n"
            f"stdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-3000:]}"
        )
        printed = {line.strip() for line in done.stdout.splitlines()}
        missing = [line for line in command.output if line not in printed]
        assert not missing, f"{where} did not print {missing}; it printed:\n{done.stdout[-3000:]}"
        promise = PROMISES.get((block.path.name, *command.args[:2]))
        if promise is not None:
            promise(block.path, work, command.args, done.stdout, request.getfixturevalue("caffe2"))


def test_every_not_run_comment_marks_a_shell_block():
    """A `not run` comment stands right before the shell block it excuses, so none is left behind stale."""
    marked = {(b.path, b.line) for b in BLOCKS if b.not_run is not None}
    for page in PAGES:
        lines = page.read_text().splitlines()
        for number, text in enumerate(lines, 1):
            if NOT_RUN.match(text):
                after = next((n for n in range(number, len(lines)) if lines[n].strip()), None)
                assert after is not None and (page, after + 1) in marked, (
                    f"{page.relative_to(ROOT)}:{number}: a `not run` comment not right before a shell block"
                )


def test_the_pages_have_runnable_blocks():
    runnable = [b for b in BLOCKS if b.not_run is None]
    assert any(b.path.name == "README.md" for b in runnable)
    assert len(runnable) >= 5, [b.id for b in BLOCKS]


# ------------------------------------------------------------------------------------------------
# What the serving and codegen pages promise of their LSTM beyond the command's exit status and output

SIZES = ((1, 1), (5, 3), (2, 4))  # (T, N): the exported and the generated LSTM run at any of them
TOLERANCE = {"rtol": 2e-5, "atol": 2e-6}


def documented_inputs(page: Path) -> dict[str, tuple[str, list[str]]]:
    """The inputs the page's Python example passes: blob -> (dtype, dims), from lines such as
    `"data": x,   # float32 [T, N, 6]`."""
    found = re.findall(r'"(\w+)":\s*\w+,\s*#\s*(\w+)\s*\[([^\]]*)\]', page.read_text())
    return {name: (dtype, [d.strip() for d in dims.split(",")]) for name, dtype, dims in found}


def documented_outputs(page: Path) -> dict[str, tuple[str, list[str]] | None]:
    """The outputs the page's Python example reads (`outputs["softmax"]`), with the dtype and dims a comment
    gives them (`# float32 [T, N, 6]`), or None where it gives none."""
    found = re.findall(r'outputs\["([^"]+)"\](?:\s*#\s*(\w+)\s*\[([^\]]*)\])?', page.read_text())
    return {name: (dtype, [d.strip() for d in dims.split(",")]) if dtype else None for name, dtype, dims in found}


def sample(documented: dict[str, tuple[str, list[str]]], steps: int, batch: int, seed: int) -> dict[str, np.ndarray]:
    """Arrays at the documented dtypes and dims, with T and N given; the int32 input is sequence lengths
    (0 to T)."""
    rng = np.random.default_rng(seed)
    sizes = {"T": steps, "N": batch}
    arrays = {}
    for name, (dtype, dims) in documented.items():
        shape = tuple(sizes[d] if d in sizes else int(d) for d in dims)
        if dtype == "int32":
            arrays[name] = rng.integers(0, steps + 1, shape).astype(np.int32)
        else:
            arrays[name] = rng.standard_normal(shape).astype(dtype)
    return arrays


def caffe2_outputs(caffe2, net_file: Path, weights: dict, inputs: dict, names) -> dict[str, np.ndarray]:
    """The independent reference: real Caffe2 runs the same predict net with the same weights and inputs."""
    from google.protobuf import text_format

    from rnn2jax.proto import caffe2_pb2

    net = text_format.Parse(net_file.read_text(), caffe2_pb2.NetDef())
    feeds = {**{name: np.asarray(value) for name, value in weights.items()}, **inputs}
    return caffe2.run_net(net, feeds, fetch=list(names))


def assert_close(got: dict, want: dict, what: str) -> None:
    assert sorted(got) == sorted(want), what
    for name, value in want.items():
        np.testing.assert_allclose(np.asarray(got[name], np.float64), value, **TOLERANCE, err_msg=f"{what}: {name}")


def init_params_as_users_get_them(net: Path, init: Path, work: Path) -> dict[str, np.ndarray]:
    """`rnn2jax.compile(net, init).params`, computed in a process of its own: the test processes compile at
    XLA's -O0 (conftest.py), and a random fill's last bit may differ from -O2's, which the command used."""
    out = work / "init_params_as_users_get_them.npz"
    code = "import sys, numpy as np, rnn2jax; np.savez(sys.argv[3], **rnn2jax.compile(sys.argv[1], sys.argv[2]).params)"
    done = subprocess.run(
        [sys.executable, "-c", code, str(net), str(init), str(out)], env=environment(), capture_output=True,
        text=True, timeout=TIMEOUT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    with np.load(out) as stored:
        return dict(stored)


def model_files(work: Path, args: list[str]) -> tuple[Path, Path, Path]:
    """The net, the init net and the file the command (`export`/`codegen NET --init INIT -o OUT`) names."""
    return work / args[1], work / args[args.index("--init") + 1], work / args[args.index("-o") + 1]


def serving_export_keeps_the_promises(page: Path, work: Path, args: list[str], printed: str, caffe2) -> None:
    """The artifact takes exactly the inputs of the page's example at their dtypes and symbolic dims (and
    `model.inputs` shows what the page shows), returns the outputs the example reads at their dims, and gives
    real Caffe2's values, as rnn2jax.compile of the same net and init net does, at several (T, N)."""
    import jax

    import rnn2jax
    from rnn2jax.serving import load_exported

    net, init, out = model_files(work, args)
    documented = documented_inputs(page)
    assert documented, f'{page.name}: no inputs in its Python example (`"blob": x,  # dtype [dims]`)'
    model = load_exported(out)
    assert {n: (str(s.dtype), [str(d) for d in s.shape]) for n, s in model.inputs.items()} == documented
    shown = re.search(r"model\.inputs\s*#\s*(\{.*?), \.\.\.\}", page.read_text())
    assert shown and repr(model.inputs).startswith(shown.group(1)), (shown, repr(model.inputs))
    returned = jax.tree_util.tree_unflatten(model.exported.out_tree, model.exported.out_avals)
    for name, spec in documented_outputs(page).items():
        assert name in returned, f"{page.name} reads outputs[{name!r}]; the export returns {sorted(returned)}"
        got = (str(returned[name].dtype), [str(d) for d in returned[name].shape])
        assert spec is None or got == spec, (name, got, spec)
    compiled = rnn2jax.compile(net, init)  # the weights the export baked in: the init net's, drawn alike
    assert set(compiled.input_names) == set(documented)
    for steps, batch in SIZES:
        inputs = sample(documented, steps, batch, seed=steps * 10 + batch)
        want = caffe2_outputs(caffe2, net, compiled.params, inputs, model.output_names)
        assert_close(model(inputs), want, f"{out.name} at T, N = {steps}, {batch}")
        assert_close(compiled(inputs), want, f"rnn2jax.compile at T, N = {steps}, {batch}")


def codegen_module_keeps_the_promises(page: Path, work: Path, args: list[str], printed: str, caffe2) -> None:
    """The module's INPUTS are the inputs of the page's example and its OUTPUTS hold those it reads; its .npz
    holds the init net's weights, as many as the command said; the page's excerpt of `apply` is the module's
    own text; and `apply` gives real Caffe2's values at the documented dtypes and dims, at several (T, N),
    T = 0 included."""
    import importlib.util


    net, init, out = model_files(work, args)
    documented = documented_inputs(page)
    assert documented, f'{page.name}: no inputs in its Python example (`"blob": x,  # dtype [dims]`)'
    spec = importlib.util.spec_from_file_location(f"doc_codegen_{out.stem}", out)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules.pop(spec.name, None)
    assert set(module.INPUTS) == set(documented)
    assert set(documented_outputs(page)) <= set(module.OUTPUTS), module.OUTPUTS
    params = module.load_params()
    weights = init_params_as_users_get_them(net, init, work)
    assert set(params) == set(weights)
    for name, value in weights.items():
        np.testing.assert_array_equal(params[name], value, err_msg=name)
    count = re.search(r"\((\d+) parameters\)", printed)
    assert count and int(count.group(1)) == len(params), printed
    written = {line.strip() for line in out.read_text().splitlines()}
    for block in fenced_blocks(page):
        if block.language == "python" and any(text.startswith("def apply(") for _, text in block.body):
            stale = [(n, t) for n, t in block.body if t.strip() not in written and t.strip() != "..."]
            assert not stale, f"{page.name}: lines of its module excerpt that {out.name} does not have: {stale}"
    for steps, batch in (*SIZES, (0, 2)):  # the page: "it runs at any sequence length T (0 included)"
        inputs = sample(documented, steps, batch, seed=steps * 10 + batch)
        want = caffe2_outputs(caffe2, net, params, inputs, module.OUTPUTS)
        assert_close(module.apply(params, inputs), want, f"{out.name} at T, N = {steps}, {batch}")


# (page, command, net) -> the check of what the page says of that command's result
PROMISES: dict[tuple[str, ...], Callable[[Path, Path, list[str], str, object], None]] = {
    ("serving.md", "export", "lstm_predict_net.pbtxt"): serving_export_keeps_the_promises,
    ("codegen.md", "codegen", "lstm_predict_net.pbtxt"): codegen_module_keeps_the_promises,
}


def test_every_promise_has_a_command_to_check():
    """The promises are checked as the page's commands run: a page that lost its command would lose them."""
    ran = {(b.path.name, *c.args[:2]) for b in BLOCKS if b.not_run is None for c in commands(b) if c.args}
    assert set(PROMISES) <= ran, set(PROMISES) - ran


# ------------------------------------------------------------------------------------------------
# Links

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def prose(path: Path) -> list[tuple[int, str]]:
    """The page's lines outside fenced code, with inline code spans removed."""
    kept, fenced = [], False
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            kept.append((number, re.sub(r"`[^`]*`", "", line)))
    return kept


def anchors(path: Path) -> set[str]:
    """GitHub's heading anchors of a page: lower case, punctuation dropped, spaces as hyphens, -1, -2 for repeats."""
    found: set[str] = set()
    fenced = False
    for line in path.read_text().splitlines():
        if line.strip().startswith("```"):
            fenced = not fenced
            continue
        match = HEADING.match(line) if not fenced else None
        if match:
            slug = re.sub(r"[^\w\- ]", "", match.group(2).lower()).replace(" ", "-")
            unique, n = slug, 0
            while unique in found:
                n += 1
                unique = f"{slug}-{n}"
            found.add(unique)
    return found


def links() -> list[tuple[Path, int, str]]:
    return [(page, n, target) for page in PAGES for n, line in prose(page) for target in LINK.findall(line)]


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_relative_links_resolve(page: Path):
    """Every relative link of the page names a file of the repository, and a heading of it when it has an anchor."""
    broken = []
    for source, number, target in links():
        if source != page or re.match(r"^[a-z][a-z0-9+.-]*:", target):
            continue  # http:, https:, mailto:
        path_part, _, anchor = target.partition("#")
        resolved = (page.parent / path_part).resolve() if path_part else page
        if not resolved.is_relative_to(ROOT) or not resolved.exists():
            broken.append(f"line {number}: {target} (no such file in the repository)")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"line {number}: {target} (no heading '#{anchor}' in {resolved.name})")
    assert not broken, f"{page.relative_to(ROOT)}:\n" + "\n".join(broken)


def test_every_error_class_is_in_the_error_table():
    import rnn2jax

    text = (ROOT / "docs" / "errors.md").read_text()
    classes = [n for n in rnn2jax.__all__ if n.endswith("Error")]
    assert "Rnn2JaxError" in classes
    assert all(issubclass(getattr(rnn2jax, n), Exception) for n in classes)
    missing = [n for n in classes if n != "Rnn2JaxError" and f"| `{n}` |" not in text]
    assert not missing, f"docs/errors.md has no row for {missing}"
