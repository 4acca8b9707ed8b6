"""The worker pool: math answers are verified in persistent child processes, each call under a time limit.

verl calls the reward from worker threads and asyncio executors. math-verify's own timeout relies on
``signal.alarm`` (main thread only), and sympy can spin for minutes or eat all memory on an adversarial answer;
a thread cannot be interrupted. So each answer goes to a small pool of persistent worker *processes* (plain
``subprocess`` children running :func:`serve`), each call waits on its worker's pipe with its own wall-clock
limit, and a worker that overruns is killed and replaced. The parent side never raises and never waits longer
than its limits. Standard library only at import time: the workers start in well under a second.

Knobs (environment variables): ``EXGRPO_REWARD_TIMEOUT_S`` (limit on one verification, default 30 s),
``EXGRPO_REWARD_QUEUE_TIMEOUT_S`` (limit on waiting for a free or starting worker, default 120 s),
``EXGRPO_REWARD_WORKERS`` (pool size, default min(8, CPU count)), ``EXGRPO_REWARD_MEM_MB`` (address-space cap of
each worker, default 4096), ``EXGRPO_REWARD_MAX_CALLS`` (calls before a worker is recycled, default 20000).
"""

from __future__ import annotations

import atexit
import json
import os
import select
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from exgrpo.verifier.precheck import PRECHECK_STATE, PrecheckRejected, install_precheck
from exgrpo.verifier.shared import PRED_CHARS, RESULT_KEYS, score_result  # noqa: F401 - importable from here too


def _env_number(name: str, default: float, cast: type = float) -> Any:
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return cast(default)
    try:
        return cast(raw)
    except ValueError as exc:
        raise ValueError(f"environment variable {name}={raw!r} is not a valid {cast.__name__}") from exc


# The slowest legitimate grade measured is a correct Minerva ODE answer written scaled by 2, which math-verify
# compares by solving both equations: 9.1 s on an idle core, 13.7 s (median of 5) at load 3 on the 2-core box
# (`benchmarks/verifier_adversarial.py --legit`; the figures: `git show 4da1df5:benchmarks/README.md`, "Verifier
# pre-check"). 30 s keeps twice that margin, so a busy machine does not turn slow correct answers into
# zeros (10 s did). Pathological answers no longer wait for it: the pre-check rejects them in milliseconds.
DEFAULT_TIMEOUT_S = _env_number("EXGRPO_REWARD_TIMEOUT_S", 30.0)
DEFAULT_QUEUE_TIMEOUT_S = _env_number("EXGRPO_REWARD_QUEUE_TIMEOUT_S", 120.0)
DEFAULT_WORKERS = _env_number("EXGRPO_REWARD_WORKERS", min(8, os.cpu_count() or 1), int)
DEFAULT_WORKER_MEM_MB = _env_number("EXGRPO_REWARD_MEM_MB", 4096, int)
# A worker is replaced after this many calls: sympy/math-verify caches only grow during a week-long run.
DEFAULT_WORKER_MAX_CALLS = _env_number("EXGRPO_REWARD_MAX_CALLS", 20000, int)


# ----------------------------------------------------------------------------------------------- math, worker side
def serve() -> None:  # pragma: no cover - runs in the worker process (exercised through the pool in tests)
    """Worker loop: one JSON request per stdin line, one JSON reply per line on the protocol pipe."""
    protocol = os.fdopen(os.dup(1), "w", buffering=1, encoding="ascii")
    os.dup2(2, 1)  # anything a library prints goes to stderr, never into the protocol stream
    sys.stdout = sys.stderr
    import logging

    logging.getLogger("math_verify").setLevel(logging.ERROR)
    import math_verify.parser
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    from exgrpo.verifier.boxed import boxed_score

    if not install_precheck(math_verify.parser):
        print("exgrpo.verifier: this math-verify has no parse_latex_cached/parse_expr_cached; answers are not "
              "pre-checked, only the time limit protects the workers", file=sys.stderr)

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

    def grade(gold: str, answer: str, precheck: bool = True) -> dict[str, Any]:
        parsed_gold = gold_cache.get(gold)
        if parsed_gold is None:
            parsed_gold = parse("\\boxed{" + gold + "}", extraction_config=gold_config, parsing_timeout=None)
            if len(gold_cache) > 4096:
                gold_cache.clear()
            gold_cache[gold] = parsed_gold
        if not parsed_gold:
            return score_result(error="ground truth could not be parsed")
        PRECHECK_STATE["on"] = precheck
        try:
            parsed = parse(answer, extraction_config=pred_config, parsing_timeout=None)
        except PrecheckRejected as exc:
            return score_result(error=f"pre-check: {exc}")
        finally:
            PRECHECK_STATE["on"] = False
        if not parsed:
            return score_result(error="no answer found")
        correct = verify(parsed_gold, parsed, timeout_seconds=None)
        shown = next((p for p in reversed(parsed) if isinstance(p, str)), "")
        return score_result(1.0 if correct else 0.0, pred=shown)

    def grade_paper(gold: str, answer: str) -> dict[str, Any]:
        score, answer_graded = boxed_score(answer, gold)
        return score_result(score, pred=answer_graded, error="" if answer_graded else "no \\boxed{} answer")

    # Both graders warmed before declaring readiness, so that no timed call pays for it: math-verify's lazily built
    # grammars, and the authors' grader's pylatexenc and sympy imports (~0.2 s, else inside its 1-second limits).
    # The paper answer is wrong on purpose, so that all three of its comparisons run; should that grader fail here,
    # the worker still serves ours, and a paper request reports the failure as its error.
    grade("1", "\\boxed{1}")
    try:
        grade_paper("x+1", "\\boxed{\\frac{x}{2}}")
    except Exception:  # noqa: BLE001 - see above
        pass
    protocol.write('{"ready": true}\n')
    for line in sys.stdin:
        try:
            request = json.loads(line)
            if request.get("grader") == "paper":
                reply = grade_paper(request["gold"], request["answer"])
            else:
                reply = grade(request["gold"], request["answer"], bool(request.get("precheck", True)))
        except MemoryError:
            reply = score_result(error="worker memory limit")
        except Exception as exc:  # noqa: BLE001 - a grading failure is a zero, never a crash of the worker
            reply = score_result(error=f"{type(exc).__name__}: {exc}")
        try:
            protocol.write(json.dumps(reply) + "\n")
        except (ValueError, OSError):
            return


# The worker imports this module by name, from the folder that holds the package (also when the package is not
# installed: verl may load the reward by file path from a checkout).
_PACKAGE_PARENT = str(Path(__file__).resolve().parents[2])
_WORKER_BOOT = "import sys; sys.path.insert(0, sys.argv[1]); from exgrpo.verifier.workers import serve; serve()"


# ----------------------------------------------------------------------------------------------- math, parent side
class _Worker:
    def __init__(self) -> None:
        env = dict(os.environ)
        env.setdefault("OMP_NUM_THREADS", "1")
        env["PYTHONIOENCODING"] = "ascii"
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _WORKER_BOOT, _PACKAGE_PARENT],
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

    def grade(self, gold: str, answer: str, timeout_s: float, queue_timeout_s: float, precheck: bool = True,
              grader: str = "ours") -> dict[str, Any]:
        """Verify ``answer`` against ``gold`` in a worker; a zero with a reason on any failure or overrun.

        ``precheck`` makes the worker reject costly candidates (:func:`precheck_candidate`, :func:`precheck_tree`)
        instead of evaluating them. ``grader="paper"`` grades with the authors' evaluation grader
        (:mod:`exgrpo.verifier.boxed`) instead of math-verify alone, and without the pre-check. A worker found dead
        before it took the request (killed from outside, OOM-killed while idle) is not the answer's fault: it is
        replaced and the request retried once.
        """
        result, retry = self._grade_once(gold, answer, timeout_s, queue_timeout_s, precheck, grader)
        if retry:
            result, _ = self._grade_once(gold, answer, timeout_s, queue_timeout_s, precheck, grader)
        return result

    def _grade_once(self, gold: str, answer: str, timeout_s: float, queue_timeout_s: float, precheck: bool = True,
                    grader: str = "ours") -> tuple[dict[str, Any], bool]:
        worker = self._acquire(time.monotonic() + queue_timeout_s)
        if worker is None:
            return score_result(error="no verifier worker available"), False
        healthy = False
        try:
            if not worker.ready:
                line = worker.read_line(time.monotonic() + queue_timeout_s)
                if line is None:
                    # exited while starting (killed from outside, or it cannot start at all): one retry on a
                    # fresh worker tells the two apart, as for a worker found dead below
                    return score_result(error="verifier worker failed to start"), worker.proc.poll() is not None
                worker.ready = True
            if worker.proc.poll() is not None:
                return score_result(error="verifier worker died"), True
            request = {"gold": gold, "answer": answer, "precheck": precheck, "grader": grader}
            payload = (json.dumps(request) + "\n").encode("ascii")
            deadline = time.monotonic() + timeout_s
            try:
                worker.proc.stdin.write(payload)
                worker.proc.stdin.flush()
            except (BrokenPipeError, OSError, ValueError):
                return score_result(error="verifier worker died"), True
            line = worker.read_line(deadline)
            if line is None:
                if worker.proc.poll() is None and time.monotonic() >= deadline:
                    return score_result(timeout=True, error=f"verification exceeded {timeout_s:g} s"), False
                return score_result(error="verifier worker died"), False
            reply = json.loads(line)
            healthy = True
            return score_result(reply.get("score", 0.0), reply.get("pred", ""), False, reply.get("error", "")), False
        except Exception as exc:  # noqa: BLE001 - never raise into verl's reward loop
            return score_result(error=f"{type(exc).__name__}: {exc}"), False
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


