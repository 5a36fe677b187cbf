"""Trial recovery: a trial a dead worker left RUNNING goes back in the queue, so a resumed study finishes with
exactly the requested number of evaluated points and none evaluated twice; a point lost MAX_LOSSES times (it
crashes or hangs the process that measures it) is a failed candidate instead, so a resume never loops on it.

Every outcome reaches the results store before it is told, so nothing measured is lost with a worker; what a
dead worker loses is its RUNNING trials, which are marked FAIL (status `lost`) here and their points re-enqueued.
"""
from __future__ import annotations

import datetime
import os
import socket

import optuna
from optuna.trial import TrialState

from .space import TARGET_PARAM

MAX_LOSSES = 2           # a point whose worker died this many times is a failed candidate, not retried again
KILLED_WORKER = "killed_worker"   # its trial's status (counted in the budget: search/study.py COUNTED)
ORPHAN_AFTER_S = 30.0   # a RUNNING trial that never named its worker (killed between `ask` and naming) is dead
                        # after this long: a live worker names its trial in the storage call right after `ask`


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def is_orphan(t: optuna.trial.FrozenTrial) -> bool:
    """RUNNING and never named its worker: killed between `ask` and `set_user_attr("worker")`, or still
    inside that window (a live worker leaves it within milliseconds)."""
    return t.state == TrialState.RUNNING and not t.user_attrs.get("worker")


def reclaim_lost_trials(study: optuna.Study, everything: bool = False,
                        orphan_after_s: float = ORPHAN_AFTER_S) -> int:
    """Mark trials a dead worker left RUNNING as FAIL (status `lost`) and re-enqueue their points.

    A trial is dead when its worker ran on this host and that process is gone, when it never got as far as
    naming its worker (killed right after `ask`, `orphan_after_s` ago or more), or always with `everything`
    (`l2c tune --reclaim all`: the caller knows no other worker is alive, e.g. after a remote host died on
    a journal file). RDB storages with heartbeats also fail stale trials of remote workers. A point is
    re-enqueued whether it was sampled (params) or popped from the queue before any param was set
    (its enqueued `fixed_params`), so a seed or retry is never dropped.
    """
    if isinstance(study._storage, optuna.storages.RDBStorage) and study._storage.is_heartbeat_enabled():
        optuna.storages.fail_stale_trials(study)
    host = socket.gethostname()
    n = 0
    now = datetime.datetime.now()
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        worker = str(t.user_attrs.get("worker", ""))
        w_host, _, w_pid = worker.rpartition(":")
        orphan = (is_orphan(t) and t.datetime_start is not None
                  and (now - t.datetime_start).total_seconds() >= orphan_after_s)
        dead = everything or orphan or (w_host == host and w_pid.isdigit() and not _pid_alive(int(w_pid)))
        if not dead:
            continue
        losses = int(t.user_attrs.get("losses", 0)) + 1
        killer = losses >= MAX_LOSSES   # the point itself takes its worker down (or hangs it): a failed candidate
        study._storage.set_trial_user_attr(t._trial_id, "status", KILLED_WORKER if killer else "lost")
        study.tell(t.number, state=TrialState.FAIL, skip_if_finished=True)
        params = dict(t.params) if TARGET_PARAM in t.params else dict(t.system_attrs.get("fixed_params") or {})
        if TARGET_PARAM in params and not killer:
            attrs = {"source": t.user_attrs.get("source", "enqueued"), "retry_of": t.number, "losses": losses}
            study.enqueue_trial(params, user_attrs=attrs)
        n += 1
    return n
