"""Several in-process vLLM engines in one Python process (the offline ``Omni`` with thinker and
talker both on vLLM; in Serve each stage has its own process and none of this applies).

vLLM 0.26 keeps some per-process state that a second engine would replace under the first:

* the MoE workspace (``vllm.v1.worker.workspace``): each GPU worker's ``init_device`` makes a new
  process-global ``WorkspaceManager`` and locks it after its warm-up. A second engine replacing
  it frees the buffer the first engine's CUDA graphs were captured with, and leaves the first
  engine a locked workspace sized for the second (seen on an H200: the 30B thinker's MoE at 32
  requests asked 85 MB of a 64 MB workspace locked by the talker's engine). ``shared_workspace``
  makes later engines reuse the first one's manager: start the engine with the largest MoE
  first; a later engine that would need more fails at its own warm-up, loudly.
* the parallel groups: the first engine shutdown destroys them for all (``Omni.shutdown`` stops
  the engines together).
"""

from __future__ import annotations

import contextlib


@contextlib.contextmanager
def shared_workspace():
    """While starting an engine: reuse the MoE workspace of an engine already in this process."""
    try:
        from vllm.v1.worker import gpu_worker, workspace
    except ImportError:  # no GPU worker in this vLLM build
        yield
        return
    if getattr(workspace, "_manager", None) is None:
        yield
        return
    original = gpu_worker.init_workspace_manager
    gpu_worker.init_workspace_manager = lambda *args, **kwargs: None
    try:
        yield
    finally:
        gpu_worker.init_workspace_manager = original
