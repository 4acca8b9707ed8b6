"""Verifiable reward for ExGRPO: math answers via math-verify, multiple choice by letter.

verl calls ``compute_score`` once per rollout, from worker threads and asyncio executors. math-verify's own
timeout relies on ``signal.alarm`` (main thread only) and sympy can spin for minutes or eat all memory on an
adversarial answer such as ``\\boxed{9^{9^{9^{9}}}}``; a thread cannot be interrupted. So math answers are
verified in a small pool of persistent worker *processes* (plain ``subprocess`` children that load this very
file), each call waits on its worker's pipe with its own wall-clock limit, and a worker that overruns is killed
and replaced. The parent side never raises and never waits longer than its limits.

This file is deliberately self-contained (standard library only at import time): verl loads it by file path
(``reward.custom_reward_function.path``), outside the ``exgrpo`` package, and the workers load it the same way.

Knobs (keyword arguments, e.g. verl's ``reward.custom_reward_function.reward_kwargs``, or environment variables):
``timeout_s`` / ``EXGRPO_REWARD_TIMEOUT_S`` (limit on one verification, default 10 s),
``queue_timeout_s`` / ``EXGRPO_REWARD_QUEUE_TIMEOUT_S`` (limit on waiting for a free or starting worker,
default 120 s), ``think_end_tag`` (default ``</think>``; ``None`` or ``""`` scores the whole response),
``strict_format`` (default False: a response without the tag scores 0 instead of being scored whole),
``EXGRPO_REWARD_WORKERS`` (pool size, default min(8, CPU count)), ``EXGRPO_REWARD_MEM_MB`` (address-space cap
of each worker, default 4096), ``EXGRPO_REWARD_MAX_CALLS`` (calls before a worker is recycled, default 20000).
"""

from __future__ import annotations

import asyncio
import atexit
import json
import os
import re
import select
import subprocess
import sys
import threading
import time
from typing import Any

THINK_END_TAG = "</think>"


def _env_number(name: str, default: float, cast: type = float) -> Any:
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return cast(default)
    try:
        return cast(raw)
    except ValueError as exc:
        raise ValueError(f"environment variable {name}={raw!r} is not a valid {cast.__name__}") from exc


DEFAULT_TIMEOUT_S = _env_number("EXGRPO_REWARD_TIMEOUT_S", 10.0)
DEFAULT_QUEUE_TIMEOUT_S = _env_number("EXGRPO_REWARD_QUEUE_TIMEOUT_S", 120.0)
DEFAULT_WORKERS = _env_number("EXGRPO_REWARD_WORKERS", min(8, os.cpu_count() or 1), int)
DEFAULT_WORKER_MEM_MB = _env_number("EXGRPO_REWARD_MEM_MB", 4096, int)
# A worker is replaced after this many calls: sympy/math-verify caches only grow during a week-long run.
DEFAULT_WORKER_MAX_CALLS = _env_number("EXGRPO_REWARD_MAX_CALLS", 20000, int)
PRED_CHARS = 200  # diagnostic "pred" is clipped: it ends up in verl's per-sample metrics arrays

# Multiple-choice benchmarks, by normalised data_source prefix. Everything else is graded as math.
MULTIPLE_CHOICE_PREFIXES = ("arc", "gpqa", "mmlu", "ai2_arc", "mc_")

RESULT_KEYS = ("score", "acc", "pred", "timeout", "error")


def _result(score: float = 0.0, pred: str = "", timeout: bool = False, error: str = "") -> dict[str, Any]:
    # verl stacks every key of every sample into one array per key, so all results carry the same keys/types.
    return {"score": float(score), "acc": bool(score == 1.0), "pred": pred[:PRED_CHARS], "timeout": bool(timeout),
            "error": error[:PRED_CHARS]}


def is_multiple_choice(data_source: str) -> bool:
    """Whether ``data_source`` names a multiple-choice benchmark (graded by option label, not math-verify)."""
    name = str(data_source).strip().lower().replace("-", "_").replace("/", "_")
    return name.startswith(MULTIPLE_CHOICE_PREFIXES)


def answer_section(solution_str: str, think_end_tag: str | None = THINK_END_TAG,
                   strict_format: bool = False) -> str | None:
    """The part of a response that holds the final answer: the text after the first ``think_end_tag``.

    Reasoning inside the thought section often contains trial answers; grading only the solution section stops
    a model from being rewarded for a guess it then rejected. Without the tag the whole response is graded,
    unless ``strict_format``, the authors' rule: then the thought section must be closed (``None`` otherwise: no
    gradable answer) and the solution ends at a second tag, if the response has one.
    """
    if not think_end_tag:
        return solution_str
    head, sep, tail = solution_str.partition(think_end_tag)
    if sep:
        return tail.partition(think_end_tag)[0] if strict_format else tail
    return None if strict_format else solution_str


# ----------------------------------------------------------------------------------------------- multiple choice
_BOXED_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")
_WRAPPER_RE = re.compile(r"\\(?:text|textbf|mathrm|mathbf|textit|mbox)\s*\{([^{}]{0,80})\}")
_BOXED_LABEL_RE = re.compile(r"^\s*[\(\[]?\s*([A-Za-z]|\d{1,2})\s*[\)\]]?\s*(?:[.:)\-]\s*.*|\s+.*)?$", re.S)
_TEXT_LABEL_RE = re.compile(
    r"answer\s*(?:is|:)?\s*[:\-]?\s*(?:option\s*)?\**\s*[\(\[]?\s*\**\s*([A-Z]|\d{1,2})\s*\**\s*[\)\]]?(?![A-Za-z0-9])",
    re.I,
)


def _boxed_contents(text: str, max_inner: int = 400) -> list[str]:
    """Contents of every ``\\boxed{...}`` (balanced braces, bounded scan so 100 kB of braces stays linear)."""
    found = []
    for match in _BOXED_RE.finditer(text):
        depth, start = 1, match.end()
        stop = min(len(text), start + max_inner)
        for pos in range(start, stop):
            char = text[pos]
            if char == "{":
                depth += 1
            elif char == "}":
                depth -= 1
                if depth == 0:
                    found.append(text[start:pos])
                    break
    return found


def extract_choice(text: str) -> str | None:
    """The option label a response commits to: its last ``\\boxed{X}``, else its last "the answer is (X)".

    Labels are letters (A-J, upper-cased) or small integers (ARC-Challenge has a few questions labelled 1-4).
    ``ANSWER: X`` (the GPQA prompt's requested format) and ``Answer: **X**`` count as the textual form.
    """
    for inner in reversed(_boxed_contents(text)):
        for _ in range(3):  # peel \text{\textbf{C}} and friends
            peeled = _WRAPPER_RE.sub(r"\1", inner)
            if peeled == inner:
                break
            inner = peeled
        match = _BOXED_LABEL_RE.match(inner)
        if match:
            return match.group(1).upper()
    last = None
    for match in _TEXT_LABEL_RE.finditer(text[-20000:]):
        label = match.group(1)
        if label.isdigit() or label.isupper():
            last = label
    return last


def _score_choice(answer: str, ground_truth: str) -> dict[str, Any]:
    gold = str(ground_truth).strip().strip("()").strip().upper()
    if not re.fullmatch(r"[A-Z]|\d{1,2}", gold):
        return _result(error=f"multiple-choice ground truth {ground_truth!r} is not an option label")
    pred = extract_choice(answer)
    if pred is None:
        return _result(error="no option label found")
    return _result(1.0 if pred == gold else 0.0, pred=pred)


# ----------------------------------------------------------------------------------------------- math, worker side
def _serve() -> None:  # pragma: no cover - runs in the worker process (exercised through the pool in tests)
    """Worker loop: one JSON request per stdin line, one JSON reply per line on the protocol pipe."""
    protocol = os.fdopen(os.dup(1), "w", buffering=1, encoding="ascii")
    os.dup2(2, 1)  # anything a library prints goes to stderr, never into the protocol stream
    sys.stdout = sys.stderr
    import logging

    logging.getLogger("math_verify").setLevel(logging.ERROR)
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    mem_mb = DEFAULT_WORKER_MEM_MB
    if mem_mb > 0:
        try:
            import resource

            resource.setrlimit(resource.RLIMIT_AS, (mem_mb << 20, mem_mb << 20))
        except (ImportError, ValueError, OSError):
            pass
    gold_config = [LatexExtractionConfig(), ExprExtractionConfig()]
    pred_config = [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()]
    gold_cache: dict[str, list] = {}

    def grade(gold: str, answer: str) -> dict[str, Any]:
        parsed_gold = gold_cache.get(gold)
        if parsed_gold is None:
            parsed_gold = parse("\\boxed{" + gold + "}", extraction_config=gold_config, parsing_timeout=None)
            if len(gold_cache) > 4096:
                gold_cache.clear()
            gold_cache[gold] = parsed_gold
        if not parsed_gold:
            return _result(error="ground truth could not be parsed")
        parsed = parse(answer, extraction_config=pred_config, parsing_timeout=None)
        if not parsed:
            return _result(error="no answer found")
        correct = verify(parsed_gold, parsed, timeout_seconds=None)
        shown = next((p for p in reversed(parsed) if isinstance(p, str)), "")
        return _result(1.0 if correct else 0.0, pred=shown)

    grade("1", "\\boxed{1}")  # warm math-verify's lazily built grammars before declaring readiness
    protocol.write('{"ready": true}\n')
    for line in sys.stdin:
        try:
            request = json.loads(line)
            reply = grade(request["gold"], request["answer"])
        except MemoryError:
            reply = _result(error="worker memory limit")
        except Exception as exc:  # noqa: BLE001 - a grading failure is a zero, never a crash of the worker
            reply = _result(error=f"{type(exc).__name__}: {exc}")
        try:
            protocol.write(json.dumps(reply) + "\n")
        except (ValueError, OSError):
            return


_WORKER_BOOT = (
    "import importlib.util, sys\n"
    "spec = importlib.util.spec_from_file_location('_exgrpo_reward_worker', sys.argv[1])\n"
    "module = importlib.util.module_from_spec(spec)\n"
    "spec.loader.exec_module(module)\n"
    "module._serve()\n"
)


# ----------------------------------------------------------------------------------------------- math, parent side
class _Worker:
    def __init__(self) -> None:
        env = dict(os.environ)
        env.setdefault("OMP_NUM_THREADS", "1")
        env["PYTHONIOENCODING"] = "ascii"
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _WORKER_BOOT, os.path.abspath(__file__)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=None, env=env, close_fds=True,
            start_new_session=True,  # a Ctrl-C to the trainer's process group is the trainer's business
        )
        self.buffer = bytearray()
        self.ready = False
        self.calls = 0
        # poll, not select: select fails on descriptors >= 1024, common in Ray workers with many sockets
        self.poller = select.poll()
        self.poller.register(self.proc.stdout.fileno(), select.POLLIN)

    def read_line(self, deadline: float) -> bytes | None:
        """One protocol line, or None when the deadline passes or the worker dies."""
        fd = self.proc.stdout.fileno()
        while True:
            newline = self.buffer.find(b"\n")
            if newline >= 0:
                line = bytes(self.buffer[:newline])
                del self.buffer[: newline + 1]
                return line
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            if not self.poller.poll(max(1, int(remaining * 1000))):
                continue  # re-check the deadline (poll rounds to milliseconds)
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return None
            self.buffer += chunk

    def kill(self) -> None:
        try:
            self.proc.kill()
        except OSError:
            pass
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except OSError:
                pass
        try:
            self.proc.wait(timeout=5)
        except (subprocess.TimeoutExpired, OSError):
            pass


class VerifierPool:
    """Persistent math-verify worker processes shared by all threads of this process.

    A worker serves one call at a time. Workers start lazily (at most ``max_workers``), are replaced after a
    timeout or crash, and exit on their own when this process dies (their stdin closes).
    """

    def __init__(self, max_workers: int = DEFAULT_WORKERS, max_calls_per_worker: int = DEFAULT_WORKER_MAX_CALLS
                 ) -> None:
        if max_workers < 1:
            raise ValueError(f"max_workers must be >= 1, got {max_workers}")
        if max_calls_per_worker < 1:
            raise ValueError(f"max_calls_per_worker must be >= 1, got {max_calls_per_worker}")
        self.max_workers = max_workers
        self.max_calls_per_worker = max_calls_per_worker
        self.pid = os.getpid()
        self._idle: list[_Worker] = []
        self._alive = 0
        self._cond = threading.Condition()
        self._closed = False
        self.restarts = 0

    def _acquire(self, deadline: float) -> _Worker | None:
        with self._cond:
            while True:
                if self._closed:
                    return None
                if self._idle:  # prefer a worker that has finished starting
                    ready = [i for i, worker in enumerate(self._idle) if worker.ready]
                    return self._idle.pop(ready[-1] if ready else -1)
                if self._alive < self.max_workers:
                    self._alive += 1
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not self._cond.wait(remaining):
                    if not self._idle and self._alive >= self.max_workers:
                        return None
        try:
            return _Worker()
        except Exception:  # noqa: BLE001 - cannot start a process: report "no worker", keep the count right
            with self._cond:
                self._alive -= 1
                self._cond.notify()
            return None

    def _release(self, worker: _Worker, healthy: bool) -> None:
        worker.calls += 1
        retire = healthy and worker.calls >= self.max_calls_per_worker
        if not healthy or retire:
            worker.kill()
            self.restarts += int(not healthy)
            try:  # start the replacement now: it imports math-verify while nobody waits for it
                worker = _Worker()
            except Exception:  # noqa: BLE001
                worker = None
        with self._cond:
            if worker is not None and not self._closed:
                self._idle.append(worker)
                worker = None
            else:
                self._alive -= 1
            self._cond.notify()
        if worker is not None:
            worker.kill()

    def grade(self, gold: str, answer: str, timeout_s: float, queue_timeout_s: float) -> dict[str, Any]:
        """Verify ``answer`` against ``gold`` in a worker; a zero with a reason on any failure or overrun.

        A worker found dead before it took the request (killed from outside, OOM-killed while idle) is not the
        answer's fault: it is replaced and the request retried once.
        """
        result, retry = self._grade_once(gold, answer, timeout_s, queue_timeout_s)
        if retry:
            result, _ = self._grade_once(gold, answer, timeout_s, queue_timeout_s)
        return result

    def _grade_once(self, gold: str, answer: str, timeout_s: float, queue_timeout_s: float
                    ) -> tuple[dict[str, Any], bool]:
        worker = self._acquire(time.monotonic() + queue_timeout_s)
        if worker is None:
            return _result(error="no verifier worker available"), False
        healthy = False
        try:
            if not worker.ready:
                line = worker.read_line(time.monotonic() + queue_timeout_s)
                if line is None:
                    return _result(error="verifier worker failed to start"), False
                worker.ready = True
            if worker.proc.poll() is not None:
                return _result(error="verifier worker died"), True
            payload = (json.dumps({"gold": gold, "answer": answer}) + "\n").encode("ascii")
            deadline = time.monotonic() + timeout_s
            try:
                worker.proc.stdin.write(payload)
                worker.proc.stdin.flush()
            except (BrokenPipeError, OSError, ValueError):
                return _result(error="verifier worker died"), True
            line = worker.read_line(deadline)
            if line is None:
                if worker.proc.poll() is None and time.monotonic() >= deadline:
                    return _result(timeout=True, error=f"verification exceeded {timeout_s:g} s"), False
                return _result(error="verifier worker died"), False
            reply = json.loads(line)
            healthy = True
            return _result(reply.get("score", 0.0), reply.get("pred", ""), False, reply.get("error", "")), False
        except Exception as exc:  # noqa: BLE001 - never raise into verl's reward loop
            return _result(error=f"{type(exc).__name__}: {exc}"), False
        finally:
            self._release(worker, healthy)

    def warm_up(self, n: int | None = None, timeout_s: float = DEFAULT_QUEUE_TIMEOUT_S) -> None:
        """Start ``n`` workers now (default all) so the first training step does not pay their start-up."""
        count = self.max_workers if n is None else min(n, self.max_workers)
        threads = [threading.Thread(target=self.grade, args=("1", "\\boxed{1}", timeout_s, timeout_s))
                   for _ in range(count)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
            self._alive -= len(idle)
            self._cond.notify_all()
        for worker in idle:
            worker.kill()


_POOL: VerifierPool | None = None
_POOL_LOCK = threading.Lock()


def get_pool() -> VerifierPool:
    """This process's verifier pool (a forked child gets its own, never its parent's pipes)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None or _POOL.pid != os.getpid():
            _POOL = VerifierPool()
        return _POOL


def shutdown() -> None:
    """Stop this process's verifier workers (also registered with atexit)."""
    global _POOL
    with _POOL_LOCK:
        pool, _POOL = _POOL, None
    if pool is not None and pool.pid == os.getpid():
        pool.close()


atexit.register(shutdown)


# ----------------------------------------------------------------------------------------------- entry points
def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None,
                  **kwargs: Any) -> dict[str, Any]:
    """verl custom reward: ``{"score": 0.0|1.0, "acc", "pred", "timeout", "error"}``; never raises or hangs.

    Extra keyword arguments verl passes (reward-router handles, ...) are accepted and ignored.
    """
    try:
        think_end_tag = kwargs.get("think_end_tag", THINK_END_TAG)
        strict_format = bool(kwargs.get("strict_format", False))
        timeout_s = float(kwargs.get("timeout_s", DEFAULT_TIMEOUT_S))
        queue_timeout_s = float(kwargs.get("queue_timeout_s", DEFAULT_QUEUE_TIMEOUT_S))
        if not isinstance(solution_str, str):
            return _result(error=f"solution_str is {type(solution_str).__name__}, not str")
        if hasattr(ground_truth, "tolist") and not isinstance(ground_truth, str):  # numpy scalar or array
            ground_truth = ground_truth.tolist()
        if isinstance(ground_truth, (list, tuple)) and len(ground_truth) == 1:
            ground_truth = ground_truth[0]
        if ground_truth is None or (isinstance(ground_truth, str) and not ground_truth.strip()):
            return _result(error="empty ground truth")
        answer = answer_section(solution_str, think_end_tag, strict_format)
        if answer is None:
            return _result(error=f"no {think_end_tag} in response (strict_format)")
        if not answer.strip():
            return _result(error="empty answer")
        if is_multiple_choice(data_source):
            return _score_choice(answer, str(ground_truth))
        return get_pool().grade(str(ground_truth), answer, timeout_s, queue_timeout_s)
    except Exception as exc:  # noqa: BLE001 - a reward function that raises kills a training run
        return _result(error=f"{type(exc).__name__}: {exc}")


async def compute_score_async(data_source: str, solution_str: str, ground_truth: Any,
                              extra_info: dict | None = None, **kwargs: Any) -> dict[str, Any]:
    """Coroutine form (verl awaits coroutine reward functions on its event loop instead of using a thread)."""
    return await asyncio.to_thread(compute_score, data_source, solution_str, ground_truth, extra_info, **kwargs)


def measure_overhead(n_calls: int = 300) -> dict[str, float]:
    """Per-call cost of the process pool: same answers graded through compute_score and in-process.

    The difference is what isolation costs (pipe round trip, JSON, thread hand-off); gold parses are cached
    in the workers, so the in-process baseline caches them too.
    """
    import logging

    logging.getLogger("math_verify").setLevel(logging.ERROR)
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    filler = "We expand, collect like terms and check the boundary cases. " * 30
    cases = [(str(k), f"<think>{filler}</think>\nSo the answer is \\boxed{{\\frac{{{2 * k}}}{{2}}}}.")
             for k in range(1, 21)]
    pool = get_pool()
    pool.warm_up(1)
    for gold, response in cases:  # warm the worker's gold cache, like the in-process cache below
        compute_score("math", response, gold)
    start = time.perf_counter()
    for i in range(n_calls):
        gold, response = cases[i % len(cases)]
        assert compute_score("math", response, gold)["score"] == 1.0
    pooled = (time.perf_counter() - start) / n_calls
    gold_config = [LatexExtractionConfig(), ExprExtractionConfig()]
    pred_config = [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()]
    golds = {gold: parse("\\boxed{" + gold + "}", gold_config, parsing_timeout=None) for gold, _ in cases}
    start = time.perf_counter()
    for i in range(n_calls):
        gold, response = cases[i % len(cases)]
        answer = answer_section(response)
        assert verify(golds[gold], parse(answer, pred_config, parsing_timeout=None), timeout_seconds=None)
    direct = (time.perf_counter() - start) / n_calls
    return {"pooled_ms": 1e3 * pooled, "in_process_ms": 1e3 * direct, "overhead_ms": 1e3 * (pooled - direct)}


if __name__ == "__main__":  # python exgrpo/reward.py: measure the pool's per-call overhead
    print(json.dumps(measure_overhead(), indent=1))
