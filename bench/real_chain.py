#!/usr/bin/env python3
"""The chain with the real upstream models (random weights) where they run, each stage in an environment of its own.

    python bench/real_chain.py setup --base DIR [--real masks,tracks2d,hands] [--site DIR]...
        [--masks sam3] [--vipe-work DIR] [--upstream DIR]
    python bench/real_chain.py check --base DIR [--device cuda:0]
    python bench/real_chain.py bound --config DIR/real.yaml --raw RAW --out OUT [--device cuda:0]
    python bench/real_chain.py report --results DIR
    python bench/real_chain.py compare --results DIR [--plot decisions.png]

``setup`` lays out configs/real-gpu.yaml's models under DIR: the stages named by ``--real`` get
their real upstream code (``--upstream DIR``: the checkouts bench/gpu_lib.sh's ``upstream`` lays out at
deploy/envs/pins.sh's commits; without it, the source snapshots unpacked by tests.upstream.sources)
and random weights in each upstream checkpoint format (bench/gpu_models.py's ``prepare``); the
others, and all of them with ``--real ''``, the stand-ins of tests/standins. Each stage gets an
interpreter of its own (a venv over this one's packages, with that model's code on its path), and
DIR/real.yaml is configs/real-gpu.yaml on those folders and interpreters, tracks2d enabled (unless
``--no-tracks2d``).
DIR/envs.json says what each stage runs. ``--site``: a folder of packages the real models need
that this interpreter lacks (hydra-core, omegaconf, iopath for SAM 2; yacs, smplx, trimesh for WiLoR);
given more than once, each is added.

The whole chain on a GPU machine (bench/gpu_full_chain.sh): ``--real masks,depth,tracks,hands --masks sam3
--vipe-work /tmp/ff-vipe``. ``depth`` runs ViPE's ``lyra`` from a folder that bench/gpu_vipe.sh built
(``--vipe-work``: upstream/hgupt3+vipe with vipe_ext compiled, upstream/microsoft+MoGe, site/ with ViPE's
own packages, first on that stage's path, and cache/ with the random-weights model cache); ``tracks`` runs
TAPIP3D, whose CUDA extension pointops2 must be in one of the ``--site`` folders; ``--masks sam3`` runs
SAM 3, as configs/real-gpu.yaml does (its builder imports decord: a ``--site`` folder must have it), on
the checkpoint whose scoring makes every query a detection (bench/gpu_models.py's ``found``).

The masks stage follows one object (``max_objects: 1``): random weights fire on hundreds of boxes.
What is a stand-in in a real stage: WiLoR's YOLO hand detector (its size is not in the checkout;
the ultralytics stand-in gives fixed boxes) and pyrender (WiLoR builds renderers at load, nothing
renders). ViPE (depth) and TAPIP3D (tracks) are stand-ins unless named by ``--real``.

``check`` loads every stage once (all at once, each from its interpreter); a real model that fails to
load is replaced by its stand-in in DIR/real.yaml, and envs.json says so.

``bound`` is the models' own compute bound: one process at a time, in chain order, runs one stage
over every video (bench/stage_worker.py, from that stage's interpreter), its inputs read from the
previous stage's outputs before each call (untimed); it prints one JSON line: the sum of the GPU
stages' run times, per stage, and each stage's load time. ``--gpus 1,2,3`` deals the videos round-robin
into one share per GPU and runs each share's chain on its own GPU at the same time (CUDA_VISIBLE_DEVICES):
every stage process is still alone on its GPU, so the sum of the run times is the same bound, reached in a
third of the wall time; the load times are then per share.

``report`` reads what bench/gpu_real_autoscale.sh left in its results folder and prints the findings;
``compare`` sets its phase A (framefleet) against y2r's way (``bound --summary``, its files named y2r-*
beside A's): bench/real_chain_report.py's ``compare``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

REAL = ("masks", "tracks2d", "hands", "depth", "tracks")  # the stages whose real model can run from its upstream
DEFAULT_REAL = ("masks", "tracks2d", "hands")  # those that need nothing built on the GPU machine beforehand
CHECKOUTS = {
    "masks": "facebookresearch+sam2",
    "sam3": "facebookresearch+sam3",
    "tracks2d": "facebookresearch+co-tracker",
    "hands": "rolpotamias+WiLoR",
    "tracks": "zbw001+TAPIP3D",
}
PREPARE = {"masks": "grounded_sam", "sam3": "sam3", "tracks2d": "cotracker", "hands": "wilor"}  # bench/gpu_models.py's
# pyrender needs EGL or OSMesa; WiLoR imports it and builds renderers at load, and nothing renders in inference.
PYRENDER_STANDIN = (
    '"""Stand-in for pyrender: WiLoR builds its renderers at load; nothing renders in inference."""\n'
    "import sys\nfrom unittest import mock\n\nsys.modules[__name__] = mock.MagicMock(name='pyrender')\n"
)


def make_env(
    folder: Path, paths: list[Path], packages: list[Path], modules: dict[str, str], first: list[Path] = ()
) -> Path:
    """A venv over this interpreter's packages, with ``paths`` added and ``packages``/``modules`` of its own first;
    ``first``: folders put before everything but $PYTHONPATH (ViPE's transformers 4 before the machine's 5)."""
    from tests.backends.standin_env import venv_over_this_python

    lines = [f"import sys; sys.path[1:1] = {[str(p) for p in first]!r}"] if first else []
    purelib = venv_over_this_python(folder, paths, lines)
    for package in packages:
        shutil.copytree(package, purelib / package.name, ignore=shutil.ignore_patterns("__pycache__"))
    for name, text in modules.items():
        (purelib / name).mkdir()
        (purelib / name / "__init__.py").write_text(text)
    return folder / "bin" / "python"


def setup(
    base: Path,
    real: list[str],
    site_dirs: list[Path],
    masks: str = "grounded_sam",
    vipe_work: Path | None = None,
    tracks2d: bool = True,
    max_flat_frame_pct: float | None = None,
    sources: Path | None = None,
) -> dict[str, Any]:
    """Lay out models, environments and DIR/real.yaml under ``base``; return what each stage runs.

    sources: a folder of upstream checkouts named <owner>+<repo>; None: tests.upstream.sources' snapshots.
    """
    import yaml

    from tests.backends.standin_env import STANDINS, lay_out_upstream, real_gpu_yaml_on, standin_python
    from tests.upstream.sources import source

    models = base / "models"
    shutil.rmtree(models, ignore_errors=True)
    lay_out_upstream(models)
    standin = standin_python()
    text = real_gpu_yaml_on(models, str(standin))
    (base / "standin.yaml").write_text(text)
    conf = yaml.safe_load(text)
    stages = conf["stages"]
    if not tracks2d:  # configs/real-gpu.yaml as it ships: 3D tracks only
        stages["tracks2d"]["enabled"] = False
        del stages["tracks2d"]["python"]
    if max_flat_frame_pct is not None:  # random-weight ViPE makes depth a plane: y2r's flat-depth gate would fire
        conf.setdefault("quality", {})["max_flat_frame_pct"] = max_flat_frame_pct
    if max_flat_frame_pct == 100:  # and random-weight TAPIP3D finds no points: every gate off, the same work as y2r's
        conf["quality"].update(min_track_windows=0, min_track_visible_fraction=0.0, min_median_track_length=0.0)
        print("quality gates off (random weights cannot pass them): every video runs every stage", file=sys.stderr)
    runs = {s: {"python": str(standin), "runs": "stand-in (tests/standins)"} for s in stages if stages[s].get("python")}
    upstream = base / "upstream"
    shutil.rmtree(upstream, ignore_errors=True)
    upstream.mkdir(parents=True)
    extra = list(site_dirs)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, [*extra, os.environ.get("PYTHONPATH", "")]))}
    name = {stage: "sam3" if stage == "masks" and masks == "sam3" else stage for stage in real}
    preparing = {}
    for stage in real:
        if stage == "depth":
            continue  # ViPE's folder comes built (--vipe-work)
        checkout = sources / CHECKOUTS[name[stage]] if sources else source(CHECKOUTS[name[stage]])
        if not checkout.is_dir():
            raise SystemExit(f"{checkout} is missing: bench/gpu_lib.sh's upstream {CHECKOUTS[name[stage]]} makes it")
        (upstream / CHECKOUTS[name[stage]]).symlink_to(checkout)
        log = open(base / f"prepare-{stage}.log", "w")  # noqa: SIM115 (the child keeps its own copy)
        if stage == "tracks":  # TAPIP3D's own models.from_config, in the process that imports pointops2
            code = "import sys; from pathlib import Path; from bench.gpu_conformance import prepare_tapip3d; "
            code += "print(prepare_tapip3d(Path(sys.argv[1]), Path(sys.argv[2])))"
            argv = [sys.executable, "-c", code, str(checkout.resolve()), str(base / "weights" / "tapip3d")]
            preparing[stage] = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
            continue
        argv = [sys.executable, str(ROOT / "bench" / "gpu_models.py"), "--step", "prepare", "--upstream", str(upstream)]
        argv += ["--models", PREPARE[name[stage]], "--weights", str(base / "weights"), "--clip", "-"]
        argv += ["--out", str(base)]
        preparing[stage] = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
    for stage, proc in preparing.items():
        if proc.wait() != 0:
            raise SystemExit(f"random weights for {stage}: exit {proc.returncode}; see {base}/prepare-{stage}.log")
    for stage in real:
        folder = base / "envs" / stage
        if stage == "depth":
            if vipe_work is None:
                raise SystemExit("--real depth needs --vipe-work: the folder bench/gpu_vipe.sh built ViPE in")
            vipe, moge = vipe_work / "upstream" / "hgupt3+vipe", vipe_work / "upstream" / "microsoft+MoGe"
            python = make_env(folder, extra, [], {}, first=[vipe_work / "site", vipe, moge])
            stages[stage]["params"]["weights_dir"] = str(vipe_work / "cache")
            stages[stage]["python"] = str(python)
            runs[stage] = {"python": str(python), "runs": "ViPE lyra + MoGe (real, random weights; bench/gpu_vipe.sh)"}
            continue
        if stage == "tracks":
            checkout = (upstream / CHECKOUTS[stage]).resolve()
            # the sites first, as bench/gpu_conformance.sh ran it (its PYTHONPATH): pointops2, omegaconf's version
            python = make_env(folder, [checkout], [], {}, first=extra)
            stages[stage]["params"].update(repo_dir=str(checkout), weights_dir=str(base / "weights" / "tapip3d"))
            stages[stage]["python"] = str(python)
            runs[stage] = {"python": str(python), "runs": "TAPIP3D (real, random weights)"}
            continue
        checkout = upstream / CHECKOUTS[name[stage]]
        weights = base / "weights" / PREPARE[name[stage]]
        if stage == "hands":
            (weights / "detector.pt").write_bytes(b"placeholder: the ultralytics stand-in checks that it exists")
            python = make_env(folder, extra, [STANDINS / "site" / "ultralytics"], {"pyrender": PYRENDER_STANDIN})
            stages[stage]["params"].update(repo_dir=str(checkout.resolve()), weights_dir=str(weights))
            what = "WiLoR network (real, random weights); YOLO detector and pyrender: stand-ins"
        else:
            if name[stage] == "sam3":  # the sites first, as bench/gpu_models.sh ran it: setuptools<81, timm's version
                python = make_env(folder, [checkout.resolve()], [], {}, first=extra)
            else:
                python = make_env(folder, [checkout.resolve(), *extra], [], {})
            stages[stage]["params"]["weights_dir"] = str(weights)
            if name[stage] == "sam3":  # configs/real-gpu.yaml's own masks backend and parameters
                stages[stage]["params"].update(
                    weights_dir=str(weights / "found"), bpe_path=str(weights / "bpe_simple_vocab_16e6.txt.gz")
                )
            elif stage == "masks":
                # y2r's grounding-dino option (configs/real-gpu.yaml runs its default, SAM 3). An untrained
                # GroundingDINO clears y2r's 0.3 on many boxes, and SAM 2 then follows each (15 s a frame
                # on an H200); a trained one finds the block: SAM 2 follows the best box.
                prompt = stages[stage]["params"].get("text_prompt", "red t-shaped block.")
                stages[stage]["backend"] = "grounded_sam"
                stages[stage]["params"] = {
                    "weights_dir": str(weights),
                    "text_prompt": prompt,
                    "box_threshold": 0.3,
                    "key_frame_idx": 0,
                    "max_objects": 1,
                }
            what = {"masks": "GroundingDINO-base + SAM 2.1-L", "sam3": "SAM 3", "tracks2d": "CoTracker3 offline"}[
                name[stage]
            ]
            what += " (real, random weights)"
        stages[stage]["python"] = str(python)
        runs[stage] = {"python": str(python), "runs": what}
    (base / "real.yaml").write_text(yaml.safe_dump(conf, sort_keys=False))
    (base / "envs.json").write_text(json.dumps(runs, indent=1))
    return runs


def check(base: Path, device: str) -> dict[str, Any]:
    """Load every own-environment stage of DIR/real.yaml once, all at once; a real one that fails runs its stand-in.

    Returns per stage its load time or error; DIR/real.yaml and DIR/envs.json are rewritten for a fallback.
    """
    import yaml

    conf = yaml.safe_load((base / "real.yaml").read_text())
    standin = yaml.safe_load((base / "standin.yaml").read_text())
    runs = json.loads((base / "envs.json").read_text())
    env = {**os.environ, "FRAMEFLEET_CONFIG": str(base / "real.yaml")}
    procs = {}
    for stage in runs:
        argv = [conf["stages"][stage]["python"], str(ROOT / "bench" / "stage_worker.py"), stage, "--device", device]
        procs[stage] = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT
        )
    result: dict[str, Any] = {}
    for stage, proc in procs.items():
        out, err = proc.communicate()
        loaded = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        if proc.returncode == 0 and loaded:
            result[stage] = {"load_s": loaded[0]["load_s"], "runs": runs[stage]["runs"]}
            continue
        error = (err.strip().splitlines() or ["?"])[-1][:400]
        result[stage] = {"error": error, "runs": runs[stage]["runs"]}
        if runs[stage]["runs"].startswith("stand-in"):
            continue
        conf["stages"][stage] = standin["stages"][stage]
        runs[stage] = {
            "python": standin["stages"][stage]["python"],
            "runs": f"stand-in (tests/standins): the real model failed to load: {error}",
        }
        result[stage]["fallback"] = "stand-in"
    (base / "real.yaml").write_text(yaml.safe_dump(conf, sort_keys=False))
    (base / "envs.json").write_text(json.dumps(runs, indent=1))
    return result


def run_stage(python: str, stage: str, jobs: list[dict[str, Any]], device: str, env: dict[str, str]) -> list[dict]:
    """Run ``stage`` over ``jobs`` in one bench/stage_worker.py process (saving its outputs); its JSON events."""
    argv = [python, str(ROOT / "bench" / "stage_worker.py"), stage, "--device", device, "--save"]
    text = "".join(json.dumps(j) + "\n" for j in jobs)
    done = subprocess.run(argv, input=text, capture_output=True, text=True, env=env, cwd=ROOT)
    if done.returncode != 0:
        raise SystemExit(f"{stage}: exit {done.returncode}\n{done.stderr[-3000:]}")
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def bound(config: Path, raw: Path, out: Path, device: str, gpus: list[str] | None = None) -> dict[str, Any]:
    """The GPU stages' own time over every video of ``raw``, one stage process at a time (see the module's doc)."""
    os.environ["FRAMEFLEET_CONFIG"] = str(config)
    from bench.modes_local import jobs_for

    jobs = jobs_for(raw.resolve(), out, run_id="bound")
    if not gpus:
        return _bound_share(jobs, device, dict(os.environ), lambda partial: _print_line(partial))
    from concurrent.futures import ThreadPoolExecutor

    shares = [jobs[i :: len(gpus)] for i in range(len(gpus))]
    parts: dict[int, dict[str, Any]] = {}

    def one(i: int) -> dict[str, Any]:
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": gpus[i]}

        def seen(partial: dict[str, Any]) -> None:  # a line per stage of any share: a cut bound says what it had
            parts[i] = partial
            _print_line(_merged(list(parts.values()), len(jobs), gpus, partial=True))

        return _bound_share(shares[i], "cuda:0" if device.startswith("cuda") else device, env, seen)

    with ThreadPoolExecutor(len(gpus)) as pool:
        done = list(pool.map(one, range(len(gpus))))
    return _merged(done, len(jobs), gpus, partial=False)


def _bound_share(jobs: list[dict[str, Any]], device: str, env: dict[str, str], seen: Any) -> dict[str, Any]:
    """One process at a time, in chain order, each stage over ``jobs``; ``seen`` gets the result after each stage."""
    import statistics
    import time

    from tasks.celery_app import settings
    from tasks.stages import GPU_STAGES

    conf = settings()
    chain = list(jobs[0]["chain"])
    result: dict[str, Any] = {"videos": len(jobs), "per_stage_s": {}, "load_s": {}, "stages": {}}
    for stage in [chain[0], *(s for s in chain if s in GPU_STAGES)]:
        gpu = stage in GPU_STAGES
        began = time.time()
        events = run_stage(conf.stages[stage].python or sys.executable, stage, jobs, device if gpu else "cpu", env)
        if gpu:
            runs = [e for e in events if e["event"] == "done"]
            result["per_stage_s"][stage] = round(sum(e["run_s"] for e in runs), 3)
            result["load_s"][stage] = next(e["load_s"] for e in events if e["event"] == "loaded")
            result["stages"][stage] = {  # the process's wall (start, load, every video, untimed I/O), its first task
                "wall_s": round(time.time() - began, 2),  # and the median of the rest, its torch peak
                "first_s": runs[0]["run_s"] if runs else None,
                "steady_s": round(statistics.median(e["run_s"] for e in runs[1:]), 3) if runs[1:] else None,
                "peak_mib": max((e.get("torch_peak_reserved_mib") or 0 for e in runs), default=None),
            }
            seen({**result, "partial": True, "bound_s": round(sum(result["per_stage_s"].values()), 3)})
    result["bound_s"] = round(sum(result["per_stage_s"].values()), 3)
    return result


def _merged(parts: list[dict[str, Any]], videos: int, gpus: list[str], partial: bool) -> dict[str, Any]:
    """The shares' bounds as one: run times summed per stage, load times listed per share."""
    per_stage: dict[str, float] = {}
    loads: dict[str, list[float]] = {}
    for part in parts:
        for stage, seconds in part["per_stage_s"].items():
            per_stage[stage] = round(per_stage.get(stage, 0.0) + seconds, 3)
            loads.setdefault(stage, []).append(part["load_s"][stage])
    if partial:  # only stages every share has finished count as a bound
        per_stage = {s: v for s, v in per_stage.items() if len(loads[s]) == len(gpus)}
    merged = {"videos": videos, "gpus": gpus, "per_stage_s": per_stage, "load_s": loads}
    merged["stages"] = parts[0].get("stages", {}) if parts else {}  # the first share's, as one GPU's figures
    merged["bound_s"] = round(sum(per_stage.values()), 3)
    if partial:
        merged["partial"] = True
    return merged


def _print_line(result: dict[str, Any]) -> None:
    print(json.dumps(result))
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("setup")
    s.add_argument("--base", type=Path, required=True)
    s.add_argument("--real", default=",".join(DEFAULT_REAL), help="stages that run their real model ('' for none)")
    s.add_argument("--site", type=Path, action="append", default=[], help="a folder of packages the real models need")
    s.add_argument("--masks", choices=["grounded_sam", "sam3"], default="grounded_sam", help="the masks' real model")
    s.add_argument("--vipe-work", type=Path, help="bench/gpu_vipe.sh's WORK folder, for --real depth")
    s.add_argument("--no-tracks2d", action="store_true", help="tracks2d off, as configs/real-gpu.yaml ships")
    s.add_argument(
        "--max-flat-frame-pct",
        type=float,
        help="quality.max_flat_frame_pct (100: every quality gate off, said on stderr)",
    )
    s.add_argument("--upstream", type=Path, help="the upstream checkouts (bench/gpu_lib.sh's upstream lays them out)")
    c = sub.add_parser("check")
    c.add_argument("--base", type=Path, required=True)
    c.add_argument("--device", default="cuda:0")
    r = sub.add_parser("report")
    r.add_argument("--results", type=Path, required=True)
    b = sub.add_parser("bound")
    b.add_argument("--config", type=Path, required=True)
    b.add_argument("--raw", type=Path, required=True)
    b.add_argument("--out", type=Path, required=True)
    b.add_argument("--device", default="cuda:0")
    b.add_argument("--gpus", default="", help="GPUs to share the videos over (e.g. 1,2,3); default: --device")
    b.add_argument("--summary", type=Path, help="write the bound's window here (started, finished, wall_s)")
    v = sub.add_parser("compare", help="framefleet (gpu_real_autoscale.sh's A) against y2r's way (bound --summary)")
    v.add_argument("--results", type=Path, required=True, help="the folder of A-* and y2r-* files")
    v.add_argument("--plot", type=Path, help="the autoscaler's decisions over time as a PNG")
    args = parser.parse_args(argv)
    if args.command == "setup":
        real = [r for r in args.real.split(",") if r]
        unknown = sorted(set(real) - set(REAL))
        if unknown:
            parser.error(f"--real: {unknown} have no real model here; choose from {', '.join(REAL)}")
        sites = [site.resolve() for site in args.site]
        vipe_work = args.vipe_work.resolve() if args.vipe_work else None
        runs = setup(
            args.base.resolve(),
            real,
            sites,
            args.masks,
            vipe_work,
            tracks2d=not args.no_tracks2d,
            max_flat_frame_pct=args.max_flat_frame_pct,
            sources=args.upstream.resolve() if args.upstream else None,
        )
        print(json.dumps(runs, indent=1))
    elif args.command == "check":
        print(json.dumps(check(args.base.resolve(), args.device), indent=1))
    elif args.command == "report":
        from bench.real_chain_report import report

        print(report(args.results))
    elif args.command == "compare":
        from bench.real_chain_report import compare

        print(compare(args.results, args.plot))
    else:
        import time

        gpus = [g for g in args.gpus.split(",") if g]
        started = time.time()
        print(json.dumps(bound(args.config.resolve(), args.raw, args.out.resolve(), args.device, gpus or None)))
        if args.summary:
            finished = time.time()
            window = {"started": started, "finished": finished, "wall_s": round(finished - started, 2)}
            args.summary.write_text(json.dumps(window))
    return 0


if __name__ == "__main__":
    sys.exit(main())
