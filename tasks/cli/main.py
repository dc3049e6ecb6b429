"""``framefleet``: one command for everything people run; each subcommand is a small module of tasks.cli.

framefleet run RAW_DIR --out OUT        the whole cluster on this machine, for one dataset
framefleet COMMAND --help               the options of COMMAND
"""

from __future__ import annotations

import importlib
import sys

# name: (module with main(argv, prog), one line for the listing). Modules load only when run.
COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("tasks.cli.run", "run a whole cluster on this machine for one dataset (Redis, workers, Flower)"),
    "enqueue": ("tasks.cli.enqueue", "send a folder of videos to running workers and show the progress"),
    "status": ("tasks.cli.status", "GPUs, workers, queues and a run's progress; --watch follows a run"),
    "cancel": ("tasks.cli.cancel", "cancel a run: waiting tasks revoked, running ones stop; --continue resumes"),
    "verify": ("tasks.cli.verify", "check an output folder's HDF5 files and statistics against the contract"),
    "videos": ("tasks.cli.videos", "every video of an output folder as JSON Lines (its status, reason, quality)"),
    "report": ("tasks.report.report", "write OUT/report.html for a finished run"),
    "view": ("tasks.cli.view", "write a video's frames, depth, cameras, 3D tracks and hands as a Rerun .rrd"),
    "clean": ("tasks.cli.clean", "delete the intermediates (OUT/work/) of finished videos"),
    "autoscale": ("tasks.autoscaler.cli", "supervise this host's GPU workers, sized by GPU memory (NVML)"),
    "gpu-memory": ("tasks.cli.gpu_memory", "GPU memory: info, monitor, suggest workers per GPU"),
    "sample": ("tasks.cli.sample", "make a folder of sample videos to try framefleet on"),
    "install-backends": ("tasks.cli.install_backends", "install MediaPipe (the CPU hands backend) in this environment"),
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"  {name.ljust(width)}  {text}" for name, (_module, text) in COMMANDS.items()]
    return (
        "usage: framefleet COMMAND [options]\n\ncommands:\n"
        + "\n".join(lines)
        + ("\n\n`framefleet COMMAND --help` gives the options of COMMAND.")
    )


def main(argv: list[str] | None = None) -> int:
    """Run the subcommand named by ``argv[0]``; return its exit status (2 for an unknown one)."""
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help", "help"):
        print(usage())
        return 0 if args else 2
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        print(f"framefleet: no command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[name][0])
    return int(module.main(rest, prog=f"framefleet {name}") or 0)


if __name__ == "__main__":
    sys.exit(main())
