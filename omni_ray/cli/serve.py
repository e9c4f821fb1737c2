"""``omni-ray serve [MODEL]``: run the Serve app (``build_omni_app``) until Ctrl-C.

As ``vllm serve MODEL`` / ``serve run CONFIG``: the model (a directory, hub id or ``tiny``) is the
positional argument, ``--config FILE`` reads a Serve config's first application (its ``args`` and
``http_options``) and flags override both. Ray is started in this process (or joined through
``RAY_ADDRESS``); Ctrl-C (SIGINT) or SIGTERM shuts Serve, then Ray, down and exits 0.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

from omni_ray.cli.argtypes import port
from omni_ray.cli.serve_config import add_app_flags, serving_args

DEFAULT_HOST, DEFAULT_PORT = "127.0.0.1", 8000  # Serve's own defaults


def add_parser(sub) -> None:
    p = sub.add_parser("serve", help="serve the OpenAI-compatible API on Ray Serve until Ctrl-C")
    p.add_argument("model", nargs="?", default=None,
                   help="checkpoint directory, Hugging Face hub id, or 'tiny' (default: the "
                        "config's model, else the tiny checkpoint: random weights)")
    add_app_flags(p)
    p.add_argument("--host", default=None,
                   help=f"listen address (default: the config's, else {DEFAULT_HOST})")
    p.add_argument("--port", type=port, default=None,
                   help=f"listen port (default: the config's, else {DEFAULT_PORT})")
    p.add_argument("--model-id", default=None,
                   help="model name in /v1/models (default: the config's, else qwen3-omni)")
    p.add_argument("--api-key-env", default=None, metavar="VAR",
                   help="env var holding comma-separated API keys (default OMNI_RAY_API_KEYS; "
                        "unset or empty: no auth)")
    p.add_argument("--mps", action="store_true",
                   help="share each GPU among the stages through NVIDIA MPS: a private MPS "
                        "control daemon for this run, so the stages' kernels run side by side "
                        "instead of time-slicing the GPU (one H200: RTF -10 %% at concurrency 1, "
                        "audio per second +11-15 %% at 8 and 32). Needs Ray started here (no "
                        "RAY_ADDRESS); on a cluster, enable MPS on the GPU nodes instead")
    p.set_defaults(run=run, parser=p)


def run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    # 1) Validate the app's args and find the checkpoint before starting anything.
    from omni_ray.cli.loading import warnings_to_stderr

    warnings_to_stderr()
    if args.mps and os.environ.get("RAY_ADDRESS", "local") != "local":
        parser.error("--mps: the stage processes must start here, under the MPS daemon; unset "
                     "RAY_ADDRESS (on a cluster, enable MPS on the GPU nodes instead)")
    extra = {"model_id": args.model_id, "security": {"api_keys_env": args.api_key_env}}
    try:
        sa, sf = serving_args(args, extra)
        what = "making the tiny checkpoint" if sa.model == "tiny" else "finding"
        print(f"omni-ray serve: {what} {sa.model} ...", file=sys.stderr, flush=True)
        model = sa.checkpoint_dir()
    except (OSError, ValueError) as e:
        parser.error(str(e))
    host = args.host or sf.http_options.get("host", DEFAULT_HOST)
    listen_port = args.port or sf.http_options.get("port", DEFAULT_PORT)

    # 2) The MPS daemon (--mps), Ray (its processes inherit the daemon's pipe directory),
    # Serve's HTTP proxy, then the app; SIGTERM stops it as Ctrl-C does.
    with contextlib.ExitStack() as stack:  # the MPS daemon, if any, quits after Ray
        if args.mps:
            _start_mps(parser, stack)
        import ray
        from ray import serve

        from omni_ray.builders.app import build_omni_app

        # Ctrl-C stops it even where its parent ignored SIGINT (a shell's background job or
        # nohup pass the ignore down, and Python then never raises KeyboardInterrupt)
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.default_int_handler)
        ray.init(ignore_reinit_error=True)
        try:
            serve.start(http_options={"host": host, "port": listen_port})
            print(f"omni-ray serve: deploying {sa.model_id} from {model} ...", file=sys.stderr,
                  flush=True)
            serve.run(build_omni_app(sa), name=sf.name, route_prefix=sf.route_prefix,
                      blocking=False)
            base = f"http://{host}:{listen_port}{sf.route_prefix.rstrip('/')}"
            print(f"omni-ray serve: {sa.model_id} ready at {base}/v1 (health: {base}/health); "
                  "Ctrl-C stops", flush=True)
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            print("omni-ray serve: stopping ...", file=sys.stderr, flush=True)
        finally:
            serve.shutdown()
            ray.shutdown()
    return 0


def _start_mps(parser: argparse.ArgumentParser, stack: contextlib.ExitStack) -> None:
    """A private MPS daemon (its directories removed after it quits) whose pipe directory this
    process's environment carries, so the Ray processes it starts are its clients."""
    from omni_ray.mps import mps_daemon

    root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="omni_ray_mps_")))
    try:
        os.environ.update(stack.enter_context(mps_daemon(root)))
    except RuntimeError as e:
        parser.error(f"--mps: {e}")
    print("omni-ray serve: GPUs shared through MPS (a private daemon for this run)",
          file=sys.stderr, flush=True)
