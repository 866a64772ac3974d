"""Which execution path ``slackswap.apply`` takes for a plan (``backend="auto"``, the default),
worked out without torch.

* ``keep``: the plan keeps every saved tensor, so there is nothing to do during the step: no
  dispatch mode, no saved-tensor hooks, no module wrappers. Autograd saves what it always saves.
* ``checkpoint``: every recompute group of the plan lies in a module call that non-reentrant
  ``torch.utils.checkpoint`` can wrap so that it re-runs exactly the plan's ops
  (``build_checkpoint_map(...).faithful``, which also checks the plan's budget against the memory
  of rebuilding each call at its first unpack), nothing is swapped, and no such call was given
  an argument that is neither a tensor nor a plain value (``meta["stateful_call_args"]``, from
  the profiler: a cache object the forward changes, as Hugging Face T5's EncoderDecoderCache,
  would send checkpoint's re-run down another branch). Each such call runs
  under checkpoint (with a selective-checkpoint policy only where the call keeps some of its
  tensors); nothing else is installed.
* ``replay``: anything else (swaps, groups that do not coincide with module calls, FSDP2
  models): the forward recorder and the swap manager run the plan exactly (replay.py, swap.py).

The first two are the fast paths; they run exactly the plan's actions, or are not taken.
``PathChoice.simulated_plan`` is the plan as the chosen path runs it, for the simulator: for
``checkpoint``, each call's re-run ops form one group at the step of the call's first unpack.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..plans import Action, Plan
from ..workload import Workload
from .checkpoint_map import CheckpointMap, build_checkpoint_map

KEEP_PATH = "keep"
CHECKPOINT_PATH = "checkpoint"
REPLAY_PATH = "replay"
RECORDED_CHECKPOINT_PATH = "checkpoint-recorded"
"""backend="checkpoint": checkpoint for recompute plus the replay backend's recorder and swap hooks."""


@dataclass(frozen=True)
class PathChoice:
    path: str
    reason: str
    """Why this path (and, for replay, why not a fast one)."""
    simulated_plan: Plan
    checkpoint_map: CheckpointMap | None = None


def choose_path(workload: Workload, plan: Plan, hardware, *, fsdp: bool = False) -> PathChoice:
    """The path ``backend="auto"`` runs ``plan`` on; ``hardware`` is what the checkpoint path's
    memory check simulates on; ``fsdp``: the model is sharded by FSDP2 (replay only)."""
    swaps, recomputes = plan.count(Action.SWAP), plan.count(Action.RECOMPUTE)
    if fsdp:
        return PathChoice(REPLAY_PATH, "FSDP2 models run on the replay path (apply is a collective there)", plan)
    if not swaps and not recomputes and not plan.recompute_groups:
        return PathChoice(KEEP_PATH, "the plan keeps every saved tensor", plan)
    if swaps:
        return PathChoice(REPLAY_PATH, f"the plan swaps {swaps} tensor(s): the swap manager runs them on the "
                                       "plan's schedule", plan)
    cmap = build_checkpoint_map(workload, plan, hardware)
    if not cmap.faithful:
        return PathChoice(REPLAY_PATH, f"torch.utils.checkpoint cannot run this plan as planned: {cmap.notes[0]}",
                          plan, cmap)
    stateful = workload.meta.get("stateful_call_args", {})
    for region in cmap.regions:
        if region.call in stateful:
            # checkpoint re-runs the call's Python: a cache object the forward changed (Hugging Face
            # T5's EncoderDecoderCache) sends the recompute down another branch (different ops).
            return PathChoice(REPLAY_PATH, f"module call {region.call!r} takes "
                                           f"{', '.join(stateful[region.call])} argument(s) it may change, so "
                                           "torch.utils.checkpoint's re-run could differ from the forward", plan, cmap)
    if any(e.action is Action.SWAP for e in cmap.execution.pack_sequence):
        return PathChoice(REPLAY_PATH, "checkpointed calls would take swapped arguments", plan, cmap)
    return PathChoice(CHECKPOINT_PATH, f"every recompute group coincides with one of {len(cmap.regions)} "
                                       "module call(s) that checkpoint re-runs exactly", cmap.simulated_plan, cmap)
