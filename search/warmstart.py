"""What a study tries first: the user's seed specs, then, in a study not started yet, prebuilt CUTLASS kernels
(the pack's: no compiler runs for them), proposals of the learned policy and of an LLM; each enqueued with its
source so the store credits it."""
from __future__ import annotations

from typing import Callable, Dict, List, Optional

import optuna

from .space import Problem, check_point, params_from_spec, prebuilt_index
from .store import Store
from .study import TuneConfig, point_key, trial_point


def prebuilt_points(problem: Problem, policy=None) -> List[Dict[str, object]]:
    """Search-space points of `problem` whose CUTLASS kernel, built as the tuner builds it (shape-generic, no
    epilogue), the prebuilt pack holds byte for byte (`space.prebuilt_index`): each costs a measurement and no nvcc
    run. The policy's most likely first, else in the pack's order."""
    found = [dict(params) for params in prebuilt_index(problem).values() if check_point(params, problem)[0] is not None]
    if policy is not None:
        found.sort(key=lambda params: -policy.log_prob(problem, params))
    return found


def warm_start(study: optuna.Study, problem: Problem, cfg: TuneConfig, policy=None, llm=None,
               store: Optional[Store] = None, log: Callable[[str], None] = lambda s: None) -> Dict[str, int]:
    """Enqueue the user's seed specs (into any study: a resumed tune given new seeds tries them, and seeds it
    already tried are skipped), then policy and LLM proposals into a study that has not started yet."""
    added = {"seed": 0, "pack": 0, "policy": 0, "llm": 0}
    trials = study.get_trials(deepcopy=False)
    # points already in the study: run (params) or waiting to run (enqueued: their fixed params)
    tried = {trial_point(t) for t in trials}
    for spec in cfg.seed_specs:
        targets = cfg.targets if spec.target == "any" else (spec.target,)
        if not any(t in cfg.targets for t in targets):
            log(f"seed spec {spec.name} is for {spec.target}, which this tune does not search "
                f"(--target {','.join(cfg.targets)}), skipped")
        for target in (t for t in targets if t in cfg.targets):
            try:
                params = params_from_spec(spec, target)
            except ValueError as err:
                log(f"seed spec {spec.name} is outside the search space, skipped: {err}")
                continue
            if point_key(params) in tried:
                continue
            study.enqueue_trial(params, user_attrs={"source": "seed"}, skip_if_exists=True)
            tried.add(point_key(params))
            added["seed"] += 1
    if trials:   # a study that already ran keeps its own course: no pack, policy or LLM warm start
        return added
    if "cutlass" in cfg.targets and cfg.warm_start > 0:   # half the warm start, where the pack has that many
        for params in prebuilt_points(problem, policy)[:max(1, cfg.warm_start // 2)]:
            if point_key(params) not in tried:
                study.enqueue_trial(params, user_attrs={"source": "pack"}, skip_if_exists=True)
                tried.add(point_key(params))
                added["pack"] += 1
    if policy is not None and cfg.warm_start > added["pack"]:
        # the CUTLASS share of the warm start is the pack's, ranked by the policy: its own proposals take the rest
        others = tuple(t for t in cfg.targets if t != "cutlass") if added["pack"] else cfg.targets
        for params in policy.propose(problem, others or cfg.targets, cfg.warm_start - added["pack"]):
            if point_key(params) in tried:
                continue
            study.enqueue_trial(params, user_attrs={"source": "policy"}, skip_if_exists=True)
            tried.add(point_key(params))
            added["policy"] += 1
    if llm is not None:
        from ..parser import parse_one
        for target in cfg.targets:
            history = [(parse_one(r.spec), r.tflops, r.baseline_tflops)
                       for r in (store.results(problem=problem.key()) if store is not None else ())
                       if r.target == target]
            try:
                proposals = llm.propose(problem, history, cfg.warm_start or 4, target=target)
            except Exception as err:   # a dead LLM server or an infeasible problem must not stop the tune
                log(f"LLM proposer failed for {target}: {type(err).__name__}: {err}; continuing without it")
                continue
            for prop in proposals:
                try:
                    params = params_from_spec(prop.spec, prop.target)
                except ValueError as err:
                    log(f"LLM proposal outside the search space, skipped: {err}")
                    continue
                study.enqueue_trial(params, user_attrs={"source": "llm"}, skip_if_exists=True)
                added["llm"] += 1
    return added
