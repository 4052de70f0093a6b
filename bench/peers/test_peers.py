"""Tests of the peer benchmark harness (peers.py).

Run: python3 -m unittest discover -s bench/peers -v   (from the repository root)

The end-to-end tests build Quarry's exec agent with `go build` and run the
harness against the real binary; peers are stood in for by small scripts
placed in a throwaway "virtualenv" directory, since installing the real
ones needs the network (scripts/bench-peers.sh does that).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
import unittest
from unittest import mock

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import peers  # noqa: E402

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def write_exe(path: str, text: str) -> None:
    """Writes an executable script."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(textwrap.dedent(text).lstrip())
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)


def alive(pid: int) -> bool:
    """Reports whether pid exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return False
    return data[data.rfind(b")") + 2 :].split()[0] != b"Z"


def wait_for(cond, deadline_s: float = 30.0) -> bool:
    """Polls cond until it is true or the (generous) deadline passes."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.05)
    return cond()


class TestPercentile(unittest.TestCase):
    def test_percentile_nearestRank(self):
        cases = [
            {"name": "single", "values": [5.0], "p": 50, "want": 5.0},
            {"name": "p50 of four is the second", "values": [1.0, 2.0, 3.0, 4.0], "p": 50, "want": 2.0},
            {"name": "p99 of hundred is the 99th", "values": [float(i) for i in range(1, 101)], "p": 99, "want": 99.0},
            {"name": "p100 is the max", "values": [1.0, 9.0], "p": 100, "want": 9.0},
            {"name": "tiny p is the min", "values": [1.0, 9.0], "p": 0.1, "want": 1.0},
        ]
        for c in cases:
            with self.subTest(c["name"]):
                self.assertEqual(c["want"], peers.percentile(c["values"], c["p"]))

    def test_percentile_badInputRaises(self):
        cases = [
            {"name": "empty", "values": [], "p": 50},
            {"name": "p zero", "values": [1.0], "p": 0},
            {"name": "p over 100", "values": [1.0], "p": 101},
        ]
        for c in cases:
            with self.subTest(c["name"]):
                with self.assertRaises(ValueError):
                    peers.percentile(c["values"], c["p"])


class TestSummarize(unittest.TestCase):
    def test_summarize_computesEveryField(self):
        s = peers.summarize([4.0, 1.0, 3.0, 2.0], wall_s=0.5)
        self.assertEqual(4, s.calls)
        self.assertEqual(2.0, s.p50_ms)
        self.assertEqual(4.0, s.p99_ms)
        self.assertEqual(2.5, s.mean_ms)
        self.assertEqual(1.0, s.min_ms)
        self.assertEqual(4.0, s.max_ms)
        self.assertEqual(8.0, s.rps)

    def test_summarize_badInputRaises(self):
        with self.assertRaises(ValueError):
            peers.summarize([], 1.0)
        with self.assertRaises(ValueError):
            peers.summarize([1.0], 0)


class TestTimedSeries(unittest.TestCase):
    def test_timedSeries(self):
        def answers(script):
            """A call that returns, or raises, the scripted outcomes in turn."""
            it = iter(script)

            def call():
                v = next(it)
                if isinstance(v, Exception):
                    raise v
                return v

            return call

        def check(v):
            if v != "ok":
                raise peers.AgentError(f"bad answer {v}")

        cases = [
            {"name": "all good", "script": ["ok"] * 5, "max_errors": 0, "want_calls": 5, "want_errors": 0},
            {"name": "errors within tolerance are counted and timed",
             "script": ["ok", "bad", peers.TransportError("reset"), "ok"], "max_errors": 2,
             "want_calls": 4, "want_errors": 2},
            {"name": "one error too many raises with first and last",
             "script": ["bad1", "ok", "bad2", "ok"], "max_errors": 1,
             "want_raise": "call 3 of 4 failed (2 failed, 1 tolerated); first: bad answer bad1; last: bad answer bad2"},
            {"name": "strict raises on the first error", "script": ["ok", "bad"], "max_errors": 0,
             "want_raise": "call 2 of 2 failed (1 failed, 0 tolerated); last: bad answer bad"},
        ]
        for c in cases:
            with self.subTest(c["name"]):
                call = answers(c["script"])
                n = len(c["script"])
                if "want_raise" in c:
                    with self.assertRaises(peers.AgentError) as ex:
                        peers.timed_series(n, 0, call, check, c["max_errors"])
                    self.assertEqual(c["want_raise"], str(ex.exception))
                    continue
                s = peers.timed_series(n, 0, call, check, c["max_errors"])
                self.assertEqual(c["want_calls"], len(s.latencies_ms))
                self.assertEqual(c["want_errors"], s.errors)
                self.assertEqual(c["want_errors"], len(s.error_samples))
                self.assertFalse(s.cut_by_budget)
                self.assertTrue(all(v >= 0 for v in s.latencies_ms))

    def test_timedSeries_budgetCutsTheSeries(self):
        s = peers.timed_series(1000, 1e-9, lambda: "ok", lambda v: None)
        self.assertEqual(1, len(s.latencies_ms))
        self.assertTrue(s.cut_by_budget)


def ok_result(name: str, p50: float, p99: float, mean: float) -> dict:
    return {"name": name, "status": "ok", "version": "1", "session_run": {
        "calls": 10, "p50_ms": p50, "p90_ms": p50, "p99_ms": p99, "mean_ms": mean,
        "min_ms": p50, "max_ms": p99, "rps": 1000 / mean, "cut_by_time_budget": False}}


class TestRatios(unittest.TestCase):
    def test_ratios(self):
        cases = [
            {
                "name": "both peers ran",
                "results": [ok_result("quarry", 1.0, 2.0, 1.0), ok_result("swe-rex", 120.0, 150.0, 125.0),
                            ok_result("rocklet", 5.0, 40.0, 6.0)],
                "want": {
                    "swe-rex": {"p50": 120.0, "p99": 75.0, "mean": 125.0, "goal": 10.0, "meets_goal": True},
                    "rocklet": {"p50": 5.0, "p99": 20.0, "mean": 6.0, "goal": 10.0, "meets_goal": False},
                },
            },
            {
                "name": "a peer that did not run has no ratio",
                "results": [ok_result("quarry", 1.0, 2.0, 1.0),
                            {"name": "swe-rex", "status": "not_run", "reason": "x"},
                            ok_result("rocklet", 10.0, 20.0, 10.0)],
                "want": {"rocklet": {"p50": 10.0, "p99": 10.0, "mean": 10.0, "goal": 10.0, "meets_goal": True}},
            },
            {
                "name": "no quarry, no ratios",
                "results": [{"name": "quarry", "status": "failed", "reason": "x"}, ok_result("swe-rex", 1.0, 1.0, 1.0)],
                "want": {},
            },
        ]
        for c in cases:
            with self.subTest(c["name"]):
                self.assertEqual(c["want"], peers.ratios(c["results"]))


class TestRenderTable(unittest.TestCase):
    def test_renderTable_showsRatiosAndWhyAPeerDidNotRun(self):
        results = [ok_result("quarry", 1.0, 2.0, 1.0), ok_result("swe-rex", 120.0, 150.0, 125.0),
                   {"name": "rocklet", "status": "not_run", "reason": "pip install failed:\n  no network"}]
        report = {"command": "true", "client": "c", "agents": results, "ratios": peers.ratios(results),
                  "plan": {"calls": 10, "warmup": 1, "max_seconds": 0}}
        table = peers.render_table(report)
        self.assertIn("120.0× slower", table)
        self.assertIn("swe-rex/quarry: p50 120.0×", table)
        self.assertIn("goal ≥10× at p50: met", table)
        self.assertIn("rocklet   ?           NOT RUN: pip install failed: no network", table)
        self.assertIn("rocklet: no ratio, the peer was not measured: pip install failed: no network", table)


class TestParseArgs(unittest.TestCase):
    def test_parseArgs_badInputNamesTheFlag(self):
        cases = [
            {"name": "calls zero", "argv": ["--calls", "0"], "want": "--calls"},
            {"name": "warmup negative", "argv": ["--warmup", "-1"], "want": "--warmup"},
            {"name": "max seconds too big", "argv": ["--max-seconds", "99999"], "want": "--max-seconds"},
            {"name": "floor calls negative", "argv": ["--floor-calls", "-5"], "want": "--floor-calls"},
            {"name": "unknown agent", "argv": ["--agents", "quarry,e2b"], "want": "--agents"},
            {"name": "quarry left out", "argv": ["--agents", "swe-rex"], "want": "must include quarry"},
        ]
        for c in cases:
            with self.subTest(c["name"]):
                err = io.StringIO()
                with contextlib.redirect_stderr(err), self.assertRaises(SystemExit) as ex:
                    peers.parse_args(["--quarry-agent", "/x", *c["argv"]])
                self.assertEqual(2, ex.exception.code)
                self.assertIn(c["want"], err.getvalue())

    def test_parseArgs_agentsKeepCanonicalOrder(self):
        a = peers.parse_args(["--quarry-agent", "/x", "--agents", "rocklet, quarry"])
        self.assertEqual(["quarry", "rocklet"], a.agents)


class TestPortProbes(unittest.TestCase):
    def test_addrFilePort(self):
        cases = [
            {"name": "missing file", "text": None, "want": None},
            {"name": "empty file", "text": "", "want": None},
            {"name": "host:port", "text": "127.0.0.1:4321\n", "want": 4321},
            {"name": "url", "text": "http://127.0.0.1:4321/", "want": 4321},
        ]
        for c in cases:
            with self.subTest(c["name"]), tempfile.TemporaryDirectory() as d:
                path = os.path.join(d, "addr")
                if c["text"] is not None:
                    with open(path, "w", encoding="utf-8") as f:
                        f.write(c["text"])
                self.assertEqual(c["want"], peers.addr_file_port(path)())

    def test_addrFilePort_refusesNonLoopback(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "addr")
            with open(path, "w", encoding="utf-8") as f:
                f.write("0.0.0.0:4321")
            with self.assertRaisesRegex(peers.AgentError, "want 127.0.0.1:PORT"):
                peers.addr_file_port(path)()

    def test_uvicornPort(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "log")
            probe = peers.uvicorn_port(path)
            self.assertIsNone(probe())
            with open(path, "w", encoding="utf-8") as f:
                f.write("INFO:     Started server process [1]\n")
            self.assertIsNone(probe())
            with open(path, "a", encoding="utf-8") as f:
                f.write("INFO:     Uvicorn running on http://127.0.0.1:38211 (Press CTRL+C to quit)\n")
            self.assertEqual(38211, probe())


class TestPeerRequests(unittest.TestCase):
    def test_peerRequests_matchEachPeersWireShape(self):
        cases = [
            {
                "name": "swe-rex",
                "agent": peers.swerex_agent("/venv", "/log"),
                "argv_tail": ["--host", "127.0.0.1", "--port", "0", "--auth-token"],
                "header": "X-API-Key",
                "create": {"session_type": "bash", "session": peers.SESSION},
                "run": {"action_type": "bash", "session": "s1", "command": "true", "timeout": 30, "check": "raise"},
                "close": {"session_type": "bash", "session": "s1"},
            },
            {
                "name": "rocklet",
                "agent": peers.rocklet_agent("/venv", "/log"),
                "argv_tail": ["--host", "127.0.0.1", "--port", "0"],
                "header": None,
                "create": {"session_type": "bash", "session": peers.SESSION, "sandbox_id": peers.SESSION,
                           "env_enable": True},
                "run": {"action_type": "bash", "session": "s1", "command": "true", "timeout": 30, "check": "raise",
                        "sandbox_id": peers.SESSION},
                "close": {"session_type": "bash", "session": "s1", "sandbox_id": peers.SESSION},
            },
        ]
        for c in cases:
            with self.subTest(c["name"]):
                a = c["agent"]
                tail = a.argv[1 : 1 + len(c["argv_tail"])]
                self.assertEqual(c["argv_tail"], tail)
                if c["header"]:
                    self.assertEqual(a.argv[-1], a.headers[c["header"]], "token sent is the token configured")
                else:
                    self.assertEqual({}, a.headers)
                self.assertEqual(("POST", "/create_session", c["create"]), a.create_req)
                self.assertEqual(("POST", "/run_in_session", c["run"]), a.run_req("s1"))
                self.assertEqual(("POST", "/close_session", c["close"]), a.close_req("s1"))
                self.assertEqual("/is_alive", a.health_path)


class TestServer(unittest.TestCase):
    def test_server_stopKillsDescendantsInOtherSessions(self):
        # pexpect starts each peer shell in a session of its own, out of reach of
        # a process-group kill; stop() must end those too.
        with tempfile.TemporaryDirectory() as d:
            pidfile = os.path.join(d, "grandchild.pid")
            script = os.path.join(d, "server.sh")
            write_exe(script, f"""
                #!/bin/bash
                setsid sleep 300 &
                echo $! > {pidfile}.tmp && mv {pidfile}.tmp {pidfile}
                # Ignore SIGTERM, as a hung server would, so stop() must escalate.
                trap '' TERM
                while :; do sleep 1; done
            """)
            agent = peers.quarry_agent(script, d)
            server = peers.Server(agent, os.path.join(d, "log"), d)
            try:
                self.assertTrue(wait_for(lambda: os.path.exists(pidfile)), "grandchild pid file")
                with open(pidfile, encoding="utf-8") as f:
                    grandchild = int(f.read())
                self.assertTrue(alive(grandchild))
            finally:
                with mock.patch.object(peers, "STOP_TIMEOUT_S", 1.0):
                    server.stop()
            self.assertIsNotNone(server.proc.returncode)
            self.assertTrue(wait_for(lambda: not alive(grandchild)), "grandchild still alive after stop")
            server.stop()  # idempotent


def build_agent(out_dir: str) -> str:
    """Builds Quarry's exec agent as the benchmark does; fails the test if it cannot."""
    out = os.path.join(out_dir, "execagent")
    done = subprocess.run(
        ["go", "build", "-o", out, "./cmd/execagent"],
        cwd=REPO, env=dict(os.environ, CGO_ENABLED="0"), capture_output=True, timeout=600, check=False,
    )
    if done.returncode != 0:
        raise AssertionError(f"go build ./cmd/execagent: {done.stderr.decode(errors='replace')}")
    return out


def run_main(argv: list[str]) -> tuple[int, str, dict]:
    """Runs peers.main with argv plus --json; returns exit code, table and JSON report."""
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "out.json")
        buf, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(err):
            code = peers.main([*argv, "--json", out])
        with open(out, encoding="utf-8") as f:
            return code, buf.getvalue(), json.load(f)


class TestMainEndToEnd(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.agent = build_agent(cls.tmp.name)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def fake_venv(self, d: str, swerex: str | None, rocklet: str | None) -> str:
        """Makes a directory shaped like the peers' virtualenv with scripted peers."""
        venv = os.path.join(d, "venv")
        os.makedirs(os.path.join(venv, "bin"))
        os.symlink(sys.executable, os.path.join(venv, "bin", "python"))
        if swerex is not None:
            write_exe(os.path.join(venv, "bin", "swerex-remote"), swerex)
        if rocklet is not None:
            write_exe(os.path.join(venv, "bin", "rocklet"), rocklet)
        return venv

    def test_main_measuresQuarryAndReportsPeersThatCannotRun(self):
        with tempfile.TemporaryDirectory() as d:
            venv = self.fake_venv(
                d,
                swerex="#!/bin/sh\necho 'ModuleNotFoundError: No module named fastapi' >&2\nexit 3\n",
                rocklet=None,
            )
            code, table, report = run_main(
                ["--quarry-agent", self.agent, "--venv", venv, "--calls", "200", "--warmup", "5", "--floor-calls", "20"])
        self.assertEqual(0, code, table)
        by = {r["name"]: r for r in report["agents"]}
        q = by["quarry"]
        self.assertEqual("ok", q["status"], q.get("reason"))
        self.assertEqual(200, q["session_run"]["calls"])
        self.assertGreater(q["session_run"]["p50_ms"], 0)
        self.assertLessEqual(q["session_run"]["p50_ms"], q["session_run"]["p99_ms"])
        self.assertEqual(20, q["health_floor"]["calls"])
        self.assertEqual("not_run", by["swe-rex"]["status"])
        self.assertIn("exited with status 3", by["swe-rex"]["reason"])
        self.assertIn("No module named fastapi", by["swe-rex"]["reason"])
        self.assertEqual("not_run", by["rocklet"]["status"])
        self.assertIn("bin/rocklet: not an executable file", by["rocklet"]["reason"])
        self.assertEqual({}, report["ratios"])
        self.assertIn("NOT RUN", table)

    def test_main_setupErrorMarksPeersNotRun(self):
        code, table, report = run_main(
            ["--quarry-agent", self.agent, "--venv", "/nonexistent", "--calls", "20", "--floor-calls", "0",
             "--setup-error", "pip install failed: no route to host"])
        self.assertEqual(0, code, table)
        by = {r["name"]: r for r in report["agents"]}
        self.assertEqual("ok", by["quarry"]["status"], by["quarry"].get("reason"))
        self.assertNotIn("health_floor", by["quarry"])
        for name in peers.PEER_NAMES:
            self.assertEqual("not_run", by[name]["status"])
            self.assertEqual("peer setup: pip install failed: no route to host", by[name]["reason"])

    def test_main_missingVenvMarksPeersNotRun(self):
        code, _table, report = run_main(
            ["--quarry-agent", self.agent, "--venv", "/nonexistent", "--calls", "20", "--floor-calls", "0"])
        self.assertEqual(0, code)
        by = {r["name"]: r for r in report["agents"]}
        self.assertIn("peers' virtualenv is missing", by["swe-rex"]["reason"])

    def test_main_quarryFailureExitsOne(self):
        cases = [
            {"name": "no such binary", "agent": "/nonexistent/execagent", "want": "not an executable file"},
            {"name": "binary exits at once", "agent": "/bin/false", "want": "exited with status 1"},
        ]
        for c in cases:
            with self.subTest(c["name"]):
                code, _table, report = run_main(["--quarry-agent", c["agent"], "--agents", "quarry", "--calls", "5"])
                self.assertEqual(1, code)
                q = report["agents"][0]
                self.assertEqual("not_run", q["status"])
                self.assertIn(c["want"], q["reason"])


if __name__ == "__main__":
    unittest.main()
