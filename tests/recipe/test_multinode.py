"""Two Ray nodes on one host, and the 7B paper script's CPU twin through them as through a two-node cluster.

The cluster is started the way Ray starts one on several machines: ``ray start --head`` and ``ray start
--address=HEAD``, each with its own CPUs and one fake GPU (``--num-gpus 1``), each in its own working directory and
its own session, so killing a node's session is that node's loss (raylet, workers, vLLM server, agents). The run is
the command a user types on the head, ``RAY_ADDRESS=... NNODES=2 N_GPUS_PER_NODE=1 EXGRPO_DEVICE=cpu bash
run_scripts/qwen2.5_math_7b_exgrpo.sh``: verl places one FSDP rank and one vLLM server on each node (each node has
one GPU bundle to give). It trains, replays and checkpoints; a worker node is killed mid-run, then the whole
cluster, and after each the same command resumes with the pool the last checkpoint saved (same state digest). The
start-up storage check refuses a checkpoint folder a node sees elsewhere. Several launches of verl on two cores and
two Ray nodes: marked slow.
"""

from __future__ import annotations

import json
import os
import queue
import re
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("verl")
pytest.importorskip("vllm")

from test_cpu_verl_e2e import (  # noqa: E402
    _USER_ENV,
    PAPER,
    TIMEOUT_S,
    Run,
    assert_clean_exit,
    printed_digests,
    run_job,
    tiny_task_and_model,  # noqa: F401  (the module fixture that builds the model outside the time limits)
    train_steps,
)

pytestmark = pytest.mark.slow

RAY = str(Path(sys.executable).parent / "ray")
NODE_CPUS = 8  # logical slots per node for verl's actors (the CPU profile gives a one-node run 16)
NODE_READY_S = 120
EXIT_AFTER_KILL_S = 300  # how long a run may take to stop after a node it uses died


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RayNode:
    """One ``ray start ... --block`` in its own session: the node's processes share it and die with it."""

    def __init__(self, name: str, workdir: Path, args: list[str], auth: dict[str, str]) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.name, self.workdir = name, workdir
        self.log = workdir / f"ray_start_{name}_{time.time_ns()}.log"
        env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS",)}
        env.update(RAY_USAGE_STATS_ENABLED="0", **auth)
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen([RAY, "start", *args, "--block"], cwd=workdir, env=env, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)

    def kill(self) -> None:
        """SIGKILL every process of the node's session (Ray puts each worker in a process group of its own, in the
        session of the ``ray start`` that started its raylet)."""
        session = self.proc.pid
        for pid in session_pids(session):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait()


def session_pids(session: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.getsid(int(entry)) == session:
                    pids.append(int(entry))
            except (ProcessLookupError, PermissionError):
                continue
    return pids


class TwoNodeCluster:
    """A head node and one worker node on this host (joined at 127.0.0.1), one fake GPU and NODE_CPUS CPUs each."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = _free_port()
        self.address = f"127.0.0.1:{self.port}"
        # Ray 2.60 authenticates cluster RPCs with a token when asked to (a head started where ~/.ray/auth_token
        # exists turns it on by itself, and a driver given an explicit address then needs it): one token for every
        # node and driver, in the environment, so the run does not depend on what ~/.ray holds.
        self.auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
        self.head: RayNode | None = None
        self.worker: RayNode | None = None

    def _resources(self) -> list[str]:
        return [f"--num-cpus={NODE_CPUS}", "--num-gpus=1",
                "--object-store-memory=500000000", "--disable-usage-stats"]

    def start(self) -> None:
        self.head = RayNode("head", self.root / "head", ["--head", f"--port={self.port}", "--include-dashboard=false",
                                                         *self._resources()], self.auth)
        self.wait_nodes(1)
        self.start_worker()

    def start_worker(self) -> None:
        self.worker = RayNode("worker", self.root / "worker", [f"--address={self.address}", *self._resources()],
                              self.auth)
        self.wait_nodes(2)

    def alive_nodes(self) -> list[dict]:
        script = ("import json, sys, ray; ray.init(address=sys.argv[1], log_to_driver=False); "
                  "print(json.dumps([{'id': n['NodeID'], 'head': 'node:__internal_head__' in n['Resources'], "
                  "'gpus': n['Resources'].get('GPU', 0)} for n in ray.nodes() if n['Alive']]))")
        env = {**{k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}, **self.auth}
        result = subprocess.run([sys.executable, "-c", script, self.address], capture_output=True, text=True,
                                env=env, timeout=120)
        if result.returncode != 0:
            self.last_error = result.stderr[-2000:]
            return []
        return json.loads(result.stdout.strip().splitlines()[-1])

    def wait_nodes(self, n: int) -> list[dict]:
        deadline = time.monotonic() + NODE_READY_S
        while time.monotonic() < deadline:
            nodes = self.alive_nodes()
            if len(nodes) == n:
                return nodes
            time.sleep(2)
        logs = "\n".join(node.log.read_text()[-2000:] for node in (self.head, self.worker) if node is not None)
        raise AssertionError(f"the cluster did not reach {n} alive node(s) in {NODE_READY_S} s\n{logs}\n"
                             f"{getattr(self, 'last_error', '')}")

    def kill_worker(self) -> None:
        self.worker.kill()

    def kill_all(self) -> None:
        for node in (self.worker, self.head):
            if node is not None:
                node.kill()

    def stop(self) -> None:
        """Kill both nodes, then whatever Ray left on this host (the heavy-run lock keeps other runs out)."""
        self.kill_all()
        subprocess.run([RAY, "stop", "--force"], capture_output=True, timeout=120)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    nodes = TwoNodeCluster(tmp_path_factory.mktemp("ray_nodes"))
    nodes.start()
    try:
        yield nodes
    finally:
        nodes.stop()


def two_node_env(cluster: TwoNodeCluster) -> dict[str, str]:
    return {"RAY_ADDRESS": cluster.address, "NNODES": "2", "N_GPUS_PER_NODE": "1", **cluster.auth}


def run_and_kill(workdir: Path, ckpt_dir: Path, name: str, kill_after: str, kill, *overrides: str,
                 env_extra: dict[str, str]) -> tuple[Run, float]:
    """The paper twin as a user starts it; when a line matches ``kill_after``, call ``kill`` (a node's loss) and
    wait for the run to stop by itself. Returns the run and the seconds it took to exit after the kill."""
    workdir.mkdir(parents=True, exist_ok=True)
    metrics_file = workdir / f"{name}.jsonl"
    env = {k: v for k, v in os.environ.items() if k not in _USER_ENV}
    env.update(EXGRPO_DEVICE="cpu", CKPT_DIR=os.path.relpath(ckpt_dir, workdir),
               VERL_FILE_LOGGER_PATH=str(metrics_file), **env_extra)
    proc = subprocess.Popen(["bash", os.path.relpath(PAPER, workdir), *overrides], cwd=workdir, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    output, killed_at, deadline, pattern = [], None, time.monotonic() + TIMEOUT_S, re.compile(kill_after)
    try:
        while True:
            limit = deadline if killed_at is None else killed_at + EXIT_AFTER_KILL_S
            try:
                line = lines.get(timeout=max(0.1, limit - time.monotonic()))
            except queue.Empty:
                break
            if line is None:
                break
            output.append(line)
            if killed_at is None and pattern.search(line):
                kill()
                killed_at = time.monotonic()
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    text = "".join(output)
    (workdir / f"{name}.log").write_text(text)
    assert killed_at is not None, f"{name}: never saw {kill_after!r}\n{text[-4000:]}"
    exited = proc.poll() is not None and proc.returncode != -signal.SIGKILL
    assert exited, f"{name}: still running {EXIT_AFTER_KILL_S} s after the kill (killed)\n{text[-4000:]}"
    metrics: dict[int, dict[str, float]] = {}
    if metrics_file.exists():
        for row in map(json.loads, metrics_file.read_text().splitlines()):
            metrics.setdefault(int(row["step"]), {}).update(row["data"])
    return Run(proc.returncode, text, metrics), time.monotonic() - killed_at


def latest(root: Path) -> int:
    return int((root / "latest_checkpointed_iteration.txt").read_text())


def logged(step: int) -> str:
    """verl's console line of a finished step (printed after its checkpoint is complete)."""
    return rf"(?:^|\s)step:{step} - "


def test_a_checkpoint_folder_a_node_resolves_elsewhere_stops_start_up_in_one_line_naming_it(cluster, tmp_path):
    """verl's own kind of checkpoint folder, a relative one, given on the command line: the driver writes its marker
    under its working directory, each node's processes look under theirs (where that node's ``ray start`` ran), so
    the node finds no marker and the run stops before any worker starts, naming the folder and the node."""
    user = tmp_path / "user"
    user.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in _USER_ENV}
    env.update(EXGRPO_DEVICE="cpu", **two_node_env(cluster))
    started = time.monotonic()
    result = subprocess.run(["bash", os.path.relpath(PAPER, user), "trainer.default_local_dir=checkpoints/relative"],
                            cwd=user, env=env, capture_output=True, text=True, timeout=600)
    took = time.monotonic() - started
    assert (user / "checkpoints" / "relative" / ".exgrpo_storage_marker.json").is_file()
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == 2 and len(errors) == 1, (result.stdout[-3000:], result.stderr[-3000:])
    node_dirs = {str(cluster.root / name / "checkpoints" / "relative") for name in ("head", "worker")}
    match = re.match(r"error: checkpoint folder (\S+) \(trainer.default_local_dir\) is not the driver's on node "
                     r"\S+ \(Ray node ([0-9a-f]{8})\): it holds no marker", errors[0])
    assert match and match.group(1) in node_dirs, errors[0]
    assert match.group(2) in {node["id"][:8] for node in cluster.alive_nodes()}
    assert "Traceback" not in result.stderr and took < 300, took
    print(f"[multinode] refused in {took:.0f} s: {errors[0]}")


def test_two_nodes_train_replay_checkpoint_and_resume_after_a_worker_node_and_the_whole_cluster_die(cluster,
                                                                                                  tmp_path):
    """One command, three launches: killed with the worker node once step 4 is logged, rerun after the node is back
    and killed with the whole cluster once step 5 is logged, rerun after the cluster is back to the end (step 6).

    verl logs a step after its checkpoint is complete, so each kill lands in the next step, and the rerun must
    resume from the logged step with the very pool it saved (the digest the saving launch printed)."""
    user, ckpt = tmp_path / "user", tmp_path / "ckpt"
    args = ("trainer.total_training_steps=6", "trainer.save_freq=1", "trainer.test_freq=4")
    env = two_node_env(cluster)
    figures: dict[str, object] = {}

    # 1. Two nodes train, replay and checkpoint every step; verl keeps two actor checkpoints (the paper profile's
    # CKPT_KEEP) and the pools of the steps whose actor it removed go with them. The worker node dies in step 5.
    started = time.monotonic()
    run, figures["exit_after_worker_kill_s"] = run_and_kill(user, ckpt, "worker_killed", logged(4), cluster.kill_worker,
                                                            *args, env_extra=env)
    figures["first_launch_s"] = time.monotonic() - started
    assert train_steps(run, "exgrpo/fresh_acc") == [1, 2, 3, 4], sorted(run.metrics)
    assert "'nnodes': 2" in run.output and "'n_gpus_per_node': 1" in run.output
    assert "'loss_scale_factor': 1.5" in run.output  # 24 x 2 ranks / (4 x 8) sequences: both nodes counted
    assert any(run.metrics[s].get("exgrpo/inserted", 0) >= 1 for s in (1, 2, 3, 4)), run.metrics
    assert any(k.startswith("val-core/") for k in run.metrics[4])
    assert {p.name for p in (ckpt / "global_step_4" / "actor").glob("model_world_size_*")} == {
        "model_world_size_2_rank_0.pt", "model_world_size_2_rank_1.pt"}
    for step in (1, 2):
        folder = ckpt / f"global_step_{step}"
        assert not (folder / "actor").exists() and (folder / "exgrpo_actor_removed.json").is_file(), step
        assert not (folder / "exgrpo_pool.npz").exists(), step
    for step in (3, 4):
        folder = ckpt / f"global_step_{step}"
        assert (folder / "actor").is_dir() and (folder / "exgrpo_pool.npz").is_file(), step
    assert run.returncode != 0 and latest(ckpt) == 4  # verl does not carry on without a node: the run stops
    saved = printed_digests(run.output, "saved")
    assert sorted(saved) == [1, 2, 3, 4]

    # 2. The worker node back, the same command: it resumes with step 4's pool; the whole cluster dies in step 6.
    cluster.start_worker()
    run, figures["exit_after_cluster_kill_s"] = run_and_kill(user, ckpt, "cluster_killed", logged(5),
                                                             cluster.kill_all, *args, env_extra=env)
    assert printed_digests(run.output, "restored") == {4: saved[4]}, run.output[-3000:]
    assert train_steps(run, "exgrpo/fresh_acc") == [5]
    assert run.returncode != 0 and latest(ckpt) == 5
    saved.update(printed_digests(run.output, "saved"))

    # 3. The cluster restarted, the same command: resumes from step 5 with its pool and finishes.
    cluster.start()
    started = time.monotonic()
    run = run_job(user, ckpt, "finish", *args, env_extra=two_node_env(cluster))
    figures["last_launch_s"] = time.monotonic() - started
    assert_clean_exit(run)
    assert printed_digests(run.output, "restored") == {5: saved[5]}
    assert train_steps(run, "exgrpo/fresh_acc") == [6] and latest(ckpt) == 6
    assert run.metrics[6]["exgrpo/latch"] == 1.0
    # Each kept actor checkpoint has its pool; verl rotates only what one launch saved, so after the relaunches
    # steps 3-6 all stay, and only the two it removed in the first launch lost theirs.
    for step in range(1, 7):
        folder = ckpt / f"global_step_{step}"
        assert (folder / "actor").is_dir() == (folder / "exgrpo_pool.npz").is_file() == (step >= 3), step
        assert (folder / "exgrpo_actor_removed.json").is_file() == (step < 3), step
    figures["digests"] = {step: saved[step] for step in sorted(saved)}
    (tmp_path / "figures.json").write_text(json.dumps(figures, indent=1))
    print(f"[multinode] {json.dumps(figures)}")
