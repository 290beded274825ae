"""Shared fixtures: a local HTTP server, an unreachable URL, a tarball builder, the demo project.

Nothing here touches the network beyond 127.0.0.1.
"""

from __future__ import annotations

import importlib.util
import io
import shutil
import socket
import sys
import tarfile
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from synthetic import PY, serve_index, wheel_bytes
from synthetic import REGISTRY as SYNTHETIC_REGISTRY
from real_runs import bracket_releases, cli_run

from pdevidence import registry
from pdevidence.core import inuse
from pdevidence.core.paths import PROJECT


@dataclass
class Route:
    """What the server answers for one path.

    ``truncate_to`` sends only that many bytes of ``body`` while still announcing
    all of it (Content-Length, or the chunk size when ``chunked``), then closes
    the connection: a transfer cut short.
    """

    body: bytes
    status: int = 200
    content_type: str = "application/octet-stream"
    chunked: bool = False
    truncate_to: int | None = None
    delay: float = 0.0  # seconds to wait before answering
    fail_first: int = 0  # the first this many requests get a 503 (a server's passing trouble)


class LocalHTTPServer:
    """``routes`` maps a path (``/a/b``) to bytes or a ``Route``; anything else is a 404."""

    def __init__(self) -> None:
        self.routes: dict[str, bytes | Route] = {}
        self.requests: list[str] = []
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever,
                                        kwargs={"poll_interval": 0.02}, daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def url(self, path: str) -> str:
        return self.base_url + path

    def serve(self, path: str, body: bytes, **options) -> str:
        """Serve ``body`` at ``path`` (options as for ``Route``); return its URL."""
        self.routes[path] = Route(body, **options)
        return self.url(path)

    def hits(self, path: str | None = None) -> int:
        """How many requests arrived, for one path or in all."""
        with self._lock:
            return sum(1 for p in self.requests if path is None or p == path)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def _handler(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # keep test output clean
                pass

            def do_HEAD(self) -> None:
                self._answer(send_body=False)

            def do_GET(self) -> None:
                self._answer(send_body=True)

            def _answer(self, send_body: bool) -> None:
                path = self.path.split("?", 1)[0]
                with server._lock:
                    server.requests.append(path)
                route = server.routes.get(path)
                if route is None:
                    route = Route(b"not found\n", status=404, content_type="text/plain")
                elif isinstance(route, bytes):
                    route = Route(route)
                if route.delay:
                    time.sleep(route.delay)
                if server.hits(path) <= route.fail_first:
                    route = Route(b"busy\n", status=503, content_type="text/plain")
                sent = route.body if route.truncate_to is None else route.body[: route.truncate_to]
                self.close_connection = True
                self.send_response(route.status)
                self.send_header("Content-Type", route.content_type)
                self.send_header("Connection", "close")
                if route.chunked:
                    self.send_header("Transfer-Encoding", "chunked")
                else:
                    self.send_header("Content-Length", str(len(route.body)))
                self.end_headers()
                if not send_body:
                    return
                if route.chunked:
                    self.wfile.write(f"{len(route.body):x}\r\n".encode() + sent)
                    if route.truncate_to is None:
                        self.wfile.write(b"\r\n0\r\n\r\n")
                else:
                    self.wfile.write(sent)
                self.wfile.flush()

        return Handler


@pytest.fixture(autouse=True)
def quick_download_retries(monkeypatch):
    """A download is tried again after a failure on the way: in tests, at once (no test sleeps for real)."""
    monkeypatch.setenv("PDEVIDENCE_DOWNLOAD_BACKOFF", "0.001")


@pytest.fixture
def http_server():
    """A ``LocalHTTPServer`` on 127.0.0.1, stopped after the test."""
    server = LocalHTTPServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def unreachable_url() -> str:
    """``http://127.0.0.1:<port>`` where nothing listens: connections are refused."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


TarEntry = tuple  # (kind, name, payload): kind file|dir|symlink|hardlink


def build_tarball(entries: Mapping[str, bytes] | Iterable[TarEntry], *, gz: bool = True) -> bytes:
    """A tar archive, in the order given.

    ``entries`` is either ``{name: content}`` for plain files, or
    ``(kind, name, payload)`` tuples where kind is ``file`` (payload: bytes),
    ``dir``, ``symlink`` or ``hardlink`` (payload: the link target).
    """
    if isinstance(entries, Mapping):
        entries = [("file", name, data) for name, data in entries.items()]
    kinds = {"file": tarfile.REGTYPE, "dir": tarfile.DIRTYPE,
             "symlink": tarfile.SYMTYPE, "hardlink": tarfile.LNKTYPE}
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz" if gz else "w") as tar:
        for kind, name, *payload in entries:
            info = tarfile.TarInfo(name)
            info.type = kinds[kind]
            info.mtime = 1_700_000_000
            info.mode = 0o755 if kind == "dir" else 0o644
            data = None
            if kind == "file":
                content = payload[0] if payload else b""
                info.size = len(content)
                data = io.BytesIO(content)
            elif kind in ("symlink", "hardlink"):
                info.linkname = payload[0]
            tar.addfile(info, data)
    return buf.getvalue()


@pytest.fixture
def make_tarball():
    """``build_tarball`` as a fixture: ``make_tarball({"top/a.txt": b"..."})`` -> bytes."""
    return build_tarball


def gone(pid: int) -> bool:
    """Whether process ``pid`` is gone, exit status collected: a zombie is not gone. The harness is the
    subreaper of what its children leave (a contained probe's sandbox init, orphaned when its bubblewrap
    parent is killed) and reaps it (``children.reap_orphans``); nothing else on some machines ever would."""
    return not Path(f"/proc/{pid}").exists()


@pytest.fixture(name="gone")
def gone_fixture():
    """``gone(pid)``: whether that process has exited."""
    return gone


# The synthetic registry, with the cells on this interpreter's Python.
DEMO_REGISTRY = SYNTHETIC_REGISTRY.replace('python = "3.12"', f'python = "{PY}"')

DEMO_HANGING = "demo probe: hanging"  # what the demo probe logs as it starts to hang, for a test waiting on it
DEMO_PROBE = '''
"""Demo probe: reads the fixture sglang's behaviour through the real probe kit."""
import os
import sys
import time

from _probekit import ScenarioSet, main

demo = ScenarioSet("demo")
mode = os.environ.get("DEMO_PROBE_MODE", "")


def prepare():
    import sglang
    if mode == "hang":
        print("demo probe: hanging", file=sys.stderr, flush=True)  # DEMO_HANGING, in its log
        time.sleep(60)
    if mode in ("crash", f"crash-{sys.argv[sys.argv.index('--side') + 1]}"):
        raise SystemExit("probe crashed on purpose")
    return sglang.__version__


@demo.scenario("D1", "rejected request at the door")
def d1(obs):
    import sglang
    obs["enqueued"] = not sglang.RETIRES_REJECTED
    obs["retired"] = sglang.RETIRES_REJECTED


@demo.scenario("D2", "valid request")
def d2(obs):
    obs["enqueued"] = True


if __name__ == "__main__":
    raise SystemExit(main(demo, prepare))
'''


@pytest.fixture(autouse=True)
def _cache_entries_let_go():
    """A test is a run: what it used of a cache is let go when it ends (core/inuse.py), as a command's is, so no
    test holds another's entries and the suite's open files stay few."""
    yield
    inuse.release()


@pytest.fixture
def demo_project(tmp_path, http_server, monkeypatch):
    """A project whose experiment ``demo`` probes a fixture "sglang" served by a local index (1.0.0 base, 1.1.0 head)."""
    root = tmp_path / "project"
    (root / "probes").mkdir(parents=True)
    (root / "constraints").mkdir()
    (root / "experiments.toml").write_text(DEMO_REGISTRY)
    (root / "constraints" / "cells.txt").write_text("")
    shutil.copy(PROJECT / "probes" / "_probekit.py", root / "probes")
    shutil.copy(PROJECT / "probes" / "_standins.py", root / "probes")
    shutil.copy(PROJECT / "noxfile.py", root / "noxfile.py")
    (root / "probes" / "probe_demo.py").write_text(DEMO_PROBE)
    index = serve_index(http_server, {
        f"sglang-{v}-py3-none-any.whl": wheel_bytes(v, f"__version__ = {v!r}\nRETIRES_REJECTED = {fixed}\n")
        for v, fixed in (("1.0.0", False), ("1.1.0", True))
    })
    monkeypatch.delenv("PDEVIDENCE_TORCH", raising=False)  # the registry's channel
    # The probe runs contained, with a cleared environment: DEMO_PROBE_MODE must be passed by name.
    for name, value in {"PDEVIDENCE_PROBE_PASS_ENV": "DEMO_PROBE_MODE",
                        "PDEVIDENCE_INDEX_URL": index, "PDEVIDENCE_CACHE": str(tmp_path / "cache"),
                        "PDEVIDENCE_WORK": str(root / ".cells"),
                        "PDEVIDENCE_RUNS": str(root / "runs")}.items():
        monkeypatch.setenv(name, value)
    return root


@pytest.fixture
def fresh_probe(monkeypatch):
    """Load a probe of ``probes/`` as a cell loads it, a fresh copy each time (its adaptations start empty)."""
    def load(filename: str):
        monkeypatch.syspath_prepend(str(PROJECT / "probes"))
        spec = importlib.util.spec_from_file_location(f"{filename[:-3]}_under_test", PROJECT / "probes" / filename)
        module = importlib.util.module_from_spec(spec)
        monkeypatch.setitem(sys.modules, spec.name, module)
        spec.loader.exec_module(module)
        return module
    return load


@pytest.fixture(scope="module")
def project_reg(tmp_path_factory):
    """The project's registry, for a module of real runs: its fresh results go to a temporary runs/."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PDEVIDENCE_RUNS", str(tmp_path_factory.mktemp("runs")))
        yield registry.load(PROJECT)


# --- Real runs shared by the real tests (``--sglang``) ---------------------------------------------------
# Each runs once per session, the first time a test asks for it, into a temporary runs directory; every
# environment it needs is the user cache's (shared across checkouts), never built again in a temporary one.

@dataclass
class Matrix:
    code: int  # the matrix's exit code
    pairs: dict  # per experiment, its pair in the report
    before: tuple  # results/ and `git status` before it ran
    runs: Path  # what it wrote: each cell's result and receipt, the report
    releases: dict  # per experiment, its releases by side (the registry's, read once)

    def result(self, experiment: str, side: str) -> dict:
        """The result the matrix's cell of ``experiment`` wrote on its ``side`` release, loaded as every reader
        loads one (a cell that left none fails here, naming it)."""
        from pdevidence.documents import results

        release = self.releases[experiment][side]
        return results.load(self.runs / f"{experiment}.{side}.release-{release}.json", experiment=experiment,
                            side=side)

    def scenarios(self, experiment: str, side: str) -> dict:
        return self.result(experiment, side)["scenarios"]

    def observed(self, experiment: str, side: str) -> dict:
        """What each scenario of that cell that ran without error observed."""
        return {sid: sc["observed"] for sid, sc in self.scenarios(experiment, side).items() if sc["error"] is None}


@pytest.fixture(scope="session")
def release_matrix(tmp_path_factory) -> Matrix:
    """The release-backed matrix (`matrix --kind release`): every experiment's base and head release, each probe
    alone in its own process as a cell runs it, then compare. Shared: test_real_releases.py reads the report,
    test_one_process_real.py and test_sandbox_real.py the cells' results, and each experiment's own real test
    (test_abort_notify_real.py, ...) what its two cells observed."""
    import hashlib
    import subprocess

    from pdevidence import cli
    from pdevidence.core.paths import results_dir
    from pdevidence.documents import reports

    def snapshot(directory: Path) -> dict[str, str]:
        return {p.relative_to(directory).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
                for p in sorted(directory.rglob("*")) if p.is_file()}

    def git_status() -> str:
        return subprocess.run(["git", "-C", str(PROJECT), "status", "--porcelain", "--untracked-files=all"],
                              capture_output=True, text=True, check=True).stdout

    runs = tmp_path_factory.mktemp("matrix-runs")
    before = snapshot(results_dir(PROJECT)), git_status()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PDEVIDENCE_RUNS", str(runs))
        code = cli.main(["--root", str(PROJECT), "matrix", "--kind", "release"])
    report = reports.load_report(runs / "report.json")
    return Matrix(code, {pair["experiment"]: pair for pair in report["pairs"]}, before, runs,
                  {name: exp.releases for name, exp in registry.load(PROJECT).experiments.items()})


@dataclass
class BracketSweep:
    releases: list[str]
    runs: Path  # runs/sweep/release-<v>/<experiment>.json and runs/sweep-<experiment>.json
    said: str  # what it printed

    def result(self, version: str, experiment: str) -> Path:
        return self.runs / "sweep" / f"release-{version}" / f"{experiment}.json"

    def row(self, experiment: str, version: str) -> dict:
        import json

        table = json.loads((self.runs / f"sweep-{experiment}.json").read_text())
        return next(r for r in table["releases"] if r["version"] == version)


@pytest.fixture(scope="session")
def bracket_sweep(tmp_path_factory) -> BracketSweep:
    """One `sweep --force` of every bracket release through the warm engine (one engine per era, every probe of a
    release in one process), contained by bubblewrap. Shared: test_engine_real.py holds it to fresh processes,
    test_sandbox_real.py to an uncontained run, test_one_process_real.py to the matrix's lone probes,
    test_check_real.py's `check --python` to its table."""
    reg = registry.load(PROJECT)
    versions = bracket_releases(reg)
    runs = tmp_path_factory.mktemp("bracket-sweep")
    done = cli_run(runs, "sweep", "--force", *versions, extra_env={"PDEVIDENCE_SANDBOX": "bubblewrap"})
    # 0: every experiment's first fixed release is among them and nothing after it lost the fix.
    assert done.returncode == 0, done.stdout + done.stderr
    return BracketSweep(versions, runs, done.stdout)


@pytest.fixture(scope="module")
def noxfile():
    """The noxfile, imported once, its sessions registered with nox as when nox reads it (and then forgotten:
    another test may import it too)."""
    nox_registry = pytest.importorskip("nox.registry", reason="nox is not installed: "
                                       "python -m pip install -r requirements-dev.txt")
    before = nox_registry.get()
    nox_registry.reset()
    spec = importlib.util.spec_from_file_location("pdevidence_tests_noxfile", PROJECT / "noxfile.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    yield module
    nox_registry.reset()
    nox_registry._REGISTRY.update(before)
