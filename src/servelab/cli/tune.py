"""CLI verbs: `servelab tune fp8-gemm ...` (tune, resumable, multi-GPU/Ray), `tune verify DIR`
and `tune install DIR --engine ...` (and `--restore`)."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from servelab import jobs, jsonout
from servelab.cli.console import make_console
from servelab.errors import UserError
from servelab.tune.space import DEFAULT_BATCH_SIZES

# servelab.tune.job, .verify, .install and kernels.fp8_gemm load torch (~0.6 s): imported
# inside the verbs, so that the CLI starts without it.


def _parse_shapes(values: list[str]) -> tuple[tuple[int, int], ...]:
    out = []
    for v in values:
        parts = v.replace("x", ",").split(",")
        if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
            raise UserError(f"--shape {v!r}: expected N,K, e.g. --shape 4096,512")
        out.append((int(parts[0]), int(parts[1])))
    return tuple(dict.fromkeys(out))


def _parse_ints(v: str | None, what: str) -> tuple[int, ...] | None:
    if v is None:
        return None
    try:
        xs = tuple(int(x) for x in v.split(",") if x.strip())
    except ValueError:
        raise UserError(f"{what} {v!r}: expected comma-separated integers, e.g. 1,2,4") from None
    if not xs or min(xs) <= 0:
        raise UserError(f"{what} {v!r}: expected positive integers")
    return xs


def register(app: typer.Typer) -> None:
    """Add `tune` and its verbs to the app."""
    tune = typer.Typer(help="Tune kernels for the GPU at hand and write engine config files.",
                       no_args_is_help=True)
    app.add_typer(tune, name="tune")
    _add_fp8_gemm(tune)
    _add_verify(tune)
    _add_install(tune)


def _add_fp8_gemm(tune: typer.Typer) -> None:
    """`servelab tune fp8-gemm`: tune, resumable, one worker per GPU or Ray."""

    @tune.command("fp8-gemm")
    def fp8_gemm(
        shape: list[str] = typer.Option(..., "--shape", help="N,K of a weight (repeatable)."),
        batch_sizes: str = typer.Option(None, "--batch-sizes", help="M values; default the 18 of the engines."),
        search: str = typer.Option("fast", "--search", help="exhaustive | fast (budgeted)."),
        gpus: str = typer.Option(None, "--gpus", help="GPU ids, one worker process each, e.g. 0,1."),
        ray: str = typer.Option(None, "--ray", help="Ray address (or 'local'): one task per unit, num_gpus=1."),
        out: Path = typer.Option(Path("tuned-configs"), "--out", help="Folder for config files and the checkpoint."),
        fmt: str = typer.Option("both", "--format", help="sglang | vllm | both."),
        device: str = typer.Option("cuda", "--device", help="cuda, or cpu (Triton interpreter, tiny space, timings meaningless)."),
        budget: float = typer.Option(0.2, "--budget", help="fast search: fraction of candidates timed."),
        space: str = typer.Option(None, "--space", help="full (default on cuda) | tiny (default on cpu)."),
        name: str = typer.Option(None, "--name", help="Job name shown by `servelab status`."),
        detach: bool = typer.Option(False, "--detach", help="Run in the background; follow with `servelab status`."),
        kernel: str = typer.Option("auto", "--kernel", help="Whose launcher to time: auto (the engine's own when importable here, else servelab's) | servelab | sglang | vllm."),
        as_json: bool = typer.Option(False, "--json", help="Print the result as JSON on stdout (docs/JSON.md); progress goes to stderr."),
    ) -> None:
        """Tune the block-FP8 GEMM per (N, K, M); resumable; writes SGLang/vLLM config files.
        The engine's shipped config for each point is always a finalist and is kept unless
        beaten by more than 1.5%."""
        from servelab.tune import job

        shapes = _parse_shapes(shape)
        bs = _parse_ints(batch_sizes, "--batch-sizes") or DEFAULT_BATCH_SIZES
        if fmt not in ("sglang", "vllm", "both"):
            raise UserError(f"--format {fmt}: choose sglang, vllm or both")
        if gpus and ray:
            raise UserError("give --gpus or --ray, not both")
        gpu_ids = tuple(g.strip() for g in gpus.split(",") if g.strip()) if gpus else None
        if device == "cpu" and not gpu_ids:
            gpu_ids = ("cpu",)
        if device not in ("cpu", "cuda"):
            raise UserError(f"--device {device}: choose cuda or cpu")
        if device == "cuda" and not ray:  # checked here: a worker would fail with a traceback
            import torch

            if not torch.cuda.is_available():
                raise UserError("--device cuda but torch sees no CUDA device; tune on a GPU "
                                "machine, or pass --device cpu (timings meaningless)")
        job_name = name or f"tune-{out.resolve().name}"
        spec = job.TuneSpec(
            shapes=shapes, out_dir=out, batch_sizes=bs, search=search, gpus=gpu_ids or ("0",),
            ray=ray, formats=("sglang", "vllm") if fmt == "both" else (fmt,), device=device,
            space=space, budget_frac=budget, name=job_name, kernel=kernel)
        if detach:
            if as_json:
                raise UserError("--json prints the result when the job ends: leave out --detach, "
                                "or follow the detached job with `servelab status --json`")
            pid, log = jobs.detach(sys.argv[1:], job_name)
            typer.echo(f"started job '{job_name}' (pid {pid}); log {log}; follow with: servelab status {job_name}")
            return
        say = _stderr if as_json else typer.echo
        rep = _run_with_progress(job, spec, say, bar=not as_json)
        if as_json:
            jsonout.emit("tune", jsonout.tune(rep, spec))
        n_ok = len(rep.units)
        say(f"done: {n_ok} points tuned ({rep.resumed_units} from the checkpoint), "
            f"{len(rep.failed)} failed, {rep.seconds:.1f} s on {rep.device_name}")
        for p in rep.files:
            say(f"  {p}")
        if rep.failed:
            raise typer.Exit(1)


def _add_verify(tune: typer.Typer) -> None:
    """`servelab tune verify DIR`: tuned vs shipped vs default."""

    @tune.command("verify")
    def verify_cmd(
        directory: Path = typer.Argument(..., help="Folder with tuned config files."),
        device: str = typer.Option("cuda", "--device", help="cuda, or cpu (interpreter; timings meaningless)."),
        batch_sizes: str = typer.Option(None, "--batch-sizes", help="Re-time only these M."),
        as_json: bool = typer.Option(False, "--json", help="Print the result as JSON (docs/JSON.md)."),
        engine: str = typer.Option("sglang", "--engine", help="sglang | vllm: whose shipped files and default to compare with."),
        kernel: str = typer.Option("auto", "--kernel", help="auto (the engine's own when importable) | servelab | sglang | vllm."),
        shipped: Path = typer.Option(None, "--shipped", help="The engine's config folder (default: found in this interpreter)."),
    ) -> None:
        """Re-time tuned vs the engine's shipped configs vs its default, per (N, K, M)."""
        from rich.table import Table

        from servelab.tune import verify as V

        checks, rows, here, label = V.verify(directory, device,
                                             _parse_ints(batch_sizes, "--batch-sizes"),
                                             engine, kernel, shipped)
        if as_json:
            gm = V.geomean([r.speedup for r in rows if r.speedup])
            gs = V.geomean([r.vs_shipped for r in rows if r.vs_shipped])
            jsonout.emit("tune_verify", jsonout.tune_verify(checks, rows, here, gm, gs, label))
            if any(r.error for r in rows):
                raise typer.Exit(1)
            return
        con = make_console()
        con.print(f"kernel timed: {label}")
        for c in checks:
            notes = []
            if c.device != here:
                notes.append(f"WARNING: tuned on {c.device}, this device is {here}")
            if c.missing_default:
                notes.append(f"missing default batch sizes {list(c.missing_default)}")
            con.print(f"{c.path.name}: {len(c.batch_sizes)} batch sizes ({c.fmt}) " + "; ".join(notes))
        if device == "cpu":
            con.print("note: Triton interpreter on the CPU: timings are MEANINGLESS for any GPU")
        t = Table(title=f"tuned vs shipped vs default ({here})")
        for col in ("N", "K", "M", "tuned config", "tuned_us", "shipped config", "shipped_us",
                    "default_us", "vs shipped", "vs default", "TFLOP/s"):
            t.add_column(col, justify="right")
        for r in rows:
            t.add_row(str(r.n), str(r.k), str(r.m), r.tuned, _f(r.tuned_us),
                      r.shipped or "(none: default)", _f(r.shipped_us), _f(r.default_us),
                      _f(r.vs_shipped, 3), _f(r.speedup, 3), _f(r.tflops))
        con.print(t)
        gm = V.geomean([r.speedup for r in rows if r.speedup])
        gs = V.geomean([r.vs_shipped for r in rows if r.vs_shipped])
        con.print(f"geometric-mean speedup over {len(rows)} points: {_f(gs, 3)}x vs shipped, "
                  f"{_f(gm, 3)}x vs default")
        failed = [r for r in rows if r.tuned_us is None]
        if failed:
            first = failed[0]
            con.print(f"FAILED: {len(failed)} tuned config(s) did not launch, first N={first.n},"
                      f"K={first.k},M={first.m} {first.tuned}: {first.error}")
            raise typer.Exit(1)


def _add_install(tune: typer.Typer) -> None:
    """`servelab tune install DIR --engine ...` (and `--restore`)."""

    @tune.command("install")
    def install_cmd(
        directory: Path = typer.Argument(None, help="Folder with tuned config files (not with --restore)."),
        engine: str = typer.Option(..., "--engine", help="sglang | vllm: whose files to install, where it reads them."),
        python: str = typer.Option(None, "--python", help="The engine's interpreter (its venv's python), if not this one."),
        dest: Path = typer.Option(None, "--dest", help="The engine's config folder, if not found."),
        restore: bool = typer.Option(False, "--restore", help="Put back what earlier installs replaced."),
        as_json: bool = typer.Option(False, "--json", help="Print the result as JSON on stdout (docs/JSON.md)."),
    ) -> None:
        """Install tuned files where the engine reads them; shipped files are backed up."""
        from servelab.kernels.fp8_gemm import engine as engine_kernel
        from servelab.tune import install as I

        say = _stderr if as_json else typer.echo
        folder = dest or I.engine_config_dir(engine, python)
        if restore:
            back = I.restore(folder)
            for f in back.done:
                say(f"{'restored' if f.replaced else 'removed '} {folder / f.name}")
            for name, why in back.failed:
                _stderr(f"not restored {name!r}: {why}")
            if as_json:
                jsonout.emit("tune_install", jsonout.tune_install(
                    engine, folder, back.done, True, None, None, not_restored=back.failed))
            if back.failed:
                raise UserError(f"{len(back.failed)} of {len(back.done) + len(back.failed)} "
                                "entries not restored (listed above); the rest were")
            return
        if directory is None:
            raise UserError("give the folder of tuned files: servelab tune install DIR --engine ...")
        import subprocess
        done = I.install(directory, engine, folder)
        for f in done:
            note = "replaced the shipped file (backed up)" if f.replaced else "new"
            say(f"installed {folder / f.name} ({note})")
        lookup: dict[str, object]
        try:                      # the engine's own lookup is the judge of "installed"
            if python is None and engine_kernel.package_dir(engine) is None:
                raise UserError(f"{engine} is not installed in this interpreter "
                                f"({sys.executable}); pass --python with the engine's "
                                "interpreter to check")
            ok = I.confirm(engine, folder, [f.name for f in done], python, own_folder=not dest)
            say(f"{engine}'s own lookup finds {len(ok.found)} of {len(done)} installed "
                f"files: {ok.by}")
            for name in ok.missing:
                say(f"NOT FOUND by {engine}'s lookup: {name}")
            lookup = {"checked": True, "by": ok.by, "found": ok.found, "missing": ok.missing,
                      "error": None}
        except (RuntimeError, UserError, OSError, subprocess.SubprocessError) as exc:
            ok = None
            say(f"not checked with {engine}'s own lookup: {str(exc)[:200]}")
            lookup = {"checked": False, "by": None, "found": [], "missing": [],
                      "error": str(exc)[:200]}
        undo = (f"servelab tune install --engine {engine} --restore"
                + (f" --dest {folder}" if dest else f" --python {python}" if python else ""))
        say(f"undo with: {undo}")
        if as_json:
            jsonout.emit("tune_install", jsonout.tune_install(engine, folder, done, False,
                                                              lookup, undo))
        if ok is not None and ok.missing:
            raise typer.Exit(1)


def _stderr(text: str) -> None:
    typer.echo(text, err=True)


def _run_with_progress(job, spec, echo=typer.echo, bar: bool = True):
    """A progress bar with ETA on a terminal; one line per unit (with ETA) otherwise, or when
    stdout carries the JSON document (`bar` False: the lines go to `echo`, i.e. stderr)."""
    if not bar or not sys.stdout.isatty():
        return job.run(spec, echo=echo, argv=sys.argv)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("tuning"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("ETA {task.fields[eta]}")) as bar:
        task = bar.add_task("tune", total=None, eta="-")

        def on_progress(done: int, total: int, eta: float | None) -> None:
            eta_s = "-" if eta is None else f"{int(eta) // 60}m{int(eta) % 60:02d}s"
            bar.update(task, completed=done, total=total, eta=eta_s)
        return job.run(spec, echo=bar.console.print, argv=sys.argv, progress=on_progress)


def _f(x: float | None, nd: int = 1) -> str:
    return "-" if x is None else f"{x:.{nd}f}"
