"""APScheduler's SQLite job store, holding only what the daemon wrote.

APScheduler 3 pickles each job (its callable's import path, trigger and arguments) into ``<state>/jobs.sqlite``
and unpickles every row it reads back. Unpickling runs whatever the pickle names, so whoever can write the
state directory could run code as the daemon through a row they add. Two rules close that:

* at every start the store is emptied and the daemon's jobs are rebuilt from its configuration
  (``clear``), so nothing is loaded from disk that this process did not add;
* rows read while the daemon runs are unpickled with ``RestrictedUnpickler``, which resolves only the classes
  a trigger and its dates need (nothing that can run a command), and a job whose callable is not one of the
  daemon's own (``allowed``) is refused. APScheduler logs a refused row as one it cannot restore and deletes it.

``docs/failure-model.md`` states the trust boundary this leaves: the state directory's owner.
"""

from __future__ import annotations

import contextlib
import io
import pickle
import sqlite3
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from apscheduler.job import Job
from apscheduler.jobstores.sqlalchemy import SQLAlchemyJobStore

# What a pickled job legitimately refers to: its trigger's classes (cron fields and expressions included), the
# dates and time zones in it, and the containers pickle builds by name.
SAFE_MODULES = ("apscheduler.triggers", "datetime", "zoneinfo", "pytz", "tzlocal")
SAFE_BUILTINS = frozenset({"set", "frozenset", "tuple", "list", "dict", "int", "float", "str", "bytes", "bool",
                           "complex", "slice"})
TABLE = "apscheduler_jobs"


class RefusedJob(pickle.UnpicklingError):
    """A stored job that names something the daemon never stores."""


class RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if module == "builtins" and name in SAFE_BUILTINS:
            return super().find_class(module, name)
        if module == "copyreg" and name == "_reconstructor":
            return super().find_class(module, name)
        if any(module == safe or module.startswith(safe + ".") for safe in SAFE_MODULES):
            return super().find_class(module, name)
        raise RefusedJob(f"the job store names {module}.{name}, which the daemon never stores")


class TrustedJobStore(SQLAlchemyJobStore):
    """``SQLAlchemyJobStore`` that restores only jobs whose callable is in ``allowed`` (``module:function``),
    unpickled with ``RestrictedUnpickler``."""

    def __init__(self, url: str, allowed: Iterable[str]):
        super().__init__(url=url)
        self.allowed = frozenset(allowed)

    def _reconstitute_job(self, job_state: bytes) -> Job:
        state = RestrictedUnpickler(io.BytesIO(job_state)).load()
        if not isinstance(state, dict) or state.get("func") not in self.allowed:
            func = state.get("func") if isinstance(state, dict) else type(state).__name__
            raise RefusedJob(f"the job store holds a job of {func!r}, not one of the daemon's jobs")
        state["jobstore"] = self
        job = Job.__new__(Job)
        job.__setstate__(state)
        job._scheduler = self._scheduler
        job._jobstore_alias = self._alias
        return job


def clear(path: Path) -> int:
    """Delete every stored job without reading one (the daemon adds its own right after); how many there were."""
    if not path.exists():
        return 0
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        if not db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (TABLE,)).fetchone():
            return 0
        return db.execute(f"DELETE FROM {TABLE}").rowcount
