"""Device memory of a simulated step (slackswap.memory.step): backward gradients, transients,
workspaces and model states replayed through the allocator model, on hand-worked chains."""

from __future__ import annotations

import pytest

from slackswap import Action, get_hardware, make_plan
from slackswap.memory import model_states
from slackswap.memory.allocator import replay
from slackswap.memory.step import CUBLAS_WORKSPACE_BYTES, CUBLAS_WORKSPACE_HOPPER_BYTES, device_memory
from slackswap.planners import plan_workload
from slackswap.workloads.models import build_model_workload
from slackswap.workloads.synthetic import chain

MiB = 1024**2
A100 = get_hardware("a100-80gb-pcie4")


def test_the_peak_falls_inside_backward_on_a_chain():
    # chain(3): F0 [0,1] F1 [1,2] F2 [2,3], Bw2 [3,5] Bw1 [5,7] Bw0 [7,9]. Saved x (1 B), a0
    # (100 B), a1 (200 B); a2 (50 B) is transient. Bw2 allocates grad(a1) (200 B) until Bw1 ends;
    # Bw1 frees a1 at 5 and allocates grad(a0) (100 B) until Bw0 ends.
    #   forward, [2,3): x + a0 + a1 + a2                  = 351 B
    #   [3,5):          x + a0 + a1 + grad(a1)             = 501 B   <- the peak
    #   [5,7):          x + a0 + grad(a1) + grad(a0)       = 401 B
    w = chain(3, size_bytes=[100, 200, 50])
    plan = make_plan(w, {}, policy="keep", budget_bytes=None)
    timeline, memory = device_memory(w, A100, plan)
    assert memory.activation_peak_bytes == timeline.peak_memory_bytes == 301
    workspace = CUBLAS_WORKSPACE_BYTES  # chain ops are GEMMs: 8 MiB + 128 KiB on A100
    assert memory.allocator.requested_peak_bytes == workspace + 501
    # Each small tensor holds 512 B: four of them live at every peak.
    assert memory.allocated_peak_bytes == workspace + 4 * 512
    # The workspace (8.125 MiB, < 10 MiB) takes a 20 MiB segment; the small ones one 2 MiB segment.
    assert memory.reserved_peak_bytes == 22 * MiB
    assert memory.model_state_bytes is None


def test_model_states_are_resident_the_whole_step():
    w = chain(3, size_bytes=[100, 200, 50])
    plan = make_plan(w, {}, policy="keep", budget_bytes=None)
    states = model_states(1000, optimizer="adam", precision="bf16-mixed")  # 2000 + 2000 + 12000 B
    _, memory = device_memory(w, A100, plan, states=states)
    assert memory.model_state_bytes == 16000
    assert memory.allocator.requested_peak_bytes == CUBLAS_WORKSPACE_BYTES + 501 + 16000
    # 2048 + 2048 + 12288 B rounded; they fit the same 2 MiB small segment as the activations.
    assert memory.allocated_peak_bytes == CUBLAS_WORKSPACE_BYTES + 4 * 512 + 2048 + 2048 + 12288
    assert memory.reserved_peak_bytes == 22 * MiB


def test_hopper_presets_get_the_32_mib_cublas_workspace():
    w = chain(3)
    plan = make_plan(w, {}, policy="keep", budget_bytes=None)
    _, memory = device_memory(w, get_hardware("h100-pcie5"), plan)
    assert memory.allocator.requested_peak_bytes == CUBLAS_WORKSPACE_HOPPER_BYTES + 1 + 100 + 100 + 100


def test_recompute_lowers_activations_but_gradients_still_count():
    # Recompute a0: it leaves after F1 and is rebuilt by re-running op0 at the start of step 1.
    w = chain(3, size_bytes=[100, 200, 50])
    plan = make_plan(w, {"a0": Action.RECOMPUTE}, policy="manual", budget_bytes=None)
    timeline, memory = device_memory(w, A100, plan)
    # [2,3): x + a1 + a2 = 251; [3,5): x + a1 + grad(a1) = 401; step 1 rebuilds a0 (R0 [5,6]):
    # x + a1(freed at 5) ... = x + grad(a1) + a0 = 301, then Bw1 adds grad(a0): 401.
    assert timeline.peak_memory_bytes == 301
    assert memory.allocator.requested_peak_bytes == CUBLAS_WORKSPACE_BYTES + 401


@pytest.mark.parametrize("model", ["bert-large", "gpt2-xl", "llama-7b"])
def test_builtin_models_replay_consistently(model):
    w = build_model_workload(model, A100, layers=2)
    states = model_states(w, optimizer="adam", precision="bf16-mixed")
    for policy in ("ideal", "full-recompute", "capuchin"):
        peak = device_memory(w, A100, make_plan(w, {}, policy="keep", budget_bytes=None))[1].activation_peak_bytes
        plan = plan_workload(w, A100, peak * 4 // 5 if policy != "ideal" else peak, policy)
        _, memory = device_memory(w, A100, plan, states=states)
        stats = memory.allocator
        assert stats.requested_peak_bytes >= memory.activation_peak_bytes + states.total_bytes
        assert stats.reserved_peak_bytes >= stats.allocated_peak_bytes >= stats.requested_peak_bytes
        expandable = device_memory(w, A100, plan, states=states, expandable_segments=True)[1]
        assert expandable.allocator.requested_peak_bytes == stats.requested_peak_bytes


def test_a_gradient_that_lives_for_no_time_is_allocated_before_it_is_freed():
    # Profiled ops without a backward (a dropout mask's bernoulli_ and div_) take 0 s. chain(3) with
    # Bw2 and Bw1 of 0 s: F0 [0,1] F1 [1,2] F2 [2,3], Bw2 [3,3], Bw1 [3,3], Bw0 [3,5]. grad(a1) is
    # allocated when Bw2 starts (3) and freed when Bw1 ends (3): it must be allocated, then freed.
    # At 3 the forward's transient a2 and the saved a1 and a0 are freed first (their readers' backward
    # ends at 3); x (1 B), grad(a1) (200 B) and grad(a0) (100 B, until 5) are then live: 301 B.
    w = chain(3, size_bytes=[100, 200, 50], bwd_time_s=[2.0, 0.0, 0.0])
    plan = make_plan(w, {}, policy="keep", budget_bytes=None)
    _, memory = device_memory(w, A100, plan)
    assert memory.allocator.requested_peak_bytes == CUBLAS_WORKSPACE_BYTES + 351  # the forward's x+a0+a1+a2
