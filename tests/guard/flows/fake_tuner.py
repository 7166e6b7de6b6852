"""A fake tuner for the autotune tests: no GPU, no Helion; behaviour from ``spec["extra"]`` or env.

Per job (``extra["jobs"][job_id]`` overrides ``extra["search"][spec["search"]]``, which overrides
``extra["default"]``; ``spec["search"]`` is "helion" or, in a bring-up's first stage, "borrowed"):
  ``sleep``     seconds to sleep before answering;
  ``until``     a path: wait (at most 120 s) until it exists before answering;
  ``crash``     die by SIGSEGV (a candidate that takes the process down);
  ``crash_in_process``  the same, in the search of this launch index (default 0), unless its benchmarks are
                isolated in Helion's own subprocess (a candidate that faults the GPU, which that survives);
                the launches before it are saved as finished and it as in flight (``save_partial``);
  ``defer_after``  search this many launches, and leave the rest to the next attempt (``deferred``), as
                the real tuner does with launches that would outlast the job's timeout; it also does so by
                the launch records' ``tune_seconds``, against ``tuneplan.attempt_limit`` of the spec;
  ``hang``      sleep forever (a hung compile or kernel);
  ``hang_after``  save this many of the launches as finished (``save_partial``), then hang;
  ``raise``     raise RuntimeError with this message (a tuner error, e.g. a CUDA fault);
  ``paths``     with ``spec["also_paths"]``, the two paths' timings to return (``paths_on_winners``' records);
  ``launches``  the launch records to return (see mamba2_guard.core.tuneplan.decide); default: one winner that
                is 10 % faster than Helion's default config, precision ok. Those in ``spec["tuned_elsewhere"]``
                are left out and listed there, as the real tuner does, and so are those it leaves as minor
                (``tuneplan.minor_launches`` over the records' ``device_ms``), listed under ``minor``.
Every call is appended to ``$FAKE_TUNE_CALLS`` (one line: job id, pid, device, search, and the other paths it
searches, ``stage=path,...`` or ``-``) when that is set, and
prints the job id to its output (the job's log).
"""

from __future__ import annotations

import json
import math
import os
import signal
import time

from mamba2_guard.core import tuneplan
from mamba2_guard.flows.autotune_worker import save_partial
from mamba2_kernels.config_store import ShapeKey

FASTER = [0.90 + 0.001 * (i % 7) for i in range(30)]
BASE = [1.00 + 0.001 * (i % 7) for i in range(30)]


def default_launch(job: dict) -> dict:
    return {"kernel": f"{job['kernel']}_k", "key": f"shape={job['shape']}",
            "config": {"block_sizes": [16 * (1 + job["index"] % 4)], "num_warps": 4},
            "incumbent": "default", "incumbent_config": {"block_sizes": [16], "num_warps": 2},
            "precision": {"ok": True}, "samples_ms": {"incumbent": BASE, "candidate": FASTER}}


def tune(spec: dict) -> dict:
    job = spec["job"]
    extra = dict(spec.get("extra") or {})
    if not extra and os.environ.get("FAKE_TUNE_EXTRA"):
        extra = json.loads(os.environ["FAKE_TUNE_EXTRA"])
    search = spec.get("search") or "helion"
    behaviour = {**extra.get("default", {}), **extra.get("search", {}).get(search, {}),
                 **extra.get("jobs", {}).get(job["id"], {})}
    calls = os.environ.get("FAKE_TUNE_CALLS")
    if calls:
        fd = os.open(calls, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        paths = ",".join(f"{stage}={path}" for stage, path in sorted((spec.get("also_paths") or {}).items())) or "-"
        os.write(fd, f"{job['id']} {os.getpid()} {spec.get('device')} {search} {paths}\n".encode())
        os.close(fd)
    print(f"fake tuner: {job['id']}", flush=True)  # lands in the job's own log
    time.sleep(float(behaviour.get("sleep", 0)))
    deadline = time.monotonic() + 120
    while behaviour.get("until") and not os.path.exists(behaviour["until"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    if behaviour.get("crash"):
        os.kill(os.getpid(), signal.SIGSEGV)
    if behaviour.get("raise"):
        raise RuntimeError(behaviour["raise"])
    launches = behaviour.get("launches")
    launches = launches if launches is not None else [default_launch(job)]
    elsewhere = spec.get("tuned_elsewhere") or []  # as the real tuner: launches earlier jobs tuned are skipped
    todo = [x for x in launches if [x["kernel"], x["key"]] not in elsewhere]
    minor = set(tuneplan.minor_launches([(x["kernel"], x["key"]) for x in todo],
                                        [x.get("device_ms", math.nan) for x in todo], elsewhere,
                                        code=lambda text: ShapeKey.parse(text).code()))
    left_as_minor = [[x["kernel"], x["key"]] for i, x in enumerate(todo) if i in minor]
    todo = [x for i, x in enumerate(todo) if i not in minor]
    if "crash_in_process" in behaviour:
        for i, launch in enumerate(todo):
            slot = [launch["kernel"], launch["key"]]
            save_partial(spec, todo[:i], in_flight=slot)
            isolated = (spec.get("helion_benchmark_subprocess") or slot in spec.get("isolate_launches", [])
                        or launch["kernel"] in spec.get("isolate_kernels", []))
            if launches.index(launch) == int(behaviour["crash_in_process"]) and not isolated:
                os.kill(os.getpid(), signal.SIGSEGV)
    if "hang_after" in behaviour and len(todo) > behaviour["hang_after"]:
        save_partial(spec, todo[:behaviour["hang_after"]])
        behaviour["hang"] = True
    if behaviour.get("hang"):
        while True:
            time.sleep(1)
    cut = int(behaviour.get("defer_after", len(todo)))
    # As the real tuner, on the launches' recorded search times: those that would end past the job's
    # timeout or the run's budget left are deferred.
    limit, elapsed = tuneplan.attempt_limit(spec.get("timeout_seconds"), spec.get("seconds_left")), 0.0
    for i, launch in enumerate(todo[:cut]):
        if tuneplan.defers(elapsed, float(launch.get("tune_seconds", 0.0)), limit, i):
            cut = i
            break
        elapsed += float(launch.get("tune_seconds", 0.0))
    searched_all = cut == len(todo)  # as the real tuner, which times the paths only then
    timed = {"paths": behaviour["paths"]} if spec.get("also_paths") and "paths" in behaviour and searched_all else {}
    return {"gpu": {"uuid": f"GPU-fake-{spec.get('device')}"}, **timed,
            "launches": todo[:cut], "deferred": [[x["kernel"], x["key"]] for x in todo[cut:]], "minor": left_as_minor,
            "tuned_elsewhere": [[x["kernel"], x["key"]] for x in launches if [x["kernel"], x["key"]] in elsewhere]}
