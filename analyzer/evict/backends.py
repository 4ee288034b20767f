"""Where an approved proposal goes: the scheduler's side of an eviction, and its undo.

Every backend has a timeout per call, retries with backoff, and passes an idempotency key (the
proposal id for its drain), so a retry after a crash does not act twice. Every backend refuses to touch a
node that someone else took out, and undoes only what it did itself.

* ``slurm``: ``scontrol update NodeName=X State=DRAIN Reason="hypertrace: ..."``; undo is
  ``State=RESUME``, only while the Reason is ours (proposal id in it). With ``requeue`` (off by
  default) the job, when its id is a Slurm job id, is requeued with the node excluded.
* ``exec``: a command run with the proposal JSON on stdin and ``HYPERTRACE_ACTION=drain|undo``,
  ``HYPERTRACE_PROPOSAL=<id>`` and ``HYPERTRACE_IDEMPOTENCY_KEY`` in its environment; exit 0
  means done. Past ``timeout_s`` its whole process group is killed.
* ``webhook``: an HTTPS POST of the proposal JSON, signed ``X-Hypertrace-Signature:
  sha256=<hex HMAC of the body>`` with the secret from a file, the action in
  ``X-Hypertrace-Action``, and ``Idempotency-Key``: the proposal id for the drain (the same on
  every retry), ``<id>-undo`` for its undo (:func:`idempotency_key`).
* ``kubernetes``: cordon, a ``hypertrace.dev/straggler=<proposal>:NoSchedule`` taint and a
  ``HypertraceStraggler`` node condition with the evidence; never NoExecute.
* ``none``: dry-run only (``enforce`` with it is a configuration error).
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from hypertrace.analyzer.evict.audit import Proposal
from hypertrace.proto.backoff import Backoff
from hypertrace.proto.settings import ConfigError

REASON_PREFIX = "hypertrace:"


class BackendError(RuntimeError):
    """An action that failed after its retries; the message says what the scheduler said."""


class Refused(BackendError):
    """The scheduler's state forbids the action (a node someone else drained, a Reason that is
    not ours): never retried."""


class Backend(Protocol):
    name: str
    retry: "Retry"

    def drain(self, p: Proposal) -> str: ...

    def undo(self, p: Proposal) -> str: ...


@dataclass(frozen=True)
class Retry:
    """A backend call's attempts, timeout and backoff (proto/backoff.py: exponential with
    jitter, capped at ``cap_s``). Refused is final, never retried."""

    attempts: int = 3
    base_s: float = 1.0
    timeout_s: float = 30.0
    cap_s: float = 60.0

    def budget_s(self) -> float:
        """The longest one call with its retries can take: every attempt to its timeout and
        every wait between them at the cap (what an attempt's lease must outlast)."""
        n = max(1, self.attempts)
        return n * self.timeout_s + (n - 1) * self.cap_s

    def run(self, action: Callable[[], str], sleep: Callable[[float], None] = time.sleep) -> str:
        def once() -> str:
            try:
                return action()
            except Refused:
                raise
            except (BackendError, OSError, subprocess.SubprocessError) as exc:
                raise _Failed(exc) from exc
        try:
            return Backoff(self.base_s, self.cap_s).retry(once, max(1, self.attempts),
                                                          (_Failed,), sleep)
        except _Failed as exc:
            raise BackendError(f"failed after {self.attempts} attempts: {exc.args[0]}") from None


class _Failed(Exception):
    """One failed attempt of a backend call (retried)."""


def proposal_body(p: Proposal, action: str) -> bytes:
    return json.dumps({**p.as_json(), "action": action}, sort_keys=True).encode()


@dataclass
class NoBackend:
    name: str = "none"
    retry: Retry = field(default_factory=Retry)

    def drain(self, p: Proposal) -> str:
        raise Refused("backend none: dry-run only (set evict.backend)")

    def undo(self, p: Proposal) -> str:
        raise Refused("backend none: nothing was done")


@dataclass
class SlurmBackend:
    """Drain and resume through ``scontrol`` (``SLURM_CONF`` from the environment)."""

    scontrol: str = "scontrol"
    retry: Retry = field(default_factory=Retry)
    requeue: bool = False     # also requeue the job (a Slurm job id) without the drained node
    name: str = "slurm"

    def _run(self, *args: str) -> str:
        done = subprocess.run([self.scontrol, *args], capture_output=True, text=True,
                              timeout=self.retry.timeout_s)
        if done.returncode != 0:
            raise BackendError(f"scontrol {' '.join(args[:2])}: {done.stderr.strip()[:300]}")
        return done.stdout

    def node(self, sched_node: str) -> tuple[str, str]:
        """(State, Reason) of a node from ``scontrol show node``."""
        out = self._run("show", "node", sched_node)
        state = re.search(r"\bState=(\S+)", out)
        reason = re.search(r"\bReason=(.*?)(?:\s+\[[^\]]*\])?\s*$", out, re.M)
        return (state.group(1) if state else "", reason.group(1).strip() if reason else "")

    def drain(self, p: Proposal) -> str:
        def act() -> str:
            state, reason = self.node(p.sched_node)
            if "DRAIN" in state.upper() or "DOWN" in state.upper():
                if p.id in reason:
                    return f"already drained by this proposal ({state})"
                raise Refused(f"{p.sched_node} is already {state} (Reason={reason!r}): drained "
                              "by someone else, not touched")
            effect = p.evidence.get("effect", 0.0)
            self._run("update", f"NodeName={p.sched_node}", "State=DRAIN",
                      f"Reason={REASON_PREFIX} job {p.job_id[:40]}, effect {effect:+.1%}, "
                      f"proposal {p.id}")
            return f"scontrol: {p.sched_node} State=DRAIN" + self._requeue(p)
        return self.retry.run(act)

    def _requeue(self, p: Proposal) -> str:
        """With ``requeue``: the job (when its id is a Slurm job id) goes back to the queue with
        the drained node excluded. A drained node alone lets a running job finish on it."""
        if not self.requeue:
            return ""
        if not p.job_id.isdigit():
            return f"; not requeued: job id {p.job_id[:40]!r} is not a Slurm job id"
        try:
            # requeue first: a running job's node list cannot change, a pending one's can (and
            # the drained node is not given to it meanwhile); a pending job only needs the list
            if "JobState=PENDING" not in self._run("show", "job", p.job_id):
                self._run("requeue", p.job_id)
            out = self._run("show", "job", p.job_id)
            m = re.search(r"\bExcNodeList=(\S+)", out)
            exclude = [x for x in (m.group(1).split(",") if m else []) if x and x != "(null)"]
            self._run("update", f"JobId={p.job_id}",
                      f"ExcNodeList={','.join(exclude + [p.sched_node])}")
        except (BackendError, OSError, subprocess.SubprocessError) as exc:
            return f"; requeue of job {p.job_id} failed: {exc}"
        return f"; job {p.job_id} requeued without {p.sched_node}"

    def undo(self, p: Proposal) -> str:
        def act() -> str:
            state, reason = self.node(p.sched_node)
            if not reason.startswith(REASON_PREFIX) or p.id not in reason:
                raise Refused(f"{p.sched_node} is {state} with Reason={reason!r}: not drained "
                              "by this proposal, not resumed")
            self._run("update", f"NodeName={p.sched_node}", "State=RESUME")
            return f"scontrol: {p.sched_node} State=RESUME"
        return self.retry.run(act)


def idempotency_key(p: Proposal, action: str) -> str:
    """The key a receiver deduplicates an action by: the proposal's id for its drain (the same
    on every retry), its own key for the undo (a receiver that deduplicates would drop an
    undo under the drain's key)."""
    return p.id if action == "drain" else f"{p.id}-{action}"


def run_bounded(command: list[str], stdin: bytes, env: dict[str, str], timeout_s: float
                ) -> tuple[int, bytes]:
    """Run ``command`` with ``stdin``; (exit code, stderr). BackendError when it runs past
    ``timeout_s``: then its whole process group is killed. Why a group of its own: a hook
    that is a shell script leaves its children (a ``sleep``, a ``curl``) holding the pipes,
    and waiting for their end after killing the script alone would hang as long as they do."""
    proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, env=env, start_new_session=True)
    try:
        _, err = proc.communicate(stdin, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        import signal
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.communicate()
        raise BackendError(f"{command[0]} did not finish within {timeout_s:g} s (its "
                           "process group was killed)") from None
    return int(proc.returncode), err or b""


@dataclass
class ExecBackend:
    command: list[str]
    retry: Retry = field(default_factory=Retry)
    name: str = "exec"

    def _call(self, p: Proposal, action: str) -> str:
        def act() -> str:
            env = dict(os.environ, HYPERTRACE_ACTION=action, HYPERTRACE_PROPOSAL=p.id,
                       HYPERTRACE_IDEMPOTENCY_KEY=idempotency_key(p, action))
            code, stderr = run_bounded(self.command, proposal_body(p, action), env,
                                       self.retry.timeout_s)
            if code != 0:
                raise BackendError(f"{self.command[0]} exited {code}: "
                                   f"{stderr.decode(errors='replace').strip()[:300]}")
            return f"{self.command[0]}: exit 0"
        return self.retry.run(act)

    def drain(self, p: Proposal) -> str:
        return self._call(p, "drain")

    def undo(self, p: Proposal) -> str:
        return self._call(p, "undo")


@dataclass
class WebhookBackend:
    url: str
    secret: bytes
    ca_file: str = ""
    retry: Retry = field(default_factory=Retry)
    name: str = "webhook"

    def _post(self, p: Proposal, action: str) -> str:
        body = proposal_body(p, action)
        sig = hmac.new(self.secret, body, hashlib.sha256).hexdigest()
        ctx = ssl.create_default_context(cafile=self.ca_file or None)

        def act() -> str:
            req = urllib.request.Request(self.url, data=body, method="POST", headers={
                "Content-Type": "application/json", "X-Hypertrace-Signature": f"sha256={sig}",
                "Idempotency-Key": idempotency_key(p, action), "X-Hypertrace-Action": action})
            try:
                with urllib.request.urlopen(req, timeout=self.retry.timeout_s,
                                            context=ctx) as resp:
                    return f"POST {self.url}: HTTP {resp.status}"
            except urllib.error.HTTPError as exc:
                if 400 <= exc.code < 500 and exc.code not in (408, 429):
                    raise Refused(f"POST {self.url}: HTTP {exc.code} {exc.reason}") from None
                raise BackendError(f"POST {self.url}: HTTP {exc.code} {exc.reason}") from None
            except urllib.error.URLError as exc:
                raise BackendError(f"POST {self.url}: {exc.reason}") from None
        return self.retry.run(act)

    def drain(self, p: Proposal) -> str:
        return self._post(p, "drain")

    def undo(self, p: Proposal) -> str:
        return self._post(p, "undo")


@dataclass
class KubernetesBackend:
    """Cordon, taint ``hypertrace.dev/straggler=<proposal>:NoSchedule`` and set the node
    condition ``HypertraceStraggler``, through the official client. Never NoExecute: that
    deletes pods and ignores PodDisruptionBudgets. A node cordoned by someone else is refused;
    undo removes only our taint (and our cordon) and sets our condition False."""

    api: Any                                   # kubernetes.client.CoreV1Api
    retry: Retry = field(default_factory=Retry)
    name: str = "kubernetes"

    TAINT = "hypertrace.dev/straggler"
    CONDITION = "HypertraceStraggler"

    @classmethod
    def connect(cls, kubeconfig: str = "", context: str = "", host: str = "",
                retry: Retry | None = None) -> "KubernetesBackend":
        """A client from ``kubeconfig`` (or $KUBECONFIG / ~/.kube/config), else the in-cluster
        service account; ``host`` alone: a plain API endpoint (tests)."""
        from kubernetes import client, config
        if host:
            conf = client.Configuration()
            conf.host = host
            return cls(client.CoreV1Api(client.ApiClient(conf)), retry or Retry())
        try:
            config.load_kube_config(config_file=kubeconfig or None, context=context or None)
        except Exception:                       # noqa: BLE001 - then try the pod's account
            config.load_incluster_config()
        return cls(client.CoreV1Api(), retry or Retry())

    def _call(self, fn: Callable[[], str]) -> str:
        from kubernetes.client.exceptions import ApiException

        def act() -> str:
            try:
                return fn()
            except ApiException as exc:
                if exc.status in (401, 403, 404, 422):
                    raise Refused(f"API server: HTTP {exc.status} {exc.reason}") from None
                raise BackendError(f"API server: HTTP {exc.status} {exc.reason}") from None
        return self.retry.run(act)

    def _condition(self, status: str, reason: str, message: str) -> dict:
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        return {"type": self.CONDITION, "status": status, "reason": reason,
                "message": message[:1000], "lastTransitionTime": now, "lastHeartbeatTime": now}

    def drain(self, p: Proposal) -> str:
        def act() -> str:
            node = self.api.read_node(p.sched_node)
            taints = [t.to_dict() for t in (node.spec.taints or [])]
            ours = [t for t in taints if t["key"] == self.TAINT]
            if any(t.get("value") == p.id for t in ours):
                return f"{p.sched_node} already tainted by this proposal"
            if node.spec.unschedulable or ours:
                raise Refused(f"{p.sched_node} is already cordoned or tainted by someone else: "
                              "not touched")
            taints.append({"key": self.TAINT, "value": p.id, "effect": "NoSchedule"})
            self.api.patch_node(p.sched_node, {"spec": {"unschedulable": True,
                                                        "taints": _clean(taints)}})
            effect = p.evidence.get("effect", 0.0)
            self.api.patch_node_status(p.sched_node, {"status": {"conditions": [
                self._condition("True", "Straggler", f"hypertrace proposal {p.id}: job "
                                f"{p.job_id}, effect {effect:+.1%}, predicted gain "
                                f"{p.predicted_gain:+.1%}")]}})
            return f"{p.sched_node}: cordoned, tainted {self.TAINT}={p.id}:NoSchedule"
        return self._call(act)

    def undo(self, p: Proposal) -> str:
        def act() -> str:
            node = self.api.read_node(p.sched_node)
            taints = [t.to_dict() for t in (node.spec.taints or [])]
            if not any(t["key"] == self.TAINT and t.get("value") == p.id for t in taints):
                raise Refused(f"{p.sched_node} carries no taint of proposal {p.id}: not ours, "
                              "not uncordoned")
            rest = [t for t in taints if t["key"] != self.TAINT]
            self.api.patch_node(p.sched_node, {"spec": {"unschedulable": False,
                                                        "taints": _clean(rest)}})
            self.api.patch_node_status(p.sched_node, {"status": {"conditions": [
                self._condition("False", "Undone", f"hypertrace proposal {p.id} undone")]}})
            return f"{p.sched_node}: our taint removed, uncordoned"
        return self._call(act)


def _clean(taints: list[dict]) -> list[dict]:
    return [{k: v for k, v in t.items() if v is not None} for t in taints]


#: Settings of the backends, beside the policy's in the ``[evict]`` table.
BACKEND_KEYS = ("command", "url", "secret_file", "ca_file", "scontrol", "requeue", "kubeconfig",
                "kube_context", "timeout_s", "retries", "retry_base_s")


def make_backend(name: str, settings: dict[str, Any]) -> Backend:
    """The configured backend; ConfigError naming the missing setting."""
    retry = Retry(int(settings.get("retries", 3)), float(settings.get("retry_base_s", 1.0)),
                  float(settings.get("timeout_s", 30.0)))
    if name == "none":
        return NoBackend()
    if name == "slurm":
        return SlurmBackend(str(settings.get("scontrol", "scontrol")), retry,
                            bool(settings.get("requeue", False)))
    if name == "exec":
        cmd = settings.get("command")
        if not cmd or not isinstance(cmd, list):
            raise ConfigError('evict.command must be a list, e.g. ["/usr/local/bin/drain"]')
        return ExecBackend([str(c) for c in cmd], retry)
    if name == "webhook":
        url, secret_file = settings.get("url", ""), settings.get("secret_file", "")
        if not str(url).startswith("https://"):
            raise ConfigError("evict.url must be an https:// URL for the webhook backend")
        try:
            secret = open(secret_file, "rb").read().strip()
        except OSError as exc:
            raise ConfigError(f"evict.secret_file {secret_file!r} cannot be read "
                              f"({exc.strerror})") from None
        return WebhookBackend(str(url), secret, str(settings.get("ca_file", "")), retry)
    if name == "kubernetes":
        try:
            import kubernetes  # noqa: F401
        except ImportError:
            raise ConfigError("evict.backend kubernetes needs the official client: pip install "
                              "'hypertrace[kubernetes]' (or kubernetes)") from None
        return KubernetesBackend.connect(str(settings.get("kubeconfig", "")),
                                         str(settings.get("kube_context", "")), retry=retry)
    raise ConfigError(f"evict.backend {name!r}: one of none, slurm, exec, webhook, kubernetes")
