"""The simulator's two fast loops: ``_Simulation.run`` hands a plan that copies nothing to
``run_copy_free`` and a plan that copies to ``run_with_copies``. Each does, step for step, what the
plain event loop (``_Simulation._dispatch`` and ``_run_events``, one method per rule of
docs/simulator.md) does, with the run's state in local variables and the rules written out inline:
a run takes about a thousand instants of a few short steps each, and the method calls cost more
than the steps. tests/test_simulator_loops.py compares them with the plain loop on random plans."""

from __future__ import annotations

import heapq

from ..plans import Action
from ..schedule import op_of_backward_step
from .setup import BACKWARD, COMPUTE_END, FORWARD, RECOMPUTE, setup_of


def run_copy_free(sim) -> None:
    """``run`` for a plan that copies nothing: the compute stream alone, one task after the
    other, each started at the instant the one before ends (no copy can free memory or end in
    between, so the event loop would find nothing else to do); it stops, as that loop does,
    at the first task that does not fit the budget."""
    # _try_compute and _end_compute in one loop, without what only copies need: no task waits
    # for data (nothing is swapped), so none stalls, and no event but the task's end is ever
    # queued. The state is in local variables, stored on the object as those keep it where a
    # fork copies it (_lift_budget) and at the end.
    tasks, n_tasks, ops = sim.tasks, sim.n_tasks, sim.w.ops
    saved_outputs, size, present, events = sim.saved_outputs, sim.size, sim.present, sim.events
    output_bytes = setup_of(sim.w).saved_output_bytes
    last_fwd_use_of_saved, last_bwd_read_of = sim.w.last_fwd_use_of_saved, sim.w.last_bwd_read_of
    last_bwd_reader, actions, memory, trigger_s = sim.w.last_bwd_reader, sim.actions, sim.memory, sim.trigger_s
    recompute, n, log, budget = Action.RECOMPUTE, sim.n, sim.log, sim.budget
    now, mem, peak, seq, ci, recompute_time = sim.now, sim.mem, sim.peak, sim.seq, sim.ci, sim.recompute_time
    group_allocs, fwd_done_upto, triggered = sim.group_allocs, sim.fwd_done_upto, sim.triggered_step
    ended, idle_since, ready_at = sim.compute_end_s, sim.idle_since, sim.data_ready_at
    while ci < n_tasks:
        task = tasks[ci]
        kind, op_index = task.kind, task.op_index
        op = ops[op_index]
        if kind is BACKWARD:
            alloc, alloc_bytes = (), 0
        elif present.isdisjoint(saved_outputs[op_index]):  # as always in forward
            alloc, alloc_bytes = saved_outputs[op_index], output_bytes[op_index]
        else:
            alloc = [o for o in saved_outputs[op_index] if o not in present]
            alloc_bytes = 0
            for name in alloc:
                alloc_bytes += size[name]
        if mem + alloc_bytes > budget:
            sim.now, sim.mem, sim.peak, sim.seq, sim.ci = now, mem, peak, seq, ci
            sim.recompute_time, sim.group_allocs, sim.fwd_done_upto = recompute_time, group_allocs, fwd_done_upto
            sim.triggered_step, sim.data_ready_at = triggered, now
            sim.compute_end_s, sim.idle_since = ended, idle_since
            if not sim._lift_budget():
                sim._raise_infeasible()
            budget = sim.budget
        start = now
        if alloc:
            if log is None:
                present.update(alloc)
                mem += alloc_bytes  # their sizes' sum
            else:
                for name in alloc:
                    present.add(name)
                    mem += size[name]
                    log.append((now, name, True))
            if mem > peak:
                peak = mem
            memory.append((now, mem))
            if kind is RECOMPUTE:
                group_allocs.extend(alloc)
        seq += 1  # the task's end, as _try_compute queues it
        now = start + (op.bwd_time_s if kind is BACKWARD else op.fwd_time_s)
        events.append(("compute", kind, op.name, start, now, alloc_bytes, task.step))
        freed = ()
        if kind is FORWARD:
            fwd_done_upto = op_index
            freed = last_fwd_use_of_saved[op_index]
            if freed:
                freed = [name for name in freed if actions[name] is recompute]
        elif kind is RECOMPUTE:
            recompute_time += op.fwd_time_s
            if task.last_of_group:
                current = op_of_backward_step(n, task.step)
                freed = [name for name in group_allocs
                         if not (actions[name] is recompute and last_bwd_reader[name] <= current)]
                group_allocs = []
        else:
            freed = last_bwd_read_of[op_index]
        for name in freed:
            if name in present:
                present.discard(name)
                mem -= size[name]
                if log is not None:
                    log.append((now, name, False))
                memory.append((now, mem))
        ended = idle_since = now
        ready_at = None
        ci += 1
        if ci < n_tasks and tasks[ci].first_of_step:
            triggered = tasks[ci].step
            trigger_s[triggered] = now
    sim.now, sim.mem, sim.peak, sim.seq, sim.ci = now, mem, peak, seq, ci
    sim.recompute_time, sim.group_allocs, sim.fwd_done_upto = recompute_time, group_allocs, fwd_done_upto
    sim.triggered_step, sim.data_ready_at = triggered, ready_at
    sim.compute_end_s, sim.idle_since = ended, idle_since


def run_with_copies(sim) -> bool:
    """``_dispatch`` then ``_run_events`` in one function, for a plan that copies: the same steps
    in the same order, with the state in local variables and the methods' bodies written out (a
    run takes a thousand instants of a few short steps each, and the calls cost more than the
    steps). False, with the state stored, at the first memory check that fails under a budget
    that lifts: the caller forks there (``_lift_budget``) and calls it again, and a dispatch
    pass tried again from its start does what the rest of the pass would do (``resume``)."""
    heap, push, pop = sim.heap, heapq.heappush, heapq.heappop
    tasks, n_tasks, n, ops = sim.tasks, sim.n_tasks, sim.n, sim.w.ops
    saved_outputs, size, present = sim.saved_outputs, sim.size, sim.present
    output_bytes = setup_of(sim.w).saved_output_bytes
    events, memory, log = sim.events, sim.memory, sim.log
    actions, prefetch, swap, recompute = sim.actions, sim.plan.prefetch_step, Action.SWAP, Action.RECOMPUTE
    bwd_reads, inputs = sim.setup.bwd_reads, sim.setup.inputs
    last_fwd_use_of_saved, last_bwd_read_of = sim.w.last_fwd_use_of_saved, sim.w.last_bwd_read_of
    last_bwd_reader, last_fwd_use = sim.w.last_bwd_reader, sim.w.last_fwd_use
    d2h_queue, queued_s, d2h_done, d2h_end_s = sim.d2h_queue, sim.queued_s, sim.d2h_done, sim.d2h_end_s
    h2d_order, h2d_issued, h2d_done = sim.h2d_order, sim.h2d_issued, sim.h2d_done
    cancelled, trigger_s, n_order = sim.cancelled, sim.trigger_s, len(sim.h2d_order)
    hw = sim.hw
    latency = hw.copy_latency_s
    # _rate_of's four outcomes
    d2h_alone, d2h_duplex = hw.d2h_bytes_per_s * 1.0, hw.d2h_bytes_per_s * hw.duplex_d2h_factor
    h2d_alone, h2d_duplex = hw.h2d_bytes_per_s * 1.0, hw.h2d_bytes_per_s * hw.duplex_h2d_factor
    budget, can_lift = sim.budget, sim.lift_to is not None
    now, mem, peak, seq, ci = sim.now, sim.mem, sim.peak, sim.seq, sim.ci
    busy, idle_since, ready_at, compute_end_s = sim.compute_busy, sim.idle_since, sim.data_ready_at, sim.compute_end_s
    fwd_done_upto, triggered, group_allocs = sim.fwd_done_upto, sim.triggered_step, sim.group_allocs
    d2h, h2d, d2h_head, h2d_head, h2d_gate = sim.d2h, sim.h2d, sim.d2h_head, sim.h2d_head, sim.h2d_gate
    d2h_last_end, h2d_last_end = sim.last_copy_end_s["d2h"], sim.last_copy_end_s["h2d"]
    d2h_bytes, h2d_bytes, recompute_time = sim.d2h_bytes, sim.h2d_bytes, sim.recompute_time
    stall_copy, stall_memory = sim.stall_copy, sim.stall_memory
    bound = False  # a memory check failed under a budget that lifts
    while True:
        # ---- a dispatch pass (_dispatch) ----
        while True:
            if not busy and ci < n_tasks:  # _try_compute
                task = tasks[ci]
                kind, op_index = task.kind, task.op_index
                go = True
                if ready_at is None:
                    if kind is RECOMPUTE:
                        for name in inputs[op_index]:  # the swapped ones: swapped_inputs
                            if (name not in h2d_done and actions.get(name) is swap
                                    and prefetch[name] <= task.step):
                                go = False
                                break
                    elif kind is BACKWARD:
                        for name in bwd_reads[op_index]:  # the swapped ones: swapped_bwd_reads
                            if name not in h2d_done and actions.get(name) is swap:
                                go = False
                                break
                    if go:
                        ready_at = now
                if go:
                    alloc_bytes = 0
                    if kind is BACKWARD:
                        alloc = None
                    elif present.isdisjoint(saved_outputs[op_index]):  # as always in forward
                        alloc, alloc_bytes = saved_outputs[op_index], output_bytes[op_index]
                    else:
                        alloc = [o for o in saved_outputs[op_index] if o not in present]
                        for name in alloc:
                            alloc_bytes += size[name]
                    if mem + alloc_bytes > budget:
                        if can_lift:
                            bound = True
                            break
                    else:
                        op = ops[op_index]
                        if ready_at > idle_since:
                            stall_copy += ready_at - idle_since
                            events.append(("compute", "stall_copy", op.name, idle_since, ready_at, 0, task.step))
                        if now > ready_at:
                            stall_memory += now - ready_at
                            events.append(("compute", "stall_memory", op.name, ready_at, now, 0, task.step))
                        if alloc:
                            if log is None:
                                present.update(alloc)
                                mem += alloc_bytes  # their sizes' sum
                            else:
                                for name in alloc:
                                    present.add(name)
                                    mem += size[name]
                                    log.append((now, name, True))
                            if mem > peak:
                                peak = mem
                            memory.append((now, mem))
                            if kind is RECOMPUTE:
                                group_allocs.extend(alloc)
                            duration = op.fwd_time_s
                        else:
                            duration = op.bwd_time_s if kind is BACKWARD else op.fwd_time_s
                        busy = True
                        push(heap, (now + duration, seq, COMPUTE_END, (task, now, alloc_bytes)))
                        seq += 1
            if d2h is None and d2h_head < len(d2h_queue):  # _try_d2h
                while d2h_head < len(d2h_queue) and d2h_queue[d2h_head] in cancelled:
                    d2h_head += 1
                if d2h_head < len(d2h_queue):
                    tensor = d2h_queue[d2h_head]
                    d2h_head += 1
                    nbytes = size[tensor]
                    if d2h_last_end == now:
                        begin = queued_s[tensor] + latency
                        begin = begin if begin > now else now
                    else:
                        begin = now + latency
                    rate = d2h_duplex if h2d is not None else d2h_alone
                    d2h = [tensor, nbytes, now, begin, float(nbytes), rate, now, 1]
                    push(heap, ((begin if begin > now else now) + d2h[4] / rate, seq, "d2h", (d2h, 1)))
                    seq += 1
                    if h2d is not None and h2d[5] != h2d_duplex:  # _rerate("h2d")
                        begin = h2d[3] if h2d[3] > h2d[6] else h2d[6]
                        if now > begin:
                            left = h2d[4] - (now - begin) * h2d[5]
                            h2d[4] = left if left > 0.0 else 0.0
                        h2d[5], h2d[6] = h2d_duplex, now
                        h2d[7] += 1
                        begin = h2d[3]
                        push(heap, ((begin if begin > now else now) + h2d[4] / h2d_duplex, seq, "h2d", (h2d, h2d[7])))
                        seq += 1
            if not (h2d is None and h2d_head < n_order and h2d_gate <= triggered):
                break
            # _try_h2d
            while h2d_head < n_order and h2d_order[h2d_head] in h2d_issued:
                h2d_head += 1
            if h2d_head >= n_order:
                break
            tensor = h2d_order[h2d_head]
            if prefetch[tensor] > triggered:
                h2d_gate = prefetch[tensor]
                break
            waited = None
            k = 0
            while True:  # the head, then (when it does not fit) what compute waits for: _issue_h2d
                if tensor in present:
                    if tensor in group_allocs:
                        group_allocs.remove(tensor)
                    if tensor not in d2h_done:
                        cancelled.add(tensor)
                    h2d_issued.add(tensor)
                    h2d_done.add(tensor)
                    break
                if tensor in d2h_done:
                    nbytes = size[tensor]
                    if mem + nbytes <= budget:
                        present.add(tensor)
                        mem += nbytes
                        if log is not None:
                            log.append((now, tensor, True))
                        if mem > peak:
                            peak = mem
                        memory.append((now, mem))
                        h2d_issued.add(tensor)
                        if h2d_last_end == now:
                            begin = trigger_s[prefetch[tensor]]
                            ended = d2h_end_s[tensor]
                            begin = (ended if ended > begin else begin) + latency
                            begin = begin if begin > now else now
                        else:
                            begin = now + latency
                        rate = h2d_duplex if d2h is not None else h2d_alone
                        h2d = [tensor, nbytes, now, begin, float(nbytes), rate, now, 1]
                        push(heap, ((begin if begin > now else now) + h2d[4] / rate, seq, "h2d", (h2d, 1)))
                        seq += 1
                        if d2h is not None and d2h[5] != d2h_duplex:  # _rerate("d2h")
                            begin = d2h[3] if d2h[3] > d2h[6] else d2h[6]
                            if now > begin:
                                left = d2h[4] - (now - begin) * d2h[5]
                                d2h[4] = left if left > 0.0 else 0.0
                            d2h[5], d2h[6] = d2h_duplex, now
                            d2h[7] += 1
                            begin = d2h[3]
                            push(heap, ((begin if begin > now else now) + d2h[4] / d2h_duplex, seq, "d2h",
                                        (d2h, d2h[7])))
                            seq += 1
                        break
                    if can_lift:
                        bound = True
                        break
                if waited is None:
                    waited = (sim._waiting_on(tasks[ci]) if not busy and ci < n_tasks and ready_at is None
                              else ())
                if k == len(waited):
                    tensor = None
                    break
                tensor = waited[k]
                k += 1
            if tensor is None or bound:
                break
        if bound:
            break
        # ---- the next instant (_run_events, _next_instant) ----
        while heap:
            top = heap[0]
            if top[2] is not COMPUTE_END and top[3][1] != top[3][0][7]:
                pop(heap)  # a copy end re-timed by a change of the other direction
            else:
                break
        if not heap:
            break
        now = heap[0][0]
        while heap:
            top = heap[0]
            if top[2] is COMPUTE_END:
                if top[0] != now:
                    break
                pop(heap)
                task, start_s, alloc_bytes = top[3]  # _end_compute
                kind, op_index = task.kind, task.op_index
                op = ops[op_index]
                events.append(("compute", kind, op.name, start_s, now, alloc_bytes, task.step))
                if kind is FORWARD:
                    fwd_done_upto = op_index
                    for name in saved_outputs[op_index]:
                        if actions[name] is swap:
                            d2h_queue.append(name)
                            queued_s[name] = now
                    freed = last_fwd_use_of_saved[op_index]
                    if freed:
                        freed = [name for name in freed
                                 if actions[name] is recompute or (actions[name] is swap and name in d2h_done)]
                elif kind is RECOMPUTE:
                    recompute_time += op.fwd_time_s
                    freed = ()
                    if task.last_of_group:
                        current = op_of_backward_step(n, task.step)
                        freed = [name for name in group_allocs
                                 if not (actions[name] is recompute and last_bwd_reader[name] <= current)]
                        group_allocs = []
                else:
                    freed = last_bwd_read_of[op_index]
                for name in freed:  # _free
                    if name in present:
                        present.discard(name)
                        mem -= size[name]
                        if log is not None:
                            log.append((now, name, False))
                        memory.append((now, mem))
                busy = False
                compute_end_s = idle_since = now
                ci += 1
                ready_at = None
                if ci < n_tasks and tasks[ci].first_of_step:
                    triggered = tasks[ci].step
                    trigger_s[triggered] = now
                continue
            copy, generation = top[3]
            if generation != copy[7]:
                pop(heap)  # a copy end re-timed since
                continue
            if top[0] != now:
                break
            pop(heap)
            tensor = copy[0]  # _end_copy
            step = tasks[ci].step if ci < n_tasks else n
            if top[2] == "d2h":
                events.append(("d2h", "copy_out", tensor, copy[2], now, copy[1], step))
                d2h_last_end = now
                d2h = None
                d2h_bytes += copy[1]
                d2h_done.add(tensor)
                d2h_end_s[tensor] = now
                if last_fwd_use[tensor] <= fwd_done_upto and tensor not in cancelled and tensor in present:
                    present.discard(tensor)
                    mem -= size[tensor]
                    if log is not None:
                        log.append((now, tensor, False))
                    memory.append((now, mem))
                other, rate = h2d, h2d_alone
            else:
                events.append(("h2d", "copy_in", tensor, copy[2], now, copy[1], step))
                h2d_last_end = now
                h2d = None
                h2d_bytes += copy[1]
                h2d_done.add(tensor)
                other, rate = d2h, d2h_alone
            if other is not None and other[5] != rate:  # _rerate of the other direction
                begin = other[3] if other[3] > other[6] else other[6]
                if now > begin:
                    left = other[4] - (now - begin) * other[5]
                    other[4] = left if left > 0.0 else 0.0
                other[5], other[6] = rate, now
                other[7] += 1
                begin = other[3]
                push(heap, ((begin if begin > now else now) + other[4] / rate, seq,
                            "h2d" if other is h2d else "d2h", (other, other[7])))
                seq += 1
    sim.now, sim.mem, sim.peak, sim.seq, sim.ci = now, mem, peak, seq, ci
    sim.compute_busy, sim.idle_since, sim.data_ready_at, sim.compute_end_s = busy, idle_since, ready_at, compute_end_s
    sim.fwd_done_upto, sim.triggered_step, sim.group_allocs = fwd_done_upto, triggered, group_allocs
    sim.d2h, sim.h2d, sim.d2h_head, sim.h2d_head, sim.h2d_gate = d2h, h2d, d2h_head, h2d_head, h2d_gate
    sim.last_copy_end_s["d2h"], sim.last_copy_end_s["h2d"] = d2h_last_end, h2d_last_end
    sim.d2h_bytes, sim.h2d_bytes, sim.recompute_time = d2h_bytes, h2d_bytes, recompute_time
    sim.stall_copy, sim.stall_memory = stall_copy, stall_memory
    if bound:
        return False
    if ci < n_tasks:
        sim._raise_infeasible()
    return True
