"""The learned policy (the RL part): a distribution over kernel specs conditioned on the problem.

A small torch network maps problem features (log2 M, N, K, their ratios, dtype, layouts, arch) to a
categorical distribution over the target and then, given the target, over each searchable knob (the
knob heads see the chosen target: autoregressive in the one place where the space is conditional).
It is trained by policy gradient on every (problem, spec, reward) in the results store: REINFORCE's
estimator with a per-problem mean-reward baseline and an entropy bonus, in its off-policy-stable
advantage-weighted form (see `Policy.fit`); reward = log(speedup), failures (invalid, build or verify)
get log(0.1). It warm-starts new studies (`propose` -> `study.enqueue_trial`) and samples inside studies
as `PolicySampler`, mixed with TPE. This is what carries what was learned on one shape to the next.
"""
from __future__ import annotations

import math
import random
from importlib import resources
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from optuna.samplers import BaseSampler, TPESampler
from torch import nn

from ..knobs import DTYPE_BYTES, KNOBS_BY_FIELD
from ..arch import ARCHS
from ..knobs import TARGETS
from .samplers import SourcedSampler
from .space import KNOB_PARAMS, PARAMS, TARGET_PARAM, Problem, check_point, check_targets, params_for

FAIL_REWARD = math.log(0.1)
DTYPES = tuple(DTYPE_BYTES)
ARCH_NAMES = tuple(ARCHS)


def problem_features(p: Problem) -> List[float]:
    lm, ln, lk = math.log2(p.m), math.log2(p.n), math.log2(p.k)
    f = [lm / 14, ln / 14, lk / 14, (lm - ln) / 14, (lm - lk) / 14, (ln - lk) / 14, (lm + ln + lk) / 42,
         math.log2(p.batch) / 8]
    f += [1.0 if p.dtype == d else 0.0 for d in DTYPES]
    f += [1.0 if x == "col" else 0.0 for x in (p.layout_a, p.layout_b, p.layout_c)]
    f += [1.0 if p.arch == a else 0.0 for a in ARCH_NAMES]
    return f


N_FEATURES = len(problem_features(Problem(1, 1, 1)))


class PolicyNet(nn.Module):
    def __init__(self, hidden: int = 64):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(N_FEATURES, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh())
        self.target_head = nn.Linear(hidden, len(TARGETS))
        self.heads = nn.ModuleDict({p.name: nn.Linear(hidden + len(TARGETS), len(p.choices)) for p in KNOB_PARAMS})

    def forward(self, feats: torch.Tensor, target_idx: torch.Tensor) -> Dict[str, torch.Tensor]:
        """Logits per parameter; the knob heads are conditioned on the (given) target."""
        h = self.trunk(feats)
        logits = {TARGET_PARAM: self.target_head(h)}
        ht = torch.cat([h, nn.functional.one_hot(target_idx, len(TARGETS)).float()], dim=-1)
        for name, head in self.heads.items():
            logits[name] = head(ht)
        return logits


class Policy:
    def __init__(self, hidden: int = 64, seed: int = 0):
        torch.manual_seed(seed)
        self.hidden = hidden
        self.net = PolicyNet(hidden)
        self.rng = random.Random(seed)
        self.trained_on = 0
        self._probs: Dict[Tuple[Problem, str], Dict[str, np.ndarray]] = {}

    # -- encoding -------------------------------------------------------------------------------------
    @staticmethod
    def _index(name: str, value) -> int:
        choices = next(p.choices for p in PARAMS if p.name == name)
        return choices.index(value)

    def _batch(self, rows: Sequence[Tuple[Problem, Dict[str, object]]]):
        feats = torch.tensor([problem_features(p) for p, _ in rows], dtype=torch.float32)
        target_idx = torch.tensor([TARGETS.index(params[TARGET_PARAM]) for _, params in rows])
        actions = {}
        for p in KNOB_PARAMS:
            actions[p.name] = torch.tensor([self._index(p.name, params[p.name]) if p.name in params else -1
                                            for _, params in rows])
        return feats, target_idx, actions

    def log_prob_and_entropy(self, feats, target_idx, actions):
        logits = self.net(feats, target_idx)
        lp_t = torch.log_softmax(logits[TARGET_PARAM], -1)
        logp = lp_t.gather(1, target_idx[:, None])[:, 0]
        ent = -(lp_t.exp() * lp_t).sum(-1)
        for name, idx in actions.items():
            lp = torch.log_softmax(logits[name], -1)
            present = idx >= 0
            logp = logp + torch.where(present, lp.gather(1, idx.clamp(min=0)[:, None])[:, 0], torch.zeros(()))
            ent = ent + torch.where(present, -(lp.exp() * lp).sum(-1), torch.zeros(()))
        return logp, ent

    # -- training -------------------------------------------------------------------------------------
    def fit(self, samples: Sequence[Tuple[Problem, Dict[str, object], float]], epochs: int = 200,
            lr: float = 1e-2, entropy: float = 0.01, temperature: float = 0.5) -> float:
        """Policy gradient on logged (problem, point, reward) samples; returns the final loss.

        The gradient is REINFORCE's, E[A * grad log pi], with the per-problem mean reward as baseline
        (A = reward - baseline, scaled by its spread) plus an entropy bonus. Because the samples are logged
        by other samplers, not drawn from this policy, plain REINFORCE diverges here: a negative advantage
        pushes a log-probability to minus infinity and the policy collapses onto whatever was rarely tried.
        So the advantage enters exponentiated, w = exp(A / temperature) (advantage-weighted regression, the
        off-policy-stable form of the same estimator): every weight is positive and the optimum puts each
        problem's mass on its high-reward points.
        """
        samples = [s for s in samples if s[1].get(TARGET_PARAM) in TARGETS]
        if not samples:
            return 0.0
        by_problem: Dict[Problem, List[float]] = {}
        for p, _, r in samples:
            by_problem.setdefault(p, []).append(r)
        base = {p: sum(rs) / len(rs) for p, rs in by_problem.items()}
        adv = torch.tensor([r - base[p] for p, _, r in samples], dtype=torch.float32)
        if len(samples) > 1:
            adv = adv / (adv.std() + 1e-6)
        weight = torch.exp(adv.clamp(-3, 3) / temperature)
        weight = weight / weight.mean()
        feats, target_idx, actions = self._batch([(p, params) for p, params, _ in samples])
        self._probs.clear()
        threads = torch.get_num_threads()
        torch.set_num_threads(1)    # a tiny network: threads only add contention
        try:
            opt = torch.optim.Adam(self.net.parameters(), lr=lr)
            loss = torch.zeros(())
            self.net.train()
            for _ in range(epochs):
                logp, ent = self.log_prob_and_entropy(feats, target_idx, actions)
                loss = -(weight * logp).mean() - entropy * ent.mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
        finally:
            torch.set_num_threads(threads)
            self.net.eval()
        self.trained_on = len(samples)
        return float(loss.detach())

    def fit_store(self, store, gpu: Optional[str] = None, protocol: Optional[str] = None, **kw) -> int:
        """Train on every result in the store (optionally one GPU / protocol); returns the sample count. Figures of
        earlier builds count too: the policy learns which regions of the knob space are fast, which a template
        change shifts a little, while what serves and what is exported reads the current build's figures only."""
        samples = []
        for r in store.results(gpu=gpu, protocol=protocol, stale=True):
            try:
                problem = Problem.from_key(r.problem)
            except (ValueError, IndexError):   # a key no l2c wrote (an old import's): one row, not every tune
                continue
            if not r.params or problem.gated:   # the features do not tell a gated problem from a plain one
                continue
            reward = math.log(r.speedup) if r.status == "ok" and r.speedup else FAIL_REWARD
            samples.append((problem, r.params, reward))
        self.fit(samples, **kw)
        return len(samples)

    # -- acting ---------------------------------------------------------------------------------------
    @torch.no_grad()
    def probabilities(self, problem: Problem, target: str) -> Dict[str, np.ndarray]:
        """Per-parameter choice probabilities for a problem once `target` is chosen (cached)."""
        key = (problem, target)
        if key not in self._probs:
            feats = torch.tensor([problem_features(problem)], dtype=torch.float32)
            logits = self.net(feats, torch.tensor([TARGETS.index(target)]))
            self._probs[key] = {k: torch.softmax(v[0], -1).numpy() for k, v in logits.items()}
        return self._probs[key]

    def mode(self, problem: Problem, targets: Sequence[str]) -> Dict[str, object]:
        """The single most probable point (argmax of each head, target first)."""
        probs_t = self.probabilities(problem, targets[0])[TARGET_PARAM]
        target = max(targets, key=lambda t: probs_t[TARGETS.index(t)])
        probs = self.probabilities(problem, target)
        params: Dict[str, object] = {TARGET_PARAM: target}
        for p in params_for(target):
            params[p.name] = p.choices[int(np.argmax(probs[p.name]))]
        return params

    def _draw(self, probs: np.ndarray, allowed: Optional[Sequence[int]] = None, rng=None) -> int:
        rng = rng or self.rng
        p = probs.astype(np.float64).copy()
        if allowed is not None:
            mask = np.zeros_like(p)
            mask[list(allowed)] = 1.0
            p *= mask
        p /= p.sum()
        return int(rng.choices(range(len(p)), weights=p.tolist())[0])

    def sample_value(self, problem: Problem, name: str, partial: Dict[str, object],
                     targets: Sequence[str], rng=None):
        """One parameter's value given those already chosen in this trial (the target comes first)."""
        if name == TARGET_PARAM:
            probs = self.probabilities(problem, targets[0])[TARGET_PARAM]
            allowed = [TARGETS.index(t) for t in targets]
            return TARGETS[self._draw(probs, allowed, rng)]
        target = partial.get(TARGET_PARAM, targets[0])
        choices = next(p.choices for p in KNOB_PARAMS if p.name == name)
        return choices[self._draw(self.probabilities(problem, target)[name], rng=rng)]

    def sample(self, problem: Problem, targets: Sequence[str], rng=None) -> Dict[str, object]:
        params: Dict[str, object] = {}
        params[TARGET_PARAM] = self.sample_value(problem, TARGET_PARAM, params, targets, rng)
        for p in params_for(params[TARGET_PARAM]):
            params[p.name] = self.sample_value(problem, p.name, params, targets, rng)
        return params

    def log_prob(self, problem: Problem, params: Dict[str, object]) -> float:
        feats, target_idx, actions = self._batch([(problem, params)])
        with torch.no_grad():
            return float(self.log_prob_and_entropy(feats, target_idx, actions)[0][0])

    def propose(self, problem: Problem, targets: Sequence[str], n: int, candidates: int = 256) -> List[Dict[str, object]]:
        """`n` distinct valid points for enqueue_trial: the mode first (when valid), then draws in order.

        Draws rather than the n most probable points: those differ only in knobs the policy is unsure of,
        so a warm start of them would spend its trials on one region.
        """
        targets = check_targets(targets)
        out: Dict[Tuple, Dict[str, object]] = {}
        draws = [self.mode(problem, targets)] + [self.sample(problem, targets) for _ in range(candidates)]
        for params in draws:
            key = tuple(sorted((k, str(v)) for k, v in params.items()))
            if key not in out and check_point(params, problem)[0] is not None:
                out[key] = params
                if len(out) >= n:
                    break
        return list(out.values())

    # -- persistence ----------------------------------------------------------------------------------
    def save(self, path) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        torch.save({"format": 1, "hidden": self.hidden, "space": [(p.name, list(map(str, p.choices))) for p in PARAMS],
                    "n_features": N_FEATURES, "trained_on": self.trained_on, "state": self.net.state_dict()}, tmp)
        tmp.replace(path)   # atomic: a reader never sees half a file

    @classmethod
    def load(cls, path) -> "Policy":
        """A saved policy. One trained before the space grew (a knob added, a knob's choices extended) loads as
        itself extended (`_extend_heads`); a space that lost a knob or a choice needs retraining."""
        blob = torch.load(path, map_location="cpu", weights_only=True)
        saved = {name: list(choices) for name, choices in blob["space"]}
        if saved.get(TARGET_PARAM) != list(TARGETS) or blob["n_features"] != N_FEATURES:
            raise ValueError(f"{path}: the policy was trained on a different search space; retrain it")
        policy = cls(hidden=blob["hidden"])
        try:
            state = _extend_heads(blob["state"], saved, policy.net)
        except ValueError as err:
            raise ValueError(f"{path}: the policy was trained on a different search space ({err}); retrain it")
        policy.net.load_state_dict(state)
        policy.net.eval()
        policy.trained_on = blob["trained_on"]
        return policy


UNSEEN_LOGIT = -30.0   # a choice the saved policy never saw: probability ~1e-13 until it is retrained


def _extend_heads(state: Dict[str, torch.Tensor], saved: Dict[str, List[str]], net: PolicyNet) -> Dict[str, torch.Tensor]:
    """`state` of a policy trained on the space `saved` (parameter -> choices as text), fitted to `net`'s heads: a
    choice it saw keeps its row; a choice added to a knob gets logit UNSEEN_LOGIT; a knob added puts its mass on its
    default (what every spec the policy learned from had). So it proposes what it proposed before."""
    state = dict(state)
    current = {p.name: [str(c) for c in p.choices] for p in KNOB_PARAMS}
    gone = [name for name in saved if name != TARGET_PARAM and name not in current]
    if gone:
        raise ValueError(f"knobs {', '.join(gone)} are no longer searched")
    for name, choices in current.items():
        have = saved.get(name)
        if have == choices:
            continue
        if have is not None and set(have) - set(choices):
            raise ValueError(f"{name} lost the choices {sorted(set(have) - set(choices))}")
        head = net.heads[name]
        weight = torch.zeros_like(head.weight)
        bias = torch.full_like(head.bias, UNSEEN_LOGIT)
        if have is None:
            bias[choices.index(str(KNOBS_BY_FIELD[name].default))] = 0.0
        else:
            for i, choice in enumerate(choices):
                if choice in have:
                    weight[i] = state[f"heads.{name}.weight"][have.index(choice)]
                    bias[i] = state[f"heads.{name}.bias"][have.index(choice)]
        state[f"heads.{name}.weight"], state[f"heads.{name}.bias"] = weight, bias
    return state


def default_policy_path(store_path) -> Path:
    """The policy lives next to the store it was trained on."""
    return Path(str(store_path)).with_name("policy.pt")


def shipped_policy_path(arch: str) -> Optional[Path]:
    """The policy shipped for `arch` (l2c/policy/<arch>.pt, trained on that architecture's measured `kernel`
    results, benchmarks/NOTES.md), or None: where a tune starts when its own store is too small to train on."""
    path = Path(str(resources.files("l2c") / "policy" / f"{arch}.pt"))
    return path if path.is_file() else None


class PolicySampler(SourcedSampler):
    """An Optuna sampler: a `fraction` of trials drawn from the policy, the rest delegated to TPE.

    Which of the two drew a trial is recorded (`source_for`) so the store can credit it.
    """

    def __init__(self, policy: Policy, problem: Problem, targets: Sequence[str], fraction: float = 0.5,
                 delegate: Optional[BaseSampler] = None, seed: Optional[int] = None):
        self.policy, self.problem, self.targets = policy, problem, check_targets(targets)
        self.fraction = fraction
        self.delegate = delegate or TPESampler(seed=seed)
        self._rng = random.Random(seed)
        self._source: Dict[int, str] = {}

    def source_for(self, number: int) -> str:
        return self._source.get(number, "tpe")

    def _by_policy(self, trial) -> bool:
        return self._source.get(trial.number) == "policy"

    def before_trial(self, study, trial) -> None:
        self._source[trial.number] = "policy" if self._rng.random() < self.fraction else "tpe"
        self.delegate.before_trial(study, trial)

    def infer_relative_search_space(self, study, trial):
        return {} if self._by_policy(trial) else self.delegate.infer_relative_search_space(study, trial)

    def sample_relative(self, study, trial, search_space):
        return {} if self._by_policy(trial) else self.delegate.sample_relative(study, trial, search_space)

    def sample_independent(self, study, trial, param_name, param_distribution):
        if not self._by_policy(trial):
            return self.delegate.sample_independent(study, trial, param_name, param_distribution)
        value = self.policy.sample_value(self.problem, param_name, dict(trial.params), self.targets, self._rng)
        if value not in param_distribution.choices:   # a target outside this study's set: let TPE pick
            return self.delegate.sample_independent(study, trial, param_name, param_distribution)
        return value

    def after_trial(self, study, trial, state, values) -> None:
        self.delegate.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self._rng = random.Random()
        self.delegate.reseed_rng()
