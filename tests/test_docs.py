"""The README and docs/ stay true: links resolve, commands parse, snippets match the code.

The README is the front page: it links every reference page in docs/, its quick start is the one
CI runs, and its examples run as written. Every page's shell commands are checked against what
they call (the CLI's parser, the scripts, the benchmarks' flags, the test command) and every
Python snippet compiles and names only what the package has.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import shlex
import sys
from pathlib import Path

import pytest

import precision_nb
from precision_nb.cli.main import build_parser

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = [README, *sorted(DOCS.glob("*.md"))]
TOPICS = (
    "panel",
    "plans",
    "training",
    "profiling",
    "cli",
    "memory-and-ops",
    "numerics",
    "notebooks",
    "development",
    "architecture",
    "distributed",
)
# architecture.md lists signatures (``f(x) -> T``) in a python block: read, not run
SIGNATURE_PAGES = {"architecture.md"}
FENCE = re.compile(r"^```([\w-]*)\n(.*?)^```", re.DOTALL | re.MULTILINE)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
SCRIPT_EXTRAS = ("", "test", "dev")  # what scripts/setup.sh accepts


def rel(page: Path) -> str:
    return str(page.relative_to(ROOT))


def blocks(page: Path, *langs: str) -> list[str]:
    return [code for lang, code in FENCE.findall(page.read_text(encoding="utf-8")) if lang in langs]


def prose(page: Path) -> str:
    """The page without its fenced code blocks."""
    return FENCE.sub("", page.read_text(encoding="utf-8"))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    found: set[str] = set()
    for line in prose(page).splitlines():
        match = re.match(r"^#{1,6} (.+)$", line)
        if match:
            base = slug(match.group(1))
            name, n = base, 0
            while name in found:
                n += 1
                name = f"{base}-{n}"
            found.add(name)
    return found


def local_links(page: Path) -> list[str]:
    return [
        target
        for target in LINK.findall(prose(page))
        if not re.match(r"^[a-z]+:", target)  # http:, https:, mailto:
    ]


# -- links -------------------------------------------------------------------------------------


def test_slug_follows_github() -> None:
    assert slug("Profile from the command line: `precision-nb profile`") == (
        "profile-from-the-command-line-precision-nb-profile"
    )
    assert slug("The engine's overhead: `bench_fit.py`") == "the-engines-overhead-bench_fitpy"
    assert slug("What one `fit()` does") == "what-one-fit-does"


def test_readme_links_every_reference_page() -> None:
    linked = {t.split("#")[0] for t in local_links(README)}
    missing = [t for t in TOPICS if f"docs/{t}.md" not in linked]
    assert not missing, f"README.md does not link docs/ pages: {missing}"


def test_plans_page_has_the_resolution_rules_section() -> None:
    assert "resolution-rules" in anchors(DOCS / "plans.md")
    section = (DOCS / "plans.md").read_text(encoding="utf-8").split("## Resolution rules", 1)[1]
    assert "| device | request | resolved mode | scaler | autocast |" in section


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_local_links_and_anchors_resolve(page: Path) -> None:
    links = local_links(page)
    for target in links:
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        assert dest.exists(), f"{rel(page)}: link to a missing file: {target}"
        if anchor:
            assert dest.suffix == ".md", f"{rel(page)}: anchor into a non-markdown file: {target}"
            assert anchor in anchors(dest), f"{rel(page)}: no heading for #{anchor} in {dest.name}"


# -- the quick start ---------------------------------------------------------------------------


def test_readme_is_a_short_front_page() -> None:
    # read in five minutes: the reference lives in docs/
    assert len(README.read_text(encoding="utf-8")) < 10_000
    assert "docs/images/panel-after-compare.png" in local_links(README)


def test_quick_start_is_what_ci_runs() -> None:
    quick = blocks(README, "bash")[0]
    commands = [line.split("#")[0].strip() for line in quick.splitlines() if line.strip()]
    assert commands == ["bash scripts/demo.sh", "bash scripts/test.sh"]
    ci = [line.strip() for line in (ROOT / ".ci/run").read_text().splitlines()]
    assert ci[-1] == "bash scripts/test.sh"


# -- shell commands ----------------------------------------------------------------------------


def shell_commands(page: Path) -> list[list[str]]:
    """Commands of the page's bash blocks (continuations joined, heredoc bodies left out) and
    its inline `precision-nb ...` spans, as argument lists without leading VAR=value settings."""
    commands: list[list[str]] = []
    for code in blocks(page, "bash"):
        code = re.sub(r"<<'(\w+)'\n.*?^\1$", "", code, flags=re.DOTALL | re.MULTILINE)
        for line in code.replace("\\\n", " ").splitlines():
            if line.strip():
                commands.append(shlex.split(line, comments=True))
    for span in re.findall(r"`((?:\.venv/bin/)?precision-nb [^`]*)`", prose(page)):
        commands.append(shlex.split(span.replace("\\|", "|").split("|")[0]))  # before a pipe
    return [without_settings(c) for c in commands]


def without_settings(args: list[str]) -> list[str]:
    while args and re.match(r"^[A-Z_]+=", args[0]):
        args = args[1:]
    return args


def test_shell_commands_strip_settings_and_heredocs() -> None:
    page = DOCS / "development.md"
    assert ["bash", "scripts/setup.sh"] in shell_commands(page)  # the setting in front is dropped
    assert all(c[0] != "import" for c in shell_commands(DOCS / "notebooks.md"))


def pytest_options() -> set[str]:
    test_sh = (ROOT / "scripts/test.sh").read_text()
    return set(re.findall(r"(--[\w-]+)", test_sh.split("python -m pytest", 1)[1]))


def check_command(args: list[str]) -> None:
    tool, rest = args[0].removeprefix(".venv/bin/"), args[1:]
    if tool == "bash":
        script = ROOT / rest[0]
        assert script.is_file() and script.parent.name == "scripts", args
        if script.name == "setup.sh":
            assert (rest[1:] or [""])[0] in SCRIPT_EXTRAS, args
    elif tool == "precision-nb":
        try:
            build_parser().parse_args(rest)
        except SystemExit as exit_:  # --help exits with 0
            if exit_.code != 0:
                raise AssertionError(f"precision-nb rejects {shlex.join(rest)}") from exit_
    elif tool == "python" and rest[:2] == ["-m", "pytest"]:
        options = {a.split("=")[0] for a in rest if a.startswith("--")}
        assert options <= pytest_options(), f"not in scripts/test.sh: {options - pytest_options()}"
        assert all((ROOT / a).exists() for a in rest[2:] if not a.startswith("-") and "/" in a)
    elif tool == "python" and rest == ["-"]:
        pass  # a heredoc script: compiled with the snippets
    elif tool == "python":
        script = ROOT / rest[0]
        assert script.is_file(), args
        text = script.read_text()
        for flag in (a for a in rest[1:] if a.startswith("--")):
            assert f'"{flag}"' in text, f"{rest[0]} has no option {flag}"
    elif tool == "torchrun":
        module = rest[rest.index("-m") + 1]
        assert (ROOT / (module.replace(".", "/") + ".py")).is_file(), args
    elif tool == "jupyter":
        assert rest[0] in ("lab", "nbconvert"), args
        paths = [a for a in rest[1:] if not a.startswith("-") and "/" in a]
        assert paths and all((ROOT / p).exists() for p in paths), args
    else:
        raise AssertionError(f"unchecked command in the docs: {shlex.join(args)}")


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_shell_commands_match_what_they_call(page: Path) -> None:
    for args in shell_commands(page):
        check_command(args)


def test_check_command_catches_a_bad_command() -> None:
    for bad in (
        ["precision-nb", "profile", "--no-such-flag"],
        ["bash", "scripts/setup.sh", "gpu"],
        ["python", "benchmarks/bench_fit.py", "--no-such-flag"],
        ["python", "-m", "pytest", "--nbval-strict"],
        ["jupyter", "lab", "notebook/"],
    ):
        with pytest.raises(AssertionError):
            check_command(bad)


# -- python snippets ---------------------------------------------------------------------------


def snippets(page: Path) -> list[str]:
    found = [] if page.name in SIGNATURE_PAGES else blocks(page, "python")
    for code in blocks(page, "bash"):
        found += re.findall(r"<<'(\w+)'\n(.*?)^\1$", code, flags=re.DOTALL | re.MULTILINE)
    return [code if isinstance(code, str) else code[1] for code in found]


def missing_names(code: str) -> list[str]:
    """Names the snippet takes from precision_nb (``pnb.X``, ``from precision_nb... import X``,
    ``module.X`` of an imported precision_nb module) that do not exist."""
    tree = ast.parse(code)
    modules: dict[str, object] = {}
    missing = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("precision_nb"):
                    modules[alias.asname or alias.name] = importlib.import_module(alias.name)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("precision_nb"):
            source = importlib.import_module(node.module)
            for alias in node.names:
                if not hasattr(source, alias.name):
                    try:
                        value = importlib.import_module(f"{node.module}.{alias.name}")
                    except ImportError:
                        missing.append(f"{node.module}.{alias.name}")
                        continue
                else:
                    value = getattr(source, alias.name)
                modules[alias.asname or alias.name] = value
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            owner = modules.get(node.value.id)
            if owner is not None and not hasattr(owner, node.attr):
                missing.append(f"{node.value.id}.{node.attr}")
        elif isinstance(node, ast.Call) and not missing:
            missing += bad_call(node, modules)
    return missing


def bad_call(node: ast.Call, modules: dict[str, object]) -> list[str]:
    """The call's arguments do not fit the signature of the precision_nb function it calls."""
    func = node.func
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
        owner = modules.get(func.value.id)
        target = getattr(owner, func.attr, None) if owner is not None else None
    elif isinstance(func, ast.Name):
        target = modules.get(func.id)
    else:
        return []
    splat = any(isinstance(a, ast.Starred) for a in node.args) or any(
        k.arg is None for k in node.keywords
    )
    if not callable(target) or inspect.ismodule(target) or splat:
        return []
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):
        return []
    try:
        signature.bind(*node.args, **{k.arg: k.value for k in node.keywords})
    except TypeError as error:
        return [f"{ast.unparse(node)}: {error}"]
    return []


def test_missing_names_finds_a_wrong_name() -> None:
    code = "import precision_nb as pnb\nfrom precision_nb.views.report import figures\n"
    assert missing_names(code + "pnb.fit\nfigures.loss_figure\n") == []
    assert missing_names(code + "pnb.fitt\nfigures.loss_fig\n") == ["pnb.fitt", "figures.loss_fig"]
    assert missing_names(code + "pnb.fit('mlp', preset='tiny', steps=3)\n") == []
    wrong = missing_names(code + "pnb.profile('mlp', None, None, 'fp32', 'tiny')\n")
    assert len(wrong) == 1 and "positional" in wrong[0]


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_python_snippets_compile_and_name_real_things(page: Path) -> None:
    for code in snippets(page):
        compile(code, rel(page), "exec")
        assert not missing_names(code), f"{rel(page)}: {missing_names(code)} in\n{code}"


def test_public_names_the_readme_uses_are_exported() -> None:
    used = set(re.findall(r"\bpnb\.(\w+)", README.read_text(encoding="utf-8")))
    assert used and used <= set(precision_nb.__all__), used - set(precision_nb.__all__)


EXAMPLES = blocks(README, "python")


def test_readme_has_a_short_example_each_for_the_panel_fit_profile_and_distributed() -> None:
    calls = ["pnb.Panel(", "pnb.fit(", "pnb.profile(", "pnb.Distributed("]
    assert len(EXAMPLES) == len(calls)
    for code, call in zip(EXAMPLES, calls, strict=True):
        assert call in code and len(code.strip().splitlines()) <= 12, code


@pytest.mark.parametrize("code", EXAMPLES, ids=["panel", "fit", "profile", "distributed"])
def test_readme_example_runs(code: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # the profile example writes profile-tiny/ here
    namespace: dict[str, object] = {"__name__": "readme_example"}
    exec(compile(code, "README.md", "exec"), namespace)
    if "pnb.profile(" in code:
        assert (tmp_path / "profile-tiny" / "report.html").is_file()
        assert not (tmp_path / "profile-out").exists()  # the demo's report is left alone
    produced = [namespace.get(name) for name in ("result", "prof", "panel")]
    assert any(value is not None for value in produced), "the example produced nothing"
    if "prof" in namespace:
        assert set(namespace["prof"].verdicts) == {"fp32", "bf16"}
    if "pnb.Distributed(" in code:
        comm = namespace["result"].comm_table()
        assert {row["rank"] for row in comm} == {0, 1}
        assert any(row["dtype"] == "bf16" for row in comm), comm


# -- the newcomer's next step ------------------------------------------------------------------


def test_demo_setup_installs_what_the_readme_runs_next(setup_dry_run) -> None:
    demo = (ROOT / "scripts/demo.sh").read_text()
    assert "bash scripts/setup.sh\n" in demo  # the demo sets up with no extra
    commands, _ = setup_dry_run(PRECISION_NB_TORCH_INDEX="cpu")  # cpu: no pip resolution
    installs = [c for c in commands if c[1:4] == ["-m", "pip", "install"]]
    assert "torch==2.13.0" in installs[0] and "-e" in installs[1]
    spec = installs[1][installs[1].index("-e") + 1]
    extra = re.fullmatch(r"\.\[(\w+)\]", spec).group(1)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    provides = {"precision-nb", "python"}  # the package's script, the venv's interpreter
    if any(d.startswith("jupyterlab") for d in project["optional-dependencies"][extra]):
        provides.add("jupyter")
    after_demo = [a for a in shell_commands(README) if a[0].startswith(".venv/bin/")]
    assert after_demo, "the README names the commands to run after the demo"
    for args in after_demo:
        assert args[0].removeprefix(".venv/bin/") in provides, f"demo does not install {args[0]}"
    assert set(project["scripts"]) == {"precision-nb"}


def test_architecture_lists_every_module() -> None:
    """The layout in docs/architecture.md names every module of the package, and no gone one."""
    text = (DOCS / "architecture.md").read_text(encoding="utf-8")
    layout = text.split("```\nprecision_nb/\n", 1)[1].split("```", 1)[0]
    listed = {
        line.split()[0]
        for line in layout.splitlines()
        if line.strip().endswith(".py") or ".py " in line
    }
    package = ROOT / "precision_nb"
    names = {p.name for p in package.rglob("*.py")}
    assert names <= listed, f"modules missing from docs/architecture.md: {sorted(names - listed)}"
    assert listed <= names, (
        f"docs/architecture.md lists modules that do not exist: {sorted(listed - names)}"
    )
