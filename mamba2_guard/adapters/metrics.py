"""Prometheus metrics: one dedicated registry, filled from a bench result, and three ways out.

* ``serve(port)``: the daemon's ``/metrics`` (the preferred way: Prometheus keeps ``up``);
* ``write_textfile(path)``: one-shot runs on a host with node-exporter's textfile collector
  (atomic: prometheus-client writes a temp file and renames it);
* ``push(gateway_url, job)``: a Pushgateway, for CI runners that nothing scrapes (the grouping key
  is {job, instance=<host>, gpu=<index>} and ``push`` replaces that whole group each time).

Naming follows Prometheus practice: prefix ``mamba2_guard_``, base units (seconds, ratios 0..1),
``_total`` for counters, ``_info`` for versions. Labels are bounded: kernel and shape names come from
the registry and the suites, impl is helion|mamba_ssm, the rest are small fixed sets. GPU labels use
DCGM exporter's own names (``gpu`` = index, ``UUID``, ``modelName``, ``Hostname``) so that a query can
join ours with DCGM's, e.g.::

    mamba2_guard_kernel_latency_seconds * on(UUID) group_left() DCGM_FI_DEV_SM_CLOCK

A case measured by a sharded bench (``mamba2_guard.bench.shard``) carries the GPU that measured it in its
``extra``; its series get that GPU's ``gpu``/``UUID``/``modelName`` labels instead of the result's.

The daemon's job name is the label ``guard_job`` (nightly|retune|drift|metrics|oneshot), not ``job``:
``job`` is Prometheus's own target label and the Pushgateway's grouping label, so a ``job`` label of
ours would be renamed ``exported_job`` on scrape and rejected by the Pushgateway.

Metric families (every one carries the GPU labels):

====================================================  ================================================
mamba2_guard_kernel_latency_seconds                   {kernel, shape, impl, quantile=0.1|0.5|0.9}
mamba2_guard_speedup_ratio                            {kernel, shape}  mamba-ssm time / Helion time
mamba2_guard_precision_abs_diff                       {kernel, shape, stat=max|mean, against=mamba_ssm}
mamba2_guard_precision_rel_error_ratio                {kernel, shape, impl, against=fp64}
mamba2_guard_precision_strays                         {kernel, shape}  output elements beyond the tolerance
mamba2_guard_roofline_utilization_ratio               {kernel, shape}
mamba2_guard_regression                               {kernel, shape}  1 = failing verdict "regression"
mamba2_guard_case_status                              {kernel, shape, status}  one-hot verdict status
mamba2_guard_drift                                    {component}  1 = drift that calls for action
mamba2_guard_env_info                                 {torch, triton, helion, mamba_ssm, cuda_runtime,
                                                       driver, python}  (no hashes: a label per hash
                                                       is a new series per commit; drift has them)
mamba2_guard_result_timestamp_seconds                 when the result's run started
mamba2_guard_run_duration_seconds                     {guard_job}  last run
mamba2_guard_last_run_timestamp_seconds               {guard_job}
mamba2_guard_last_success_timestamp_seconds           {guard_job}
mamba2_guard_runs_total                               {guard_job, status}  counter
mamba2_guard_autotune_duration_seconds                {kernel}  last autotune (GPU labels too)
mamba2_guard_prs_opened_total                         counter
mamba2_guard_last_event_timestamp_seconds             {event=drift|retune|pr}  for annotations
mamba2_guard_state_errors_total                       {file}  unreadable state moved aside
mamba2_guard_scheduler_last_tick_timestamp_seconds    the daemon's heartbeat (stops moving: a stalled scheduler)
mamba2_guard_scheduler_next_due_timestamp_seconds     when the daemon's next job is due
mamba2_guard_bringup_jobs                             {stage, state=done|left}  a new GPU's bring-up
mamba2_guard_bringup_stage                            {stage}  1 for the current stage
mamba2_guard_bringup_device_seconds                   spent on the bring-up so far
mamba2_guard_bringup_speedup_geomean_ratio            the whole calls against mamba-ssm at its last report
====================================================  ================================================
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Info

from mamba2_kernels import seen

log = logging.getLogger(__name__)
NO_SNAPSHOT = "no such file"  # GuardMetrics.read_snapshot's answer where there is no snapshot yet

PREFIX = "mamba2_guard"
GPU_LABELS = ("gpu", "UUID", "modelName", "Hostname")
RUN_STATUSES = ("success", "regression", "error", "timeout", "killed", "missed", "skipped")
EVENTS = ("drift", "retune", "pr")
QUANTILES = (("0.1", 10), ("0.5", 50), ("0.9", 90))
DRIFT_COMPONENT_FOR_CLASS = {"new-gpu": "gpu", "kernel-source": "kernels", "invalid-config": "config"}
DRIFT_COMPONENTS = ("gpu", "helion", "triton", "torch", "cuda_runtime", "driver", "mamba_ssm", "kernels", "config")


def gpu_labels(fingerprint: Mapping[str, Any] | None) -> dict[str, str]:
    """DCGM-aligned labels from a fingerprint dict ('' where unknown, i.e. the label is absent)."""
    fp = dict(fingerprint or {})
    index = fp.get("gpu_index")
    return {
        "gpu": "" if index is None else str(index),
        "UUID": fp.get("gpu_uuid") or "",
        "modelName": fp.get("gpu_name") or "cpu",
        "Hostname": fp.get("hostname") or socket.gethostname(),
    }


def case_gpu_labels(result_labels: Mapping[str, str], extra: Mapping[str, Any] | None) -> dict[str, str]:
    """A case's GPU labels: the GPU that measured it when the case records one (a sharded bench puts
    ``gpu_index``/``gpu_uuid``/``gpu_name`` in its ``extra``), else the result's."""
    extra = extra or {}
    if extra.get("gpu_uuid") is None and extra.get("gpu_index") is None:
        return dict(result_labels)
    index = extra.get("gpu_index")
    return {**result_labels, "gpu": "" if index is None else str(index), "UUID": extra.get("gpu_uuid") or "",
            "modelName": extra.get("gpu_name") or result_labels["modelName"]}


def _as_dict(obj: Any) -> Any:
    if obj is None or isinstance(obj, Mapping):
        return obj
    if hasattr(obj, "to_dict"):
        return obj.to_dict()
    raise TypeError(f"expected a mapping or an object with to_dict(), got {type(obj).__name__}")


def _percentile(values: list[float], q: int) -> float | None:
    if not values:
        return None
    from mamba2_guard.core import stats

    if q == 50:
        return stats.median(values)
    s = stats.summarize(values)
    if s is None:
        return None
    return s.p10 if q == 10 else s.p90


def _timestamp(iso: str | None) -> float | None:
    if not iso:
        return None
    try:
        return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


class GuardMetrics:
    """All metric families of the guard, on a registry of their own."""

    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry(auto_describe=True)
        r = self.registry
        g = GPU_LABELS
        case = ("kernel", "shape")
        self.latency = Gauge(f"{PREFIX}_kernel_latency_seconds", "Kernel latency per call (quantile over samples)",
                             case + ("impl", "quantile") + g, registry=r)
        self.speedup = Gauge(f"{PREFIX}_speedup_ratio", "mamba-ssm time / Helion time (median of paired rounds)",
                             case + g, registry=r)
        self.abs_diff = Gauge(f"{PREFIX}_precision_abs_diff", "Absolute difference of Helion's outputs",
                              case + ("stat", "against") + g, registry=r)
        self.rel_err = Gauge(f"{PREFIX}_precision_rel_error_ratio", "Max relative error against a reference",
                             case + ("impl", "against") + g, registry=r)
        self.strays = Gauge(f"{PREFIX}_precision_strays",
                            "Output elements beyond the tolerance of mamba-ssm's value, over the case's outputs",
                            case + g, registry=r)
        self.roofline = Gauge(f"{PREFIX}_roofline_utilization_ratio", "Roofline-bound time / achieved time (0..1)",
                              case + g, registry=r)
        self.regression = Gauge(f"{PREFIX}_regression", "1 when the case's verdict is a regression",
                                case + g, registry=r)
        self.case_status = Gauge(f"{PREFIX}_case_status", "1 for the case's current verdict status",
                                 case + ("status",) + g, registry=r)
        self.drift = Gauge(f"{PREFIX}_drift", "1 when this component drifted and calls for action",
                           ("component",) + g, registry=r)
        self.env = Info(f"{PREFIX}_env", "Versions the last result was measured with", g, registry=r)
        self.result_ts = Gauge(f"{PREFIX}_result_timestamp_seconds", "Start of the run that produced the result",
                               g, registry=r)
        self.run_duration = Gauge(f"{PREFIX}_run_duration_seconds", "Duration of the job's last run", ("guard_job",),
                                  registry=r)
        self.last_run = Gauge(f"{PREFIX}_last_run_timestamp_seconds", "End of the job's last run", ("guard_job",),
                              registry=r)
        self.last_success = Gauge(f"{PREFIX}_last_success_timestamp_seconds", "End of the job's last successful run",
                                  ("guard_job",), registry=r)
        self.runs = Counter(f"{PREFIX}_runs", "Job runs by outcome", ("guard_job", "status"), registry=r)
        self.autotune = Gauge(f"{PREFIX}_autotune_duration_seconds", "Duration of the last autotune", ("kernel",) + g,
                              registry=r)
        self.prs = Counter(f"{PREFIX}_prs_opened", "Pull requests opened by the guard", registry=r)
        self.events = Gauge(f"{PREFIX}_last_event_timestamp_seconds", "When the guard last saw this event",
                            ("event",), registry=r)
        self.fallback_keys = Gauge(f"{PREFIX}_fallback_keys", "Shape keys served without their own tuned config "
                                   "(the seen-keys file), by kernel and reason", ("kernel", "reason"), registry=r)
        self.state_errors = Counter(f"{PREFIX}_state_errors", "State files found unreadable and moved aside",
                                    ("file",), registry=r)
        self.scheduler_tick = Gauge(f"{PREFIX}_scheduler_last_tick_timestamp_seconds",
                                    "When the daemon's scheduler last ran its heartbeat job", registry=r)
        self.scheduler_next_due = Gauge(f"{PREFIX}_scheduler_next_due_timestamp_seconds",
                                        "When the daemon's next job is due", registry=r)
        self.bringup_jobs = Gauge(f"{PREFIX}_bringup_jobs", "A new GPU's bring-up: jobs done and left, by stage",
                                  ("stage", "state"), registry=r)
        self.bringup_stage = Gauge(f"{PREFIX}_bringup_stage", "1 for the bring-up's current stage (complete: done)",
                                   ("stage",), registry=r)
        self.bringup_seconds = Gauge(f"{PREFIX}_bringup_device_seconds", "Seconds the bring-up has spent so far",
                                     registry=r)
        self.bringup_speedup = Gauge(f"{PREFIX}_bringup_speedup_geomean_ratio", "Geometric mean of the whole "
                                     "calls' speedup against mamba-ssm when the bring-up last reported", registry=r)
        self._gpu: dict[str, str] = gpu_labels(None)
        self._case_gpus: set[str] = set()  # gpu label values of the per-case series (several: sharded bench)

    # ------------------------------------------------------------------------------------------
    # From a bench result

    def update_from_result(self, result: Any, verdicts: Iterable[Any] = (), fingerprint: Any = None,
                           drift: Any = None) -> None:
        """Replace every per-case series with the values of ``result`` (dict or BenchResult).

        ``verdicts``: Verdict objects or dicts; ``fingerprint``: dict or Fingerprint (default: the
        result's); ``drift``: a DriftReport or its dict (optional).
        """
        doc = _as_dict(result)
        fp = _as_dict(fingerprint) or dict(doc.get("fingerprint") or {})
        gl = gpu_labels(fp)
        self._gpu = gl
        for family in (self.latency, self.speedup, self.abs_diff, self.rel_err, self.roofline, self.regression,
                       self.case_status):
            family.clear()
        from mamba2_guard.core.results import BenchResult

        parsed = result if isinstance(result, BenchResult) else BenchResult.from_dict(doc)
        where = {c.key: case_gpu_labels(gl, c.extra) for c in parsed.cases}
        self._case_gpus = {w["gpu"] for w in where.values()} | {gl["gpu"]}
        for c in parsed.cases:
            labels = {"kernel": c.kernel, "shape": c.shape, **where[c.key]}
            if c.timings_meaningful:
                for impl in ("helion", "mamba_ssm"):
                    samples = list(getattr(c.samples_ms, impl))
                    for qname, q in QUANTILES:
                        v = _percentile(samples, q)
                        if v is not None:
                            self.latency.labels(impl=impl, quantile=qname, **labels).set(v / 1e3)
                if c.speedup is not None:
                    self.speedup.labels(**labels).set(c.speedup)
                if c.roofline_fraction is not None:
                    self.roofline.labels(**labels).set(c.roofline_fraction)
            p = c.precision
            if p is not None:
                for stat, v in (("max", p.max_abs_diff_vs_mamba_ssm), ("mean", p.mean_abs_diff_vs_mamba_ssm)):
                    if v is not None:
                        self.abs_diff.labels(stat=stat, against="mamba_ssm", **labels).set(v)
                for impl, v in (("helion", p.max_rel_err_vs_fp64), ("mamba_ssm", p.mamba_ssm_max_rel_err_vs_fp64)):
                    if v is not None:
                        self.rel_err.labels(impl=impl, against="fp64", **labels).set(v)
                self.strays.labels(**labels).set(sum(int(o.get("strays") or 0) for o in p.outputs))
        seen = set()
        for v in verdicts:
            vd = _as_dict(v)
            labels = {"kernel": vd["kernel"], "shape": vd["shape"], **where.get((vd["kernel"], vd["shape"]), gl)}
            seen.add((vd["kernel"], vd["shape"]))
            self.regression.labels(**labels).set(1.0 if vd["status"] == "regression" else 0.0)
            self.case_status.labels(status=vd["status"], **labels).set(1.0)
        for c in parsed.cases:  # cases without a verdict: no regression known
            if (c.kernel, c.shape) not in seen:
                self.regression.labels(kernel=c.kernel, shape=c.shape, **where[c.key]).set(0.0)
        env = {
            "torch": fp.get("torch"), "triton": fp.get("triton"), "helion": fp.get("helion"),
            "mamba_ssm": fp.get("mamba_ssm"), "cuda_runtime": fp.get("cuda_runtime"),
            "driver": fp.get("driver_version"), "python": fp.get("python"),
        }
        self.env.labels(**gl).info({k: str(v) if v is not None else "" for k, v in env.items()})
        ts = _timestamp(parsed.started_at)
        if ts is not None:
            self.result_ts.labels(**gl).set(ts)
        if drift is not None:
            self.update_drift(drift, fp)

    def update_drift(self, drift: Any, fingerprint: Any = None) -> None:
        """Set ``mamba2_guard_drift{component}`` from a DriftReport (or its dict): 1 = act, 0 = fine."""
        d = _as_dict(drift) or {}
        gl = gpu_labels(_as_dict(fingerprint)) if fingerprint is not None else self._gpu
        self.drift.clear()
        flagged = set()
        for item in d.get("items") or []:
            if item.get("action", "ignore") == "ignore":
                continue
            comp = DRIFT_COMPONENT_FOR_CLASS.get(item.get("class"), item.get("component"))
            flagged.add(comp if comp in DRIFT_COMPONENTS else "other")
        for comp in DRIFT_COMPONENTS + (("other",) if "other" in flagged else ()):
            self.drift.labels(component=comp, **gl).set(1.0 if comp in flagged else 0.0)

    # ------------------------------------------------------------------------------------------
    # Job bookkeeping

    def record_run(self, job: str, status: str, started: float, finished: float) -> None:
        if status not in RUN_STATUSES:
            raise ValueError(f"status: expected one of {RUN_STATUSES}, got {status!r}")
        self.runs.labels(guard_job=job, status=status).inc()
        if status in ("missed", "skipped"):
            return
        self.run_duration.labels(guard_job=job).set(max(0.0, finished - started))
        self.last_run.labels(guard_job=job).set(finished)
        if status in ("success", "regression"):
            self.last_success.labels(guard_job=job).set(finished)

    def restore(self, daemon_state: Mapping[str, Any]) -> None:
        """Re-create counters and timestamps from the daemon's bookkeeping after a restart."""
        for job, info in (daemon_state.get("jobs") or {}).items():
            if info.get("last_run") is not None:
                self.last_run.labels(guard_job=job).set(info["last_run"])
            if info.get("last_success") is not None:
                self.last_success.labels(guard_job=job).set(info["last_success"])
            if info.get("duration_s") is not None:
                self.run_duration.labels(guard_job=job).set(info["duration_s"])
        for key, n in (daemon_state.get("counts") or {}).items():
            job, _, status = key.partition("/")
            if n:
                self.runs.labels(guard_job=job, status=status).inc(n)
        for event, ts in (daemon_state.get("events") or {}).items():
            self.events.labels(event=event).set(ts)
        if daemon_state.get("prs_opened"):
            self.prs.inc(daemon_state["prs_opened"])

    def update_liveness(self, last_tick: float, next_due: float | None) -> None:
        """The daemon's heartbeat: a last tick that stops moving while the process is up is a stalled scheduler."""
        self.scheduler_tick.set(last_tick)
        if next_due is not None:
            self.scheduler_next_due.set(next_due)

    def update_bringup(self, progress: Mapping[str, Any] | None) -> None:
        """The bring-up's progress (``mamba2_guard.core.bringup.progress``); clears the series when None."""
        for family in (self.bringup_jobs, self.bringup_stage):
            family.clear()
        if not progress:
            return
        for name, stage in (progress.get("stages") or {}).items():
            done, jobs = int(stage.get("done") or 0), int(stage.get("jobs") or 0)
            self.bringup_jobs.labels(stage=name, state="done").set(done)
            self.bringup_jobs.labels(stage=name, state="left").set(max(0, jobs - done))
        self.bringup_stage.labels(stage=str(progress.get("stage"))).set(1)
        self.bringup_seconds.set(float(progress.get("seconds") or 0))
        if progress.get("speedup_geomean") is not None:
            self.bringup_speedup.set(float(progress["speedup_geomean"]))

    def record_event(self, event: str, ts: float) -> None:
        if event not in EVENTS:
            raise ValueError(f"event: expected one of {EVENTS}, got {event!r}")
        self.events.labels(event=event).set(ts)

    def record_pr_opened(self, n: int = 1) -> None:
        self.prs.inc(n)

    def record_autotune(self, kernel: str, seconds: float) -> None:
        self.autotune.labels(kernel=kernel, **self._gpu).set(seconds)

    def record_state_error(self, file: str) -> None:
        self.state_errors.labels(file=file).inc()

    def update_seen(self, entries: Iterable[Mapping[str, Any]]) -> None:
        """``fallback_keys`` from the seen-keys file's entries (mamba2_kernels/seen.py)."""
        counts: dict[tuple[str, str], int] = {}
        for entry in entries:
            label = (str(entry.get("kernel")), str(entry.get("reason")))
            counts[label] = counts.get(label, 0) + 1
        self.fallback_keys.clear()
        for (kernel, reason), n in counts.items():
            self.fallback_keys.labels(kernel=kernel, reason=reason).set(n)

    def load_seen(self) -> None:
        """Fill ``fallback_keys`` from this machine's seen-keys file; an unreadable one is logged."""
        file = seen.path()
        if file is None:
            return
        try:
            self.update_seen(seen.read(file).values())
        except ValueError as exc:
            log.error("metrics: %s", exc)

    def load_snapshot(self, path: Path) -> bool:
        """Fill from a ``latest.json`` snapshot (see :func:`snapshot`). False when absent or unreadable (logged)."""
        problem = self.read_snapshot(path)
        if problem and problem != NO_SNAPSHOT:
            log.error("metrics: %s: %s", path, problem)
        return problem is None

    def read_snapshot(self, path: Path) -> str | None:
        """Fill from a ``latest.json`` snapshot; None when done, else why not (``NO_SNAPSHOT`` when absent)."""
        from mamba2_guard.adapters.state import read_json

        data, problem = read_json(path)
        if data is None:
            return problem or NO_SNAPSHOT
        if not isinstance(data, dict):
            return f"expected a JSON object with result, verdicts, ..., got {type(data).__name__}"
        try:
            self.update_from_result(data["result"], data.get("verdicts") or (), data.get("fingerprint"),
                                    data.get("drift"))
            for event, ts in (data.get("events") or {}).items():
                if event in EVENTS and ts is not None:
                    self.record_event(event, float(ts))
            for kernel, seconds in (data.get("autotune_s") or {}).items():
                self.record_autotune(kernel, float(seconds))
            self.update_bringup(data.get("bringup"))
        except KeyError as exc:
            return f"cannot use the snapshot: no key {exc}"
        except (AttributeError, TypeError, ValueError) as exc:
            return f"cannot use the snapshot: {exc}"
        self.load_seen()
        return None

    # ------------------------------------------------------------------------------------------
    # Ways out

    def exposition(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self.registry)

    def serve(self, port: int, addr: str = "127.0.0.1"):
        """Start ``/metrics`` on a daemon thread; returns (server, thread) (``server.shutdown()`` stops it)."""
        from prometheus_client import start_http_server

        return start_http_server(port, addr=addr, registry=self.registry)

    def write_textfile(self, path: Path) -> None:
        """node-exporter textfile collector output; prometheus-client writes a temp file and renames it."""
        from prometheus_client import write_to_textfile

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_to_textfile(str(path), self.registry)

    def push(self, gateway_url: str, job: str = "mamba2-guard", timeout_s: float = 30.0) -> None:
        """Replace this host+GPU's group on a Pushgateway with the current values."""
        from prometheus_client import push_to_gateway

        grouping = {"instance": self._gpu["Hostname"]}
        if self._gpu["gpu"] and self._case_gpus <= {self._gpu["gpu"]}:
            # one GPU's series: group by it. A sharded bench's series carry several gpu labels, and pushed
            # series must not disagree with a grouping label: the group is then the host.
            grouping["gpu"] = self._gpu["gpu"]
        push_to_gateway(gateway_url, job=job, registry=self.registry, grouping_key=grouping, timeout=timeout_s)


def snapshot(result: Any, verdicts: Iterable[Any] = (), fingerprint: Any = None, drift: Any = None,
             events: Mapping[str, float] | None = None, autotune_s: Mapping[str, float] | None = None,
             bringup: Mapping[str, Any] | None = None) -> dict:
    """The ``latest.json`` document a cycle leaves for the daemon's metrics (plain JSON)."""
    return {
        "result": _as_dict(result),
        "verdicts": [_as_dict(v) for v in verdicts],
        "fingerprint": _as_dict(fingerprint),
        "drift": _as_dict(drift),
        "events": dict(events or {}),
        "autotune_s": dict(autotune_s or {}),
        "bringup": dict(bringup) if bringup else None,
    }


def write_snapshot(state_dir: Path, result: Any, verdicts: Iterable[Any] = (), **kw: Any) -> Path:
    """Write ``<state_dir>/latest.json`` atomically (call this at the end of a cycle)."""
    from mamba2_guard.adapters.state import StateDir, write_json

    path = StateDir(Path(state_dir)).latest
    write_json(path, snapshot(result, verdicts, **kw))
    return path


# ----------------------------------------------------------------------------------------------
# Module-level default instance (what the CLI uses)

METRICS = GuardMetrics()


def update_from_result(result: Any, verdicts: Iterable[Any] = (), fingerprint: Any = None, drift: Any = None) -> None:
    METRICS.update_from_result(result, verdicts, fingerprint, drift)


def serve(port: int, addr: str = "127.0.0.1"):
    return METRICS.serve(port, addr)


def write_textfile(path: Path) -> None:
    METRICS.write_textfile(path)


def push(gateway_url: str, job: str = "mamba2-guard") -> None:
    METRICS.push(gateway_url, job)
