"""A tiny fake of the GitHub REST endpoints PyGithub calls for the PR bot, on 127.0.0.1.

It keeps pulls, comments and labels in memory, records every request, and checks each one's shape:
method + path must be a known endpoint, JSON bodies must carry exactly the allowed keys, and the
Authorization header must be ``token <TOKEN>``. Violations are collected in ``server.violations``
(the fixture fails the test on any).
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

PREFIX = "/api/v3"
OWNER, NAME = "octo", "configs"
FULL = f"{OWNER}/{NAME}"

# (method, path regex) -> (required JSON keys, allowed JSON keys) ; None = no body expected
ROUTES: list[tuple[str, str, frozenset | None, frozenset | None]] = [
    ("GET", rf"/repos/{FULL}", None, None),
    ("GET", rf"/repos/{FULL}/pulls", None, None),
    (
        "POST",
        rf"/repos/{FULL}/pulls",
        frozenset({"title", "head", "base", "body"}),
        frozenset({"title", "head", "base", "body", "draft", "maintainer_can_modify"}),
    ),
    ("GET", rf"/repos/{FULL}/pulls/(\d+)", None, None),
    ("PATCH", rf"/repos/{FULL}/pulls/(\d+)", frozenset(), frozenset({"title", "body", "state", "base"})),
    ("GET", rf"/repos/{FULL}/issues/(\d+)/comments", None, None),
    ("POST", rf"/repos/{FULL}/issues/(\d+)/comments", frozenset({"body"}), frozenset({"body"})),
    ("POST", rf"/repos/{FULL}/issues/(\d+)/labels", frozenset({"labels"}), frozenset({"labels"})),
]


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    json: Any
    headers: dict[str, str]


@dataclass
class State:
    pulls: dict[int, dict] = field(default_factory=dict)
    comments: dict[int, list[dict]] = field(default_factory=dict)
    next_number: int = 1
    next_id: int = 1000
    refuse_reopen: bool = False  # emulate GitHub refusing to reopen a force-pushed PR


class FakeGitHub:
    def __init__(self, token: str):
        self.token = token
        self.state = State()
        self.requests: list[Request] = []
        self.violations: list[str] = []
        self.lock = threading.Lock()
        # (status, raw body bytes, headers): every request gets this answer instead (rate limits, odd bodies)
        self.answer: tuple[int, bytes, dict[str, str]] | None = None
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.root = f"http://127.0.0.1:{self.port}"
        self.api = f"{self.root}{PREFIX}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()

    # -- JSON shapes ------------------------------------------------------------------------

    def repo_json(self) -> dict:
        return {
            "id": 1,
            "name": NAME,
            "full_name": FULL,
            "owner": {"login": OWNER, "id": 1, "type": "Organization"},
            "private": False,
            "default_branch": "main",
            "url": f"{self.api}/repos/{FULL}",
            "html_url": f"{self.root}/{FULL}",
        }

    def pr_json(self, pr: dict) -> dict:
        n = pr["number"]
        return {
            "id": 100 + n,
            "number": n,
            "state": pr["state"],
            "title": pr["title"],
            "body": pr["body"],
            "url": f"{self.api}/repos/{FULL}/pulls/{n}",
            "issue_url": f"{self.api}/repos/{FULL}/issues/{n}",
            "html_url": f"{self.root}/{FULL}/pull/{n}",
            "head": {"ref": pr["head"], "label": f"{OWNER}:{pr['head']}", "sha": "0" * 40, "repo": self.repo_json()},
            "base": {"ref": pr["base"], "label": f"{OWNER}:{pr['base']}", "sha": "1" * 40, "repo": self.repo_json()},
            "labels": [{"id": i, "name": name, "color": "ededed"} for i, name in enumerate(pr["labels"])],
            "merged_at": pr.get("merged_at"),
            "merged": pr.get("merged_at") is not None,
            "closed_at": None if pr["state"] == "open" else "2026-01-01T00:00:00Z",
            "user": {"login": pr.get("user", "mamba2-guard[bot]"), "id": 7},
        }

    def comment_json(self, n: int, c: dict) -> dict:
        return {
            "id": c["id"],
            "body": c["body"],
            "url": f"{self.api}/repos/{FULL}/issues/comments/{c['id']}",
            "html_url": f"{self.root}/{FULL}/pull/{n}#issuecomment-{c['id']}",
            "user": {"login": "mamba2-guard[bot]", "id": 7},
        }

    # -- helpers for tests ------------------------------------------------------------------

    def add_pr(
        self,
        head: str,
        base: str = "main",
        title: str = "t",
        body: str = "",
        state: str = "open",
        labels=(),
        merged: bool = False,
    ) -> int:
        with self.lock:
            n = self.state.next_number
            self.state.next_number += 1
            self.state.pulls[n] = {
                "number": n,
                "head": head,
                "base": base,
                "title": title,
                "body": body,
                "state": state,
                "labels": list(labels),
                "merged_at": "2026-01-01T00:00:00Z" if merged else None,
            }
            self.state.comments[n] = []
            return n

    def calls(self, method: str | None = None, pattern: str | None = None) -> list[Request]:
        return [
            r
            for r in self.requests
            if (method is None or r.method == method) and (pattern is None or re.search(pattern, r.path))
        ]

    def writes(self) -> list[Request]:
        return [r for r in self.requests if r.method != "GET"]

    # -- routing ----------------------------------------------------------------------------

    def handle(self, method: str, raw_path: str, headers: dict[str, str], body: bytes) -> tuple[int, Any]:
        parts = urlsplit(raw_path)
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        try:
            data = json.loads(body) if body else None
        except ValueError:
            data = "<invalid json>"
        req = Request(method, parts.path, query, data, headers)
        with self.lock:
            self.requests.append(req)
        if headers.get("authorization") != f"token {self.token}":
            self.violations.append(f"{method} {parts.path}: bad Authorization header")
            return 401, {"message": "Bad credentials"}
        if not parts.path.startswith(PREFIX):
            self.violations.append(f"{method} {parts.path}: not under {PREFIX}")
            return 404, {"message": "Not Found"}
        path = parts.path[len(PREFIX) :]
        for m, pattern, required, allowed in ROUTES:
            mt = re.fullmatch(pattern, path)
            if m != method or not mt:
                continue
            if path.endswith("/labels") and isinstance(data, list):
                # GitHub accepts a bare array of label names (what PyGithub sends) or {"labels": [...]}.
                data = {"labels": data}
            if required is not None:
                if not isinstance(data, dict):
                    self.violations.append(f"{method} {path}: body is not a JSON object")
                    return 400, {"message": "Problems parsing JSON"}
                keys = set(data)
                if not required <= keys or not keys <= allowed:
                    self.violations.append(f"{method} {path}: keys {sorted(keys)} (required {sorted(required)})")
                    return 422, {"message": "Validation Failed"}
            elif data is not None:
                self.violations.append(f"{method} {path}: unexpected body")
            with self.lock:
                return self.dispatch(method, path, mt.groups(), query, data)
        self.violations.append(f"{method} {path}: unknown endpoint")
        return 404, {"message": "Not Found"}

    def dispatch(self, method, path, groups, query, data) -> tuple[int, Any]:
        st = self.state
        if path == f"/repos/{FULL}" and method == "GET":
            return 200, self.repo_json()
        if path == f"/repos/{FULL}/pulls" and method == "GET":
            state = query.get("state", "open")
            if state not in ("open", "closed", "all"):
                self.violations.append(f"GET pulls: bad state {state!r}")
            out = []
            for pr in sorted(st.pulls.values(), key=lambda p: p["number"]):
                if state != "all" and pr["state"] != state:
                    continue
                if "head" in query:
                    owner, _, ref = query["head"].partition(":")
                    if not ref:
                        self.violations.append("GET pulls: head filter without owner:")
                    if owner != OWNER or pr["head"] != ref:
                        continue
                if "base" in query and pr["base"] != query["base"]:
                    continue
                out.append(self.pr_json(pr))
            return 200, out
        if path == f"/repos/{FULL}/pulls" and method == "POST":
            for pr in st.pulls.values():
                if pr["state"] == "open" and pr["head"] == data["head"] and pr["base"] == data["base"]:
                    return 422, {
                        "message": "Validation Failed",
                        "errors": [{"message": f"A pull request already exists for {OWNER}:{data['head']}."}],
                    }
            n = st.next_number
            st.next_number += 1
            st.pulls[n] = {
                "number": n,
                "head": data["head"],
                "base": data["base"],
                "title": data["title"],
                "body": data.get("body") or "",
                "state": "open",
                "labels": [],
                "merged_at": None,
            }
            st.comments[n] = []
            return 201, self.pr_json(st.pulls[n])
        n = int(groups[0]) if groups else None
        if n is not None and n not in st.pulls:
            return 404, {"message": "Not Found"}
        if path.startswith(f"/repos/{FULL}/pulls/") and method == "GET":
            return 200, self.pr_json(st.pulls[n])
        if path.startswith(f"/repos/{FULL}/pulls/") and method == "PATCH":
            pr = st.pulls[n]
            if data.get("state") == "open" and pr["state"] == "closed" and st.refuse_reopen:
                return 422, {
                    "message": "Validation Failed",
                    "errors": [{"message": "state cannot be changed. The head branch was force-pushed"}],
                }
            if "state" in data and data["state"] not in ("open", "closed"):
                self.violations.append(f"PATCH pulls/{n}: bad state")
            for k in ("title", "body", "state", "base"):
                if k in data:
                    pr[k] = data[k]
            return 200, self.pr_json(pr)
        if path.endswith("/comments") and method == "GET":
            return 200, [self.comment_json(n, c) for c in st.comments[n]]
        if path.endswith("/comments") and method == "POST":
            c = {"id": st.next_id, "body": data["body"]}
            st.next_id += 1
            st.comments[n].append(c)
            return 201, self.comment_json(n, c)
        if path.endswith("/labels") and method == "POST":
            labels = data["labels"]
            if not isinstance(labels, list) or not all(isinstance(x, str) for x in labels):
                self.violations.append(f"POST labels: {labels!r}")
            pr = st.pulls[n]
            for lb in labels:
                if lb not in pr["labels"]:
                    pr["labels"].append(lb)
            return 200, [{"id": i, "name": x, "color": "ededed"} for i, x in enumerate(pr["labels"])]
        self.violations.append(f"{method} {path}: not implemented")
        return 404, {"message": "Not Found"}

    def _handler(self):
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                headers = {k.lower(): v for k, v in self.headers.items()}
                extra: dict[str, str] = {}
                if fake.answer is not None:
                    status, out, extra = fake.answer
                    fake.requests.append(Request(self.command, self.path, {}, None, headers))
                else:
                    try:
                        status, payload = fake.handle(self.command, self.path, headers, body)
                    except Exception as e:  # a bug in the fake must fail the test, not hang it
                        fake.violations.append(f"fake server error: {e!r}")
                        status, payload = 500, {"message": "fake error"}
                    out = json.dumps(payload).encode()
                self.send_response(status)
                for name, value in extra.items():
                    self.send_header(name, value)
                self.send_header("Content-Type", "application/json; charset=utf-8")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = _serve

            def log_message(self, *args):  # keep test output quiet
                pass

        return Handler
